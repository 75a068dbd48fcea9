"""Block sizes of relpos_triton's three kernels, and where a training step's device time goes, on a CUDA GPU.

One training step of a one-layer encoder-decoder (`model_case`: encoder self-attention runs the kernels without
causality, decoder self-attention with it) with every kernel's autotuner given the candidate configs (the package's
`BLOCK_CONFIGS`, marked, and FlashAttention-2's Hopper ones; the package's alone with --candidates package): Triton's
autotuner times each on the step's own inputs (its `do_bench`), recorded per kernel, tuning key (flags, length
bucket) and config. Then, with the blocks so chosen, the device time of every CUDA kernel over a few profiled steps,
for `absolute` on sdpa and the scheme on relpos_triton in the same process (the per-token costs outside the fused
kernel show there by name). Writes tuning.md and tuning.json into --out after every timing (a time limit keeps what
was done).

    python -m benchmarks.tune_relpos_triton --device cuda --dtype bfloat16 --shape base --length 512 \\
        --tokens 16384 --attention_dropout 0.1 --out /tmp/tune
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

import torch

from benchmarks import command_line
from benchmarks.bench_training import TUNED_KERNELS, model_case
from benchmarks.common import (
    SHAPES,
    check_attention_dropout,
    check_device_available,
    check_whole_sequence,
    environment,
    environment_lines,
    markdown_table,
    positive_int,
    write_report,
)
from hf_relpos import POSITION_SCHEMES
from hf_relpos.translation.safety import output_folder

# (BLOCK_M, BLOCK_N, num_warps, num_stages) beside the package's: those FlashAttention-2's Triton kernels use on Hopper
# (larger tiles, deeper pipelines, the backward's 32 x 128).
HOPPER_CONFIGS = ((64, 64, 4, 3), (128, 64, 4, 2), (128, 64, 8, 3), (32, 128, 4, 2), (64, 128, 8, 2), (128, 128, 8, 2))
CANDIDATES = ("package", "all")   # the package's configs alone, or those and HOPPER_CONFIGS
TOP_KERNELS = 25


def block_label(block_m: int, block_n: int, warps: int, stages: int) -> str:
    return f"{block_m}x{block_n} w{warps} s{stages}"


def config_label(config: Any) -> str:
    return block_label(config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages)


def package_configs(meta: dict[str, Any]) -> set[str]:
    """The labels of the package's own block configs in a record (the 2026-11-28 record, which does not list them,
    timed the package's five first)."""
    configs = meta["package_configs"] if "package_configs" in meta else meta["candidates"][:5]
    return {block_label(*config) for config in configs}


def milliseconds(timing: Any) -> float:
    """do_bench's result: a float, or [median, ...] in some Triton versions."""
    return float(timing[0] if isinstance(timing, (list, tuple)) else timing)


def tuning_key(tuner: Any, meta: dict[str, Any]) -> str:
    """What the autotuner keys a kernel's blocks on, readably: its flags and the length bucket."""
    flags = ", ".join(f"{label} {bool(meta.get(flag))}" for label, flag in
                      (("causal", "CAUSAL"), ("dropout", "DROPOUT"), ("a^K", "HAS_BIAS"), ("a^V", "HAS_VALUES")))
    return f"{flags}, length bucket {getattr(tuner, 'nargs', {}).get('length_bucket')}"


def tuning_group(timing: dict[str, Any]) -> tuple[str, str]:
    """The kernel and tuning key a recorded timing competes in (records before the key was kept: the causal flag
    alone)."""
    return timing["kernel"], timing.get("key", f"causal {timing['causal']}")


def record_timings(tuner: Any, name: str, timings: list[dict[str, Any]], save: Any) -> None:
    """Wraps the autotuner's per-config benchmark so that each timing is recorded (with what the autotuner keys it
    on: the flags and the length bucket) and saved as it comes."""
    bench = tuner._bench

    def recorded(*args: Any, config: Any, **meta: Any) -> Any:
        result = bench(*args, config=config, **meta)
        timings.append({"kernel": name, "causal": bool(meta.get("CAUSAL")), "key": tuning_key(tuner, meta),
                        "config": config_label(config), "ms": milliseconds(result)})
        save()
        return result

    tuner._bench = recorded


