"""Parallel data for translation: loading (Hub dataset, local files, or the generated demo corpus), schema checks,
tokenization with length filtering or truncation, and source-length ordering for fast evaluation.

Every split is reduced to two text columns, `source` and `target`, before tokenization. Accepted schemas are the WMT one,
`{"translation": {"en": "...", "de": "..."}}`, flat language columns (`en`, `de`), and plain-text files by prefix as
fairseq and OpenNMT-py read them: `data/train` names `data/train.en` and `data/train.de`, line i of one the translation
of line i of the other. A .parquet file (the Hub's format, `Dataset.to_parquet`) or .arrow file (an Arrow IPC stream or
file, as `save_to_disk` writes) is read by pyarrow a record batch at a time. Any other data file may be compressed with
gzip, bzip2 or xz (`train.tsv.gz`, `data/train.en.gz`): it is decompressed while read, by the standard library. A test file may be source-only (a `.txt` file with one source
per line, a prefix with only the source-language file, or records without the target language): its `target` column is
all None, and it is translated but not scored.

Line-based files (plain text, `.tsv`, `.txt`) are split at "\n" only (a "\r" before it is dropped), so a line count is
`wc -l`'s and a stray "\r" or U+2028 inside a sentence cannot shift one side against the other. A `.tsv` file has no
quoting: fields are split at tabs and a `"` is text (csv-style quoting would eat the quotes of a sentence that starts
with one), so a tab inside a sentence is an error. Empty lines are kept in place on both sides: training drops the
pairs with an empty side (counted in the log), evaluation keeps them (an empty source translates to an empty line).
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import glob
import gzip
import io
import itertools
import json
import logging
import lzma
import os
import re
import sys
import unicodedata
import uuid
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import datasets.config
import huggingface_hub.constants
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from datasets import (
    Dataset,
    DatasetDict,
    DownloadMode,
    Features,
    List,
    Value,
    VerificationMode,
    concatenate_datasets,
    load_dataset,
    load_dataset_builder,
)
from datasets.exceptions import DatasetGenerationError
from datasets.table import InMemoryTable
from huggingface_hub import HfApi
from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ..model.validation import require_int, require_name_or_null
from ..publish.files import expand_home
from ..publish.hub import primary_subtag
from ..publish.pipeline_relpos import NO_SPACE_SCRIPT, join_translations
from ..tokenization_relpos import RelPosTokenizer
from .demo_corpus import write_demo_corpus
from .metrics import decode_translations
from .preflight import HUB_TIMEOUT_SECONDS, check_local_folder

logger = logging.getLogger(__name__)

DEMO_DATASET_NAME = "demo"
DEMO_DATA_FOLDER = "demo_data"
DEMO_CORPUS_FIELDS = ("demo_train_pairs", "demo_validation_pairs", "demo_test_pairs", "demo_seed")   # its every split
# A Hub configuration named by a language pair, as WMT's and OPUS's are ("de-en", "zh-en", "en-hi").
LANGUAGE_PAIR_CONFIG = re.compile(r"[a-z]{2,3}-[a-z]{2,3}")
FILE_FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv", ".txt": "txt", ".parquet": "parquet",
                ".arrow": "arrow"}
# Binary formats, read by pyarrow a record batch at a time (`_table_columns`): a file of one is read as it is, never
# through `COMPRESSIONS` (Parquet compresses its pages itself).
BINARY_FORMATS = ("parquet", "arrow")
# Compressed data files read as they are, decompressed while read by the standard library (gzip, bzip2, xz; a file of
# several streams, as `cat a.gz b.gz` or pbzip2 write, is read whole): suffix -> opener of the compressed byte stream.
COMPRESSIONS: dict[str, Callable[[BinaryIO], BinaryIO]] = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"), ".bz2": lambda raw: bz2.BZ2File(raw, "rb"),
    ".xz": lambda raw: lzma.LZMAFile(raw, "rb"),
}
# The same compressions written (hf-relpos-translate --output hyp.de.gz): suffix -> writer over the file's byte
# stream; a gzip header holds no file name or time, so the same text gives the same bytes (as `gzip -n`).
COMPRESSION_WRITERS: dict[str, Callable[[BinaryIO], BinaryIO]] = {
    ".gz": lambda raw: gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0),
    ".bz2": lambda raw: bz2.BZ2File(raw, "wb"), ".xz": lambda raw: lzma.LZMAFile(raw, "wb"),
}
# Compressed files that are not read (decompress them first, with this command): zstd needs a package that is no
# dependency (the standard library has none before Python 3.14), and a zip is an archive of files, not one text.
DECOMPRESS_COMMANDS = {".zst": "unzstd", ".zip": "unzip"}
SOURCE_ONLY_FORMATS = ("txt",)  # one source sentence per line: a test file to translate, never to train on
BYTE_ORDER_MARK = "\ufeff"
UTF16_BYTE_ORDER_MARKS = (b"\xff\xfe", b"\xfe\xff")   # little- and big-endian
# The magic bytes a compressed file opens with -> its suffix: text that is not UTF-8 from its first line and opens
# with them is compressed data read as text (a file renamed, or piped without decompressing).
COMPRESSED_DATA_MAGIC = {b"\x1f\x8b": ".gz", b"BZh": ".bz2", b"\xfd7zXZ\x00": ".xz", b"\x28\xb5\x2f\xfd": ".zst",
                         b"PK\x03\x04": ".zip"}
# Files are read this many bytes (plain text, .tsv) or records (.jsonl, .json, .csv) at a time.
READ_CHUNK_BYTES = 32 << 20
RECORDS_PER_CHUNK = 100_000
# Files at least this large show a progress bar while read.
PROGRESS_MIN_BYTES = 64 << 20
# Dropping this share of the training pairs or more (empty, or over the length limits) is logged as a warning.
HEAVY_LOSS_SHARE = 0.1
OVERLONG_PAIR_POLICIES = ("filter", "truncate")
TRANSLATION_COLUMN = "translation"
# Half of a UTF-16 surrogate pair: a JSON escape such as "\ud83d" without its other half (a text cut inside an emoji
# by a tool that counts UTF-16 units) decodes to one, which is no character and cannot be written as UTF-8.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
SPLITS = ("train", "validation", "test")


# concatenated_pairs: at most this many joined pairs per training pair; joined pairs built this many at a time;
# max_pairs_per_join: at most this many training pairs in one joined pair.
MAX_CONCATENATED_PAIRS = 4
MAX_PAIRS_PER_JOIN = 8
JOIN_CHUNK_PAIRS = 100_000


class DatasetSchemaError(ValueError):
    """A data file or dataset does not have the fields translation needs, or cannot be loaded."""


@dataclass
class DataArguments:
    """Where the parallel text comes from and how it is cut to length."""

    _argument_group_name = "data"

    dataset_name: str | None = field(
        default="wmt/wmt14",
        metadata={"help": "Hub dataset id (e.g. wmt/wmt14, bentrevett/multi30k), or 'demo' for the generated corpus. "
                          "Ignored when any of train_file/validation_file/test_file is given."},
    )
    dataset_config_name: str | None = field(default="de-en", metadata={"help": "Hub dataset configuration."})
    source_lang: str = field(default="en", metadata={"help": "Source language key, e.g. en."})
    target_lang: str = field(default="de", metadata={"help": "Target language key, e.g. de."})
    train_file: str | None = field(
        default=None,
        metadata={"help": "Local training file (.jsonl/.json/.csv/.tsv/.parquet/.arrow), or the prefix of two plain-text files, one "
                          "sentence per line: data/train reads data/train.SOURCE_LANG and data/train.TARGET_LANG. A "
                          "file may be compressed with gzip, bzip2 or xz (train.tsv.gz, data/train.en.gz + "
                          "data/train.de.gz; .zst and .zip are refused)."},
    )
    validation_file: str | None = field(default=None, metadata={"help": "Local validation file or plain-text prefix "
                                                                         "(compressed too, as train_file)."})
    test_file: str | None = field(
        default=None,
        metadata={"help": "Local test file or plain-text prefix (compressed too, as train_file); may be source-only "
                          "(.txt, one sentence per line, a prefix with only the source-language file, or records "
                          "without the target language): translated into test_hypotheses.txt, not scored."},
    )
    validation_split_name: str = field(default="validation", metadata={"help": "Hub split used for evaluation."})
    test_split_name: str = field(default="test", metadata={"help": "Hub split used for prediction."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep only the first N test pairs."})
    max_source_length: int = field(default=256, metadata={"help": "Longest source, in tokens (with </s>)."})
    max_target_length: int = field(default=256, metadata={"help": "Longest target, in tokens (with </s>)."})
    overlong_pairs: str = field(
        default="filter",
        metadata={"help": "Training pairs over max_source_length/max_target_length: 'filter' drops them, 'truncate' "
                          "cuts them. Evaluation pairs are never dropped nor cut (their sources are translated whole)."},
    )
    concatenated_pairs: float = field(
        default=0.0,
        metadata={"help": "Joined training pairs to add, as a fraction of the training pairs (0.5: half as many "
                          "again): each joins two different training pairs drawn at random (the run's seed), sources "
                          "with a space and targets likewise (sentence concatenation, Kondo et al. 2021), so the model "
                          "trains on inputs of two sentences, up to twice the training lengths. 0: none."},
    )
    max_pairs_per_join: int = field(
        default=2,
        metadata={"help": "Training pairs in each joined pair of concatenated_pairs: 2 joins two; N > 2 joins from 2 "
                          "to N different pairs, the number drawn uniformly (the run's seed), so the model trains on "
                          "inputs of up to N sentences."},
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    prepared_data_dir: str | None = field(
        default=None,
        metadata={"help": "A folder shared by runs for the prepared (tokenized, filtered) splits, each kept under a key "
                          "of its data files, tokenizer and length settings: runs with the same ones prepare a split "
                          "once and the others load it; no run removes another's. null: output_dir/prepared_data, "
                          "the run's own (a split prepared there under older data or settings is removed)."},
    )
    tokenizer_training_pairs: int | None = field(
        default=None,
        metadata={"help": "Train a new tokenizer on a random sample of this many training pairs (fixed seed) instead "
                          "of all of them: the BPE trainer's memory grows with the corpus's distinct words (GiBs at "
                          "WMT size), a sample bounds it. null: every pair."},
    )
    demo_train_pairs: int = field(default=8000, metadata={"help": "Demo corpus: training pairs."})
    demo_validation_pairs: int = field(default=300, metadata={"help": "Demo corpus: validation pairs."})
    demo_test_pairs: int = field(default=300, metadata={"help": "Demo corpus: test pairs."})
    demo_seed: int = field(default=1234, metadata={"help": "Demo corpus: generator seed."})

    def __post_init__(self) -> None:
        for name in ("train_file", "validation_file", "test_file"):
            require_name_or_null(name, getattr(self, name), "a data file or the prefix of plain-text files")
        require_name_or_null("dataset_name", self.dataset_name,
                             f"a Hub dataset, a local folder or {DEMO_DATASET_NAME!r}")
        for name in ("train_file", "validation_file", "test_file", "prepared_data_dir"):
            setattr(self, name, expand_home(getattr(self, name)))
        if self.overlong_pairs not in OVERLONG_PAIR_POLICIES:
            raise ValueError(f"overlong_pairs must be one of {list(OVERLONG_PAIR_POLICIES)}, got {self.overlong_pairs!r}")
        if self.source_lang == self.target_lang:
            raise ValueError(f"source_lang and target_lang must differ, both are {self.source_lang!r}")
        for name in ("max_source_length", "max_target_length"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be at least 2 (one token and </s>), got {getattr(self, name)}")
        for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
            require_int(name, getattr(self, name), minimum=1, null_means="every example")
        if (isinstance(self.concatenated_pairs, bool) or not isinstance(self.concatenated_pairs, (int, float))
                or not 0 <= self.concatenated_pairs <= MAX_CONCATENATED_PAIRS):
            raise ValueError(f"concatenated_pairs must be a number from 0 (none) to {MAX_CONCATENATED_PAIRS} (that many "
                             f"joined pairs per training pair), got {self.concatenated_pairs!r}")
        if (isinstance(self.max_pairs_per_join, bool) or not isinstance(self.max_pairs_per_join, int)
                or not 2 <= self.max_pairs_per_join <= MAX_PAIRS_PER_JOIN):
            raise ValueError(f"max_pairs_per_join must be an integer from 2 to {MAX_PAIRS_PER_JOIN} (training pairs in "
                             f"each joined pair), got {self.max_pairs_per_join!r}")
        if self.max_pairs_per_join > 2 and not self.concatenated_pairs:
            raise ValueError(f"max_pairs_per_join {self.max_pairs_per_join} sets how many pairs a joined pair of "
                             "concatenated_pairs joins, and concatenated_pairs is 0 (no joined pairs): set both")
        if self.prepared_data_dir is not None and not self.prepared_data_dir.strip():   # Path("") is the current folder
            raise ValueError("prepared_data_dir must name a folder, or be null (output_dir/prepared_data, the run's "
                             f"own); got {self.prepared_data_dir!r}")
        require_int("preprocessing_num_workers", self.preprocessing_num_workers, minimum=1,
                    null_means="tokenize in this process")
        require_int("tokenizer_training_pairs", self.tokenizer_training_pairs, minimum=1, null_means="every pair")
        for name in ("demo_train_pairs", "demo_validation_pairs", "demo_test_pairs"):
            require_int(name, getattr(self, name), minimum=1)
        if self.dataset_name is not None and not self.uses_local_files:   # else ignored, the default wmt/wmt14 too
            check_local_folder(self.dataset_name, "dataset_name", hub_kind="dataset")
        check_config_languages(self)
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and (compressed := compressed_data_files(path, self.source_lang, self.target_lang)):
                decompress = "; ".join(f"{DECOMPRESS_COMMANDS[file.suffix.lower()]} {file}" for file in compressed)
                sources_only = ", .txt (sources only)" if name == "test_file" else ""
                raise ValueError(f"{name} {path!r} names compressed file(s) ({', '.join(map(str, compressed))}) of a "
                                 f"kind that is not read ({', '.join(DECOMPRESS_COMMANDS)}): decompress first "
                                 f"({decompress}) and give a .jsonl, .json, .csv, .tsv{sources_only} file or the prefix "
                                 f"of plain-text files PREFIX.{self.source_lang} + PREFIX.{self.target_lang}, "
                                 f"uncompressed or compressed with gzip, bzip2 or xz ({', '.join(COMPRESSIONS)})")
            if path is not None and name != "test_file" and data_file_format(path) in SOURCE_ONLY_FORMATS:
                raise ValueError(f"{name} {path!r}: a .txt file holds sources only; training and validation need "
                                 "pairs (.jsonl, .json, .csv, .tsv, .parquet, .arrow, or a prefix of plain-text files PREFIX."
                                 f"{self.source_lang} + PREFIX.{self.target_lang})")

    @property
    def uses_local_files(self) -> bool:
        return any((self.train_file, self.validation_file, self.test_file))

    @property
    def local_dataset_folder(self) -> Path | None:
        """The local folder `dataset_name` names (data files, a `save_to_disk` folder, a Hub dataset's layout) when the
        run reads it (no local files given), else None."""
        if self.uses_local_files or self.uses_demo_corpus or not (self.dataset_name and os.path.isdir(self.dataset_name)):
            return None
        return Path(self.dataset_name)

    @property
    def uses_demo_corpus(self) -> bool:
        """Whether the run reads the generated demo corpus (`DEMO_CORPUS_FIELDS` decide its every split)."""
        return self.dataset_name == DEMO_DATASET_NAME and not self.uses_local_files


def check_config_languages(data_args: DataArguments) -> None:
    """A Hub dataset's configuration named by another language pair than source_lang/target_lang (the default de-en
    with --source_lang hi) is an error now, not after `load_dataset` has downloaded that pair (4.5M pairs for WMT14)."""
    config = data_args.dataset_config_name
    if (data_args.uses_local_files or data_args.dataset_name in (None, DEMO_DATASET_NAME) or config is None
            or not LANGUAGE_PAIR_CONFIG.fullmatch(config)):
        return
    wanted = {primary_subtag(data_args.source_lang), primary_subtag(data_args.target_lang)}
    if set(config.split("-")) != wanted:
        wmt_config = "-".join([*sorted(wanted - {"en"}), *sorted(wanted & {"en"})])   # xx-en
        raise ValueError(f"dataset_config_name {config!r} is the configuration of another language pair than "
                         f"source_lang {data_args.source_lang!r} / target_lang {data_args.target_lang!r}: set "
                         f"dataset_config_name to the pair's configuration (WMT's is {wmt_config!r}), or null for a "
                         "dataset without configurations")


# what reads each split (training_args' flags, as data_preparation.splits_to_read applies them)
SPLIT_USES = {"train": "do_train", "validation": "do_eval, or evaluation during training unless eval_strategy is 'no'",
              "test": "do_predict"}


def local_split_files(
    data_args: DataArguments, splits: tuple[str, ...], demo_directory: str | os.PathLike
) -> dict[str, str] | None:
    """The local file (or plain-text prefix) each requested split is read from (the demo corpus is written to
    `demo_directory` first), or None for a Hub dataset."""
    if data_args.uses_demo_corpus:
        paths = write_demo_corpus(
            demo_directory, data_args.demo_train_pairs, data_args.demo_validation_pairs, data_args.demo_test_pairs,
            seed=data_args.demo_seed,
        )
        files = {split: str(paths[split]) for split in splits}
    elif data_args.uses_local_files:
        files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    else:
        return None
    missing = [split for split in splits if files.get(split) is None]
    if missing:
        needed = " or ".join(f"{split}_file" for split in missing)
        uses = "; ".join(f"{split}: {SPLIT_USES[split]}" for split in missing)
        raise DatasetSchemaError(f"the run needs the {', '.join(missing)} split(s) ({uses}) but no {needed} was given")
    return {split: files[split] for split in splits}


def existing_data_files(path: str | os.PathLike, source_lang: str, target_lang: str) -> list[Path]:
    """The files a data file or a plain-text prefix names, those that exist (what its contents depend on): for a
    prefix, the file each side is read from (`plain_text_side`), compressed or not."""
    path = Path(path)
    if path.is_file():
        return [path]
    return [side for lang in (source_lang, target_lang) if (side := plain_text_side(path, lang)) is not None]


def load_parallel_splits(
    data_args: DataArguments, splits: tuple[str, ...], demo_directory: str | os.PathLike, cache_dir: str | None = None,
    workdir: str | os.PathLike | None = None,
) -> dict[str, Dataset]:
    """The requested splits (of `SPLITS`) as datasets with `source` and `target` text columns, sample caps applied;
    local files are read into memory-mapped Arrow files in `workdir` when given.

    Every schema problem raises `DatasetSchemaError` here, before any tokenizer or model work starts.
    """
    files = local_split_files(data_args, splits, demo_directory)
    if files is not None:
        loaded = {split: read_local_pairs(files[split], data_args.source_lang, data_args.target_lang,
                                          allow_source_only=split == "test", workdir=workdir) for split in splits}
    else:
        loaded = _load_hub_splits(data_args, splits, cache_dir)
    caps = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
            "test": data_args.max_predict_samples}
    for split, dataset in loaded.items():
        cap = caps[split]
        if cap is not None and cap < len(dataset):
            loaded[split] = dataset.select(range(cap))
        origin = f"{split} file {files[split]!r}" if files is not None else f"{data_args.dataset_name!r} {split} split"
        _require_present_texts(loaded[split], origin, data_args.source_lang, data_args.target_lang,
                               allow_source_only=split == "test")
        _require_text(loaded[split], origin, data_args.source_lang, data_args.target_lang)
    return loaded


def has_references(dataset: Dataset) -> bool:
    """Whether a split has target texts (False for a source-only test file)."""
    return dataset.with_format("arrow")["target"].null_count < len(dataset)


def _require_present_texts(dataset: Dataset, origin: str, source_lang: str, target_lang: str,
                           allow_source_only: bool) -> None:
    """A missing (None) text is an error naming its row, as a `null` in a local file is one naming its line; only a
    test split (`allow_source_only`) may lack the target, on every row, and is then source-only."""
    columns = dataset.with_format("arrow")
    for column, lang in (("source", source_lang), ("target", target_lang)):
        missing = columns[column].null_count
        if missing == 0 or (column == "target" and allow_source_only and missing == len(dataset)):
            continue
        row = pc.index(pc.is_null(columns[column]), True).as_py()
        rule = ("a test split is either parallel on every row or source-only (no target on any row)"
                if column == "target" and allow_source_only else "every pair needs both texts")
        raise DatasetSchemaError(f"{origin}, row {row}: the {column} text ({lang!r}) is missing (None) in {missing} of "
                                 f"its {len(dataset)} rows; {rule}")


def _require_text(dataset: Dataset, origin: str, source_lang: str, target_lang: str) -> None:
    """A split with no pairs, or whose source or target side is empty on every line, is an error (usually the wrong
    language key or column)."""
    if len(dataset) == 0:
        raise DatasetSchemaError(f"{origin} holds no pairs")
    sides = (("source", source_lang), ("target", target_lang)) if has_references(dataset) else (("source", source_lang),)
    for column, lang in sides:
        if not has_text(dataset, column).any():
            raise DatasetSchemaError(f"{origin}: the {column} side ({lang!r}) is empty on every one of its "
                                     f"{len(dataset)} lines")


def hub_split_names(data_args: DataArguments) -> dict[str, str]:
    """The Hub dataset's split read for each of `SPLITS`."""
    return {"train": "train", "validation": data_args.validation_split_name, "test": data_args.test_split_name}


