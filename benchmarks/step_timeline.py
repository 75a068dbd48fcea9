"""Where a training step's wall time goes: device busy time, idle gaps, host enqueue time and synchronizations.

For each series (scheme@kernel), the full encoder-decoder of `bench_training.model_case` (training mode, dropout on),
after `--warmup` untimed steps (compiles, autotuning):

1. wall ms per step two ways: steps timed one by one with the queue drained around each (as bench_training times
   them), and `--steps` consecutive steps with one drain at the end (as a training loop runs them);
2. the host's enqueue time: ms until step() returns after a drained queue (the host's own work, unless it waits
   on a synchronization or on a full launch queue), and the forward's part of it (until the loss is returned);
3. synchronizations (CUDA): every warning of torch.cuda.set_sync_debug_mode over one step, with its frames in
   hf_relpos, transformers and benchmarks;
4. one profiled step (torch.profiler, CPU and CUDA): the device's busy time (the union of kernel, memcpy and memset
   intervals) against the step's wall time, the largest idle gaps with the host operators running during each,
   and the runtime calls that synchronize, copy or allocate with their counts and host time, each by the operators
   that issued it (with --host_profile also their innermost frames in our code), the device time per kernel, and
   the host's operators and autograd nodes by self time (every thread: the backward's run on autograd's device
   thread), shown against the first series' as the operators with the most extra host time;
5. with --host_profile, the host's Python functions over the timed steps (cProfile): where the host's time goes.

    python -m benchmarks.step_timeline --device cuda --dtype bfloat16 --shape base --length 512 --tokens 16384 \\
        --attention_dropout 0.1 --series absolute@sdpa shaw@relpos_triton --out /tmp/timeline

Writes timeline.md and timeline.json into --out after each series (a time limit keeps what was done).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import traceback
import warnings
from collections import Counter
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
    non_negative_int,
    positive_int,
    scheme_and_kernel,
    series_kernels,
    synchronize,
    write_report,
)
from hf_relpos.translation.safety import output_folder

FRAME_SOURCES = ("hf_relpos", "transformers", "benchmarks")
# runtime calls that synchronize the host with the device, copy (cudaMemcpyAsync need not block) or allocate
SYNC_AND_COPY_CALLS = ("Synchronize", "Memcpy", "cudaFree", "cudaMalloc")
TOP_GAPS = 12
TOP_ROWS = 25
TOP_ISSUERS = 8   # the most frequent issuers of each runtime call
TOP_OPERATORS = 200   # host operators kept per series, by self time (the extra-time table reads them)
STEP_MARKER = "timeline_step"


def time_steps(case: Any, device: str, steps: int) -> dict[str, float]:
    """ms per step: drained around each step (median), consecutive (mean), and the host's enqueue time (median),
    split into the forward's and the backward's where the case separates them."""
    drained, enqueue, forward_enqueue = [], [], []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        if case.forward is None:
            case.step()
        else:
            loss = case.forward()
            forward_enqueue.append(time.perf_counter() - start)
            loss.backward()
        enqueue.append(time.perf_counter() - start)
        synchronize(device)
        drained.append(time.perf_counter() - start)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        case.step()
    synchronize(device)
    consecutive = (time.perf_counter() - start) / steps
    timing = {"drained_ms": 1e3 * statistics.median(drained), "consecutive_ms": 1e3 * consecutive,
              "enqueue_ms": 1e3 * statistics.median(enqueue)}
    if forward_enqueue:
        timing["forward_enqueue_ms"] = 1e3 * statistics.median(forward_enqueue)
    return timing


def synchronizations(step: Any) -> list[dict[str, Any]]:
    """Each synchronizing CUDA operation of one step (torch.cuda.set_sync_debug_mode), by its frames in our code."""
    found: Counter = Counter()
    previous = warnings.showwarning

    def record(message: Any, category: Any, filename: str, lineno: int, *args: Any) -> None:
        frames = [f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno} {frame.name}"
                  for frame in traceback.extract_stack()[:-1] if any(s in frame.filename for s in FRAME_SOURCES)]
        found[(str(message).split("\n")[0][:100], " < ".join(reversed(frames[-4:])))] += 1

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            step()
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = previous
    return [{"message": message, "frames": frames, "count": count} for (message, frames), count in found.items()]


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals, sorted and disjoint."""
    union: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


