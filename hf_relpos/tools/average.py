"""Checkpoint averaging (Vaswani et al. 2017: the last 5 checkpoints for base models, the last 20 for big ones).

    python -m hf_relpos.tools.average outputs/run --last_n 5 --output_dir outputs/run/averaged

The inputs are either one training output folder (its newest complete `checkpoint-<step>` folders are used, 5 unless
`--last_n` says otherwise, also when the folder holds the final model; as the training app's `average_checkpoints`,
a checkpoint the Trainer did not finish writing is skipped with a warning) or the checkpoint folders themselves (all
of them unless `--last_n` says otherwise). The result is a model folder loadable with `from_pretrained`: the averaged weights plus
the config, generation config, tokenizer and remote code of the newest checkpoint, and (with remote code) the
translation pipeline that a trained folder ships (`add_translation_pipeline`), a model card (`folder_model_card`) and
the training run's record without the scores of its final weights.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from safetensors.torch import save_file
from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..publish.files import apply_umask_mode_to_weights, expand_home, staged_folder
from ..publish.hub import CARD_FILE, add_translation_pipeline, folder_model_card
from ..publish.records import AVERAGED_CHECKPOINTS_FILE, RUN_RECORD_FILE, training_record
from ..translation.arguments import add_import_modules_argument, import_modules_hint, import_user_modules
from ..translation.checkpoints import (
    CHECKPOINT_PATTERN,
    TRAINER_STATE_FILE,
    average_weights,
    find_checkpoints,
    is_complete_checkpoint,
)
from ..translation.safety import FINAL_MODEL_DESCRIPTIONS, OutputDirError, check_new_output_dir

logger = logging.getLogger(__name__)

TRAINER_STATE_FILES = re.compile(
    r"^(optimizer.*|scheduler.*|scaler.*|rng_state.*|trainer_state\.json|training_args\.bin|model.*\.safetensors.*"
    r"|pytorch_model.*)$"
)


def copied_from_newest(name: str) -> bool:
    """Whether the newest checkpoint's file `name` goes into the averaged folder as it is: not its weights or trainer
    state, nor, where the newest is a run's final model, what describes those weights (`FINAL_MODEL_DESCRIPTIONS`:
    card, record, scores, translations), which the averaged weights do not have."""
    return not TRAINER_STATE_FILES.match(name) and not any(fnmatch.fnmatchcase(name, pattern)
                                                           for pattern in FINAL_MODEL_DESCRIPTIONS)


DEFAULT_LAST_N = 5   # checkpoints of a training output folder averaged unless told otherwise (Vaswani et al.'s base)


def select_checkpoints(paths_or_output_dir: str | os.PathLike | Sequence[str | os.PathLike],
                       last_n: int | None = None) -> list[Path]:
    """The checkpoints to average, oldest first: the newest `last_n` of one training output folder's complete
    `checkpoint-<step>` folders (`is_complete_checkpoint`; `DEFAULT_LAST_N` when None), or of the checkpoint folders
    given (all when None)."""
    if isinstance(paths_or_output_dir, (str, os.PathLike)):
        paths_or_output_dir = [paths_or_output_dir]
    paths = [Path(path) for path in paths_or_output_dir]
    for path in paths:
        if not path.is_dir():
            raise ValueError(f"{str(path)!r} is not a folder")
    resolved = [path.resolve() for path in paths]
    for index, folder in enumerate(resolved):
        if folder in resolved[:index]:
            raise ValueError(f"{str(paths[index])!r} is listed twice (also as {str(paths[resolved.index(folder)])!r}): "
                             "the average would weigh it double; list each checkpoint once")
    found = find_checkpoints(paths[0]) if len(paths) == 1 else []
    checkpoints = [path for path in found if is_complete_checkpoint(path)]
    incomplete = ", ".join(path.name for path in found if path not in checkpoints)
    why = f"no {TRAINER_STATE_FILE} for the folder's step: the Trainer did not finish writing it"
    if found and not checkpoints:
        raise ValueError(f"{str(paths[0])!r}: no complete checkpoint-<step> folder ({incomplete}: {why}); list "
                         "checkpoint folders to average them anyway")
    if incomplete:
        logger.warning("skipping %s (%s); list checkpoint folders to average them anyway", incomplete, why)
    told = last_n is not None
    if last_n is None:
        last_n = DEFAULT_LAST_N if checkpoints else len(paths)
    default = "" if told else " (the default for a training output folder)"
    if not checkpoints:
        if len(paths) == 1 and not _has_weights(paths[0]):
            raise ValueError(f"{str(paths[0])!r} holds neither model weights nor checkpoint-<step> folders")
        if len(paths) == 1:   # with or without last_n: a copy of one model is no average
            raise ValueError(f"{str(paths[0])!r} is one model without checkpoint-<step> folders: nothing to average; "
                             "give a training output folder or two or more checkpoint folders")
        checkpoints = paths
    if last_n < 1:
        raise ValueError(f"last_n must be a positive integer, got {last_n}")
    if last_n > len(checkpoints):
        fewer = f"average at most last_n={len(checkpoints)}, or " if len(checkpoints) > 1 else ""
        raise ValueError(f"last_n={last_n}{default} but only {len(checkpoints)} checkpoint(s): "
                         f"{[str(p) for p in checkpoints]}; {fewer}train with more checkpoints kept (save_strategy "
                         "steps with save_steps, or epoch, and save_total_limit null or at least last_n)")
    selected = checkpoints[-last_n:]
    for checkpoint in selected:
        if not _has_weights(checkpoint):
            raise ValueError(f"{str(checkpoint)!r} has no {SAFE_WEIGHTS_NAME} (or {SAFE_WEIGHTS_INDEX_NAME})")
    return selected


def _has_weights(folder: Path) -> bool:
    return (folder / SAFE_WEIGHTS_NAME).is_file() or (folder / SAFE_WEIGHTS_INDEX_NAME).is_file()


def _ships_remote_code(folder: Path) -> bool:
    """Whether the model folder declares its remote code (an `auto_map` in config.json)."""
    config = folder / CONFIG_NAME
    return config.is_file() and bool(json.loads(config.read_text(encoding="utf-8")).get("auto_map"))


def check_not_a_checkpoint_name(output_dir: Path) -> None:
    """OutputDirError when `output_dir` is named `checkpoint-<step>` in a training output folder (one holding
    checkpoints or a trainer state): there the Trainer's save_total_limit would delete it as an old checkpoint, a
    resumed run reaching that step would write its checkpoint into it, and the next average would take it for one."""
    run_dir = Path(os.path.abspath(output_dir)).parent
    if CHECKPOINT_PATTERN.match(output_dir.name) and run_dir.is_dir() and (
            find_checkpoints(run_dir) or (run_dir / TRAINER_STATE_FILE).is_file()):
        raise OutputDirError(
            f"output_dir {str(output_dir)!r} is named as a checkpoint of the training run in {str(run_dir)!r}: its "
            "Trainer would delete it (save_total_limit) or write a checkpoint into it on resuming, and averaging "
            "that run would take it for a checkpoint; choose another name (e.g. averaged)")


def average_checkpoints(
    paths_or_output_dir: str | os.PathLike | Sequence[str | os.PathLike], last_n: int | None,
    output_dir: str | os.PathLike
) -> Path:
    """Average the parameters of the last `last_n` checkpoints (`select_checkpoints`; None: 5 of a training output
    folder, all of the checkpoint folders given) into a new model folder `output_dir` and return it.

    Floating-point tensors are averaged in float64 and cast back to their dtype; other tensors (integer buffers) are
    taken from the newest checkpoint. All checkpoints must hold the same tensor names and shapes. `output_dir` must
    not exist yet or be empty; it is filled through a temporary folder, so a failure leaves nothing half-written.
    """
    return _average_selected(select_checkpoints(paths_or_output_dir, last_n), output_dir)


def _average_selected(checkpoints: Sequence[Path], output_dir: str | os.PathLike) -> Path:
    """`average_checkpoints` of the checkpoints `select_checkpoints` chose (one of them: `--last_n 1` of a training
    output folder), not selected again: one folder alone is refused there as nothing to average."""
    output_dir = Path(output_dir)
    check_new_output_dir(output_dir)
    check_not_a_checkpoint_name(output_dir)
    averaged = average_weights(checkpoints)

    with staged_folder(output_dir, last=CONFIG_NAME) as staging:
        for item in checkpoints[-1].iterdir():
            if item.is_file() and copied_from_newest(item.name):
                shutil.copyfile(item, staging / item.name)
        # the record of the run (languages and recipe, for scoring these weights), without the scores and metrics
        # of its final weights: this average is not measured
        record = training_record(checkpoints[-1]) or training_record(checkpoints[-1].parent)
        if record is not None:
            record.scores, record.metrics = {}, {}
            (staging / RUN_RECORD_FILE).write_text(json.dumps(record.to_json(), indent=1) + "\n")
        save_file({name: tensor.contiguous() for name, tensor in averaged.items()}, staging / SAFE_WEIGHTS_NAME,
                  metadata={"format": "pt"})
        apply_umask_mode_to_weights(staging)
        provenance = {"checkpoints": [str(path.resolve()) for path in checkpoints], "last_n": len(checkpoints)}
        (staging / AVERAGED_CHECKPOINTS_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        if _ships_remote_code(staging):
            add_translation_pipeline(staging)
            (staging / CARD_FILE).write_text(folder_model_card(staging, record, name=output_dir.resolve().name),
                                             encoding="utf-8")
    return output_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-relpos-average",
        description="Average the parameters of the last N Trainer checkpoints into a loadable model folder.",
    )
    parser.add_argument("inputs", nargs="+", type=expand_home,
                        help="a training output folder, or checkpoint folders (oldest first)")
    parser.add_argument("--last_n", type=int, default=None,
                        help=f"how many of the newest checkpoints to average (default: {DEFAULT_LAST_N} of a "
                             "training output folder's, all of the checkpoint folders listed)")
    parser.add_argument("--output_dir", required=True, type=expand_home, help="new folder for the averaged model")
    add_import_modules_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        import_user_modules(args.import_modules)
        checkpoints = select_checkpoints(args.inputs if len(args.inputs) > 1 else args.inputs[0], args.last_n)
        written = _average_selected(checkpoints, args.output_dir)
    except (ValueError, OSError) as error:   # OutputDirError is a ValueError
        parser.exit(2, f"{parser.prog}: error: {' '.join(str(error).split())}{import_modules_hint(error)}\n")
    print(f"averaged {len(checkpoints)} checkpoint(s) into {written}")


if __name__ == "__main__":
    main()
