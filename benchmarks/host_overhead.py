"""The host's time per training step of each series, without a GPU: what a host-bound GPU step pays outside kernels.

The full encoder-decoder (`bench_training.model_case`, training mode, dropout on) runs on the CPU at tiny widths, so
that the host's Python and dispatch work dominates each step, with relpos_triton's kernels not run (their outputs stay
uninitialised, denormals are flushed). Every other operator runs as it does on a GPU, so a series' milliseconds are
its host work per step: the fused path's autograd dispatch, launch settings, tables and key ranges included. With
`--launches stubbed` (the default) the launches are no-ops, so Triton's own launch path is left out; with
`--launches triton` each launch goes through it (the autotuner's key and cache, the JIT function's argument binding,
specialisation and kernel-cache lookup) with a stand-in CUDA driver (sm_90): the kernels are not compiled, the
autotuner's benchmark returns equal timings (its first configuration is chosen), and the compiled kernel's launcher,
whose C call a GPU would make, does nothing. `--launches triton` needs triton's JIT functions: a process where
TRITON_INTERPRET was unset when triton_relative_kernels was imported. On an H200 the fused path's step was host-bound
(docs/results/gpu_check/2026-12-04_h200_e8f9f2f). Series are timed round-robin; ms per step is the median over
rounds, each the mean of --steps steps; one more step per series counts the aten operators it dispatches (views
among them, which launch nothing on a GPU).

    python -m benchmarks.host_overhead --series absolute@sdpa shaw@relpos_triton --out /tmp/host
    python -m benchmarks.host_overhead --launches triton --series absolute@sdpa shaw@relpos_triton --out /tmp/host

Writes host_overhead.md and host_overhead.json into --out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Iterator
from typing import Any

import torch

from benchmarks import command_line
from benchmarks.bench_training import TUNED_KERNELS, model_case
from benchmarks.common import (
    CountOperators,
    Shape,
    check_attention_dropout,
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
from hf_relpos.translation.safety import output_folder

HOST_SHAPE = Shape(d_model=64, heads=8, ffn_dim=64, layers=6, vocab_size=64)   # the base model's layers and heads


@contextlib.contextmanager
def launches_as_no_ops() -> Iterator[None]:
    """relpos_triton's Triton launches as no-ops (the forward and both backward kernels, whose outputs stay
    uninitialised), on any device; undone on exit."""
    from hf_relpos.model import triton_relative

    saved = triton_relative.launch
    triton_relative.launch = lambda *args, **settings: None
    try:
        yield
    finally:
        triton_relative.launch = saved


@contextlib.contextmanager
def kernels_stubbed() -> Iterator[None]:
    """`launches_as_no_ops` on the CPU: under the interpreter's flag (the CPU is the kernel's device only there),
    denormals flushed; all undone on exit (torch's default keeps denormals)."""
    interpret = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_flush_denormal(True)   # the uninitialised outputs must not slow the operators after them
    try:
        with launches_as_no_ops():
            yield
    finally:
        torch.set_flush_denormal(False)
        if interpret is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = interpret


class StandInDriver:
    """What triton's JIT launch path asks the active driver: a CUDA device 0 of compute capability 9.0 (an H100's or
    H200's), stream 0."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


class StandInKernel:
    """A compiled kernel as triton's launch path uses it, whose launch does nothing and is counted."""

    function = packed_metadata = None

    def __init__(self, launches: list[int]) -> None:
        self.launches = launches

    def launch_metadata(self, grid: Any, stream: int, *args: Any) -> None:
        return None

    def run(self, *args: Any) -> None:
        self.launches[0] += 1


@contextlib.contextmanager
def triton_launch_path(launches: list[int]) -> Iterator[None]:
    """relpos_triton's launches through triton's launch path with `StandInDriver`, each compile returning a
    `StandInKernel` (counting into `launches[0]`) and the autotuner's benchmark equal timings; the device checks of
    the fused path pass on the CPU. Everything is undone on exit."""
    import triton
    from triton.runtime import driver

    from hf_relpos.model import attention_functions, triton_relative
    from hf_relpos.model import triton_relative_kernels as kernels

    jitted = (kernels.relative_forward_kernel, kernels.relative_backward_keys_kernel,
              kernels.relative_backward_queries_kernel)
    if not all(isinstance(kernel, triton.runtime.JITFunction) for kernel in jitted):
        raise SystemExit("--launches triton: relpos_triton's kernels were built for Triton's interpreter "
                         "(TRITON_INTERPRET=1 when they were imported); run it in a process without TRITON_INTERPRET")
    tuners = tuple(getattr(kernels, name) for name in TUNED_KERNELS)

    def compile_for(kernel: Any) -> Any:
        def stand_in_compile(key: Any, signature: Any, device: int, *rest: Any) -> StandInKernel:
            compiled = kernel.device_caches[device][0][key] = StandInKernel(launches)
            return compiled
        return stand_in_compile

    saved = (triton_relative.interpreting, triton_relative.check_device, attention_functions.check_device)
    previous_driver = driver._active
    driver.set_active(StandInDriver())
    for kernel in jitted:
        kernel._do_compile = compile_for(kernel)
    for tuner in tuners:
        tuner._bench = lambda *args, config, **meta: [1.0]
    triton_relative.interpreting = lambda: False
    triton_relative.check_device = attention_functions.check_device = lambda device: None
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        triton_relative.interpreting, triton_relative.check_device, attention_functions.check_device = saved
        for kernel in (*jitted, *tuners):
            vars(kernel).pop("_do_compile", None)
            vars(kernel).pop("_bench", None)
        for kernel in jitted:
            kernel.device_caches.clear()
        for tuner in tuners:
            tuner.cache.clear()
        driver._active = previous_driver   # (None: found again on the next use, as before)


def render_markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    return "\n".join([
        "# The host's time per training step (kernel launches "
        + ("stubbed" if meta["launches"] == "stubbed" else "through Triton's launch path, not run")
        + ", CPU)", "", *environment_lines(meta),
        f"- {meta['layers']} + {meta['layers']} layers of d_model {meta['d_model']}, {meta['heads']} heads, n = "
        f"{meta['length']}, batch {meta['batch']}, attention dropout {meta['attention_dropout']:g}; "
        f"{meta['rounds']} round-robin rounds of {meta['steps']} steps after one untimed", "",
        markdown_table(["series", "ms per step", "ms more than the first series", "rounds' spread",
                        "aten operators per step", "launches through Triton's path per step"],
                       [[row["series"], f"{row['ms']:.2f}", f"{row['extra_ms']:+.2f}", f"{row['spread']:.0%}",
                         f"{row['operators']}", f"{row['triton_launches']}"] for row in rows]), ""])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", nargs="+", default=["absolute@sdpa", "shaw@relpos_triton"],
                        help="scheme@kernel; the first is the baseline")
    parser.add_argument("--length", type=positive_int, default=8)
    parser.add_argument("--batch", type=positive_int, default=2)
    parser.add_argument("--attention_dropout", type=float, default=0.1)
    parser.add_argument("--steps", type=positive_int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="bfloat16: under autocast, as the GPU benchmarks train")
    parser.add_argument("--launches", choices=("stubbed", "triton"), default="stubbed",
                        help="relpos_triton's launches: no-ops, or through Triton's launch path with a stand-in driver")
    parser.add_argument("--out", type=output_folder, required=True)
    args = parser.parse_args(argv)
    check_series(args.series)
    if any(scheme_and_kernel(label)[1] == "flex_attention" for label in args.series):
        raise SystemExit("--series flex_attention: training needs --device cuda (FlexAttention has no backward on the "
                         "CPU), and this benchmark runs on the CPU")
    check_attention_dropout(args.attention_dropout)
    torch.set_num_threads(args.threads)
    shape = HOST_SHAPE
    meta = environment("cpu", args.dtype, command=command_line("benchmarks.host_overhead", argv)) | {
        "kernel": series_kernels(args.series),
        "layers": shape.layers, "d_model": shape.d_model, "heads": shape.heads, "length": args.length,
        "batch": args.batch, "attention_dropout": args.attention_dropout, "steps": args.steps, "rounds": args.rounds,
        "launches": args.launches}
    launches = [0]
    with kernels_stubbed() if args.launches == "stubbed" else triton_launch_path(launches):
        cases = {}
        for label in args.series:
            scheme, kernel = scheme_and_kernel(label)
            cases[label] = model_case(scheme, shape, args.length, args.batch, "cpu", args.dtype, shape.layers,
                                      shape.vocab_size, kernel, args.attention_dropout)

        def steps(step: Any) -> Any:
            return lambda: [step() for _ in range(args.steps)]

        seconds = round_robin({label: steps(case.step) for label, case in cases.items()}, 1, args.rounds, "cpu")
        triton_launches, operators = dict.fromkeys(cases, 0), {}
        for label, case in cases.items():   # one step's aten operators and launches through Triton's path
            before = launches[0]
            with CountOperators() as counted:
                case.step()
            triton_launches[label], operators[label] = launches[0] - before, counted.operators
    per_step = {label: 1e3 * statistics.median(times) / args.steps for label, times in seconds.items()}
    baseline = per_step[args.series[0]]
    rows = [{"series": label, "ms": ms, "extra_ms": ms - baseline, "operators": operators[label],
             "triton_launches": triton_launches[label],
             "spread": max(seconds[label]) / min(seconds[label]) - 1} for label, ms in per_step.items()]
    write_report(args.out, "host_overhead", render_markdown(meta, rows), {"meta": meta, "rows": rows})
    print(render_markdown(meta, rows))
    return {"meta": meta, "rows": rows}


if __name__ == "__main__":
    main()
