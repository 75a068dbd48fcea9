"""hf_relpos' attention kernels: transformers' attention-function signature, plus what a position scheme adds.

`RELPOS_ATTENTION_FUNCTIONS` is a model-local `AttentionInterface` (the override transformers documents for a model
that needs its own version of a kernel). "eager", "sdpa" and "flex_attention" map to the functions below, which take
what transformers' own do not: a scheme's score bias (dense, or bucketed as a `RelativeBias` that FlexAttention reads
through its score_mod), a value term (Shaw's a^V), per-head boolean masks, and zero output for a query that may attend
to no key. Every other name (flash_attention_2/3, Hub kernels) resolves to transformers' function for it.

Each function is `f(module, query, key, value, attention_mask, scaling, dropout, ...) -> (output, weights)` with
per-head inputs [B, H, n|m, d], `attention_mask` boolean and broadcastable to [B, H, n, m] (True = may attend) or
None, and output [B, n, H, d] as in transformers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.modeling_utils import AttentionInterface

from .positions import RelativeBias

RELPOS_KERNELS = ("eager", "sdpa", "flex_attention")


def dense_bias(score_bias: torch.Tensor | RelativeBias, dtype: torch.dtype) -> torch.Tensor:
    """A score bias as a tensor broadcastable to [B, H, n, m]."""
    return (score_bias.dense() if isinstance(score_bias, RelativeBias) else score_bias).to(dtype)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    score_bias: torch.Tensor | RelativeBias | None = None,
    value_term: Callable[[torch.Tensor], torch.Tensor] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """z = P v + value_term(P), P = dropout(softmax(q k^T * scaling + score_bias, masked)), returning P before dropout.

    The softmax runs in promote_types(dtype, float32): float32 under bf16/fp16, float64 stays float64. Masked scores
    take the dtype's minimum, never -inf, and a query with no key to attend to outputs zeros, so neither outputs
    nor gradients become NaN.
    """
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if score_bias is not None:
        scores = scores + dense_bias(score_bias, scores.dtype)
    has_key = None
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        has_key = attention_mask.any(dim=-1, keepdim=True)
    probabilities = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    probabilities = probabilities.to(query.dtype)
    if has_key is not None:
        probabilities = probabilities * has_key
    dropped = nn.functional.dropout(probabilities, p=dropout, training=dropout > 0)
    output = torch.matmul(dropped, value)
    if value_term is not None:
        output = output + value_term(dropped)
    return output.transpose(1, 2).contiguous(), probabilities


SDPA_MASK_ALIGNMENT_BYTES = 16


def aligned_mask(mask: torch.Tensor) -> torch.Tensor:
    """The additive mask itself, or a contiguous copy when its data does not start on a 16-byte boundary.

    SDPA's memory-efficient CUDA kernel reads the mask in 16-byte vectors and pads only misaligned row strides: a
    view that starts off the boundary (Transformer-XL's rel-shift, `positions.rel_shift`) stops it with "CUDA
    error: misaligned address" (torch 2.11, H100, bf16, a batch without padding).
    """
    if mask.data_ptr() % SDPA_MASK_ALIGNMENT_BYTES == 0:
        return mask
    return mask.clone(memory_format=torch.contiguous_format)


def sdpa_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    score_bias: torch.Tensor | RelativeBias | None = None,
    value_term: Callable[[torch.Tensor], torch.Tensor] | None = None,
    output_attentions: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`torch.nn.functional.scaled_dot_product_attention` with the score bias as an additive mask (a boolean 4-D
    mask alone keeps SDPA's fused kernels). A value term or `output_attentions` needs the probabilities, which SDPA
    never forms: those calls run `eager_attention_forward` (the same equation)."""
    if value_term is not None or output_attentions:
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, score_bias,
                                       value_term)
    has_key = None
    attn_mask = attention_mask
    if attention_mask is not None:
        has_key = attention_mask.any(dim=-1, keepdim=True)
        attn_mask = attention_mask | ~has_key  # a query with no key attends everywhere, then is zeroed: no NaN
    if score_bias is not None:
        bias = dense_bias(score_bias, query.dtype)
        attn_mask = bias if attn_mask is None else torch.where(attn_mask, bias, torch.finfo(query.dtype).min)
        if query.device.type != "cpu":
            attn_mask = aligned_mask(attn_mask)
    output = nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout, scale=scaling
    )
    if has_key is not None:
        output = output * has_key
    return output.transpose(1, 2).contiguous(), None


_compiled_flex_attention: Callable | None = None


def flex_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    score_bias: torch.Tensor | RelativeBias | None = None,
    value_term: Callable[[torch.Tensor], torch.Tensor] | None = None,
    output_attentions: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FlexAttention (torch.nn.attention.flex_attention; compiled on CUDA, the unfused reference elsewhere): a
    score_mod that reads a `RelativeBias` table by bucket (no n x m bias tensor) and a block mask from the boolean
    mask. A value term or `output_attentions` runs `eager_attention_forward`, as in `sdpa_attention_forward`.
    FlexAttention has no dropout: attention dropout > 0 is an error (set attention_dropout to 0, or use sdpa/eager)."""
    if value_term is not None or output_attentions:
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, score_bias,
                                       value_term)
    if dropout > 0:
        raise ValueError(f"attn_implementation 'flex_attention' has no attention dropout, got attention_dropout="
                         f"{dropout} in training: set attention_dropout to 0 or use 'sdpa' or 'eager'")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    global _compiled_flex_attention
    batch, heads, query_length, _ = query.shape
    key_length = key.size(-2)
    score_mod = None
    if isinstance(score_bias, RelativeBias):
        table, bucket = score_bias.table.to(query.dtype), score_bias.bucket

        def score_mod(score, b, h, q, kv):
            return score + table[b, h, q, bucket(q, kv)]
    elif score_bias is not None:
        dense = score_bias.to(query.dtype).expand(batch, heads, query_length, key_length)

        def score_mod(score, b, h, q, kv):
            return score + dense[b, h, q, kv]

    block_mask = None
    if attention_mask is not None:
        block_mask = getattr(attention_mask, "_flex_block_mask", None)  # built once per mask, shared by the layers
        if block_mask is None:
            mask_heads = attention_mask.size(1)
            full = attention_mask.expand(batch, mask_heads, query_length, key_length)
            if mask_heads == 1:
                def mask_mod(b, h, q, kv):
                    return full[b, 0, q, kv]
            else:
                def mask_mod(b, h, q, kv):
                    return full[b, h, q, kv]
            block_mask = create_block_mask(
                mask_mod, batch, mask_heads if mask_heads > 1 else None, query_length, key_length,
                device=query.device, _compile=query.is_cuda,
            )
            attention_mask._flex_block_mask = block_mask
    attend = flex_attention
    if query.is_cuda:
        if _compiled_flex_attention is None:
            _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
        attend = _compiled_flex_attention
    output = attend(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling)
    if attention_mask is not None:
        output = output * attention_mask.any(dim=-1, keepdim=True)
    return output.transpose(1, 2).contiguous(), None


RELPOS_ATTENTION_FUNCTIONS = AttentionInterface()
RELPOS_ATTENTION_FUNCTIONS["eager"] = eager_attention_forward
RELPOS_ATTENTION_FUNCTIONS["sdpa"] = sdpa_attention_forward
RELPOS_ATTENTION_FUNCTIONS["flex_attention"] = flex_attention_forward
