"""Fault handling for training runs: an output-folder preflight (writable, enough free space) and the error raised on
a non-finite training loss. Staged folders and atomic writes are `hf_relpos.publish.files`. See
docs/reliability.md."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from ..publish.files import creation_error, expand_home, nearest_existing_folder, staging_tag, unfilled_entries
from ..publish.hub import CARD_FILE
from ..publish.records import AVERAGED_CHECKPOINTS_FILE, HYPOTHESES_FILE, RESULTS_FILE, RUN_RECORD_FILE
from .checkpoints import TRAINER_STATE_FILE

# train_translation.py saves the final model here inside output_dir, then moves it in (`move_folder_contents`).
FINAL_MODEL_STAGING = ".final-model-staging"
# What output_dir holds about its final model besides the model: the run's record, card, scores, translations, end
# state and the checkpoints it averages. They go with the model they describe when a new one replaces it.
FINAL_MODEL_DESCRIPTIONS = (RUN_RECORD_FILE, CARD_FILE, AVERAGED_CHECKPOINTS_FILE, RESULTS_FILE.format(prefix="*"),
                            HYPOTHESES_FILE.format(prefix="*"), TRAINER_STATE_FILE)


class OutputDirError(ValueError):
    """output_dir cannot hold the run's results: not a folder, not writable, or too little free space."""


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; training stops before the weights are updated with it."""

    def __init__(self, value: float, step: int, epoch: float) -> None:
        super().__init__(
            f"training loss is {value} at step {step} (epoch {epoch:.2f}); training stopped and no final model was "
            f"saved (checkpoints written before this step are intact). Raise warmup_steps or check the data, then "
            f"resume from the last checkpoint or start again; or lower learning_rate in a new run from a checkpoint's "
            f"weights (--model_name_or_path CHECKPOINT: a resumed run keeps the checkpoint's learning rate)."
        )
        self.value = value
        self.step = step


class TrainingStoppedError(RuntimeError):
    """`enable_jit_checkpoint`: a SIGTERM stopped training before its last step, after the Trainer saved a checkpoint;
    the run is not finished, so no final model, scores, card or record are written."""

    def __init__(self, step: int, checkpoint: str | os.PathLike | None) -> None:
        saved = f"{Path(checkpoint).name} is saved" if checkpoint is not None else "no complete checkpoint was saved"
        super().__init__(
            f"training was stopped by SIGTERM at step {step} (enable_jit_checkpoint): {saved}, and no final model, "
            f"scores, card or run record were written; continue with --resume_from_checkpoint last"
        )
        self.step = step


def format_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000:
            return f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def check_new_output_dir(output_dir: str | os.PathLike, setting: str = "output_dir") -> None:
    """The folder a tool writes its result into: raise `OutputDirError` naming `setting` unless it does not exist yet
    or is an empty folder (but for the staging of a fill killed on this machine, which `staged_folder` removes), and
    can be written (`check_output_dir`)."""
    check_output_dir(output_dir, setting=setting)
    if not Path(output_dir).is_dir() or not (entries := unfilled_entries(output_dir)):
        return
    staging = [entry.name for entry in entries if entry.name.startswith(staging_tag(output_dir))]
    held = (f"it holds {', '.join(map(repr, staging))}, a fill's staging folder (of another machine or a process "
            "still running); remove it if no job writes there, or choose a new one") if staging else "choose a new one"
    raise OutputDirError(f"{setting} {str(output_dir)!r} exists and is not an empty folder; {held}")


def output_folder(value: str) -> Path:
    """argparse type of a folder that results go into (`--out`, `--work`): one that can be made or written
    (`check_output_dir`), checked when the arguments are read rather than when the results are written at the end."""
    folder = Path(expand_home(value))
    try:
        check_output_dir(folder, setting="the folder")
    except OutputDirError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return folder


def check_output_dir(output_dir: str | os.PathLike, required_bytes: int = 0, setting: str = "output_dir") -> None:
    """Raise `OutputDirError` unless `output_dir` (or, if it does not exist yet, its nearest existing parent) is a
    folder in which a file can be created and deleted, on a disk with at least `required_bytes` free; a link on the
    way to a target that does not exist (no folder can be created through it) is an error too. `setting`: the
    argument that names the folder (output_dir, prepared_data_dir), for the error.

    Nothing is left behind: the probe is a temporary folder removed again, and `output_dir` itself is not created.
    """
    path = Path(output_dir).absolute()
    try:
        existing = nearest_existing_folder(path, setting)
    except ValueError as error:
        raise OutputDirError(str(error)) from None
    if (error := creation_error(existing)) is not None:
        raise OutputDirError(
            f"{setting} {str(path)!r} is not writable: cannot create files in {str(existing)!r} ({error.strerror})")
    free = shutil.disk_usage(existing).free
    if required_bytes > free:
        raise OutputDirError(
            f"{setting} {str(path)!r}: only {format_bytes(free)} free on its disk, but the run needs about "
            f"{format_bytes(required_bytes)} (final model and checkpoints with optimizer state); free some space, "
            f"lower save_total_limit or choose another output_dir"
        )
