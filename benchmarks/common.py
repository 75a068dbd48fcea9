"""Shared pieces of the benchmark suite: schemes, shapes, devices, round-robin timing, peak memory, reports."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import hf_relpos
from hf_relpos.model.attention_functions import PROBABILITY_DROPOUT_KERNELS, RELPOS_KERNELS
from hf_relpos.publish.files import write_text_atomic
from hf_relpos.publish.records import cpu_model_name, source_version

# Benchmark label -> config overrides: every registered scheme under its own name, and "shaw-k", Shaw's a^K without
# the a^V term ("shaw" is the paper's a^K + a^V).
VARIANTS: dict[str, dict[str, Any]] = {"shaw-k": {"position_scheme": "shaw", "use_relative_values": False}}
SCHEMES: dict[str, dict[str, Any]] = {**{name: {"position_scheme": name} for name in hf_relpos.POSITION_SCHEMES},
                                      **VARIANTS}
BASELINE = "absolute"
KERNELS = tuple(dict.fromkeys(("sdpa", "eager", "flex_attention", *RELPOS_KERNELS)))
DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Shape:
    """Model dimensions; `layers` is per stack (encoder and decoder)."""

    d_model: int
    heads: int
    ffn_dim: int
    layers: int
    vocab_size: int


SHAPES: dict[str, Shape] = {
    "base": Shape(d_model=512, heads=8, ffn_dim=2048, layers=6, vocab_size=32768),  # WMT base (Vaswani et al.)
    "small": Shape(d_model=256, heads=4, ffn_dim=1024, layers=3, vocab_size=8000),
    "tiny": Shape(d_model=32, heads=4, ffn_dim=64, layers=1, vocab_size=64),  # smoke tests only
}


def make_config(
    scheme: str, shape: Shape, layers: int | None = None, vocab_size: int | None = None, kernel: str = "sdpa",
    attention_dropout: float = 0.0,
) -> hf_relpos.RelPosTransformerConfig:
    """Config of `shape` with the position scheme of benchmark label `scheme`, layers/vocabulary optionally reduced,
    attention running through `kernel` ("sdpa", "eager", "flex_attention" or "relpos_triton") with attention dropout
    `attention_dropout` (in training mode) in the form `dropout_kind(kernel)` gives."""
    layers = shape.layers if layers is None else layers
    config = hf_relpos.RelPosTransformerConfig(
        vocab_size=shape.vocab_size if vocab_size is None else vocab_size,
        d_model=shape.d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn_dim,
        decoder_ffn_dim=shape.ffn_dim,
        attention_dropout=attention_dropout,
        attention_dropout_kind=dropout_kind(kernel),
        **SCHEMES[scheme],
    )
    config._attn_implementation = kernel
    return config


def scheme_and_kernel(series: str) -> tuple[str, str]:
    """(scheme, kernel) of a series label `scheme@kernel` (`scheme` alone: sdpa)."""
    scheme, _, kernel = series.partition("@")
    return scheme, kernel or "sdpa"


def series_kernels(series: list[str]) -> str:
    """The kernels the series run on, each once in order of appearance, for a report's header."""
    return " / ".join(dict.fromkeys(scheme_and_kernel(label)[1] for label in series))


def dropout_kind(kernel: str) -> str:
    """The recipes' attention dropout as `kernel` runs it: on the probabilities where it can, else (flex_attention)
    as key dropout, the form the fused path runs (issue #47 item 8: level with it on validation for xl, 3 seeds)."""
    return "probabilities" if kernel in PROBABILITY_DROPOUT_KERNELS else "keys"


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype, --kernel, --attention_dropout, --out, --quick, --schemes, --warmup, --repeats (shared by
    every benchmark script)."""
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="bfloat16 = autocast (weights stay fp32)"
    )
    parser.add_argument(
        "--kernel", choices=KERNELS, default="sdpa",
        help="attention kernel of every scheme (flex_attention: compiled on CUDA; relpos_triton: Shaw's a^K and a^V in "
        "one Triton kernel on CUDA, the other schemes on sdpa)",
    )
    parser.add_argument(
        "--attention_dropout", "--attention-dropout", type=float, default=0.0,
        help="attention dropout in training mode: on the probabilities, or as key dropout on flex_attention, which "
             "cannot drop probabilities",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help="directory for the .md, .json and .png")
    parser.add_argument("--quick", action="store_true", help="CPU-sized subset (see the script's help)")
    parser.add_argument("--schemes", nargs="+", choices=tuple(SCHEMES), default=list(SCHEMES))
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds before the timed ones")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (the median is reported)")
    parser.add_argument("--threads", type=int, help="CPU: torch.set_num_threads (default: torch's choice)")
    parser.add_argument(
        "--clock", choices=CLOCKS, default="wall",
        help="wall: elapsed seconds; cpu: the CPU seconds of the timing thread (CPU, --threads 1 only), which other "
             "processes on a shared machine do not inflate",
    )


def check_arguments(args: argparse.Namespace) -> None:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False (a CPU build of torch?)")
    if not 0.0 <= args.attention_dropout < 1.0:
        raise SystemExit(f"--attention_dropout: must be in [0, 1), got {args.attention_dropout}")
    if BASELINE not in args.schemes:
        args.schemes.insert(0, BASELINE)
    if args.clock == "cpu" and (args.device != "cpu" or args.threads != 1):
        raise SystemExit("--clock cpu: needs --device cpu and --threads 1 (the CPU time of the one thread that runs "
                         f"every operator); got --device {args.device} --threads {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)


def autocast(device: str, dtype: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for --dtype bfloat16, nothing for float32."""
    if dtype == "bfloat16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def timed(run: Callable[[], Any], device: str, clock: str = "wall") -> float:
    """Seconds of one call on `clock` (CLOCKS), with the GPU queue drained before and after."""
    now = CLOCKS[clock]
    synchronize(device)
    start = now()
    run()
    synchronize(device)
    return now() - start


