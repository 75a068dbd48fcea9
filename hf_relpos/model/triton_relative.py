"""attn_implementation "relpos_triton": a fused FlashAttention-2-style Triton kernel for relative self-attention whose
score bias and value term depend on the clipped distance clip(j - i', k) (Shaw et al. 2018: a^K and a^V).

The kernel (`triton_relative_kernels.py`, imported on the first call only, so that triton is needed only when this
kernel runs) takes the per-row bias table T = c q a^K^T [B, H, n, W >= 2k+1] (columns beyond 2k unread, their gradient
zero: Shaw's aligned product, unsliced) and returns the output sum_j D_ij v_j, each row's dropped probability mass per
clipped distance M [B, H, n, 2k+1 padded to a multiple of 8 with zeros] and the row log-sum-exp (in base 2); the a^V
term is the small matmul M a^V outside, and autograd takes the tables' gradients through T and M (small matmuls too,
all with an aligned distance dimension: `positions.times_table`). No n x m tensor is formed, forward or backward;
attention dropout is applied to the probabilities after the softmax with a Philox mask (16-bit draws, `dropout_rate`)
regenerated in the backward. Registered as torch.library custom ops with their autograd, so that torch.compile sees one
opaque op each way; eager calls run the same two functions through an autograd.Function (`FusedAttention`), without the
custom op's per-call dispatch (host time: the fused path's training step is host-bound on an H200,
docs/results/gpu_check/2026-11-28_h200_8ed37f1).

Runs on CUDA; on the CPU only under Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported), which
the tests use.
"""

from __future__ import annotations

import functools
import math
import os
import re
from typing import Any

import torch

KERNEL_NAME = "relpos_triton"
INTERPRETER_BLOCK = 16   # block size under the interpreter: small, so that tests cross several tiles
INTERPRETER_BLOCKS = (INTERPRETER_BLOCK, INTERPRETER_BLOCK)   # (BLOCK_M, BLOCK_N) of the kernels there
SEED_RANGE = (2**32, 2**62)  # seeds always int64 in the kernels' signature (no second compile for small seeds)
# Compile options of every launch, given rather than left to triton's default: multiplies and adds fused into FMAs
# (one rounding each), as every GPU measurement ran; triton 3.9 warns when it is left unset and 3.10 turns it off.
COMPILE_OPTIONS = {"enable_fp_fusion": True}
# The ops' namespace, one per copy of this module (hf_relpos' own, a Hub folder's remote code), so that copies loaded in
# one process do not register the same op twice: "hf_relpos_model" for hf_relpos.
OP_NAMESPACE = re.sub(r"\W", "_", __name__.rpartition(".")[0] or __name__)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_device(device: torch.device) -> None:
    """One clear error unless the kernel can run on `device`: CUDA, or the CPU under Triton's interpreter."""
    if device.type == "cuda" or (device.type == "cpu" and interpreting()):
        return
    raise RuntimeError(
        f"attn_implementation {KERNEL_NAME!r} runs on CUDA GPUs (on the CPU only under Triton's interpreter, "
        f"TRITON_INTERPRET=1, for tests), not on {device.type!r}: use 'sdpa' or 'eager' on this device")


def check_runs_on(device: torch.device) -> None:
    """`check_device`, then triton's presence (the kernels' module raises its ImportError): what a run checks once,
    before it prepares anything, that the kernel's first call would otherwise find."""
    check_device(device)
    from . import triton_relative_kernels  # noqa: F401


