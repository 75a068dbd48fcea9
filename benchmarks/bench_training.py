"""Training throughput and peak memory of every position scheme, relative to `absolute` in the same run.

Two benchmarks, each forward + backward at a fixed token count per batch (batch = tokens // length):
  attention  one encoder self-attention layer alone (`RelPosAttention` + the stack's `PositionScheme`)
  model      the full encoder-decoder (`RelPosTransformerForConditionalGeneration` with labels)
The schemes run round-robin (the starting scheme rotates each round), so load drift hits them alike; each row gives
the median tokens/s and the median over rounds of the speed ratio to `absolute` in the same round.

    python -m benchmarks.bench_training --quick          # CPU-sized subset
    python -m benchmarks.bench_training --dtype bfloat16  # the full suite (on a GPU)
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import command_line
from benchmarks.common import (
    BASELINE,
    KERNELS,
    SHAPES,
    Shape,
    add_common_arguments,
    autocast,
    check_arguments,
    check_kernels_run,
    dropout_kind,
    earlier_objects_out_of_collections,
    environment,
    environment_lines,
    make_config,
    markdown_table,
    paired_ratio,
    peak_memory,
    positive_int,
    quadratic_memory,
    round_robin,
    timed,
    write_report,
)
from hf_relpos import RelPosTransformerForConditionalGeneration
from hf_relpos.model.attention_functions import compiled_graph_count
from hf_relpos.model.modeling_relpos import RelPosEncoder, attention_mask_for, with_scheme_mask
from hf_relpos.model.positions import PositionContext
from hf_relpos.tools.viz import require_matplotlib, save_figure

BENCHMARKS = ("attention", "model")
MIB = 2**20


@dataclass
class Case:
    """One scheme at one shape and length: `step()` runs one forward + backward of `tokens` tokens; `forward()`,
    where given, the step's forward alone (gradients zeroed first), returning the loss that `step()` backpropagates;
    `inputs`, the leaf tensors besides the module's parameters whose gradients the step computes."""

    module: nn.Module
    step: Callable[[], None]
    tokens: int
    forward: Callable[[], torch.Tensor] | None = None
    inputs: tuple[torch.Tensor, ...] = ()

    def clear_gradients(self) -> None:
        """Frees every gradient the step computes: the module's parameters' and the inputs'."""
        self.module.zero_grad(set_to_none=True)
        for tensor in self.inputs:
            tensor.grad = None


def attention_case(
    scheme: str, shape: Shape, length: int, batch: int, device: str, dtype: str, kernel: str = "sdpa",
    attention_dropout: float = 0.0,
) -> Case:
    """Self-attention of an encoder's first layer with the encoder's position scheme (embed + terms + kernel)."""
    stack = RelPosEncoder(make_config(scheme, shape, layers=1, kernel=kernel, attention_dropout=attention_dropout))
    stack.positions.init_parameters(stack.config.init_std)
    module = nn.ModuleDict({"scheme": stack.positions, "attention": stack.layers[0].self_attn}).to(device).train()
    inputs = torch.randn(batch, length, shape.d_model, device=device, requires_grad=True)

    def step() -> None:
        module.zero_grad(set_to_none=True)
        inputs.grad = None
        with autocast(device, dtype):
            hidden = module["scheme"].embed(inputs, 0)
            context = module["scheme"].prepare(PositionContext(length, length, 0, None, hidden.device, hidden.dtype))
            mask = with_scheme_mask(stack.config, module["scheme"], context, attention_mask_for(
                stack.config, batch, length, length, 0, None, causal=False, device=hidden.device))
            output, _ = module["attention"](hidden, mask, module["scheme"], position_context=context)
        output.float().sum().backward()

    return Case(module, step, batch * length, inputs=(inputs,))


