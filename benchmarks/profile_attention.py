"""Where each scheme's extra time goes: torch.profiler over forward + backward of one self-attention layer.

For every length and scheme, the time per step of each operator (its own time: CPU time on the CPU; on CUDA the
device time of the kernels it launched itself, so that nothing is counted twice) and the operators whose time exceeds
absolute's by the most, i.e. the ops that a faster path would have to speed up; beside their sum, the wall time of
a step timed without the profiler (median of as many steps): on CUDA a wall time well above the device time is time
the GPU waits for the host (launches, syncs). Writes profile.md and profile.json into --out after every length (a
time limit keeps the lengths done).

    python -m benchmarks.profile_attention --shape base --lengths 128 --threads 1
    python -m benchmarks.profile_attention --device cuda --dtype bfloat16 --kernel relpos_triton \\
        --attention_dropout 0.1 --schemes absolute shaw --lengths 512 128 --tokens 16384
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import command_line
from benchmarks.bench_training import attention_case
from benchmarks.common import (
    BASELINE,
    SHAPES,
    add_common_arguments,
    check_arguments,
    check_kernels_run,
    environment,
    environment_lines,
    markdown_table,
    positive_int,
    timed,
    write_report,
)

RECORDED_MS = 0.005   # ops below this time per step are left out of the record's per-op table


def self_times_ms(step: Callable[[], None], steps: int, device: str, warmup: int = 1) -> dict[str, float]:
    """Own time per operator name in ms per step, summed over the profiled steps after `warmup` unprofiled ones: CPU
    time on the CPU; on CUDA the device time of the kernels each operator launched itself (operator events only: the
    kernels' own events would count the same time twice)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(warmup):
        step()
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in profiler.key_averages():
        if event.device_type != torch.autograd.DeviceType.CPU:
            continue
        own = event.self_device_time_total if device == "cuda" else event.self_cpu_time_total
        if own > 0:
            totals[event.key] += own / 1000 / steps
    return dict(totals)


def extra_ops(own: dict[str, float], base: dict[str, float], top: int) -> list[tuple[str, float, float]]:
    """The `top` operators by time beyond the baseline's (the baseline's own: by time): (name, ms, extra ms)."""
    key = (lambda op: own[op]) if own is base else (lambda op: own[op] - base.get(op, 0.0))
    return [(op, own[op], own[op] - base.get(op, 0.0)) for op in sorted(own, key=key, reverse=True)[:top]]


def render_markdown(meta: dict[str, Any], profiles: list[dict[str, Any]], top: int) -> str:
    lines = ["# Where each scheme's extra time goes: one self-attention layer, forward + backward", "",
             *environment_lines(meta),
             f"- shape {meta['shape']}, {meta['tokens']} tokens per batch, attention dropout "
             f"{meta['attention_dropout']:g}, {meta['steps']} profiled steps after {meta['warmup']} unprofiled; time per "
             f"step: {meta['time']}", ""]
    for profile in profiles:
        base = profile["schemes"][BASELINE]["ops_ms"]
        lines.append(f"## n = {profile['length']}, batch {profile['batch']}")
        for scheme, entry in profile["schemes"].items():
            lines += ["", f"{scheme}: {entry['total_ms']:.2f} ms per step ({entry['extra_ms']:+.2f} ms vs {BASELINE}); "
                          f"wall {entry['wall_ms']:.2f} ms ({entry['extra_wall_ms']:+.2f} ms)",
                      "", markdown_table(["op", "ms", f"extra ms vs {BASELINE}"],
                                         [[op, f"{ms:.3f}", f"{extra:+.3f}"]
                                          for op, ms, extra in extra_ops(entry["ops_ms"], base, top)])]
        lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--shape", choices=tuple(SHAPES), default="base")
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[128])
    parser.add_argument("--tokens", type=positive_int, default=4096, help="tokens per batch (batch = tokens // length)")
    parser.add_argument("--top", type=positive_int, default=6, help="ops listed per scheme in the Markdown")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(args)
    check_kernels_run([args.kernel], args.device, "--kernel")
    if args.tokens < max(args.lengths):
        raise SystemExit(f"--tokens {args.tokens}: fewer than the longest of --lengths ({max(args.lengths)}); a batch "
                         "holds at least one whole sequence")
    steps = 3 if args.repeats is None else args.repeats
    warmup = 1 if args.warmup is None else args.warmup
    meta = environment(args.device, args.dtype, args.clock,
                       command=command_line("benchmarks.profile_attention", argv)) | {
        "kernel": args.kernel, "shape": args.shape, "tokens": args.tokens, "steps": steps, "warmup": warmup,
        "attention_dropout": args.attention_dropout,
        "time": ("device time of the kernels each op launched itself" if args.device == "cuda"
                 else "each op's own CPU time"),
    }
    profiles: list[dict[str, Any]] = []
    for length in args.lengths:
        batch = args.tokens // length
        schemes = {}
        for scheme in args.schemes:
            torch.manual_seed(0)
            case = attention_case(scheme, SHAPES[args.shape], length, batch, args.device, args.dtype, args.kernel,
                                  args.attention_dropout)
            schemes[scheme] = {"ops_ms": self_times_ms(case.step, steps, args.device, warmup),
                               "wall_ms": 1000 * statistics.median(timed(case.step, args.device, args.clock)
                                                              for _ in range(steps))}
            del case
        base_total = sum(schemes[BASELINE]["ops_ms"].values())
        for entry in schemes.values():
            entry["total_ms"] = sum(entry["ops_ms"].values())
            entry["extra_ms"] = entry["total_ms"] - base_total
            entry["extra_wall_ms"] = entry["wall_ms"] - schemes[BASELINE]["wall_ms"]
            entry["ops_ms"] = {op: ms for op, ms in sorted(entry["ops_ms"].items(), key=lambda item: -item[1])
                               if ms >= RECORDED_MS}
        profiles.append({"length": length, "batch": batch, "schemes": schemes})
        markdown = render_markdown(meta, profiles, args.top)
        markdown_path, json_path = write_report(args.out, "profile", markdown, {"meta": meta, "profiles": profiles})
    print(markdown)
    print(f"wrote {markdown_path}, {json_path}")
    return {"meta": meta, "profiles": profiles}


if __name__ == "__main__":
    main()