def round_robin(runs: dict[str, Callable[[], Any]], warmup: int, repeats: int, device: str,
                clock: str = "wall") -> dict[str, list[float]]:
    """Seconds per call for every entry, `repeats` timed rounds after `warmup` untimed ones.

    Each round runs every entry once, and the starting entry rotates from round to round, so that load drift (other
    processes on the machine, thermal or clock changes) hits all entries alike.
    """
    names = list(runs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_idx in range(warmup + repeats):
        shift = round_idx % len(names)
        for name in names[shift:] + names[:shift]:
            elapsed = timed(runs[name], device, clock)
            if round_idx >= warmup:
                seconds[name].append(elapsed)
    return seconds


def paired_ratio(seconds: list[float], baseline_seconds: list[float]) -> float:
    """Median over rounds of baseline time / this time: the speed relative to the baseline in the same round."""
    return statistics.median(base / own for base, own in zip(baseline_seconds, seconds, strict=True))


def peak_memory(run: Callable[[], Any], device: str) -> int:
    """Peak bytes of torch tensor memory allocated by one call, above what was allocated before it.

    CUDA: the caching allocator's `max_memory_allocated`. CPU: the profiler's allocator events
    (`profile_memory=True` records every tensor allocation and free with its size and time); their running sum's
    maximum is the peak. Unlike RSS, this counts exactly the tensors, ignores the allocator's and the OS's page
    reuse, and does not depend on what other processes do.
    """
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as profiler:
        run()
    events = [event for event in profiler.profiler.kineto_results.events() if event.name() == "[memory]"]
    events.sort(key=lambda event: event.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def fit_quadratic_memory(lengths: list[int], batches: list[int], peaks: list[float], tokens: int) -> tuple[float, float]:
    """Least-squares fit of peak = a * tokens + c * batch * n^2; returns (a, c) in bytes.

    With a fixed token count per batch, a is the per-token (linear) memory and c the memory per sequence and squared
    length: an n x n score tensor costs c = heads * element size, an n x n x d one c = heads * d * element size.
    """
    rows = torch.tensor([[float(tokens), float(b * n * n)] for n, b in zip(lengths, batches, strict=True)])
    solution = torch.linalg.lstsq(rows.double(), torch.tensor(peaks, dtype=torch.float64)[:, None]).solution
    return float(solution[0]), float(solution[1])


def environment(device: str, dtype: str, clock: str = "wall") -> dict[str, Any]:
    """Device, processor, versions, code, clock, date and command line of this run (the header of every report)."""
    if device == "cuda":
        device_name = torch.cuda.get_device_name()
    else:
        device_name = cpu_model_name()
    return {
        "command": " ".join(["python -m benchmarks." + Path(sys.argv[0]).stem, *sys.argv[1:]]),
        "device": device,
        "device_name": device_name,
        "cpu_threads": torch.get_num_threads(),
        "dtype": dtype,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "python": platform.python_version(),
        "code": source_version(Path(__file__).resolve().parents[1]),
        "clock": clock,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(out: Path, stem: str, markdown: str, data: dict[str, Any]) -> tuple[Path, Path]:
    """Writes `stem`.md and `stem`.json into `out` (each whole or not at all: a benchmark rewrites them as it goes);
    returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    markdown_path, json_path = out / f"{stem}.md", out / f"{stem}.json"
    write_text_atomic(markdown_path, markdown + "\n")
    write_text_atomic(json_path, json.dumps(data, indent=2) + "\n")
    return markdown_path, json_path


def environment_lines(meta: dict[str, Any]) -> Iterator[str]:
    yield f"- command: `{meta['command']}`"
    yield (f"- device: {meta['device']} ({meta['device_name']}, {meta['cpu_threads']} CPU threads), dtype "
           f"{meta['dtype']}, attention kernel {meta['kernel']}")
    yield f"- torch {meta['torch']}, transformers {meta['transformers']}, python {meta['python']}, {meta['date']}"
    if "code" in meta:   # records before these fields: wall clock, code version not recorded
        yield f"- code `{meta['code']}`, clock: {meta['clock']}"
