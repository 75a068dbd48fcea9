"""The final model of a training run: optionally the average of its last checkpoints (`average_checkpoints`,
Vaswani et al. 2017) loaded into the trained model in every process, then saved into output_dir so that a kill
mid-way never leaves a folder mixing old and new files. The checkpoint folders themselves (listing, completeness,
the average of their weights) are `checkpoints`' job."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..publish.files import move_folder_contents, write_text_atomic
from ..publish.hub import add_translation_pipeline
from ..publish.records import AVERAGED_CHECKPOINTS_FILE
from .checkpoints import average_weights, complete_checkpoints, config_differences
from .safety import FINAL_MODEL_STAGING
from .trainer import TranslationTrainer, adopt_saved_absolute_positions_scale

logger = logging.getLogger(__name__)


def average_final_weights(trainer: TranslationTrainer, count: int) -> None:
    """`average_checkpoints`: load the mean of the run's last `count` complete checkpoints (fewer, with a warning, if
    it saved fewer; none: the trained weights stay) into the trained model, in every process, so that the model
    saved, evaluated and predicted with is the average (Vaswani et al. 2017). Only checkpoints saved with the newest
    one's config are averaged (the others are named in a warning; under `fade_absolute_positions` they were trained
    to another `absolute_positions_scale`), and the model takes that checkpoint's scale.
    output_dir/averaged_checkpoints.json names the checkpoints."""
    trainer.accelerator.wait_for_everyone()   # the main process wrote the checkpoints
    output_dir = Path(trainer.args.output_dir)
    checkpoints = complete_checkpoints(output_dir)[-count:]
    if not checkpoints:
        logger.warning("average_checkpoints=%d: the run saved no checkpoint; the final model is the trained weights",
                       count)
        return
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
            state[name].copy_(tensor)
    if trainer.args.should_save:
        provenance = {"average_checkpoints": count, "checkpoints": [path.name for path in checkpoints]}
        write_text_atomic(output_dir / AVERAGED_CHECKPOINTS_FILE, json.dumps(provenance, indent=2) + "\n")
    logger.info("average_checkpoints: the final model is the average of %s", ", ".join(path.name for path in checkpoints))


def save_final_model(trainer: TranslationTrainer) -> None:
    """`trainer.save_model()` with the translation pipeline its model card shows (`add_translation_pipeline`), written
    to a staging folder inside output_dir and moved in file by file with the weights (model.safetensors, or the shard
    index) removed first and moved last: a kill mid-way leaves a folder without weights, which `from_pretrained`
    refuses, never one that mixes old and new files."""
    output_dir = Path(trainer.args.output_dir)
    staging = output_dir / FINAL_MODEL_STAGING
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.save_model(str(staging))
    if trainer.args.should_save:
        add_translation_pipeline(staging)
        weights = SAFE_WEIGHTS_INDEX_NAME if (staging / SAFE_WEIGHTS_INDEX_NAME).is_file() else SAFE_WEIGHTS_NAME
        for name in (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME):
            (output_dir / name).unlink(missing_ok=True)
        move_folder_contents(staging, output_dir, last=weights)
