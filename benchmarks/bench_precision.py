"""bf16 training against float32 eager: one model, one initialisation and one stream of batches,
trained --steps steps three ways: float32 on `eager` (the reference), bf16 autocast on --kernel, and bf16 autocast on
`eager` (what bf16 alone changes), in that order, the record rewritten after each. Records every step's loss of each
run and each bf16 run's deviation from the reference, largest and over the last tenth of the steps. The kernel is
"within bf16" when both its deviations are at most --tolerance times bf16 eager's.

The task is copying random token sequences (a length-n source, the same sequence as target), which the model learns
within a few hundred steps, so the curve falls. Dropout and attention dropout are 0 in every run: the kernels draw
their dropout masks differently, and the comparison is of arithmetic, not of masks.

    python -m benchmarks.bench_precision --device cuda --kernel relpos_triton --scheme shaw --steps 300
    python -m benchmarks.bench_precision --quick      # CPU: the tiny shape, 6 steps, sdpa
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import command_line
from benchmarks.common import (
    KERNELS,
    SCHEMES,
    SHAPES,
    Shape,
    autocast,
    check_device_available,
    check_kernels_run,
    check_whole_sequence,
    environment,
    environment_lines,
    make_config,
    markdown_table,
    positive_int,
    write_report,
)
from hf_relpos import RelPosTransformerConfig, RelPosTransformerForConditionalGeneration
from hf_relpos.translation.safety import output_folder

# The flags --quick sizes for the CPU, and their values with and without it (a value given on the command line stays).
FULL_SIZE = {"shape": "base", "steps": 300, "length": 128, "tokens": 8192, "warmup_steps": 50}
QUICK_SIZE = {"shape": "tiny", "steps": 6, "length": 16, "tokens": 64, "warmup_steps": 2}


def precision_config(scheme: str, shape: Shape, layers: int | None, vocab_size: int | None,
                     kernel: str) -> RelPosTransformerConfig:
    """`make_config` with every dropout 0 (the runs must differ only by kernel and dtype)."""
    config = make_config(scheme, shape, layers, vocab_size, kernel)
    config.dropout = config.activation_dropout = config.attention_dropout = 0.0
    return config


def copy_batches(steps: int, batch: int, length: int, vocab_size: int, seed: int) -> list[torch.Tensor]:
    """`steps` batches of random ids in [4, vocab_size) (0-3 are the special tokens), [batch, length] each."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab_size, (batch, length), generator=generator) for _ in range(steps)]


