"""hf_relpos' attention kernels: transformers' attention-function signature, plus what a position scheme adds.

`RELPOS_ATTENTION_FUNCTIONS` is a model-local `AttentionInterface` (the override transformers documents for a model
that needs its own version of a kernel). "eager", "sdpa" and "flex_attention" map to the functions below, which take
what transformers' own do not: a scheme's score bias (dense, or bucketed as a `RelativeBias`), a value term, per-head
boolean masks, zero output for a query that may attend to no key, and on the fused path (FlexAttention) the scheme's
own fused form of them (`AttentionTerms.score_mod`, `fused_attention`). No scheme's equation lives here.
"relpos_triton" (triton_relative.py) is clipped-distance relative attention (Shaw's a^K and a^V) in one fused Triton
kernel, registered with transformers too so that it accepts the name. Every other
name (flash_attention_2/3, Hub kernels) resolves to transformers' function for it.

Each function is `f(module, query, key, value, attention_mask, scaling, dropout, ...) -> (output, weights)` with
per-head inputs [B, H, n|m, d], `attention_mask` boolean and broadcastable to [B, H, n, m] (True = may attend) or
None (FlexAttention: a `FlexMask`), and output [B, n, H, d] as in transformers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
from transformers.utils import logging

from .positions import DenseBias, PositionContext, RelativeBias, RelativeValues
from .triton_relative import KERNEL_NAME as TRITON_KERNEL
from .triton_relative import check_device, check_runs_on, clipped_relative_attention, key_ranges

RELPOS_KERNELS = ("eager", "sdpa", "flex_attention", TRITON_KERNEL)
# transformers' prefix for a kernel run on its paged KV cache ("paged|sdpa").
PAGED_PREFIX = "paged|"
# the one paged kernel transformers keeps under its prefixed name; for any other it drops the prefix
PAGED_EAGER = "paged|eager"
# the kernels that take `KeyDropout` (attention_dropout_kind "keys"); relpos_triton drops probabilities instead
KEY_DROPOUT_KERNELS = ("eager", "sdpa", "flex_attention")
# the kernels that drop attention probabilities after the softmax (attention_dropout_kind "probabilities");
# flex_attention cannot (its score_mod acts before the softmax)
PROBABILITY_DROPOUT_KERNELS = ("eager", "sdpa", TRITON_KERNEL)
# the kernels that take a fixed-size KV cache (generate's cache_implementation "static"), whose query offset is a
# 0-dim tensor: FlexAttention's masks and fused regions slice by the offset as an integer
FIXED_SIZE_CACHE_KERNELS = ("eager", "sdpa", TRITON_KERNEL)
# of those, the kernels that read the fill level on the host: a compiled step would recompile at every fill level
HOST_OFFSET_KERNELS = (TRITON_KERNEL,)

logger = logging.get_logger(__name__)


HASH_MASK = 0xFFFFFFFF
# odd multipliers below 2**31: a product with a 32-bit value stays below 2**63, so int64 never overflows
HASH_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D)
KEEP_BITS = 24   # the keep decision compares the hash's top 24 bits with round(p * 2**24)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift, multiply, xor-shift, multiply, xor-shift) on int64 values < 2**32."""
    for multiplier in HASH_MULTIPLIERS:
        x = x ^ (x >> 16)
        x = (x * multiplier) & HASH_MASK
    return x ^ (x >> 15)


