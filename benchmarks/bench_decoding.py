"""Greedy `generate()` of exactly 128 new tokens with and without the KV cache, for every position scheme.

Tokens/s counts generated tokens (batch x new tokens). The cached path must be >= 5x faster than the uncached one,
which re-runs the decoder over the whole prefix at every step. Scheme x cache runs round-robin, as in
`bench_training`.

    python -m benchmarks.bench_decoding --quick            # CPU-sized subset
    python -m benchmarks.bench_decoding --dtype bfloat16   # on a GPU
    python -m benchmarks.bench_decoding --dtype bfloat16 --cache-implementation static   # the cached runs on
        # transformers' fixed-size StaticCache (generate compiles the decoding step on a GPU; the warm-up takes it)
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import command_line
from benchmarks.common import (
    BASELINE,
    SHAPES,
    add_common_arguments,
    autocast,
    check_arguments,
    check_kernels_run,
    environment,
    environment_lines,
    make_config,
    markdown_table,
    positive_int,
    round_robin,
    write_report,
)
from hf_relpos import RelPosTransformerForConditionalGeneration

REQUIRED_SPEEDUP = 5.0


def generation(
    model: RelPosTransformerForConditionalGeneration, source: torch.Tensor, new_tokens: int, use_cache: bool, dtype: str,
    cache_implementation: str = "dynamic",
) -> Callable[[], None]:
    """A call that generates exactly `new_tokens` tokens per sequence (greedy, EOS cannot stop it early); with
    `use_cache`, on the cache `cache_implementation` ("dynamic" or "static")."""
    device = source.device.type

    def run() -> None:
        with autocast(device, dtype):
            output = model.generate(
                input_ids=source,
                attention_mask=torch.ones_like(source),
                min_new_tokens=new_tokens,
                max_new_tokens=new_tokens,
                do_sample=False,
                num_beams=1,
                use_cache=use_cache,
                cache_implementation=cache_implementation if use_cache else None,
            )
        if output.size(1) != new_tokens + 1:
            raise RuntimeError(f"generate() returned {output.size(1) - 1} new tokens, expected {new_tokens}")

    return run


def run_benchmark(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per scheme: cached and uncached tokens/s, their ratio, and the cached speed relative to absolute."""
    shape = SHAPES[args.shape]
    runs = {}
    for scheme in args.schemes:
        torch.manual_seed(0)
        config = make_config(scheme, shape, args.layers, args.vocab_size, args.kernel, args.attention_dropout)
        model = RelPosTransformerForConditionalGeneration(config).to(args.device).eval()
        source = torch.randint(4, config.vocab_size, (args.batch, args.source_length), device=args.device)
        for use_cache in (True, False):
            runs[(scheme, use_cache)] = generation(model, source, args.new_tokens, use_cache, args.dtype,
                                                   args.cache_implementation)
    keys = list(runs)
    seconds = round_robin({f"{s}/{c}": runs[(s, c)] for s, c in keys}, args.warmup, args.repeats, args.device, args.clock)
    tokens = args.batch * args.new_tokens
    speed = {key: tokens / statistics.median(seconds[f"{key[0]}/{key[1]}"]) for key in keys}
    rows = []
    for scheme in args.schemes:
        cached, uncached = speed[(scheme, True)], speed[(scheme, False)]
        rows.append(
            {
                "scheme": scheme,
                "cached_tokens_per_s": cached,
                "uncached_tokens_per_s": uncached,
                "speedup": cached / uncached,
                "meets_5x": cached / uncached >= REQUIRED_SPEEDUP,
                "cached_ratio_to_absolute": cached / speed[(BASELINE, True)],
            }
        )
        print(format_row(rows[-1]), flush=True)
    return rows


def format_row(row: dict[str, Any]) -> str:
    return (
        f"{row['scheme']:11} cached {row['cached_tokens_per_s']:8.1f} tok/s  uncached "
        f"{row['uncached_tokens_per_s']:8.1f} tok/s  speed-up x{row['speedup']:.1f}"
        f"{'' if row['meets_5x'] else '  (below 5x)'}"
    )


