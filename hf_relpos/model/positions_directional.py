"""`directional`: DiSAN's directional self-attention masks (Shen et al. 2018, sec. 3.2)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from transformers.utils import logging

from .positions import (
    PositionContext,
    PositionScheme,
    SchemeCard,
    SchemeField,
    boolean_field,
    register_position_scheme,
)

DIRECTIONS = ("forward", "backward", "both")
DECODER_BACKWARD_HEADS = "In the decoder the causal mask leaves backward heads without keys, so they output zeros."

logger = logging.get_logger(__name__)

SHEN_BIBTEX = """@inproceedings{shen2018disan,
  title     = {{DiSAN}: Directional Self-Attention Network for {RNN}/{CNN}-Free Language Understanding},
  author    = {Shen, Tao and Zhou, Tianyi and Long, Guodong and Jiang, Jing and Pan, Shirui and Zhang, Chengqi},
  booktitle = {Proceedings of the Thirty-Second AAAI Conference on Artificial Intelligence},
  pages     = {5446--5455},
  year      = {2018}
}"""


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


def describe(config: Any) -> str:
    """The model-card text: the masked softmax, the allowed keys and each head's direction in this config."""
    encoder_heads = ", ".join(head_directions(config, config.encoder_attention_heads, is_causal=False))
    decoder_heads = ", ".join(head_directions(config, config.decoder_attention_heads, is_causal=True))
    if config.directional_disable_diagonal:
        masks = "forward: j < i, backward: j > i, both: j ≠ i (DiSAN's diag-disabled masks)"
    else:
        masks = "forward: j ≤ i, backward: j ≥ i, both: every j (the diagonal allowed)"
    return (
        "DiSAN directional self-attention (Shen et al. 2018, sec. 3.2): each head h attends through a direction mask "
        "M^h, which is the only order information the model has (no position encodings are added):\n\n"
        "$$\\mathrm{head}_h(i) = \\sum_j \\mathrm{softmax}_j\\!\\left(\\frac{q_i^\\top k_j}{\\sqrt{d_{head}}} + "
        "M^h_{ij}\\right) v_j, \\qquad M^h_{ij} = 0 \\text{ if key } j \\text{ is allowed for query } i, "
        "\\ -\\infty \\text{ otherwise}$$\n\n"
        f"Allowed keys: {masks}. Encoder heads: {encoder_heads}; decoder heads: {decoder_heads}. The masks combine "
        "with padding and, in the decoder, the causal mask; a query left with no key outputs zeros."
    )


def limitations(config: Any) -> list[str]:
    """A backward head in the causal decoder can see no key at all."""
    if "backward" in head_directions(config, config.decoder_attention_heads, is_causal=True):
        return [DECODER_BACKWARD_HEADS]
    return []


def _valid_pattern(pattern: Any) -> bool:
    return pattern is None or (isinstance(pattern, (list, tuple)) and len(pattern) > 0
                               and all(direction in DIRECTIONS for direction in pattern))


@register_position_scheme("directional")
class DirectionalPositions(PositionScheme):
    """Per-head masks: forward M_ij = 0 iff j < i, backward iff j > i, both iff j != i (DiSAN's diag-disabled
    masks); with `directional_disable_diagonal=False` the diagonal is allowed too (j <= i, j >= i, all).

    `directional_heads` is a pattern cycled over the heads; the default gives the first half of the encoder's heads
    the forward mask and the second half the backward one, and every head of a causal stack (decoder) the forward
    one: under the causal mask a backward head would see nothing. The masks combine with padding (and, in a
    decoder, the causal mask); a query left with no key outputs zeros.
    """

    takes_fixed_size_cache = True

    config_fields = (
        SchemeField("directional_heads", None,
                    "pattern of directions cycled over the heads (null: encoder half forward, half backward; decoder "
                    "forward)", f"null or a non-empty list of {list(DIRECTIONS)}", _valid_pattern),
        boolean_field("directional_disable_diagonal", True,
                      "a head never attends to its own position (DiSAN's diag-disabled masks)"),
    )
    card = SchemeCard(
        title="DiSAN directional self-attention masks (Shen et al. 2018)",
        description=describe,
        bibtex=(SHEN_BIBTEX,),
        tags=("relative-position",),
        limitations=limitations,
    )

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.head_directions = head_directions(config, num_heads, is_causal)
        self.disable_diagonal = config.directional_disable_diagonal
        if is_causal and "backward" in self.head_directions:
            logger.warning_once(
                f"directional_heads {config.directional_heads} gives the decoder "
                f"{self.head_directions.count('backward')} backward head(s) of {num_heads}: {DECODER_BACKWARD_HEADS} "
                "(the pattern is cycled over both stacks' heads); leave directional_heads null for the default, the "
                "encoder's heads half forward and half backward and every decoder head forward")

    def head_mask(self, device: torch.device) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """mask_mod(h, i, j): head h's query at position index i may attend to the key at index j (the masks compare
        positions only by order, so indices stand for randomized, sorted, positions too)."""
        codes = torch.tensor([DIRECTIONS.index(direction) for direction in self.head_directions], device=device)
        disable_diagonal = self.disable_diagonal

        def mask_mod(h: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
            code = codes[h]
            if disable_diagonal:
                return torch.where(code == 0, j < i, torch.where(code == 1, j > i, j != i))
            return torch.where(code == 0, j <= i, torch.where(code == 1, j >= i, j == j))
        return mask_mod

    def prepare(self, context: PositionContext) -> PositionContext:
        """The direction masks as a mask_mod of indices, shared by the layers (expanded only for dense kernels)."""
        return replace(context, mask_mod=self.head_mask(context.device))
