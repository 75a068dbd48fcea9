"""Position-scheme registry and the pieces every scheme shares.

A position scheme says *what* order information enters self-attention (an embedding-level encoding, an additive
score bias, a value term, a mask); `attention_core` says *how* the scaled dot product runs (eager,
`torch.nn.functional.scaled_dot_product_attention` or FlexAttention: `config._attn_implementation`). One scheme instance serves one stack (the encoder's or the
decoder's self-attention) and owns the parameters of all its layers, so parameters shared across layers
(Transformer-XL's tied u, v) need no special case.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

ATTENTION_REGISTRY: dict[str, type[PositionScheme]] = {}


def register_attention(name: str) -> Callable[[type[PositionScheme]], type[PositionScheme]]:
    """Class decorator that makes a `PositionScheme` selectable as `config.attention_type = name`."""

    def decorator(scheme_class: type[PositionScheme]) -> type[PositionScheme]:
        if not (isinstance(scheme_class, type) and issubclass(scheme_class, PositionScheme)):
            raise TypeError(f"register_attention({name!r}) expects a PositionScheme subclass, got {scheme_class!r}")
        existing = ATTENTION_REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != scheme_class.__qualname__:
            raise ValueError(f"attention_type {name!r} is already registered by {existing.__module__}.{existing.__qualname__}")
        scheme_class.name = name
        ATTENTION_REGISTRY[name] = scheme_class
        return scheme_class

    return decorator


def get_scheme_class(name: str) -> type[PositionScheme]:
    """Registry lookup with an error that lists what is registered."""
    if name not in ATTENTION_REGISTRY:
        raise ValueError(f"attention_type must be one of {sorted(ATTENTION_REGISTRY)}, got {name!r}")
    return ATTENTION_REGISTRY[name]


def relative_position_index(
    query_length: int, key_length: int, max_relative_position: int, query_offset: int = 0, device: Any = None
) -> torch.LongTensor:
    """Shaw et al. (2018) sec. 3.2 index table: entry [i, j] = clip(j - i', k) + k with i' = i + query_offset.

    `query_offset` is the number of cached positions before the first query, so an incremental decoding step sees
    its true distance to every key.
    """
    if max_relative_position < 0:
        raise ValueError(f"max_relative_position must be >= 0, got {max_relative_position}")
    query_positions = torch.arange(query_offset, query_offset + query_length, device=device)
    key_positions = torch.arange(key_length, device=device)
    distance = key_positions[None, :] - query_positions[:, None]
    return distance.clamp(-max_relative_position, max_relative_position) + max_relative_position


def sinusoids(positions: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Vaswani et al. (2017) sinusoids [sin(p / 10000^(2i/d)) | cos(p / 10000^(2i/d))], shape [len(positions), dim].

    Works for any (also negative, as Transformer-XL's R needs) position, so no table limits the length.
    """
    half = dim // 2
    inverse_frequency = torch.exp(
        torch.arange(half, device=positions.device, dtype=torch.float64) * (-math.log(10000.0) / max(half, 1))
    )
    angles = positions.to(torch.float64)[:, None] * inverse_frequency[None, :]
    encoding = torch.cat([angles.sin(), angles.cos()], dim=-1)
    if dim % 2:
        encoding = torch.nn.functional.pad(encoding, (0, 1))
    return encoding.to(dtype)


def rel_shift(scores: torch.Tensor, key_length: int) -> torch.Tensor:
    """Transformer-XL's relative shift (Dai et al. 2019, appendix B).

    `scores[..., t, p]` holds query t against the distance `D_max - p`, with `D_max = query_offset + n - 1` (the
    largest distance). Returns `out[..., t, j] = scores[..., t, n - 1 - t + j]`, i.e. query t against key j at
    distance `query_offset + t - j`. The paper pads a column and re-views the memory; the same skew is a strided
    view (row stride D - 1, offset n - 1) of the contiguous scores: no gather, no copy, no n x n x d tensor.
    Entries whose distance lies outside the range that `scores` covers are arbitrary and must be masked.
    """
    *batch, query_length, distance_length = scores.shape
    scores = scores.contiguous()
    return scores.as_strided(
        (*batch, query_length, key_length),
        (*scores.stride()[:-2], distance_length - 1, 1),
        scores.storage_offset() + query_length - 1,
    )


@dataclass
class RelativeBias:
    """A score bias that depends on (query i, key j) only through a bucket: bias[b, h, i, j] = table[b, h, i, bucket(i, j)].

    `table` is [B, H, n, R] (Shaw: q . w^K_r for the 2k+1 clipped distances; XL: (q + v) . W_kR R_d for every
    distance d). `dense()` expands it to [B, H, n, m] for the eager and SDPA kernels (by `densify` when the scheme has
    a cheaper way, such as XL's rel-shift, else by a gather); the FlexAttention kernel reads `table` through `bucket`
    inside its score_mod and never builds the n x m float tensor.
    """

    table: torch.Tensor
    bucket: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    key_length: int
    densify: Callable[[], torch.Tensor] | None = None

    def dense(self) -> torch.Tensor:
        if self.densify is not None:
            return self.densify()
        batch, heads, query_length, _ = self.table.shape
        queries = torch.arange(query_length, device=self.table.device)[:, None]
        keys = torch.arange(self.key_length, device=self.table.device)[None, :]
        index = self.bucket(queries, keys).expand(batch, heads, query_length, self.key_length)
        return torch.gather(self.table, -1, index)


def attention_core(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None,
    score_bias: torch.Tensor | RelativeBias | None = None,
    scale: float | None = None,
    dropout: float = 0.0,
    kernel: str = "sdpa",
    output_attentions: bool = False,
    value_term: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T * scale + score_bias, masked by `allowed`) v, for [B, H, n, d] inputs.

    `allowed` is a boolean mask broadcastable to [B, H, n, m] (True = may attend). Masked scores take the dtype's
    minimum, never -inf, and a query with nothing to attend to outputs zeros, so neither outputs nor gradients
    become NaN. `kernel` is `config._attn_implementation`: "sdpa" (default), "eager" or "flex_attention".
    `value_term(probabilities)` adds a term computed from the probabilities (Shaw's a^V); it forces the eager path,
    as does `output_attentions`. FlexAttention has no dropout, so attention dropout in training runs on SDPA.
    """
    scale = query.size(-1) ** -0.5 if scale is None else scale
    eager = kernel == "eager" or value_term is not None or output_attentions
    if kernel == "flex_attention" and not eager and dropout == 0.0:
        return _flex_attention(query, key, value, allowed, score_bias, scale), None
    if isinstance(score_bias, RelativeBias):
        score_bias = score_bias.dense()
    has_any = None
    additive = None if score_bias is None else score_bias.to(query.dtype)
    if allowed is not None:
        allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape))
        has_any = allowed.any(dim=-1, keepdim=True)
        allowed = allowed | ~has_any

    if not eager:
        if allowed is not None:
            # A boolean 4-D mask keeps SDPA's fused kernels; a bias needs the additive form.
            additive = allowed if additive is None else torch.where(allowed, additive, torch.finfo(query.dtype).min)
        output = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=additive, dropout_p=dropout, scale=scale
        )
        return (output if has_any is None else output * has_any), None
    if allowed is not None:
        bias = additive if additive is not None else torch.zeros((), dtype=query.dtype, device=query.device)
        additive = torch.where(allowed, bias, torch.finfo(query.dtype).min)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if additive is not None:
        scores = scores + additive if allowed is None else torch.where(allowed, scores + additive, additive)
    probabilities = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if has_any is not None:
        probabilities = probabilities * has_any
    dropped = torch.nn.functional.dropout(probabilities, p=dropout, training=dropout > 0)
    output = torch.matmul(dropped, value)
    if value_term is not None:
        output = output + value_term(dropped)
    return output, probabilities


_compiled_flex_attention: Callable | None = None


def _flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None,
    score_bias: torch.Tensor | RelativeBias | None,
    scale: float,
) -> torch.Tensor:
    """FlexAttention (torch.nn.attention.flex_attention): a score_mod that reads the bias table by bucket and a
    block mask from `allowed` (compiled on CUDA; the unfused reference implementation elsewhere)."""
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
    if allowed is not None:
        mask_heads = allowed.size(1)
        full = allowed.expand(batch, mask_heads, query_length, key_length)
        block_mask = getattr(allowed, "_flex_block_mask", None)
        if block_mask is None:
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
            allowed._flex_block_mask = block_mask
    attend = flex_attention
    if query.is_cuda:
        if _compiled_flex_attention is None:
            _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
        attend = _compiled_flex_attention
    output = attend(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale)
    if allowed is not None:
        output = output * allowed.any(dim=-1, keepdim=True)
    return output


class PositionScheme(nn.Module):
    """How order enters the self-attention of one stack (encoder or decoder); subclass and `@register_attention`.

    Subclasses own the parameters of all `num_layers` layers and override `embed` (embedding-level encodings) and/or
    `attend` (score biases, value terms, masks). `attend` receives per-head projections [B, H, n, d] and keys/values
    that already include any cache, `query_offset` being the number of cached positions.
    """

    name: str = ""

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__()
        self.config = config
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.is_causal = is_causal

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Raise ValueError for config values this scheme cannot use (called by the config at construction)."""

    def init_parameters(self, std: float) -> None:
        """Initialise this scheme's own parameters (called by `PreTrainedModel._init_weights`)."""

    def embed(self, inputs_embeds: torch.Tensor, past_length: int) -> torch.Tensor:
        """Embedding-level position encoding; identity for purely relative schemes."""
        return inputs_embeds

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
        """Scaled dot-product attention of layer `layer_idx` with this scheme's position information."""
        return attention_core(
            query, key, value, allowed, dropout=dropout, kernel=self.kernel, output_attentions=output_attentions
        )

    @property
    def kernel(self) -> str:
        """How the scaled dot product runs: `config._attn_implementation` ("sdpa", "eager" or "flex_attention")."""
        return getattr(self.config, "_attn_implementation", None) or "sdpa"