def model_case(
    scheme: str, shape: Shape, length: int, batch: int, device: str, dtype: str, layers: int, vocab_size: int,
    kernel: str = "sdpa", attention_dropout: float = 0.0, compile_backend: str | None = None,
) -> Case:
    """The full encoder-decoder on random source/target ids of `length` tokens each (training mode, dropout on);
    with `compile_backend`, run through torch.compile(model, backend=...), as the Trainer's `torch_compile` does."""
    torch.manual_seed(0)
    config = make_config(scheme, shape, layers, vocab_size, kernel, attention_dropout)
    model = RelPosTransformerForConditionalGeneration(config).to(device).train()
    runner = model if compile_backend is None else torch.compile(model, backend=compile_backend)
    source = torch.randint(4, vocab_size, (batch, length), device=device)
    labels = torch.randint(4, vocab_size, (batch, length), device=device)

    def forward() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            return runner(input_ids=source, labels=labels).loss

    def step() -> None:
        forward().backward()

    return Case(model, step, 2 * batch * length, forward)


def series_labels(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(label, scheme, kernel) of every measured series: the scheme's name for one kernel, scheme@kernel for several."""
    if len(args.kernels) == 1:
        return [(scheme, scheme, args.kernels[0]) for scheme in args.schemes]
    return [(f"{scheme}@{kernel}", scheme, kernel) for kernel in args.kernels for scheme in args.schemes]


def baseline_labels(args: argparse.Namespace) -> list[str]:
    return [label for label, scheme, _ in series_labels(args) if scheme == BASELINE]


class GraphsGrew(RuntimeError):
    """FlexAttention or torch.compile compiled a graph during the timed rounds: the timings would include compiles."""


def compiled_graphs() -> tuple[int, int]:
    """How many graphs FlexAttention and torch.compile (dynamo) have compiled in this process."""
    return compiled_graph_count(), torch._dynamo.utils.counters["stats"]["unique_graphs"]


def measure(cases: dict[str, Case], args: argparse.Namespace) -> tuple[dict[str, dict[str, float]], str]:
    """Warm-up rounds, then round-robin timing, then one peak-memory measurement per series (gradients cleared
    before it). Ratios are to absolute on its fastest kernel (the returned label). The compiled FlexAttention graphs
    and torch.compile's graphs must not grow after the warm-up (`GraphsGrew`); a fallback to the unfused kernel raises
    in the kernel itself."""
    first_call = dict.fromkeys(cases)   # the first warm-up round, timed per case: it holds compiles and autotuning
    for name, case in cases.items() if args.warmup else ():
        first_call[name] = timed(case.step, args.device, args.clock)
        print(f"first call {name}: {first_call[name]:.1f} s", flush=True)
    round_robin({name: case.step for name, case in cases.items()}, max(args.warmup - 1, 0), 0, args.device,
                args.clock)
    graphs = compiled_graphs()
    seconds = round_robin({name: case.step for name, case in cases.items()}, 0, args.repeats, args.device, args.clock)
    after = compiled_graphs()
    if after != graphs:
        flex, dynamo = (now - before for now, before in zip(after, graphs, strict=True))
        raise GraphsGrew(f"FlexAttention compiled {flex} and torch.compile {dynamo} graph(s) during the timed rounds "
                         f"(after {args.warmup} warm-up rounds): raise --warmup or pad the lengths")
    baseline = min(baseline_labels(args), key=lambda label: statistics.median(seconds[label]))
    results = {}
    for name, case in cases.items():
        case.clear_gradients()   # a gradient left from the timed rounds, freed in the call, would leave the peak
        results[name] = {
            "tokens_per_s": case.tokens / statistics.median(seconds[name]),
            "ratio": paired_ratio(seconds[name], seconds[baseline]),
            "peak_bytes": peak_memory(case.step, args.device),
            "seconds": seconds[name],
            "first_call_s": first_call[name],
        }
    return results, baseline


def run_benchmarks(args: argparse.Namespace, save: Callable[[list[dict[str, Any]]], None] | None = None
                   ) -> list[dict[str, Any]]:
    """One row per benchmark, shape, length and scheme; `save(rows)` after each length, so that a run cut off by a
    time limit keeps what it measured."""
    rows = []
    for benchmark in args.benchmarks:
        tokens = args.tokens if benchmark == "attention" else args.model_tokens
        lengths = args.lengths if benchmark == "attention" else args.model_lengths
        for shape_name in args.shapes:
            shape = SHAPES[shape_name]
            if benchmark == "attention":
                layers = 1
            else:
                layers = shape.layers if args.layers is None else args.layers
            for length in lengths:
                batch = tokens // length
                torch.manual_seed(0)
                vocab_size = shape.vocab_size if args.vocab_size is None else args.vocab_size
                cases = {
                    label: attention_case(scheme, shape, length, batch, args.device, args.dtype, kernel,
                                          args.attention_dropout)
                    if benchmark == "attention"
                    else model_case(scheme, shape, length, batch, args.device, args.dtype, layers, vocab_size, kernel,
                                    args.attention_dropout, args.compile_backend)
                    for label, scheme, kernel in series_labels(args)
                }
                results, baseline = measure(cases, args)
                baseline_peak = results[baseline]["peak_bytes"]
                kernels = {label: kernel for label, _, kernel in series_labels(args)}
                for scheme, result in results.items():
                    rows.append(
                        {
                            "benchmark": benchmark,
                            "shape": shape_name,
                            "layers": layers,
                            "length": length,
                            "batch": batch,
                            "scheme": scheme,
                            "kernel": kernels[scheme],
                            "baseline": baseline,
                            "baseline_kernel": kernels[baseline],
                            "tokens_per_s": result["tokens_per_s"],
                            "ratio": result["ratio"],
                            "peak_mib": result["peak_bytes"] / MIB,
                            "memory_overhead": result["peak_bytes"] / baseline_peak - 1.0,
                            "seconds": result["seconds"],
                            "first_call_s": result["first_call_s"],
                            "compiled_graphs": compiled_graph_count(),
                        }
                    )
                    print(format_row(rows[-1]), flush=True)
                if save is not None:
                    save(rows)
                del cases, results
                gc.collect()
    return rows


def memory_growth(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per benchmark, shape and scheme: how peak memory grows with the length.

    `bytes_per_score` is the fitted n^2 memory beyond absolute's, per self-attention score element (batch x heads x
    n x n x self-attention layers): a few bytes for extra n x n tensors, >= head_dim x element size for an
    n x n x d one. `peak_ratio_2n` is peak(2n) / peak(n) at the two longest lengths, and `exponent` the growth of
    the per-sequence peak between them (peak / batch ~ n^exponent).
    """
    element_size = 2 if args.dtype == "bfloat16" else 4
    growth = []
    groups = sorted({(row["benchmark"], row["shape"]) for row in rows}, key=str)
    for benchmark, shape_name in groups:
        shape = SHAPES[shape_name]
        fits = {}
        for scheme, _, _ in series_labels(args):
            series = sorted(
                (r for r in rows if (r["benchmark"], r["shape"], r["scheme"]) == (benchmark, shape_name, scheme)),
                key=lambda r: r["length"],
            )
            lengths, batches = [r["length"] for r in series], [r["batch"] for r in series]
            peaks = [r["peak_mib"] * MIB for r in series]
            fits[scheme] = (series, quadratic_memory(lengths, batches, peaks) if len(series) > 1 else 0.0)
        for scheme, (series, quadratic) in fits.items():
            if len(series) < 2:   # one length: no growth measured
                continue
            self_attention_layers = series[0]["layers"] * (1 if benchmark == "attention" else 2)
            per_score = (quadratic - fits[baseline_labels(args)[0]][1]) / (shape.heads * self_attention_layers)
            entry = {"benchmark": benchmark, "shape": shape_name, "scheme": scheme, "extra_bytes_per_score": per_score}
            last, before = series[-1], series[-2]
            peak_ratio = last["peak_mib"] / before["peak_mib"]
            entry["peak_ratio_2n"] = peak_ratio
            entry["exponent"] = math.log(peak_ratio * before["batch"] / last["batch"], last["length"] / before["length"])
            entry["n2d_threshold_bytes"] = (shape.d_model // shape.heads) * element_size
            entry["grows_like"] = "n^2" if per_score < entry["n2d_threshold_bytes"] else "n^2 d"
            growth.append(entry)
    return growth


def format_row(row: dict[str, Any]) -> str:
    return (
        f"{row['benchmark']:9} {row['shape']:5} n={row['length']:<5} batch={row['batch']:<4} {row['scheme']:22} "
        f"{row['tokens_per_s']:10.0f} tok/s  x{row['ratio']:.3f}  peak {row['peak_mib']:8.1f} MiB "
        f"({row['memory_overhead']:+.1%})"
    )


# relpos_triton's autotuned kernels, named as hf_relpos.model.triton_relative_kernels defines them
TUNED_KERNELS = ("tuned_forward", "tuned_backward_keys", "tuned_backward_queries")


def relpos_triton_tuning() -> dict[str, dict[str, str]]:
    """The block sizes relpos_triton's autotuner chose, per kernel and compile-time key (empty until its kernels ran
    compiled: the interpreter does not autotune)."""
    kernels = sys.modules.get("hf_relpos.model.triton_relative_kernels")
    if kernels is None:
        return {}
    return {name: {str(key): str(config) for key, config in getattr(kernels, name).cache.items()}
            for name in TUNED_KERNELS}


def compile_lines(meta: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The first call of each series (its compiles and autotuning) and relpos_triton's autotuned blocks, where the
    record has them."""
    lines = []
    if rows and rows[0].get("first_call_s") is not None:
        calls = ", ".join(f"{row['scheme']} (n = {row['length']}) {row['first_call_s']:.1f} s" for row in rows)
        lines.append(f"- first call per series (compiles, autotuning): {calls}")
    for kernel, tuned in meta.get("relpos_triton_tuning", {}).items():
        if tuned:
            lines.append(f"- relpos_triton's autotuned blocks, {kernel}: "
                         + "; ".join(f"{key}: {config}" for key, config in tuned.items()))
    return lines


