r"""How long the training sources are with joined pairs (`--concatenated_pairs R`, and `--max_pairs_per_join N`
pairs in each at most), against the longest level of experiments/long_inputs.py (K test captions joined into one
sentence): whether that level stays longer than what the model trained on. Lengths in words (white-space separated), as long_inputs.py counts them.

  python experiments/joined_lengths.py --data ../shared/data/multi30k --ratio 0.5 --seeds 1 2 [--max-pairs-per-join 4]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from long_inputs import build_levels

from hf_relpos.translation.data import MAX_PAIRS_PER_JOIN, read_local_pairs, with_concatenated_pairs


def words(texts: Sequence[str]) -> np.ndarray:
    return np.array([len(text.split()) for text in texts])


def joined_lengths(data: Path, ratio: float, seeds: Sequence[int], captions: int = 4, max_pairs: int = 2) -> list[str]:
    """One line on `captions` test captions as one sentence, then one per seed on its training sources."""
    pairs = read_local_pairs(data / "train.jsonl", "en", "de")
    test = read_local_pairs(data / "test.jsonl", "en", "de")
    level = f"{captions} as one sentence"
    longest = words(build_levels(test["source"], test["target"], "en", "de", [captions])[level][0])
    lines = [f"test2016, {level}: {len(longest)} sources, {longest.mean():.1f} words on average "
             f"(min {longest.min()}, max {longest.max()})"]
    for seed in seeds:
        training = words(with_concatenated_pairs(pairs, ratio, seed, max_pairs=max_pairs)["source"])
        single, joined = training[:len(pairs)], training[len(pairs):]
        joins = f", max_pairs_per_join {max_pairs}" if max_pairs > 2 else ""
        lines.append(f"concatenated_pairs {ratio:g}{joins}, seed {seed}: {len(pairs)} training sources, {single.mean():.1f} "
                     f"words on average (max {single.max()}), {len(joined)} joined, {joined.mean():.1f} (max "
                     f"{joined.max()}); of the {level} sources, {100 * (longest > training.max()).mean():.1f} % are "
                     f"longer than every training source, {100 * (longest > np.percentile(training, 99)).mean():.1f} "
                     "% longer than 99 % of them")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="folder with train.jsonl and test.jsonl")
    parser.add_argument("--ratio", type=float, required=True, help="concatenated_pairs")
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="the runs' seeds (they draw the pairs)")
    parser.add_argument("--max-pairs-per-join", type=int, default=2, choices=range(2, MAX_PAIRS_PER_JOIN + 1),
                        metavar="N", help=f"max_pairs_per_join (2 to {MAX_PAIRS_PER_JOIN})")
    args = parser.parse_args(argv)
    print("\n".join(joined_lengths(args.data, args.ratio, args.seeds, max_pairs=args.max_pairs_per_join)))


if __name__ == "__main__":
    main()
