"""The prepared-data path against the code it replaced: the same batches for a fixed seed (the sampler it replaced, kept
below verbatim as the oracle), the same pairs from every file layout and the same token ids; and the prepared data
reused by a rerun and by a second process, rebuilt when a file or a setting changes, never loaded half-written."""

from __future__ import annotations

import bz2
import contextlib
import csv
import errno
import gzip
import json
import lzma
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import legacy_data_pipeline as legacy
import numpy as np
import pytest
import test_train_distributed as distributed
from datasets import Dataset, load_dataset_builder, load_from_disk
from test_data import write_hub_layout
from test_training import write_config
from transformers import AutoTokenizer

import hf_relpos.translation.data as data_module
import hf_relpos.translation.data_preparation as preparation_module
import hf_relpos.translation.tokenizer_setup as tokenizer_module
import hf_relpos.translation.trainer as trainer_module
import hf_relpos.translation.training as training_module
from hf_relpos.translation.batching import TokenBudgetBatchSampler
from hf_relpos.translation.data import (
    DataArguments,
    DatasetSchemaError,
    has_references,
    load_parallel_splits,
    read_local_pairs,
    tokenize_evaluation_pairs,
    tokenize_training_pairs,
)
from hf_relpos.translation.demo_corpus import random_sentence_pair, write_demo_corpus
from hf_relpos.translation.prepared import (
    MANIFEST_FILE,
    PARTIAL_PREFIX,
    PREPARED_FOLDER,
    PreparationError,
    PreparedStore,
    load_prepared,
    prepared_store,
)
from hf_relpos.translation.safety import OutputDirError
from hf_relpos.translation.tokenization import train_joint_tokenizer
from hf_relpos.translation.training import ConfigError, run


# ---- Oracle: the sampler it replaced (its `_cut_batches` read the whole length list per pool: quadratic) -----------
class LegacySampler:
    def __init__(self, source_lengths, target_lengths, max_tokens, num_processes=1, shuffle=True, seed=0,
                 pool_factor=None):
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        self.max_tokens, self.num_processes, self.shuffle, self.seed = max_tokens, num_processes, shuffle, seed
        self.pool_factor = pool_factor
        self.epoch = 0
        self._pass_sizes: list[int] = []
        self._last_pass = None
        if pool_factor is None:
            self._num_batches = len(self._batches_for_epoch(0))
        else:
            self._num_batches = len(self._pass(0)) // num_processes * num_processes

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        if self.pool_factor is None:
            yield from self._batches_for_epoch(self.epoch)
        else:
            yield from self._stream_slice(self.epoch * self._num_batches, (self.epoch + 1) * self._num_batches)

    def _stream_slice(self, start, stop):
        batches, pass_start, pass_index = [], 0, 0
        while pass_start < stop:
            size = self._pass_size(pass_index)
            if pass_start + size > start:
                batches.extend(self._pass(pass_index)[max(start - pass_start, 0) : stop - pass_start])
            pass_start += size
            pass_index += 1
        return batches

    def _pass_size(self, pass_index):
        while len(self._pass_sizes) <= pass_index:
            self._pass(len(self._pass_sizes))
        return self._pass_sizes[pass_index]

    def _pass(self, pass_index):
        if self._last_pass is None or self._last_pass[0] != pass_index:
            generator = np.random.default_rng([self.seed, pass_index])
            order = generator.permutation(len(self.source_lengths))
            longer_side = np.maximum(self.source_lengths, self.target_lengths)[order]
            pool = (np.cumsum(longer_side) - longer_side) // (self.pool_factor * self.max_tokens)
            by_length = np.lexsort((self.target_lengths[order], self.source_lengths[order], longer_side, pool))
            pools = np.split(order[by_length], np.flatnonzero(np.diff(pool[by_length])) + 1)
            batches = [batch for members in pools for batch in self._cut_batches(members)]
            if len(batches) < self.num_processes:
                batches = legacy_split_to_multiple(batches, self.num_processes)
            if pass_index == len(self._pass_sizes):
                self._pass_sizes.append(len(batches))
            self._last_pass = (pass_index, [batches[i] for i in generator.permutation(len(batches))])
        return self._last_pass[1]

    def _batches_for_epoch(self, epoch):
        generator = np.random.default_rng([self.seed, epoch])
        tie_break = generator.permutation(len(self.source_lengths)) if self.shuffle else np.arange(
            len(self.source_lengths))
        by_length = tie_break[np.lexsort((self.target_lengths[tie_break], self.source_lengths[tie_break]))]
        batches = legacy_split_to_multiple(self._cut_batches(by_length), self.num_processes)
        if self.shuffle:
            return [batches[i] for i in generator.permutation(len(batches))]
        return batches

    def _cut_batches(self, order):
        return legacy_cut(order.tolist(), np.maximum(self.source_lengths, self.target_lengths).tolist(),
                          self.max_tokens)


