"""The preparation step of a translation run: which splits it reads, its tokenizer and model (built, and so checked,
before any data is written), and each split tokenized and filtered, or loaded when an earlier run or process
prepared it from the same files, tokenizer and settings; the evaluation splits sorted by source length for
generation. How a prepared split is stored on disk (memory-mapped Arrow under a key of its inputs, published
atomically, in output_dir or in a `prepared_data_dir` shared by runs) is `prepared`'s job."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ..model.modeling_relpos import RelPosTransformerForConditionalGeneration
from ..publish.records import SAMPLE_CAPS
from .arguments import ConfigError, ModelArguments, TranslationTrainingArguments, data_seed
from .batching import check_examples_fit
from .data import (
    CONCATENATION_JOIN_RULE,
    DEMO_DATA_FOLDER,
    EVALUATION_OVERLONG_PAIRS,
    PROGRESS_MIN_BYTES,
    DataArguments,
    LengthReport,
    compression_of,
    data_file_format,
    example_lengths,
    existing_data_files,
    has_references,
    hub_split_names,
    load_parallel_splits,
    local_folder_split_files,
    local_split_files,
    parquet_uncompressed_bytes,
    sort_by_source_length,
    tokenize_evaluation_pairs,
    tokenize_training_pairs,
    warn_of_unwritable_references,
    with_concatenated_pairs,
)
from .model_setup import build_model, max_new_tokens_for
from .prepared import (
    PreparedStore,
    files_sha256,
    load_prepared,
    preparation,
    preparation_key,
    prepared_store,
    publish_prepared,
    tokenizer_sha256,
)
from .tokenizer_setup import obtain_tokenizer
from .trainer import EvaluationSet, padding_multiple, token_budget_sampler

logger = logging.getLogger(__name__)

# The text a compressed data file holds, per byte of it, for the disk budget: an estimate (gzip shrinks English prose
# about 3.5 times, bzip2 and xz about 4.3 times; the repetitive demo corpus 5 to 10 times).
TEXT_PER_COMPRESSED_BYTE = 4


def data_file_text_bytes(path: Path) -> int:
    """The text a data file holds, for the disk budget: a .parquet file's size uncompressed, as its footer states it
    (`parquet_uncompressed_bytes`); a compressed file `TEXT_PER_COMPRESSED_BYTE` times its size, the text it holds
    being unknown until it is read; any other file its size."""
    if data_file_format(path) == "parquet":
        return parquet_uncompressed_bytes(path)
    return path.stat().st_size * (TEXT_PER_COMPRESSED_BYTE if compression_of(path) else 1)


def splits_to_read(training_args: TranslationTrainingArguments) -> tuple[str, ...]:
    """The splits the run needs: "train" to train, "validation" to evaluate (at the end, or during training), "test"
    to predict."""
    needs_validation = training_args.do_eval or (training_args.do_train and training_args.eval_strategy != "no")
    return tuple(split for split, wanted in (("train", training_args.do_train), ("validation", needs_validation),
                                             ("test", training_args.do_predict)) if wanted)


class RawSplits:
    """The run's splits as read from their files or the Hub, each read once and only when needed (a tokenizer to
    train, data to prepare); local files are read into memory-mapped Arrow files in the preparation folder, whose disk
    budget counts the splits in `to_prepare` (all of them until the run knows which need preparing)."""

    def __init__(self, data_args: DataArguments, splits: tuple[str, ...], output_dir: str, store: PreparedStore,
                 cache_dir: str | None, stack: contextlib.ExitStack) -> None:
        self.data_args, self.splits, self.store, self.cache_dir, self.stack = (
            data_args, splits, store, cache_dir, stack)
        self.demo_directory = Path(output_dir) / DEMO_DATA_FOLDER
        self.files = local_split_files(data_args, splits, self.demo_directory)
        if self.files is not None and data_args.uses_local_files and data_args.dataset_name:
            logger.info("Local files given: dataset_name %r is not used.", data_args.dataset_name)
        self.to_prepare = splits
        self.loaded: dict[str, Dataset] = {}
        self.folder: Path | None = None
        self.folder_files: dict[str, list[Path]] | None = None   # a local dataset folder's, per split name

    def data_files(self, split: str) -> list[Path]:
        """The files `split` is read from: its local file or plain-text pair, or those of a local dataset folder that
        its configuration reads for it (`local_folder_split_files`, resolved once for every split; none for a Hub
        dataset)."""
        if self.files is not None:
            return existing_data_files(self.files[split], self.data_args.source_lang, self.data_args.target_lang)
        folder = self.data_args.local_dataset_folder
        if folder is None:
            return []
        if self.folder_files is None:
            names = [hub_split_names(self.data_args)[name] for name in self.splits]
            self.folder_files = local_folder_split_files(folder, self.data_args.dataset_config_name, names,
                                                         self.cache_dir)
        return self.folder_files[hub_split_names(self.data_args)[split]]

    def identities(self) -> dict[str, str]:
        """Per split, what its texts depend on: the SHA-256 of its files (a local dataset folder's: those its
        configuration reads for it, with the configuration and split read) and the settings that select its texts (the languages, the sample cap); for
        a Hub dataset, the `datasets` fingerprint of the loaded split."""
        folder = self.data_args.local_dataset_folder if self.files is None else None
        if self.files is None and folder is None:
            return {split: self.get(split)._fingerprint for split in self.splits}
        identities = {}
        files = {split: tuple(self.data_files(split)) for split in self.splits}
        distinct = dict.fromkeys(files.values())   # a folder's files, read by every split, are hashed once
        started, size = time.monotonic(), sum(path.stat().st_size for paths in distinct for path in paths)
        with tqdm(total=size, unit="B", unit_scale=True, desc="Hashing the data files",
                  disable=size < PROGRESS_MIN_BYTES) as bar:
            digests = {paths: files_sha256(paths, bar.update) for paths in distinct}
            for split in self.splits:
                selection = {"files": digests[files[split]], "sample_cap": getattr(self.data_args, SAMPLE_CAPS[split]),
                             "languages": [self.data_args.source_lang, self.data_args.target_lang]}
                if folder is not None:   # which of the folder's files, configurations and splits
                    selection |= {"paths": [path.relative_to(folder).as_posix() for path in files[split]],
                                  "config": self.data_args.dataset_config_name,
                                  "split_name": hub_split_names(self.data_args)[split]}
                identities[split] = hashlib.sha256(json.dumps(selection, sort_keys=True).encode()).hexdigest()
        logger.info("Hashed the data files (%.0f MiB) in %.1f s", size / 2**20, time.monotonic() - started)
        return identities

    def text_bytes(self, splits: tuple[str, ...]) -> int:
        """The size of what `splits` are read from: their files (`data_file_text_bytes`), or the loaded Hub splits'
        Arrow tables."""
        if self.files is None:
            return sum(self.get(split).data.nbytes for split in splits)
        return sum(data_file_text_bytes(path) for split in splits for path in self.data_files(split))

    def prepared_text_bytes(self, splits: tuple[str, ...]) -> int:
        """`text_bytes` of `splits`, the training text counted 1 + k x concatenated_pairs times (a joined pair holds
        k pairs' text, on average (2 + max_pairs_per_join) / 2)."""
        pairs_per_join = (2 + self.data_args.max_pairs_per_join) / 2
        joined = (pairs_per_join * self.data_args.concatenated_pairs * self.text_bytes(("train",))
                  if "train" in splits else 0)
        return self.text_bytes(splits) + int(joined)

    def workdir(self) -> Path:
        """The preparation folder of this run (created at the first call, with the disk budget of the splits in
        `to_prepare`; removed when the run's preparation ends)."""
        if self.folder is None:
            self.folder = self.stack.enter_context(preparation(self.store,
                                                               self.prepared_text_bytes(self.to_prepare)))
        return self.folder

    def read(self, splits: tuple[str, ...]) -> None:
        """Read each of `splits` (its files are checked as they are read), so that a bad file of any of them stops the
        run before a tokenizer is trained or a split is prepared."""
        for split in splits:
            self.get(split)

    def training_split(self) -> Dataset:
        """The training split, for a new tokenizer to learn from, read after every split to prepare is (a new
        tokenizer prepares them all anew): a bad validation or test file stops the run before the tokenizer trains."""
        self.read(self.to_prepare)
        return self.get("train")

    def get(self, split: str) -> Dataset:
        """The texts of `split` (a Hub dataset loads all its splits at once)."""
        if split not in self.loaded:
            splits = self.splits if self.files is None else (split,)
            workdir = None if self.files is None else self.workdir() / "raw"
            started = time.monotonic()
            loaded = load_parallel_splits(self.data_args, splits, self.demo_directory, cache_dir=self.cache_dir,
                                          workdir=workdir)
            logger.info("Read %s in %.1f s", ", ".join(f"{name} ({len(dataset)} pairs)" for name, dataset in
                                                        loaded.items()), time.monotonic() - started)
            self.loaded.update(loaded)
        return self.loaded[split]


@dataclass
class PreparedData:
    """What a run trains and evaluates on."""

    tokenizer: PreTrainedTokenizerBase
    new_tokenizer_settings: dict[str, Any] | None  # to save with a newly trained tokenizer
    model: RelPosTransformerForConditionalGeneration
    train_dataset: Dataset | None
    evaluation_sets: dict[str, EvaluationSet]
    # split -> where its prepared data came from: {"folder", "key", "reused"} (reused: prepared by an earlier run or
    # process, not by this one)
    prepared_from: dict[str, dict[str, Any]]


# The evaluation sets' prefixes (the Trainer's metric prefixes) -> their splits.
SPLIT_NAMES = {"eval": "validation", "test": "test"}


def prepare_data(model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments,
                 splits: tuple[str, ...], retrain: bool, resuming: bool) -> PreparedData:
    """The tokenizer, the model (built, and so checked, before any data is written) and the tokenized splits: each
    split is loaded (memory-mapped) from output_dir/prepared_data (or prepared_data_dir) when it was prepared from the
    same files, tokenizer and settings, else read, tokenized, filtered and saved there (see
    `hf_relpos.translation.prepared`); the texts
    are read only for a split to prepare or a tokenizer to train, and every split to prepare is read (its files
    checked) before a tokenizer is trained or any split is saved, so that a bad data file writes nothing; the
    training pairs are checked against the token budget (`check_token_budget`) before any split is saved too."""
    output_dir = training_args.output_dir
    store = prepared_store(output_dir, data_args.prepared_data_dir)
    prepared_from: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        raw = RawSplits(data_args, splits, output_dir, store, model_args.cache_dir, stack)
        identities = raw.identities()
        tokenizer, new_settings = obtain_tokenizer(model_args, data_args, training_args, identities.get("train"),
                                                   raw.training_split, retrain=retrain, resuming=resuming)
        model = build_model(model_args, tokenizer, data_args, training_args)
        token_ids = tokenizer_sha256(tokenizer)
        keys, prepared = {}, {}
        for split in splits:
            inputs = {"split": split, "data": identities[split], "tokenizer": token_ids,
                      **{name: getattr(data_args, name) for name in ("max_source_length", "max_target_length")}}
            if split == "train":
                inputs["overlong_pairs"] = data_args.overlong_pairs
                if data_args.concatenated_pairs:
                    inputs |= {"concatenated_pairs": data_args.concatenated_pairs, "seed": data_seed(training_args),
                               "join_rule": CONCATENATION_JOIN_RULE}
                    if data_args.max_pairs_per_join > 2:
                        inputs["max_pairs_per_join"] = data_args.max_pairs_per_join
            else:   # kept whole (evaluation splits prepared before were cut to the length limits: not reused)
                inputs["overlong_pairs"] = EVALUATION_OVERLONG_PAIRS
            keys[split] = inputs
            started, key = time.monotonic(), preparation_key(inputs)
            loaded = load_prepared(store, split, key)
            if loaded is not None:
                logger.info("Reusing the %s data prepared in %s on %s (%d pairs): memory-mapped in %.1f s", split,
                            store.folder(split, key), loaded[1]["prepared_at"], len(loaded[0]),
                            time.monotonic() - started)
                prepared_from[split] = {"folder": str(store.folder(split, key)), "key": key, "reused": True}
                report = LengthReport(**loaded[1]["report"])
                logger.info(report.describe(inputs["overlong_pairs"]))
                prepared[split] = loaded[0]
        if "train" in prepared:
            check_token_budget(prepared["train"], training_args, model)
        raw.to_prepare = tuple(split for split in splits if split not in prepared)
        raw.read(raw.to_prepare)
        for split in raw.to_prepare:   # "train" first: its token budget is checked before any split is saved
            inputs, key = keys[split], preparation_key(keys[split])
            started = time.monotonic()
            workdir = raw.workdir() / "work"
            if split == "train":
                pairs = with_concatenated_pairs(raw.get(split), data_args.concatenated_pairs,
                                                data_seed(training_args), workdir, data_args.max_pairs_per_join)
                dataset, report = tokenize_training_pairs(pairs, tokenizer, data_args, workdir, keep_text=False)
                check_token_budget(dataset, training_args, model)
            else:
                dataset, report = tokenize_evaluation_pairs(raw.get(split), tokenizer, data_args, split, workdir)
            published = publish_prepared(store, raw.workdir(), split, key, dataset,
                                         {"inputs": inputs, "report": vars(report)})
            folder = store.folder(split, key)
            if published:
                logger.info("Prepared the %s data in %.1f s, saved in %s", split, time.monotonic() - started, folder)
            else:
                logger.info("Prepared the %s data in %.1f s, but another run published it in %s meanwhile: loading "
                            "that one, this run's copy is discarded", split, time.monotonic() - started, folder)
            prepared_from[split] = {"folder": str(folder), "key": key, "reused": not published}
            prepared[split] = load_prepared(store, split, key)[0]
    evaluation_sets = {prefix: prepare_evaluation_set(prepared[split])
                       for prefix, split in SPLIT_NAMES.items() if split in prepared}
    for split in SPLIT_NAMES.values():
        if split in prepared:
            warn_of_unwritable_references(prepared[split], tokenizer, split)
    return PreparedData(tokenizer, new_settings, model, prepared.get("train"), evaluation_sets, prepared_from)


def check_evaluation_lengths(evaluation_sets: dict[str, EvaluationSet], training_args: TranslationTrainingArguments,
                             model: RelPosTransformerForConditionalGeneration) -> None:
    """With `position_randomization_at_inference`, `position_randomization_max` must hold each evaluation split's
    longest source (translated whole) and the longest output generate may give it (Ruoss et al. draw n sorted
    positions out of the range); checked before training, since evaluation would otherwise stop at that source."""
    config = model.config
    limit = config.position_randomization_max
    if limit is None or not config.position_randomization_at_inference or not training_args.predict_with_generate:
        return
    for prefix, evaluation in evaluation_sets.items():
        sources = example_lengths(evaluation.dataset)[0]
        longest = int(sources.max()) if len(sources) else 0
        output = 1 + max_new_tokens_for(longest, training_args, config.max_position_embeddings)
        if max(longest, output) > limit:
            raise ConfigError(
                f"position_randomization_max ({limit}) must hold the {SPLIT_NAMES[prefix]} split's longest source "
                f"({longest} tokens) and the longest output generated for it ({output} tokens, decoder start "
                f"included): raise position_randomization_max to {max(longest, output)} or set "
                "position_randomization_at_inference false")


def prepare_evaluation_set(tokenized: Dataset) -> EvaluationSet:
    """An `EvaluationSet` of a tokenized split that kept its text columns."""
    sorted_dataset, order = sort_by_source_length(tokenized)
    return EvaluationSet(sorted_dataset, order, list(tokenized["target"]) if has_references(tokenized) else None,
                         sources=list(tokenized["source"]))


def check_token_budget(train_dataset: Dataset, training_args: TranslationTrainingArguments,
                       model: RelPosTransformerForConditionalGeneration) -> None:
    """Every training pair, padded as `model`'s kernel pads it, must fit the token budget on its own, and under several
    processes their batches must be shareable among the processes (the trainer's `token_budget_sampler`); checked on
    the tokenized pairs before any prepared split or the tokenizer is saved into output_dir."""
    if training_args.max_tokens_per_batch is None:
        return
    lengths = example_lengths(train_dataset)
    try:
        check_examples_fit(*lengths, training_args.max_tokens_per_batch, padding_multiple(model))
        if training_args.world_size > 1:
            token_budget_sampler(lengths, training_args, model, training_args.world_size)
    except ValueError as error:
        raise ConfigError(str(error)) from None