def render_markdown(meta: dict[str, Any], rows: list[dict[str, Any]], growth: list[dict[str, Any]]) -> str:
    header = ["benchmark", "shape", "layers", "n", "batch", "scheme", "tokens/s", "ratio to absolute", "peak MiB",
              "memory vs absolute", "kernel", "absolute's kernel"]
    table = [  # records written before --kernels have one kernel for every row (meta)
        [r["benchmark"], r["shape"], r["layers"], r["length"], r["batch"], r["scheme"], f"{r['tokens_per_s']:.0f}",
         f"{r['ratio']:.3f}", f"{r['peak_mib']:.1f}", f"{r['memory_overhead']:+.1%}",
         r.get("kernel", meta["kernel"]), r.get("baseline_kernel", meta["kernel"])]
        for r in rows
    ]
    growth_table = [  # records written before single-length series were left out hold them without an exponent
        [g["benchmark"], g["shape"], g["scheme"], f"{g['peak_ratio_2n']:.2f}", f"{g['exponent']:.2f}",
         f"{g['extra_bytes_per_score']:.1f}", g["n2d_threshold_bytes"], g["grows_like"]]
        for g in growth if "exponent" in g
    ]
    growth_section = [
        "## Memory growth with length",
        "",
        "peak(2n)/peak(n) at the two longest lengths (fixed tokens), exponent of the per-sequence peak "
        "(peak/batch ~ n^e), and the fitted n^2 memory beyond absolute's per self-attention score element "
        "(an n x n x d tensor would cost >= the threshold).",
        "",
        markdown_table(["benchmark", "shape", "scheme", "peak(2n)/peak(n)", "exponent", "extra bytes / score",
                        "n^2 d threshold", "grows like"], growth_table),
    ] if growth_table else ["Memory growth with length: not measured (one length per series)."]
    return "\n".join(
        [
            "# Training throughput (forward + backward) and peak memory",
            "",
            *environment_lines(meta),
            f"- tokens per batch: {meta['tokens']} (attention), {meta['model_tokens']} source + as many target "
            f"(model); full model: {meta['model_layers']} vocabulary {meta['vocab_size']}",
            *([f"- attention dropout: {meta['attention_dropout']}" + dropout_kinds_text(meta)]
              if "attention_dropout" in meta else []),
            f"- {meta['warmup']} warm-up + {meta['repeats']} timed rounds, schemes round-robin; tokens/s = median; "
            "ratio = median over rounds of absolute's time / the scheme's time in the same round, absolute on its "
            "fastest kernel of the run",
            *([f"- every model through torch.compile (backend {meta['torch_compile']}), as the Trainer's "
               "torch_compile runs it"] if meta.get("torch_compile") else []),
            f"- peak memory: {meta['memory_method']}",
            *([f"- compiled FlexAttention graphs in the process: {rows[-1]['compiled_graphs']} (none compiled during "
               "the timed rounds)"] if rows and "compiled_graphs" in rows[-1] else []),
            *compile_lines(meta, rows),
            "",
            markdown_table(header, table),
            "",
            *growth_section,
        ]
    )