def kernel_times_ms(step: Any, steps: int) -> dict[str, float]:
    """Device time per CUDA kernel name, ms per step, over `steps` profiled steps after one unprofiled."""
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in profiler.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.key] += event.device_time_total / 1000 / steps
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def render_markdown(meta: dict[str, Any], timings: list[dict[str, Any]],
                    profiles: dict[str, dict[str, float]]) -> str:
    lines = ["# relpos_triton's block sizes, and each CUDA kernel's device time", "", *environment_lines(meta),
             f"- shape {meta['shape']} (one encoder and one decoder layer), scheme {meta['scheme']}, n = "
             f"{meta['length']}, batch {meta['batch']}, attention dropout {meta['attention_dropout']:g}; * = one of "
             "the package's configs", ""]
    by_kernel: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for timing in timings:
        by_kernel[tuning_group(timing)].append(timing)
    package = package_configs(meta)
    for (kernel, key), rows in by_kernel.items():
        best_package = min((row["ms"] for row in rows if row["config"] in package), default=float("nan"))
        lines += [f"## {kernel}, {key}", "", markdown_table(
            ["config", "ms", "vs the package's best"],
            [[row["config"] + (" *" if row["config"] in package else ""), f"{row['ms']:.4f}",
              f"{row['ms'] / best_package:.3f}"] for row in sorted(rows, key=lambda row: row["ms"])]), ""]
    for label, kernels in profiles.items():
        total = sum(kernels.values())
        lines += [f"## CUDA kernels of one training step: {label} ({total:.3f} ms)", "",
                  markdown_table(["kernel", "ms"], [[name[:120], f"{ms:.4f}"]
                                                    for name, ms in list(kernels.items())[:TOP_KERNELS]]), ""]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda",), default="cuda")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="base")
    parser.add_argument("--scheme", choices=tuple(POSITION_SCHEMES), default="shaw")
    parser.add_argument("--length", type=positive_int, default=512)
    parser.add_argument("--tokens", type=positive_int, default=16384, help="tokens per batch (batch = tokens // length)")
    parser.add_argument("--attention_dropout", type=float, default=0.1)
    parser.add_argument("--steps", type=positive_int, default=3, help="profiled steps")
    parser.add_argument("--candidates", choices=CANDIDATES, default="all",
                        help="block configs timed: the package's own, or those and FlashAttention-2's Hopper ones")
    parser.add_argument("--out", type=output_folder, required=True)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_attention_dropout(args.attention_dropout)
    check_whole_sequence(args.tokens, args.length)
    check_device_available("cuda")
    from hf_relpos.model import triton_relative_kernels

    package = triton_relative_kernels.BLOCK_CONFIGS
    candidates = package + (HOPPER_CONFIGS if args.candidates == "all" else ())
    batch = args.tokens // args.length
    shape = SHAPES[args.shape]
    meta = environment(args.device, args.dtype, command=command_line("benchmarks.tune_relpos_triton", argv)) | {
        "kernel": "relpos_triton", "scheme": args.scheme, "shape": args.shape, "length": args.length, "batch": batch,
        "attention_dropout": args.attention_dropout,
        "candidates": [list(c) for c in candidates], "package_configs": [list(c) for c in package]}
    timings: list[dict[str, Any]] = []
    profiles: dict[str, dict[str, float]] = {}

    def save() -> None:
        write_report(args.out, "tuning", render_markdown(meta, timings, profiles),
                     {"meta": meta, "timings": timings, "profiles": profiles})

    for name in TUNED_KERNELS:
        tuner = getattr(triton_relative_kernels, name)
        tuner.configs = triton_relative_kernels.block_configs(candidates)
        tuner.cache.clear()
        record_timings(tuner, name, timings, save)
    cases = {"absolute@sdpa": ("absolute", "sdpa"), f"{args.scheme}@relpos_triton": (args.scheme, "relpos_triton")}
    for label, (scheme, kernel) in reversed(cases.items()):   # the scheme first: its tuning is the point
        case = model_case(scheme, shape, args.length, batch, args.device, args.dtype, 1, shape.vocab_size, kernel,
                          args.attention_dropout)
        profiles[label] = kernel_times_ms(case.step, args.steps)
        save()
        del case
    print(render_markdown(meta, timings, profiles))
    return {"meta": meta, "timings": timings, "profiles": profiles}


if __name__ == "__main__":
    main()