def local_folder_files(folder: Path) -> list[Path]:
    """The files of a local dataset folder, in path order, without hidden ones (`.git`, `hf download`'s `.cache`)."""
    return sorted(path for path in folder.rglob("*")
                  if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts))


def local_folder_split_files(folder: Path, config_name: str | None, split_names: Sequence[str],
                             cache_dir: str | None) -> dict[str, list[Path]]:
    """Per split name, the files of a local dataset folder that `load_dataset(folder, config_name)` reads for it (the
    data files `datasets` resolves for that configuration and split, all in one resolution), with the folder's
    README.md, whose YAML declares them; every file of the folder where `datasets` resolves none (`load_dataset` then
    says why). A copy of a Hub dataset holds every configuration (`hf download wmt/wmt14`: fr-en's 40.8M pairs beside
    de-en's 4.5M), whose other files neither the split's texts nor so its prepared data depend on."""
    try:
        data_files = load_dataset_builder(str(folder), config_name, cache_dir=cache_dir).config.data_files or {}
    except (ValueError, OSError):
        data_files = {}
    readme = [folder / "README.md"] if (folder / "README.md").is_file() else []
    every_file = local_folder_files(folder) if any(name not in data_files for name in split_names) else []
    return {name: sorted({folder / os.path.relpath(path, folder) for path in data_files[name]}.union(readme))
            if name in data_files else every_file for name in split_names}