@dataclasses.dataclass(frozen=True)
class KeyDropout:
    """Key dropout (`attention_dropout_kind` "keys"): score (b, h, i, j) of a call (batch entry b, head h, query i,
    key j, the call's indices) is dropped, i.e. masked before the softmax, with probability p, so each row
    renormalises over the keys it keeps: p'_ij = keep_ij e^s_ij / sum_l keep_il e^s_il. A query that loses every key
    outputs zeros, like a query with no key (and like a lone probability dropped by standard dropout).

    The keep decision is a counter-based hash of (seed, b, h, i, j) computed from the indices (`keeps`): eager and
    sdpa build it densely, FlexAttention computes it inside its score_mod (and again in its backward), never storing
    a mask. `seed` is a [1] int64 tensor drawn once per attention call from torch's generator (`draw`), so runs are
    reproducible under `set_seed` and every kernel drops the same scores given the same seed; a score is dropped when
    the hash's top KEEP_BITS bits fall below `threshold` = round(p 2^KEEP_BITS) (an int: a float captured by the
    compiled score_mod would become a tensor read on the host)."""

    seed: torch.Tensor
    threshold: int

    @classmethod
    def draw(cls, probability: float, device: torch.device) -> KeyDropout:
        seed = torch.randint(0, HASH_MASK, (1,), dtype=torch.int64, device=device)
        return cls(seed, round(probability * 2**KEEP_BITS))

    @property
    def probability(self) -> float:
        """The drop probability p the threshold stands for, threshold / 2^KEEP_BITS."""
        return self.threshold / 2**KEEP_BITS

    def keeps(self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Whether score (b, h, q, kv) is kept, at broadcastable integer indices."""
        state = self.seed[0]
        for index in (b, h, q, kv):
            state = _mix(state ^ (index.to(torch.int64) & HASH_MASK))
        return (state >> (32 - KEEP_BITS)) >= self.threshold

    def dense(self, batch: int, heads: int, query_length: int, key_length: int) -> torch.Tensor:
        """`keeps` at every index, [B, H, n, m] booleans (eager and sdpa)."""
        device = self.seed.device
        return self.keeps(torch.arange(batch, device=device)[:, None, None, None],
                          torch.arange(heads, device=device)[None, :, None, None],
                          torch.arange(query_length, device=device)[None, None, :, None],
                          torch.arange(key_length, device=device)[None, None, None, :])

    def score_mod(self, inner: Callable | None) -> Callable:
        """`inner` (a score_mod, or None) with the dropped scores set to -inf: FlexAttention's form."""
        keeps = self.keeps

        def score_mod(score, b, h, q, kv):
            score = score if inner is None else inner(score, b, h, q, kv)
            return torch.where(keeps(b, h, q, kv), score, float("-inf"))
        return score_mod


def with_key_dropout(attention_mask: torch.Tensor | None, key_dropout: KeyDropout | None, query: torch.Tensor,
                     key: torch.Tensor) -> torch.Tensor | None:
    """A dense boolean mask with the dropped keys masked too (eager and sdpa)."""
    if key_dropout is None:
        return attention_mask
    batch, heads, query_length, _ = query.shape
    keeps = key_dropout.dense(batch, heads, query_length, key.size(-2))
    return keeps if attention_mask is None else attention_mask & keeps


def mask_rows(attention_mask: torch.Tensor, kernel_cache: dict[Any, Any] | None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of a boolean mask [B|1, H|1, n, m] (True = may attend): the masked entries (~mask), whether each query has a
    key ([..., n, 1]) and the mask with every key allowed in a row that has none (such a row attends everywhere,
    then is zeroed: no NaN). Computed once per mask tensor of a stack call (`kernel_cache`, which every layer of the
    call shares: its self-attention mask is one tensor) rather than in every layer."""
    if kernel_cache is not None and "mask_rows" in kernel_cache and kernel_cache["mask_rows"][0] is attention_mask:
        return kernel_cache["mask_rows"][1]
    has_key = attention_mask.any(dim=-1, keepdim=True)
    rows = (~attention_mask, has_key, attention_mask | ~has_key)
    if kernel_cache is not None:   # the latest mask only: a layer's own (key dropout, DiSAN's per head) replaces it
        kernel_cache["mask_rows"] = (attention_mask, rows)
    return rows


def dense_bias(score_bias: torch.Tensor | RelativeBias | DenseBias, dtype: torch.dtype) -> torch.Tensor:
    """A score bias as a tensor broadcastable to [B, H, n, m]."""
    return (score_bias if torch.is_tensor(score_bias) else score_bias.dense()).to(dtype)


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
    key_dropout: KeyDropout | None = None,
    kernel_cache: dict[Any, Any] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """z = P v + value_term(P), P = dropout(softmax(q k^T * scaling + score_bias, masked)), returning P before dropout.
    With `key_dropout` the dropped scores are masked before the softmax instead (`KeyDropout`).

    The softmax runs in promote_types(dtype, float32): float32 under bf16/fp16, float64 stays float64. Masked scores
    take the dtype's minimum, never -inf, and a query with no key to attend to outputs zeros, so neither outputs
    nor gradients become NaN. What the mask gives (`mask_rows`) is kept in `kernel_cache` for the stack call's
    other layers.
    """
    attention_mask = with_key_dropout(attention_mask, key_dropout, query, key)
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if score_bias is not None:
        scores = scores + dense_bias(score_bias, scores.dtype)
    has_key = None
    if attention_mask is not None:
        masked, has_key, _ = mask_rows(attention_mask, kernel_cache)
        scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)
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
    key_dropout: KeyDropout | None = None,
    kernel_cache: dict[Any, Any] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`torch.nn.functional.scaled_dot_product_attention` with the score bias as an additive mask (a boolean 4-D
    mask alone keeps SDPA's fused kernels) and `key_dropout`'s dropped keys in the mask. A value term, and
    `output_attentions`, need the probabilities, which SDPA never forms: those calls run `eager_attention_forward`
    (the same equation). What the mask gives (`mask_rows`) is kept in `kernel_cache` for the stack call's other
    layers."""
    attention_mask = with_key_dropout(attention_mask, key_dropout, query, key)
    if value_term is not None or output_attentions:
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, score_bias,
                                       value_term, kernel_cache=kernel_cache)
    has_key = None
    attn_mask = attention_mask
    if attention_mask is not None:
        _, has_key, attn_mask = mask_rows(attention_mask, kernel_cache)
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


FLEX_BLOCK = 128   # FlexAttention's block size: block masks are built at this granularity
FLEX_RECOMPILE_LIMIT = 32
FLEX_LENGTH_MULTIPLE = 64   # batches padded to a multiple of this on the fused path: a few compiled graphs per run
COMPILE_ON_CPU = False   # compile FlexAttention on the CPU too (Inductor's CPU backend: inference only, no lse)

_compiled_flex_attention: Callable | None = None
_compiled_graphs = 0


def length_multiple(kernel: str | None) -> int | None:
    """The multiple a batch's lengths should be padded to for `kernel` (None: any length): FlexAttention compiles
    with dynamic shapes, yet Dynamo specialises on sizes 0 and 1 and on the number of blocks; padded lengths keep a
    run to a few graphs whatever its batches."""
    return FLEX_LENGTH_MULTIPLE if kernel == "flex_attention" else None


class FlexCompileError(RuntimeError):
    """The fused path cannot run fused (Dynamo's recompile limit reached, or Inductor refused the shape or dtype):
    raised instead of falling back to the unfused kernel, which would form every score."""


def compiled_graph_count() -> int:
    """How many FlexAttention graphs this process has compiled (each costs seconds; bounded by padded lengths)."""
    return _compiled_graphs


def _count_and_compile(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Inductor, counting the graphs it is given."""
    global _compiled_graphs
    from torch._inductor.compile_fx import compile_fx

    _compiled_graphs += 1
    return compile_fx(graph, example_inputs)


def flex_kernel(query: torch.Tensor) -> Callable:
    """FlexAttention compiled with dynamic shapes (on CUDA, or on the CPU with `COMPILE_ON_CPU`); elsewhere the
    unfused reference (forward only on the CPU). The compiled kernel never falls back in silence: past
    FLEX_RECOMPILE_LIMIT graphs, or when Inductor refuses the inputs, it raises `FlexCompileError`."""
    global _compiled_flex_attention
    from torch.nn.attention.flex_attention import flex_attention

    if not (query.is_cuda or COMPILE_ON_CPU):
        if query.device.type != "cpu":
            logger.warning_once(f"flex_attention on {query.device.type}: FlexAttention is compiled on CUDA only, so it "
                                "runs uncompiled here (slow, forming every score); use 'sdpa' on this device")
        return flex_attention
    if _compiled_flex_attention is None:
        compiled = torch.compile(flex_attention, dynamic=True, backend=_count_and_compile)

        def run(query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            # autocast off: q, k, v keep the projections' dtype (bf16 under bf16 autocast); float32 tiles can exceed
            # an H100/H200's shared memory
            with torch.autocast(query.device.type, enabled=False), torch._dynamo.config.patch(
                    recompile_limit=FLEX_RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
                try:
                    return compiled(query, *args, **kwargs)
                except torch._dynamo.exc.FailOnRecompileLimitHit as error:
                    raise FlexCompileError(
                        f"FlexAttention reached {FLEX_RECOMPILE_LIMIT} compiled graphs ({compiled_graph_count()} in "
                        "this process) and would run unfused: pad lengths to a multiple of "
                        f"{FLEX_LENGTH_MULTIPLE} (train_translation pads them when attn_implementation is "
                        "flex_attention)"
                    ) from error
                except (torch._dynamo.exc.BackendCompilerFailed, torch._inductor.exc.InductorError) as error:
                    raise FlexCompileError(
                        f"FlexAttention could not be compiled for {query.dtype} queries of shape "
                        f"{list(query.shape)} on {query.device}: {str(error).splitlines()[0]}"
                    ) from error

        _compiled_flex_attention = run
    return _compiled_flex_attention


@dataclasses.dataclass(frozen=True)
class FlexMask:
    """Which keys each query may attend to, in the form FlexAttention reads: from per-sequence key validity and
    positions, never a dense [B, H, n, m] tensor. Query i sits at position i' = i + `query_offset`, key j at j.

    Key j is allowed for query i of sequence b and head h when `key_start[b]` <= j < `key_end[b]` (the keys of each
    sequence as one run, [B] integers; None: every key) and `key_valid[b, j]` (a padding that is not one run, [B, m]
    booleans; None: every key),
    `lowest` <= j - i' <= `highest` (None: unbounded; a causal stack has highest 0, a window w gives -w and w),
    `head_mask(h, i', j)` (a scheme's per-head mask over `heads` heads) and
    `dense_extra[b, h, i, j]` (a scheme mask given only densely, [1|B, 1|H, n, m]: read per entry, the slow form).
    The `BlockMask` is built once per record (`block_mask`) and shared by every layer that gets the record.
    `key_dropout` (one attention call's `KeyDropout`, `with_key_dropout`) drops scores inside the kernel's score_mod
    (`flex_region`) and in `band`; it is no part of `allows`, `dense` or the block mask, which the layers share.
    """

    batch: int
    query_length: int
    key_length: int
    query_offset: int = 0
    key_start: torch.Tensor | None = None
    key_end: torch.Tensor | None = None
    key_valid: torch.Tensor | None = None
    lowest: int | None = None
    highest: int | None = None
    heads: int = 1
    head_mask: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    dense_extra: torch.Tensor | None = None
    key_dropout: KeyDropout | None = None
    _built: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_padding(cls, padding: torch.Tensor | None, query_length: int, query_offset: int = 0,
                     **bounds: Any) -> FlexMask:
        """The mask of a [B, m] 1/0 key padding: per-sequence key ranges when each sequence's keys form one run
        (right or left padding; one check on the host), else the padding itself; under torch.compile always the
        padding itself (the check would break the graph)."""
        if padding is None:
            raise ValueError("from_padding needs a [batch, keys] padding mask")
        valid = padding.bool()
        batch, key_length = valid.shape
        if torch.compiler.is_compiling():
            return cls(batch, query_length, key_length, query_offset, key_valid=valid, **bounds)
        first = valid.int().argmax(-1)
        end = key_length - valid.flip(-1).int().argmax(-1)
        counts = valid.sum(-1)
        end = torch.where(counts > 0, end, first)
        if torch.equal(counts, end - first):
            return cls(batch, query_length, key_length, query_offset, key_start=first, key_end=end, **bounds)
        return cls(batch, query_length, key_length, query_offset, key_valid=valid, **bounds)

    def is_full(self) -> bool:
        """Whether every query may attend to every key."""
        return all(term is None for term in (self.key_start, self.key_valid, self.lowest, self.highest,
                                             self.head_mask, self.dense_extra))

    def allows(self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """The mask at (broadcastable) batch, head, query and key indices; FlexAttention's mask_mod."""
        distance = kv - q - self.query_offset
        allowed = kv >= 0
        if self.key_start is not None:
            allowed = allowed & (kv >= self.key_start[b]) & (kv < self.key_end[b])
        if self.key_valid is not None:
            allowed = allowed & self.key_valid[b, kv]
        if self.lowest is not None:
            allowed = allowed & (distance >= self.lowest)
        if self.highest is not None:
            allowed = allowed & (distance <= self.highest)
        if self.head_mask is not None:
            allowed = allowed & self.head_mask(h, q + self.query_offset, kv)
        if self.dense_extra is not None:
            extra = self.dense_extra
            allowed = allowed & extra[b % extra.size(0), h % extra.size(1), q, kv]
        return allowed

    def restricted(self, lowest: int | None = None, highest: int | None = None) -> FlexMask | None:
        """This mask and lowest <= j - i' <= highest (shared by the layers: built once per record), or None when no
        query of the call meets such a key."""
        if lowest is not None and self.lowest is not None:
            lowest = max(lowest, self.lowest)
        if highest is not None and self.highest is not None:
            highest = min(highest, self.highest)
        lowest = self.lowest if lowest is None else lowest
        highest = self.highest if highest is None else highest
        reach_low, reach_high = self.distance_bounds()
        if (reach_low if lowest is None else max(lowest, reach_low)) > (
                reach_high if highest is None else min(highest, reach_high)):
            return None
        key = ("restricted", lowest, highest)
        if key not in self._built:
            self._built[key] = dataclasses.replace(self, lowest=lowest, highest=highest, key_dropout=None, _built={})
        return self._built[key].with_key_dropout(self.key_dropout)

    def with_key_dropout(self, key_dropout: KeyDropout | None) -> FlexMask:
        """This mask with one call's key dropout (None: without), sharing this record's block masks."""
        if key_dropout is self.key_dropout:
            return self
        return dataclasses.replace(self, key_dropout=key_dropout, _built=self._built)

    def distance_bounds(self) -> tuple[int, int]:
        """The smallest and largest distance j - i' this mask can allow: keys 0 .. m-1 against queries i' =
        `query_offset` .. `query_offset` + n - 1, within `lowest` .. `highest`."""
        lowest, highest = -(self.query_offset + self.query_length - 1), self.key_length - 1 - self.query_offset
        if self.lowest is not None:
            lowest = max(lowest, self.lowest)
        if self.highest is not None:
            highest = min(highest, self.highest)
        return lowest, highest

    def with_head_mask(self, head_mask: Callable, heads: int) -> FlexMask:
        """This mask and a scheme's per-head mask `head_mask(h, i', j)`."""
        if self.head_mask is not None:
            first = self.head_mask
            head_mask = lambda h, i, j: first(h, i, j) & head_mask(h, i, j)  # noqa: E731
        return dataclasses.replace(self, head_mask=head_mask, heads=max(self.heads, heads), _built={})

    def with_dense(self, mask: torch.Tensor) -> FlexMask:
        """This mask and a dense boolean mask broadcastable to [B, H, n, m] (read per entry)."""
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        if self.dense_extra is not None:
            mask = mask & self.dense_extra
        return dataclasses.replace(self, dense_extra=mask, heads=max(self.heads, mask.size(1)), _built={})

    def dense(self, device: torch.device | None = None) -> torch.Tensor | None:
        """The mask as a boolean [B, 1|H, n, m] tensor (eager and SDPA; one query per decoding step), None when
        nothing is masked."""
        if self.is_full():
            return None
        device = self._device(device)
        b = torch.arange(self.batch, device=device)[:, None, None, None]
        h = torch.arange(self.heads, device=device)[None, :, None, None]
        q = torch.arange(self.query_length, device=device)[None, None, :, None]
        kv = torch.arange(self.key_length, device=device)[None, None, None, :]
        return self.allows(b, h, q, kv).expand(self.batch, -1, self.query_length, self.key_length)

    def band(self, first: int, count: int, device: torch.device | None = None, heads: int = 1) -> torch.Tensor:
        """[B, 1|H, n, count] ([B, `heads`, n, count] with key dropout, which differs per head of the call): whether
        query i may attend to key j = i' + first + r (r < count), keys outside 0 .. m-1 and dropped keys excluded."""
        device = self._device(device)
        b = torch.arange(self.batch, device=device)[:, None, None, None]
        h = torch.arange(self.heads, device=device)[None, :, None, None]
        q = torch.arange(self.query_length, device=device)[None, None, :, None]
        kv = q + self.query_offset + first + torch.arange(count, device=device)
        inside = (kv >= 0) & (kv < self.key_length)
        kv = kv.clamp(0, self.key_length - 1)
        allowed = self.allows(b, h, q, kv) & inside
        if self.key_dropout is None:
            return allowed
        return allowed & self.key_dropout.keeps(b, torch.arange(heads, device=device)[None, :, None, None], q, kv)

    def block_mask(self, device: torch.device) -> Any:
        """The `BlockMask` (None when nothing is masked), built a block of queries at a time from `allows` (at most
        FLEX_BLOCK x m entries per batch entry and head at once), once per record."""
        if self.is_full():
            return None
        if "block_mask" not in self._built:
            self._built["block_mask"] = self._build_block_mask(device)
        return self._built["block_mask"]

    def _device(self, device: torch.device | None) -> torch.device:
        for tensor in (self.key_start, self.key_valid, self.dense_extra):
            if tensor is not None:
                return tensor.device
        return torch.device("cpu") if device is None else device

    def _build_block_mask(self, device: torch.device) -> Any:
        from torch.nn.attention.flex_attention import BlockMask

        block, query_length, key_length = FLEX_BLOCK, self.query_length, self.key_length
        key_blocks = math.ceil(key_length / block)
        b = torch.arange(self.batch, device=device)[:, None, None, None]
        h = torch.arange(self.heads, device=device)[None, :, None, None]
        kv = torch.arange(key_blocks * block, device=device)
        kv_inside = kv < key_length
        kv = kv.clamp(max=key_length - 1)[None, None, None, :]
        partial, full = [], []
        for index in range((query_length + block - 1) // block):   # over the count: a new length keeps the graph
            q = torch.arange(index * block, (index + 1) * block, device=device)
            inside = kv_inside & (q < query_length)[:, None]
            allowed = self.allows(b, h, q.clamp(max=query_length - 1)[None, None, :, None], kv) & inside
            allowed = allowed.expand(self.batch, self.heads, block, -1).reshape(
                self.batch, self.heads, block, key_blocks, block)
            some, every = allowed.any(-1).any(-2), allowed.all(-1).all(-2)
            partial.append(some & ~every)
            full.append(every)

        def sparse(blocks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            blocks = torch.stack(blocks, dim=2).to(torch.int32)  # [B, H, query blocks, key blocks]
            return blocks.sum(-1, dtype=torch.int32), torch.argsort(blocks, dim=-1, descending=True, stable=True).to(
                torch.int32)

        allows = self.allows
        return BlockMask.from_kv_blocks(*sparse(partial), *sparse(full), BLOCK_SIZE=block,
                                        mask_mod=lambda b, h, q, kv: allows(b, h, q, kv),
                                        seq_lengths=(query_length, key_length))


def as_flex_mask(attention_mask: torch.Tensor | FlexMask | None, batch: int, query_length: int,
                 key_length: int) -> FlexMask:
    """A kernel's mask argument as a `FlexMask` (a dense boolean tensor is read per entry)."""
    if isinstance(attention_mask, FlexMask):
        return attention_mask
    mask = FlexMask(batch, query_length, key_length)
    return mask if attention_mask is None else mask.with_dense(attention_mask)


def dense_mask(attention_mask: torch.Tensor | FlexMask | None, device: torch.device) -> torch.Tensor | None:
    """A kernel's mask argument as a dense boolean tensor (or None)."""
    return attention_mask.dense(device) if isinstance(attention_mask, FlexMask) else attention_mask


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


def flex_region(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: FlexMask, scaling: float,
                score_mod: Callable | None = None, with_lse: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One FlexAttention call over the keys `mask` allows: the output [B, H, n, d] (zero for a query with no key),
    and with `with_lse` the row log-sum-exp [B, H, n] (-inf for such a query). What a scheme's `fused_attention`
    composes. The mask's key dropout enters the score_mod."""
    attend = flex_kernel(query)
    block_mask = mask.block_mask(query.device)
    if mask.key_dropout is not None:
        score_mod = mask.key_dropout.score_mod(score_mod)
    if with_lse:
        return with_log_sum_exp(attend, query, key, value, score_mod, block_mask, scaling)
    return attend(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling), None


def flex_score_mod(score_bias: torch.Tensor | RelativeBias | DenseBias | None, table: torch.Tensor | None,
                   batch: int, heads: int, query_length: int, key_length: int, dtype: torch.dtype) -> Callable | None:
    """A score bias without a score_mod of its scheme's, read per score: a `RelativeBias` `table` through its bucket
    (n x R per head), or a dense bias (a tensor or a `DenseBias`, n x m)."""
    if isinstance(score_bias, RelativeBias):
        table, bucket = table.to(dtype).expand(batch, heads, query_length, -1), score_bias.bucket

        def score_mod(score, b, h, q, kv):
            return score + table[b, h, q, bucket(q, kv)]
        return score_mod
    if score_bias is not None:
        dense = dense_bias(score_bias, dtype).expand(batch, heads, query_length, key_length)

        def score_mod(score, b, h, q, kv):
            return score + dense[b, h, q, kv]
        return score_mod
    return None


def flex_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | FlexMask | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    score_bias: torch.Tensor | RelativeBias | None = None,
    value_term: Callable[[torch.Tensor], torch.Tensor] | None = None,
    output_attentions: bool = False,
    score_mod: Callable | None = None,
    fused_attention: Callable | None = None,
    key_dropout: KeyDropout | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FlexAttention (compiled with dynamic shapes on CUDA, the unfused reference elsewhere) with the mask as a
    `FlexMask` and what the scheme adds in its fused form: its `fused_attention` (its own composition of FlexAttention
    calls for a score bias and a value term together), else its `score_mod` (computed from indices and small tables), else a
    `RelativeBias` table read by bucket (recomputed in the backward when `score_bias.recompute`).

    A decoding step (one query) runs `sdpa_attention_forward` (one query's scores are [B, H, 1, m]: nothing to
    fuse); `output_attentions`, or a value term without a fused form (with a warning, once), run
    `eager_attention_forward` (the same equation). FlexAttention cannot drop
    probabilities after the softmax: attention dropout > 0 is an error (checked first); `key_dropout`
    (attention_dropout_kind "keys") runs fused, inside every FlexAttention call's score_mod and a scheme's band."""
    check_dropout_kernel("flex_attention", dropout, "probabilities")
    query_length = query.size(-2)
    unfused_value_term = value_term is not None and fused_attention is None
    if unfused_value_term and not (output_attentions or query_length == 1):
        cause = ("Shaw's a^V at randomized positions" if isinstance(value_term, RelativeValues)
                 and not value_term.consecutive else f"a value term ({type(value_term).__name__}) whose scheme gives "
                 "no fused_attention")
        logger.warning_once(f"flex_attention: {cause} has no fused form: it runs on eager, forming the n x m "
                            "attention probabilities")
    if query_length == 1 and not output_attentions:
        return sdpa_attention_forward(module, query, key, value, dense_mask(attention_mask, query.device), scaling,
                                      dropout, score_bias, value_term, key_dropout=key_dropout)
    if output_attentions or unfused_value_term:
        return eager_attention_forward(module, query, key, value, dense_mask(attention_mask, query.device), scaling,
                                       dropout, score_bias, value_term, key_dropout)
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    batch, heads, _, _ = query.shape
    key_length = key.size(-2)
    mask = as_flex_mask(attention_mask, batch, query_length, key_length).with_key_dropout(key_dropout)
    if fused_attention is not None:
        output = fused_attention(query, key, value, scaling, mask, flex_region)
    elif score_mod is not None or not isinstance(score_bias, RelativeBias):
        score_mod = score_mod or flex_score_mod(score_bias, None, batch, heads, query_length, key_length, query.dtype)
        output, _ = flex_region(query, key, value, mask, scaling, score_mod)
    else:
        def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            table = score_bias.table() if callable(score_bias.table) else score_bias.table
            table_mod = flex_score_mod(score_bias, table, batch, heads, query_length, key_length, query.dtype)
            return flex_region(query, key, value, mask, scaling, table_mod)[0]

        if score_bias.recompute and torch.is_grad_enabled():
            output = torch.utils.checkpoint.checkpoint(attend, query, key, value, use_reentrant=False)
        else:
            output = attend(query, key, value)
    return output.transpose(1, 2).contiguous(), None


# --- attn_implementation "relpos_triton" ---

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
        if not isinstance(score_bias, RelativeBias) or score_bias.clip_distance is None or not score_bias.consecutive:
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


def triton_fallback_cause(clipped: tuple[int, int] | None, score_bias: Any, value_term: Any,
                          output_attentions: bool) -> str | None:
    """Why Shaw's terms leave the fused kernel (None: the call has none of them, or they run fused): output_attentions,
    a mask other than padding ranges and causality, or randomized positions."""
    if clipped is not None:
        return "output_attentions" if output_attentions else (
            "a mask other than padding ranges and causality (self_attention_window, padding with holes)")
    clipped_bias = isinstance(score_bias, RelativeBias) and score_bias.clip_distance is not None
    if (clipped_bias and not score_bias.consecutive) or (
            isinstance(value_term, RelativeValues) and not value_term.consecutive):
        return "randomized positions"
    return None


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
    key_dropout: KeyDropout | None = None,
    kernel_cache: dict[Any, Any] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shaw's relative self-attention in one fused Triton kernel (`clipped_relative_attention`): the a^K bias read
    by distance, the a^V term from each row's probability mass per distance, padding from per-sequence key ranges,
    causal for the decoder, true attention dropout (after the softmax, seen by a^V too); the padding ranges come
    from the stack call's `kernel_cache` (`relpos_triton_prepare`). What it does not cover (`triton_clipped_terms`)
    runs on `TRITON_OTHERWISE`, with a warning (once) when Shaw's terms leave the kernel (`triton_fallback_cause`).
    On CUDA; on the CPU only under TRITON_INTERPRET=1."""
    if key_dropout is not None:
        check_dropout_kernel(TRITON_KERNEL, key_dropout.probability, "keys")
    check_device(query.device)
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    clipped = triton_clipped_terms(score_bias, value_term)
    causal = getattr(module, "is_causal", False)
    batch, _, query_length, _ = query.shape
    ranges = None
    if clipped is not None and not output_attentions:
        ranges = key_ranges(attention_mask, batch, query_length, key.size(-2), clipped[1], causal, query.device,
                            kernel_cache)
    if ranges is None:
        cause = triton_fallback_cause(clipped, score_bias, value_term, output_attentions)
        if cause is not None:
            logger.warning_once(f"relpos_triton: Shaw's relative attention with {cause} runs on {TRITON_OTHERWISE} "
                                "and eager, not on the fused kernel (slower, forming every score)")
        return RELPOS_ATTENTION_FUNCTIONS[TRITON_OTHERWISE](
            module, query, key, value, attention_mask, scaling, dropout, score_bias, value_term,
            output_attentions=output_attentions)
    max_distance, query_offset = clipped
    query_offset = int(query_offset)   # a fixed-size cache's fill level (a 0-dim tensor): the kernel takes an int
    bias_table = score_bias.full_table() if score_bias is not None else None
    output = clipped_relative_attention(query, key, value, bias_table, *ranges, scaling, dropout, query_offset,
                                        max_distance, causal, value_term)
    return output.transpose(1, 2).contiguous(), None


def relpos_triton_prepare(mask: torch.Tensor | None, context: PositionContext, batch: int, causal: bool,
                          only_causality: bool) -> None:
    """Checks a stack call's self-attention mask for padding ranges once, before its layers (`key_ranges`, a host
    sync unless the mask holds `only_causality`), into `context.kernel_cache`: under torch.compile the graph then
    breaks there, not in the layer loop, where dynamo would give up on the loop and compile each layer on its own.
    Only for a clipped-distance scheme at consecutive positions (`context.clip_distance`), the calls the kernel can
    take: the others never read the mask."""
    if context.clip_distance is None:
        return
    key_ranges(mask, batch, context.query_length, context.key_length, context.query_offset, causal, context.device,
               context.kernel_cache, only_causality)


# --- end of "relpos_triton" ---

# what a kernel reads once per stack call, before the layers: f(self-attention mask, context, batch, causal, whether
# the mask holds causality alone)
KERNEL_PREPARATIONS: dict[str, Callable[[torch.Tensor | None, PositionContext, int, bool, bool], None]] = {
    TRITON_KERNEL: relpos_triton_prepare,
}


def prepare_kernel(kernel: str | None, mask: torch.Tensor | None, context: PositionContext, batch: int,
                   causal: bool, only_causality: bool) -> None:
    """Runs `kernel`'s per-stack-call preparation (`KERNEL_PREPARATIONS`; most kernels have none). `only_causality`:
    the stack built `mask` from causality alone (no padding, window or scheme mask)."""
    preparation = KERNEL_PREPARATIONS.get(kernel)
    if preparation is not None:
        preparation(mask, context, batch, causal, only_causality)


def registered_kernels() -> list[str]:
    """The kernels an `attn_implementation` may name: hf_relpos' own and those transformers has registered (a Hub
    kernel, "owner/repo", registers itself as it loads)."""
    return sorted({*RELPOS_KERNELS, *ALL_ATTENTION_FUNCTIONS.valid_keys()})


def check_dropout_kernel(kernel: str | None, dropout: float, dropout_kind: str) -> None:
    """One ValueError when `kernel` (None: eager) cannot run attention dropout `dropout` of `dropout_kind` in
    training: "keys" runs on `KEY_DROPOUT_KERNELS` only (relpos_triton drops probabilities instead; any other kernel
    would ignore the draw); "probabilities" on every kernel but flex_attention (its score_mod acts before the
    softmax), transformers' and Hub kernels taking their dropout argument as usual."""
    if dropout <= 0:   # every attention call in evaluation: nothing to check
        return
    kernel = kernel or "eager"
    if dropout_kind == "keys":
        takes, refused = KEY_DROPOUT_KERNELS, kernel not in KEY_DROPOUT_KERNELS
    else:
        takes = PROBABILITY_DROPOUT_KERNELS
        refused = kernel in RELPOS_KERNELS and kernel not in takes
    if refused:
        other = "keys" if dropout_kind == "probabilities" else "probabilities"
        raise ValueError(f"attention_dropout_kind {dropout_kind!r} runs with attn_implementation {list(takes)}, got "
                         f"{kernel!r} with attention_dropout={dropout} in training; set attention_dropout_kind to "
                         f"{other!r}, attention_dropout to 0, or use one of those kernels")


# Kernels that run on some devices only: the check a run makes before it prepares anything (raising RuntimeError or
# ImportError); the others run wherever torch does (flex_attention off CUDA with a warning, eagerly).
KERNEL_DEVICE_CHECKS: dict[str, Callable[[torch.device], None]] = {TRITON_KERNEL: check_runs_on}


def check_kernel_device(kernel: str | None, device: torch.device, backward: bool = False) -> None:
    """One RuntimeError or ImportError when `kernel` (None: the model's default) cannot run on `device` here
    (`KERNEL_DEVICE_CHECKS` of the kernel transformers runs for the name, `kernel_run_for`); with `backward` (the
    caller trains), also when it has no backward there: FlexAttention on the CPU, where torch runs it forward only."""
    name = kernel_run_for(kernel)
    check = KERNEL_DEVICE_CHECKS.get(name or "")
    if check is not None:
        check(device)
    if backward and name == "flex_attention" and device.type == "cpu":
        raise RuntimeError("attn_implementation 'flex_attention' has no backward on 'cpu' (torch's FlexAttention runs "
                           "there forward only, to evaluate): train with 'sdpa' or 'eager' on this device, or "
                           "flex_attention on a CUDA GPU")


def kernel_run_for(name: str | None) -> str | None:
    """The kernel transformers runs for `attn_implementation` `name`: the name without the "paged|" prefix, which
    transformers drops from every kernel but its paged eager kernel (`_check_and_adjust_attn_implementation`)."""
    if name is None or name == PAGED_EAGER:
        return name
    return name.removeprefix(PAGED_PREFIX)


def check_kernel_name(name: str) -> str:
    """`name` when it names a registered kernel (with or without transformers' "paged|" prefix) or a Hub kernel
    "owner/repo"; else one ValueError listing the registered ones."""
    if "/" in name or kernel_run_for(name) in registered_kernels():
        return name
    raise ValueError(f"attn_implementation {name!r} is not a registered attention kernel: one of "
                     f"{registered_kernels()}, a Hub kernel 'owner/repo', or one registered with "
                     "transformers.AttentionInterface.register")


RELPOS_ATTENTION_FUNCTIONS = AttentionInterface()
RELPOS_ATTENTION_FUNCTIONS["eager"] = eager_attention_forward
RELPOS_ATTENTION_FUNCTIONS["sdpa"] = sdpa_attention_forward
RELPOS_ATTENTION_FUNCTIONS["flex_attention"] = flex_attention_forward
RELPOS_ATTENTION_FUNCTIONS[TRITON_KERNEL] = relpos_triton_attention_forward
# transformers checks a requested attn_implementation against its global registry (from_pretrained, from_config,
# set_attn_implementation): the name is registered there too, for this model's attention to look up locally.
AttentionInterface.register(TRITON_KERNEL, relpos_triton_attention_forward)
