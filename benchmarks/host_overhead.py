"""The host's time per training step of each series, without a GPU: what a host-bound GPU step pays outside kernels.

The full encoder-decoder (`bench_training.model_case`, training mode, dropout on) runs on the CPU at tiny widths, so
that the host's Python and dispatch work dominates each step, with relpos_triton's kernel launches replaced by no-ops
(under Triton's interpreter they would run the kernels in numpy; their outputs stay uninitialised, denormals are
flushed). Every other operator runs as it does on a GPU, so a series' milliseconds are its host work per step, the
fused path's custom-op or autograd dispatch, launch settings, tables and key ranges included, less Triton's own
launch path. On an H200 the fused path's step was host-bound (docs/results/gpu_check/2026-11-28_h200_8ed37f1).
Series are timed round-robin; ms per step is the median over rounds, each the mean of --steps steps.

    python -m benchmarks.host_overhead --series absolute@sdpa shaw@relpos_triton --out /tmp/host

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
from benchmarks.bench_training import model_case
from benchmarks.common import (
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
def kernels_stubbed() -> Iterator[None]:
    """relpos_triton's Triton launches as no-ops (the forward and both backward kernels, and the backward's Delta),
    denormals flushed; both undone on exit (torch's default keeps denormals)."""
    from hf_relpos.model import triton_relative

    saved = triton_relative.launch, triton_relative.row_deltas, os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"   # the CPU is the kernel's device only under the interpreter
    torch.set_flush_denormal(True)   # the uninitialised outputs must not slow the operators after them
    triton_relative.launch = lambda *args, **settings: None
    triton_relative.row_deltas = lambda grad_output, output, grad_masses, masses, settings: output.new_empty(
        output.shape[:3], dtype=torch.promote_types(output.dtype, torch.float32))
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        triton_relative.launch, triton_relative.row_deltas, interpret = saved
        if interpret is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = interpret


def render_markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    return "\n".join([
        "# The host's time per training step (kernel launches stubbed, CPU)", "", *environment_lines(meta),
        f"- {meta['layers']} + {meta['layers']} layers of d_model {meta['d_model']}, {meta['heads']} heads, n = "
        f"{meta['length']}, batch {meta['batch']}, attention dropout {meta['attention_dropout']:g}; "
        f"{meta['rounds']} round-robin rounds of {meta['steps']} steps after one untimed", "",
        markdown_table(["series", "ms per step", "ms more than the first series", "rounds' spread"],
                       [[row["series"], f"{row['ms']:.2f}", f"{row['extra_ms']:+.2f}", f"{row['spread']:.0%}"]
                        for row in rows]), ""])


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
    parser.add_argument("--out", type=output_folder, required=True)
    args = parser.parse_args(argv)
    check_series(args.series)
    if any(scheme_and_kernel(label)[1] == "flex_attention" for label in args.series):
        raise SystemExit("--series flex_attention: training needs --device cuda (FlexAttention has no backward on the "
                         "CPU), and this benchmark runs on the CPU")
    check_attention_dropout(args.attention_dropout)
    torch.set_num_threads(args.threads)
    shape = HOST_SHAPE
    meta = environment("cpu", "float32", command=command_line("benchmarks.host_overhead", argv)) | {
        "kernel": series_kernels(args.series),
        "layers": shape.layers, "d_model": shape.d_model, "heads": shape.heads, "length": args.length,
        "batch": args.batch, "attention_dropout": args.attention_dropout, "steps": args.steps, "rounds": args.rounds}
    with kernels_stubbed():
        cases = {}
        for label in args.series:
            scheme, kernel = scheme_and_kernel(label)
            cases[label] = model_case(scheme, shape, args.length, args.batch, "cpu", "float32", shape.layers,
                                      shape.vocab_size, kernel, args.attention_dropout)

        def steps(step: Any) -> Any:
            return lambda: [step() for _ in range(args.steps)]

        seconds = round_robin({label: steps(case.step) for label, case in cases.items()}, 1, args.rounds, "cpu")
    per_step = {label: 1e3 * statistics.median(times) / args.steps for label, times in seconds.items()}
    baseline = per_step[args.series[0]]
    rows = [{"series": label, "ms": ms, "extra_ms": ms - baseline,
             "spread": max(seconds[label]) / min(seconds[label]) - 1} for label, ms in per_step.items()]
    write_report(args.out, "host_overhead", render_markdown(meta, rows), {"meta": meta, "rows": rows})
    print(render_markdown(meta, rows))
    return {"meta": meta, "rows": rows}


if __name__ == "__main__":
    main()