def check_tab_separated_folder(folder: Path, config_name: str | None, cache_dir: str | None) -> None:
    """Refuse a local dataset folder whose tab-separated files `datasets` would read as CSV with quoting (its csv
    builder, `sep` a tab, `quoting` not QUOTE_NONE): a field that opens with a quote loses it, and an unclosed one
    joins the lines up to the next quote, where a .tsv `train_file` is read with no quoting. A folder `datasets` cannot
    resolve is left to `load_dataset`, which says why."""
    try:
        builder = load_dataset_builder(str(folder), config_name, cache_dir=cache_dir)
    except (ValueError, OSError):
        return
    config = builder.config
    if builder.name != "csv" or (config.delimiter or config.sep) != "\t" or config.quoting == csv.QUOTE_NONE:
        return
    files = sorted({os.path.relpath(path, folder) for paths in (config.data_files or {}).values() for path in paths})
    raise DatasetSchemaError(
        f"dataset_name {str(folder)!r}: datasets reads its tab-separated files ({', '.join(files)}) as CSV, with "
        "quoting: a sentence that starts with a quote loses it, and an unclosed quote joins the lines up to the next "
        "one; give them as train_file / validation_file / test_file instead, which read a .tsv with no quoting "
        "(docs/training.md, Data)")


def plain_text_prefixes(folder: Path, source_lang: str, target_lang: str) -> list[str]:
    """The prefixes of the plain-text pairs in `folder` itself (PREFIX.SOURCE_LANG and PREFIX.TARGET_LANG, either
    compressed or not, as `plain_text_side` reads them), in name order."""
    prefixes = set()
    for path in folder.iterdir():
        for suffix in ("", *COMPRESSIONS):
            side = f".{source_lang}{suffix}"
            if path.is_file() and path.name.endswith(side) and len(path.name) > len(side):
                prefixes.add(str(folder / path.name[:-len(side)]))
    with_both_sides = []
    for prefix in sorted(prefixes):
        with contextlib.suppress(DatasetSchemaError):   # a side compressed twice: not a pair to suggest
            if plain_text_side(prefix, target_lang) is not None:
                with_both_sides.append(prefix)
    return with_both_sides


def _load_hub_splits(data_args: DataArguments, splits: tuple[str, ...], cache_dir: str | None) -> dict[str, Dataset]:
    origin = f"dataset {data_args.dataset_name!r}" + (
        f" (config {data_args.dataset_config_name!r})" if data_args.dataset_config_name else ""
    )
    if data_args.local_dataset_folder is not None:
        check_tab_separated_folder(data_args.local_dataset_folder, data_args.dataset_config_name, cache_dir)
    offline = huggingface_hub.constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE
    if not offline:
        check_hub_dataset(data_args.dataset_name)
    # `datasets` caches a local folder's configuration under the folder's name alone: changed files, or another folder
    # of that name, would load the Arrow it cached before; so a local folder is read afresh every time.
    afresh = ({"download_mode": DownloadMode.FORCE_REDOWNLOAD, "verification_mode": VerificationMode.NO_CHECKS}
              if data_args.local_dataset_folder is not None else {})
    try:
        dataset_dict: DatasetDict = load_dataset(data_args.dataset_name, data_args.dataset_config_name,
                                                 cache_dir=cache_dir, **afresh)
    except (ConnectionError, OSError, ValueError) as error:
        hint = " (HF_HUB_OFFLINE is set: only a dataset in the local cache loads)" if offline else ""
        folder = data_args.local_dataset_folder
        prefixes = [] if folder is None else plain_text_prefixes(folder, data_args.source_lang, data_args.target_lang)
        if prefixes:
            remedy = (f"; its plain-text pairs are read by prefix, not as dataset_name: give {', '.join(prefixes)} "
                      f"as train_file / validation_file / test_file (each PREFIX.{data_args.source_lang} + "
                      f"PREFIX.{data_args.target_lang})")
        elif folder is not None and data_args.dataset_config_name is not None:
            remedy = ("; a local folder of data files (JSON, CSV, Parquet, save_to_disk) has no configuration of that "
                      "name: set dataset_config_name null (its default, de-en, is WMT14's)")
        else:
            remedy = ""
        raise DatasetSchemaError(f"{origin} could not be loaded{hint}: {' '.join(str(error).split())}{remedy}") from None
    except DatasetGenerationError as error:   # a data file that datasets' reader cannot parse (invalid JSON, ...)
        cause = error.__cause__ or error
        remedy = ("; give its files as train_file / validation_file / test_file, whose errors name the file and line"
                  if data_args.local_dataset_folder is not None else "")
        raise DatasetSchemaError(f"{origin} could not be read: {type(cause).__name__}: "
                                 f"{' '.join(str(cause).split())}{remedy}") from None
    result = {}
    for split in splits:
        name = hub_split_names(data_args)[split]
        if name not in dataset_dict:
            raise DatasetSchemaError(f"{origin} has no split {name!r}; its splits are {sorted(dataset_dict)}")
        result[split] = to_source_target(
            dataset_dict[name], data_args.source_lang, data_args.target_lang, f"{origin}, split {name!r}"
        )
    return result


def check_hub_dataset(name: str) -> None:
    """One quick request (no retries) that the Hub dataset exists and is reachable, so that an unreachable Hub is one
    clear error at once instead of `load_dataset`'s retries and a ConnectionError traceback. A local folder, or a name
    that is no Hub id, is left to `load_dataset`."""
    if os.path.exists(name):
        return
    try:
        HfApi().dataset_info(name, timeout=HUB_TIMEOUT_SECONDS)
    except HFValidationError:
        return
    except GatedRepoError:   # a RepositoryNotFoundError too: asked first
        raise DatasetSchemaError(f"dataset {name!r} is gated: accept its conditions on its Hub page and log in with "
                                 "`hf auth login`") from None
    except RepositoryNotFoundError:
        raise DatasetSchemaError(f"dataset {name!r} is not on the Hugging Face Hub (or it is private: log in with "
                                 "`hf auth login`); check dataset_name, or give local files") from None
    except Exception as error:  # noqa: BLE001 - connection, DNS, proxy, timeout: the Hub cannot be used now
        raise DatasetSchemaError(
            f"dataset {name!r}: the Hugging Face Hub cannot be reached ({type(error).__name__}: "
            f"{' '.join(str(error).split())}); connect to the network, set HF_HUB_OFFLINE=1 to use a copy in the "
            "local cache, or give local files (train_file, validation_file, test_file)") from None


def to_source_target(dataset: Dataset, source_lang: str, target_lang: str, origin: str) -> Dataset:
    """Map a Hub dataset in the WMT or the flat schema to `source`/`target` columns, checking the languages exist; a
    missing text stays None (`_require_present_texts` decides on it)."""
    columns = dataset.column_names
    if TRANSLATION_COLUMN in columns:
        feature = dataset.features[TRANSLATION_COLUMN]
        languages = list(getattr(feature, "languages", None) or (dataset[0][TRANSLATION_COLUMN] if len(dataset) else {}))
        _require_languages(languages, source_lang, target_lang, f"{origin}, field '{TRANSLATION_COLUMN}'")
        _require_utf8(dataset, TRANSLATION_COLUMN, (source_lang, target_lang), origin)

        def extract(batch: dict[str, list[Any]]) -> dict[str, list[str]]:
            pairs = batch[TRANSLATION_COLUMN]
            return {"source": [_text(pair.get(source_lang)) for pair in pairs],
                    "target": [_text(pair.get(target_lang)) for pair in pairs]}
    else:
        _require_languages(columns, source_lang, target_lang, f"{origin}, columns")
        for lang in dict.fromkeys((source_lang, target_lang)):
            _require_utf8(dataset, lang, (None,), origin)

        def extract(batch: dict[str, list[Any]]) -> dict[str, list[str]]:
            return {"source": [_text(text) for text in batch[source_lang]],
                    "target": [_text(text) for text in batch[target_lang]]}
    return dataset.map(extract, batched=True, remove_columns=columns, desc="Selecting language pair",
                       features=Features({"source": Value("string"), "target": Value("string")}))


def _require_utf8(dataset: Dataset, column: str, fields: Sequence[str | None], origin: str) -> None:
    """One error naming the row (counted from 0, as `dataset[row]`) where a string `column` (its struct `fields`, or
    the column itself for None) holds bytes that are not UTF-8: datasets' JSON reader keeps them in a string column,
    which was a UnicodeDecodeError traceback when the texts were read."""
    first_row = 0
    for chunk in dataset.with_format("arrow")[column].chunks:
        for name in fields:
            texts = chunk if name is None else pc.struct_field(chunk, name)
            if texts.type not in (pa.string(), pa.large_string()):
                continue
            try:
                texts.validate(full=True)
            except pa.ArrowInvalid:
                raw = texts.view(pa.large_binary() if pa.types.is_large_string(texts.type) else pa.binary())
                row = next(index for index, value in enumerate(raw.to_pylist())
                           if value is not None and not _is_utf8(value))
                raise DatasetSchemaError(f"{origin}, row {first_row + row}: the {name or column!r} text is not UTF-8 "
                                         "text; save the data files as UTF-8") from None
        first_row += len(chunk)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _require_languages(available: list[str], source_lang: str, target_lang: str, where: str,
                       expected: str | None = None) -> None:
    """One error at `where` unless `available` holds both languages; `expected` says what would (by default the
    WMT schema or flat columns)."""
    missing = [lang for lang in dict.fromkeys((source_lang, target_lang)) if lang not in available]
    if missing:
        expected = expected or (f"expected '{TRANSLATION_COLUMN}': {{'{source_lang}': ..., '{target_lang}': ...}} or "
                                f"flat columns '{source_lang}' and '{target_lang}'")
        raise DatasetSchemaError(f"{where}: no {' or '.join(repr(lang) for lang in missing)} (found "
                                 f"{sorted(available)}); {expected} (set source_lang/target_lang)")


