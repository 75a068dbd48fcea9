"""`absolute`: sinusoidal position encodings added to the (scaled) token embeddings (Vaswani et al. 2017, sec. 3.5)."""

from __future__ import annotations

from typing import Any

import torch

from .positions import PositionScheme, SchemeCard, add_sinusoids, register_position_scheme


def describe(config: Any) -> str:
    """The model-card text: the sinusoid equations."""
    scale = "the token embeddings scaled by √d_model" if config.scale_embedding else "the token embeddings"
    if config.d_model % 2:   # one sine more than cosines (`sinusoids`)
        equations = ("$$PE_{(p,\\,i)} = \\sin\\left(p / 10000^{2i/d}\\right), \\quad 0 \\le i < (d+1)/2; \\qquad "
                     "PE_{(p,\\,(d+1)/2+i)} = \\cos\\left(p / 10000^{2i/d}\\right), \\quad 0 \\le i < (d-1)/2$$")
    else:
        equations = ("$$PE_{(p,\\,i)} = \\sin\\left(p / 10000^{2i/d}\\right), \\qquad "
                     "PE_{(p,\\,d/2+i)} = \\cos\\left(p / 10000^{2i/d}\\right), \\qquad 0 \\le i < d/2$$")
    return (
        f"Sinusoidal absolute position encodings (Vaswani et al. 2017, sec. 3.5) are added to {scale}; attention "
        f"itself has no position term:\n\n{equations}\n\n"
        "They are computed on the fly, so any length has encodings; a cached decoding step gets its true position."
    )


@register_position_scheme("absolute")
class AbsolutePositions(PositionScheme):
    """PE(pos, i) = sin(pos / 10000^(2i/d)), PE(pos, d/2 + i) = cos(...), i < d/2 (the sines in the first half, the
    cosines in the second, as Marian and fairseq lay them out; for an odd d one sine more, as Marian), added to the
    embeddings.

    Computed on the fly for positions `past_length .. past_length + n - 1` (or the randomized `positions`), so any length works and a cached
    decoding step gets its true position. Attention itself has no position term, so every kernel runs it.
    """

    takes_fixed_size_cache = True

    card = SchemeCard(title="sinusoidal absolute positions (Vaswani et al. 2017)", description=describe)

    def embed(self, inputs_embeds: torch.Tensor, past_length: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        return add_sinusoids(inputs_embeds, past_length, positions)
