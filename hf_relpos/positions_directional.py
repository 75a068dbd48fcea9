"""`directional`: DiSAN's directional self-attention masks (Shen et al. 2018, sec. 3.2)."""

from __future__ import annotations

from typing import Any

import torch

from .positions import PositionScheme, attention_core, register_attention

DIRECTIONS = ("forward", "backward", "both")


def head_directions(config: Any, num_heads: int, is_causal: bool) -> list[str]:
    """Each head's direction: `directional_heads` cycled over the heads; by default the first half forward and the
    second half backward, or every head forward in a causal stack (the decoder)."""
    if config.directional_heads:
        pattern = config.directional_heads
    elif is_causal:
        pattern = ["forward"]
    else:
        pattern = ["forward"] * (num_heads // 2) + ["backward"] * (num_heads - num_heads // 2)
    return [pattern[head % len(pattern)] for head in range(num_heads)]


@register_attention("directional")
class DirectionalPositions(PositionScheme):
    """Per-head masks: forward M_ij = 0 iff j < i, backward iff j > i, both iff j != i (DiSAN's diag-disabled
    masks); with `directional_disable_diagonal=False` the diagonal is allowed too (j <= i, j >= i, all).

    `directional_heads` is a pattern cycled over the heads; the default gives the first half of the encoder's heads
    the forward mask and the second half the backward one, and every head of a causal stack (decoder) the forward
    one: under the causal mask a backward head would see nothing. The masks combine with padding (and, in a
    decoder, the causal mask); a query left with no key outputs zeros (`attention_core`).
    """

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.head_directions = head_directions(config, num_heads, is_causal)
        self.disable_diagonal = config.directional_disable_diagonal

    @classmethod
    def check_config(cls, config: Any) -> None:
        pattern = config.directional_heads
        if pattern is None:
            return
        if not isinstance(pattern, (list, tuple)) or not pattern or any(d not in DIRECTIONS for d in pattern):
            raise ValueError(f"directional_heads must be a non-empty list of {list(DIRECTIONS)}, got {pattern!r}")

    def direction_mask(self, query_length: int, key_length: int, query_offset: int, device: Any) -> torch.Tensor:
        """Boolean [H, n, m]: head h's query i (absolute position i + query_offset) may attend to key j."""
        query_positions = torch.arange(query_offset, query_offset + query_length, device=device)[:, None]
        key_positions = torch.arange(key_length, device=device)[None, :]
        if self.disable_diagonal:
            by_direction = {
                "forward": key_positions < query_positions,
                "backward": key_positions > query_positions,
                "both": key_positions != query_positions,
            }
        else:
            by_direction = {
                "forward": key_positions <= query_positions,
                "backward": key_positions >= query_positions,
                "both": torch.ones(query_length, key_length, dtype=torch.bool, device=device),
            }
        return torch.stack([by_direction[direction] for direction in self.head_directions])

    def attend(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        allowed: torch.Tensor | None,
        query_offset: int,
        dropout: float = 0.0,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        directional = self.direction_mask(query.size(-2), key.size(-2), query_offset, query.device)
        allowed = directional if allowed is None else allowed & directional
        return attention_core(
            query, key, value, allowed, dropout=dropout, kernel=self.kernel, output_attentions=output_attentions
        )