SEPARATOR_NAMES = {",": "commas", "\t": "tabs", ";": "semicolons", "|": "'|'"}
FORMAT_OF_SEPARATOR = {",": "csv", "\t": "tsv"}
# What else a file whose fields another separator splits can do than be saved with its format's separator.
OTHER_SEPARATOR_REMEDIES = {",": ", or name it .csv", "\t": ", or name it .tsv",
                            ";": " (a spreadsheet's CSV uses semicolons in some locales)"}


def _header_hint(source_lang: str, target_lang: str, separator: str, header: list[str]) -> str:
    """What a .csv (`separator` ",") or .tsv ("\t") file without the languages in its first line (`header`) needs:
    the format's separator where that line is one field naming the source language with another (a spreadsheet's
    semicolon CSV), else a header line."""
    kind = FORMAT_OF_SEPARATOR[separator]
    for other, name in SEPARATOR_NAMES.items():
        if other != separator and len(header) == 1 and source_lang in header[0].split(other):
            return (f"its first line is one field whose columns are separated by {name}, where a .{kind} file's are "
                    f"separated by {SEPARATOR_NAMES[separator]}: save it with {SEPARATOR_NAMES[separator]}"
                    f"{OTHER_SEPARATOR_REMEDIES.get(other, '')}")
    shown = "<TAB>" if separator == "\t" else separator
    return (f"its first line names the columns: add a header line naming the languages, e.g. "
            f"{source_lang}{shown}{target_lang}")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def compressed_data_files(path: str | os.PathLike, source_lang: str, target_lang: str) -> list[Path]:
    """The compressed files of a kind that is not read (`DECOMPRESS_COMMANDS`) a data file or plain-text prefix names:
    the path itself (`train.jsonl.zst`), or for a prefix those of a side that has no file to read otherwise
    (`train.en.zst` for `train` without `train.en`, `train.en.gz`, ...)."""
    path = Path(path)
    pair = plain_text_files(path, source_lang, target_lang)
    if path.suffix.lower() in DECOMPRESS_COMMANDS and not all(side.is_file() for side in pair):
        return [path]
    if path.is_file():
        return []
    return [Path(f"{side}{suffix}") for side in pair
            if not any(Path(f"{side}{readable}").is_file() for readable in ("", *COMPRESSIONS))
            for suffix in DECOMPRESS_COMMANDS if Path(f"{side}{suffix}").is_file()]


def compression_of(path: str | os.PathLike) -> str | None:
    """The suffix of the compression (`COMPRESSIONS`) a data file is read through, or None for an uncompressed one."""
    suffix = Path(path).suffix.lower()
    return suffix if suffix in COMPRESSIONS else None


def uncompressed_name(path: Path) -> Path:
    """`path` without the suffix of the compression it is read through (`train.tsv.gz` -> `train.tsv`)."""
    return path.with_suffix("") if compression_of(path) else path


def data_file_format(path: str | os.PathLike) -> str | None:
    """The format (`FILE_FORMATS`) a data file's suffix names, before the compression suffix when it has one
    (`train.tsv.gz` is a .tsv file); None for any other suffix (a plain-text prefix)."""
    return FILE_FORMATS.get(uncompressed_name(Path(path)).suffix.lower())


def plain_text_files(prefix: str | os.PathLike, source_lang: str, target_lang: str) -> tuple[Path, Path]:
    """The two plain-text files a prefix names, fairseq-style: `data/train` -> `data/train.en`, `data/train.de`
    (each may be there compressed instead: `plain_text_side`)."""
    return tuple(Path(f"{prefix}.{lang}") for lang in (source_lang, target_lang))


def plain_text_side(prefix: str | os.PathLike, lang: str) -> Path | None:
    """The file one side of a plain-text pair is read from: `prefix.LANG`, else the one of `prefix.LANG.gz`,
    `.bz2`, `.xz` that exists (`prefix.LANG` is read when it is there too, as `gunzip -k` leaves both); None when
    there is none. Two compressed files of one side, without the uncompressed one, are an error naming them."""
    plain = Path(f"{prefix}.{lang}")
    if plain.is_file():
        return plain
    compressed = [Path(f"{plain}{suffix}") for suffix in COMPRESSIONS if Path(f"{plain}{suffix}").is_file()]
    if len(compressed) > 1:
        raise DatasetSchemaError(f"plain-text prefix {str(prefix)!r}: its {lang!r} side is there compressed twice "
                                 f"({', '.join(map(str, compressed))}) and {plain} is not; keep the one to read")
    return compressed[0] if compressed else None


def read_local_pairs(path: str | os.PathLike, source_lang: str, target_lang: str,
                     allow_source_only: bool = False, workdir: str | os.PathLike | None = None) -> Dataset:
    """Read a .jsonl/.json/.csv/.tsv/.parquet/.arrow parallel file, or the plain-text pair `path.SOURCE_LANG` +
    `path.TARGET_LANG` when `path` is no file and does not end in one of those suffixes (`data/train`,
    `corpus.tok.bpe`), into `source`/`target` columns; errors name the file and line (or row).

    The file is read in chunks of `READ_CHUNK_BYTES` (plain text and .tsv split and UTF-8-checked by Arrow, records
    parsed `RECORDS_PER_CHUNK` at a time, .parquet and .arrow files a record batch at a time) into Arrow, so memory
    holds one chunk of Python objects at most: in `workdir`, when given, as memory-mapped Arrow files, else in memory.

    With `allow_source_only` (test files), a .txt file (one source per line, blank lines kept), a prefix with only the
    source-language file, or a file whose records all lack the target language is read with a `target` column of
    None."""
    path = Path(path)
    file_format = data_file_format(path)
    sink = _ArrowSink(workdir, path.name)
    if not path.is_file():
        if file_format is not None:
            raise DatasetSchemaError(f"data file {str(path)!r} does not exist")
        return _read_plain_text_pair(path, source_lang, target_lang, allow_source_only, sink)
    if file_format is None and uncompressed_name(path).suffix in (f".{source_lang}", f".{target_lang}"):
        prefix = uncompressed_name(path).with_suffix("")
        compressed = f", or their {compression_of(path)} files" if compression_of(path) else ""
        raise DatasetSchemaError(f"data file {str(path)!r} is one side of a plain-text pair: give its prefix "
                                 f"{str(prefix)!r} (read as {prefix}.{source_lang} + {prefix}.{target_lang}{compressed})")
    if file_format in BINARY_FORMATS and compression_of(path):
        raise DatasetSchemaError(f"data file {str(path)!r}: a .{file_format} file is read as it is, not compressed "
                                 f"again with {compression_of(path)}: decompress it and give {uncompressed_name(path)}")
    if file_format is None:
        text_formats = sorted(suffix for suffix, kind in FILE_FORMATS.items() if kind not in BINARY_FORMATS)
        raise DatasetSchemaError(f"data file {str(path)!r} must end in one of {sorted(FILE_FORMATS)}, or in one of "
                                 f"{text_formats} and {', '.join(COMPRESSIONS)} (compressed) (or name the prefix of plain-text "
                                 f"files {str(path)}.{source_lang} + {str(path)}.{target_lang}, and not be a file itself)")
    if file_format in SOURCE_ONLY_FORMATS and not allow_source_only:
        raise DatasetSchemaError(f"data file {str(path)!r} holds sources only; this split needs pairs")
    if file_format == "txt":
        return sink.dataset({"source": (lines for _, lines, _ in _line_chunks(path))}, with_null_target=True)
    if file_format == "tsv":
        return sink.dataset(_tsv_columns(path, source_lang, target_lang, allow_source_only))
    if file_format in BINARY_FORMATS:
        batches = _parquet_batches(path) if file_format == "parquet" else _arrow_batches(path)
        return sink.dataset(_table_columns(path, batches, source_lang, target_lang, allow_source_only))
    return sink.dataset(_record_columns(path, file_format, source_lang, target_lang, allow_source_only))


def _record_columns(path: Path, file_format: str, source_lang: str, target_lang: str,
                    allow_source_only: bool) -> Iterator[dict[str, pa.Array]]:
    """`source`/`target` chunks of a .jsonl/.json/.csv file. A .jsonl file is read `READ_CHUNK_BYTES` at a time and
    each chunk parsed by Arrow's JSON reader when every record in it is a pair of strings in one schema; any other
    chunk (an error to name, nulls, mixed schemas, a source-only record) is read record by record, as are .json and
    .csv files, `RECORDS_PER_CHUNK` records at a time."""
    columns = _RecordColumns(file_format, source_lang, target_lang, allow_source_only)
    if file_format == "csv":
        columns.check_header(_csv_header(path), f"{path}:1, header")
    if file_format != "jsonl":
        for location, record in _records(path, file_format):
            columns.add(location, record)
            if columns.full:
                yield columns.flush()
        yield columns.flush()
        return
    for first_line, lines, piece in _line_chunks(path):
        parsed = _parse_jsonl_chunk(piece, lines, source_lang, target_lang)
        if parsed is not None:
            offset, nested, chunk = parsed
            columns.saw_pair(f"{path}:{first_line + offset}, " + (f"field '{TRANSLATION_COLUMN}'" if nested
                                                                   else "fields"))
            yield columns.flush()
            yield chunk
            continue
        for offset, line in enumerate(lines.to_pylist()):
            if line.strip():
                line_number = first_line + offset
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DatasetSchemaError(f"{path}:{line_number}: invalid JSON ({error.msg})") from None
                columns.add(f"{path}:{line_number}", record)
                if columns.full:
                    yield columns.flush()
    yield columns.flush()


