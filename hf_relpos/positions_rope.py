"""`rope`: rotary position embedding (Su et al. 2021, RoFormer, sec. 3.4)."""

from __future__ import annotations

from typing import Any

import torch

from .positions import (
    AttentionTerms,
    PositionScheme,
    SchemeCard,
    integer_field,
    number_field,
    query_and_key_positions,
    register_attention,
)

SU_BIBTEX = """@article{su2024roformer,
  title   = {{RoFormer}: Enhanced Transformer with Rotary Position Embedding},
  author  = {Su, Jianlin and Ahmed, Murtadha and Lu, Yu and Pan, Shengfeng and Bo, Wen and Liu, Yunfeng},
  journal = {Neurocomputing},
  volume  = {568},
  pages   = {127063},
  year    = {2024},
  note    = {arXiv:2104.09864, 2021}
}"""


def rotary_dims(config: Any, head_dim: int) -> int:
    """How many leading dimensions of each head are rotated: `rotary_dim`, or all of them (null)."""
    return head_dim if config.rotary_dim is None else config.rotary_dim


def describe(config: Any) -> str:
    """The model-card text: the rotation and this config's frequencies."""
    partial = ("every dimension of a head" if config.rotary_dim is None
               else f"the first {config.rotary_dim} dimensions of each head (the rest pass unrotated)")
    return (
        "Rotary position embedding (RoPE; Su et al. 2021, RoFormer eq. 34): queries and keys of self-attention are "
        "rotated by their position, pairwise in the planes (x_{2t}, x_{2t+1}), so that their dot product depends on "
        "the offset only; nothing is added to the embeddings or to the scores:\n\n"
        "$$q_i^\\top k_j \\;\\to\\; (R_{\\Theta,i}\\, q_i)^\\top (R_{\\Theta,j}\\, k_j) = q_i^\\top R_{\\Theta,j-i}\\, k_j, "
        "\\qquad \\theta_t = \\theta^{-2t/d_{rot}}$$\n\n"
        f"with base θ = {config.rope_theta:g} (`rope_theta`) over {partial}. Nothing is learned."
    )


@register_attention("rope")
class RotaryPositions(PositionScheme):
    """RoFormer eq. 34: q_i -> R_{Theta,i} q_i, k_j -> R_{Theta,j} k_j, R a block-diagonal of 2x2 rotations by the
    angles p theta_t of position p in the planes (2t, 2t+1), theta_t = rope_theta^(-2t / d_rot), t < d_rot / 2.

    Only the first `rotary_dim` dimensions of a head are rotated (all when null; GPT-NeoX's partial rotary). It
    replaces queries and keys and adds nothing else, so every kernel runs it, transformers' flash kernels included.
    Cached keys arrive unrotated and are rotated with their own positions 0 .. m-1, queries with `query_offset + i`,
    so a cached decoding step sees the true offsets. Angles are computed in float64.
    """

    config_fields = (
        number_field("rope_theta", 10000.0, "base of the rotation frequencies theta_t = base^(-2t/d)", symbol="θ"),
        integer_field("rotary_dim", None, "leading dimensions of each head that are rotated (even; null: all)",
                      minimum=2, optional=True),
    )
    card = SchemeCard(
        title="rotary position embedding (Su et al. 2021)",
        description=describe,
        bibtex=(SU_BIBTEX,),
        tags=("relative-position", "rope"),
    )

    @classmethod
    def check_config(cls, config: Any) -> None:
        if config.rotary_dim is None:
            return
        head_dims = {config.d_model // config.encoder_attention_heads, config.d_model // config.decoder_attention_heads}
        if config.rotary_dim % 2 or config.rotary_dim > min(head_dims):
            raise ValueError(f"rotary_dim must be null or an even integer <= the head dimension ({min(head_dims)}), got "
                             f"{config.rotary_dim}")

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.rotary_dim = rotary_dims(config, head_dim)
        self.theta = float(config.rope_theta)

    def rotate(self, states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """R_{Theta,p} x for each row x [..., len(positions), d] at position p."""
        rotary = self.rotary_dim
        exponents = torch.arange(0, rotary, 2, device=states.device, dtype=torch.float64) / rotary
        angles = positions.to(torch.float64)[:, None] * self.theta ** (-exponents)[None, :]
        cos, sin = angles.cos().to(states.dtype), angles.sin().to(states.dtype)
        pairs = states[..., :rotary].unflatten(-1, (rotary // 2, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
        return torch.cat([rotated, states[..., rotary:]], dim=-1)

    def terms(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, query_offset: int,
        positions: torch.Tensor | None = None,
    ) -> AttentionTerms:
        query_positions, key_positions = query_and_key_positions(query.size(-2), key.size(-2), positions, query.device)
        return AttentionTerms(query=self.rotate(query, query_positions), key=self.rotate(key, key_positions))
