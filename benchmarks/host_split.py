"""Where a host-bound step's extra time goes on the GPU: each series' training step, and its forward alone, with
relpos_triton's Triton launches as they are or as no-ops, and the backward on autograd's device thread or the caller's.

On an H200 `shaw`'s step on relpos_triton at n = 16 (the device mostly idle) took 23.8 ms more than `absolute`'s
(docs/results/gpu_check/2026-12-04_h200_d34293a, step (u)), where `benchmarks.host_overhead` finds 5-7 ms more host
work on a CPU, Triton's launch path included: the rest is work that only a GPU run does. Variants of each series of
`bench_training.model_case` (training mode, dropout on):

- launches `real` (as training runs) or `none` (relpos_triton's launches as no-ops, their outputs uninitialised:
  the launches' host cost, plus their device time where the device is the bottleneck); a series on another kernel
  has no launches to remove, so only `real`;
- backward thread `device` (autograd's default: the backward of CUDA tensors runs on the device's worker thread,
  the fused op's Python backward included) or `caller` (torch.autograd.set_multithreading_enabled(False): every
  node on the thread that called backward); on the CPU both are the caller's.

Timed round-robin with the queue drained around each call: ms per step (and per forward, without a backward, with
the backward thread `device`) is the median over rounds of each round's mean over --steps calls; every row against
the first series' `real` / `device` row. Each step row also says how long Python's garbage collector ran within its
timed steps, and how often (`gc.callbacks`; on whichever thread a pass started: the heap is not frozen, as in a
training run). Same code, three ways of running it, so no correctness check is needed;
the `none` rows compute on uninitialised outputs (their loss is meaningless, their timing is the point).

    python -m benchmarks.host_split --device cuda --dtype bfloat16 --shape base --length 16 --batch 32 \\
        --attention_dropout 0.1 --out /tmp/host_split

Writes host_split.md and host_split.json into --out.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from benchmarks import command_line
from benchmarks.bench_training import model_case
from benchmarks.common import (
    SHAPES,
    check_attention_dropout,
    check_device_available,
    check_kernels_run,
    check_series,
    environment,
    environment_lines,
    markdown_table,
    positive_int,
    round_robin,
    scheme_and_kernel,
    series_kernels,
    write_report,
)
from benchmarks.host_overhead import launches_as_no_ops
from hf_relpos.translation.safety import output_folder

LAUNCHES = ("real", "none")
BACKWARD_THREADS = ("device", "caller")


@contextlib.contextmanager
def variant(launches: str, backward_thread: str) -> Iterator[None]:
    """relpos_triton's launches as they are (`real`) or no-ops (`none`), the backward on autograd's device thread
    (`device`) or the caller's (`caller`)."""
    with contextlib.ExitStack() as stack:
        if launches == "none":
            stack.enter_context(launches_as_no_ops())
        if backward_thread == "caller":
            stack.enter_context(torch.autograd.set_multithreading_enabled(False))
        yield


def variants(label: str) -> list[tuple[str, str]]:
    """(launches, backward thread) of a series: `none` only where it launches relpos_triton's kernels."""
    launches = LAUNCHES if scheme_and_kernel(label)[1] == "relpos_triton" else LAUNCHES[:1]
    return [(launch, thread) for launch in launches for thread in BACKWARD_THREADS]


class CollectorTime:
    """The garbage collector's passes while entered (a `gc.callbacks` entry): `passes` and their `seconds`, one
    entry per `with` block."""

    def __init__(self) -> None:
        self.passes: list[int] = []
        self.seconds: list[float] = []
        self.started: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            self.seconds[-1] += time.perf_counter() - self.started
            self.passes[-1] += 1
            self.started = None

    def __enter__(self) -> CollectorTime:
        self.passes.append(0)
        self.seconds.append(0.0)
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self)
        self.started = None


def repeated(call: Callable[[], Any], times: int, launches: str, backward_thread: str,
             collector: CollectorTime) -> Callable[[], None]:
    def run() -> None:
        with variant(launches, backward_thread), collector:
            for _ in range(times):
                call()
    return run


