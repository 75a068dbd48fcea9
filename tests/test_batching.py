"""Token-budget batching: budget, coverage, per-epoch shuffling, and disjoint shards through accelerate."""

import random
import re

import numpy as np
import pytest
import torch
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader
from torch.utils.data import DataLoader, Dataset

from hf_relpos.translation.batching import TokenBudgetBatchSampler, check_examples_fit, cut_token_batches


def random_lengths(count: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return [rng.randint(1, 60) for _ in range(count)], [rng.randint(1, 80) for _ in range(count)]


def padded_cost(batch: list[int], lengths: list[int]) -> int:
    return len(batch) * max(lengths[index] for index in batch)


@pytest.mark.parametrize("num_processes", [1, 2, 3])
def test_every_batch_fits_and_every_example_is_used_once(num_processes):
    sources, targets = random_lengths(997)
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=300, num_processes=num_processes, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert len(batches) % num_processes == 0
        assert sorted(index for batch in batches for index in batch) == list(range(997))
        assert all(batch for batch in batches)
        assert all(padded_cost(batch, sources) <= 300 and padded_cost(batch, targets) <= 300 for batch in batches)


def test_batches_group_similar_lengths():
    sources, targets = random_lengths(2000)
    batches = list(TokenBudgetBatchSampler(sources, targets, max_tokens=400, seed=0))
    spreads = [max(sources[i] for i in batch) - min(sources[i] for i in batch) for batch in batches]
    assert sum(spreads) / len(spreads) < 3  # random batches of this size would spread over ~50 lengths


def test_shuffle_is_seeded_per_epoch():
    sources, targets = random_lengths(500)
    first = TokenBudgetBatchSampler(sources, targets, max_tokens=200, seed=7)
    second = TokenBudgetBatchSampler(sources, targets, max_tokens=200, seed=7)
    epoch_zero = list(first)
    assert epoch_zero == list(second)
    first.set_epoch(1)
    assert list(first) != epoch_zero
    assert list(TokenBudgetBatchSampler(sources, targets, max_tokens=200, seed=8)) != epoch_zero


def test_without_shuffle_batches_come_in_length_order():
    sources, targets = random_lengths(300)
    batches = list(TokenBudgetBatchSampler(sources, targets, max_tokens=200, shuffle=False))
    longest = [max(sources[i] for i in batch) for batch in batches]
    assert longest == sorted(longest)


def test_two_ranks_get_disjoint_batches_covering_the_epoch():
    """The global batch list, dealt by accelerate's BatchSamplerShard as under DDP, is split without repeats."""
    sources, targets = random_lengths(301)
    shards = []
    for rank in range(2):
        sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=250, num_processes=2, seed=5)
        sampler.set_epoch(2)
        shards.append(list(BatchSamplerShard(sampler, num_processes=2, process_index=rank, even_batches=True)))
    assert len(shards[0]) == len(shards[1])
    rank_examples = [{index for batch in shard for index in batch} for shard in shards]
    assert rank_examples[0].isdisjoint(rank_examples[1])
    assert rank_examples[0] | rank_examples[1] == set(range(301))
    assert sum(len(batch) for shard in shards for batch in shard) == 301


class IndexDataset(Dataset):
    def __len__(self) -> int:
        return 301

    def __getitem__(self, index: int) -> int:
        return index


def test_prepared_dataloader_shards_once():
    """`prepare_data_loader` (what Trainer/accelerate do) wraps the sampler once; no rank sees an example twice."""
    sources, targets = random_lengths(301)
    seen = []
    for rank in range(2):
        sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=250, num_processes=2, seed=5)
        loader = prepare_data_loader(
            DataLoader(IndexDataset(), batch_sampler=sampler), num_processes=2, process_index=rank,
            put_on_device=False,
        )
        seen.append([int(index) for batch in loader for index in batch])
    assert len(seen[0]) + len(seen[1]) == 301
    assert sorted(seen[0] + seen[1]) == list(range(301))
    assert isinstance(next(iter(DataLoader(IndexDataset(), batch_sampler=sampler))), torch.Tensor)


def test_batch_count_is_padded_by_splitting_not_by_repeating():
    sampler = TokenBudgetBatchSampler([10] * 5, [10] * 5, max_tokens=50, num_processes=4)
    batches = list(sampler)
    assert len(batches) == 4
    assert sorted(index for batch in batches for index in batch) == list(range(5))


def test_example_over_budget_is_one_clear_error():
    with pytest.raises(ValueError, match=r"max_tokens_per_batch=20 .* example 1 with 30 source"):
        TokenBudgetBatchSampler([5, 30, 7], [5, 6, 7], max_tokens=20)


