"""The reading and tokenization of hf_relpos/translation/data.py before the prepared-data path, kept verbatim as the
oracle of tests/test_prepared_data.py: Python lists of every line and record, `Dataset.from_dict`, row-by-row filters."""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from hf_relpos.translation.data import DataArguments, DatasetSchemaError

logger = logging.getLogger(__name__)

DEMO_DATASET_NAME = "demo"
DEMO_DATA_FOLDER = "demo_data"
FILE_FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv", ".txt": "txt"}
SOURCE_ONLY_FORMATS = ("txt",)  # one source sentence per line: a test file to translate, never to train on
BYTE_ORDER_MARK = "\ufeff"
# Dropping this share of the training pairs or more (empty, or over the length limits) is logged as a warning.
HEAVY_LOSS_SHARE = 0.1
HUB_TIMEOUT_SECONDS = 10
OVERLONG_PAIR_POLICIES = ("filter", "truncate")
TRANSLATION_COLUMN = "translation"
SPLITS = ("train", "validation", "test")


def _require_languages(available: list[str], source_lang: str, target_lang: str, where: str) -> None:
    missing = [lang for lang in dict.fromkeys((source_lang, target_lang)) if lang not in available]
    if missing:
        raise DatasetSchemaError(
            f"{where}: no {' or '.join(repr(lang) for lang in missing)} (found {sorted(available)}); expected "
            f"'{TRANSLATION_COLUMN}': {{'{source_lang}': ..., '{target_lang}': ...}} or flat columns "
            f"'{source_lang}' and '{target_lang}' (set source_lang/target_lang)"
        )


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def plain_text_files(prefix: str | os.PathLike, source_lang: str, target_lang: str) -> tuple[Path, Path]:
    """The two plain-text files a prefix names, fairseq-style: `data/train` -> `data/train.en`, `data/train.de`."""
    return tuple(Path(f"{prefix}.{lang}") for lang in (source_lang, target_lang))


def read_local_pairs(path: str | os.PathLike, source_lang: str, target_lang: str,
                     allow_source_only: bool = False) -> Dataset:
    """Read a .jsonl/.json/.csv/.tsv parallel file, or the plain-text pair `path.SOURCE_LANG` + `path.TARGET_LANG`
    when `path` is no file and does not end in one of those suffixes (`data/train`, `corpus.tok.bpe`), into
    `source`/`target` columns; errors name the file and line.

    With `allow_source_only` (test files), a .txt file (one source per line, blank lines kept), a prefix with only the
    source-language file, or a file whose records all lack the target language is read with a `target` column of
    None."""
    path = Path(path)
    file_format = FILE_FORMATS.get(path.suffix.lower())
    if not path.is_file():
        if file_format is not None:
            raise DatasetSchemaError(f"data file {str(path)!r} does not exist")
        return _read_plain_text_pair(path, source_lang, target_lang, allow_source_only)
    if file_format is None:
        raise DatasetSchemaError(f"data file {str(path)!r} must end in one of {sorted(FILE_FORMATS)} (or name the "
                                 f"prefix of plain-text files {str(path)}.{source_lang} + {str(path)}.{target_lang}, "
                                 "and not be a file itself)")
    if file_format in SOURCE_ONLY_FORMATS and not allow_source_only:
        raise DatasetSchemaError(f"data file {str(path)!r} holds sources only; this split needs pairs")
    sources: list[str] = []
    targets: list[str | None] = []
    first_without_target = first_with_target = None
    for location, record in _records(path, file_format, source_lang):
        if not isinstance(record, dict):
            raise DatasetSchemaError(f"{location}: expected an object with the texts, got {type(record).__name__}")
        texts = record.get(TRANSLATION_COLUMN, record) if file_format in ("jsonl", "json") else record
        if not isinstance(texts, dict):
            raise DatasetSchemaError(f"{location}: '{TRANSLATION_COLUMN}' must be an object of language -> text")
        where = f"{location}, field '{TRANSLATION_COLUMN}'" if texts is not record else f"{location}, fields"
        source_only = allow_source_only and target_lang not in texts
        _require_languages(list(texts), source_lang, source_lang if source_only else target_lang, where)
        if source_only:
            first_without_target = first_without_target or where
        else:
            first_with_target = first_with_target or where
        for lang, column in ((source_lang, sources), (target_lang, targets)):
            value = texts.get(lang)
            if value is not None and not isinstance(value, str):
                raise DatasetSchemaError(f"{location}: {lang!r} must be a string, got {type(value).__name__}")
            column.append(None if source_only and lang == target_lang else value or "")
    if first_without_target and first_with_target:
        raise DatasetSchemaError(f"{first_without_target}: no {target_lang!r}, although {first_with_target} has one; "
                                 "a test file is either parallel on every line or source-only")
    return Dataset.from_dict({"source": sources, "target": targets})


