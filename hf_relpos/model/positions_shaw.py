"""`shaw`: relation-aware self-attention (Shaw, Uszkoreit, Vaswani 2018)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import initialization as init

from .positions import (
    MAX_POSITIONS,
    AttentionTerms,
    PositionContext,
    PositionScheme,
    RelativeBias,
    RelativeValues,
    SchemeCard,
    boolean_field,
    clipped_distance,
    clipped_rel_shift,
    computed_once,
    integer_field,
    number_field,
    padded_table,
    product_dtype,
    region_attention,
    register_position_scheme,
    rows_by_index,
    times_table,
)

SHAW_BIBTEX = """@inproceedings{shaw2018self,
  title     = {Self-Attention with Relative Position Representations},
  author    = {Shaw, Peter and Uszkoreit, Jakob and Vaswani, Ashish},
  booktitle = {Proceedings of the 2018 Conference of the North American Chapter of the Association for
               Computational Linguistics: Human Language Technologies, Volume 2 (Short Papers)},
  pages     = {464--468},
  year      = {2018}
}"""


def describe(config: Any) -> str:
    """The model-card text: eqs. 3-4 with the terms this config uses, and what each layer learns."""
    k = config.max_relative_position
    head_dims = [config.d_model // config.encoder_attention_heads, config.d_model // config.decoder_attention_heads]
    size = (f"d_z = {head_dims[0]}" if head_dims[0] == head_dims[1]
            else f"d_z = {head_dims[0]} in the encoder and {head_dims[1]} in the decoder")
    key_term = " + a^K_{ij}" if config.use_relative_keys else ""
    value_term = " + a^V_{ij}" if config.use_relative_values else ""
    tables = [name for name, used in (("a^K", config.use_relative_keys), ("a^V", config.use_relative_values)) if used]
    if config.relative_embeddings_shared_across_heads:
        sharing = "one table shared by all heads of a layer, as in the paper"
    else:
        sharing = "one table per head"
    learned = (f"Each self-attention layer learns 2k+1 = {2 * k + 1} vectors of size {size} for "
               f"{' and '.join(f'${name}$' for name in tables)} ({sharing}); distances beyond k = {k} are clipped "
               "to ±k." if tables else "Both relative terms are off, so attention has no position information.")
    return (
        "Relation-aware self-attention (Shaw, Uszkoreit and Vaswani 2018): the edge between query position i and key "
        "position j carries learned vectors a^K and a^V that depend only on the clipped distance j − i.\n\n"
        f"$$e_{{ij}} = \\frac{{x_i W^Q \\left(x_j W^K{key_term}\\right)^\\top}}{{\\sqrt{{d_z}}}}, \\qquad "
        f"z_i = \\sum_j \\alpha_{{ij}} \\left(x_j W^V{value_term}\\right)$$\n\n"
        "$$a^K_{ij} = w^K_{\\mathrm{clip}(j-i,\\,k)}, \\quad a^V_{ij} = w^V_{\\mathrm{clip}(j-i,\\,k)}, \\quad "
        "\\mathrm{clip}(x, k) = \\max(-k, \\min(k, x))$$\n\n"
        f"{learned}"
    )


@register_position_scheme("shaw")
class ShawPositions(PositionScheme):
    """Shaw et al. (2018): e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_z) (eq. 4), z_i = sum_j alpha_ij (v_j + a^V_ij)
    (eq. 3), a^K_ij = w^K_clip(j-i,k), a^V_ij = w^V_clip(j-i,k) (sec. 3.2).

    Per layer (`relative_keys[layer]`, `relative_values[layer]`), 2k+1 vectors of size d_z for keys and for values,
    shared across heads (paper) or one table per head. Efficient form (eq. 5, sec. 3.3): e_ij split into
    q_i k_j^T + q_i (a^K_ij)^T, the second term a `RelativeBias` of q_i . w^K_r for the 2k+1 distances r, laid out
    over the keys by `clipped_rel_shift` (eager, SDPA); the a^V value term (`RelativeValues`) sums each row's
    probabilities into the 2k+1 distance buckets, then multiplies by w^V. On FlexAttention, at consecutive positions,
    both come from key regions and the band (`region_attention`); under randomized positions a^K is read per
    query-key pair inside the score_mod (O(n (2k+1) d + n^2)). No n x n x d tensor.
    """

    takes_fixed_size_cache = True

    config_fields = (
        integer_field("max_relative_position", 16, "clipping distance: relative distances beyond ±k share one vector",
                      symbol="k", maximum=MAX_POSITIONS - 1,
                      maximum_reason=f"a table of 2k + 1 rows, sized for at most {MAX_POSITIONS} tokens; k >= n - 1 "
                                     "already gives every distance among n tokens its own row"),
        boolean_field("use_relative_keys", True, "add a^K_ij to the keys (eq. 4)", symbol="a^K"),
        boolean_field("use_relative_values", True, "add a^V_ij to the values (eq. 3)", symbol="a^V"),
        boolean_field("relative_embeddings_shared_across_heads", True,
                      "one table per layer shared by its heads (the paper); false: one table per head"),
        number_field("relative_embedding_init_std", None,
                     "std of the a^K and a^V tables at initialisation; null: sqrt(2 / (2k + 1 + d_z)), the scale "
                     "of Tensor2Tensor's default initialiser (the paper's code)", optional=True),
    )
    card = SchemeCard(
        title="relative position representations (Shaw et al. 2018)",
        description=describe,
        bibtex=(SHAW_BIBTEX,),
        tags=("relative-position",),
    )

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.max_relative_position = config.max_relative_position
        self.table_init_std = config.relative_embedding_init_std
        table_shape = (num_layers, 2 * self.max_relative_position + 1, head_dim)
        if not config.relative_embeddings_shared_across_heads:
            table_shape = (num_layers, num_heads, *table_shape[1:])
        self.relative_keys = nn.Parameter(torch.empty(table_shape)) if config.use_relative_keys else None
        self.relative_values = nn.Parameter(torch.empty(table_shape)) if config.use_relative_values else None

    def init_parameters(self, std: float) -> None:
        """N(0, relative_embedding_init_std) tables. Null draws them at the variance of Shaw et al.'s Tensor2Tensor
        code, whose default initialiser (uniform_unit_scaling: fan-average variance scaling) gives a (2k + 1) x d_z
        table variance 2 / (2k + 1 + d_z). The linears' `std` (init_std) is not used: at 0.02 the relative terms start
        an order of magnitude below the content terms."""
        table_std = self.table_init_std
        if table_std is None:
            table_std = math.sqrt(2.0 / (2 * self.max_relative_position + 1 + self.head_dim))
        for tables in (self.relative_keys, self.relative_values):
            if tables is not None:
                init.normal_(tables, mean=0.0, std=table_std)

    def prepare(self, context: PositionContext) -> ShawContext:
        """The positions, shared by the layers; the bucket of every query-key pair (`ShawContext.index`) is computed
        only when a kernel reads it."""
        return context.extend(ShawContext, max_relative_position=self.max_relative_position,
                              relative_keys=self.relative_keys, relative_values=self.relative_values)

    def terms(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, context: ShawContext) -> AttentionTerms:
        """a^K as a `RelativeBias` and a^V as `RelativeValues` (eager, SDPA), and at consecutive positions their fused
        form (`fused_attention`); each computed only when a kernel asks. For one query i (a decoding step) a^K_ij and
        a^V_ij depend on the key alone: the keys k_j + a^K_ij (eq. 4 unfactored) and a^V_ij added to the values
        (`value_bias`: eq. 3 unfactored, z_i = sum_j p_ij (v_j + a^V_ij)), so every kernel runs the step as plain
        attention, without the probabilities. Without either (`use_relative_keys` and `use_relative_values` false)
        no term: plain attention."""
        key_length = key.size(-2)
        kmax, offset, consecutive = self.max_relative_position, context.query_offset, context.positions is None
        if query.size(-2) == 1:   # a decoding step: both terms by the key alone, read once for the stack's layers
            key_rows, value_rows = context.step_rows
            return AttentionTerms(key=None if key_rows is None else key + key_rows[layer_idx].to(key.dtype),
                                  value_bias=None if value_rows is None else value_rows[layer_idx].to(key.dtype))
        value_term = None
        if self.relative_values is not None:
            # w^V in the dtype of its product with the masses (promote_types(dtype, float32)): autocast's, under it
            values_dtype = product_dtype(torch.promote_types(query.dtype, torch.float32), query.device.type)
            value_term = RelativeValues(context.aligned_table(1, layer_idx, values_dtype), kmax, offset,
                                        lambda: context.index, consecutive)
        score_bias = None
        if self.relative_keys is not None:
            def table() -> torch.Tensor:
                return self.key_profile(context, layer_idx, query)

            if consecutive:
                def bucket(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
                    return clipped_distance(j - i - offset, kmax)
            else:   # randomized positions: the [n, m] index, read before any kernel traces the bucket
                index = context.index

                def bucket(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
                    return index[i, j]
            score_bias = RelativeBias(table=table, bucket=bucket, key_length=key_length,
                                      clip_distance=kmax, query_offset=offset, consecutive=consecutive)
            if consecutive and not context.fixed_size_cache and query.size(-2) > 1:   # slices by the int offset
                score_bias.densify = lambda bias: clipped_rel_shift(bias.full_table(), key_length, kmax, offset)
            elif consecutive:   # a fixed-size cache's steps: read by the layers' shared index
                score_bias.densify = lambda bias: bias_by_index(bias.full_table(), context.index)
        fused = None
        if consecutive and (score_bias is not None or value_term is not None):
            def fused(query, key, value, scaling, mask, attend):
                return self.fused_attention(context, layer_idx, query, key, value, scaling, mask, attend)
        return AttentionTerms(score_bias=score_bias, value_term=value_term, fused_attention=fused)

    def key_profile(self, context: ShawContext, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        """q_i . w^K_r / sqrt(d_z) for the 2k+1 distances r (eq. 5's second term before it is laid out over the
        keys), [B, H, n, aligned_width(2k+1)]: the columns beyond 2k are zeros (the padded table's zero rows), kept so
        that the product is not sliced (a kernel reading the table by distance takes it whole, and its gradient
        needs no slice's backward); the scale applied to the small table rather than to the product, the table in the
        product's dtype (under autocast cast once per stack call for every layer, not by each layer's product)."""
        return times_table(query, context.aligned_table(0, layer_idx, product_dtype(query.dtype, query.device.type)))

    def fused_attention(self, context: ShawContext, layer_idx: int, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, scaling: float, mask: Any, attend: Any) -> torch.Tensor:
        """Eqs. 3-4 without the probability matrix: `region_attention`, plus the a^V masses times w^V."""
        output, masses = self.region_attention(context, layer_idx, query, key, value, scaling, mask, attend)
        if self.relative_values is not None:
            with torch.autocast(query.device.type, enabled=False):   # masses stay in promote_types(dtype, float32)
                output = output + times_table(masses, context.aligned_table(1, layer_idx), transpose=False)
        return output.to(query.dtype)

    def region_attention(self, context: ShawContext, layer_idx: int, query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor, scaling: float, mask: Any, attend: Any
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """sum_j p_ij v_j with a^K in the scores, and the masses M [B, H, n, 2k+1] (M_ir: the probability of the keys
        at clipped distance r - k), both in promote_types(dtype, float32), at consecutive positions, by the shared
        `region_attention`: the left (j - i' <= -k) and right (j - i' >= k) regions, where a^K is the per-row
        constant q_i . w^K_0 and q_i . w^K_2k, through FlexAttention without score_mod, and the band |j - i'| < k with
        a^K's buckets 1 .. 2k-1, O(n k d) per head; M are the merge's weights (each >= 0, summing to 1; zero for a
        query with no key). Every gradient (q, k, v, w^K, w^V) follows by autograd, without atomic adds."""
        kmax = self.max_relative_position

        def bias(first: int, count: int, compute: torch.dtype) -> tuple:
            if self.relative_keys is None:
                return None, None, None
            # q_i . w^K_r / sqrt(d) for the 2k + 1 buckets; the band's diagonal d has bucket d + k
            profile = self.key_profile(context, layer_idx, query.to(compute))
            return profile[..., 0], profile[..., first + kmax : first + kmax + count], profile[..., 2 * kmax]

        output, masses = region_attention(query, key, value, scaling, mask, attend, 1 - kmax, max(0, 2 * kmax - 1),
                                          bias, with_weights=True)
        if kmax == 0:   # both regions have the one bucket 0
            masses = masses.sum(-1, keepdim=True)
        return output, masses


def bias_by_index(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """bias[b, h, i, j] = table[b, h, i, index[i, j]] for the profile `table` [B, H, n, >= 2k+1] and a stack call's bucket
    `index` [n, m], for the calls of several queries on a fixed-size cache (whose keys are slots: no skew by an int
    offset)."""
    batch, heads, query_length, _ = table.shape
    return table.gather(-1, index.expand(batch, heads, query_length, index.size(-1)))


@dataclass(frozen=True)
class ShawContext(PositionContext):
    """`index` [n, m]: clip(j - i', k) + k for query i and key j (computed when first read)."""

    max_relative_position: int = 0
    relative_keys: torch.Tensor | None = field(default=None, repr=False, compare=False)
    relative_values: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def clip_distance(self) -> int | None:
        """k at consecutive positions for a call of several queries; None for one query, whose terms are on the keys
        and values (plain attention: no kernel reads the mask's padding ranges), and at randomized positions."""
        return self.max_relative_position if self.positions is None and self.query_length > 1 else None

    @computed_once
    def index(self) -> torch.Tensor:
        query_positions, key_positions = self.query_and_key_positions()
        return clipped_distance(key_positions[None, :] - query_positions[:, None], self.max_relative_position)

    def aligned_tables(self, which: int, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
        """Each layer's w^K / sqrt(d_z) (`which` 0) or w^V (1) with zero rows up to the aligned width
        (`padded_table`), [(H,) R', d], in `dtype` (default: the table's): one scale, pad, cast and split of the
        stacked table for the stack call's layers (backward: one stack, cast and pad), where each layer's products
        would select, scale, pad and cast their own (operators and copies per layer, forward and backward alike)."""
        tables = (self.relative_keys, self.relative_values)[which]
        dtype = dtype or tables.dtype
        name = f"aligned_tables_{which}_{str(dtype).removeprefix('torch.')}"   # an attribute's name (torch.compile)
        return self.once(name, lambda: aligned(which, tables).to(dtype).unbind(0))

    def aligned_table(self, which: int, layer_idx: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Layer `layer_idx`'s w^K / sqrt(d_z) (`which` 0) or w^V (1), padded (`padded_table`), in `dtype`
        (default: the table's): from `aligned_tables` when the layers share what the stack call computes, else
        (gradient checkpointing, where the stack call's values are recomputed at every read) that layer's table
        alone, so that a read scales and pads one layer's rows rather than every layer's."""
        if self.reuse_across_layers:
            return self.aligned_tables(which, dtype)[layer_idx]
        table = (self.relative_keys, self.relative_values)[which][layer_idx]
        return aligned(which, table).to(dtype or table.dtype)

    @computed_once
    def step_rows(self) -> tuple[tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...] | None]:
        """For one query (a decoding step): w^K_clip(j - i', k) and w^V_clip(j - i', k) for every key j, each layer's
        [m, d] (or [H, m, d]) rows of the `relative_keys` and `relative_values` tables [L, (H,) 2k+1, d] at `index`,
        read once for the stack's layers (one gather per table, split by layer), None for a table the scheme lacks."""
        def rows(tables: torch.Tensor | None) -> tuple[torch.Tensor, ...] | None:
            return None if tables is None else rows_by_index(tables, self.index).unbind(0)

        return rows(self.relative_keys), rows(self.relative_values)


def aligned(which: int, table: torch.Tensor) -> torch.Tensor:
    """w^K / sqrt(d_z) (`which` 0: eq. 5's scale on the small table, not on the product) or w^V (1), one layer's
    [(H,) 2k+1, d] or a stack's [L, ...], with zero rows up to the aligned width (`padded_table`)."""
    return padded_table(table * table.size(-1) ** -0.5 if which == 0 else table)
