"""The tokenizer of a translation run: `tokenizer_name`'s or the model's, else the one a previous run saved in
output_dir when it was trained with this run's settings, else a new joint BPE tokenizer trained on the training split
(all of it, or a fixed random sample of `tokenizer_training_pairs`); saved into output_dir with the settings it was
trained with, which decide whether a later run may reuse it. The tokenizer itself is defined in `tokenization`."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.tokenization_utils_base import TOKENIZER_CONFIG_FILE

from ..publish.files import move_folder_contents, owned_prefix, remove_abandoned
from .arguments import ConfigError, ModelArguments, TranslationTrainingArguments
from .data import DataArguments
from .tokenization import (
    MIN_FREQUENCY,
    TOKENIZER_FILE,
    has_saved_tokenizer,
    load_tokenizer,
    load_tokenizer_settings,
    save_tokenizer_settings,
    settings_differences,
    tokenizer_settings,
    train_joint_tokenizer,
)

logger = logging.getLogger(__name__)

# The tag of the folder a tokenizer is saved into before its files move into output_dir (`save_tokenizer`).
TOKENIZER_STAGING = ".tokenizer."

# The seed of the sample of training pairs a tokenizer is trained on (`tokenizer_training_pairs`).
TOKENIZER_SAMPLE_SEED = 0
# Texts per batch handed to the tokenizer trainer.
TOKENIZER_TRAINING_BATCH = 10_000


def describe_training_data(data_args: DataArguments) -> str:
    """Where the training pairs come from, in words (recorded with a trained tokenizer)."""
    if data_args.train_file:
        origin = f"train_file {str(Path(data_args.train_file).resolve())!r}"
    elif data_args.uses_demo_corpus:
        origin = f"demo corpus (demo_seed {data_args.demo_seed}, {data_args.demo_train_pairs} pairs)"
    else:
        origin = f"dataset {data_args.dataset_name!r} ({data_args.dataset_config_name})"
    cap = f", first {data_args.max_train_samples} pairs" if data_args.max_train_samples else ""
    sample = (f", a sample of {data_args.tokenizer_training_pairs} pairs" if data_args.tokenizer_training_pairs
              else "")
    return f"{origin}{cap}, {data_args.source_lang}+{data_args.target_lang}{sample}"


def tokenizer_training_sample(train: Dataset, pairs: int | None) -> Dataset:
    """The training pairs a new tokenizer learns from: all, or a random sample of `pairs` (in corpus order, drawn
    with `TOKENIZER_SAMPLE_SEED`)."""
    if pairs is None or pairs >= len(train):
        return train
    chosen = np.random.default_rng(TOKENIZER_SAMPLE_SEED).choice(len(train), size=pairs, replace=False)
    return train.select(np.sort(chosen))


class TextBatches:
    """The source texts, then the target texts of `dataset`, `TOKENIZER_TRAINING_BATCH` at a time, read as Arrow
    columns with a progress bar; re-iterable: each `iter()` reads the dataset afresh (a tokenizer_character_coverage
    below 1 reads it twice, to count its characters and to train)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[list[str]]:
        columns = self.dataset.with_format("arrow")
        with tqdm(total=2 * len(self.dataset), desc="Reading texts for the tokenizer", unit=" texts") as bar:
            for column in ("source", "target"):
                for batch in columns.iter(TOKENIZER_TRAINING_BATCH):
                    bar.update(batch.num_rows)
                    yield batch[column].to_pylist()