def _table_columns(path: Path, batches: Iterator[pa.RecordBatch], source_lang: str, target_lang: str,
                   allow_source_only: bool) -> Iterator[dict[str, pa.Array]]:
    """`source`/`target` chunks of a .parquet or .arrow file's record batches (each at most `RECORDS_PER_CHUNK`
    rows): a batch whose two languages are strings without nulls, in one schema, is taken as its Arrow columns
    (`_batch_pair_texts`); any other (an error to name, nulls, a source-only row) is read row by row, as the records
    of a .jsonl file, an error naming the file and row ("train.parquet: row 17", counted from 1)."""
    columns = _RecordColumns("parquet", source_lang, target_lang, allow_source_only)
    first_row = 1
    for batch in batches:
        pair = _batch_pair_texts(batch, source_lang, target_lang) if batch.num_rows else None
        if pair is not None:
            nested, chunk = pair
            columns.saw_pair(f"{path}: row {first_row}, " + (f"field '{TRANSLATION_COLUMN}'" if nested else "fields"))
            yield chunk
        else:
            for offset, record in enumerate(batch.to_pylist()):
                columns.add(f"{path}: row {first_row + offset}", record)
            yield columns.flush()
        first_row += batch.num_rows
    yield columns.flush()


def _batch_pair_texts(batch: pa.RecordBatch, source_lang: str,
                      target_lang: str) -> tuple[bool, dict[str, pa.Array]] | None:
    """(whether the texts sit in the 'translation' struct, the `source`/`target` chunk) of a record batch whose two
    languages are strings (`_is_text_type`) without a null, in the WMT schema or flat columns (the one the
    record-by-record reader would read: 'translation' when there is such a column); None otherwise."""
    nested = TRANSLATION_COLUMN in batch.schema.names
    if nested:
        struct = batch.column(TRANSLATION_COLUMN)
        if not pa.types.is_struct(struct.type) or struct.null_count:
            return None
        fields = dict(zip((field.name for field in struct.type), struct.flatten(), strict=True))   # slice-aware
    else:
        fields = dict(zip(batch.schema.names, batch.columns, strict=True))
    texts = [fields.get(lang) for lang in (source_lang, target_lang)]
    if any(text is None or not _is_text_type(text.type) for text in texts):
        return None
    # nulls counted after the cast: a dictionary column's null_count leaves out an index to a null dictionary value
    source, target = (text.cast(pa.string()) for text in texts)
    if source.null_count or target.null_count:
        return None
    return nested, {"source": source, "target": target}


# Arrow's string types: string, large string and string view (polars' `Utf8View`; pyarrow 16 and later)
TEXT_TYPES = tuple(make() for make in (pa.string, pa.large_string, getattr(pa, "string_view", None)) if make)


def _is_text_type(data_type: pa.DataType) -> bool:
    """Whether an Arrow column of `data_type` holds strings (`TEXT_TYPES`), dictionary-encoded too (a pandas
    categorical)."""
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    return data_type in TEXT_TYPES


def _parquet_file(path: Path) -> pq.ParquetFile:
    """A .parquet file opened (its footer read); a file that is no Parquet file (cut short, another format) is one
    error naming it."""
    try:
        return pq.ParquetFile(path)
    except pa.ArrowInvalid as error:
        raise DatasetSchemaError(f"{path}: not a Parquet file ({error})") from None


def parquet_uncompressed_bytes(path: str | os.PathLike) -> int:
    """The size of a .parquet file's data uncompressed, as its footer states it (the sum of its row groups'): near
    the size of its Arrow table, whatever codec compressed its pages."""
    with _parquet_file(Path(path)) as parquet:
        metadata = parquet.metadata
        return sum(metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups))


def _parquet_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The record batches of a .parquet file, `RECORDS_PER_CHUNK` rows at most, read one at a time (`_parquet_file`
    names a file that is no Parquet file)."""
    parquet = _parquet_file(path)
    with parquet, tqdm(total=parquet.metadata.num_rows, unit=" rows", desc=f"Reading {path.name}",
                       disable=path.stat().st_size < PROGRESS_MIN_BYTES) as progress:
        for batch in parquet.iter_batches(batch_size=RECORDS_PER_CHUNK):
            yield batch
            progress.update(batch.num_rows)


def _arrow_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The record batches of an .arrow file, an Arrow IPC stream (what `datasets`' save_to_disk and cache write) or
    IPC file (`pyarrow.ipc.new_file`, Feather v2), cut to `RECORDS_PER_CHUNK` rows at most, read one at a time; a
    file that is neither is one error naming it."""
    with pa.OSFile(str(path)) as source:
        try:
            stream = iter(pa.ipc.open_stream(source))
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                reader = pa.ipc.open_file(source)
            except pa.ArrowInvalid as error:
                raise DatasetSchemaError(f"{path}: not an Arrow IPC stream or file ({error})") from None
            stream = (reader.get_batch(index) for index in range(reader.num_record_batches))
        for batch in stream:
            for start in range(0, batch.num_rows, RECORDS_PER_CHUNK):
                yield batch.slice(start, RECORDS_PER_CHUNK)


class _RecordColumns:
    """Records' texts gathered into `source`/`target` chunks, each record checked (an object; the WMT or the flat
    schema; both languages, or with `allow_source_only` the source alone in every record; strings)."""

    def __init__(self, file_format: str, source_lang: str, target_lang: str, allow_source_only: bool) -> None:
        self.file_format, self.source_lang, self.target_lang = file_format, source_lang, target_lang
        self.allow_source_only = allow_source_only
        self.sources: list[str] = []
        self.targets: list[str | None] = []
        self.first_without_target: str | None = None
        self.first_with_target: str | None = None

    @property
    def full(self) -> bool:
        return len(self.sources) >= RECORDS_PER_CHUNK

    def add(self, location: str, record: Any) -> None:
        if not isinstance(record, dict):
            raise DatasetSchemaError(f"{location}: expected an object with the texts, got {type(record).__name__}")
        texts = record.get(TRANSLATION_COLUMN, record) if self.file_format != "csv" else record
        if not isinstance(texts, dict):
            raise DatasetSchemaError(f"{location}: '{TRANSLATION_COLUMN}' must be an object of language -> text")
        where = f"{location}, field '{TRANSLATION_COLUMN}'" if texts is not record else f"{location}, fields"
        source_only = self.allow_source_only and texts.get(self.target_lang) is None
        _require_languages(list(texts), self.source_lang, self.source_lang if source_only else self.target_lang, where)
        if source_only:
            self.first_without_target = self.first_without_target or where
            self._check_consistent()
        else:
            self.saw_pair(where)
        for lang, column in ((self.source_lang, self.sources), (self.target_lang, self.targets)):
            value = texts.get(lang)
            if source_only and lang == self.target_lang:
                column.append(None)
            elif isinstance(value, str):
                _require_characters(value, location, lang)
                column.append(value)
            else:
                found = "null" if value is None else type(value).__name__
                raise DatasetSchemaError(f"{location}: {lang!r} must be a string, got {found}")

    def check_header(self, header: list[str], where: str) -> None:
        """The languages in a .csv header (named at its line, not at the first row's); an empty file has none."""
        if header:
            source_only = self.allow_source_only and self.target_lang not in header
            _require_languages(header, self.source_lang, self.source_lang if source_only else self.target_lang,
                               where, _header_hint(self.source_lang, self.target_lang, ",", header))

    def saw_pair(self, where: str) -> None:
        """A record with both languages at `where`."""
        self.first_with_target = self.first_with_target or where
        self._check_consistent()

    def _check_consistent(self) -> None:
        if self.first_without_target and self.first_with_target:
            raise DatasetSchemaError(f"{self.first_without_target}: no {self.target_lang!r}, although "
                                     f"{self.first_with_target} has one; a test file is either parallel on every line "
                                     "or source-only")

    def flush(self) -> dict[str, pa.Array]:
        """The texts gathered since the last flush, as a chunk."""
        chunk = {"source": pa.array(self.sources, pa.string()), "target": pa.array(self.targets, pa.string())}
        self.sources, self.targets = [], []
        return chunk


def _require_characters(text: str, location: str, lang: str) -> None:
    """One error at `location` naming `lang` where `text` holds a `LONE_SURROGATE` (it was a UnicodeEncodeError
    traceback from Arrow once the chunk was gathered)."""
    surrogate = LONE_SURROGATE.search(text)
    if surrogate is not None:
        raise DatasetSchemaError(
            f"{location}: {lang!r} holds the escape \\u{ord(surrogate.group()):04x} at character {surrogate.start()}, "
            "half of a UTF-16 surrogate pair without its other half, which is no character (a text cut inside an "
            "emoji or another character beyond U+FFFF): repair or remove it")


def _parse_jsonl_chunk(piece: bytes, lines: pa.Array, source_lang: str,
                       target_lang: str) -> tuple[int, bool, dict[str, pa.Array]] | None:
    """(offset of the first record's line, whether the texts sit under 'translation', the chunk) of JSON lines parsed
    by Arrow, or None when a record needs the record-by-record reader: not every non-blank line one record holding
    both languages as strings in the same schema (the reader then names any error), or a "\r" (which that reader
    took for a line end)."""
    if b"\r" in piece:
        return None
    try:
        table = pa_json.read_json(io.BytesIO(piece), read_options=pa_json.ReadOptions(block_size=len(piece) + 1))
    except pa.ArrowInvalid:
        return None
    filled = np.flatnonzero(texts_with_text(lines))
    if table.num_rows != filled.size or filled.size == 0:
        return None
    nested = TRANSLATION_COLUMN in table.column_names
    if nested:
        struct = table[TRANSLATION_COLUMN].combine_chunks()
        if not pa.types.is_struct(struct.type) or struct.null_count:
            return None
        available = {struct.type.field(index).name: index for index in range(struct.type.num_fields)}
        texts = [struct.field(available[lang]) if lang in available else None for lang in (source_lang, target_lang)]
    else:
        texts = [table[lang].combine_chunks() if lang in table.column_names else None
                 for lang in (source_lang, target_lang)]
    if any(text is None or text.type != pa.string() or text.null_count for text in texts):
        return None
    return int(filled[0]), nested, {"source": texts[0], "target": texts[1]}


