"""A training output folder's `checkpoint-<step>` folders: listed newest last, and whether each is complete (the
one to resume from). Averaging them is `hf_relpos.tools.average`."""


from __future__ import annotations

import json
import os
import re
from pathlib import Path

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE_FILE = "trainer_state.json"


def find_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders of a training output folder, oldest first."""
    output_dir = Path(output_dir)
    found = [(int(match.group(1)), path) for path in output_dir.iterdir()
             if path.is_dir() and (match := CHECKPOINT_PATTERN.match(path.name))]
    return [path for _, path in sorted(found)]


def is_complete_checkpoint(folder: str | os.PathLike) -> bool:
    """Whether a Trainer checkpoint folder was written to the end.

    The Trainer writes `trainer_state.json` last (after weights, optimizer, scheduler and random states) and deletes
    older checkpoints only after it; a folder whose state file is missing, cut short, or for another step is
    incomplete (the step is checked when the folder is named `checkpoint-<step>`). `TranslationTrainer` removes a
    stale state file before it rewrites a checkpoint folder.
    """
    folder = Path(folder)
    try:
        state = json.loads((folder / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    match = CHECKPOINT_PATTERN.match(folder.name)
    return isinstance(state, dict) and (match is None or state.get("global_step") == int(match.group(1)))


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete `checkpoint-<step>` folder of a training output folder (incomplete ones are skipped)."""
    complete = [path for path in find_checkpoints(output_dir) if is_complete_checkpoint(path)]
    return complete[-1] if complete else None


