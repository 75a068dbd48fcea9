"""A training output folder's `checkpoint-<step>` folders: listed newest last, whether each is complete (the one to
resume from), and the average of their weights (Vaswani et al. 2017). `hf_relpos.tools.average` writes an averaged
model folder; `average_checkpoints` (a training argument) makes the average a run's final model."""


from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..model.configuration_relpos import RelPosTransformerConfig
from ..publish.files import WeightsFileError, reading_weights

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE_FILE = "trainer_state.json"


def checkpoint_step(checkpoint: Path) -> int:
    """The step of a `checkpoint-<step>` folder, from its name."""
    return int(CHECKPOINT_PATTERN.match(checkpoint.name).group(1))


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


def complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The complete `checkpoint-<step>` folders of a training output folder, oldest first (incomplete ones skipped)."""
    return [path for path in find_checkpoints(output_dir) if is_complete_checkpoint(path)]


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete `checkpoint-<step>` folder of a training output folder (incomplete ones are skipped)."""
    complete = complete_checkpoints(output_dir)
    return complete[-1] if complete else None


def load_weights(checkpoint: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint saved as one safetensors file or as shards with an index. A weights file that a
    kill cut short (safetensors before 0.8 writes in place) or that is corrupt is a ValueError naming it."""
    checkpoint = Path(checkpoint)
    if (checkpoint / SAFE_WEIGHTS_NAME).is_file():
        return _load_weights_file(checkpoint / SAFE_WEIGHTS_NAME)
    index = json.loads((checkpoint / SAFE_WEIGHTS_INDEX_NAME).read_text())
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        weights.update(_load_weights_file(checkpoint / shard))
    return weights


def _load_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file; a file cut short or corrupt is a ValueError naming it and its checkpoint."""
    try:
        with reading_weights(path.name):
            return load_file(path)
    except WeightsFileError as error:
        raise WeightsFileError(f"{str(path.parent)!r}: {error}: a checkpoint whose writing was interrupted; leave it "
                               "out (name the checkpoints to average, or a smaller last_n)") from None


@functools.cache
def _default_config() -> dict:
    return RelPosTransformerConfig().to_dict()


def saved_config(checkpoint: str | os.PathLike) -> dict | None:
    """A checkpoint's config.json, without the transformers release that wrote it and, for an hf_relpos model, with
    the default of every field it lacks (one added after it was saved; it loads with that default); None where it
    has none."""
    path = Path(checkpoint) / CONFIG_NAME
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("model_type") == RelPosTransformerConfig.model_type:
        config = {**_default_config(), **config}
    config.pop("transformers_version", None)
    return config


# config.json fields that change nothing the weights compute: `use_cache` (checkpoints of a run resumed with another
# hf_relpos version may differ in it) and `custom_pipelines` (a run's final model declares the translation pipeline,
# its checkpoints do not)
WEIGHT_NEUTRAL_CONFIG_FIELDS = ("use_cache", "custom_pipelines")


def config_differences(checkpoint: str | os.PathLike, reference: str | os.PathLike) -> list[str]:
    """The config.json fields in which two checkpoints differ, as "name: value vs value" (none where either has no
    config.json; a field one of them lacks counts at its default), but for `WEIGHT_NEUTRAL_CONFIG_FIELDS`. Within one
    run they differ only where training changes the config (`fade_absolute_positions`)."""
    config, other = saved_config(checkpoint), saved_config(reference)
    if config is None or other is None:
        return []
    return [f"{name}: {config.get(name)!r} vs {other.get(name)!r}" for name in sorted(config.keys() | other.keys())
            if name not in WEIGHT_NEUTRAL_CONFIG_FIELDS and config.get(name) != other.get(name)]


# the saved tokenizer files that define its token ids: hf_relpos' tokenizer.json, a converted MarianMT model's joint
# vocabulary and SentencePiece models
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "source.spm", "target.spm")


def _token_ids(path: Path) -> object:
    """What in a tokenizer file decides the token ids: tokenizer.json's vocabulary, merges (a merge as a pair,
    however the tokenizers release wrote it) and added tokens (each one's id and text: language tags added after
    training; not their flags), another file's bytes."""
    if path.name != "tokenizer.json":
        return path.read_bytes()
    saved = json.loads(path.read_text(encoding="utf-8"))
    model = saved.get("model") or {}
    merges = [tuple(merge.split(" ", 1)) if isinstance(merge, str) else tuple(merge) for merge in model.get("merges", [])]
    added = sorted((token.get("id"), token.get("content")) for token in saved.get("added_tokens") or [])
    return model.get("vocab"), merges, added


def saved_token_ids(folder: str | os.PathLike) -> dict[str, object]:
    """What each tokenizer file (`VOCABULARY_FILES`) that `folder` holds decides of the token ids (`_token_ids`), by
    file name; empty where it saved no tokenizer."""
    return {name: _token_ids(Path(folder) / name) for name in VOCABULARY_FILES if (Path(folder) / name).is_file()}


def vocabulary_differences(token_ids: dict[str, object], reference: dict[str, object]) -> list[str]:
    """The tokenizer files that both `saved_token_ids` hold and whose token ids differ. Within one run they never
    differ; the final models of two runs whose tokenizers were trained on other texts do, and their weights do not
    average into a model of either."""
    return [name for name in token_ids if name in reference and token_ids[name] != reference[name]]


def average_weights(checkpoints: Sequence[str | os.PathLike]) -> dict[str, torch.Tensor]:
    """The mean of the checkpoints' tensors: floating-point tensors summed in float64 and cast back to their dtype,
    other tensors (integer buffers) taken from the newest (last) checkpoint. Every checkpoint must hold the same
    config, the same tokenizer where they saved one (`vocabulary_differences`) and the same tensor names and shapes
    (ValueError naming the first that does not): weights trained for different configs (e.g. different
    `absolute_positions_scale`) or token ids do not average into a model of either."""
    reference_token_ids = saved_token_ids(checkpoints[-1])   # read once, not once per checkpoint
    for checkpoint in checkpoints[:-1]:
        differences = config_differences(checkpoint, checkpoints[-1])
        if differences:
            raise ValueError(f"{str(checkpoint)!r} and {str(checkpoints[-1])!r} differ in their config "
                             f"({'; '.join(differences)}): only checkpoints of one model can be averaged")
        vocabularies = vocabulary_differences(saved_token_ids(checkpoint), reference_token_ids)
        if vocabularies:
            raise ValueError(f"{str(checkpoint)!r} and {str(checkpoints[-1])!r} hold different tokenizers "
                             f"({', '.join(vocabularies)}): weights trained for other token ids do not average into "
                             "a model of either; average checkpoints of one tokenizer")
    newest = load_weights(checkpoints[-1])
    sums = {name: tensor.to(torch.float64) for name, tensor in newest.items() if tensor.is_floating_point()}
    for checkpoint in checkpoints[:-1]:
        weights = load_weights(checkpoint)
        if weights.keys() != newest.keys():
            difference = sorted(weights.keys() ^ newest.keys())
            raise ValueError(f"{str(checkpoint)!r} and {str(checkpoints[-1])!r} differ in tensors: {difference[:10]}")
        for name, total in sums.items():
            if weights[name].shape != total.shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(weights[name].shape)} in {str(checkpoint)!r} "
                                 f"but {tuple(total.shape)} in {str(checkpoints[-1])!r}")
            total += weights[name].to(torch.float64)
    return {name: (sums[name] / len(checkpoints)).to(tensor.dtype) if name in sums else tensor
            for name, tensor in newest.items()}