def legacy_cut(order: Sequence[int], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    batches, current, longest_in_batch = [], [], 0
    for index in order:
        longest = max(longest_in_batch, lengths[index])
        if current and (len(current) + 1) * longest > max_tokens:
            batches.append(current)
            current, longest = [], lengths[index]
        current.append(index)
        longest_in_batch = longest
    if current:
        batches.append(current)
    return batches


def legacy_split_to_multiple(batches, multiple):
    batches = list(batches)
    while len(batches) % multiple:
        largest = max(range(len(batches)), key=lambda position: len(batches[position]))
        batch = batches[largest]
        middle = len(batch) // 2
        batches[largest : largest + 1] = [batch[:middle], batch[middle:]]
    return batches


@pytest.mark.parametrize("pool_factor", [None, 1, 3, 50])
@pytest.mark.parametrize("num_processes", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_the_sampler_yields_the_batches_of_the_code_it_replaced(pool_factor, num_processes, shuffle):
    if pool_factor is not None and not shuffle:
        pytest.skip("pools need shuffle")
    rng = random.Random(pool_factor or 0)
    sources = [rng.randint(1, 90) for _ in range(1500)]
    targets = [rng.randint(1, 110) for _ in range(1500)]
    arguments = dict(max_tokens=400, num_processes=num_processes, shuffle=shuffle, seed=7, pool_factor=pool_factor)
    new, old = TokenBudgetBatchSampler(sources, targets, **arguments), LegacySampler(sources, targets, **arguments)
    assert len(new) == old._num_batches
    for epoch in range(4):
        new.set_epoch(epoch)
        old.set_epoch(epoch)
        assert list(new) == list(old)


# ---- Reading and tokenization against the code it replaced (tests/legacy_data_pipeline.py) -------------------------
TRICKY_LINES = [
    ("A small cat.", "Eine kleine Katze."), ("", "Leer."), ("   ", "Nur Leerzeichen."), ("Tab\u3000space", "\x1c\u2028"),
    ("Ends in CR\r", "Windows\r"), ("Mid\rline", "Zeile\u2028mit Trenner"), ("Ünïcödé – “quotes”", "Straße 😀"),
    (" ".join(["long"] * 30), "kurz"), ("short", " ".join(["lang"] * 30)), ("\xa0", "Nicht leer"),
] * 7


def write_tricky_corpus(folder, with_final_newline=True):
    """The pairs in every layout: plain-text prefix (a byte order mark, "\r\n" line ends), .tsv, .jsonl, .csv and a
    source-only .txt."""
    folder.mkdir(parents=True, exist_ok=True)
    end = "\n" if with_final_newline else ""
    sources, targets = zip(*TRICKY_LINES, strict=True)
    (folder / "plain.en").write_bytes(("\ufeff" + "\r\n".join(sources) + end).encode("utf-8"))
    (folder / "plain.de").write_bytes(("\n".join(targets) + end).encode("utf-8"))
    tsv_rows = ["en\tde"] + [f"{en}\t{de}" if i % 9 else "" for i, (en, de) in enumerate(TRICKY_LINES)]
    (folder / "pairs.tsv").write_bytes(("\n".join(tsv_rows) + end).encode("utf-8"))
    (folder / "pairs.jsonl").write_text("".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n"
                                                for en, de in TRICKY_LINES), encoding="utf-8")
    with open(folder / "pairs.csv", "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["en", "de"])
        writer.writerows(TRICKY_LINES)
    (folder / "sources.txt").write_bytes(("\n".join(sources) + end).encode("utf-8"))
    # JSON lines of several shapes: flat with extra fields, nested, blank lines, an empty text, source-only records.
    mixed = [json.dumps({"en": en, "de": de, "id": i}) if i % 5 else json.dumps({"translation": {"en": en, "de": de}})
             for i, (en, de) in enumerate(TRICKY_LINES)]
    mixed[20:20] = ["", "   ", json.dumps({"en": "", "de": "Leere Quelle"})]
    (folder / "mixed.jsonl").write_bytes(("\n".join(mixed) + end).encode("utf-8"))
    (folder / "sources.jsonl").write_text("".join(json.dumps({"translation": {"en": en}}) + "\n"
                                                  for en in sources), encoding="utf-8")
    return {"plain": folder / "plain", "tsv": folder / "pairs.tsv", "jsonl": folder / "pairs.jsonl",
            "mixed_jsonl": folder / "mixed.jsonl", "source_jsonl": folder / "sources.jsonl", "csv": folder / "pairs.csv",
            "txt": folder / "sources.txt"}


def columns(dataset):
    return {"source": list(dataset["source"]), "target": list(dataset["target"])}


@pytest.mark.parametrize("chunk_bytes", [7, 64, 1 << 20])
@pytest.mark.parametrize("final_newline", [True, False])
@pytest.mark.parametrize("on_disk", [False, True])
def test_reading_gives_the_pairs_the_code_it_replaced_read(tmp_path, monkeypatch, chunk_bytes, final_newline, on_disk):
    monkeypatch.setattr(data_module, "READ_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(data_module, "RECORDS_PER_CHUNK", 4)
    files = write_tricky_corpus(tmp_path / "corpus", final_newline)
    for layout, path in files.items():
        source_only = layout in ("txt", "source_jsonl")
        new = read_local_pairs(path, "en", "de", allow_source_only=source_only,
                               workdir=tmp_path / "work" if on_disk else None)
        old = legacy.read_local_pairs(path, "en", "de", allow_source_only=source_only)
        assert columns(new) == columns(old), layout
        assert len(new) == {"tsv": len(TRICKY_LINES) - 8, "mixed_jsonl": len(TRICKY_LINES) + 1}.get(layout,
                                                                                                  len(TRICKY_LINES))


def test_reading_errors_are_those_of_the_code_it_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "READ_CHUNK_BYTES", 16)
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "utf.en").write_bytes(b"one\ntwo\nthr\xc3e\nfour\n")
    (folder / "utf.de").write_bytes(b"eins\nzwei\ndrei\nvier\n")
    (folder / "count.en").write_text("a\nb\nc\n")
    (folder / "count.de").write_text("a\nb\n")
    (folder / "tabs.tsv").write_text("en\tde\na\tb\nc\td\te\n")
    (folder / "languages.tsv").write_text("en\tfr\na\tb\n")
    (folder / "typed.jsonl").write_text('{"en": "a", "de": "b"}\n{"en": "a", "de": 5}\n')
    (folder / "mixed.jsonl").write_text('{"en": "a", "de": "b"}\n{"en": "a"}\n')
    good = '{"en": "a", "de": "b"}\n' * 5
    (folder / "invalid.jsonl").write_text(good + '{"en": "a", "de": "b"\n' + good)
    (folder / "list.jsonl").write_text(good + '["a", "b"]\n')
    (folder / "missing.jsonl").write_text(good + '{"en": "a"}\n')
    (folder / "nested.jsonl").write_text(good + '{"translation": "a"}\n')
    cases = [("utf", False), ("count", False), ("tabs.tsv", False), ("typed.jsonl", False),
             ("mixed.jsonl", True), ("invalid.jsonl", False), ("list.jsonl", False), ("missing.jsonl", False),
             ("nested.jsonl", False)]
    # one change on purpose: a .tsv header without the languages names line 1, where they are (the old code: line 2)
    with pytest.raises(DatasetSchemaError, match=r"languages\.tsv:1, header: no 'de'"):
        read_local_pairs(folder / "languages.tsv", "en", "de")
    with pytest.raises(DatasetSchemaError, match=r"languages\.tsv:2, fields: no 'de'"):
        legacy.read_local_pairs(folder / "languages.tsv", "en", "de")
    for name, source_only in cases:
        with pytest.raises(DatasetSchemaError) as new:
            read_local_pairs(folder / name, "en", "de", allow_source_only=source_only)
        with pytest.raises(DatasetSchemaError) as old:
            legacy.read_local_pairs(folder / name, "en", "de", allow_source_only=source_only)
        assert str(new.value) == str(old.value), name


@pytest.fixture(scope="module")
def tricky_tokenizer():
    english, german = zip(*[random_sentence_pair(random.Random(i)) for i in range(200)], strict=True)
    texts = list(english) + list(german) + [text for pair in TRICKY_LINES for text in pair]
    return train_joint_tokenizer(texts, vocab_size=500)


TOKEN_COLUMNS = ("input_ids", "labels", "source_length", "target_length")


@pytest.mark.parametrize("policy", ["filter", "truncate"])
@pytest.mark.parametrize("workers", [None, 2])
def test_training_pairs_get_the_token_ids_of_the_code_it_replaced(tmp_path, tricky_tokenizer, policy, workers):
    files = write_tricky_corpus(tmp_path / "corpus")
    arguments = DataArguments(max_source_length=12, max_target_length=10, overlong_pairs=policy,
                              preprocessing_num_workers=workers)
    for tokenizer in (tricky_tokenizer, SlowPathTokenizer(tricky_tokenizer)):
        new, new_report = tokenize_training_pairs(read_local_pairs(files["plain"], "en", "de"), tokenizer, arguments,
                                                  workdir=tmp_path / "work")
        old, old_report = legacy.tokenize_training_pairs(legacy.read_local_pairs(files["plain"], "en", "de"),
                                                         tricky_tokenizer, arguments)
        assert vars(new_report) == vars(old_report) and new_report.dropped > 0
        for column in ("source", *TOKEN_COLUMNS):
            assert list(new[column]) == list(old[column]), column


def test_evaluation_pairs_get_the_token_ids_of_the_code_it_replaced(tmp_path, tricky_tokenizer):
    """Within the length limits (the replaced code cut evaluation pairs beyond them, which no longer happens:
    tests/test_data.py)."""
    files = write_tricky_corpus(tmp_path / "corpus")
    arguments = DataArguments(max_source_length=1024, max_target_length=1024)
    for layout in ("plain", "txt"):
        dataset = read_local_pairs(files[layout], "en", "de", allow_source_only=True)
        new, new_report = tokenize_evaluation_pairs(dataset, tricky_tokenizer, arguments, "test")
        legacy_dataset = legacy.read_local_pairs(files[layout], "en", "de", allow_source_only=True)
        old, old_report = legacy.tokenize_evaluation_pairs(legacy_dataset, tricky_tokenizer, arguments, "test")
        assert vars(new_report) == vars(old_report)
        for column in ("source", "target", *TOKEN_COLUMNS):
            assert list(new[column]) == list(old[column]), (layout, column)
        assert has_references(new) == (layout == "plain")


COMPRESSORS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def compressed_copy(files: dict[str, Path], folder: Path, suffix: str) -> dict[str, Path]:
    """Each of `files` (a plain-text prefix: both its files) compressed with `suffix` into `folder`, by layout."""
    folder.mkdir()
    copies = {}
    for layout, path in files.items():
        originals = [path] if path.is_file() else [Path(f"{path}.{lang}") for lang in ("en", "de")]
        for original in originals:
            (folder / f"{original.name}{suffix}").write_bytes(COMPRESSORS[suffix](original.read_bytes()))
        copies[layout] = folder / (f"{path.name}{suffix}" if path.is_file() else path.name)
    return copies


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_a_compressed_file_of_every_layout_gives_the_pairs_and_token_ids_of_the_uncompressed_one(
        tmp_path, monkeypatch, tricky_tokenizer, suffix):
    """Each layout (a plain-text prefix, .tsv, .jsonl, .json, .csv, a source-only .txt and .jsonl) compressed, read as
    a run reads its split's file (`DataArguments`, in chunks shorter than a line, so the decompressed text is cut where
    the file's is), gives the pairs of the uncompressed file, and tokenized its token ids and length counts; the files
    its prepared split's key hashes are the compressed ones."""
    monkeypatch.setattr(data_module, "READ_CHUNK_BYTES", 64)
    monkeypatch.setattr(data_module, "RECORDS_PER_CHUNK", 4)
    files = write_tricky_corpus(tmp_path / "corpus")
    files["json"] = tmp_path / "corpus" / "pairs.json"
    files["json"].write_text(json.dumps({"data": [{"en": en, "de": de} for en, de in TRICKY_LINES]}), encoding="utf-8")
    compressed = compressed_copy(files, tmp_path / "compressed", suffix)
    for layout, path in files.items():
        split = "test" if layout in ("txt", "source_jsonl") else "train"
        prepared = []
        for data_file in (path, compressed[layout]):
            arguments = DataArguments(**{f"{split}_file": str(data_file)}, max_source_length=12, max_target_length=10)
            pairs = load_parallel_splits(arguments, (split,), tmp_path / "demo", workdir=tmp_path / "work")[split]
            tokenized, report = (tokenize_training_pairs(pairs, tricky_tokenizer, arguments) if split == "train"
                                 else tokenize_evaluation_pairs(pairs, tricky_tokenizer, arguments, split))
            prepared.append((columns(pairs), {column: list(tokenized[column]) for column in TOKEN_COLUMNS},
                             vars(report)))
        assert prepared[1] == prepared[0], layout
        assert len(prepared[0][1]["input_ids"]) > 0, layout
        hashed = data_module.existing_data_files(compressed[layout], "en", "de")
        assert [item.name for item in hashed] == ([f"plain.en{suffix}", f"plain.de{suffix}"] if layout == "plain"
                                                  else [compressed[layout].name]), layout


def test_a_compressed_corpus_prepares_the_data_of_the_uncompressed_one_and_a_changed_file_prepares_again(
        tmp_path, monkeypatch, capsys):
    """train_file train.jsonl.gz and validation_file the prefix of validation.en.xz + validation.de.xz: the run trains
    the tokenizer and prepares the data (token ids, length counts) of the same corpus uncompressed, budgeting disk for
    the compressed files' estimated text; a rerun reuses both splits; a changed compressed file prepares its split
    again."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "train.jsonl.gz").write_bytes(gzip.compress(corpus["train"].read_bytes()))

    def write_validation(pairs):
        for lang in ("en", "de"):
            (packed / f"validation.{lang}.xz").write_bytes(
                lzma.compress("".join(pair[lang] + "\n" for pair in pairs).encode("utf-8")))
    validation = [json.loads(line)["translation"] for line in corpus["validation"].read_text("utf-8").splitlines()]
    write_validation(validation)
    prepare_only(write_config(tmp_path / "plain.yaml", corpus, tmp_path / "plain", max_steps=1, do_predict=False))
    config = write_config(tmp_path / "packed.yaml", {**corpus, "train": packed / "train.jsonl.gz",
                                                     "validation": packed / "validation"},
                          tmp_path / "out", max_steps=1, do_predict=False)
    real_preparation, budgets = preparation_module.preparation, []
    monkeypatch.setattr(preparation_module, "preparation",
                        lambda folder, text_bytes: budgets.append(text_bytes) or real_preparation(folder, text_bytes))
    prepare_only(config)
    packed_bytes = sum(path.stat().st_size for path in packed.iterdir())
    assert budgets == [preparation_module.TEXT_PER_COMPRESSED_BYTE * packed_bytes]
    assert ((tmp_path / "out" / "tokenizer.json").read_text("utf-8")
            == (tmp_path / "plain" / "tokenizer.json").read_text("utf-8")), "the tokenizer learnt from the same text"
    for split in ("train", "validation"):
        (plain,), (compressed,) = ((tmp_path / run_dir / PREPARED_FOLDER).glob(f"{split}-*") for run_dir in
                                   ("plain", "out"))
        manifests = [json.loads((folder / MANIFEST_FILE).read_text())["report"] for folder in (plain, compressed)]
        assert manifests[0] == manifests[1] and manifests[0]["total"] > 0, split
        datasets = [load_from_disk(str(folder / "data")) for folder in (plain, compressed)]
        assert datasets[0].column_names == datasets[1].column_names, split
        for column in datasets[0].column_names:
            assert list(datasets[0][column]) == list(datasets[1][column]), (split, column)
    capsys.readouterr()
    prepare_only(config)
    log = capsys.readouterr().out
    assert "Reusing the train data" in log and "Reusing the validation data" in log
    write_validation([validation[1], validation[0], *validation[2:]])   # as many lines, other contents
    prepare_only(config)
    log = capsys.readouterr().out
    assert "Reusing the train data" in log and "Prepared the validation data" in log
    (changed,) = (tmp_path / "out" / PREPARED_FOLDER).glob("validation-*")
    assert load_from_disk(str(changed / "data"))["source"][:2] == [validation[1]["en"], validation[0]["en"]]


def test_a_parquet_and_arrow_corpus_trains_as_its_jsonl_files(tmp_path):
    """train_file train.parquet (the WMT schema, as the Hub's files and `Dataset.to_parquet` hold it), validation_file
    validation.arrow (the Arrow IPC stream `save_to_disk` writes) and a source-only test.parquet: the run trains one
    step, evaluates and translates the test file, with the tokenizer, prepared data (token ids, length counts) and
    hypotheses of the same run on the .jsonl files."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    columnar = tmp_path / "columnar"
    columnar.mkdir()
    records = {split: [json.loads(line) for line in corpus[split].read_text("utf-8").splitlines()]
               for split in ("train", "validation", "test")}
    Dataset.from_list(records["train"]).to_parquet(columnar / "train.parquet")
    Dataset.from_list(records["validation"]).save_to_disk(str(tmp_path / "saved"))
    shutil.copy(tmp_path / "saved" / "data-00000-of-00001.arrow", columnar / "validation.arrow")
    Dataset.from_dict({"en": [record["translation"]["en"] for record in records["test"]]}).to_parquet(
        columnar / "test.parquet")
    sources_only = tmp_path / "corpus" / "test.txt"
    sources_only.write_text("".join(record["translation"]["en"] + "\n" for record in records["test"]), "utf-8")
    settings = {"max_steps": 1, "save_strategy": "no"}
    results = {}
    for name, files in (("jsonl", {**corpus, "test": sources_only}),
                        ("columnar", {split: columnar / f"{split}.{'arrow' if split == 'validation' else 'parquet'}"
                                      for split in corpus})):
        results[name] = run([str(write_config(tmp_path / f"{name}.yaml", files, tmp_path / name, **settings))])
    assert results["columnar"]["eval"]["eval_bleu"] == results["jsonl"]["eval"]["eval_bleu"]
    hypotheses = [(tmp_path / name / "test_hypotheses.txt").read_text("utf-8") for name in ("jsonl", "columnar")]
    assert hypotheses[0] == hypotheses[1] and len(hypotheses[0].splitlines()) == 10
    assert ((tmp_path / "columnar" / "tokenizer.json").read_text("utf-8")
            == (tmp_path / "jsonl" / "tokenizer.json").read_text("utf-8")), "the tokenizer learnt from the same text"
    for split in ("train", "validation", "test"):
        (plain,), (read,) = ((tmp_path / run_dir / PREPARED_FOLDER).glob(f"{split}-*") for run_dir in
                             ("jsonl", "columnar"))
        manifests = [json.loads((folder / MANIFEST_FILE).read_text())["report"] for folder in (plain, read)]
        assert manifests[0] == manifests[1], split
        datasets = [load_from_disk(str(folder / "data")) for folder in (plain, read)]
        assert datasets[0].to_dict() == datasets[1].to_dict() and len(datasets[0]) > 0, split


def test_the_disk_check_counts_a_parquet_file_at_the_uncompressed_size_its_footer_states(tmp_path, monkeypatch):
    """A .parquet train_file (zstd pages, a third of its text's size) is budgeted at its data's size uncompressed,
    as its footer states it, near the Arrow table it is read into; not at its file size, nor by a fixed ratio that
    depends on the codec. The .jsonl validation file counts its size, as before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    records = [json.loads(line)["translation"] for line in corpus["train"].read_text("utf-8").splitlines()]
    train = tmp_path / "train.parquet"
    pq.write_table(pa.table({"translation": records}), train, compression="zstd")
    metadata = pq.read_metadata(train)
    uncompressed = sum(metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups))
    table_bytes = read_local_pairs(train, "en", "de").data.nbytes
    assert uncompressed > 2 * train.stat().st_size and abs(uncompressed - table_bytes) < 0.2 * table_bytes
    config = write_config(tmp_path / "c.yaml", {**corpus, "train": train}, tmp_path / "out", max_steps=1,
                          do_predict=False)
    real_preparation, budgets = preparation_module.preparation, []
    monkeypatch.setattr(preparation_module, "preparation",
                        lambda folder, text_bytes: budgets.append(text_bytes) or real_preparation(folder, text_bytes))
    prepare_only(config)
    assert budgets == [uncompressed + corpus["validation"].stat().st_size]


class SlowPathTokenizer:
    """A tokenizer that is not exactly `PreTrainedTokenizerFast`: tokenization goes through `tokenizer(...)`."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)


# ---- Prepared once, reused, rebuilt on change, never loaded half-written -------------------------------------------
def prepare_only(config, *overrides):
    assert run([str(config), "--prepare_only", "true", *overrides]) == {}


def prepared_folders(output_dir):
    return sorted(path.name.split("-")[0] for path in (output_dir / PREPARED_FOLDER).iterdir())


@pytest.fixture
def prepared_run(tmp_path):
    """A corpus, a config and its output_dir after one `--prepare_only true` run."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, do_predict=False)
    prepare_only(config)
    return corpus, config, output_dir


def test_a_first_run_says_what_it_prepared_and_a_rerun_what_it_reuses_each_once(tmp_path, capsys):
    """The log of a first preparation names each split prepared (not reused), the unused dataset_name once, and a
    tokenizer smaller than asked for; a rerun names each split reused (not prepared) and reuses the tokenizer."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, do_predict=False)
    options = ("--dataset_name", "bentrevett/multi30k", "--tokenizer_vocab_size", "4000")
    for first in (True, False):
        capsys.readouterr()
        prepare_only(config, *options)
        log = capsys.readouterr().out
        assert log.count("Local files given: dataset_name 'bentrevett/multi30k' is not used.") == 1
        for split in ("train", "validation"):
            assert (log.count(f"Prepared the {split} data"), log.count(f"Reusing the {split} data")) == (
                (1, 0) if first else (0, 1)), log
        smaller = re.search(r"The tokenizer has (\d+) tokens of the 4000 asked for \(tokenizer_vocab_size\)", log)
        if first:
            assert smaller and int(smaller.group(1)) == len(AutoTokenizer.from_pretrained(output_dir)) < 4000
        else:
            assert smaller is None and "Reusing the tokenizer saved in" in log


def test_a_run_warns_of_references_no_translation_can_write_when_prepared_and_when_reused(tmp_path, capsys):
    """A validation reference holding U+095B (DEVANAGARI LETTER ZA, which NFC, the tokenizer's normaliser, turns into
    two code points) is named in a warning by the run that prepares the split and by the rerun that reuses it."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    with open(corpus["validation"], "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"translation": {"en": "Life.", "de": "\u095bिंदगी"}}, ensure_ascii=False) + "\n")
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_predict=False)
    for _ in range(2):
        capsys.readouterr()
        prepare_only(config)
        log = capsys.readouterr().out
        assert log.count("validation: 1 of the 13 references hold text the tokenizer gives back otherwise") == 1, log
        assert "first in reference 13" in log and "U+095B DEVANAGARI LETTER ZA" in log


def test_a_rerun_and_the_training_launch_load_the_prepared_data(prepared_run, monkeypatch, capsys):
    corpus, config, output_dir = prepared_run
    assert prepared_folders(output_dir) == ["train", "validation"]
    with monkeypatch.context() as patch:
        patch.setattr(preparation_module, "load_parallel_splits", lambda *a, **k: pytest.fail("read the texts again"))
        patch.setattr(preparation_module, "tokenize_training_pairs", lambda *a, **k: pytest.fail("tokenized again"))
        patch.setattr(preparation_module, "tokenize_evaluation_pairs", lambda *a, **k: pytest.fail("tokenized again"))
        patch.setattr(tokenizer_module, "train_joint_tokenizer", lambda *a, **k: pytest.fail("trained a tokenizer again"))
        capsys.readouterr()
        prepare_only(config)
        assert re.search(r"Reusing the train data prepared in \S+ on .* \(\d+ pairs\): memory-mapped in",
                         capsys.readouterr().out)
        built = {}
        original = trainer_module.TranslationTrainer.__init__

        def remember(self, *args, **kwargs):
            original(self, *args, **kwargs)
            built["train"], built["eval"] = self.train_dataset, self.eval_dataset
        patch.setattr(trainer_module.TranslationTrainer, "__init__", remember)
        assert "train" in run([str(config)])
    prepared = output_dir / PREPARED_FOLDER
    for dataset in (built["train"], built["eval"]):
        assert dataset.cache_files and all(Path(item["filename"]).is_relative_to(prepared)
                                           for item in dataset.cache_files), "memory-mapped from the prepared folder"


def test_a_changed_file_or_setting_prepares_again(prepared_run, capsys):
    corpus, config, output_dir = prepared_run
    folders = {path.name for path in (output_dir / PREPARED_FOLDER).iterdir()}
    capsys.readouterr()
    prepare_only(config, "--max_target_length", "40")  # a length setting: train and validation again
    log = capsys.readouterr().out
    assert "Prepared the train data" in log and "Prepared the validation data" in log
    changed = {path.name for path in (output_dir / PREPARED_FOLDER).iterdir()}
    assert len(changed) == 2 and not changed & folders, "the stale folders are replaced"

    lines = corpus["validation"].read_text(encoding="utf-8").splitlines()
    corpus["validation"].write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n", encoding="utf-8")
    prepare_only(config, "--max_target_length", "40")  # same size, other contents: validation only again
    log = capsys.readouterr().out
    assert "Reusing the train data" in log and "Prepared the validation data" in log

    lines = corpus["train"].read_text(encoding="utf-8").splitlines()
    corpus["train"].write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"holds a tokenizer trained with other settings than this run's \(training text differs \(the files of train_file .* changed since\)"):
        prepare_only(config, "--max_target_length", "40")  # as before the prepared-data path: the saved tokenizer no longer fits
    capsys.readouterr()
    prepare_only(config, "--max_target_length", "40", "--tokenizer_name", str(output_dir))
    log = capsys.readouterr().out
    assert "Prepared the train data" in log and "Reusing the validation data" in log
    (train,) = (output_dir / PREPARED_FOLDER).glob("train-*")
    assert json.loads((train / MANIFEST_FILE).read_text())["report"]["total"] == len(lines) - 1


def test_a_changed_file_in_a_local_dataset_folder_prepares_its_splits_again(tmp_path, capsys):
    """A folder in a Hub dataset's layout, read with its configuration: a rerun after one of its files changed
    prepares its splits again from the changed texts (the files its configuration reads for a split are in that split's
    key; the tokenizer of output_dir is kept: it is not what is tested here)."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    splits = {split: [tuple(json.loads(line)["translation"][lang] for lang in ("en", "de"))
                      for line in corpus[split].read_text(encoding="utf-8").splitlines()]
              for split in ("train", "validation")}
    write_hub_layout(tmp_path / "hub", splits)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", train_file=None, validation_file=None,
                          test_file=None, dataset_name=str(tmp_path / "hub"), dataset_config_name="de-en",
                          cache_dir=str(tmp_path / "cache"), max_steps=1, do_predict=False)
    prepare_only(config)
    write_hub_layout(tmp_path / "hub", {**splits, "validation": splits["validation"][::-1]})
    capsys.readouterr()
    prepare_only(config, "--tokenizer_name", str(tmp_path / "out"))
    assert "Prepared the validation data" in capsys.readouterr().out
    (validation,) = (tmp_path / "out" / PREPARED_FOLDER).glob("validation-*")
    prepared = load_from_disk(str(validation / "data"))
    assert list(zip(prepared["source"], prepared["target"], strict=True)) == splits["validation"][::-1]


