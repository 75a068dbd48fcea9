"""Token-budget batching (Vaswani et al. 2017: "each training batch contained ... approximately 25000 source tokens
and 25000 target tokens"), safe under data parallelism.

`TokenBudgetBatchSampler` yields the *global* list of batches of one epoch, the same on every process (same seed, same
epoch). Handed to a `DataLoader` as `batch_sampler` and prepared by accelerate, it is wrapped in
`accelerate.data_loader.BatchSamplerShard`, which deals the batches round-robin: process r gets batches r, r + P,
r + 2P, ... The sampler therefore never shards by itself (no double sharding), and it makes the number of batches a
multiple of the number of processes P by splitting its largest batches (never by repeating examples), so accelerate
has nothing to pad.

Two ways to group lengths. By default the whole corpus is sorted (fairseq): the least padding, every example used
exactly once per epoch, but each batch holds pairs of one length and the same length strata come back every epoch.
With `pool_factor` (OpenNMT-py's option of that name) each pass over the data is shuffled, cut into pools of about
`pool_factor` batches' worth of tokens, and sorted only within a pool, so batches mix lengths and change composition
every pass; the passes then form one stream of batches, cut into epochs of a fixed number of batches (the Trainer
needs a fixed length): every example is used exactly once per pass, and a pass boundary can fall inside an epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ..model.validation import require_int


def padded_lengths(lengths: Sequence[int] | np.ndarray, length_multiple: int = 1) -> np.ndarray:
    """`lengths` rounded up to a multiple of `length_multiple` (ceil(l / m) * m): the length a batch is padded to
    when its kernel pads lengths (`hf_relpos.model.attention_functions.length_multiple`)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return -(-lengths // length_multiple) * length_multiple


def check_examples_fit(source_lengths: Sequence[int], target_lengths: Sequence[int], max_tokens: int,
                       length_multiple: int = 1) -> None:
    """ValueError naming the budget and the first offender when an example alone, padded to a multiple of
    `length_multiple`, exceeds `max_tokens` on either side (no batch could hold it)."""
    source_lengths = np.asarray(source_lengths, dtype=np.int64)
    target_lengths = np.asarray(target_lengths, dtype=np.int64)
    longer_side = padded_lengths(np.maximum(source_lengths, target_lengths), length_multiple)
    too_long = np.flatnonzero(longer_side > max_tokens)
    if too_long.size:
        first = int(too_long[0])
        padding = f" (padded to {longer_side[first]}: the kernel pads lengths to a multiple of {length_multiple})"
        raise ValueError(
            f"max_tokens_per_batch={max_tokens} is smaller than {too_long.size} training pair(s), e.g. example "
            f"{first} with {source_lengths[first]} source and {target_lengths[first]} target tokens"
            f"{padding if length_multiple > 1 else ''}; "
            "raise max_tokens_per_batch or lower max_source_length/max_target_length"
        )


class TokenBudgetBatchSampler:
    """Batches of example indices whose padded size fits `max_tokens` on both sides.

    A batch of n examples costs n * (longest source) source tokens and n * (longest target) target tokens once padded,
    each longest length rounded up to a multiple of `length_multiple` (the kernel's padding); both stay <=
    `max_tokens`. Examples are sorted by (source length, target length), ties broken by a seeded shuffle,
    cut greedily into batches, and the batch order is shuffled each epoch (`set_epoch`). The cut points depend only on
    the sorted lengths, so every epoch has the same number of batches, which the Trainer needs for its step counts.

    With `pool_factor`, the sort (by the longer side first) runs within random pools of examples whose longer sides
    sum to about `pool_factor * max_tokens` tokens, drawn afresh each pass; epoch e is batches [e * N, (e + 1) * N)
    of the stream of passes, N the batch count of the first pass rounded down to a multiple of `num_processes`.
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        num_processes: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        pool_factor: int | None = None,
        length_multiple: int = 1,
    ) -> None:
        if len(source_lengths) != len(target_lengths):
            raise ValueError(
                f"source_lengths ({len(source_lengths)}) and target_lengths ({len(target_lengths)}) differ in length"
            )
        require_int("max_tokens_per_batch", max_tokens, minimum=1)
        require_int("num_processes", num_processes, minimum=1)
        require_int("length_pool_factor", pool_factor, minimum=1, null_means="one global length sort")
        require_int("length_multiple", length_multiple, minimum=1)
        if pool_factor is not None and not shuffle:
            raise ValueError("length_pool_factor draws random pools: it needs shuffle=True")
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        self.longer_side = np.maximum(self.source_lengths, self.target_lengths)
        self.budget_lengths = padded_lengths(self.longer_side, length_multiple)   # what the budget counts
        check_examples_fit(self.source_lengths, self.target_lengths, max_tokens, length_multiple)
        self.max_tokens = max_tokens
        self.num_processes = num_processes
        self.shuffle = shuffle
        self.seed = seed
        self.pool_factor = pool_factor
        self.length_multiple = length_multiple
        self.epoch = 0
        self._pass_sizes: list[int] = []   # batches in each pass generated so far (pooled stream)
        self._last_pass: tuple[int, list[list[int]]] | None = None   # (index, batches) of the pass built last
        if pool_factor is None:
            self._num_batches = len(self._batches_for_epoch(0))
        else:
            self._num_batches = len(self._pass(0)) // num_processes * num_processes

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle `__iter__` yields (called by the Trainer / accelerate each epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self._num_batches

    def __iter__(self) -> Iterator[list[int]]:
        if self.pool_factor is None:
            yield from self._batches_for_epoch(self.epoch)
        else:
            yield from self._stream_slice(self.epoch * self._num_batches, (self.epoch + 1) * self._num_batches)

    def _stream_slice(self, start: int, stop: int) -> list[list[int]]:
        """Batches [start, stop) of the concatenated passes."""
        batches: list[list[int]] = []
        pass_start = 0
        pass_index = 0
        while pass_start < stop:
            size = self._pass_size(pass_index)
            if pass_start + size > start:
                batches.extend(self._pass(pass_index)[max(start - pass_start, 0) : stop - pass_start])
            pass_start += size
            pass_index += 1
        return batches

    def _pass_size(self, pass_index: int) -> int:
        while len(self._pass_sizes) <= pass_index:
            self._pass(len(self._pass_sizes))
        return self._pass_sizes[pass_index]

    def _pass(self, pass_index: int) -> list[list[int]]:
        """One pass over the data in pooled batches: shuffle, cut into pools of ~pool_factor * max_tokens tokens (of
        the longer side), sort each pool by (longer side, source, target) length (the longer side is what the budget
        counts), cut each greedily, shuffle the pass's batches."""
        if self._last_pass is None or self._last_pass[0] != pass_index:
            generator = np.random.default_rng([self.seed, pass_index])
            order = generator.permutation(len(self.source_lengths))
            longer_side = self.longer_side[order]
            budget_lengths = self.budget_lengths[order]
            pool = (np.cumsum(budget_lengths) - budget_lengths) // (self.pool_factor * self.max_tokens)
            by_length = np.lexsort((self.target_lengths[order], self.source_lengths[order], longer_side, pool))
            pools = np.split(order[by_length], np.flatnonzero(np.diff(pool[by_length])) + 1)
            batches = [batch for members in pools for batch in self._cut_batches(members)]
            if len(batches) < self.num_processes:
                batches = _split_to_multiple(batches, self.num_processes, self.max_tokens)
            if pass_index == len(self._pass_sizes):
                self._pass_sizes.append(len(batches))
            self._last_pass = (pass_index, [batches[i] for i in generator.permutation(len(batches))])
        return self._last_pass[1]

    def _batches_for_epoch(self, epoch: int) -> list[list[int]]:
        generator = np.random.default_rng([self.seed, epoch])
        if self.shuffle:
            tie_break = generator.permutation(len(self.source_lengths))
        else:
            tie_break = np.arange(len(self.source_lengths))
        by_length = tie_break[np.lexsort((self.target_lengths[tie_break], self.source_lengths[tie_break]))]
        batches = _split_to_multiple(self._cut_batches(by_length), self.num_processes, self.max_tokens)
        if self.shuffle:
            return [batches[i] for i in generator.permutation(len(batches))]
        return batches

    def _cut_batches(self, order: np.ndarray) -> list[list[int]]:
        """`order` cut greedily; reads the lengths of `order`'s examples only, so cutting every pool of a pass costs
        O(N) in all."""
        return cut_token_batches(order.tolist(), self.longer_side[order].tolist(), self.max_tokens,
                                 self.length_multiple)


def cut_token_batches(order: Sequence[int], lengths: Sequence[int], max_tokens: int,
                      length_multiple: int = 1) -> list[list[int]]:
    """`order` cut into consecutive batches whose padded size (count x longest length in the batch, rounded up to a
    multiple of `length_multiple`) stays within `max_tokens`, `lengths[i]` being the length of item `order[i]`; an
    item longer than `max_tokens` forms a batch of its own."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest_in_batch = 0
    for index, length in zip(order, padded_lengths(lengths, length_multiple).tolist(), strict=True):
        longest = max(longest_in_batch, length)
        if current and (len(current) + 1) * longest > max_tokens:
            batches.append(current)
            current, longest = [], length
        current.append(index)
        longest_in_batch = longest
    if current:
        batches.append(current)
    return batches


def _split_to_multiple(batches: list[list[int]], multiple: int, max_tokens: int) -> list[list[int]]:
    """Halve the largest batches until the batch count is a multiple of `multiple` (halves still fit the budget); a
    ValueError naming max_tokens_per_batch, the process count and the pair count where too few pairs are left to
    split."""
    batches, cut = list(batches), len(batches)
    while len(batches) % multiple:
        largest = max(range(len(batches)), key=lambda position: len(batches[position]))
        batch = batches[largest]
        if len(batch) < 2:
            pairs = sum(map(len, batches))
            change = ("raise max_tokens_per_batch (fewer, fuller batches), use more training pairs, or launch fewer "
                      "processes" if pairs >= multiple else
                      f"use at least {multiple} training pairs, or launch at most {pairs} processes")
            raise ValueError(
                f"max_tokens_per_batch={max_tokens} cuts the {pairs} training pairs into {cut} batches, and {multiple} "
                f"processes need a multiple of {multiple} non-empty batches (each process takes one per step), which "
                f"splitting batches cannot reach with {pairs} pairs: {change}"
            )
        middle = len(batch) // 2
        batches[largest : largest + 1] = [batch[:middle], batch[middle:]]
    return batches

