r"""What a token budget holds: pairs per batch and padding for `max_tokens_per_batch` x `length_pool_factor`.

Tokenizes the training pairs of a WMT14-schema JSONL file (`{"translation": {"en": ..., "de": ...}}`) with a trained
tokenizer, builds the epoch-0 batches of `hf_relpos.translation.batching.TokenBudgetBatchSampler` for every budget and pool factor
asked for, and prints one Markdown table: batches per epoch, pairs per batch, padded source + target tokens per batch,
and the share of those that are padding. Use it to pick a budget that holds the pairs per step you want.

The figures in docs/training.md (the tokenizer of a vs_marian.py run, trained on Multi30k's training pairs):
  python experiments/batch_statistics.py --train-file ../shared/data/multi30k/train.jsonl \
      --tokenizer /tmp/vs_marian/marian-matched/seed1/model --budgets 1024 1536 2048 --pool-factors none 1 4 8
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from hf_relpos.translation.batching import TokenBudgetBatchSampler
from hf_relpos.translation.data import (
    DataArguments,
    example_lengths,
    read_local_pairs,
    tokenize_training_pairs,
    with_concatenated_pairs,
)
from hf_relpos.translation.tokenization import load_tokenizer


def read_lengths(train_file: Path, tokenizer_folder: str, source: str, target: str,
                 data_args: DataArguments | None = None, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token counts of every training pair's source and target, read and tokenized by train_translation.py's own
    functions (with `</s>`; with the joined pairs of `data_args.concatenated_pairs` a run of data seed `seed` adds;
    empty pairs dropped and overlong ones handled as `data_args` says, by default at the default length limits).
    The texts and token ids go to memory-mapped Arrow files in a temporary folder, as the run writes them, so memory
    does not grow with the corpus."""
    data_args = data_args or DataArguments(train_file=str(train_file), source_lang=source, target_lang=target)
    if data_args.concatenated_pairs and seed is None:
        raise ValueError("read_lengths: concatenated_pairs draws the joined pairs with the run's data seed; pass seed")
    with tempfile.TemporaryDirectory(prefix="batch_statistics-") as workdir:
        pairs = with_concatenated_pairs(read_local_pairs(train_file, source, target, workdir=workdir),
                                        data_args.concatenated_pairs, seed, workdir, data_args.max_pairs_per_join)
        tokenized, _ = tokenize_training_pairs(pairs, load_tokenizer(tokenizer_folder), data_args, workdir,
                                               keep_text=False)
        return tuple(lengths.copy() for lengths in example_lengths(tokenized))


def batch_figures(batches: list[np.ndarray], source_lengths: np.ndarray, target_lengths: np.ndarray) -> dict[str, float]:
    """Number of batches, mean pairs and padded source + target tokens per batch, and the padding share."""
    padded = sum(len(batch) * (source_lengths[batch].max() + target_lengths[batch].max()) for batch in batches)
    real = sum(source_lengths[batch].sum() + target_lengths[batch].sum() for batch in batches)
    return {"batches": len(batches), "pairs": sum(map(len, batches)) / len(batches),
            "padded_tokens": float(padded / len(batches)), "padding": float(1 - real / padded)}


def training_batches(source_lengths: np.ndarray, target_lengths: np.ndarray, count: int, seed: int,
                     budget: int | None, pool_factor: int | None, batch_size: int) -> list[np.ndarray]:
    """The first `count` training batches of one process: with a token budget, the ones
    `TokenBudgetBatchSampler` deals epoch after epoch (the very batches the Trainer draws); without one, random
    batches of `batch_size` pairs (a draw from the distribution of the Trainer's RandomSampler, not its stream)."""
    batches: list[np.ndarray] = []
    if budget is None:
        generator = np.random.default_rng(seed)
        while len(batches) < count:
            order = generator.permutation(len(source_lengths))
            batches += [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
        return batches[:count]
    sampler = TokenBudgetBatchSampler(source_lengths, target_lengths, budget, seed=seed, pool_factor=pool_factor)
    epoch = 0
    while len(batches) < count:
        sampler.set_epoch(epoch)
        batches += [np.asarray(batch) for batch in sampler]
        epoch += 1
    return batches[:count]


def statistics(source_lengths: np.ndarray, target_lengths: np.ndarray, budget: int, pool_factor: int | None,
               seed: int) -> dict[str, float]:
    """Batches per epoch, mean pairs and padded tokens per batch, and the padding share of the first epoch."""
    batches = [np.asarray(batch) for batch in
               TokenBudgetBatchSampler(source_lengths, target_lengths, budget, seed=seed, pool_factor=pool_factor)]
    return batch_figures(batches, source_lengths, target_lengths)


def parse_pool_factor(text: str) -> int | None:
    return None if text.lower() in ("none", "null") else int(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-file", type=Path, required=True, help="JSONL file in the WMT14 schema")
    parser.add_argument("--tokenizer", required=True, help="folder of a trained tokenizer (e.g. a model's output_dir)")
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048, 4096], help="max_tokens_per_batch")
    parser.add_argument("--pool-factors", type=parse_pool_factor, nargs="+", default=[None, 1, 4, 8],
                        help="length_pool_factor values; none sorts the whole corpus")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    source_lengths, target_lengths = read_lengths(args.train_file, args.tokenizer, args.source_lang, args.target_lang)
    print(f"{len(source_lengths)} pairs; mean tokens: source {source_lengths.mean():.1f}, "
          f"target {target_lengths.mean():.1f}\n")
    print("| max_tokens_per_batch | length_pool_factor | batches per epoch | pairs per batch | padded tokens per batch "
          "| padding |")
    print("| --- | --- | --- | --- | --- | --- |")
    for budget in args.budgets:
        for pool_factor in args.pool_factors:
            row = statistics(source_lengths, target_lengths, budget, pool_factor, args.seed)
            print(f"| {budget} | {pool_factor if pool_factor is not None else 'null'} | {row['batches']} | "
                  f"{row['pairs']:.1f} | {row['padded_tokens']:.0f} | {100 * row['padding']:.1f} % |")


if __name__ == "__main__":
    main()
