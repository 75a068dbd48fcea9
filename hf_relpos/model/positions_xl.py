"""`xl`: Transformer-XL relative attention (Dai et al. 2019, sec. 3.3)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import initialization as init

from .positions import (
    AttentionTerms,
    PositionContext,
    PositionScheme,
    RelativeBias,
    SchemeCard,
    boolean_field,
    computed_once,
    dense_by_query_blocks,
    integer_field,
    register_position_scheme,
    rel_shift,
    sinusoids,
)

DAI_BIBTEX = """@inproceedings{dai2019transformerxl,
  title     = {Transformer-{XL}: Attentive Language Models beyond a Fixed-Length Context},
  author    = {Dai, Zihang and Yang, Zhilin and Yang, Yiming and Carbonell, Jaime and Le, Quoc and
               Salakhutdinov, Ruslan},
  booktitle = {Proceedings of the 57th Annual Meeting of the Association for Computational Linguistics},
  pages     = {2978--2988},
  year      = {2019}
}"""


def describe(config: Any) -> str:
    """The model-card text: the four terms of A_ij and how R, u and v are set up in this config."""
    clamp = (f"clamped to ±{config.clamp_len}" if config.clamp_len is not None else "not clamped (`clamp_len: null`)")
    biases = ("u and v are learned per layer (untied)" if config.untie_relative_biases
              else "u and v are shared by all layers of a stack (tied)")
    return (
        "Transformer-XL relative attention (Dai et al. 2019, sec. 3.3): content and position terms, with a global "
        "content bias u and position bias v per head, scaled by 1/√d_head:\n\n"
        "$$A_{ij} = \\underbrace{q_i^\\top k_j}_{(a)} + \\underbrace{q_i^\\top W_{k,R} R_{i-j}}_{(b)} + "
        "\\underbrace{u^\\top k_j}_{(c)} + \\underbrace{v^\\top W_{k,R} R_{i-j}}_{(d)}$$\n\n"
        f"R is the parameter-free sinusoid of the distance i − j, {clamp}; W_{{k,R}} is learned per layer; {biases}. "
        "The encoder sees both signs of i − j, the decoder only i − j ≥ 0. W_{k,R} R is projected once per distance, and "
        "the (b)+(d) scores are aligned with the rel-shift trick, a block of queries at a time against only the "
        "distances the block meets."
    )


@register_position_scheme("xl")
class XLPositions(PositionScheme):
    """A_ij = q_i.k_j (a) + q_i.W_kR R_(i-j) (b) + u.k_j (c) + v.W_kR R_(i-j) (d), scaled by 1/sqrt(d).

    R is the parameter-free sinusoid of the distance i - j, clamped to [-clamp_len, clamp_len]; W_kR is per layer;
    u = `content_bias`, v = `position_bias`, per layer (`untie_relative_biases`) or shared by the stack's layers.
    Terms (a)+(c) = (q + u).k are the attention product (the query the terms return); (b)+(d) = (q + v).W_kR R for
    every distance form a `RelativeBias`, aligned by `rel_shift` (in the encoder a block of queries at a time,
    `blocked_position_bias`; a cached step's one query meets key j at its j-th distance, so its table is the bias).
    Bidirectional distances in the encoder, causal (i - j >= 0) in a decoder; `query_offset` counts cached or memory
    positions.
    """

    takes_fixed_size_cache = True

    config_fields = (
        integer_field("clamp_len", None, "largest distance |i - j| encoded in R (null: no clamping)", optional=True),
        boolean_field("untie_relative_biases", True,
                      "u and v per layer; false: shared by all layers of a stack (the paper's tied biases)"),
    )
    card = SchemeCard(
        title="Transformer-XL relative attention (Dai et al. 2019)",
        description=describe,
        bibtex=(DAI_BIBTEX,),
        tags=("relative-position",),
    )

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.clamp_len = config.clamp_len
        self.position_projections = nn.ModuleList(
            [nn.Linear(config.d_model, num_heads * head_dim, bias=False) for _ in range(num_layers)]
        )
        bias_count = num_layers if config.untie_relative_biases else 1
        self.content_bias = nn.Parameter(torch.empty(bias_count, num_heads, head_dim))
        self.position_bias = nn.Parameter(torch.empty(bias_count, num_heads, head_dim))
        self._sinusoid_tables: dict[torch.device, torch.Tensor] = {}

    def init_parameters(self, std: float) -> None:
        init.normal_(self.content_bias, mean=0.0, std=std)
        init.normal_(self.position_bias, mean=0.0, std=std)

    def encodings(self, distances: torch.Tensor, span: int, dtype: torch.dtype) -> torch.Tensor:
        """R_d [len(distances), d_model] for distances |d| <= span, read from a float64 table of the sinusoids of
        every distance up to the largest one seen (doubled as needed). The table depends on positions only, never on
        a weight, so it cannot go stale. `span` comes from the caller's integers: reading it off `distances` would
        make the CPU wait for the GPU."""
        table = self._sinusoid_tables.get(distances.device)
        if table is None or table.size(0) < 2 * span + 1:
            covered = 0 if table is None else table.size(0) // 2
            span = max(span, 2 * covered, 64)
            table = sinusoids(torch.arange(-span, span + 1, device=distances.device), self.config.d_model, torch.float64)
            self._sinusoid_tables[distances.device] = table
        return table.index_select(0, distances + table.size(0) // 2).to(dtype)

    def prepare(self, context: PositionContext) -> XLContext:
        """The distances of the call, largest first, their bucket per query-key pair and their encodings R_d."""
        query_length, key_length = context.query_length, context.key_length
        if context.positions is None:  # consecutive positions: the distances of query t are a window of one list
            distance_count = key_length if self.is_causal else query_length + key_length - 1
            largest_distance = context.query_offset + query_length - 1

            def bucket(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
                return (query_length - 1 - i + j).clamp(max=distance_count - 1)
        else:  # randomized positions: every distance between the smallest and the largest, read by the bucket
            query_positions, key_positions = context.query_and_key_positions()
            largest_distance = int(query_positions[-1] - key_positions[0])
            smallest_distance = 0 if self.is_causal else int(query_positions[0] - key_positions[-1])
            distance_count = largest_distance - smallest_distance + 1

            def bucket(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
                return (largest_distance - query_positions[i] + key_positions[j]).clamp(max=distance_count - 1)

        distances = largest_distance - torch.arange(distance_count, device=context.device)
        if context.fixed_size_cache:   # the offset is a tensor; the queries fit in the m slots: |distance| < m
            span = key_length - 1
        else:
            span = max(abs(largest_distance), abs(largest_distance - distance_count + 1))
        if self.clamp_len is not None:
            distances = distances.clamp(-self.clamp_len, self.clamp_len)
            span = min(span, self.clamp_len)
        return context.extend(XLContext, bucket=bucket, encodings=self.encodings(distances, span, context.dtype),
                              score_scale=self.head_dim**-0.5, content_bias=self.content_bias,
                              position_bias=self.position_bias)

    def position_scores(self, layer_idx: int, position_query: torch.Tensor, context: XLContext,
                        with_zero_row: bool = False) -> torch.Tensor:
        """(q + v) . W_kR R_d / sqrt(d) [B, H, n, count] for the context's `count` distances d (`with_zero_row`: and a
        zero score more, for `rel_shift`), from R^T / sqrt(d), formed once per stack call (`scaled_encodings_t`).

        Two orders of the same product, the cheaper one for the shapes at hand (`projects_queries`): project the
        distances (W_kR R_d, then dot each query: training, where B n >> count) or project the B n queries
        (W_kR^T (q + v), then dot each R_d: a cached decoding step, whose one query meets every earlier distance, its
        scores per distance then being the bias of its keys). The second needs the matrix W_kR itself: only a plain
        nn.Linear's weight is that (`projected_encodings`).
        """
        batch, heads, query_length, head_dim = position_query.shape
        dtype = position_query.dtype
        projection = self.position_projections[layer_idx]
        encodings_t = (context.scaled_encodings_and_a_zero_column_t if with_zero_row else context.scaled_encodings_t)
        model_dim, count = encodings_t.shape
        queries = batch * query_length
        if isinstance(projection, nn.Linear) and projects_queries(queries, heads, count, model_dim):
            by_head = position_query.transpose(0, 1).reshape(heads, queries, head_dim)
            projected_queries = torch.bmm(by_head, projection.weight.to(dtype).view(heads, head_dim, model_dim))
            scores = projected_queries.flatten(0, 1).mm(encodings_t.to(dtype))   # W_kR^T (q + v) . R_d / sqrt(d)
            return scores.view(heads, batch, query_length, count).transpose(0, 1)
        return torch.matmul(position_query, self.projected_encodings(layer_idx, context, dtype, heads, with_zero_row))

    def projected_encodings(self, layer_idx: int, context: XLContext, dtype: torch.dtype, heads: int,
                            with_zero_row: bool = False) -> torch.Tensor:
        """W_kR R_d / sqrt(d) per head: [H, d, count] (`with_zero_row`: and a zero column more). A module an adapter
        put in the nn.Linear's place (PEFT's LoRA: W_kR + B A) projects the encodings by its forward: its weight alone
        would leave the adapter out."""
        projection = self.position_projections[layer_idx]
        if isinstance(projection, nn.Linear):
            encodings_t = context.scaled_encodings_and_a_zero_column_t if with_zero_row else context.scaled_encodings_t
            return projection.weight.to(dtype).mm(encodings_t.to(dtype)).view(heads, self.head_dim, -1)
        encodings = (context.encodings_and_a_zero_row if with_zero_row else context.encodings).to(dtype)
        projected = projection(encodings) * context.score_scale
        return projected.view(encodings.size(0), heads, -1).permute(1, 2, 0)

    def blocked_position_bias(self, layer_idx: int, position_query: torch.Tensor, context: XLContext,
                              key_length: int) -> torch.Tensor:
        """The dense (b)+(d) bias [B, H, n, m] of bidirectional, consecutive positions, a block of queries at a time
        (`dense_by_query_blocks`): each block is multiplied with only the distances it meets (the context's n + m - 1,
        largest first) and aligned by `rel_shift`."""
        query_length, heads = position_query.size(-2), position_query.size(1)
        projected = self.projected_encodings(layer_idx, context, position_query.dtype, heads)
        return dense_by_query_blocks(
            query_length, key_length,
            lambda first, size, columns: torch.matmul(position_query[:, :, first : first + size], projected[..., columns]),
        )

    def terms(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, context: XLContext) -> AttentionTerms:
        """(a)+(c) as the query q + u; (b)+(d) as a `RelativeBias` whose table (every distance, for FlexAttention)
        and dense form (consecutive positions: query blocks in the encoder, the rel-shifted table in a decoder, whose
        table already holds one column per key, and a zero column more; one query's table itself) are computed only
        when a kernel asks."""
        key_length = key.size(-2)
        content_biases, position_biases = context.layer_biases
        bias_idx = layer_idx if len(content_biases) > 1 else 0
        position_query = query + position_biases[bias_idx].to(query.dtype)
        score_bias = RelativeBias(
            table=lambda: self.position_scores(layer_idx, position_query, context),
            bucket=context.bucket,
            key_length=key_length,
            recompute=True,
        )
        if context.positions is None and self.is_causal and query.size(-2) == 1:
            score_bias.densify = RelativeBias.full_table   # one query meets key j at the j-th distance: no rel-shift
        elif context.positions is None and self.is_causal:
            score_bias.densify = lambda bias: rel_shift(
                self.position_scores(layer_idx, position_query, context, with_zero_row=True), key_length)
        elif context.positions is None:
            score_bias.densify = lambda bias: self.blocked_position_bias(layer_idx, position_query, context, key_length)
        return AttentionTerms(query=query + content_biases[bias_idx].to(query.dtype), score_bias=score_bias)


@dataclass(frozen=True)
class XLContext(PositionContext):
    """`encodings` [count, d_model]: R_d for the call's distances, largest first; `bucket(i, j)`: the
    column of query i's position scores that holds its distance to key j; `score_scale` 1/sqrt(d); `content_bias`
    and `position_bias`: the scheme's u and v [L, H, d] (L = 1 when tied)."""

    bucket: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    encodings: torch.Tensor | None = None
    score_scale: float | None = None
    content_bias: torch.Tensor | None = None
    position_bias: torch.Tensor | None = None

    @computed_once
    def layer_biases(self) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """u and v of each layer (one when tied) as [H, 1, d], split off the [L, H, d] parameters once per stack call
        (unsqueeze, unbind), not selected and unsqueezed by every layer."""
        return self.content_bias.unsqueeze(2).unbind(0), self.position_bias.unsqueeze(2).unbind(0)

    @computed_once
    def scaled_encodings_t(self) -> torch.Tensor:
        """R^T / sqrt(d) [d_model, count]: what every layer's position scores multiply (`XLPositions.position_scores`),
        the score scale folded into the small encodings once per stack call, not into each layer's weight."""
        return (self.encodings * self.score_scale).t()

    @computed_once
    def scaled_encodings_and_a_zero_column_t(self) -> torch.Tensor:
        """`scaled_encodings_t` and one zero column more [d_model, count + 1]: a causal table from them has the m + 1
        distance columns that `rel_shift` reads as a view (the extra one, a future key's, is masked)."""
        return nn.functional.pad(self.scaled_encodings_t, (0, 1))

    @computed_once
    def encodings_and_a_zero_row(self) -> torch.Tensor:
        """`encodings` and one zero row more [count + 1, d_model]: what an adapter's module in W_kR's place projects
        for a causal table (`XLPositions.projected_encodings`)."""
        return nn.functional.pad(self.encodings, (0, 0, 0, 1))


def projects_queries(queries: int, heads: int, count: int, model_dim: int) -> bool:
    """Whether the position scores of `queries` queries against `count` distances take fewer products with the queries
    projected (W_kR^T (q + v), then one dot per R_d: queries (D + H count) per head dimension) than with the distances
    (W_kR R_d, then one dot per query: count (D + queries)), as when a few queries meet many distances."""
    return queries * (model_dim + heads * count) < count * (model_dim + queries)