def test_a_local_copy_of_a_hub_dataset_keys_each_split_by_the_files_its_configuration_reads(tmp_path, monkeypatch):
    """A copy of a whole Hub dataset (`hf download wmt/wmt14`) holds every configuration: a split's key (and so what
    each process of a launch hashes) is the files its own configuration and split read, so a file of another
    configuration, or of another split, neither is hashed for it nor prepares it again; the folder's data files are
    resolved once per run, for all its splits."""
    resolutions = []

    def counted_builder(*args, **kwargs):
        resolutions.append(args)
        return load_dataset_builder(*args, **kwargs)

    monkeypatch.setattr(data_module, "load_dataset_builder", counted_builder)
    hub = tmp_path / "hub"
    write_hub_layout(hub, {"train": [("A dog.", "Ein Hund.")] * 3, "validation": [("A cat.", "Eine Katze.")] * 2})
    readme = (hub / "README.md").read_text(encoding="utf-8").removesuffix("---\n")
    (hub / "README.md").write_text(f"{readme}- config_name: fr-en\n  data_files:\n  - split: train\n    path: "
                                   "fr-en/train.jsonl\n---\n", encoding="utf-8")
    (hub / "fr-en").mkdir()
    (hub / "fr-en" / "train.jsonl").write_text('{"translation": {"en": "A dog.", "fr": "Un chien."}}\n')
    arguments = DataArguments(dataset_name=str(hub), dataset_config_name="de-en")

    def identities() -> dict[str, str]:
        with contextlib.ExitStack() as stack:
            raw = preparation_module.RawSplits(arguments, ("train", "validation"), str(tmp_path / "out"),
                                               prepared_store(tmp_path / "out", None), str(tmp_path / "cache"), stack)
            assert [path.relative_to(hub).as_posix() for path in raw.data_files("train")] == ["README.md",
                                                                                             "de-en/train.jsonl"]
            resolutions.clear()
            identities = raw.identities()
            assert raw.identities() == identities and raw.data_files("validation") and resolutions == []
            return identities

    first = identities()
    (hub / "fr-en" / "train.jsonl").write_text('{"translation": {"en": "A cat.", "fr": "Un chat."}}\n')
    assert identities() == first
    (hub / "de-en" / "validation.jsonl").write_text('{"translation": {"en": "A cat.", "de": "Eine Katze."}}\n')
    changed = identities()
    assert changed["train"] == first["train"] and changed["validation"] != first["validation"]