def timeline(events: list[Any], step_start: float, step_end: float) -> dict[str, Any]:
    """Busy time, idle gaps (the trailing one included) and the runtime calls that synchronize or copy with what
    issued them, of one profiled step from the profiler's events (us): the host's events are the operators and
    runtime calls the step started, before `step_end` (not the harness's drain after it; Python functions, recorded
    with stacks, only name the code that issued a call)."""
    # the device's own activity: kernels, copies and fills, not the GPU ranges of record_function annotations
    device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
              and not getattr(e, "is_user_annotation", False) and e.name != STEP_MARKER]
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU
            and step_start <= e.time_range.start < step_end and not getattr(e, "is_python_function", False)]
    busy = merged([(e.time_range.start, e.time_range.end) for e in device])
    end = max([step_end] + [b for _, b in busy])
    wall = end - step_start
    gaps, cursor = [], step_start
    for start, stop in busy:
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, stop)
    if end > cursor:
        gaps.append((cursor, end))
    gaps.sort(key=lambda gap: gap[0] - gap[1])
    rows = []
    for start, stop in gaps[:TOP_GAPS]:
        during = Counter(e.name for e in host if e.time_range.start < stop and e.time_range.end > start
                         and e.time_range.end - e.time_range.start < stop - start + 1e3)
        rows.append({"offset_ms": (start - step_start) / 1e3, "gap_ms": (stop - start) / 1e3,
                     "host_ops": [f"{name} x{count}" for name, count in during.most_common(6)]})
    calls: dict[str, list[float]] = {}
    issuers: dict[str, Counter] = {}
    for e in host:
        if any(name in e.name for name in SYNC_AND_COPY_CALLS):
            calls.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
            issuers.setdefault(e.name, Counter())[issuer(e)] += 1
    launches = sum(1 for e in host if "LaunchKernel" in e.name)
    kernel_ms: Counter = Counter()
    for e in device:
        kernel_ms[e.name[:120]] += (e.time_range.end - e.time_range.start) / 1e3
    busy_us = sum(b - a for a, b in busy)
    operators: dict[str, list[float]] = {}
    for e in host:
        counted = operators.setdefault(e.name, [0, 0.0])
        counted[0] += 1
        counted[1] += e.self_cpu_time_total / 1e3
    return {"wall_ms": wall / 1e3, "busy_ms": busy_us / 1e3, "idle_ms": (wall - busy_us) / 1e3,
            "kernels": len(device), "launches": launches, "gaps": rows,
            "kernel_ms": dict(kernel_ms.most_common(TOP_ROWS)),
            "host_operators": {name: {"count": count, "self_ms": ms} for name, (count, ms) in
                               sorted(operators.items(), key=lambda item: -item[1][1])[:TOP_OPERATORS]},
            "blocking": {name: {"count": len(times), "host_ms": sum(times) / 1e3,
                                "issued_by": dict(issuers[name].most_common(TOP_ISSUERS))}
                         for name, times in sorted(calls.items())}}


def issuer(event: Any) -> str:
    """What issued a runtime call: its enclosing operators (innermost first, up to 3) and, where the profile
    recorded the Python functions (with_stack), the innermost 3 of them in our code."""
    names, frames, parent = [], [], getattr(event, "cpu_parent", None)
    while parent is not None:
        if not getattr(parent, "is_python_function", False):
            names.append(parent.name)
        elif any(source in parent.name for source in FRAME_SOURCES):
            frames.append(parent.name.split("site-packages/")[-1])
        parent = getattr(parent, "cpu_parent", None)
    return (" < ".join(names[:3]) or "no operator") + (f" ({' < '.join(frames[:3])})" if frames else "")


def host_functions(step: Any, device: str, steps: int) -> list[dict[str, Any]]:
    """The host's Python functions over `steps` steps (cProfile), ms per step, the largest own time first."""
    synchronize(device)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        step()
    synchronize(device)
    profile.disable()
    stats = pstats.Stats(profile).stats
    rows = [{"function": f"{path.split('site-packages/')[-1]}:{line} {name}", "calls": calls / steps,
             "own_ms": 1e3 * own / steps, "cumulative_ms": 1e3 * cumulative / steps}
            for (path, line, name), (_, calls, own, cumulative, _) in stats.items()]
    return sorted(rows, key=lambda row: -row["own_ms"])[:TOP_ROWS * 2]


