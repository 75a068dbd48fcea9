"""hf_relpos' attention kernels: transformers' attention-function signature, plus what a position scheme adds.

`RELPOS_ATTENTION_FUNCTIONS` is a model-local `AttentionInterface` (the override transformers documents for a model
that needs its own version of a kernel). "eager", "sdpa" and "flex_attention" map to the functions below, which take
what transformers' own do not: a scheme's score bias (dense, or bucketed as a `RelativeBias` that FlexAttention reads
through its score_mod), a value term (Shaw's a^V), per-head boolean masks, and zero output for a query that may attend
to no key. "relpos_triton" (triton_relative.py) is Shaw's relative attention in one fused Triton kernel, registered
with transformers too so that it accepts the name. Every other name (flash_attention_2/3, Hub kernels) resolves to
transformers' function for it.

Each function is `f(module, query, key, value, attention_mask, scaling, dropout, ...) -> (output, weights)` with
per-head inputs [B, H, n|m, d], `attention_mask` boolean and broadcastable to [B, H, n, m] (True = may attend) or
None, and output [B, n, H, d] as in transformers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers.modeling_utils import AttentionInterface

from .positions import RelativeBias, RelativeValues
from .triton_relative import KERNEL_NAME as TRITON_KERNEL
from .triton_relative import check_device, clipped_relative_attention, key_ranges

RELPOS_KERNELS = ("eager", "sdpa", "flex_attention", TRITON_KERNEL)


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
    error: misaligned address".
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
FLEX_RECOMPILE_LIMIT = 64


def flex_kernel(query: torch.Tensor) -> Callable:
    """FlexAttention, compiled (fused) on CUDA; the unfused reference elsewhere (no backward on CPU)."""
    global _compiled_flex_attention
    from torch.nn.attention.flex_attention import flex_attention

    if not query.is_cuda:
        return flex_attention
    if _compiled_flex_attention is None:
        # One compiled kernel per score_mod and mask pattern (each scheme, encoder and decoder, a^V's edge pass):
        # more than Dynamo's default limit of 8 per function, past which it would fall back to the unfused kernel.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, FLEX_RECOMPILE_LIMIT)
        _compiled_flex_attention = without_autocast(torch.compile(flex_attention, dynamic=False))
    return _compiled_flex_attention


def without_autocast(attend: Callable) -> Callable:
    """`attend` run with autocast off: the queries, keys and values keep the dtype the projections gave them (bf16
    under bf16 autocast), so autocast never sends a bf16 model's FlexAttention to float32, whose default forward
    tiles can exceed an H100/H200's shared memory."""

    def run(query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(query.device.type, enabled=False):
            return attend(query, *args, **kwargs)

    return run


def with_log_sum_exp(
    attend: Callable, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod: Callable | None,
    block_mask: Any, scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention's output and row log-sum-exp [B, H, n] (-inf for a query with no key), through `return_aux`
    where torch has it, else `return_lse`."""
    from torch.nn.attention import flex_attention as flex

    if hasattr(flex, "AuxRequest"):
        output, aux = attend(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling,
                             return_aux=flex.AuxRequest(lse=True))
        return output, aux.lse
    return attend(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling, return_lse=True)


def flex_score_mod(
    score_bias: torch.Tensor | RelativeBias | None, batch: int, heads: int, query_length: int, key_length: int,
    dtype: torch.dtype,
) -> Callable | None:
    """The score bias as a FlexAttention score_mod: a `RelativeBias` table read through its bucket (no n x m float
    tensor), or a dense bias read per entry."""
    if isinstance(score_bias, RelativeBias):
        table, bucket = score_bias.full_table().to(dtype).expand(batch, heads, query_length, -1), score_bias.bucket

        def score_mod(score, b, h, q, kv):
            return score + table[b, h, q, bucket(q, kv)]
        return score_mod
    if score_bias is not None:
        dense = score_bias.to(dtype).expand(batch, heads, query_length, key_length)

        def score_mod(score, b, h, q, kv):
            return score + dense[b, h, q, kv]
        return score_mod
    return None


def flex_block_mask(
    attention_mask: torch.Tensor | None, batch: int, query_length: int, key_length: int, device: torch.device,
    keys_from: int | None = None,
) -> Any:
    """The boolean mask [B, 1|H, n, m] as a FlexAttention `BlockMask` (blocks with no allowed entry are skipped),
    built once per mask tensor and kept on it, so every layer of a forward shares it. `keys_from` = c further keeps
    only the keys j >= i + c (the right edge of Shaw's a^V); None when nothing is masked."""
    from torch.nn.attention.flex_attention import create_block_mask

    if attention_mask is None:
        return None if keys_from is None else keys_from_block_mask(query_length, key_length, keys_from, device)
    built = attention_mask.__dict__.setdefault("_flex_block_masks", {})
    if keys_from in built:
        return built[keys_from]
    mask_heads = attention_mask.size(1)
    full = attention_mask.expand(batch, mask_heads, query_length, key_length)
    if mask_heads == 1:
        def in_mask(b, h, q, kv):
            return full[b, 0, q, kv]
    else:
        def in_mask(b, h, q, kv):
            return full[b, h, q, kv]
    allowed = in_mask
    if keys_from is not None:
        def allowed(b, h, q, kv):
            return in_mask(b, h, q, kv) & (kv >= q + keys_from)
    block_mask = create_block_mask(allowed, batch, mask_heads if mask_heads > 1 else None, query_length, key_length,
                                   device=device, _compile=device.type == "cuda")
    built[keys_from] = block_mask
    return block_mask


@functools.lru_cache(maxsize=16)
def keys_from_block_mask(query_length: int, key_length: int, keys_from: int, device: torch.device) -> Any:
    """The `BlockMask` of the keys j >= i + `keys_from` alone, for every batch entry and head (built once per
    shape)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q, kv: kv >= q + keys_from, None, None, query_length, key_length,
                             device=device, _compile=device.type == "cuda")


def relative_value_masses(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    score_bias: torch.Tensor | RelativeBias | None,
    attention_mask: torch.Tensor | None,
    log_normalizer: torch.Tensor,
    right_log_mass: torch.Tensor | None,
    values: RelativeValues,
) -> torch.Tensor:
    """M[b, h, i, r] = sum_{j: clip(j - i', k) = r - k} p_ij (what `RelativeValues.mass_by_distance` sums from P)
    without P, from the row log-sum-exp `log_normalizer` [B, H, n] of the scores s_ij:

    - band, |j - i'| < k: p_ij = exp(s_ij - lse_i), from the 2k - 1 scores on the diagonals j = i' + r;
    - right edge, j - i' >= k: exp(lse^right_i - lse_i), `right_log_mass` the log-sum-exp over those keys alone
      (None: no such key, as in a causal stack);
    - left edge, j - i' <= -k: the rest, 1 - band - right (0 for a query with no key).

    Gradients reach q, k and the bias through the band scores and both log-sum-exps. Queries at consecutive
    positions i' = i + query_offset, keys at 0 .. m-1.
    """
    k, offset = values.max_relative_position, values.query_offset
    batch, heads, query_length, _ = query.shape
    key_length = key.size(-2)
    has_key = torch.isfinite(log_normalizer)
    safe_normalizer = torch.where(has_key, log_normalizer, torch.zeros_like(log_normalizer))
    total = has_key.to(query.dtype)
    if k == 0:
        return total[..., None]
    band = []
    for distance in range(offset - k + 1, offset + k):  # key j = i + distance
        first, last = max(0, -distance), min(query_length, key_length - distance)
        if last <= first:
            band.append(query.new_zeros(batch, heads, query_length))
            continue
        scores = (query[:, :, first:last] * key[:, :, first + distance:last + distance]).sum(-1) * scaling
        if isinstance(score_bias, RelativeBias):
            rows = torch.arange(first, last, device=query.device)
            column = score_bias.bucket(rows, rows + distance)
            table = score_bias.full_table().expand(batch, heads, -1, -1)[:, :, first:last]
            scores = scores + table.gather(-1, column[None, None, :, None].expand(batch, heads, -1, 1)).squeeze(-1)
        elif score_bias is not None:
            dense = score_bias.expand(batch, heads, query_length, key_length)
            scores = scores + dense.diagonal(distance, -2, -1)
        if attention_mask is not None:
            allowed = attention_mask.expand(batch, -1, query_length, key_length).diagonal(distance, -2, -1)
            scores = scores.masked_fill(~allowed, float("-inf"))
        probabilities = torch.exp(scores - safe_normalizer[:, :, first:last])
        band.append(nn.functional.pad(probabilities, (first, query_length - last)))
    band = torch.stack(band, dim=-1)
    if right_log_mass is None:
        right = torch.zeros_like(total)
    else:
        reached = torch.isfinite(right_log_mass) & has_key
        right = torch.exp(torch.where(reached, right_log_mass, safe_normalizer) - safe_normalizer) * reached
    left = total - right - band.sum(-1)
    return torch.cat([left[..., None], band, right[..., None]], dim=-1)


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
    """FlexAttention (compiled on CUDA, the unfused reference elsewhere): a score_mod that reads a `RelativeBias`
    table by bucket (no n x m bias tensor), a block mask from the boolean mask, and Shaw's value term
    (`RelativeValues` at consecutive positions) from the row log-sum-exp (`relative_value_masses`) instead of the
    probabilities. Any other value term, or `output_attentions`, runs `eager_attention_forward` (the same equation).
    FlexAttention has no dropout: attention dropout > 0 is an error (set attention_dropout to 0, or use sdpa/eager)."""
    fused_values = isinstance(value_term, RelativeValues) and value_term.consecutive
    if (value_term is not None and not fused_values) or output_attentions:
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, score_bias,
                                       value_term)
    if dropout > 0:
        raise ValueError(f"attn_implementation 'flex_attention' has no attention dropout, got attention_dropout="
                         f"{dropout} in training: set attention_dropout to 0 or use 'sdpa' or 'eager'")
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    batch, heads, query_length, _ = query.shape
    key_length = key.size(-2)
    score_mod = flex_score_mod(score_bias, batch, heads, query_length, key_length, query.dtype)
    block_mask = flex_block_mask(attention_mask, batch, query_length, key_length, query.device)
    attend = flex_kernel(query)
    if not fused_values:
        output = attend(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling)
    else:
        output, log_normalizer = with_log_sum_exp(attend, query, key, value, score_mod, block_mask, scaling)
        right_log_mass = None
        keys_from = value_term.query_offset + value_term.max_relative_position
        if value_term.max_relative_position > 0 and not getattr(module, "is_causal", False) and keys_from < key_length:
            right_mask = flex_block_mask(attention_mask, batch, query_length, key_length, query.device, keys_from)
            _, right_log_mass = with_log_sum_exp(attend, query, key, value, score_mod, right_mask, scaling)
        masses = relative_value_masses(query, key, scaling, score_bias, attention_mask, log_normalizer,
                                       right_log_mass, value_term)
        output = output + value_term.from_masses(masses.to(output.dtype))
    if attention_mask is not None:
        output = output * attention_mask.any(dim=-1, keepdim=True)
    return output.transpose(1, 2).contiguous(), None


# --- attn_implementation "relpos_triton" (issue #48) ---

TRITON_OTHERWISE = "sdpa"


def triton_clipped_terms(
    score_bias: torch.Tensor | RelativeBias | None, value_term: Callable[[torch.Tensor], torch.Tensor] | None,
) -> tuple[int, int] | None:
    """What "relpos_triton" covers, in one place: (k, query_offset) when the call's terms are a score bias and/or a
    value term by the clipped distance clip(j - i', k) at consecutive positions (Shaw with a^K and a^V, shaw-k
    without a^V, Shaw with a^V alone), else None: plain attention (cross-attention, absolute, rope, none), the other
    schemes' biases (T5, ALiBi, XL), scheme masks (DiSAN) and randomized positions run on `TRITON_OTHERWISE` (sdpa,
    which itself hands a value term or output_attentions to eager); so do masks other than padding ranges and
    causality (`key_ranges`: self_attention_window)."""
    bias_clip = None
    if score_bias is not None:
        if not isinstance(score_bias, RelativeBias) or score_bias.clip_distance is None:
            return None
        bias_clip = (score_bias.clip_distance, score_bias.query_offset)
    values_clip = None
    if value_term is not None:
        if not isinstance(value_term, RelativeValues) or not value_term.consecutive:
            return None
        values_clip = (value_term.max_relative_position, value_term.query_offset)
    if bias_clip is not None and values_clip is not None and bias_clip != values_clip:
        return None
    return bias_clip or values_clip


def relpos_triton_attention_forward(
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
    """Shaw's relative self-attention in one fused Triton kernel (`clipped_relative_attention`): the a^K bias read
    by distance, the a^V term from each row's probability mass per distance, padding from per-sequence key ranges,
    causal for the decoder, true attention dropout (after the softmax, seen by a^V too). What it does not cover
    (`triton_clipped_terms`) runs on `TRITON_OTHERWISE`. On CUDA; on the CPU only under TRITON_INTERPRET=1."""
    check_device(query.device)
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    clipped = None if output_attentions else triton_clipped_terms(score_bias, value_term)
    causal = getattr(module, "is_causal", False)
    batch, _, query_length, _ = query.shape
    ranges = None
    if clipped is not None:
        ranges = key_ranges(attention_mask, batch, query_length, key.size(-2), clipped[1], causal, query.device)
    if ranges is None:
        return RELPOS_ATTENTION_FUNCTIONS[TRITON_OTHERWISE](
            module, query, key, value, attention_mask, scaling, dropout, score_bias, value_term,
            output_attentions=output_attentions)
    max_distance, query_offset = clipped
    bias_table = score_bias.full_table() if score_bias is not None else None
    output = clipped_relative_attention(query, key, value, bias_table, *ranges, scaling, dropout, query_offset,
                                        max_distance, causal, value_term)
    return output.transpose(1, 2).contiguous(), None


# --- end of "relpos_triton" ---

RELPOS_ATTENTION_FUNCTIONS = AttentionInterface()
RELPOS_ATTENTION_FUNCTIONS["eager"] = eager_attention_forward
RELPOS_ATTENTION_FUNCTIONS["sdpa"] = sdpa_attention_forward
RELPOS_ATTENTION_FUNCTIONS["flex_attention"] = flex_attention_forward
RELPOS_ATTENTION_FUNCTIONS[TRITON_KERNEL] = relpos_triton_attention_forward
# transformers checks a requested attn_implementation against its global registry (from_pretrained, from_config,
# set_attn_implementation): the name is registered there too, for this model's attention to look up locally.
AttentionInterface.register(TRITON_KERNEL, relpos_triton_attention_forward)
