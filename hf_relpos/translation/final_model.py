"""The final model of a training run: optionally the average of its last checkpoints (`average_checkpoints`,
Vaswani et al. 2017) loaded into the trained model in every process, then saved into output_dir so that a kill
mid-way never leaves a folder mixing old and new files, nor the new model beside the record, card or scores of the
one it replaced. The checkpoint folders themselves (listing, completeness,
the average of their weights) are `checkpoints`' job."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..publish.files import move_folder_contents, write_text_atomic
from ..publish.hub import add_translation_pipeline
from ..publish.records import AVERAGED_CHECKPOINTS_FILE
from .checkpoints import average_weights, checkpoint_step, complete_checkpoints, config_differences, load_weights
from .preflight import remove_matching
from .safety import FINAL_MODEL_DESCRIPTIONS, FINAL_MODEL_STAGING
from .trainer import TranslationTrainer, adopt_saved_absolute_positions_scale

logger = logging.getLogger(__name__)


def average_final_weights(trainer: TranslationTrainer, count: int) -> dict[str, Any] | None:
    """`average_checkpoints`: load the mean of the run's last `count` complete checkpoints on its save schedule
    (`TranslationTrainer.saves_on_schedule`: a SIGTERM's checkpoint at another step is left out, so that a run
    stopped and resumed averages the checkpoints of an uninterrupted one; fewer, with a warning, if it saved fewer;
    none: the trained weights stay) up to the step it ended at (one past it is an earlier run's, which trained on
    from the checkpoint this one resumed from, with a higher max_steps), into the trained model, in every process, so
    that the model saved, evaluated and predicted with is the average (Vaswani et al. 2017). Only checkpoints saved with the newest
    one's config are averaged (the others are named in a warning; under `fade_absolute_positions` they were trained
    to another `absolute_positions_scale`), and the model takes that checkpoint's scale.
    Returns what averaged_checkpoints.json, saved with the model (`save_final_model`), says: the checkpoints averaged
    (None: none were)."""
    trainer.accelerator.wait_for_everyone()   # the main process wrote the checkpoints
    output_dir = Path(trainer.args.output_dir)
    ended_at = trainer.state.global_step
    complete = complete_checkpoints(output_dir)
    later = [path for path in complete if checkpoint_step(path) > ended_at]
    if later:
        logger.warning("average_checkpoints=%d: %s left out, saved past step %d, where this run ended, by an earlier "
                       "run in output_dir that trained on from the checkpoint this one resumed from", count,
                       ", ".join(path.name for path in later), ended_at)
    complete = [path for path in complete if path not in later]
    scheduled = [path for path in complete if trainer.saves_on_schedule(checkpoint_step(path))]
    if len(scheduled) < len(complete):
        logger.info("average_checkpoints=%d: %s left out, saved off the save schedule (by a SIGTERM: "
                    "enable_jit_checkpoint); the average is of the checkpoints an uninterrupted run saves", count,
                    ", ".join(path.name for path in complete if path not in scheduled))
    checkpoints = scheduled[-count:]
    if not checkpoints:
        logger.warning("average_checkpoints=%d: the run saved no checkpoint; the final model is the trained weights",
                       count)
        return None
    if len(checkpoints) < count:
        logger.warning("average_checkpoints=%d: the run saved only %d checkpoint(s); averaging those", count,
                       len(checkpoints))
    differing = {path: config_differences(path, checkpoints[-1]) for path in checkpoints[:-1]}
    differing = {path: differences for path, differences in differing.items() if differences}
    if differing:
        logger.warning("average_checkpoints=%d: %s; averaging the %d checkpoint(s) saved with the config of %s only "
                       "(weights trained for another config do not average into this model)", count,
                       "; ".join(f"{path.name} saved another config than {checkpoints[-1].name} "
                                 f"({', '.join(differences)})" for path, differences in differing.items()),
                       len(checkpoints) - len(differing), checkpoints[-1].name)
        checkpoints = [path for path in checkpoints if path not in differing]
    averaged = average_weights(checkpoints)
    model = trainer.accelerator.unwrap_model(trainer.model)
    adopt_saved_absolute_positions_scale(model, checkpoints[-1])
    state = model.state_dict()   # shares storage with the parameters
    unknown = sorted(averaged.keys() - state.keys())
    if unknown:
        raise RuntimeError(f"average_checkpoints: the checkpoints hold tensors the model lacks: {unknown[:10]}")
    with torch.no_grad():
        for name, tensor in averaged.items():
            state[name].copy_(_as_target(tensor, state[name]))
    logger.info("average_checkpoints: the final model is the average of %s", ", ".join(path.name for path in checkpoints))
    return {"average_checkpoints": count, "checkpoints": [path.name for path in checkpoints]}


def _as_target(tensor: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A full tensor of the average, as `target` holds it: under FSDP2 (configs/accelerate/fsdp.yaml) the model's
    parameters are DTensors sharded over the processes, and copying a plain tensor into one is an error ("got mixed
    torch.Tensor and DTensor"); every process holds the same average, so it is distributed like the target and each
    process copies its own shard."""
    if not torch.distributed.is_available():
        return tensor
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        return distribute_tensor(tensor.to(device=target.device, dtype=target.dtype), target.device_mesh,
                                 target.placements)
    return tensor


