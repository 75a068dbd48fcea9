"""`alibi`: attention with linear biases (Press, Smith, Lewis 2022)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .positions import AttentionTerms, DenseBias, PositionContext, PositionScheme, SchemeCard, register_position_scheme

PRESS_BIBTEX = """@inproceedings{press2022train,
  title     = {Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation},
  author    = {Press, Ofir and Smith, Noah A. and Lewis, Mike},
  booktitle = {International Conference on Learning Representations},
  year      = {2022}
}"""


def alibi_slopes(num_heads: int) -> list[float]:
    """The paper's head slopes: for H a power of 2 the geometric sequence m_h = 2^(-8 h / H), h = 1..H; otherwise
    those of the largest power of 2 below H, then every other slope of twice that power (the paper's code)."""
    if num_heads & (num_heads - 1) == 0:
        return [2.0 ** (-8.0 * head / num_heads) for head in range(1, num_heads + 1)]
    closest = 2 ** math.floor(math.log2(num_heads))
    return alibi_slopes(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


@register_position_scheme("alibi")
class AlibiPositions(PositionScheme):
    """ALiBi (Press et al. 2022, sec. 3): softmax(q_i k^T / sqrt(d) - m_h |i - j|) with fixed slopes `alibi_slopes`.

    No encoding is added to the embeddings and nothing is learned. The encoder penalises the distance in both
    directions (|i - j|, symmetric); in the decoder the causal mask leaves j <= i, where the bias is the paper's
    -m_h (i - j). The bias is one [1, H, n, m] tensor per call, in promote_types(dtype, float32), for the kernels
    that take a dense bias; the fused kernel computes it per score from the indices.
    """

    takes_fixed_size_cache = True

    card = SchemeCard(
        title="ALiBi linear distance biases (Press et al. 2022)",
        description=lambda config: (
            "Attention with linear biases (ALiBi; Press, Smith and Lewis 2022): no position is embedded; each head h "
            "subtracts a fixed multiple of the query-key distance from its scores,\n\n"
            "$$\\mathrm{softmax}_j\\!\\left(\\frac{q_i^\\top k_j}{\\sqrt{d_{head}}} - m_h\\,|i - j|\\right), \\qquad "
            "m_h = 2^{-8h/H}$$\n\n"
            "with the paper's geometric slopes (for a head count H that is not a power of 2, those of the power below "
            "and every other slope of the power above, as in the paper's code). Encoder: symmetric |i − j|, so it "
            "cannot tell left from right by itself: a source reversed, end token `</s>` included, gets the reversed "
            "encoder states and the same translation, and only where `</s>` stands gives the encoder a direction; "
            f"decoder: causal, j ≤ i. Slopes: encoder {_slope_text(config.encoder_attention_heads)}; decoder "
            f"{_slope_text(config.decoder_attention_heads)}. Nothing is learned."
        ),
        bibtex=(PRESS_BIBTEX,),
        tags=("relative-position", "alibi"),
    )

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.slopes = alibi_slopes(num_heads)

    def prepare(self, context: PositionContext) -> AlibiContext:
        """The slopes in promote_types(dtype, float32) and the bias -m_h |i - j| in both forms, shared by the layers:
        dense [1, H, n, m] when a kernel asks for it (built then, once), and the fused kernel's score_mod in closed
        form from the indices (no n x m tensor)."""
        dtype = torch.promote_types(context.dtype, torch.float32)
        slopes = torch.tensor(self.slopes, dtype=dtype, device=context.device)
        query_positions, key_positions = context.query_and_key_positions()

        def dense() -> torch.Tensor:
            distance = (query_positions[:, None] - key_positions[None, :]).abs().to(dtype)
            return (-slopes[:, None, None] * distance)[None]

        offset, positions = context.query_offset, context.positions
        if positions is None:
            def score_mod(score, b, h, q, kv):
                return score - slopes[h] * (q + offset - kv).abs()
        else:
            def score_mod(score, b, h, q, kv):
                return score - slopes[h] * (positions[q + offset] - positions[kv]).abs()
        return context.extend(AlibiContext, bias=DenseBias(dense), score_mod=score_mod)

    def terms(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, context: AlibiContext) -> AttentionTerms:
        return AttentionTerms(score_bias=context.bias, score_mod=context.score_mod)


@dataclass(frozen=True)
class AlibiContext(PositionContext):
    """`bias`: -m_h |i - j| [1, H, n, m] when first read; `score_mod`: the same per score, from the indices."""

    bias: DenseBias | None = None
    score_mod: Any = None


def _slope_text(num_heads: int) -> str:
    return ", ".join(f"{slope:.4g}" for slope in alibi_slopes(num_heads))