def test_too_few_examples_for_the_processes_is_an_error():
    with pytest.raises(ValueError) as error:
        TokenBudgetBatchSampler([5, 6], [5, 6], max_tokens=100, num_processes=3)
    assert str(error.value) == (
        "max_tokens_per_batch=100 cuts the 2 training pairs into 1 batches, and 3 processes need a multiple of 3 "
        "non-empty batches (each process takes one per step), which splitting batches cannot reach with 2 pairs: use "
        "at least 3 training pairs, or launch at most 2 processes")


def test_pairs_each_alone_in_a_batch_that_the_processes_cannot_share_name_the_settings_to_change():
    """3 pairs near the budget, one batch each, make 3 batches, and 2 processes need 4 (a pair is not split)."""
    with pytest.raises(ValueError) as error:
        TokenBudgetBatchSampler([400, 500, 450], [400, 480, 500], max_tokens=512, num_processes=2)
    assert str(error.value) == (
        "max_tokens_per_batch=512 cuts the 3 training pairs into 3 batches, and 2 processes need a multiple of 2 "
        "non-empty batches (each process takes one per step), which splitting batches cannot reach with 3 pairs: "
        "raise max_tokens_per_batch (fewer, fuller batches), use more training pairs, or launch fewer processes")


# --- pooled batches (length_pool_factor) ---------------------------------------------------------------------------


def stream(sampler: TokenBudgetBatchSampler, epochs: int) -> list[list[int]]:
    batches = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        batches.extend(sampler)
    return batches


@pytest.mark.parametrize("num_processes", [1, 2, 3])
def test_pooled_epochs_have_a_fixed_length_and_use_each_example_once_per_pass(num_processes):
    """Epochs are slices of a stream of passes: each has len(sampler) batches (a multiple of the processes), every
    batch fits the budget, and after any number of epochs every example has been used m or m + 1 times."""
    sources, targets = random_lengths(997)
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=300, num_processes=num_processes, seed=3,
                                      pool_factor=2)
    assert len(sampler) % num_processes == 0
    for epochs in (1, 2, 5):
        batches = stream(sampler, epochs)
        assert len(batches) == epochs * len(sampler)
        assert all(padded_cost(batch, sources) <= 300 and padded_cost(batch, targets) <= 300 for batch in batches)
        counts = np.bincount([index for batch in batches for index in batch], minlength=997)
        assert counts.max() - counts.min() <= 1 and counts.min() >= epochs - 1


def test_first_pooled_pass_is_one_use_of_every_example():
    sources, targets = random_lengths(500)
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=250, seed=1, pool_factor=3)
    batches = stream(sampler, 4)
    used = np.cumsum([len(batch) for batch in batches])
    first_pass = int(np.searchsorted(used, 500)) + 1
    assert used[first_pass - 1] == 500, "the first pass ends on a batch boundary"
    assert sorted(index for batch in batches[:first_pass] for index in batch) == list(range(500))


def test_pools_mix_lengths_and_change_batches_every_pass():
    """Sorting within pools of ~pool_factor batches: batches spread over more lengths (of the longer side, the one the
    budget counts) the smaller the pool, and, unlike the corpus-wide sort, batches are new every pass."""
    sources, targets = random_lengths(3000)
    longer = [max(pair) for pair in zip(sources, targets, strict=True)]

    def mean_spread(sampler: TokenBudgetBatchSampler) -> float:
        batches = list(sampler)
        return sum(max(longer[i] for i in b) - min(longer[i] for i in b) for b in batches) / len(batches)

    spreads = [mean_spread(TokenBudgetBatchSampler(sources, targets, max_tokens=400, seed=0, pool_factor=factor))
               for factor in (1, 4, 32)]
    assert spreads[0] > spreads[1] > spreads[2] > 0.5
    pooled = TokenBudgetBatchSampler(sources, targets, max_tokens=400, seed=0, pool_factor=2)
    epochs = stream(pooled, 2)
    first, second = set(map(frozenset, epochs[: len(pooled)])), set(map(frozenset, epochs[len(pooled) :]))
    assert len(first & second) < 0.05 * len(first)


def test_pooled_epochs_do_not_depend_on_the_epochs_iterated_before():
    """A resumed run asks for epoch e directly: it must get what an uninterrupted run got."""
    sources, targets = random_lengths(400)
    uninterrupted = TokenBudgetBatchSampler(sources, targets, max_tokens=200, seed=4, pool_factor=2)
    expected = stream(uninterrupted, 4)[3 * len(uninterrupted):]
    resumed = TokenBudgetBatchSampler(sources, targets, max_tokens=200, seed=4, pool_factor=2)
    resumed.set_epoch(3)
    assert list(resumed) == expected
    assert list(TokenBudgetBatchSampler(sources, targets, max_tokens=200, seed=5, pool_factor=2)) != stream(
        uninterrupted, 1)