def train_curve(initial: dict[str, torch.Tensor], config_of: Any, kernel: str, dtype: str, batches: list[torch.Tensor],
                device: str, learning_rate: float, warmup: int) -> list[float]:
    """The loss of every step of AdamW (linear warm-up over `warmup` steps, gradients clipped at 1) from the weights
    `initial`, attention on `kernel`, under `dtype` autocast (float32: none)."""
    model = RelPosTransformerForConditionalGeneration(config_of(kernel)).to(device).train()
    model.load_state_dict(initial)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    losses = []
    for ids in batches:
        ids = ids.to(device)
        with autocast(device, dtype):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def deviations(losses: list[float], reference: list[float]) -> dict[str, float]:
    """The largest |loss - reference| over the steps, and its mean over the last tenth of them."""
    gaps = [abs(a - b) for a, b in zip(losses, reference, strict=True)]
    tail = gaps[-max(1, len(gaps) // 10):]
    return {"max_deviation": max(gaps), "final_deviation": statistics.mean(tail)}


def within_bf16(candidate: dict[str, float], bf16_eager: dict[str, float], tolerance: float) -> bool:
    """Whether the candidate's largest and final deviations are each at most `tolerance` times bf16 eager's."""
    return all(candidate[key] <= tolerance * bf16_eager[key] for key in ("max_deviation", "final_deviation"))


def run(args: argparse.Namespace, command: str, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The three runs (float32 eager, then the kernel, then bf16 eager) of `command`, `save(data)` after each, so
    that a time limit keeps the runs done."""
    shape = SHAPES[args.shape]
    vocab_size = shape.vocab_size if args.vocab_size is None else args.vocab_size
    layers = shape.layers if args.layers is None else args.layers
    batch = args.tokens // args.length

    def config_of(kernel: str):
        return precision_config(args.scheme, shape, layers, vocab_size, kernel)

    torch.manual_seed(args.seed)
    initial = RelPosTransformerForConditionalGeneration(config_of("eager")).state_dict()
    batches = copy_batches(args.steps, batch, args.length, vocab_size, args.seed)
    meta = environment(args.device, "bfloat16 autocast against float32", command=command) | {
        "kernel": args.kernel, "scheme": args.scheme, "shape": args.shape, "layers": layers,
        "vocab_size": vocab_size, "length": args.length, "batch": batch, "steps": args.steps,
        "learning_rate": args.learning_rate, "warmup_steps": args.warmup_steps, "seed": args.seed,
        "tolerance": args.tolerance,
    }
    data: dict[str, Any] = {"meta": meta, "runs": [], "within_bf16": None}
    for kernel, dtype in (("eager", "float32"), (args.kernel, "bfloat16"), ("eager", "bfloat16")):
        entry = {"kernel": kernel, "dtype": dtype, "losses": train_curve(
            initial, config_of, kernel, dtype, batches, args.device, args.learning_rate, args.warmup_steps)}
        if data["runs"]:
            entry.update(deviations(entry["losses"], data["runs"][0]["losses"]))
        data["runs"].append(entry)
        print(f"{dtype} {kernel}: loss {entry['losses'][0]:.4f} -> {entry['losses'][-1]:.4f}", flush=True)
        save(data)
    data["within_bf16"] = within_bf16(data["runs"][1], data["runs"][2], args.tolerance)
    save(data)
    return data


def render_markdown(data: dict[str, Any]) -> str:
    meta, runs = data["meta"], data["runs"]
    steps = meta["steps"]
    shown = sorted({0, steps - 1, *range(0, steps, max(1, steps // 10))})
    header = ["step", *[f"{entry['dtype']} {entry['kernel']}" for entry in runs]]
    table = [[step + 1, *[f"{entry['losses'][step]:.4f}" for entry in runs]] for step in shown]
    summary = [[f"{entry['dtype']} {entry['kernel']}", f"{entry['max_deviation']:.4f}",
                f"{entry['final_deviation']:.4f}"] for entry in runs[1:]]
    verdict = ("not decided yet (bf16 eager not run)" if data["within_bf16"] is None
               else "within" if data["within_bf16"] else "NOT within")
    return "\n".join([
        "# bf16 training against float32 eager",
        "",
        *environment_lines(meta),
        f"- `{meta['scheme']}`, shape {meta['shape']} ({meta['layers']} + {meta['layers']} layers, vocabulary "
        f"{meta['vocab_size']}), copying random sequences of {meta['length']} tokens, batch {meta['batch']}, "
        f"{steps} steps of AdamW (learning rate {meta['learning_rate']:g}, {meta['warmup_steps']} warm-up steps, "
        f"gradients clipped at 1), seed {meta['seed']}; dropout and attention dropout 0; the same initial weights "
        "and batches in every run",
        "",
        markdown_table(header, table),
        "",
        markdown_table(["run", "largest deviation from float32 eager", "its mean over the last tenth"], summary),
        "",
        f"bf16 on `{meta['kernel']}` against {meta['tolerance']:g} x bf16 eager's deviations: {verdict}.",
    ])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--kernel", choices=KERNELS, default="sdpa", help="the kernel of the bf16 run beside eager's")
    parser.add_argument("--scheme", choices=tuple(SCHEMES), default="shaw")
    parser.add_argument("--shape", choices=tuple(SHAPES), help="default base (--quick: tiny)")
    parser.add_argument("--layers", type=positive_int, help="layers per stack (default: the shape's)")
    parser.add_argument("--vocab_size", type=int, help="vocabulary (default: the shape's; at least 5: ids 0-3 are "
                        "the special tokens)")
    parser.add_argument("--length", type=int, help="source and target tokens per sequence (default 128, --quick: 16)")
    parser.add_argument("--tokens", type=int,
                        help="source tokens per batch (batch = tokens // length; default 8192, --quick: 64)")
    parser.add_argument("--steps", type=int, help="default 300 (--quick: 6)")
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--warmup_steps", type=int, help="default 50 (--quick: 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=2.0,
                        help="the kernel's deviations may be this many times bf16 eager's")
    parser.add_argument("--out", type=output_folder, default=Path(__file__).resolve().parent / "results" / "precision")
    parser.add_argument("--quick", action="store_true",
                        help="CPU-sized defaults: the tiny shape, 6 steps of 4 x 16 tokens, 2 warm-up steps")
    args = parser.parse_args(argv)
    check_device_available(args.device)
    check_kernels_run([args.kernel], args.device, "--kernel")
    for name, value in (QUICK_SIZE if args.quick else FULL_SIZE).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("steps", "length", "tokens", "warmup_steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name}: must be at least 1, got {getattr(args, name)}")
    check_whole_sequence(args.tokens, args.length)
    if args.vocab_size is not None and args.vocab_size < 5:
        raise SystemExit(f"--vocab_size: must be at least 5 (ids 0-3 are the special tokens), got {args.vocab_size}")
    for name in ("learning_rate", "tolerance"):
        if not (getattr(args, name) > 0 and math.isfinite(getattr(args, name))):
            raise SystemExit(f"--{name}: must be a positive number, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Trains the three runs, writes precision.{md,json} into --out and returns the JSON data."""
    args = parse_args(argv)
    paths = []

    def save(data: dict[str, Any]) -> None:
        paths[:] = write_report(args.out, "precision", render_markdown(data), data)

    data = run(args, command_line("benchmarks.bench_precision", argv), save)
    markdown_path, json_path = paths
    print(render_markdown(data))
    print(f"\nwrote {markdown_path}, {json_path}")
    return data


if __name__ == "__main__":
    main()
