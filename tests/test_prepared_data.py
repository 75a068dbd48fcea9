"""The prepared-data path against the code it replaced: the same batches for a fixed seed (the pre-#52 sampler, kept
below verbatim as the oracle), the same pairs from every file layout and the same token ids; and the prepared data
reused by a rerun and by a second process, rebuilt when a file or a setting changes, never loaded half-written."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from hf_relpos.translation.batching import TokenBudgetBatchSampler


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