def _read_plain_text_pair(prefix: Path, source_lang: str, target_lang: str, allow_source_only: bool) -> Dataset:
    """`prefix.SOURCE_LANG` and `prefix.TARGET_LANG`, line by line (one error when their line counts differ); with
    `allow_source_only`, the source file alone when the target file does not exist."""
    source_path, target_path = plain_text_files(prefix, source_lang, target_lang)
    missing = [str(candidate) for candidate in (source_path, target_path) if not candidate.is_file()]
    if missing == [str(target_path)] and allow_source_only:
        sources = list(_lines(source_path))
        return Dataset.from_dict({"source": sources, "target": [None] * len(sources)})
    if missing:
        raise DatasetSchemaError(
            f"data file {str(prefix)!r} does not exist, nor does the plain-text pair it would name as a prefix "
            f"({source_path} + {target_path}: {' and '.join(missing)} missing); give a "
            f"{'/'.join(sorted(FILE_FORMATS))} file or a prefix whose .{source_lang} and .{target_lang} files exist")
    sources, targets = list(_lines(source_path)), list(_lines(target_path))
    if len(sources) != len(targets):
        raise DatasetSchemaError(
            f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}; parallel plain-text files "
            "need one line per sentence, line i of one the translation of line i of the other")
    return Dataset.from_dict({"source": sources, "target": targets})