@pytest.mark.parametrize(("overrides", "prepared", "reused"), [
    (["--max_source_length", "40"], ["train", "validation"], []),
    (["--max_train_samples", "100"], ["train"], ["validation"]),
    (["--max_eval_samples", "6"], ["validation"], ["train"]),
    (["--source_lang", "de", "--target_lang", "en"], ["train", "validation"], []),
])
def test_a_changed_length_limit_sample_cap_or_language_direction_prepares_those_splits_again(prepared_run, capsys,
                                                                                            overrides, prepared,
                                                                                            reused):
    """Each setting that cuts or selects a split's texts is in its key: a split prepared under another one is never
    reused (the tokenizer of output_dir is kept: it is not what is tested here)."""
    _, config, output_dir = prepared_run
    capsys.readouterr()
    prepare_only(config, *overrides, "--tokenizer_name", str(output_dir))
    log = capsys.readouterr().out
    for split in prepared:
        assert f"Prepared the {split} data" in log, (overrides, split)
    for split in reused:
        assert f"Reusing the {split} data" in log, (overrides, split)


def test_a_tokenizer_learnt_from_a_sample_of_another_size_is_not_reused(tmp_path):
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_predict=False)
    prepare_only(config, "--tokenizer_training_pairs", "30")
    with pytest.raises(ConfigError, match=r"training text differs \(saved: .*a sample of 30 pairs; now: .*a sample of "
                                          r"40 pairs\)"):
        prepare_only(config, "--tokenizer_training_pairs", "40")