def _read_plain_text_pair(prefix: Path, source_lang: str, target_lang: str, allow_source_only: bool,
                          sink: _ArrowSink) -> Dataset:
    """`prefix.SOURCE_LANG` and `prefix.TARGET_LANG`, each read into its own column (one error when their line counts
    differ); with `allow_source_only`, the source file alone when the target file does not exist. Either file may be
    there compressed instead (`plain_text_side`)."""
    source_name, target_name = plain_text_files(prefix, source_lang, target_lang)
    source_path, target_path = (plain_text_side(prefix, lang) for lang in (source_lang, target_lang))
    missing = [str(name) for name, path in ((source_name, source_path), (target_name, target_path)) if path is None]
    if missing == [str(target_name)] and allow_source_only:
        return sink.dataset({"source": (lines for _, lines, _ in _line_chunks(source_path))}, with_null_target=True)
    if missing == [str(target_name)]:   # the source alone: not a language mix-up, a split that needs references
        found = (f" (only {source_path} is there: only a test file may be source-only, translated and not scored; "
                 f"a training or validation file needs its .{target_lang} side too)")
    elif missing:
        siblings = sorted(str(sibling) for sibling in prefix.parent.glob(f"{glob.escape(prefix.name)}.*")
                          if sibling.is_file()) if prefix.parent.is_dir() else []
        found = (f" (there are {', '.join(siblings)}: are source_lang {source_lang!r} and target_lang "
                 f"{target_lang!r} right?)" if siblings else "")
    if missing and prefix.is_dir():
        pairs = plain_text_prefixes(prefix, source_lang, target_lang)
        instead = (f"the prefix of its plain-text pairs ({', '.join(pairs)})" if pairs
                   else f"one of its {'/'.join(sorted(FILE_FORMATS))} files, or the folder as dataset_name (read by "
                        "datasets, with dataset_config_name null)")
        raise DatasetSchemaError(
            f"data file {str(prefix)!r} is a folder, and the plain-text pair it would name as a prefix ({source_name} "
            f"+ {target_name}) does not exist; give {instead}")
    if missing:
        raise DatasetSchemaError(
            f"data file {str(prefix)!r} does not exist, nor does the plain-text pair it would name as a prefix "
            f"({source_name} + {target_name}: {' and '.join(missing)} missing){found}; give a "
            f"{'/'.join(sorted(FILE_FORMATS))} file or a prefix whose .{source_lang} and .{target_lang} files exist "
            f"(uncompressed, or compressed: {', '.join(COMPRESSIONS)})")
    sources = sink.dataset({"source": (lines for _, lines, _ in _line_chunks(source_path))})
    targets = sink.dataset({"target": (lines for _, lines, _ in _line_chunks(target_path))})
    if len(sources) != len(targets):
        raise DatasetSchemaError(
            f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}; parallel plain-text files "
            "need one line per sentence, line i of one the translation of line i of the other")
    return concatenate_datasets([sources, targets], axis=1)


class _ArrowSink:
    """Where read chunks go: an Arrow stream file in `workdir` (memory-mapped once written), or memory."""

    def __init__(self, workdir: str | os.PathLike | None, name: str) -> None:
        self.workdir = None if workdir is None else Path(workdir)
        self.name = name

    def dataset(self, chunks: Iterator[dict[str, pa.Array]] | dict[str, Iterator[pa.Array]],
                with_null_target: bool = False) -> Dataset:
        """A dataset of the chunks: an iterator of column -> array dicts, or one column -> iterator of arrays; with
        `with_null_target`, a `target` column of nulls is added (a source-only file)."""
        if isinstance(chunks, dict):
            ((column, arrays),) = chunks.items()
            chunks = ({column: array} for array in itertools.chain(arrays, [pa.array([], pa.string())]))

        def batches() -> Iterator[pa.RecordBatch]:
            for columns in chunks:
                if with_null_target:
                    columns = dict(columns, target=pa.nulls(len(columns["source"]), pa.string()))
                yield pa.RecordBatch.from_pydict(columns)

        stream = batches()
        first = next(stream)
        if self.workdir is None:
            return Dataset(InMemoryTable(pa.Table.from_batches([first, *stream])))
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"{self.name}.{'-'.join(first.schema.names)}.{uuid.uuid4().hex[:8]}.arrow"
        with pa.OSFile(str(path), "wb") as file, pa.ipc.new_stream(file, first.schema) as writer:
            writer.write_batch(first)
            for batch in stream:
                writer.write_batch(batch)
        return Dataset.from_file(str(path))


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """(the bytes of the text, the file's own bytes) of a data file: a compressed one (`COMPRESSIONS`) decompressed as
    it is read, the file's own position telling how much of it is read (a progress bar). A compressed file that does
    not decompress (corrupt, cut short, not of its suffix's kind) is one error naming it."""
    with open(path, "rb") as raw, _decompressed(raw, path) as handle:
        yield handle, raw


@contextlib.contextmanager
def _decompressed(raw: BinaryIO, path: str | os.PathLike) -> Iterator[BinaryIO]:
    """The bytes of the text of `raw`, the file opened from `path`: decompressed as they are read when `path` ends in
    one of `COMPRESSIONS` (`raw` itself otherwise; it stays open either way). A compressed file that does not
    decompress (corrupt, cut short, not of its suffix's kind: `_is_decompression_error`) is one error naming it; an
    error of the file itself (an OSError of its reads, EIO) propagates as it is."""
    compression = compression_of(path)
    if compression is None:
        yield raw
        return
    try:
        with COMPRESSIONS[compression](raw) as handle:
            yield handle
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as error:
        if not _is_decompression_error(error, compression):
            raise
        raise DatasetSchemaError(f"{path}: not a whole {compression} file, it does not decompress "
                                 f"({type(error).__name__}: {error})") from None


def _is_decompression_error(error: BaseException, compression: str) -> bool:
    """Whether `error`, raised while a `compression` file was read, says its bytes do not decompress: cut short
    (EOFError, every module), corrupt or of another kind (gzip: gzip.BadGzipFile, zlib.error; xz: lzma.LZMAError;
    bzip2: a bare OSError without errno, "Invalid data stream"). An OSError with an errno (EIO) is the file's own."""
    if isinstance(error, (EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError)):
        return True
    return compression == ".bz2" and type(error) is OSError and error.errno is None


def _line_chunks(path: Path) -> Iterator[tuple[int, pa.Array, bytes]]:
    """(number of the first line, the lines, their bytes) of a UTF-8 text file (decompressed when it is compressed),
    `READ_CHUNK_BYTES` at a time: lines without their "\n" (or "\r\n"), split at "\n" only, as `wc -l` counts them (a
    final "\n" ends the last line, it starts none); a byte order mark at the start is dropped; the first line that is
    not UTF-8 is an error naming it."""
    first_line = 1
    carry = b""
    size = path.stat().st_size
    with _opened(path) as (handle, raw), tqdm(total=size, unit="B", unit_scale=True, desc=f"Reading {path.name}",
                                                disable=size < PROGRESS_MIN_BYTES) as progress:
        at_start = True
        while True:
            block = handle.read(READ_CHUNK_BYTES)
            progress.update(raw.tell() - progress.n)
            data = carry + block
            if at_start:
                data, at_start = _without_byte_order_mark(data), False
            cut = data.rfind(b"\n") + 1 if block else len(data)
            if block and cut == 0:  # one line longer than the chunk: read on
                carry = data
                continue
            piece, carry = data[:cut], data[cut:]
            if piece:
                lines = _split_lines(piece, path, first_line)
                yield first_line, lines, piece
                first_line += len(lines)
            if not block:
                return


def text_line_chunks(stream: BinaryIO, name: str, chunk_lines: int) -> Iterator[list[str]]:
    """The lines of UTF-8 text read from `stream` as it comes (stdin, a pipe, a file), `chunk_lines` at a time, each
    chunk given as soon as its last line is read: together the lines of the text by `_line_chunks`' rule for data
    files (a byte order mark at the start dropped, split at "\n" with a "\r" before it dropped), an invalid line an
    error naming it as "NAME:LINE" (counted from the start of the stream)."""
    first_line = 1
    pending: list[bytes] = []
    for raw in stream:   # split at b"\n" only, each piece with its "\n"
        if first_line == 1 and not pending:
            raw = _without_byte_order_mark(raw)
            if not raw:   # the stream held only a byte order mark
                continue
        pending.append(raw)
        if len(pending) == chunk_lines:
            yield _split_lines(b"".join(pending), name, first_line).to_pylist()
            first_line += chunk_lines
            pending = []
    if pending:
        yield _split_lines(b"".join(pending), name, first_line).to_pylist()


def text_file_line_chunks(file: BinaryIO, path: str | os.PathLike, chunk_lines: int) -> Iterator[list[str]]:
    """`text_line_chunks` of `file`, opened from `path` (a text file, a pipe): decompressed as it is read when `path`
    ends in one of `COMPRESSIONS`, as the data files are (`_opened`), a file that does not decompress one error
    naming it; an invalid line an error naming it as "PATH:LINE". `file` stays open (seek it back to read it again)."""
    with _decompressed(file, path) as handle:
        yield from text_line_chunks(handle, str(path), chunk_lines)


def _without_byte_order_mark(data: bytes) -> bytes:
    """`data` without the UTF-8 byte order mark a text file may start with."""
    return data.removeprefix(BYTE_ORDER_MARK.encode("utf-8"))


def _split_lines(piece: bytes, path: Path | str, first_line: int) -> pa.Array:
    """The lines of `piece` (whole lines; a final "\n" starts no line) as a UTF-8-checked string array."""
    parts = pc.split_pattern(pa.array([piece], pa.binary()), b"\n")[0].values
    if piece.endswith(b"\n"):
        parts = parts[:-1]
    try:
        lines = parts.cast(pa.string())
    except pa.ArrowInvalid:
        for offset, raw in enumerate(piece.split(b"\n")):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise not_utf8_error(path, first_line + offset, raw, error) from None
        raise
    if pc.any(pc.ends_with(lines, "\r")).as_py():
        lines = pc.replace_substring_regex(lines, pattern="\r$", replacement="")
    return lines


def _records(path: Path, file_format: str) -> Iterator[tuple[str, Any]]:
    """(location, record) for each example of a .json/.csv file; location is "file:line" (or "file: record N" for a
    JSON array)."""
    if file_format == "json":
        with _opened(path) as (handle, _):
            try:
                content = json.load(io.TextIOWrapper(handle, encoding="utf-8-sig"))
            except json.JSONDecodeError as error:
                raise DatasetSchemaError(f"{path}:{error.lineno}: invalid JSON ({error.msg})") from None
            except UnicodeDecodeError:
                raise _not_utf8_error(path) from None
        records = content.get("data") if isinstance(content, dict) else content
        if not isinstance(records, list):
            raise DatasetSchemaError(f"{path}: a .json file must hold a list of records or {{\"data\": [records]}}")
        for index, record in enumerate(records):
            yield f"{path}: record {index}", record
    else:
        with _opened(path) as (handle, _):
            reader = csv.reader(io.TextIOWrapper(handle, encoding="utf-8-sig", newline=""))
            try:
                header = next(reader, [])
                for row in reader:
                    if not row:  # a blank line
                        continue
                    if len(row) != len(header):
                        raise DatasetSchemaError(f"{path}:{reader.line_num}: {len(row)} field(s), but the header has "
                                                 f"{len(header)} ({', '.join(header)})")
                    yield f"{path}:{reader.line_num}", dict(zip(header, row, strict=True))
            except UnicodeDecodeError:
                raise _not_utf8_error(path) from None


def _csv_header(path: Path) -> list[str]:
    """The column names of a .csv file's first row (none for an empty file)."""
    with _opened(path) as (handle, _):
        try:
            return next(csv.reader(io.TextIOWrapper(handle, encoding="utf-8-sig", newline="")), [])
        except UnicodeDecodeError:
            raise _not_utf8_error(path) from None


