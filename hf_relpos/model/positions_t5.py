"""`t5`: T5's bucketed relative position bias (Raffel et al. 2020, sec. 2.1)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import initialization as init

from .positions import (
    MAX_POSITIONS,
    AttentionTerms,
    DenseBias,
    PositionContext,
    PositionScheme,
    SchemeCard,
    computed_once,
    integer_field,
    region_attention,
    register_position_scheme,
)

RAFFEL_BIBTEX = """@article{raffel2020exploring,
  title   = {Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer},
  author  = {Raffel, Colin and Shazeer, Noam and Roberts, Adam and Lee, Katherine and Narang, Sharan and
             Matena, Michael and Zhou, Yanqi and Li, Wei and Liu, Peter J.},
  journal = {Journal of Machine Learning Research},
  volume  = {21},
  number  = {140},
  pages   = {1--67},
  year    = {2020}
}"""


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5's bucket of each relative position j - i (Raffel et al. 2020; mesh-tensorflow's `_relative_position_bucket`,
    as transformers' `T5Attention._relative_position_bucket`).

    Bidirectional: half the buckets for j - i > 0, half for j - i <= 0; unidirectional (a decoder): every j > i
    shares bucket 0. Within a half of `b` buckets, distances below b/2 get one bucket each, larger ones share
    logarithmically wider buckets up to `max_distance`, beyond which all share the last. The logarithm runs in
    float32 as in T5, so bucket edges equal T5's (and a T5 checkpoint's) exactly.
    """
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets = (relative_position > 0).to(torch.long) * num_buckets
        relative_position = relative_position.abs()
    else:
        relative_position = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (
        torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    if_large = torch.clamp(if_large, max=num_buckets - 1)
    return relative_buckets + torch.where(is_small, relative_position, if_large)


def describe(config: Any) -> str:
    """The model-card text: the bucketed bias and this config's bucket layout."""
    buckets, distance = config.relative_attention_num_buckets, config.relative_attention_max_distance
    return (
        "T5 relative position bias (Raffel et al. 2020, sec. 2.1): each head h adds a learned scalar for the bucket "
        "of the offset j − i to its scores; no position is embedded:\n\n"
        "$$e_{ij} = \\frac{q_i^\\top k_j}{\\sqrt{d_{head}}} + b_h\\!\\left(\\mathrm{bucket}(j - i)\\right)$$\n\n"
        f"{buckets} buckets: offsets below {buckets // 4} (encoder, per sign) or {buckets // 2} (decoder) get one "
        f"bucket each, larger ones logarithmically wider buckets up to {distance}, beyond which all share one. The "
        "encoder's buckets are bidirectional (half for j > i), the decoder's unidirectional. One table of "
        "buckets × heads scalars per stack, shared by all its layers as in T5."
    )


@register_position_scheme("t5")
class T5Positions(PositionScheme):
    """e_ij = q_i k_j^T / sqrt(d) + b_h(bucket(j - i)) with `relative_position_bucket` (bidirectional in the encoder,
    unidirectional in a decoder) and one learned scalar per bucket and head, shared by every layer of the stack (T5
    computes it in the first layer and passes it on). Eager/SDPA get it dense (gathered through the [n, m] bucket
    index). FlexAttention, at consecutive positions, gets it by the shared `region_attention` (`fused_attention`):
    every offset at or beyond the distance where its half's last bucket begins (at most max_distance) has that
    bucket, a per-head constant, so the two far key regions run without score_mod and the band between them is
    explicit, its bias gathered from the table by each diagonal's bucket ([H, band width]): the table never enters
    the kernel and its gradient needs no atomic adds. Under randomized positions FlexAttention's score_mod computes
    each score's bucket and reads the [H, buckets] table (its gradient through the kernel's atomic adds).

    Unlike T5 itself, whose attention has no 1/sqrt(d) (folded into its initialisation), the scores here keep the
    scaling every other scheme uses, so the schemes compare on equal terms.
    """

    takes_fixed_size_cache = True

    config_fields = (
        integer_field("relative_attention_num_buckets", 32, "buckets of relative positions (T5)", minimum=4,
                      maximum=2 * MAX_POSITIONS,
                      maximum_reason=f"one bucket per offset either way among {MAX_POSITIONS} tokens at most"),
        integer_field("relative_attention_max_distance", 128,
                      "offsets at and beyond this share the last bucket (T5)", minimum=1, maximum=MAX_POSITIONS - 1,
                      maximum_reason=f"the band of offsets below it is sized for at most {MAX_POSITIONS} tokens, "
                                     f"whose largest offset is {MAX_POSITIONS - 1}"),
    )
    card = SchemeCard(
        title="T5 bucketed relative position biases (Raffel et al. 2020)",
        description=describe,
        bibtex=(RAFFEL_BIBTEX,),
        tags=("relative-position",),
    )

    @classmethod
    def check_config(cls, config: Any) -> None:
        exact = config.relative_attention_num_buckets // 2  # offsets with a bucket each in a decoder
        if config.relative_attention_max_distance <= exact:
            raise ValueError(f"relative_attention_max_distance must be an integer > relative_attention_num_buckets // 2 "
                             f"({exact}), got {config.relative_attention_max_distance}")

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.relative_attention_bias = nn.Embedding(self.num_buckets, num_heads)
        self.bucket_of = functools.partial(relative_position_bucket, bidirectional=not is_causal,
                                           num_buckets=self.num_buckets, max_distance=self.max_distance)
        # the fused path's band of offsets j - i' from band_first on and its buckets, then the two far buckets (on
        # the CPU, explicitly: transformers builds the model under torch.device("meta"))
        left, right = (last_bucket_from(self.bucket_of, self.max_distance, sign) for sign in (-1, 1))
        self.band_first = 1 - left
        offsets = torch.cat([torch.arange(self.band_first, right, device="cpu"),
                             torch.tensor([-self.max_distance, self.max_distance], device="cpu")])
        self.fused_buckets = tuple(self.bucket_of(offsets).tolist())

    def init_parameters(self, std: float) -> None:
        init.normal_(self.relative_attention_bias.weight, mean=0.0, std=std)

    def bucket_biases(self, context: PositionContext) -> torch.Tensor:
        """The table b [R, H] in the stack's dtype, read through the embedding's forward rather than its weight, so
        that a module an adapter put in its place (PEFT's LoRA embedding: weight + B A) gives the biases it computes.
        Read where it is used (in a layer, or a bias built when a kernel first asks), never kept from `prepare`: a
        tensor computed outside the layers would join every layer's graph, which reentrant gradient checkpointing
        then differentiates once per layer."""
        return self.relative_attention_bias(torch.arange(self.num_buckets, device=context.device)).to(context.dtype)

    def prepare(self, context: PositionContext) -> T5Context:
        """The bias of every query-key pair in its forms, shared by the layers (as T5 computes it once per stack):
        dense [1, H, n, m] from the [n, m] bucket index, or at consecutive positions the fused path's band and far
        biases (`T5Context.fused_bias`, no n x m tensor), each built when a kernel first asks for it, once; under
        randomized positions a score_mod (`terms`) that computes each score's bucket by the same arithmetic and
        reads the [H, buckets] table."""
        query_positions, key_positions = context.query_and_key_positions()
        bucket_of = self.bucket_of

        def dense() -> torch.Tensor:
            biases = self.bucket_biases(context)
            return biases[bucket_of(key_positions[None, :] - query_positions[:, None])].permute(2, 0, 1)[None]

        bias = DenseBias(dense)
        if context.positions is None:
            return context.extend(T5Context, bias=bias, bucket_biases=functools.partial(self.bucket_biases, context),
                                  band_first=self.band_first, fused_buckets=self.fused_buckets)
        return context.extend(T5Context, bias=bias)

    def terms(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, context: T5Context) -> AttentionTerms:
        fused = score_mod = None
        if context.positions is None:
            def fused(query, key, value, scaling, mask, attend):
                return self.fused_attention(context, query, key, value, scaling, mask, attend)
        else:
            table, positions, offset, bucket_of = (self.bucket_biases(context).t(), context.positions,
                                                   context.query_offset, self.bucket_of)

            def score_mod(score, b, h, q, kv):
                return score + table[h, bucket_of(positions[kv] - positions[q + offset])]
        return AttentionTerms(score_bias=context.bias, score_mod=score_mod, fused_attention=fused)

    def fused_attention(self, context: T5Context, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        scaling: float, mask: Any, attend: Any) -> torch.Tensor:
        """e_ij = q_i k_j^T * scaling + b_h(bucket(j - i')) at consecutive positions by the shared
        `region_attention`: the far regions' bias is the per-head constant of their last bucket, the band's is
        band read by diagonal from `band_bias`, O(n (band width) d) per head."""
        band_bias, far_bias = context.fused_bias

        def bias(first: int, count: int, compute: torch.dtype) -> tuple:
            band = band_bias[:, None, first - context.band_first : first - context.band_first + count]  # [H, 1, count]
            return far_bias[:, :1].to(compute), band.to(compute), far_bias[:, 1:].to(compute)

        output, _ = region_attention(query, key, value, scaling, mask, attend, context.band_first, band_bias.size(-1),
                                     bias)
        return output.to(query.dtype)


def last_bucket_from(bucket_of: Any, max_distance: int, sign: int) -> int:
    """The smallest D >= 1 such that every offset sign * d with d >= D has the bucket of sign * max_distance (T5
    puts every offset at or beyond max_distance in its half's last bucket, which begins at or before it)."""
    buckets = bucket_of(sign * torch.arange(max_distance + 1, device="cpu"))
    nearer = torch.nonzero(buckets != buckets[-1])
    return int(nearer.max()) + 1 if nearer.numel() else 1


@dataclass(frozen=True)
class T5Context(PositionContext):
    """`bias`: the stack's bias [1, H, n, m] for every layer when first read (once per forward). At consecutive
    positions `fused_bias` (from the table [R, H] that `bucket_biases()` reads and `fused_buckets`: the buckets of the
    offsets `band_first` .. `band_first` + W - 1, then of the offsets below and above them)."""

    bias: DenseBias | None = None
    bucket_biases: Callable[[], torch.Tensor] | None = None
    band_first: int = 0
    fused_buckets: tuple[int, ...] = ()

    @computed_once
    def fused_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The band's bias [H, W] and the far regions' [H, 2] (below, above), gathered once per forward."""
        table = self.bucket_biases()
        biases = table[torch.tensor(self.fused_buckets, device=table.device)].t()
        return biases[:, :-2], biases[:, -2:]