def test_a_token_budget_smaller_than_a_reused_training_pair_is_one_error(prepared_run, capsys):
    """The budget is checked on reused training pairs as on newly prepared ones, before the run goes on."""
    _, config, output_dir = prepared_run
    for prepare_only_flags in (["--prepare_only", "true"], []):
        with pytest.raises(ConfigError, match=r"max_tokens_per_batch=16 is smaller than \d+ training pair"):
            run([str(config), *prepare_only_flags, "--max_tokens_per_batch", "16"])
        assert "Reusing the train data" in capsys.readouterr().out
    assert not (output_dir / "model.safetensors").exists()


def test_joined_pairs_are_prepared_per_ratio_and_seed(prepared_run, monkeypatch, capsys):
    corpus, config, output_dir = prepared_run
    budgets, budgeted = [], preparation_module.preparation

    def remember_budget(folder, text_bytes):
        budgets.append(text_bytes)
        return budgeted(folder, text_bytes)
    monkeypatch.setattr(preparation_module, "preparation", remember_budget)
    capsys.readouterr()
    prepare_only(config, "--concatenated_pairs", "0.5")
    assert budgets == [2 * corpus["train"].stat().st_size], "the disk budget counts the joined pairs' text"
    log = capsys.readouterr().out
    assert "Added 60 joined training pairs (concatenated_pairs 0.5) to the 120 pairs" in log
    assert "Prepared the train data" in log and "Reusing the validation data" in log
    (train,) = (output_dir / PREPARED_FOLDER).glob("train-*")
    assert json.loads((train / MANIFEST_FILE).read_text())["report"]["total"] == 180
    prepare_only(config, "--concatenated_pairs", "0.5")
    assert "Reusing the train data" in capsys.readouterr().out
    prepare_only(config, "--concatenated_pairs", "0.5", "--seed", "2")   # other pairs joined
    assert "Prepared the train data" in capsys.readouterr().out
    prepare_only(config, "--concatenated_pairs", "0.5", "--max_pairs_per_join", "4")   # 2 to 4 pairs joined
    log = capsys.readouterr().out
    assert "Added 60 joined training pairs (concatenated_pairs 0.5, 4 pairs per join at most) to the 120 pairs" in log
    assert "Prepared the train data" in log
    size = corpus["train"].stat().st_size
    assert budgets[-1] == size + int(3 * 0.5 * size), "a joined pair holds 3 pairs' text on average"
    prepare_only(config, "--concatenated_pairs", "0.5", "--max_pairs_per_join", "4")
    assert "Reusing the train data" in capsys.readouterr().out