def profiled_step(step: Any, device: str, with_stack: bool = False) -> dict[str, Any]:
    """One step under torch.profiler (`timeline`); `with_stack` records the operators' Python frames (more host
    time in the profiled step) to name the code that issues each runtime copy or synchronization."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    synchronize(device)
    with torch.profiler.profile(activities=activities, with_stack=with_stack) as profiler:
        with torch.profiler.record_function(STEP_MARKER):
            step()
        synchronize(device)
    events = list(profiler.events())
    marker = next(e for e in events if e.name == STEP_MARKER and e.device_type == torch.autograd.DeviceType.CPU)
    return timeline(events, marker.time_range.start, marker.time_range.end)


def extra_host_time(operators: dict[str, dict[str, float]], baseline: dict[str, dict[str, float]]) -> list[list[str]]:
    """Rows (operator, counts, self ms, difference) of the `TOP_ROWS` operators whose host self time exceeds the
    baseline's by the most (an operator absent from a top list counts as 0 there)."""
    absent = {"count": 0, "self_ms": 0.0}
    extra = sorted(((operators.get(name, absent)["self_ms"] - baseline.get(name, absent)["self_ms"], name)
                    for name in operators.keys() | baseline.keys()), reverse=True)
    return [[name, f"{operators.get(name, absent)['count']}", f"{baseline.get(name, absent)['count']}",
             f"{operators.get(name, absent)['self_ms']:.3f}", f"{baseline.get(name, absent)['self_ms']:.3f}",
             f"{difference:+.3f}"] for difference, name in extra[:TOP_ROWS]]