def _lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file without their "\n" (or "\r\n"), split at "\n" only, as `wc -l` counts them
    (a final "\n" ends the last line, it starts none); a byte order mark at the start is dropped."""
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DatasetSchemaError(f"{path}:{line_number}: not UTF-8 text ({error.reason} at byte "
                                         f"{error.start} of the line)") from None
            if line_number == 1:
                line = line.removeprefix(BYTE_ORDER_MARK)
            yield line.removesuffix("\n").removesuffix("\r")


def _records(path: Path, file_format: str, source_lang: str) -> Iterator[tuple[str, Any]]:
    """(location, record) for each example; location is "file:line" (or "file: record N" for a JSON array)."""
    if file_format == "txt":
        for line_number, line in enumerate(_lines(path), start=1):
            yield f"{path}:{line_number}", {source_lang: line}
    elif file_format == "tsv":
        yield from _tsv_records(path)
    elif file_format == "jsonl":
        with open(path, encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        yield f"{path}:{line_number}", json.loads(line)
                    except json.JSONDecodeError as error:
                        raise DatasetSchemaError(f"{path}:{line_number}: invalid JSON ({error.msg})") from None
    elif file_format == "json":
        with open(path, encoding="utf-8") as handle:
            try:
                content = json.load(handle)
            except json.JSONDecodeError as error:
                raise DatasetSchemaError(f"{path}:{error.lineno}: invalid JSON ({error.msg})") from None
        records = content.get("data") if isinstance(content, dict) else content
        if not isinstance(records, list):
            raise DatasetSchemaError(f"{path}: a .json file must hold a list of records or {{\"data\": [records]}}")
        for index, record in enumerate(records):
            yield f"{path}: record {index}", record
    else:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            for row in reader:
                if None in row:
                    raise DatasetSchemaError(f"{path}:{reader.line_num}: more fields than the header has")
                yield f"{path}:{reader.line_num}", row


def _tsv_records(path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """Rows of a tab-separated file whose first line names the columns (e.g. `en<TAB>de`), split at tabs with no
    quoting: every character but the tab and the line end is text. A row with another number of fields than the
    header (a tab inside a sentence, or a missing field) is an error naming the line; an empty line is skipped."""
    lines = enumerate(_lines(path), start=1)
    header = next((line.split("\t") for _, line in lines), None)
    if header is None:
        return
    for line_number, line in lines:
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DatasetSchemaError(
                f"{path}:{line_number}: {len(fields)} tab-separated fields, but the header has {len(header)} "
                f"({', '.join(header)}); a .tsv file has no quoting, so a sentence may not contain a tab")
        yield f"{path}:{line_number}", dict(zip(header, fields, strict=True))


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
        return (f"{self.split}: kept {kept} of {self.total} pairs ({self.empty} with an empty side dropped, "
                f"{self.overlong} over the length limits {'dropped' if policy == 'filter' else 'truncated'})")


def tokenize_training_pairs(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments
) -> tuple[Dataset, LengthReport]:
    """Tokenize training pairs; drop pairs with an empty side, and filter or truncate the overlong ones."""
    report = LengthReport("train", len(dataset))
    non_empty = dataset.filter(
        lambda batch: [bool(s.strip()) and bool(t.strip()) for s, t in zip(batch["source"], batch["target"], strict=True)],
        batched=True, num_proc=data_args.preprocessing_num_workers, desc="Dropping empty pairs",
    )
    report.empty = len(dataset) - len(non_empty)
    tokenized = _tokenize(non_empty, tokenizer, data_args.preprocessing_num_workers)
    overlong = _overlong_mask(tokenized, data_args.max_source_length, data_args.max_target_length)
    report.overlong = int(overlong.sum())
    if data_args.overlong_pairs == "filter":
        tokenized = tokenized.select(np.flatnonzero(~overlong))
    else:
        tokenized = _truncate(tokenized, data_args.max_source_length, data_args.max_target_length,
                              tokenizer.eos_token_id, data_args.preprocessing_num_workers)
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


def tokenize_evaluation_pairs(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments, split: str
) -> tuple[Dataset, LengthReport]:
    """Tokenize evaluation pairs without dropping any (the test set stays whole); overlong ones are truncated."""
    tokenized = _tokenize(dataset, tokenizer, data_args.preprocessing_num_workers)
    overlong = _overlong_mask(tokenized, data_args.max_source_length, data_args.max_target_length)
    report = LengthReport(split, len(dataset), overlong=int(overlong.sum()))
    long_sources = int((example_lengths(tokenized)[0] > data_args.max_source_length).sum())
    if long_sources:
        logger.warning("%s: %d source(s) longer than max_source_length=%d tokens are truncated to it for translation "
                       "(the references stay whole)", split, long_sources, data_args.max_source_length)
    if report.overlong:
        tokenized = _truncate(tokenized, data_args.max_source_length, data_args.max_target_length,
                              tokenizer.eos_token_id, data_args.preprocessing_num_workers)
    logger.info(report.describe("truncate"))
    return tokenized, report


def _tokenize(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, num_proc: int | None) -> Dataset:
    def encode(batch: dict[str, list[str]]) -> dict[str, list]:
        sources = tokenizer(batch["source"])["input_ids"]
        targets = tokenizer(text_target=[text or "" for text in batch["target"]])["input_ids"]  # None: source-only
        return {"input_ids": sources, "labels": targets,
                "source_length": [len(ids) for ids in sources], "target_length": [len(ids) for ids in targets]}

    return dataset.map(encode, batched=True, num_proc=num_proc, desc="Tokenizing")


def _overlong_mask(dataset: Dataset, max_source_length: int, max_target_length: int) -> np.ndarray:
    source_lengths, target_lengths = example_lengths(dataset)
    return (source_lengths > max_source_length) | (target_lengths > max_target_length)


def _truncate(dataset: Dataset, max_source_length: int, max_target_length: int, eos_token_id: int,
              num_proc: int | None) -> Dataset:
    """Cut token sequences to the limits, keeping the final </s>."""
    def cut(batch: dict[str, list]) -> dict[str, list]:
        sources = [ids if len(ids) <= max_source_length else ids[: max_source_length - 1] + [eos_token_id]
                   for ids in batch["input_ids"]]
        targets = [ids if len(ids) <= max_target_length else ids[: max_target_length - 1] + [eos_token_id]
                   for ids in batch["labels"]]
        return {"input_ids": sources, "labels": targets,
                "source_length": [len(ids) for ids in sources], "target_length": [len(ids) for ids in targets]}

    return dataset.map(cut, batched=True, num_proc=num_proc, desc="Truncating")


def example_lengths(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Token counts (source, target) per example, from the columns written at tokenization."""
    columns = dataset.with_format("numpy")
    return np.asarray(columns["source_length"], dtype=np.int64), np.asarray(columns["target_length"], dtype=np.int64)