def obtain_tokenizer(
    model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments,
    train_data_sha256: str | None, training_split: Callable[[], Dataset], retrain: bool, resuming: bool,
) -> tuple[PreTrainedTokenizerBase, dict[str, Any] | None]:
    """(tokenizer, settings to save with it when newly trained): tokenizer_name, else the model's, else the one in
    output_dir if it was trained with this run's settings (any when resuming), else a new one trained on the training
    split (`training_split()` reads it, only then). `retrain` ignores the one in output_dir (a fresh run)."""
    for field_name in ("tokenizer_name", "model_name_or_path"):
        name_or_path = getattr(model_args, field_name)
        if name_or_path is not None:
            try:
                tokenizer = load_tokenizer(name_or_path, model_args.cache_dir)
            except (OSError, ValueError) as error:
                raise ConfigError(f"{field_name} {name_or_path!r}: cannot load its tokenizer: {error}") from None
            if field_name == "tokenizer_name" and model_args.model_name_or_path is not None:
                _warn_if_not_the_models_tokenizer(tokenizer, model_args.tokenizer_name, model_args.model_name_or_path)
            return tokenizer, None
    if train_data_sha256 is None:
        raise ConfigError("no tokenizer_name or model_name_or_path, and no training split to train a tokenizer on")
    output_dir = training_args.output_dir
    if data_args.tokenizer_training_pairs is not None:
        sample = f"{train_data_sha256}\0sample {data_args.tokenizer_training_pairs} seed {TOKENIZER_SAMPLE_SEED}"
        train_data_sha256 = hashlib.sha256(sample.encode()).hexdigest()
    settings = tokenizer_settings(train_data_sha256, model_args.tokenizer_vocab_size,
                                  model_args.tokenizer_character_coverage, describe_training_data(data_args))
    if has_saved_tokenizer(output_dir) and not retrain:
        differences = settings_differences(load_tokenizer_settings(output_dir), settings)
        if differences and not resuming:
            raise ConfigError(
                f"output_dir {output_dir!r} holds a tokenizer trained with other settings than this run's "
                f"({'; '.join(differences)}): train a new one with --overwrite_output_dir true (a fresh run), use "
                f"it as it is with --tokenizer_name {output_dir}, or choose another output_dir")
        if differences:
            logger.warning("Resuming with the tokenizer saved in %s (the checkpoints need it), although %s",
                           output_dir, "; ".join(differences))
        else:
            logger.info("Reusing the tokenizer saved in %s (trained with this run's settings)", output_dir)
        return load_tokenizer(output_dir), None
    texts = tokenizer_training_sample(training_split(), data_args.tokenizer_training_pairs)
    logger.info("Training a joint BPE tokenizer (vocabulary %d) on the training split", model_args.tokenizer_vocab_size)
    started = time.monotonic()
    tokenizer = train_joint_tokenizer(TextBatches(texts), model_args.tokenizer_vocab_size,
                                      character_coverage=model_args.tokenizer_character_coverage)
    release_freed_memory()
    logger.info("Trained the tokenizer in %.1f s", time.monotonic() - started)
    if len(tokenizer) < model_args.tokenizer_vocab_size:
        logger.info("The tokenizer has %d tokens of the %d asked for (tokenizer_vocab_size): the training split has "
                    "no more pairs of symbols seen at least %d times to merge", len(tokenizer),
                    model_args.tokenizer_vocab_size, MIN_FREQUENCY)
    return tokenizer, settings


def _warn_if_not_the_models_tokenizer(tokenizer: PreTrainedTokenizerBase, tokenizer_name: str,
                                      model_name_or_path: str) -> None:
    """A warning when `model_name_or_path` is a folder with a saved tokenizer whose vocabulary (token -> id) is not
    `tokenizer`'s: the pretrained embeddings would be read for other tokens than they were trained on. (A larger
    tokenizer than the model's embeddings is refused when the model is built.)"""
    if not (Path(model_name_or_path) / TOKENIZER_CONFIG_FILE).is_file():
        return
    try:
        own = AutoTokenizer.from_pretrained(model_name_or_path).get_vocab()
    except (OSError, ValueError):   # a tokenizer that does not load cannot be compared
        return
    given = tokenizer.get_vocab()
    if given != own:
        moved = sum(own.get(token) != index for token, index in given.items())
        logger.warning(
            "tokenizer_name %s is not the tokenizer saved with model_name_or_path %s (%d of its %d tokens are missing "
            "there or have another id; that one has %d): the model reads and writes those ids as the tokens it was "
            "trained on until fine-tuning relearns them; leave tokenizer_name null to use the model's own tokenizer",
            tokenizer_name, model_name_or_path, moved, len(given), len(own))


def release_freed_memory() -> None:
    """Hand the memory the tokenizer trainer freed (Rust, through the C allocator, which keeps it) back to the system,
    so that this process, and the tokenization workers forked from it next, do not keep the trainer's peak."""
    with contextlib.suppress(OSError, AttributeError):   # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, output_dir: str | os.PathLike,
                   settings: dict[str, Any] | None = None) -> None:
    """Save next to the model with its training settings; files are staged and moved in, tokenizer.json (the reuse
    marker) last."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_abandoned(output_dir, TOKENIZER_STAGING)
    staging = Path(tempfile.mkdtemp(prefix=owned_prefix(TOKENIZER_STAGING), dir=output_dir))
    try:
        tokenizer.save_pretrained(staging)
        if settings is not None:
            save_tokenizer_settings(settings, staging)
        move_folder_contents(staging, output_dir, last=TOKENIZER_FILE)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
