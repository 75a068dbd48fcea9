"""Token-budget batching: budget, coverage, per-epoch shuffling, and disjoint shards through accelerate."""

import random

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader
from torch.utils.data import DataLoader, Dataset

from hf_relpos.batching import TokenBudgetBatchSampler


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
    with pytest.raises(ValueError, match="one per process"):
        TokenBudgetBatchSampler([5, 6], [5, 6], max_tokens=100, num_processes=3)
