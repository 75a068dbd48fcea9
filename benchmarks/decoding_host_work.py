"""The host's work per cached decoding step of each series, without a GPU: what a host-bound GPU decoding step pays.

On a GPU, cached decoding of a translation model is host-bound: per step, Python and one dispatch per operator, not
kernels. The full encoder-decoder runs `generate` (greedy, and beam search) on the CPU at tiny widths, so that a
step's time is its host work, and counts per step the aten operators it dispatches (views among them, which launch
nothing on a GPU) and its host syncs (`.item()`, `bool(tensor)`, `nonzero`, `torch.equal`, ...: each a GPU stall). A step's figures are the
difference between a generate of --new_tokens and one of --base_tokens new tokens, divided by the tokens between
them, so the encoder, the first step and generate's setup cancel. Series are timed round-robin; ms per step is the
median over rounds.

    python -m benchmarks.decoding_host_work --out /tmp/decoding_host_work

Writes decoding_host_work.md and decoding_host_work.json into --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import command_line
from benchmarks.common import (
    BASELINE,
    CountOperators,
    check_series,
    environment,
    environment_lines,
    make_config,
    markdown_table,
    positive_int,
    scheme_and_kernel,
    series_kernels,
    write_report,
)
from benchmarks.host_overhead import HOST_SHAPE
from hf_relpos import RelPosTransformerForConditionalGeneration
from hf_relpos.model.positions import built_in_schemes
from hf_relpos.translation.safety import output_folder


def generation(model: RelPosTransformerForConditionalGeneration, source: torch.Tensor,
               num_beams: int) -> Callable[[int], None]:
    """A call that generates exactly `new_tokens` tokens per sequence with the KV cache (greedy or beam search)."""

    def run(new_tokens: int) -> None:
        with torch.no_grad():
            output = model.generate(input_ids=source, attention_mask=torch.ones_like(source), do_sample=False,
                                    num_beams=num_beams, min_new_tokens=new_tokens, max_new_tokens=new_tokens,
                                    use_cache=True)
        if output.size(1) != new_tokens + 1:
            raise RuntimeError(f"generate() returned {output.size(1) - 1} new tokens, expected {new_tokens}")

    return run


def counted_step(run: Callable[[int], None], base_tokens: int, new_tokens: int) -> tuple[float, dict[str, float]]:
    """Operators and host syncs (by operator) per decoding step."""
    counts = []
    for tokens in (base_tokens, new_tokens):
        with CountOperators() as counted:
            run(tokens)
        counts.append(counted)
    steps = new_tokens - base_tokens
    syncs = {name: (counts[1].syncs[name] - counts[0].syncs[name]) / steps
             for name in sorted(set(counts[0].syncs) | set(counts[1].syncs))}
    return (counts[1].operators - counts[0].operators) / steps, {name: n for name, n in syncs.items() if n}


def render_markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    table = [[row["series"], "greedy" if row["num_beams"] == 1 else f"beam {row['num_beams']}",
              f"{row['operators']:.1f}", f"{row['extra_operators']:+.1f}",
              ", ".join(f"{name} {count:g}" for name, count in row["syncs"].items()) or "none",
              f"{row['ms']:.2f}", f"{row['ratio']:.2f}", f"{row['spread']:.0%}"] for row in rows]
    return "\n".join([
        "# The host's work per cached decoding step (CPU)", "", *environment_lines(meta),
        f"- {meta['layers']} + {meta['layers']} layers of d_model {meta['d_model']}, {meta['heads']} heads, "
        f"vocabulary {meta['vocab_size']}; batch {meta['batch']}, source length {meta['source_length']}; a step: "
        f"generate of {meta['new_tokens']} new tokens less one of {meta['base_tokens']}, per token between them; "
        f"{meta['rounds']} round-robin rounds after one untimed", "",
        markdown_table(["series", "search", "operators per step", "more than the first series", "host syncs per step",
                        "ms per step", "ms vs the first series", "rounds' spread"], table), ""])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", nargs="+",
                        default=[BASELINE, *(scheme for scheme in built_in_schemes() if scheme != BASELINE)],
                        help="scheme or scheme@kernel (sdpa when not given); the first is the baseline (default: "
                             "every scheme hf_relpos ships)")
    parser.add_argument("--num_beams", type=positive_int, nargs="+", default=[1, 4])
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--source_length", type=positive_int, default=16)
    parser.add_argument("--base_tokens", type=positive_int, default=4)
    parser.add_argument("--new_tokens", type=positive_int, default=20)
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--out", type=output_folder, required=True)
    args = parser.parse_args(argv)
    check_series(args.series)
    if args.new_tokens <= args.base_tokens:
        raise SystemExit(f"--new_tokens {args.new_tokens}: must be more than --base_tokens ({args.base_tokens})")
    torch.set_num_threads(args.threads)
    shape = HOST_SHAPE
    meta = environment("cpu", "float32", command=command_line("benchmarks.decoding_host_work", argv)) | {
        "kernel": series_kernels(args.series), "layers": shape.layers, "d_model": shape.d_model, "heads": shape.heads,
        "vocab_size": shape.vocab_size, "batch": args.batch, "source_length": args.source_length,
        "base_tokens": args.base_tokens, "new_tokens": args.new_tokens, "rounds": args.rounds}
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(4, shape.vocab_size, (args.batch, args.source_length), generator=generator)
    runs = {}
    for label in args.series:
        scheme, kernel = scheme_and_kernel(label)
        torch.manual_seed(0)
        config = make_config(scheme, shape, shape.layers, shape.vocab_size, kernel)
        model = RelPosTransformerForConditionalGeneration(config).eval()
        for num_beams in args.num_beams:
            runs[(label, num_beams)] = generation(model, source, num_beams)
    counts = {key: counted_step(run, args.base_tokens, args.new_tokens) for key, run in runs.items()}
    steps = args.new_tokens - args.base_tokens
    seconds: dict[tuple[str, int], list[float]] = {key: [] for key in runs}
    keys = list(runs)
    for round_idx in range(args.rounds + 1):
        shift = round_idx % len(keys)
        for key in keys[shift:] + keys[:shift]:
            start = time.perf_counter()
            runs[key](args.base_tokens)
            middle = time.perf_counter()
            runs[key](args.new_tokens)
            end = time.perf_counter()
            if round_idx:
                seconds[key].append(((end - middle) - (middle - start)) / steps)
    rows = []
    for label, num_beams in keys:
        ms = 1e3 * statistics.median(seconds[(label, num_beams)])
        baseline = (args.series[0], num_beams)
        operators, syncs = counts[(label, num_beams)]
        rows.append({"series": label, "num_beams": num_beams, "operators": operators,
                     "extra_operators": operators - counts[baseline][0], "syncs": syncs, "ms": ms,
                     "ratio": ms / (1e3 * statistics.median(seconds[baseline])),
                     "spread": max(seconds[(label, num_beams)]) / min(seconds[(label, num_beams)]) - 1})
    rows.sort(key=lambda row: row["num_beams"])
    write_report(args.out, "decoding_host_work", render_markdown(meta, rows), {"meta": meta, "rows": rows})
    print(render_markdown(meta, rows))
    return {"meta": meta, "rows": rows}


if __name__ == "__main__":
    main()