def _not_utf8_error(path: Path) -> DatasetSchemaError:
    """The error naming the first line of a data file (decompressed as read) that is not UTF-8, as `_split_lines`
    names one for the formats read line by line: .csv and .json are decoded as one stream, whose error has no line."""
    with _opened(path) as (handle, _):
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                return not_utf8_error(path, number, line, error)
    return DatasetSchemaError(f"{path}: not UTF-8 text")


def not_utf8_error(path: Path | str, line_number: int, line: bytes, error: UnicodeDecodeError) -> DatasetSchemaError:
    """The error naming line `line_number` of `path`, which `error` says is not UTF-8; a first line that opens with a
    UTF-16 byte order mark (a spreadsheet's "Unicode text" export) is named as UTF-16, one that opens with a
    compressed file's magic bytes (`COMPRESSED_DATA_MAGIC`) as that compression."""
    hint = ""
    if line_number == 1 and line.startswith(UTF16_BYTE_ORDER_MARKS):
        hint = ": it is UTF-16 (its byte order mark); save it as UTF-8"
    elif line_number == 1:
        suffix = next((suffix for magic, suffix in COMPRESSED_DATA_MAGIC.items() if line.startswith(magic)), None)
        if suffix is not None:
            readable = (f"give the file a name ending in {suffix}, which is decompressed as it is read, or "
                        if suffix in COMPRESSIONS else "")
            hint = f": it is {suffix} compressed data; {readable}decompress it first"
    return DatasetSchemaError(f"{path}:{line_number}: not UTF-8 text ({error.reason} at byte {error.start} of the "
                              f"line){hint}")


def _tsv_columns(path: Path, source_lang: str, target_lang: str,
                 allow_source_only: bool) -> Iterator[dict[str, pa.Array]]:
    """`source`/`target` chunks of a tab-separated file whose first line names the columns (e.g. `en<TAB>de`), split
    at tabs with no quoting: every character but the tab and the line end is text. A header without the languages is
    an error naming line 1; a row with another number of fields than the header (a tab inside a sentence, or a
    missing field) is an error naming the line; an empty line is skipped."""
    header: list[str] | None = None
    for first_line, lines, _ in _line_chunks(path):
        if header is None:
            header = lines[0].as_py().split("\t")
            source_only = allow_source_only and target_lang not in header
            _require_languages(list(dict.fromkeys(header)), source_lang, source_lang if source_only else target_lang,
                               f"{path}:{first_line}, header", _header_hint(source_lang, target_lang, "\t", header))
            lines, first_line = lines[1:], first_line + 1
        fields = pc.split_pattern(lines, "\t")
        counts = pc.list_value_length(fields).to_numpy(zero_copy_only=False)
        filled = pc.utf8_length(lines).to_numpy(zero_copy_only=False) > 0
        wrong = np.flatnonzero(filled & (counts != len(header)))
        if wrong.size:
            line_number, found = first_line + int(wrong[0]), int(counts[wrong[0]])
            raise DatasetSchemaError(
                f"{path}:{line_number}: {found} tab-separated fields, but the header has {len(header)} "
                f"({', '.join(header)}); a .tsv file has no quoting, so a sentence may not contain a tab")
        rows = np.flatnonzero(filled)
        if rows.size == 0:
            continue
        fields = fields.take(pa.array(rows))
        # A name given twice in the header: the last column of that name, as a dict of the row would keep.
        source = pc.list_element(fields, len(header) - 1 - header[::-1].index(source_lang))
        target = (pa.nulls(len(rows), pa.string()) if source_only
                  else pc.list_element(fields, len(header) - 1 - header[::-1].index(target_lang)))
        yield {"source": source, "target": target}
    yield {"source": pa.array([], pa.string()), "target": pa.array([], pa.string())}


@dataclass
class LengthReport:
    """What tokenization did to one split, for the log."""

    split: str
    total: int
    empty: int = 0
    overlong: int = 0
    dropped: int = 0

    def describe(self, policy: str) -> str:
        kept = self.total - self.dropped
        treated = {"filter": "dropped", "truncate": "truncated", "keep": "kept whole"}[policy]
        return (f"{self.split}: kept {kept} of {self.total} pairs ({self.empty} with an empty side dropped, "
                f"{self.overlong} over the length limits {treated})")


# the version of how `with_concatenated_pairs` joins texts, in the prepared training split's key (1: always one space;
# 2: as `join_translations` joins sentences); a change to that rule raises it, so splits joined before are not reused
CONCATENATION_JOIN_RULE = 2


def with_concatenated_pairs(dataset: Dataset, ratio: float, seed: int, workdir: str | os.PathLike | None = None,
                            max_pairs: int = 2) -> Dataset:
    """The `source`/`target` pairs of `dataset` followed by round(ratio * len(dataset)) joined pairs: the sources of k
    different pairs joined as the pipeline joins sentences (`join_translations`: one space, none between Chinese or
    Japanese sentences), and their targets likewise, for pairs drawn uniformly (numpy's
    default_rng(seed)) among those with text on both sides (sentence concatenation, Kondo et al. 2021); k is 2, or
    drawn uniformly from 2 to `max_pairs` (the first two pairs of each are those `max_pairs` 2 draws). The joined pairs
    are written to an Arrow file in `workdir` when given (memory otherwise). With no pair to join, `dataset` itself."""
    count = round(ratio * len(dataset))
    if count == 0:
        return dataset
    usable = np.flatnonzero(has_text(dataset, "source") & has_text(dataset, "target"))
    if len(usable) < max_pairs:
        joins = "two" if max_pairs == 2 else f"up to {max_pairs} (max_pairs_per_join)"
        raise DatasetSchemaError(f"concatenated_pairs joins {joins} different training pairs; the training data has "
                                 f"{len(usable)} pair(s) with text on both sides")
    generator = np.random.default_rng(seed)
    first = generator.integers(len(usable), size=count)
    second = (first + generator.integers(1, len(usable), size=count)) % len(usable)   # never the same pair
    drawn = [first, second]
    if max_pairs > 2:
        sizes = generator.integers(2, max_pairs + 1, size=count)
        for position in range(2, max_pairs):
            more, rows = generator.integers(len(usable), size=count), np.arange(count)
            while (rows := rows[np.any(np.stack([indices[rows] for indices in drawn]) == more[rows], axis=0)]).size:
                more[rows] = generator.integers(len(usable), size=rows.size)   # drawn again where it repeats a pair
            drawn.append(np.where(sizes > position, more, -1))   # -1: this joined pair has fewer parts
    pairs = dataset.select_columns(["source", "target"])
    texts = pairs.with_format("arrow")

    def trimmed(table: pa.Table, column: str, present: np.ndarray) -> pa.Array:
        """`column` of `table` without surrounding whitespace, null where `present` is False."""
        values = pc.utf8_trim_whitespace(table[column]).combine_chunks()
        return values if present.all() else pc.if_else(pa.array(present), values, pa.scalar(None, values.type))

    def joined_chunks() -> Iterator[dict[str, pa.Array]]:
        for start in range(0, count, JOIN_CHUNK_PAIRS):
            chunk = [indices[start:start + JOIN_CHUNK_PAIRS] for indices in drawn]
            tables = [(texts[usable[np.maximum(indices, 0)]], indices >= 0) for indices in chunk]
            columns = {}
            for column in ("source", "target"):
                parts = [trimmed(table, column, present) for table, present in tables]
                joined = pc.binary_join_element_wise(*parts, pa.scalar(" ", parts[0].type), null_handling="skip")
                # `join_translations` joins with one space but where a script written without spaces meets itself.
                rows = pc.match_substring_regex(joined, NO_SPACE_SCRIPT.pattern)
                if pc.any(rows).as_py():
                    texts_by_row = zip(*(pc.filter(part, rows).to_pylist() for part in parts), strict=True)
                    rejoined = [join_translations([(text, " ") for text in texts if text is not None])
                                for texts in texts_by_row]
                    joined = pc.replace_with_mask(joined, rows, pa.array(rejoined, joined.type))
                columns[column] = joined
            yield columns

    joined = _ArrowSink(workdir, "joined").dataset(joined_chunks())
    logger.info("Added %d joined training pairs (concatenated_pairs %g%s) to the %d pairs", count, ratio,
                f", {max_pairs} pairs per join at most" if max_pairs > 2 else "", len(dataset))
    return concatenate_datasets([pairs, joined])


def tokenize_training_pairs(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments,
    workdir: str | os.PathLike | None = None, keep_text: bool = True,
) -> tuple[Dataset, LengthReport]:
    """Tokenize training pairs; drop pairs with an empty side, and filter or truncate the overlong ones. The maps
    write their Arrow files into `workdir` when given; `keep_text=False` leaves the text columns out."""
    report = LengthReport("train", len(dataset))
    non_empty = dataset.select(np.flatnonzero(has_text(dataset, "source") & has_text(dataset, "target")))
    report.empty = len(dataset) - len(non_empty)
    tokenized = _tokenize(non_empty, tokenizer, data_args.preprocessing_num_workers, workdir, "train", keep_text)
    overlong = _overlong_mask(tokenized, data_args.max_source_length, data_args.max_target_length)
    report.overlong = int(overlong.sum())
    if data_args.overlong_pairs == "filter":
        tokenized = select_rows(tokenized, np.flatnonzero(~overlong))
    else:
        tokenized = _truncate(tokenized, data_args.max_source_length, data_args.max_target_length,
                              tokenizer.eos_token_id, data_args.preprocessing_num_workers, workdir, "train")
    report.dropped = report.empty + (report.overlong if data_args.overlong_pairs == "filter" else 0)
    logger.info(report.describe(data_args.overlong_pairs))
    advice = (f"raise max_source_length ({data_args.max_source_length}) / max_target_length "
              f"({data_args.max_target_length}) or set overlong_pairs: truncate")
    if len(tokenized) == 0:
        raise DatasetSchemaError(
            f"no training pairs left after filtering: {report.describe(data_args.overlong_pairs)}; {advice}"
        )
    if report.dropped >= HEAVY_LOSS_SHARE * report.total:
        logger.warning("%.1f%% of the training pairs are dropped: %s; %s", 100 * report.dropped / report.total,
                       report.describe(data_args.overlong_pairs), advice)
    return tokenized, report


# What evaluation splits do with pairs over the length limits (`LengthReport.describe`'s policy): keep them whole.
EVALUATION_OVERLONG_PAIRS = "keep"


def tokenize_evaluation_pairs(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments, split: str,
    workdir: str | os.PathLike | None = None,
) -> tuple[Dataset, LengthReport]:
    """Tokenize evaluation pairs whole: none dropped, none cut. max_source_length / max_target_length bound the
    training pairs only; a longer source is translated whole, as hf-relpos-translate and the pipeline translate it
    (its output capped relative to it), so the split's BLEU is that of the whole test set."""
    tokenized = _tokenize(dataset, tokenizer, data_args.preprocessing_num_workers, workdir, split)
    overlong = _overlong_mask(tokenized, data_args.max_source_length, data_args.max_target_length)
    report = LengthReport(split, len(dataset), overlong=int(overlong.sum()))
    logger.info(report.describe(EVALUATION_OVERLONG_PAIRS))
    return tokenized, report