def next_power_of_2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def launch_settings(query: torch.Tensor, max_distance: int, with_bias: bool, mass_columns: int, causal: bool,
                    dropout: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The kernels' compile-time settings: head size, flags, the masses' width (0: no a^V), accumulation dtype
    (float32, float64 for float64 inputs) and matmul precision (IEEE for float32/64: no TF32; half-precision operands
    multiplied as float32 under the interpreter, `matmul`): float64 from triton 3.5 on, else one error. Those of the
    forward and dq/dT kernels, then those of the dk/dv kernel (without the distance and mass widths), formed once per
    setting (each layer's call reads them: host time)."""
    # each use imports the kernels' module: triton only when they run
    from .triton_relative_kernels import FLOAT64_DOT, FLOAT64_DOT_TRITON, triton
    if query.dtype == torch.float64 and not FLOAT64_DOT:
        raise RuntimeError(f"attn_implementation {KERNEL_NAME!r} runs float64 inputs with triton "
                           f"{'.'.join(map(str, FLOAT64_DOT_TRITON))} or newer "
                           f"(float64 tl.dot); triton {triton.__version__} is installed: upgrade triton, or run "
                           f"the model in float32 or bfloat16, or on 'sdpa'")
    return settings_for(query.size(-1), query.dtype, max_distance, with_bias, mass_columns, causal, dropout > 0,
                        interpreting())


@functools.lru_cache(maxsize=256)
def settings_for(head_dim: int, dtype: torch.dtype, max_distance: int, with_bias: bool, mass_columns: int,
                 causal: bool, dropout: bool, interpreted: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """`launch_settings` of one setting (not to be changed: shared by every call of that setting)."""
    from .triton_relative_kernels import tl

    accumulate_64 = dtype == torch.float64
    keys = dict(HEAD_DIM=head_dim, BLOCK_D=max(16, next_power_of_2(head_dim)), HAS_BIAS=with_bias,
                HAS_VALUES=mass_columns > 0, CAUSAL=causal, DROPOUT=dropout,
                ACC=tl.float64 if accumulate_64 else tl.float32,
                PRECISION=("ieee" if dtype in (torch.float32, torch.float64)
                           else "float32" if interpreted else "tf32"))
    return keys | dict(BLOCK_I=next_power_of_2(max(2 * max_distance - 1, 1)), MASS_COLUMNS=mass_columns), keys


GRID_LIMIT = 65535   # CUDA's most programs along a grid's dimension 1 or 2 (dimension 0: 2^31 - 1)


def program_grid(tiles: int, batch_heads: int) -> tuple[int, int, int]:
    """The kernels' grid (tiles, min(B H, GRID_LIMIT), ceil(B H / GRID_LIMIT)): batch x heads over dimensions 1 and
    2, so that more than CUDA's 65,535 (a large batch or beam) launch. Up to the limit it is (tiles, B H, 1), the
    launch of (tiles, B H): dimension 0 runs fastest, and one (b, h)'s tiles, neighbours, share its K and V in L2.
    The kernels take b H + h = program_id(1) + program_id(2) num_programs(1) (`program_batch_head`), and the
    programs beyond B H of the last slice return."""
    return tiles, min(batch_heads, GRID_LIMIT), ceil_div(batch_heads, GRID_LIMIT)


def launch(kernel: Any, tuned: Any, blocks: str, rows: int, batch_heads: int, *args: Any, **settings: Any) -> None:
    """Run `kernel` over the `program_grid` of (row blocks, batch x heads): autotuned on a GPU, with
    `INTERPRETER_BLOCKS` under the interpreter. `blocks` names the block size that tiles `rows`. Once the autotuner
    has chosen the blocks for a call's key, later calls with that key launch the kernel with them directly (the
    autotuner's own launch path re-forms its key from every argument: host time on a host-bound step)."""
    settings["batch_heads"] = batch_heads
    if interpreting():
        block_m, block_n = INTERPRETER_BLOCKS
        kernel[program_grid(ceil_div(rows, block_m if blocks == "BLOCK_M" else block_n), batch_heads)](
            *args, **settings, BLOCK_M=block_m, BLOCK_N=block_n, **COMPILE_OPTIONS)
        return
    # as Autotuner.run: one config (blocks pinned, as ablate_relpos_triton does) is launched whatever the cache holds;
    # a config with a pre_hook is left to the autotuner, which runs it
    config = tuned.cache.get(autotuner_key(tuned, args, settings)) if len(tuned.configs) > 1 else None
    if config is None or config.pre_hook is not None:   # tunes a new key (benchmarks every config once), launches
        tuned[lambda meta: program_grid(ceil_div(rows, meta[blocks]), batch_heads)](*args, **settings,
                                                                                    **COMPILE_OPTIONS)
    else:
        chosen = config.all_kwargs()
        kernel[program_grid(ceil_div(rows, chosen[blocks]), batch_heads)](*args, **settings, **chosen,
                                                                          **COMPILE_OPTIONS)


def autotuner_key(tuned: Any, args: tuple, settings: dict[str, Any]) -> tuple:
    """The key under which triton's autotuner `tuned` caches its choice for a call (as `Autotuner.run` forms it: the
    key parameters' values, then the dtype of every argument that has one, in the call's order: the tensors, the
    other arguments being ints, floats, bools, strings and triton dtypes)."""
    positions = key_positions(tuned)
    key = [settings[name] if name in settings else args[positions[name]] for name in tuned.keys]
    key += [str(value.dtype) for value in (*args, *settings.values()) if isinstance(value, torch.Tensor)]
    return tuple(key)


@functools.cache
def key_positions(tuned: Any) -> dict[str, int]:
    """Where each of `tuned`'s key parameters comes in its kernel's arguments."""
    return {name: tuned.arg_names.index(name) for name in tuned.keys}


def length_bucket(query_length: int, key_length: int) -> int:
    """The autotuning key's length: the longer side rounded up to a power of two, at least 64 and at most 8192 (the
    best blocks depend on the length; a bucket per power of two tunes a few times per run, not once per shape)."""
    return min(max(next_power_of_2(max(query_length, key_length)), 64), 8192)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


DROPOUT_LEVELS = 2**16   # the kernels draw each keep decision as a 16-bit integer >= round(2^16 p)


def dropout_threshold(dropout: float) -> int:
    """round(2^16 p): a key is dropped when its 16-bit draw is below it; one clear error when the rate rounds to 1."""
    threshold = round(dropout * DROPOUT_LEVELS)
    if not 0 <= threshold < DROPOUT_LEVELS:
        raise ValueError(f"attn_implementation {KERNEL_NAME!r}: attention dropout {dropout} must be in [0, 1 - 2^-17), "
                         "the rates its 16-bit draws express")
    return threshold


def dropout_rate(dropout: float) -> float:
    """The rate the kernels drop at for an asked rate p: round(2^16 p) / 2^16 (within 2^-17 of p), exactly, and the
    kept probabilities are scaled by 1 / (1 - that rate), so the dropped attention is unbiased."""
    return dropout_threshold(dropout) / DROPOUT_LEVELS


def scales(query: torch.Tensor, scaling: float, dropout: float) -> torch.Tensor:
    """(c, 1 / (1 - `dropout_rate`), log2(e)) in the accumulation dtype: a float argument would reach the kernel as
    float32."""
    return scales_on(torch.promote_types(query.dtype, torch.float32), query.device, scaling, dropout)


@functools.lru_cache(maxsize=64)
def scales_on(dtype: torch.dtype, device: torch.device, scaling: float, dropout: float) -> torch.Tensor:
    """`scales`, built once per setting (no host-to-device copy per layer)."""
    return torch.tensor([scaling, 1.0 / (1.0 - dropout_rate(dropout)), 1.0 / math.log(2.0)], dtype=dtype, device=device)


def strides(*tensors: torch.Tensor) -> list[int]:
    """The batch, head and row strides of [B, H, n, d] tensors whose last dimension is contiguous."""
    return [stride for tensor in tensors for stride in tensor.stride()[:3]]


def with_unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


MAX_ROW_SPAN = 2**31 - 1   # the kernels address a head's rows with 32-bit offsets from a 64-bit base


def check_row_spans(**tensors: torch.Tensor) -> None:
    """One clear error when a head of a [B, H, n, *] tensor spans more elements than 32-bit row offsets reach."""
    for name, tensor in tensors.items():
        span = (tensor.size(2) - 1) * tensor.stride(2) + tensor.size(3) if tensor.numel() else 0
        if span > MAX_ROW_SPAN:
            raise ValueError(f"attn_implementation {KERNEL_NAME!r}: one head of {name} spans {span} elements (row "
                             f"stride {tensor.stride(2)}), more than the kernels' 32-bit row offsets reach "
                             f"({MAX_ROW_SPAN}): use 'sdpa' or 'eager' for such tensors")


def empty_in_order_of(reference: torch.Tensor, last: int, dtype: torch.dtype) -> torch.Tensor:
    """An empty [B, H, n, last] tensor laid out in the order of `reference` [B, H, n, d]: token-major ([B, n, H, last]
    memory) when the reference's heads are closer in memory than its rows (the model's heads, also as slices of a
    fused buffer), so that its products with the distance tables need no copy; head-major otherwise."""
    batch, heads, length, _ = reference.shape
    if reference.stride(1) < reference.stride(2):
        return reference.new_empty(batch, length, heads, last, dtype=dtype).transpose(1, 2)
    return reference.new_empty(batch, heads, length, last, dtype=dtype)


def masses_in_order_of(query: torch.Tensor, max_distance: int, mass_columns: int) -> torch.Tensor:
    """M [B, H, n, mass_columns] in query's order and the accumulation dtype, for the forward kernel to fill: its
    first 2k+1 columns, and the others (padding to an aligned width) with zeros."""
    if 0 < mass_columns < 2 * max_distance + 1:
        raise ValueError(f"attn_implementation {KERNEL_NAME!r}: mass_columns {mass_columns} is less than "
                         f"2k + 1 = {2 * max_distance + 1}")
    return empty_in_order_of(query, mass_columns, torch.promote_types(query.dtype, torch.float32))


def fused_forward(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias_table: torch.Tensor | None,
    key_start: torch.Tensor, key_end: torch.Tensor, seed: torch.Tensor, scaling: float, dropout: float,
    query_offset: int, max_distance: int, causal: bool, mass_columns: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o [B, H, n, d], M [B, H, n, mass_columns], lse log2(e) [B, H, n]: each row's log-sum-exp in base 2, -inf for
    a row without a key): see the kernels' module docstring. M's columns beyond 2k+1 are zero (the value term's
    aligned width, `RelativeValues.mass_columns`); 0 columns: no masses, no value term. `bias_table` [B, H, n, W]:
    T[i, r] in its first 2k+1 columns (W >= 2k+1; the others are not read). Keys of sequence b are those in
    [key_start[b], key_end[b]); `seed` [1] int64 keys the dropout mask; the scale c must be positive."""
    if not scaling > 0:
        raise ValueError(f"attn_implementation {KERNEL_NAME!r}: the attention scale must be positive, got {scaling}")
    if bias_table is not None and bias_table.size(-1) < 2 * max_distance + 1:
        raise ValueError(f"attn_implementation {KERNEL_NAME!r}: the bias table has {bias_table.size(-1)} columns, "
                         f"fewer than 2k + 1 = {2 * max_distance + 1}")
    query, key, value = (with_unit_last_stride(tensor) for tensor in (query, key, value))
    batch, heads, query_length, head_dim = query.shape
    key_length = key.size(-2)
    accumulate = torch.promote_types(query.dtype, torch.float32)
    output = torch.empty_like(query)   # query's layout: token-major [B, n, H, d] memory needs no copy to merge heads
    masses = masses_in_order_of(query, max_distance, mass_columns)
    lse = query.new_empty(batch, heads, query_length, dtype=accumulate)
    settings, _ = launch_settings(query, max_distance, bias_table is not None, mass_columns, causal, dropout)
    table = query if bias_table is None else with_unit_last_stride(bias_table)
    check_row_spans(query=query, key=key, value=value, bias_table=table, masses=masses)
    from .triton_relative_kernels import relative_forward_kernel, tuned_forward

    launch(relative_forward_kernel, tuned_forward, "BLOCK_M", query_length, batch * heads,
           query, key, value, table, output, masses, lse, key_start, key_end, scales(query, scaling, dropout),
           int(seed.item()), dropout_threshold(dropout), *strides(query, key, value, table, output, masses), heads,
           query_length, key_length, query_offset, max_distance, length_bucket(query_length, key_length), **settings)
    return output, masses, lse


relative_attention = torch.library.custom_op(f"{OP_NAMESPACE}::relative_attention", mutates_args=())(fused_forward)


@relative_attention.register_fake
def _(query, key, value, bias_table, key_start, key_end, seed, scaling, dropout, query_offset, max_distance, causal,
      mass_columns):
    batch, heads, query_length, _ = query.shape
    query = with_unit_last_stride(query)
    return (torch.empty_like(query), masses_in_order_of(query, max_distance, mass_columns),
            query.new_empty(batch, heads, query_length, dtype=torch.promote_types(query.dtype, torch.float32)))


def fused_backward(
    grad_output: torch.Tensor, grad_masses: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
    value: torch.Tensor, bias_table: torch.Tensor | None, output: torch.Tensor, masses: torch.Tensor,
    lse: torch.Tensor, key_start: torch.Tensor, key_end: torch.Tensor, seed: torch.Tensor, scaling: float,
    dropout: float, query_offset: int, max_distance: int, causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dT) of `fused_forward` (dT in the bias table's shape and dtype, zero beyond its first 2k+1
    columns; [B, H, n, 0] without one): the dq/dT kernel first, which also stores each row's Delta_i = dO_i . o_i +
    sum_r dM_ir M_ir, then the dk/dv kernel."""
    query, key, value = (with_unit_last_stride(tensor) for tensor in (query, key, value))
    batch, heads, query_length, _ = query.shape
    key_length = key.size(-2)
    accumulate = torch.promote_types(query.dtype, torch.float32)
    grad_output, grad_masses = with_unit_last_stride(grad_output), with_unit_last_stride(grad_masses)
    # each gradient in its input's layout (token-major projections: no copy to merge heads)
    grad_query, grad_key, grad_value = (torch.empty_like(tensor) for tensor in (query, key, value))
    with_bias = bias_table is not None
    # dT as wide as the table and in its dtype: the kernel rounds its sums once as it stores them (no cast after)
    # and writes zeros beyond 2k+1
    grad_table = empty_in_order_of(query, bias_table.size(-1) if with_bias else 0,
                                   bias_table.dtype if with_bias else accumulate)
    check_row_spans(grad_output=grad_output, grad_masses=grad_masses, grad_table=grad_table)
    settings, keys_settings = launch_settings(query, max_distance, with_bias, masses.size(-1), causal, dropout)
    table = query if bias_table is None else with_unit_last_stride(bias_table)
    common = (key_start, key_end, scales(query, scaling, dropout), int(seed.item()), dropout_threshold(dropout),
              *strides(query, key, value, table, grad_output, grad_masses))
    sizes = (heads, query_length, key_length, query_offset, max_distance, length_bucket(query_length, key_length))
    delta = output.new_empty(batch, heads, query_length, dtype=accumulate)   # written by the dq/dT kernel
    from .triton_relative_kernels import (
        relative_backward_keys_kernel,
        relative_backward_queries_kernel,
        tuned_backward_keys,
        tuned_backward_queries,
    )

    launch(relative_backward_queries_kernel, tuned_backward_queries, "BLOCK_M", query_length,
           batch * heads, query, key, value, table, grad_output, grad_masses, output, masses, lse, delta, grad_query,
           grad_table, *common, *strides(grad_query, grad_table, output, masses), *sizes,
           table_columns=grad_table.size(-1), **settings)
    launch(relative_backward_keys_kernel, tuned_backward_keys, "BLOCK_N", key_length, batch * heads,
           query, key, value, table, grad_output, grad_masses, lse, delta, grad_key, grad_value, *common,
           *strides(grad_key, grad_value), *sizes, **keys_settings)
    return grad_query, grad_key, grad_value, grad_table


relative_attention_backward = torch.library.custom_op(f"{OP_NAMESPACE}::relative_attention_backward",
                                                     mutates_args=())(fused_backward)


@relative_attention_backward.register_fake
def _(grad_output, grad_masses, query, key, value, bias_table, output, masses, lse, key_start, key_end, seed,
      scaling, dropout, query_offset, max_distance, causal):
    distances = bias_table.size(-1) if bias_table is not None else 0
    dtype = bias_table.dtype if bias_table is not None else torch.promote_types(query.dtype, torch.float32)
    return (*(torch.empty_like(with_unit_last_stride(tensor)) for tensor in (query, key, value)),
            empty_in_order_of(with_unit_last_stride(query), distances, dtype))


def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    query, key, value, bias_table, key_start, key_end, seed, scaling, dropout, query_offset, max_distance, causal, _ = \
        inputs
    attention_output, masses, lse = output
    ctx.save_for_backward(query, key, value, bias_table, attention_output, masses, lse, key_start, key_end, seed)
    ctx.settings = (scaling, dropout, query_offset, max_distance, causal)
    ctx.mark_non_differentiable(lse)


def gradients(ctx: Any, grad_output: torch.Tensor | None, grad_masses: torch.Tensor | None,
              backward_function: Any) -> tuple:
    """The inputs' gradients from those of (o, M) by `backward_function` (the backward op, or `fused_backward`)."""
    query, key, value, bias_table, attention_output, masses, lse, key_start, key_end, seed = ctx.saved_tensors
    if grad_output is None:
        grad_output = torch.zeros_like(attention_output)
    if grad_masses is None:
        grad_masses = torch.zeros_like(masses)
    grad_query, grad_key, grad_value, grad_table = backward_function(
        grad_output, grad_masses, query, key, value, bias_table, attention_output, masses, lse, key_start, key_end,
        seed, *ctx.settings)
    return (grad_query, grad_key, grad_value, grad_table if bias_table is not None else None,
            None, None, None, None, None, None, None, None, None)


def backward(ctx: Any, grad_output: torch.Tensor | None, grad_masses: torch.Tensor | None, _: Any) -> tuple:
    return gradients(ctx, grad_output, grad_masses, relative_attention_backward)


relative_attention.register_autograd(backward, setup_context=setup_context)


class FusedAttention(torch.autograd.Function):
    """`relative_attention` in eager mode: the same forward and backward functions and autograd context, called
    directly instead of through the custom ops' dispatch (a per-call cost on the host, forward and backward)."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outputs = fused_forward(*inputs)
        setup_context(ctx, inputs, outputs)
        ctx.set_materialize_grads(False)   # `gradients` fills an unused output's gradient itself (lse's: never)
        return outputs

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor | None, grad_masses: torch.Tensor | None, _: Any) -> tuple:
        # with create_graph the backward op, which has no derivative and says so, instead of kernels whose outputs
        # autograd would take as constants (a silently wrong second derivative)
        return gradients(ctx, grad_output, grad_masses,
                         relative_attention_backward if torch.is_grad_enabled() else fused_backward)


def dropout_seed() -> torch.Tensor:
    """A fresh dropout seed [1] from torch's generator (so torch.manual_seed makes runs repeat)."""
    return torch.randint(*SEED_RANGE, (1,), dtype=torch.int64)


def dropout_keep_mask(seed: int, dropout: float, batch: int, heads: int, query_length: int, key_length: int,
                      device: torch.device) -> torch.Tensor:
    """The keep mask [B, H, n, m] (bool) that the kernels apply for `seed` and drop rate `dropout` (tests and
    debugging)."""
    check_device(device)
    keep = torch.empty(batch * heads, query_length, key_length, dtype=torch.int8, device=device)
    block = INTERPRETER_BLOCK
    from .triton_relative_kernels import dropout_keep_kernel

    # the tiles in dimension 0, row blocks fastest: key blocks beyond 65,535 (m > 2^20) launch too
    dropout_keep_kernel[program_grid(ceil_div(query_length, block) * ceil_div(key_length, block), batch * heads)](
        keep, seed, dropout_threshold(dropout), query_length, key_length, batch * heads, BLOCK_M=block, BLOCK_N=block,
        **COMPILE_OPTIONS)
    return keep.view(batch, heads, query_length, key_length).bool()


def key_ranges(attention_mask: torch.Tensor | None, batch: int, query_length: int, key_length: int,
               query_offset: int, causal: bool, device: torch.device,
               cache: dict[Any, Any] | None = None, only_causality: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per sequence, the keys [start, end) the boolean mask [B, 1, n, m] allows (int32 [B] each), or None when the
    mask is anything else than those ranges (and causality, j <= i + query_offset): padding on either side is
    covered, holes or windows are not. Reading the mask is a host sync (and under torch.compile a graph break), so
    it is skipped where the caller built the mask from causality alone (`only_causality`: no padding, window or
    scheme mask), which the kernel applies itself: every key. `cache` (a stack call's
    `PositionContext.kernel_cache`) keeps the answer for that mask tensor (or for no mask), so every layer of the
    call shares one check."""
    if attention_mask is not None and attention_mask.size(1) != 1:   # a mask per head is no padding range
        return None
    cache_key = ("key_ranges", query_offset, causal)   # one mask tensor (or none): one batch and shape
    if cache is not None and cache_key in cache and cache[cache_key][0] is attention_mask:
        return cache[cache_key][1]
    if attention_mask is None or only_causality:   # every key (kept too: two fills a layer on the device)
        ranges = (torch.zeros(batch, dtype=torch.int32, device=device),
                  torch.full((batch,), key_length, dtype=torch.int32, device=device))
    else:
        mask = attention_mask.expand(batch, 1, query_length, key_length)[:, 0]
        allowed = mask.any(dim=1)   # [B, m]: keys some query may attend to
        positions = torch.arange(key_length, device=device)
        start = torch.where(allowed, positions, key_length).amin(-1)
        end = torch.where(allowed, positions + 1, 0).amax(-1).clamp(min=start)
        expected = (positions >= start[:, None, None]) & (positions < end[:, None, None])
        if causal:
            rows = torch.arange(query_length, device=device)[:, None] + query_offset
            expected = expected & (positions[None, :] <= rows)
        matches = torch.equal(expected.expand_as(mask), mask)
        ranges = (start.to(torch.int32), end.to(torch.int32)) if matches else None
    if cache is not None:
        cache[cache_key] = (attention_mask, ranges)
    return ranges


def clipped_relative_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias_table: torch.Tensor | None,
    key_start: torch.Tensor, key_end: torch.Tensor, scaling: float, dropout: float, query_offset: int,
    max_distance: int, causal: bool, value_term: Any = None,
) -> torch.Tensor:
    """softmax-attention [B, H, n, d] with the bias T[i, clip(j - i', k) + k] (`bias_table` [B, H, n, >= 2k+1] or
    None) and, when `value_term` (a `RelativeValues`) is given, its term sum_r M[i, r] a^V_r from the kernel's
    masses; attention dropout `dropout` on the probabilities, seen by both terms. torch.compile traces the custom op,
    eager mode calls `FusedAttention`."""
    check_device(query.device)
    # a seed is drawn only for dropout: without it torch's random stream stays where sdpa and eager leave it
    seed = dropout_seed() if dropout > 0 else torch.full((1,), SEED_RANGE[0], dtype=torch.int64)
    fused = relative_attention if torch.compiler.is_compiling() else FusedAttention.apply
    output, masses, _ = fused(query, key, value, bias_table, key_start, key_end, seed, scaling, dropout, query_offset,
                              max_distance, causal, value_term.mass_columns if value_term is not None else 0)
    if value_term is not None:
        output = output + value_term.from_masses(masses).to(output.dtype)
    return output