def render_markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    return "\n".join([
        "# Where the step's host time goes: launches real or no-ops, the backward on the device's thread or the "
        "caller's", "", *environment_lines(meta),
        f"- shape {meta['shape']} ({meta['layers']} + {meta['layers']} layers), n = {meta['length']}, batch "
        f"{meta['batch']}, attention dropout {meta['attention_dropout']:g}; {meta['rounds']} round-robin rounds of "
        f"{meta['steps']} calls after one untimed; queue drained around each call", "",
        markdown_table(["series", "launches", "backward thread", "ms per step", "ms more than the first row",
                        "ms per forward", "rounds' spread (step)", "garbage collector ms per step",
                        "collector passes per step"],
                       [[row["series"], row["launches"], row["backward_thread"], f"{row['step_ms']:.2f}",
                         f"{row['extra_step_ms']:+.2f}",
                         f"{row['forward_ms']:.2f}" if row["forward_ms"] is not None else "-",
                         f"{row['spread']:.0%}", f"{row['collector_ms']:.2f}", f"{row['collector_passes']:.2f}"]
                        for row in rows]), ""])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", nargs="+", default=["absolute@sdpa", "shaw@relpos_triton"],
                        help="scheme@kernel; the first is the baseline")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    parser.add_argument("--length", type=positive_int, default=16)
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--attention_dropout", type=float, default=0.1)
    parser.add_argument("--steps", type=positive_int, default=5, help="calls per round")
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--out", type=output_folder, required=True)
    args = parser.parse_args(argv)
    check_device_available(args.device)
    check_series(args.series)
    schemes_and_kernels = {label: scheme_and_kernel(label) for label in args.series}
    check_kernels_run([kernel for _, kernel in schemes_and_kernels.values()], args.device, "--series")
    check_attention_dropout(args.attention_dropout)
    shape = SHAPES[args.shape]
    meta = environment(args.device, args.dtype, command=command_line("benchmarks.host_split", argv)) | {
        "kernel": series_kernels(args.series), "shape": args.shape, "layers": shape.layers, "length": args.length,
        "batch": args.batch, "attention_dropout": args.attention_dropout, "steps": args.steps, "rounds": args.rounds}
    cases = {label: model_case(scheme, shape, args.length, args.batch, args.device, args.dtype, shape.layers,
                               shape.vocab_size, kernel, args.attention_dropout)
             for label, (scheme, kernel) in schemes_and_kernels.items()}
    runs: dict[tuple[str, str, str, str], Callable[[], None]] = {}
    collectors: dict[tuple[str, str, str, str], CollectorTime] = {}
    for label, case in cases.items():
        for launches, thread in variants(label):
            for phase, call in (("step", case.step), ("forward", case.forward)):
                if phase == "step" or thread == BACKWARD_THREADS[0]:
                    key = (label, launches, thread, phase)
                    collectors[key] = CollectorTime()
                    runs[key] = repeated(call, args.steps, launches, thread, collectors[key])
    names = {"/".join(key): key for key in runs}
    seconds = round_robin({name: runs[key] for name, key in names.items()}, 1, args.rounds, args.device)
    ms = {key: 1e3 * statistics.median(seconds[name]) / args.steps for name, key in names.items()}
    spread = {key: max(seconds[name]) / min(seconds[name]) - 1 for name, key in names.items()}
    baseline = ms[(args.series[0], *variants(args.series[0])[0], "step")]
    timed_steps = args.rounds * args.steps   # each run's first call is the untimed round's
    rows = []
    for label in args.series:
        for launches, thread in variants(label):
            step = (label, launches, thread, "step")
            rows.append({"series": label, "launches": launches, "backward_thread": thread, "step_ms": ms[step],
                         "extra_step_ms": ms[step] - baseline,
                         "forward_ms": ms.get((label, launches, thread, "forward")), "spread": spread[step],
                         "collector_ms": 1e3 * sum(collectors[step].seconds[1:]) / timed_steps,
                         "collector_passes": sum(collectors[step].passes[1:]) / timed_steps})
    write_report(args.out, "host_split", render_markdown(meta, rows), {"meta": meta, "rows": rows})
    print(render_markdown(meta, rows))
    return {"meta": meta, "rows": rows}


if __name__ == "__main__":
    main()