def plot(rows: list[dict[str, Any]], schemes: list[str], path: Path) -> None:
    """Ratio to absolute (left) and peak memory (right) against the length, one line per scheme and series
    (`schemes`: the series labels, scheme or scheme@kernel), written to `path` through `save_figure` (whole or not
    at all)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (ratio_axis, memory_axis) = plt.subplots(1, 2, figsize=(13, 5))
    series = sorted({(r["benchmark"], r["shape"]) for r in rows}, key=str)
    styles = ["-", "--", ":", "-."]
    colors = {scheme: f"C{idx}" for idx, scheme in enumerate(schemes)}
    for (benchmark, shape), style in zip(series, styles * len(series), strict=False):
        for scheme in schemes:
            points = sorted(
                (r["length"], r["ratio"], r["peak_mib"])
                for r in rows
                if (r["benchmark"], r["shape"], r["scheme"]) == (benchmark, shape, scheme)
            )
            lengths, ratios, peaks = zip(*points, strict=True)
            label = f"{scheme} ({benchmark}, {shape})"
            if not scheme.startswith(BASELINE):
                ratio_axis.plot(lengths, ratios, style, marker="o", color=colors[scheme], label=label)
            memory_axis.plot(lengths, peaks, style, marker="o", color=colors[scheme], label=label)
    ratio_axis.axhline(1.0, color="grey", linewidth=0.8)
    ratio_axis.set(xscale="log", xlabel="length n", ylabel="training tokens/s relative to absolute",
                   title="Speed ratio to absolute (same run)")
    memory_axis.set(xscale="log", yscale="log", xlabel="length n", ylabel="peak MiB (forward + backward)",
                    title="Peak memory at a fixed token count")
    for axis in (ratio_axis, memory_axis):
        axis.set_xticks(sorted({r["length"] for r in rows}), labels=[str(n) for n in sorted({r["length"] for r in rows})])
        axis.grid(alpha=0.3)
    memory_axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    try:
        save_figure(figure, path, dpi=120)
    finally:
        plt.close(figure)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--quick", action="store_true",
                        help="CPU-sized defaults: 2048 tokens per batch for one attention layer, a 1 + 1-layer model "
                        "with an 8000-token vocabulary at n = 64, 128, 256 (512 source tokens), 1 warm-up + 4 timed "
                        "rounds")
    parser.add_argument("--benchmarks", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=["base", "small"])
    parser.add_argument("--lengths", nargs="+", type=positive_int, help="attention benchmark (default 64 .. 1024)")
    parser.add_argument("--model-lengths", nargs="+", type=positive_int, help="model benchmark (default: --lengths)")
    parser.add_argument("--tokens", type=positive_int, help="tokens per batch, attention benchmark (default 16384)")
    parser.add_argument("--model-tokens", type=positive_int,
                        help="source tokens per batch, model benchmark (default --tokens)")
    parser.add_argument("--layers", type=positive_int, help="full model: layers per stack (default: the shape's)")
    parser.add_argument("--vocab-size", type=positive_int, help="full model: vocabulary (default: the shape's)")
    parser.add_argument("--kernels", nargs="+", choices=KERNELS,
                        help="measure every scheme on each of these kernels in one round-robin (default: --kernel); "
                        "ratios are then to absolute on its fastest kernel")
    parser.add_argument("--compile", action="store_true",
                        help="model benchmark: every model through torch.compile, as the Trainer's torch_compile runs "
                        "it")
    parser.add_argument("--compile_backend",
                        help="torch.compile's backend with --compile (the Trainer's torch_compile_backend; default "
                        "inductor)")
    args = parser.parse_args(argv)
    if args.compile and "attention" in args.benchmarks:
        raise SystemExit("--compile: compiles the model benchmark only; pass --benchmarks model")
    if args.compile_backend and not args.compile:
        raise SystemExit("--compile_backend: names the backend of --compile; pass --compile too")
    if args.compile:
        args.compile_backend = args.compile_backend or "inductor"
    if args.kernels is None:
        args.kernels = [args.kernel]
    check_arguments(args)
    quick = args.quick
    if args.lengths is None:
        args.lengths = [64, 128, 256, 512, 1024]
    if args.model_lengths is None:
        args.model_lengths = [64, 128, 256] if quick else args.lengths
    if args.tokens is None:
        args.tokens = 2048 if quick else 16384
    if args.model_tokens is None:
        args.model_tokens = 512 if quick else args.tokens
    if args.layers is None and quick:
        args.layers = 1
    if args.vocab_size is None and quick:
        args.vocab_size = 8000
    if args.warmup is None:
        args.warmup = 1 if quick else 3
    if args.repeats is None:
        args.repeats = 4 if quick else 10
    for benchmark, tokens_flag, tokens, lengths_flag, lengths in (
            ("attention", "--tokens", args.tokens, "--lengths", args.lengths),
            ("model", "--model-tokens", args.model_tokens, "--model-lengths", args.model_lengths)):
        if benchmark in args.benchmarks and tokens < max(lengths):
            raise SystemExit(f"{tokens_flag} {tokens}: fewer than the longest of {lengths_flag} ({max(lengths)}); a "
                             "batch holds at least one whole sequence")
    return args


def dropout_kinds_text(meta: dict[str, Any]) -> str:
    """` (on the probabilities: sdpa; key dropout: flex_attention)` for a record with attention dropout, else ""."""
    kinds = meta.get("attention_dropout_kinds", {})
    parts = [f"{'on the probabilities' if kind == 'probabilities' else 'key dropout'}: "
             f"{', '.join(kernel for kernel, each in kinds.items() if each == kind)}"
             for kind in dict.fromkeys(kinds.values())]
    return f" ({'; '.join(parts)})" if parts else ""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmarks, writes training.{md,json,png} into --out and returns the JSON data."""
    args = parse_args(argv)
    check_kernels_run(args.kernels, args.device, "--kernel" if args.kernels == [args.kernel] else "--kernels")
    require_matplotlib()  # fail before training, not after, when the `viz` extra is missing
    torch.manual_seed(0)
    meta = environment(args.device, args.dtype, args.clock,
                       command=command_line("benchmarks.bench_training", argv)) | {
        "kernel": " / ".join(args.kernels),
        "tokens": args.tokens,
        "model_tokens": args.model_tokens,
        "model_layers": (f"{args.layers} + {args.layers} layers" if args.layers is not None
                         else "the shape's layers (" + ", ".join(f"{name} {SHAPES[name].layers} + {SHAPES[name].layers}"
                                                                 for name in args.shapes) + "),"),
        "vocab_size": (args.vocab_size if args.vocab_size is not None
                       else "of the shape (" + ", ".join(f"{name} {SHAPES[name].vocab_size}" for name in args.shapes)
                       + ")"),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "attention_dropout": args.attention_dropout,
        "torch_compile": args.compile_backend,
        **({"attention_dropout_kinds": {kernel: dropout_kind(kernel) for kernel in args.kernels}}
           if args.attention_dropout > 0 else {}),
        "memory_method": "torch.cuda.max_memory_allocated above the pre-step allocation"
        if args.device == "cuda"
        else "running sum of the torch profiler's allocator events (profile_memory=True), max above the start",
    }

    def save(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], str, tuple[Path, Path]]:
        growth = memory_growth(rows, args)
        meta["relpos_triton_tuning"] = relpos_triton_tuning()
        data = {"meta": meta, "training": rows, "memory_growth": growth}
        markdown = render_markdown(meta, rows, growth)
        return data, markdown, write_report(args.out, "training", markdown, data)

    with earlier_objects_out_of_collections():
        rows = run_benchmarks(args, save)
    data, markdown, (markdown_path, json_path) = save(rows)
    plot(rows, [label for label, _, _ in series_labels(args)], args.out / "training.png")
    print(markdown)
    print(f"\nwrote {markdown_path}, {json_path}, {args.out / 'training.png'}")
    return data


if __name__ == "__main__":
    main()