def test_two_ranks_get_disjoint_pooled_batches():
    sources, targets = random_lengths(301)
    shards = []
    for rank in range(2):
        sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=250, num_processes=2, seed=5, pool_factor=2)
        sampler.set_epoch(1)
        shards.append(list(BatchSamplerShard(sampler, num_processes=2, process_index=rank, even_batches=True)))
    assert len(shards[0]) == len(shards[1]) == len(sampler) // 2
    rank_examples = [[index for batch in shard for index in batch] for shard in shards]
    assert len(set(rank_examples[0] + rank_examples[1])) == len(rank_examples[0]) + len(rank_examples[1])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pool_factor": 0}, "length_pool_factor must be null (one global length sort) or an integer >= 1, got 0"),
    ({"pool_factor": 2, "shuffle": False}, "length_pool_factor draws random pools: it needs shuffle=True"),
])
def test_bad_pool_factor_is_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TokenBudgetBatchSampler([5, 6, 7], [5, 6, 7], max_tokens=20, **kwargs)


@pytest.mark.parametrize("pool_factor", [None, 2])
def test_the_budget_counts_lengths_padded_to_the_kernels_multiple(pool_factor):
    """A flex batch is padded to a multiple of 64: n examples of longest length l cost n * ceil(l / 64) * 64."""
    sources, targets = random_lengths(997)
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=512, seed=3, pool_factor=pool_factor,
                                      length_multiple=64)
    padded = [-(-max(source, target) // 64) * 64 for source, target in zip(sources, targets, strict=True)]
    batches = list(sampler)
    assert sorted(index for batch in batches for index in batch) == list(range(997))
    assert all(padded_cost(batch, padded) <= 512 for batch in batches)
    assert max(padded_cost(batch, padded) for batch in batches) == 512   # the budget is used, not just respected
    unpadded = TokenBudgetBatchSampler(sources, targets, max_tokens=512, seed=3, pool_factor=pool_factor)
    assert any(padded_cost(batch, padded) > 512 for batch in unpadded)


def test_cut_token_batches_counts_padded_lengths():
    assert cut_token_batches([0, 1, 2, 3], [10, 10, 10, 10], 40) == [[0, 1, 2, 3]]
    assert cut_token_batches([0, 1, 2, 3], [10, 10, 10, 10], 40, length_multiple=16) == [[0, 1], [2, 3]]
    assert cut_token_batches([0, 1, 2], [16, 17, 3], 64, length_multiple=16) == [[0, 1], [2]]


def test_an_example_that_fits_only_unpadded_is_refused_when_padded():
    check_examples_fit([40], [30], max_tokens=50)
    with pytest.raises(ValueError, match=r"max_tokens_per_batch=50 .* \(padded to 64: the kernel pads lengths to a "
                                         r"multiple of 64\)"):
        check_examples_fit([40], [30], max_tokens=50, length_multiple=64)
    with pytest.raises(ValueError, match="padded to 64"):
        TokenBudgetBatchSampler([40], [30], max_tokens=50, length_multiple=64)


def test_an_example_exactly_as_long_as_the_budget_fits_in_a_batch_of_its_own():
    """The budget is inclusive (n x longest <= max_tokens): a pair whose longer side, padded, is max_tokens is
    accepted and batched alone; one token more is refused."""
    check_examples_fit([50], [20], max_tokens=50)
    check_examples_fit([30], [40], max_tokens=64, length_multiple=64)
    sampler = TokenBudgetBatchSampler([50, 10, 12], [20, 50, 3], max_tokens=50, shuffle=False)
    assert list(sampler) == [[1], [2], [0]]   # sorted by source length; 1 and 0 are 50 long, 2 joins neither
    with pytest.raises(ValueError, match=r"max_tokens_per_batch=50 is smaller than 1 training pair"):
        check_examples_fit([51], [20], max_tokens=50)


def test_a_batch_split_for_the_processes_is_halved():
    """Ten pairs of 10 tokens at 40 tokens a batch cut into 4 + 4 + 2; for two processes the largest is halved (2 + 2),
    not one example split off, so the two halves cost about the same."""
    sampler = TokenBudgetBatchSampler([10] * 10, [10] * 10, max_tokens=40, num_processes=2, shuffle=False)
    assert [len(batch) for batch in sampler] == [2, 2, 4, 2]