def render_markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    # records before --cache-implementation ran on the dynamic cache, which the text leaves unsaid
    static_note = "; cached runs on the static cache" if meta.get("cache_implementation") == "static" else ""
    table = [
        [r["scheme"], f"{r['cached_tokens_per_s']:.1f}", f"{r['uncached_tokens_per_s']:.1f}", f"{r['speedup']:.1f}x",
         "yes" if r["meets_5x"] else "**no**", f"{r['cached_ratio_to_absolute']:.3f}"]
        for r in rows
    ]
    return "\n".join(
        [
            "# Decoding: generate() with and without the KV cache",
            "",
            *environment_lines(meta),
            f"- shape {meta['shape']} ({meta['layers']} + {meta['layers']} layers, vocabulary {meta['vocab_size']}), "
            f"batch {meta['batch']}, source length {meta['source_length']}, {meta['new_tokens']} new tokens "
            f"(min_new_tokens = max_new_tokens), greedy{static_note}",
            f"- {meta['warmup']} warm-up + {meta['repeats']} timed rounds, scheme x cache round-robin; "
            "tokens/s = generated tokens / median seconds",
            "",
            markdown_table(
                ["scheme", "cached tokens/s", "uncached tokens/s", "speed-up", ">= 5x", "cached vs absolute"], table
            ),
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--quick", action="store_true",
                        help="CPU-sized defaults: the small shape, batch 4, 1 warm-up + 3 timed rounds")
    parser.add_argument("--shape", choices=tuple(SHAPES), help="default base (--quick: small)")
    parser.add_argument("--layers", type=positive_int, help="layers per stack (default: the shape's)")
    parser.add_argument("--vocab-size", type=positive_int, help="default: the shape's")
    parser.add_argument("--batch", type=positive_int, help="sequences per generate() call (default 32, --quick: 4)")
    parser.add_argument("--source-length", type=positive_int, default=32)
    parser.add_argument("--new-tokens", type=positive_int, default=128)
    parser.add_argument("--cache-implementation", choices=("dynamic", "static"), default="dynamic",
                        help="the KV cache of the cached runs (static: transformers' fixed-size StaticCache)")
    args = parser.parse_args(argv)
    check_arguments(args)
    if args.attention_dropout:
        raise SystemExit(f"--attention_dropout {args.attention_dropout}: generate() runs the model in eval mode, where "
                         "attention dropout is off; the decoding benchmark would measure the same as without it")
    quick = args.quick
    if args.shape is None:
        args.shape = "small" if quick else "base"
    if args.layers is None:
        args.layers = SHAPES[args.shape].layers
    if args.vocab_size is None:
        args.vocab_size = SHAPES[args.shape].vocab_size
    if args.batch is None:
        args.batch = 4 if quick else 32
    if args.warmup is None:
        args.warmup = 1
    if args.repeats is None:
        args.repeats = 3 if quick else 5
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark, writes decoding.{md,json} into --out and returns the JSON data."""
    args = parse_args(argv)
    check_kernels_run([args.kernel], args.device, "--kernel", backward=False)
    meta = environment(args.device, args.dtype, args.clock,
                       command=command_line("benchmarks.bench_decoding", argv)) | {
        key: getattr(args, key)
        for key in ("kernel", "shape", "layers", "vocab_size", "batch", "source_length", "new_tokens", "cache_implementation",
                    "warmup", "repeats")
    }
    rows = run_benchmark(args)
    data = {"meta": meta, "decoding": rows}
    markdown = render_markdown(meta, rows)
    markdown_path, json_path = write_report(args.out, "decoding", markdown, data)
    print(markdown)
    print(f"\nwrote {markdown_path}, {json_path}")
    return data


if __name__ == "__main__":
    main()
