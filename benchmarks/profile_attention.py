"""Where each scheme's extra time goes: torch.profiler over forward + backward of one self-attention layer.

For every scheme, prints the operators whose self time (summed over the timed steps) exceeds absolute's by the most,
i.e. the ops that a faster core would have to speed up.

    python -m benchmarks.profile_attention --shape base --length 128 --threads 1
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from benchmarks.bench_training import attention_case
from benchmarks.common import BASELINE, SHAPES, add_common_arguments, check_arguments, markdown_table


def self_times_ms(step, steps: int, device: str) -> dict[str, float]:
    """Self time per operator name in ms per step (CPU time on CPU, device time on CUDA)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    step()
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in profiler.key_averages():
        own = event.self_device_time_total if device == "cuda" else event.self_cpu_time_total
        totals[event.key] += own / 1000 / steps
    return totals


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--shape", choices=tuple(SHAPES), default="base")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--top", type=int, default=6, help="ops listed per scheme")
    args = parser.parse_args(argv)
    check_arguments(args)
    steps = args.repeats or 3
    batch = max(args.tokens // args.length, 1)
    times = {}
    for scheme in args.schemes:
        torch.manual_seed(0)
        case = attention_case(scheme, SHAPES[args.shape], args.length, batch, args.device, args.dtype, args.kernel,
                              args.attention_dropout)
        times[scheme] = self_times_ms(case.step, steps, args.device)
    base = times[BASELINE]
    print(f"self time per step, {args.shape} n={args.length} batch={batch}, {args.device} ({steps} profiled steps)")
    for scheme, own in times.items():
        total, base_total = sum(own.values()), sum(base.values())
        extra = sorted(((own[op] - base.get(op, 0.0), op) for op in own), reverse=True)[: args.top]
        print(f"\n{scheme}: {total:.1f} ms per step ({total - base_total:+.1f} ms vs absolute)")
        print(markdown_table(["op", "ms", "extra ms vs absolute"], [[op, f"{own[op]:.2f}", f"{d:+.2f}"] for d, op in extra]))
    return times


if __name__ == "__main__":
    main()