def render_markdown(meta: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    lines = ["# Where a training step's wall time goes", "", *environment_lines(meta),
             f"- shape {meta['shape']}, {meta['layers']} + {meta['layers']} layers, n = {meta['length']}, batch "
             f"{meta['batch']}, attention dropout {meta['attention_dropout']:g}; {meta['steps']} steps per timing "
             f"after {meta['warmup']} untimed", ""]
    baseline = next(iter(results.values()), None)
    first_label = next(iter(results), "")
    header = ["series", "drained ms/step", "consecutive ms/step", "ratio (drained)", "ratio (consecutive)",
              "host enqueue ms", "of which forward ms", "profiled wall ms", "device busy ms", "device idle ms", "kernels", "syncs"]
    table = []
    for label, result in results.items():
        timing, profile = result["timing"], result.get("profile", {})
        table.append([label, f"{timing['drained_ms']:.2f}", f"{timing['consecutive_ms']:.2f}",
                      f"{baseline['timing']['drained_ms'] / timing['drained_ms']:.3f}",
                      f"{baseline['timing']['consecutive_ms'] / timing['consecutive_ms']:.3f}",
                      f"{timing['enqueue_ms']:.2f}",
                      f"{timing['forward_enqueue_ms']:.2f}" if "forward_enqueue_ms" in timing else "-",
                      *(f"{profile[key]:.2f}" if key in profile else "-"
                                                       for key in ("wall_ms", "busy_ms", "idle_ms")),
                      profile.get("kernels", "-"), sum(s["count"] for s in result.get("syncs", []))])
    lines += [markdown_table(header, table), ""]
    for label, result in results.items():
        if result.get("syncs"):
            lines += [f"## {label}: synchronizing operations in one step", "", markdown_table(
                ["count", "warning", "frames (innermost first)"],
                [[s["count"], s["message"], s["frames"]] for s in result["syncs"]]), ""]
        profile = result.get("profile")
        if profile:
            lines += [f"## {label}: the largest device idle gaps of one profiled step", "", markdown_table(
                ["at ms", "gap ms", "host operators during the gap"],
                [[f"{g['offset_ms']:.2f}", f"{g['gap_ms']:.3f}", "; ".join(g["host_ops"])] for g in profile["gaps"]]),
                "", "Runtime calls that synchronize, copy or allocate: " + (", ".join(
                    f"{name} x{b['count']} ({b['host_ms']:.2f} ms)" for name, b in profile["blocking"].items())
                    or "none") + f"; kernel launches {profile['launches']}.", ""]
            issued = [[name, f"{count}", by] for name, calls in profile["blocking"].items()
                      for by, count in calls.get("issued_by", {}).items()]
            if issued:
                lines += [f"## {label}: what issued those runtime calls", "", markdown_table(
                    ["call", "count", "operators (innermost first) and frames in our code"], issued), ""]
            if profile.get("kernel_ms"):
                lines += [f"## {label}: device time per kernel in the profiled step", "", markdown_table(
                    ["kernel", "ms"], [[name, f"{ms:.3f}"] for name, ms in profile["kernel_ms"].items()]), ""]
        if profile and profile.get("host_operators") and baseline is not None and result is not baseline:
            lines += [f"## {label}: the host operators with the most self time beyond {first_label}'s (profiled step)",
                      "", markdown_table(["operator", "count", f"count ({first_label})", "self ms",
                                          f"self ms ({first_label})", "extra ms"],
                                         extra_host_time(profile["host_operators"],
                                                         baseline["profile"]["host_operators"])), ""]
        if result.get("host_functions"):
            lines += [f"## {label}: the host's Python functions per step (cProfile)", "", markdown_table(
                ["function", "calls", "own ms", "cumulative ms"],
                [[row["function"], f"{row['calls']:g}", f"{row['own_ms']:.3f}", f"{row['cumulative_ms']:.3f}"]
                 for row in result["host_functions"]]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="base")
    parser.add_argument("--layers", type=positive_int, help="layers per stack (default: the shape's)")
    parser.add_argument("--length", type=positive_int, default=512)
    parser.add_argument("--tokens", type=positive_int, default=16384,
                        help="source tokens per batch (batch = tokens // length)")
    parser.add_argument("--attention_dropout", type=float, default=0.1)
    parser.add_argument("--series", nargs="+", default=["absolute@sdpa", "shaw@relpos_triton"],
                        help="scheme@kernel, the first is the baseline of the ratios")
    parser.add_argument("--warmup", type=non_negative_int, default=2)
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--host_profile", action="store_true",
                        help="also the host's Python functions over --steps steps (cProfile)")
    parser.add_argument("--out", type=output_folder, required=True)
    args = parser.parse_args(argv)
    check_device_available(args.device)
    check_series(args.series)
    check_kernels_run([scheme_and_kernel(label)[1] for label in args.series], args.device, "--series")
    check_attention_dropout(args.attention_dropout)
    if args.tokens < args.length:
        raise SystemExit(f"--tokens {args.tokens}: fewer than --length ({args.length}); a batch holds at least one "
                         "whole sequence")
    shape = SHAPES[args.shape]
    layers = shape.layers if args.layers is None else args.layers
    batch = args.tokens // args.length
    meta = environment(args.device, args.dtype, command=command_line("benchmarks.step_timeline", argv)) | {
        "shape": args.shape, "layers": layers, "length": args.length, "batch": batch,
        "attention_dropout": args.attention_dropout, "warmup": args.warmup, "steps": args.steps,
        "kernel": series_kernels(args.series)}
    results: dict[str, dict[str, Any]] = {}
    for label in args.series:
        scheme, kernel = scheme_and_kernel(label)
        case = model_case(scheme, shape, args.length, batch, args.device, args.dtype, layers, shape.vocab_size, kernel,
                          args.attention_dropout)
        for _ in range(args.warmup):
            case.step()
        result: dict[str, Any] = {"timing": time_steps(case, args.device, args.steps)}
        results[label] = result
        if args.device == "cuda":
            result["syncs"] = synchronizations(case.step)
        result["profile"] = profiled_step(case.step, args.device, with_stack=args.host_profile)
        if args.host_profile:
            result["host_functions"] = host_functions(case.step, args.device, args.steps)
        write_report(args.out, "timeline", render_markdown(meta, results), {"meta": meta, "results": results})
        print(render_markdown(meta, {label: result} if len(results) == 1 else results), flush=True)
        del case
    return {"meta": meta, "results": results}


if __name__ == "__main__":
    main()
