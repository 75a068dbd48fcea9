"""`xl`: Transformer-XL relative attention (Dai et al. 2019, sec. 3.3)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import initialization as init

from .positions import PositionScheme, RelativeBias, attention_core, register_attention, rel_shift, sinusoids


@register_attention("xl")
class XLPositions(PositionScheme):
    """A_ij = q_i.k_j (a) + q_i.W_kR R_(i-j) (b) + u.k_j (c) + v.W_kR R_(i-j) (d), scaled by 1/sqrt(d).

    R is the parameter-free sinusoid of the distance i - j, clamped to [-clamp_len, clamp_len]; W_kR is per layer;
    u = `content_bias`, v = `position_bias`, per layer (`untie_relative_biases`) or shared by the stack's layers. Terms (a)+(c) = (q + u).k run as
    the attention product; (b)+(d) = (q + v).W_kR R for every distance, aligned by `rel_shift`. Bidirectional
    distances in the encoder, causal (i - j >= 0) in a decoder; `query_offset` counts cached or memory positions.
    """

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.clamp_len = config.clamp_len
        self.position_projections = nn.ModuleList(
            [nn.Linear(config.d_model, num_heads * head_dim, bias=False) for _ in range(num_layers)]
        )
        bias_count = num_layers if config.untie_relative_biases else 1
        self.content_bias = nn.Parameter(torch.empty(bias_count, num_heads, head_dim))
        self.position_bias = nn.Parameter(torch.empty(bias_count, num_heads, head_dim))
        self._inference_tables: dict[int, tuple] = {}

    def init_parameters(self, std: float) -> None:
        init.normal_(self.content_bias, mean=0.0, std=std)
        init.normal_(self.position_bias, mean=0.0, std=std)

    def _projected_encodings(
        self, layer_idx: int, largest_distance: int, count: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """W_kR R_d for d = largest_distance, largest_distance - 1, ... (`count` of them), clamped to clamp_len.

        At inference the projections of all distances in [-span, span] are kept per layer (keyed by the weight's
        version, so any update invalidates them): a cached decoding step gathers rows instead of projecting again.
        """
        distances = torch.arange(largest_distance, largest_distance - count, -1, device=device)
        if self.clamp_len is not None:
            distances = distances.clamp(-self.clamp_len, self.clamp_len)
        projection = self.position_projections[layer_idx]
        if torch.is_grad_enabled():
            return projection(sinusoids(distances, self.config.d_model, dtype))
        weight = projection.weight
        key = (id(weight), weight._version, dtype, weight.device)
        needed = max(abs(largest_distance), abs(largest_distance - count + 1))
        if self.clamp_len is not None:
            needed = min(needed, self.clamp_len)
        cached = self._inference_tables.get(layer_idx)
        if cached is None or cached[0] != key or cached[1] < needed:
            span = max(needed, 2 * cached[1] if cached is not None and cached[0] == key else 0, 64)
            if self.clamp_len is not None:
                span = min(span, self.clamp_len)
            positions = torch.arange(-span, span + 1, device=weight.device)
            cached = (key, span, projection(sinusoids(positions, self.config.d_model, dtype)))
            self._inference_tables[layer_idx] = cached
        return cached[2].index_select(0, distances + cached[1])

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
        batch, heads, query_length, head_dim = query.shape
        key_length = key.size(-2)
        bias_idx = layer_idx if self.content_bias.size(0) > 1 else 0
        largest_distance = query_offset + query_length - 1
        distance_count = key_length if self.is_causal else query_length + key_length - 1
        projected = self._projected_encodings(
            layer_idx, largest_distance, distance_count, query.dtype, query.device
        ).view(distance_count, heads, head_dim)
        position_scores = torch.matmul(
            query + self.position_bias[bias_idx][:, None, :].to(query.dtype), projected.permute(1, 2, 0)
        )
        scale = head_dim**-0.5
        position_scores = position_scores * scale
        last_distance_index = distance_count - 1
        score_bias = RelativeBias(
            table=position_scores,
            bucket=lambda i, j: (query_length - 1 - i + j).clamp(max=last_distance_index),
            key_length=key_length,
            densify=lambda: rel_shift(position_scores, key_length),
        )
        return attention_core(
            query + self.content_bias[bias_idx][:, None, :].to(query.dtype),
            key,
            value,
            allowed,
            score_bias=score_bias,
            scale=scale,
            dropout=dropout,
            kernel=self.kernel,
            output_attentions=output_attentions,
        )