def test_preparing_one_split_reads_and_budgets_for_that_split_only(prepared_run, monkeypatch, capsys):
    """A changed validation file: the train file is neither read nor counted in the disk budget."""
    corpus, config, output_dir = prepared_run
    lines = corpus["validation"].read_text(encoding="utf-8").splitlines()
    corpus["validation"].write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n", encoding="utf-8")
    real_read, real_preparation = data_module.read_local_pairs, preparation_module.preparation
    budgets = []

    def read_but_train(path, *args, **kwargs):
        assert Path(path) != corpus["train"], "read the train file"
        return real_read(path, *args, **kwargs)

    def recording_preparation(output_dir, text_bytes):
        budgets.append(text_bytes)
        return real_preparation(output_dir, text_bytes)
    monkeypatch.setattr(data_module, "read_local_pairs", read_but_train)
    monkeypatch.setattr(preparation_module, "preparation", recording_preparation)
    capsys.readouterr()
    prepare_only(config)
    log = capsys.readouterr().out
    assert "Reusing the train data" in log and "Prepared the validation data" in log
    assert budgets == [corpus["validation"].stat().st_size]


def test_an_interrupted_preparation_leaves_nothing_a_run_loads(tmp_path, monkeypatch, capsys):
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, do_predict=False)
    original_save = Dataset.save_to_disk

    def killed_while_saving(self, path, *args, **kwargs):
        original_save(self, path, *args, **kwargs)
        raise KeyboardInterrupt("killed after the data, before the manifest")

    with monkeypatch.context() as patch:
        patch.setattr(Dataset, "save_to_disk", killed_while_saving)
        with pytest.raises(KeyboardInterrupt):
            prepare_only(config)
    assert not (output_dir / PREPARED_FOLDER).exists() or not list((output_dir / PREPARED_FOLDER).iterdir())

    # A SIGKILL leaves its partial folder: a complete-looking split in it is never loaded, and it is removed.
    prepare_only(config)
    prepared = output_dir / PREPARED_FOLDER
    (train,) = prepared.glob("train-*")
    dead = prepared / f"{PARTIAL_PREFIX}{socket.gethostname()}-{dead_pid()}-0"
    shutil.copytree(train, dead / train.name)
    shutil.rmtree(train)
    capsys.readouterr()
    prepare_only(config)
    log = capsys.readouterr().out
    assert "Prepared the train data" in log and "left by an interrupted preparation" in log
    assert not dead.exists() and len(list(prepared.glob("train-*"))) == 1


def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_full_disk_is_one_clear_error(tmp_path, monkeypatch):
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, do_predict=False)
    real_usage = shutil.disk_usage

    def full_where_prepared(path):
        usage = real_usage(path)
        return usage._replace(free=1000) if Path(path).name == PREPARED_FOLDER else usage
    monkeypatch.setattr(shutil, "disk_usage", full_where_prepared)
    with pytest.raises(PreparationError, match=r"preparing the data needs about .* GiB free in .*prepared_data .* "
                                               r"but only 0\.0 GiB are free; free some space or choose another"):
        prepare_only(config)
    assert not output_dir.exists(), "nothing left behind"


@pytest.mark.parametrize("damage", ["data_deleted", "data_truncated", "manifest_missing"])
def test_a_damaged_prepared_split_is_one_error_naming_its_folder_until_it_is_removed(prepared_run, capsys, damage):
    """A prepared split whose files were deleted since (a scratch purge), truncated, or whose copy stopped before its
    manifest (`cp -r` or rsync of prepared_data_dir interrupted) is one `PreparationError` naming the folder and the
    remedy, on every rerun until the folder is removed; then the split is prepared again."""
    _, config, output_dir = prepared_run
    (train,) = (output_dir / PREPARED_FOLDER).glob("train-*")
    (arrow,) = (train / "data").glob("*.arrow")
    if damage == "data_deleted":
        arrow.unlink()
    elif damage == "data_truncated":
        os.truncate(arrow, 1000)
    else:
        (train / MANIFEST_FILE).unlink()
    for _ in range(2):
        with pytest.raises(PreparationError, match=rf"^the train data prepared in {re.escape(str(train))} is damaged "
                                                   r"\(\w+: .+\); remove that folder, and the run prepares the train "
                                                   r"split again$"):
            prepare_only(config)
    shutil.rmtree(train)
    capsys.readouterr()
    prepare_only(config)
    log = capsys.readouterr().out
    assert "Prepared the train data" in log and "Reusing the validation data" in log
    assert load_prepared(PreparedStore(output_dir / PREPARED_FOLDER, shared=False), "train",
                         train.name.split("-")[1]) is not None


