"""`rope`: rotary position embedding (Su et al. 2021, RoFormer, sec. 3.4)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .positions import (
    AttentionTerms,
    PositionContext,
    PositionScheme,
    SchemeCard,
    computed_once,
    integer_field,
    number_field,
    query_positions,
    register_position_scheme,
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


@register_position_scheme("rope")
class RotaryPositions(PositionScheme):
    """RoFormer eq. 34: q_i -> R_{Theta,i} q_i, k_j -> R_{Theta,j} k_j, R a block-diagonal of 2x2 rotations by the
    angles p theta_t of position p in the planes (2t, 2t+1), theta_t = rope_theta^(-2t / d_rot), t < d_rot / 2.

    Only the first `rotary_dim` dimensions of a head are rotated (all when null; GPT-NeoX's partial rotary). It
    replaces queries and keys and adds nothing else, so every kernel runs it, transformers' flash kernels included.
    Keys are rotated once, as they are computed (`transform_new_keys`), so the KV cache holds rotated keys and a
    cached decoding step rotates only its own key and query, at their true positions. Angles are computed in float64,
    once per stack call, only for the positions the call rotates: a cached step's own, not every cached position's.
    """

    takes_fixed_size_cache = True

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
        """Rotations turn pairs of dimensions: the rotated part of every head of each stack (all of it when
        rotary_dim is null) must be even and fit in the head."""
        for stack in ("encoder", "decoder"):
            heads = getattr(config, f"{stack}_attention_heads")
            head_dim = config.d_model // heads
            if config.rotary_dim is None and head_dim % 2:
                raise ValueError(f"position_scheme 'rope' rotates pairs of dimensions: the {stack}'s head dimension "
                                 f"(d_model / {stack}_attention_heads = {config.d_model} / {heads}) must be even, got "
                                 f"{head_dim} (change d_model or the heads, or set rotary_dim to an even integer "
                                 f"< {head_dim})")
            if config.rotary_dim is not None and (config.rotary_dim % 2 or config.rotary_dim > head_dim):
                raise ValueError(f"rotary_dim must be null or an even integer <= the {stack}'s head dimension "
                                 f"({head_dim}), got {config.rotary_dim}")

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.rotary_dim = rotary_dims(config, head_dim)
        self.theta = float(config.rope_theta)

    def angles(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of p theta_t [len(positions), d_rot / 2], computed in float64, returned in `dtype`."""
        exponents = torch.arange(0, self.rotary_dim, 2, device=positions.device, dtype=torch.float64) / self.rotary_dim
        angles = positions.to(torch.float64)[:, None] * self.theta ** (-exponents)[None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(self, states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pair_swap: torch.Tensor) -> torch.Tensor:
        """R_{Theta,p} x for each row x [..., len(cos), d], given the per-dimension cos and signed sin of its angles
        (`pairwise`): x_2t cos - x_2t+1 sin and x_2t+1 cos + x_2t sin as x cos + swapped(x) sin, the pairs swapped
        (x_2t+1, x_2t) by one index_select of the stack call's `pair_swap` index, with the same products and sums, in
        four operators per call (each layer's query and key)."""
        rotary = self.rotary_dim
        rotated_part = states if rotary == states.size(-1) else states[..., :rotary]
        swapped = rotated_part.index_select(-1, pair_swap)
        rotated = rotated_part * cos.to(states.dtype) + swapped * sin.to(states.dtype)
        return rotated if rotary == states.size(-1) else torch.cat([rotated, states[..., rotary:]], dim=-1)

    def prepare(self, context: PositionContext) -> RopeContext:
        """How the layers read the rotation angles of the call's positions (`RopeContext.angles_up_to_last_query`,
        computed when first read), and the index that swaps each plane's two dimensions (2t <-> 2t + 1: t XOR 1),
        shared by the layers."""
        pair_swap = torch.arange(self.rotary_dim, device=context.device) ^ 1
        return context.extend(RopeContext, angles_of=functools.partial(self.pairwise_angles, dtype=context.dtype),
                              pair_swap=pair_swap)

    def pairwise_angles(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The angles of `positions` as `rotate` reads them (`pairwise`), [len(positions), d_rot] each."""
        return pairwise(*self.angles(positions, dtype))

    def transform_new_keys(self, layer_idx: int, key: torch.Tensor, context: RopeContext) -> torch.Tensor:
        """The c keys of this call sit at the c positions ending with the last query's: rotated once, before they
        are cached."""
        return self.rotate(key, *context.angles_up_to_last_query(key.size(-2)), context.pair_swap)

    def terms(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, context: RopeContext) -> AttentionTerms:
        return AttentionTerms(query=self.rotate(query, *context.angles_up_to_last_query(query.size(-2)),
                                                context.pair_swap))


def pairwise(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and sin [..., d_rot / 2] of each plane's angle per rotated dimension [..., d_rot]: cos for both
    dimensions of a plane, -sin for its first and sin for its second (what `RotaryPositions.rotate` multiplies)."""
    return torch.stack([cos, cos], dim=-1).flatten(-2), torch.stack([-sin, sin], dim=-1).flatten(-2)


@dataclass(frozen=True)
class RopeContext(PositionContext):
    """`angles_of(positions)`: cos and sin [len(positions), d_rot] of those positions, per rotated dimension
    (`pairwise`); `pair_swap` [d_rot]: the index 1, 0, 3, 2, ... that swaps the dimensions of each plane."""

    angles_of: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    pair_swap: torch.Tensor | None = None

    def angles_up_to_last_query(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [count, d_rot] of the `count` key slots that end with the last query's, computed for those
        positions alone: the n queries' (and a cached call's new keys', which are theirs) and, with a Transformer-XL
        memory, those of the memory and the queries, each once per stack call, not by every layer."""
        if count == self.query_length:
            return self.query_angles
        if count == self.key_length:
            return self.key_angles
        return self.angles_of(self.last_positions(count))

    @computed_once
    def query_angles(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [n, d_rot] of the n queries."""
        return self.angles_of(self.last_positions(self.query_length))

    @computed_once
    def key_angles(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [m, d_rot] of the m keys."""
        return self.angles_of(self.last_positions(self.key_length))

    def last_positions(self, count: int) -> torch.Tensor:
        """The positions [count] of the `count` key slots that end with the last query's: those of `count` queries
        ending there (`query_positions`), the last `count` of the randomized `positions`, else query_offset + n -
        count .. query_offset + n - 1 (in a fixed-size cache, whose slots past the queries are unused, from the
        offset tensor)."""
        return query_positions(count, self.key_length, self.positions, self.device,
                               self.query_offset + self.query_length - count)