def save_final_model(trainer: TranslationTrainer, averaged: dict[str, Any] | None = None) -> None:
    """`trainer.save_model()` with the translation pipeline its model card shows (`add_translation_pipeline`) and, for
    an average (`average_final_weights`), averaged_checkpoints.json saying which, written to a staging folder inside
    output_dir. The previous final model's record, card, scores and translations (`FINAL_MODEL_DESCRIPTIONS`) are
    removed, then its weights (model.safetensors, or the shard index), and the staged files are moved in with the
    weights last: a kill mid-way leaves a folder without weights, which `from_pretrained` refuses, or the new model
    without a record; never one that mixes old and new files, or that describes the new model with the old one's
    record and scores."""
    output_dir = Path(trainer.args.output_dir)
    staging = output_dir / FINAL_MODEL_STAGING
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.save_model(str(staging))
    if trainer.args.should_save:
        add_translation_pipeline(staging)
        if averaged is not None:
            write_text_atomic(staging / AVERAGED_CHECKPOINTS_FILE, json.dumps(averaged, indent=2) + "\n")
        weights = SAFE_WEIGHTS_INDEX_NAME if (staging / SAFE_WEIGHTS_INDEX_NAME).is_file() else SAFE_WEIGHTS_NAME
        remove_matching(output_dir, FINAL_MODEL_DESCRIPTIONS)
        for name in (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME):
            (output_dir / name).unlink(missing_ok=True)
        move_folder_contents(staging, output_dir, last=weights)


def load_final_model(model: torch.nn.Module, output_dir: str | Path) -> None:
    """The final model a training run saved into `output_dir` (`save_final_model`: one weights file or shards),
    loaded into `model`, the model the same run builds before training (same config, kernel and generation
    settings), with the `absolute_positions_scale` it was saved with (`fade_absolute_positions`, or that of the
    averaged or best checkpoint): a run that finishes a stopped one (`finished_training`) scores and records the
    model the stopped run saved. Called before the Trainer is built (so, under FSDP, on the whole model)."""
    weights = load_weights(output_dir)
    state = model.state_dict()   # shares storage with the parameters; tied weights are saved once
    unknown = sorted(weights.keys() - state.keys())
    if unknown:
        raise RuntimeError(f"{str(output_dir)!r}: the final model holds tensors this run's model lacks: {unknown[:10]}")
    with torch.no_grad():
        for name, tensor in weights.items():
            if tensor.shape != state[name].shape:
                raise RuntimeError(f"{str(output_dir)!r}: tensor {name!r} has shape {tuple(tensor.shape)} in the final "
                                   f"model, {tuple(state[name].shape)} in this run's model")
            state[name].copy_(tensor)
    loaded = {state[name].data_ptr() for name in weights}
    missing = sorted(name for name in state.keys() - weights.keys() if state[name].data_ptr() not in loaded)
    if missing:
        raise RuntimeError(f"{str(output_dir)!r}: the final model lacks tensors of this run's model: {missing[:10]}")
    adopt_saved_absolute_positions_scale(model, output_dir)