def unwritable_references(dataset: Dataset, tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[str]]:
    """`unwritable_texts` of a tokenized split with references: its labels decoded, against its references. What the
    tokenizer's normaliser changes (NFC changes 1120 characters: Devanagari's precomposed nukta letters such as
    U+095B, the Greek question mark, the Angstrom sign, CJK compatibility ideographs; NFD text is composed) or drops
    is text no translation from this tokenizer can hold."""
    if not has_references(dataset):
        return [], []
    return unwritable_texts(dataset["target"],
                            decode_translations(dataset["labels"], tokenizer))


def unwritable_texts(references: Sequence[str | None], decoded: Sequence[str]) -> tuple[list[int], list[str]]:
    """(the rows whose reference the tokenizer does not give back, the characters of those references missing from
    what it gives back): each reference against `decoded`, the same reference encoded and decoded, compared word by
    word (white space does not count, as BLEU and chrF ignore it); a None reference (none given) counts as given
    back."""
    rows = [row for row, (reference, text) in enumerate(zip(references, decoded, strict=True))
            if reference is not None and reference.split() != text.split()]
    missing = dict.fromkeys(character for row in rows for character in references[row]
                            if _not_written(character, decoded[row]))
    return rows, list(missing)


def _not_written(character: str, text: str) -> bool:
    """Whether `character` of a reference is missing from `text`, the reference as the tokenizer gives it back: not
    in it, and changed by NFC, a combining mark, or not even part of a composed character there (a base letter that
    NFC composed with its mark is written, inside the composed character)."""
    if character in text:
        return False
    return (unicodedata.normalize("NFC", character) != character or unicodedata.combining(character) != 0
            or character not in unicodedata.normalize("NFD", text))


def warn_of_unwritable_references(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, split: str) -> None:
    """A warning when some of the split's references are text the tokenizer cannot give back as written (see
    `unwritable_references`): they are scored as they are, so BLEU and chrF count those characters as errors in every
    translation."""
    message = unwritable_references_message(split, *unwritable_references(dataset, tokenizer), len(dataset), tokenizer)
    if message is not None:
        logger.warning("%s", message)


def unwritable_references_message(where: str, rows: list[int], missing: list[str], references: int,
                                  tokenizer: PreTrainedTokenizerBase) -> str | None:
    """What `where`'s `references` references hold that the tokenizer cannot give back as written (`rows` and
    `missing`, of `unwritable_texts`), and what it means for their scores; None when they hold nothing such."""
    if not rows:
        return None
    shown = ", ".join(f"U+{ord(character):04X} {unicodedata.name(character, '')}".strip() for character in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return (f"{where}: {len(rows)} of the {references} references hold text the tokenizer gives back otherwise (its "
            f"normaliser, {_normaliser_name(tokenizer)}, changes it, or it cannot encode it), first in reference "
            f"{rows[0] + 1}; characters no translation can write as they are: "
            f"{shown or 'none (only their order or composition differs)'}{more}. The references are scored as they "
            "are, so BLEU and chrF count these as errors in any translation; normalise the reference file the same "
            "way (e.g. unicodedata.normalize('NFC', line)) to score the translations alone")


def _normaliser_name(tokenizer: PreTrainedTokenizerBase) -> str:
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    return type(normalizer).__name__ if normalizer is not None else "none"


# Token columns as the tokenization maps write them (int32: half the disk of Arrow's default int64).
TOKEN_FEATURES = Features({"input_ids": List(Value("int32")), "labels": List(Value("int32")),
                           "source_length": Value("int32"), "target_length": Value("int32")})


def _map_cache_file(workdir: str | os.PathLike | None, name: str) -> str | None:
    return None if workdir is None else str(Path(workdir) / f"{name}.arrow")


def _tokenize(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, num_proc: int | None,
              workdir: str | os.PathLike | None, split: str, keep_text: bool = True) -> Dataset:
    encode_texts = batch_encoder(tokenizer)

    def encode(batch: dict[str, list[str]]) -> dict[str, list]:
        sources = encode_texts(batch["source"], False)
        targets = encode_texts([text or "" for text in batch["target"]], True)  # None: source-only
        return {"input_ids": sources, "labels": targets,
                "source_length": [len(ids) for ids in sources], "target_length": [len(ids) for ids in targets]}

    text = ("source", "target")
    features = Features({**{name: dataset.features[name] for name in text if keep_text}, **TOKEN_FEATURES})
    return dataset.map(encode, batched=True, num_proc=num_proc, desc=f"Tokenizing {split}", features=features,
                       remove_columns=None if keep_text else list(text),
                       cache_file_name=_map_cache_file(workdir, f"{split}-tokenized"), load_from_cache_file=False)


def batch_encoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[str], bool], list[list[int]]]:
    """`encode(texts, as_target)`: the token ids of each text, as `tokenizer(texts)` (or `text_target=texts`) gives
    them; for a plain fast tokenizer without truncation or padding (this package's own `RelPosTokenizer`, which
    encodes as its base class does) straight from its Rust backend's `encode_batch_fast`, which skips the offsets and
    masks nothing here reads. The backend is told the tokenizer's `split_special_tokens` at each call, as
    `tokenizer(texts)` tells it: the flag is not part of the backend's serialisation, so a copy pickled into a
    preprocessing worker would otherwise lose it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    plain = type(tokenizer) in (PreTrainedTokenizerFast, RelPosTokenizer)
    if plain and backend.truncation is None and backend.padding is None:
        split_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))

        def encode(texts: list[str], as_target: bool) -> list[list[int]]:
            backend.encode_special_tokens = split_special_tokens
            return [encoding.ids for encoding in backend.encode_batch_fast(texts)]

        return encode
    return lambda texts, as_target: (tokenizer(text_target=texts) if as_target else tokenizer(texts))["input_ids"]


def _overlong_mask(dataset: Dataset, max_source_length: int, max_target_length: int) -> np.ndarray:
    source_lengths, target_lengths = example_lengths(dataset)
    return (source_lengths > max_source_length) | (target_lengths > max_target_length)


def _truncate(dataset: Dataset, max_source_length: int, max_target_length: int, eos_token_id: int,
              num_proc: int | None, workdir: str | os.PathLike | None, split: str) -> Dataset:
    """Cut token sequences to the limits, keeping the final </s>."""
    def cut(batch: dict[str, list]) -> dict[str, list]:
        sources = [ids if len(ids) <= max_source_length else ids[: max_source_length - 1] + [eos_token_id]
                   for ids in batch["input_ids"]]
        targets = [ids if len(ids) <= max_target_length else ids[: max_target_length - 1] + [eos_token_id]
                   for ids in batch["labels"]]
        return {"input_ids": sources, "labels": targets,
                "source_length": [len(ids) for ids in sources], "target_length": [len(ids) for ids in targets]}

    return dataset.map(cut, batched=True, num_proc=num_proc, desc=f"Truncating {split}", features=dataset.features,
                       cache_file_name=_map_cache_file(workdir, f"{split}-truncated"), load_from_cache_file=False)


LENGTH_COLUMNS = ("source_length", "target_length")
# The datasets `select_rows` made -> (the dataset they were selected from, the rows selected), held weakly (an entry
# goes with its dataset). `datasets` reads a column of a `select`ed dataset row by row (`Table.fast_gather` of every
# index: 21 s and 2.4 GB for the 4.65M WMT14 pairs filtered to the length limits) and no public API of it gives a
# selection's rows, so the rows this package selects are kept here for `example_lengths` to pick in numpy.
_SELECTIONS: weakref.WeakKeyDictionary[Dataset, tuple[Dataset, np.ndarray]] = weakref.WeakKeyDictionary()


def select_rows(dataset: Dataset, rows: np.ndarray | Sequence[int]) -> Dataset:
    """`dataset.select(rows)`, whose `example_lengths` are `dataset`'s picked at `rows` in numpy (not gathered row by
    row by `datasets`)."""
    rows = np.asarray(rows, dtype=np.int64)
    selected = dataset.select(rows)
    _SELECTIONS[selected] = (dataset, rows)
    return selected


def example_lengths(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Token counts (source, target) per example, from the columns written at tokenization: for a dataset `select_rows`
    made, those of the dataset it selected from, picked at its rows in numpy; for any other, its columns read whole
    from its (memory-mapped) table. A dataset `select`ed otherwise (not by `select_rows`) is read through `datasets`,
    which gathers its rows one by one: right, but slow and memory-hungry for millions of rows."""
    if (selection := _SELECTIONS.get(dataset)) is not None:
        source, rows = selection
        return tuple(lengths[rows] for lengths in example_lengths(source))
    table = dataset.select_columns(list(LENGTH_COLUMNS)).with_format("arrow")[:]
    return tuple(np.asarray(table.column(name).to_numpy(), dtype=np.int64) for name in LENGTH_COLUMNS)


# The characters Python's str.isspace() (and so str.strip()) counts as white space, as an RE2 class.
WHITE_SPACE = "".join(f"\\x{{{code:x}}}" for code in range(sys.maxunicode + 1) if chr(code).isspace())


def has_text(dataset: Dataset, column: str) -> np.ndarray:
    """Per example, whether the text in `column` has a character that is not white space (`bool(text.strip())`);
    False for a missing text."""
    return texts_with_text(dataset.with_format("arrow")[column])


def texts_with_text(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per text, `bool(text.strip())`; False for a missing text."""
    blank = pc.match_substring_regex(texts, f"^[{WHITE_SPACE}]*$")
    return ~np.asarray(pc.fill_null(blank, True).to_numpy(zero_copy_only=False), dtype=bool)


def sort_by_source_length(dataset: Dataset) -> tuple[Dataset, np.ndarray]:
    """The dataset sorted longest source first (similar lengths batch together, so beam search pads little), and the
    original position of each sorted example, for `restore_order`."""
    source_lengths, _ = example_lengths(dataset)
    order = np.argsort(-source_lengths, kind="stable")
    return select_rows(dataset, order), order


def restore_order(items_in_sorted_order: list[Any], order: np.ndarray) -> list[Any]:
    """Undo `sort_by_source_length`: item i of the result belongs to example i of the original dataset."""
    if len(items_in_sorted_order) != len(order):
        raise ValueError(f"{len(items_in_sorted_order)} items for {len(order)} examples")
    restored: list[Any] = [None] * len(order)
    for sorted_position, original_position in enumerate(order.tolist()):
        restored[original_position] = items_in_sorted_order[sorted_position]
    return restored
