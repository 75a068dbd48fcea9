"""`absolute`: sinusoidal position encodings added to the (scaled) token embeddings (Vaswani et al. 2017, sec. 3.5)."""

from __future__ import annotations

import torch

from .positions import PositionScheme, register_attention, sinusoids


@register_attention("absolute")
class AbsolutePositions(PositionScheme):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), added to the embeddings.

    Computed on the fly for positions `past_length .. past_length + n - 1`, so any length works and a cached
    decoding step gets its true position. Attention itself has no position term.
    """

    def embed(self, inputs_embeds: torch.Tensor, past_length: int) -> torch.Tensor:
        positions = torch.arange(past_length, past_length + inputs_embeds.size(1), device=inputs_embeds.device)
        return inputs_embeds + sinusoids(positions, inputs_embeds.size(-1), inputs_embeds.dtype)