@pytest.mark.parametrize("no_room", [errno.ENOSPC, errno.EDQUOT], ids=["disk_full", "quota_exceeded"])
def test_a_disk_that_fills_up_or_a_quota_that_runs_out_while_preparing_is_one_clear_error(tmp_path, monkeypatch,
                                                                                           no_room):
    """The free-space check passes, then a write finds no room: a full disk (ENOSPC) or, on a cluster, the user's
    quota used up (EDQUOT, while the disk itself has room) is one `PreparationError` naming the folder and the
    remedy, and nothing is left behind."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, do_predict=False)

    def no_room_left(self, path, *args, **kwargs):
        raise OSError(no_room, os.strerror(no_room), path)
    monkeypatch.setattr(Dataset, "save_to_disk", no_room_left)
    with pytest.raises(PreparationError, match=rf"the disk of .*prepared_data filled up \(or the quota there ran out\) "
                                               rf"while preparing the data \(.*{os.strerror(no_room)}.*\); about .* GiB "
                                               "are needed: free some space or choose another output_dir"):
        prepare_only(config)
    assert not output_dir.exists(), "nothing left behind"


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["output_dir", "prepared_data_dir"])
def test_the_second_rank_maps_what_the_first_prepared(tmp_path, shared):
    """Two processes (accelerate launch, gloo on CPU): rank 0 prepares, rank 1 waits and loads its folders, in
    output_dir/prepared_data or in prepared_data_dir."""
    config_path, output_dir = distributed.write_config(tmp_path)
    root = tmp_path / "shared" if shared else output_dir / PREPARED_FOLDER
    worker = tmp_path / "worker.py"
    worker.write_text(PREPARE_WORKER, encoding="utf-8")
    (tmp_path / "records").mkdir()
    completed = distributed.launch(tmp_path, worker, str(config_path), "--use_cpu", "true", "--prepare_only", "true",
                                   *(["--prepared_data_dir", str(root)] if shared else []))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    ranks = [json.loads((tmp_path / "records" / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [r["prepared"] for r in ranks] == [["train", "validation"], []]
    assert ranks[0]["files"] == ranks[1]["files"] and all(f.startswith(str(root)) for f in ranks[1]["files"])
    assert (output_dir / PREPARED_FOLDER).exists() != shared


PREPARE_WORKER = '''
import json, os, sys
from accelerate import PartialState
from hf_relpos.translation import data_preparation, prepared, training

record = {"prepared": [], "files": []}
original_publish, original_prepare = data_preparation.publish_prepared, training.prepare_data

def publish(store, folder, split, *args, **kwargs):
    record["prepared"].append(split)
    return original_publish(store, folder, split, *args, **kwargs)

def prepare(*args, **kwargs):
    result = original_prepare(*args, **kwargs)
    datasets = [result.train_dataset, *(item.dataset for item in result.evaluation_sets.values())]
    record["files"] = [item["filename"] for dataset in datasets for item in dataset.cache_files]
    return result

data_preparation.publish_prepared, training.prepare_data = publish, prepare
training.main(sys.argv[1:])
state = PartialState()
with open(os.path.join(os.environ["RECORD_DIR"], f"rank{state.process_index}.json"), "w") as handle:
    json.dump(record, handle)
'''


def test_json_lines_of_one_schema_are_parsed_by_arrow_not_record_by_record(tmp_path, monkeypatch):
    files = write_tricky_corpus(tmp_path / "corpus")
    expected = columns(legacy.read_local_pairs(files["jsonl"], "en", "de"))
    monkeypatch.setattr(data_module.json, "loads", lambda *args: pytest.fail("parsed record by record"))
    assert columns(read_local_pairs(files["jsonl"], "en", "de")) == expected



def test_a_kill_while_removing_data_prepared_under_other_settings_leaves_nothing_a_run_loads(tmp_path, monkeypatch,
                                                                                            capsys):
    """A split prepared under new settings replaces the one prepared under the old settings; a kill part-way through
    removing the old one (here: after its dataset's state.json) never leaves a folder under the old key, which a run
    with the old settings would load and fail on: that run prepares the split again."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, do_predict=False)
    prepare_only(config)
    real_rmtree = shutil.rmtree

    def killed_while_removing_a_split(path, *args, **kwargs):
        path = Path(path)
        if (path / MANIFEST_FILE).is_file() and (path / "data" / "state.json").is_file():
            (path / "data" / "state.json").unlink()
            raise KeyboardInterrupt(f"killed while removing {path.name}")
        return real_rmtree(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(shutil, "rmtree", killed_while_removing_a_split)
        with pytest.raises(KeyboardInterrupt, match="killed while removing"):
            prepare_only(config, "--max_source_length", "40")
    capsys.readouterr()
    prepare_only(config)
    log = capsys.readouterr().out
    assert "Prepared the train data" in log and "Reusing the train data" not in log


def test_a_preparation_interrupted_after_a_split_resumes_after_it(tmp_path, monkeypatch, capsys):
    """The training split prepared before the kill is reused: the tokenizer, trained again, is the same."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_predict=False)
    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while preparing the validation split")

    with monkeypatch.context() as patch:
        patch.setattr(preparation_module, "tokenize_evaluation_pairs", killed)
        with pytest.raises(KeyboardInterrupt):
            prepare_only(config)
    assert prepared_folders(tmp_path / "out") == ["train"]
    capsys.readouterr()
    prepare_only(config)
    log = capsys.readouterr().out
    assert "Trained the tokenizer" in log and "Reusing the train data" in log and "Prepared the validation data" in log


def test_a_tokenizer_can_learn_from_a_sample_of_the_training_pairs(tmp_path, monkeypatch):
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_predict=False)
    seen = []
    original = tokenizer_module.train_joint_tokenizer

    def counting(batches, *args, **kwargs):
        texts = [text for batch in batches for text in batch]
        seen.append(texts)
        return original(texts, *args, **kwargs)

    monkeypatch.setattr(tokenizer_module, "train_joint_tokenizer", counting)
    prepare_only(config, "--tokenizer_training_pairs", "30")
    sample = legacy.read_local_pairs(corpus["train"], "en", "de").select(
        sorted(np.random.default_rng(tokenizer_module.TOKENIZER_SAMPLE_SEED).choice(120, 30, replace=False)))
    assert seen == [[text for text in list(sample["source"]) + list(sample["target"]) if text]]
    settings = json.loads((tmp_path / "out" / "tokenizer_training.json").read_text())
    assert settings["data"].endswith("en+de, a sample of 30 pairs")
    with pytest.raises(ConfigError, match=r"training text differs \(saved: .*a sample of 30 pairs; now: .*en\+de\)"):
        prepare_only(config)
    with pytest.raises(ValueError, match=r"tokenizer_training_pairs must be null \(every pair\) or an integer >= 1"):
        DataArguments(tokenizer_training_pairs=0)


# ---- A prepared_data_dir shared by runs ----------------------------------------------------------------------------
@pytest.fixture
def shared_run(tmp_path):
    """A corpus, a config, a shared prepared_data_dir and the output_dir of a first `--prepare_only true` run that
    prepared its splits there."""
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    shared = tmp_path / "shared"
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "first", max_steps=1, do_predict=False,
                          prepared_data_dir=str(shared))
    prepare_only(config)
    return config, shared


def split_folders(root: Path) -> list[str]:
    return sorted(path.name for path in root.iterdir())


def test_a_run_in_another_output_dir_loads_the_split_another_run_prepared_in_prepared_data_dir(shared_run, tmp_path,
                                                                                               monkeypatch, capsys):
    """The second run trains its tokenizer again (the same one: the same key), tokenizes nothing, trains on the
    shared folders and says so in its log and run record; with --tokenizer_name it trains no tokenizer either."""
    config, shared = shared_run
    assert not (tmp_path / "first" / PREPARED_FOLDER).exists()
    published = split_folders(shared)
    assert [name.split("-")[0] for name in published] == ["train", "validation"]
    built = {}
    original_prepare = training_module.prepare_data

    def remember(*args, **kwargs):
        built["data"] = original_prepare(*args, **kwargs)
        return built["data"]
    with monkeypatch.context() as patch:
        patch.setattr(training_module, "prepare_data", remember)
        patch.setattr(preparation_module, "tokenize_training_pairs", lambda *a, **k: pytest.fail("tokenized again"))
        patch.setattr(preparation_module, "tokenize_evaluation_pairs", lambda *a, **k: pytest.fail("tokenized again"))
        capsys.readouterr()
        assert "train" in run([str(config), "--output_dir", str(tmp_path / "second")])
        log = capsys.readouterr().out
        assert "Trained the tokenizer" in log
        for name in published:
            assert f"Reusing the {name.split('-')[0]} data prepared in {shared / name} on" in log
        patch.setattr(tokenizer_module, "train_joint_tokenizer", lambda *a, **k: pytest.fail("trained a tokenizer"))
        prepare_only(config, "--output_dir", str(tmp_path / "third"), "--tokenizer_name", str(tmp_path / "first"))
    assert split_folders(shared) == published and not (tmp_path / "second" / PREPARED_FOLDER).exists()
    for dataset in (built["data"].train_dataset, built["data"].evaluation_sets["eval"].dataset):
        assert all(Path(item["filename"]).is_relative_to(shared) for item in dataset.cache_files)
    record = json.loads((tmp_path / "second" / "run_record.json").read_text())
    assert record["prepared_from"] == {name.split("-")[0]: {"folder": str(shared / name), "key": name.split("-")[1],
                                                            "reused": True} for name in published}


def test_a_first_run_records_the_splits_it_prepared_in_prepared_data_dir(tmp_path):
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_predict=False,
                          prepared_data_dir=str(tmp_path / "shared"))
    assert "train" in run([str(config)])
    record = json.loads((tmp_path / "out" / "run_record.json").read_text())
    assert {split: (Path(source["folder"]).parent, source["reused"]) for split, source in
            record["prepared_from"].items()} == {"train": (tmp_path / "shared", False),
                                                 "validation": (tmp_path / "shared", False)}


def test_prepared_data_dir_keeps_the_splits_of_other_settings(shared_run):
    """In output_dir/prepared_data a split prepared under another key is removed (test above); in a shared folder it
    is another run's data: a run with other length settings prepares beside it."""
    config, shared = shared_run
    first = split_folders(shared)
    prepare_only(config, "--max_source_length", "40")
    both = split_folders(shared)
    assert len(both) == 4 and set(first) < set(both)


def test_a_run_that_publishes_a_split_second_loads_the_one_published_first(shared_run, tmp_path, monkeypatch, capsys):
    """Two runs preparing one key at once (simulated: the key is published between this run's preparation and its
    publication): both succeed, the second discards its copy and loads the published one, leaving no partial folder."""
    config, shared = shared_run
    (train,) = shared.glob("train-*")
    other_run = tmp_path / "other_run"
    shutil.move(train, other_run)
    manifest = json.loads((other_run / MANIFEST_FILE).read_text())
    (other_run / MANIFEST_FILE).write_text(json.dumps({**manifest, "prepared_at": "by the other run"}))
    real_publish, built = preparation_module.publish_prepared, {}

    def published_meanwhile(store, folder, split, *args, **kwargs):
        if split == "train":
            shutil.copytree(other_run, train)
        return real_publish(store, folder, split, *args, **kwargs)

    def remember(*args, **kwargs):
        built["data"] = original_prepare(*args, **kwargs)
        return built["data"]
    original_prepare = training_module.prepare_data
    monkeypatch.setattr(preparation_module, "publish_prepared", published_meanwhile)
    monkeypatch.setattr(training_module, "prepare_data", remember)
    capsys.readouterr()
    prepare_only(config, "--output_dir", str(tmp_path / "second"))
    log = capsys.readouterr().out
    assert f"but another run published it in {train} meanwhile: loading that one" in log
    assert json.loads((train / MANIFEST_FILE).read_text())["prepared_at"] == "by the other run"
    assert not list(shared.glob(f"{PARTIAL_PREFIX}*")) and len(split_folders(shared)) == 2
    assert all(Path(item["filename"]).is_relative_to(train) for item in built["data"].train_dataset.cache_files)
    assert built["data"].prepared_from["train"] == {"folder": str(train), "key": train.name.split("-")[1],
                                                    "reused": True}


def test_a_partial_folder_in_prepared_data_dir_is_removed_only_when_its_process_is_gone(shared_run):
    config, shared = shared_run
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        host = f"{PARTIAL_PREFIX}{socket.gethostname()}"
        running, dead = shared / f"{host}-{alive.pid}-0", shared / f"{host}-{dead_pid()}-0"
        for partial in (running, dead):
            (partial / "train-0").mkdir(parents=True)
        prepare_only(config, "--max_source_length", "40")   # a preparation: removes what dead processes left
        assert running.exists() and not dead.exists()
    finally:
        alive.kill()
        alive.wait()


def test_the_disk_space_check_applies_to_prepared_data_dir(tmp_path, monkeypatch):
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    shared = tmp_path / "shared"
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_predict=False,
                          prepared_data_dir=str(shared))
    real_usage = shutil.disk_usage

    def full_where_shared(path):
        usage = real_usage(path)
        return usage._replace(free=1000) if Path(path) == shared else usage
    monkeypatch.setattr(shutil, "disk_usage", full_where_shared)
    with pytest.raises(PreparationError, match=rf"GiB free in {re.escape(str(shared))} .* free some space or choose "
                                               r"another prepared_data_dir"):
        prepare_only(config)
    assert list(shared.iterdir()) == [], "no partial folder left"


@pytest.mark.parametrize("bad", ["file", "read_only", "dangling_link"])
def test_a_prepared_data_dir_that_cannot_hold_the_data_is_one_error_before_any_work(tmp_path, monkeypatch, bad):
    corpus = write_demo_corpus(tmp_path / "corpus", 120, 12, 10, seed=5)
    folder = tmp_path / "shared"
    real_mkdtemp = tempfile.mkdtemp

    def read_only_mkdtemp(*args, dir=None, **kwargs):   # what a read-only folder gives, even to root
        if Path(dir) == folder:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real_mkdtemp(*args, dir=dir, **kwargs)
    if bad == "file":
        folder.write_text("not a folder")
        expected = rf"prepared_data_dir '{re.escape(str(folder))}': .* is a file, not a folder"
    elif bad == "dangling_link":   # a link to a folder not there (an unmounted disk, a moved folder)
        folder.symlink_to(tmp_path / "gone")
        expected = (rf"prepared_data_dir '{re.escape(str(folder))}': '{re.escape(str(folder))}' is a link to "
                    rf"'{re.escape(str(tmp_path / 'gone'))}', which does not exist; create that folder or remove "
                    "the link")
    else:
        folder.mkdir()
        monkeypatch.setattr("tempfile.mkdtemp", read_only_mkdtemp)
        expected = rf"prepared_data_dir '{re.escape(str(folder))}' is not writable: cannot create files in"
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_predict=False,
                          prepared_data_dir=str(folder))
    monkeypatch.setattr(tokenizer_module, "train_joint_tokenizer", lambda *a, **k: pytest.fail("trained a tokenizer"))
    with pytest.raises(OutputDirError, match=expected):
        run([str(config)])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_prepared_data_dir_is_one_error_naming_the_field(blank):
    """An empty prepared_data_dir (`--prepared_data_dir ""`, `prepared_data_dir: ''`) is no folder: it would put the
    prepared splits in the current folder, so it is refused, with null named as the way to the run's own folder."""
    with pytest.raises(ValueError, match=r"^prepared_data_dir must name a folder, or be null \(output_dir/prepared_data, "
                                         rf"the run's own\); got {re.escape(repr(blank))}$"):
        DataArguments(prepared_data_dir=blank)
