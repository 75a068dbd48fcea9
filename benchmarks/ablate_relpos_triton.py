"""What each of relpos_triton's terms costs: the fused op timed forward and forward + backward with Shaw's bias table,
its a^V masses and attention dropout switched off one at a time, at fixed blocks, beside sdpa (cuDNN's or flash
attention) on the same q, k, v with the same dropout. Inputs as the model gives them: token-major heads ([B, n, H, d]
memory), the base shape's 8 heads of 64, k = 16, no padding, encoder self-attention (not causal). Writes
ablation.md and ablation.json into --out after every row (a time limit keeps what was done).

    python -m benchmarks.ablate_relpos_triton --length 512 --tokens 16384 --attention_dropout 0.1 --out /tmp/ablate

The blocks are the ones the H200 autotuner chose at n = 512 (docs/results/gpu_check/2026-11-28_h200_1f3e7bf), one
compile per kernel and flag set instead of five.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import command_line
from benchmarks.common import (
    SHAPES,
    check_attention_dropout,
    check_whole_sequence,
    environment,
    environment_lines,
    markdown_table,
    positive_int,
    write_report,
)
from benchmarks.tune_relpos_triton import block_label
from hf_relpos.translation.safety import output_folder

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per autotuned kernel: the H200's choice at n = 512, not causal
PINNED_BLOCKS = {"tuned_forward": (64, 32, 4, 3), "tuned_backward_keys": (64, 64, 4, 2),
                 "tuned_backward_queries": (64, 32, 4, 3)}
# (label, bias table a^K, masses for a^V, dropout): the full term set first, then one term off at a time, then none
VARIANTS = (("a^K, a^V, dropout", True, True, True), ("a^K, a^V", True, True, False),
            ("a^K, dropout", True, False, True), ("a^V, dropout", False, True, True),
            ("dropout", False, False, True), ("plain", False, False, False))


def token_major(batch: int, heads: int, length: int, width: int, device: str, dtype: torch.dtype,
                generator: torch.Generator) -> torch.Tensor:
    """A [B, H, n, width] leaf laid out [B, n, H, width], as the model's projections split into heads."""
    values = torch.randn(batch, length, heads, width, generator=generator, dtype=torch.float32)
    return values.to(device, dtype).transpose(1, 2).requires_grad_()


def steps(batch: int, heads: int, length: int, head_dim: int, max_distance: int, dropout: float, device: str,
          dtype: torch.dtype, variant: tuple[str, bool, bool, bool]) -> dict[str, Callable[[], Any]]:
    """The fused op's forward and forward + backward for one variant, and sdpa's on the same inputs."""
    from hf_relpos.model.positions import aligned_width
    from hf_relpos.model.triton_relative import SEED_RANGE, relative_attention

    _, with_bias, with_masses, with_dropout = variant
    generator = torch.Generator().manual_seed(0)
    query, key, value = (token_major(batch, heads, length, head_dim, device, dtype, generator) for _ in range(3))
    table = token_major(batch, heads, length, 2 * max_distance + 1, device, dtype, generator) if with_bias else None
    key_start = torch.zeros(batch, dtype=torch.int32, device=device)
    key_end = torch.full((batch,), length, dtype=torch.int32, device=device)
    seed = torch.full((1,), SEED_RANGE[0] + 1, dtype=torch.int64)
    drop = dropout if with_dropout else 0.0
    inputs = [tensor for tensor in (query, key, value, table) if tensor is not None]

    def forward() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return relative_attention(query, key, value, table, key_start, key_end, seed, head_dim**-0.5, drop, 0,
                                  max_distance, False, aligned_width(2 * max_distance + 1) if with_masses else 0)

    def training() -> None:
        output, masses, _ = forward()
        loss = output.float().sum() + (masses.sum() if with_masses else 0.0)
        torch.autograd.grad(loss, inputs)

    def sdpa_forward() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, dropout_p=drop)

    def sdpa_training() -> None:
        torch.autograd.grad(sdpa_forward().float().sum(), (query, key, value))

    return {"forward": forward, "training": training, "sdpa_forward": sdpa_forward, "sdpa_training": sdpa_training}


def cuda_milliseconds(function: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(function))


def render_markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    return "\n".join([
        "# What each of relpos_triton's terms costs", "", *environment_lines(meta),
        f"- n = {meta['length']}, batch {meta['batch']}, {meta['heads']} heads of {meta['head_dim']}, k = "
        f"{meta['max_distance']}, attention dropout {meta['attention_dropout']:g} where on; token-major inputs; blocks "
        f"{meta['blocks']}; ms from triton.testing.do_bench; sdpa with the same dropout", "",
        markdown_table(["terms", "forward ms", "forward + backward ms", "sdpa forward ms", "sdpa forward + backward ms",
                        "forward vs sdpa", "forward + backward vs sdpa"],
                       [[row["variant"], f"{row['forward']:.4f}", f"{row['training']:.4f}",
                         f"{row['sdpa_forward']:.4f}", f"{row['sdpa_training']:.4f}",
                         f"{row['forward'] / row['sdpa_forward']:.2f}x",
                         f"{row['training'] / row['sdpa_training']:.2f}x"] for row in rows]), ""])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="base")
    parser.add_argument("--length", type=positive_int, default=512)
    parser.add_argument("--tokens", type=positive_int, default=16384, help="tokens per batch (batch = tokens // length)")
    parser.add_argument("--max_distance", type=positive_int, default=16)
    parser.add_argument("--attention_dropout", type=float, default=0.1)
    parser.add_argument("--out", type=output_folder, required=True)
    return parser


def main(argv: list[str] | None = None, timer: Callable[[Callable[[], Any]], float] = cuda_milliseconds,
         device: str = "cuda") -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_attention_dropout(args.attention_dropout)
    check_whole_sequence(args.tokens, args.length)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("needs a CUDA GPU: torch.cuda.is_available() is False")
        from hf_relpos.model import triton_relative_kernels

        for name, blocks in PINNED_BLOCKS.items():
            getattr(triton_relative_kernels, name).configs = triton_relative_kernels.block_configs((blocks,))
    shape = SHAPES[args.shape]
    batch = args.tokens // args.length
    dtype = getattr(torch, args.dtype)
    meta = environment(device, args.dtype, command=command_line("benchmarks.ablate_relpos_triton", argv)) | {
        "kernel": "relpos_triton", "length": args.length, "batch": batch, "heads": shape.heads,
        "head_dim": shape.d_model // shape.heads, "max_distance": args.max_distance,
        "attention_dropout": args.attention_dropout,
        "blocks": ", ".join(f"{name.removeprefix('tuned_')} {block_label(*blocks)}"
                            for name, blocks in PINNED_BLOCKS.items())}
    rows: list[dict[str, Any]] = []
    for variant in VARIANTS:
        functions = steps(batch, shape.heads, args.length, meta["head_dim"], args.max_distance,
                          args.attention_dropout, device, dtype, variant)
        rows.append({"variant": variant[0], **{name: timer(function) for name, function in functions.items()}})
        write_report(args.out, "ablation", render_markdown(meta, rows), {"meta": meta, "rows": rows})
    print(render_markdown(meta, rows))
    return {"meta": meta, "rows": rows}


if __name__ == "__main__":
    main()
