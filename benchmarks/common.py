"""Shared pieces of the benchmark suite: schemes, shapes, devices, round-robin timing, peak memory, reports."""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import gc
import json
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hf_relpos
from hf_relpos.model.attention_functions import (
    PROBABILITY_DROPOUT_KERNELS,
    RELPOS_KERNELS,
    check_kernel_device,
)
from hf_relpos.publish.files import write_text_atomic
from hf_relpos.publish.records import checkout_version, cpu_model_name
from hf_relpos.translation.safety import output_folder

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


# The aten operators that make the host wait for the device: a tensor's value read on the host.
HOST_SYNCS = frozenset({"_local_scalar_dense", "is_nonzero", "nonzero", "equal", "allclose"})


class CountOperators(TorchDispatchMode):
    """How many aten operators run inside it (views among them, which launch nothing on a GPU; a torch.library custom
    op counts as one), and how many of them are host syncs."""

    def __init__(self) -> None:
        super().__init__()
        self.operators = 0
        self.syncs: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.operators += 1
        name = func.__name__.split(".")[0]
        if name in HOST_SYNCS:
            self.syncs[name] += 1
        return func(*args, **(kwargs or {}))


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
    as key dropout, the form the fused path runs (for xl, level with probability dropout on validation over 3 seeds)."""
    return "probabilities" if kernel in PROBABILITY_DROPOUT_KERNELS else "keys"


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a count or size of which 0 would measure nothing)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype, --kernel, --attention_dropout, --out, --schemes, --warmup, --repeats, --threads, --clock
    (shared by the scheme benchmarks)."""
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
    parser.add_argument("--out", type=output_folder, default=DEFAULT_RESULTS,
                        help="directory for the .md, .json and .png")
    parser.add_argument("--schemes", nargs="+", choices=tuple(SCHEMES), default=list(SCHEMES))
    parser.add_argument("--warmup", type=non_negative_int, help="untimed rounds before the timed ones")
    parser.add_argument("--repeats", type=positive_int, help="timed rounds (the median is reported)")
    parser.add_argument("--threads", type=positive_int, help="CPU: torch.set_num_threads (default: torch's choice)")
    parser.add_argument(
        "--clock", choices=CLOCKS, default="wall",
        help="wall: elapsed seconds; cpu: the CPU seconds of the timing thread (CPU, --threads 1 only), which other "
             "processes on a shared machine do not inflate",
    )


def check_device_available(device: str) -> None:
    """One clear error where `device` is cuda and this torch sees no GPU (before anything runs or is written)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False (a CPU build of torch?)")


def check_arguments(args: argparse.Namespace) -> None:
    """One clear error for a device, dropout or clock this run cannot use; adds absolute to the schemes and sets
    --threads. Whether the kernels run on the device is `check_kernels_run`'s, in `main` (a documented --device cuda
    command parses on a CPU-only machine)."""
    check_device_available(args.device)
    check_attention_dropout(args.attention_dropout)
    if BASELINE not in args.schemes:
        args.schemes.insert(0, BASELINE)
    if args.clock == "cpu" and (args.device != "cpu" or args.threads != 1):
        raise SystemExit("--clock cpu: needs --device cpu and --threads 1 (the CPU time of the one thread that runs "
                         f"every operator); got --device {args.device} --threads {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)


def check_attention_dropout(value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise SystemExit(f"--attention_dropout: must be in [0, 1), got {value}")


def check_whole_sequence(tokens: int, length: int) -> None:
    """A batch of `tokens` holds at least one sequence of `length` (--tokens and --length)."""
    if tokens < length:
        raise SystemExit(f"--tokens {tokens}: fewer than --length ({length}); a batch holds at least one whole sequence")


def check_kernels_run(kernels: list[str], device: str, flag: str, backward: bool = True) -> None:
    """One clear error, naming `flag`, for a kernel that cannot run on `device`: the model's rule
    (`check_kernel_device`, as train_translation.py and hf-relpos-translate apply it: relpos_triton needs CUDA, or
    Triton's interpreter on the CPU, and triton installed), and flex_attention's backward (`backward`: the run
    trains) on the CPU."""
    for kernel in dict.fromkeys(kernels):
        try:
            check_kernel_device(kernel, torch.device(device))
        except (RuntimeError, ImportError) as error:
            raise SystemExit(f"{flag} {kernel}: {error}") from None
    if device == "cpu" and "flex_attention" in kernels and backward:
        raise SystemExit(f"{flag} flex_attention: training needs --device cuda (FlexAttention has no backward on the "
                         "CPU)")


def check_series(series: list[str]) -> None:
    """One clear error for a --series label that is not scheme@kernel with a known scheme and kernel."""
    for label in series:
        scheme, kernel = scheme_and_kernel(label)
        if scheme not in SCHEMES or kernel not in KERNELS:
            raise SystemExit(f"--series {label}: must be scheme@kernel, scheme one of {', '.join(SCHEMES)}; kernel "
                             f"one of {', '.join(KERNELS)}")


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


@contextlib.contextmanager
def earlier_objects_out_of_collections() -> Iterator[None]:
    """The process's objects from before the block (its imports, a caller's) kept out of the garbage collector's
    passes until its end (gc.freeze): a gc.collect between measurements then walks the benchmark's own objects, not
    the whole heap (0.2 s a call after importing transformers, more in a long-lived process such as a test worker).
    Under a caller's gc.freeze the block leaves the freezing to that caller."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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


def quadratic_memory(lengths: list[int], batches: list[int], peaks: list[float]) -> float:
    """c of the least-squares fit peak = k + a * batch * n + c * batch * n^2, in bytes per sequence and squared length
    (an n x n score tensor costs c = heads * element size, an n x n x d one c = heads * d * element size).

    a is the memory per token, on each batch's own tokens (batch = tokens // n holds fewer where n does not divide
    --tokens); k, what a step holds at any length (the weights' gradients), is fitted where three lengths or more
    determine it. With two lengths it is left out: it then moves every scheme's c alike, so the difference between
    two schemes' c stays exact where their k is the same. Where every batch holds the same tokens, k and a * tokens
    are one constant, and the minimum-norm solution (gelsd) leaves c exact.
    """
    rows = torch.tensor([[*([1.0] if len(lengths) > 2 else []), float(b * n), float(b * n * n)]
                         for n, b in zip(lengths, batches, strict=True)], dtype=torch.float64)
    solution = torch.linalg.lstsq(rows, torch.tensor(peaks, dtype=torch.float64)[:, None], driver="gelsd").solution
    return float(solution[-1])


def environment(device: str, dtype: str, clock: str = "wall", *, command: str) -> dict[str, Any]:
    """Device, processor, versions, code, clock, date and the command of this run, from `benchmarks.command_line` (the
    header of every report)."""
    if device == "cuda":
        device_name = torch.cuda.get_device_name()
    else:
        device_name = cpu_model_name()
    return {
        "command": command,
        "device": device,
        "device_name": device_name,
        "cpu_threads": torch.get_num_threads(),
        "dtype": dtype,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "python": platform.python_version(),
        "code": checkout_version(Path(__file__).resolve().parents[1]),
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
