"""The prepared-data path against the code it replaced: the same batches for a fixed seed (the pre-#52 sampler, kept
below verbatim as the oracle), the same pairs from every file layout and the same token ids; and the prepared data
reused by a rerun and by a second process, rebuilt when a file or a setting changes, never loaded half-written."""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterator, Sequence

import legacy_data_pipeline as legacy
import numpy as np
import pytest

import hf_relpos.translation.data as data_module
from hf_relpos.translation.batching import TokenBudgetBatchSampler
from hf_relpos.translation.data import (
    DataArguments,
    DatasetSchemaError,
    has_references,
    read_local_pairs,
    tokenize_evaluation_pairs,
    tokenize_training_pairs,
)
from hf_relpos.translation.demo_corpus import random_sentence_pair
from hf_relpos.translation.tokenization import train_joint_tokenizer


# ---- Oracle: the sampler before #52 (its `_cut_batches` read the whole length list per pool: quadratic) ----------
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


# ---- Reading and tokenization against the pre-#52 code (tests/legacy_data_pipeline.py) ---------------------------
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
    return {"plain": folder / "plain", "tsv": folder / "pairs.tsv", "jsonl": folder / "pairs.jsonl",
            "csv": folder / "pairs.csv", "txt": folder / "sources.txt"}


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
        source_only = layout == "txt"
        new = read_local_pairs(path, "en", "de", allow_source_only=source_only,
                               workdir=tmp_path / "work" if on_disk else None)
        old = legacy.read_local_pairs(path, "en", "de", allow_source_only=source_only)
        assert columns(new) == columns(old), layout
        assert len(new) == (len(TRICKY_LINES) if layout != "tsv" else len(TRICKY_LINES) - 8)


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
    cases = [("utf", False), ("count", False), ("tabs.tsv", False), ("languages.tsv", False), ("typed.jsonl", False),
             ("mixed.jsonl", True)]
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
    files = write_tricky_corpus(tmp_path / "corpus")
    arguments = DataArguments(max_source_length=12, max_target_length=10)
    for layout in ("plain", "txt"):
        dataset = read_local_pairs(files[layout], "en", "de", allow_source_only=True)
        new, new_report = tokenize_evaluation_pairs(dataset, tricky_tokenizer, arguments, "test")
        legacy_dataset = legacy.read_local_pairs(files[layout], "en", "de", allow_source_only=True)
        old, old_report = legacy.tokenize_evaluation_pairs(legacy_dataset, tricky_tokenizer, arguments, "test")
        assert vars(new_report) == vars(old_report)
        for column in ("source", "target", *TOKEN_COLUMNS):
            assert list(new[column]) == list(old[column]), (layout, column)
        assert has_references(new) == (layout == "plain")


class SlowPathTokenizer:
    """A tokenizer that is not exactly `PreTrainedTokenizerFast`: tokenization goes through `tokenizer(...)`."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)
