"""A scheme defined in a test file joins every shared test of the schemes with no other edit.

conftest.py imports each tests/test_scheme_*.py before collection, so what such a file registers is in `SCHEMES`
(oracle, cache, save/load, kernels, ... parametrize over it) and its `ORACLE_CASES` join the float64 oracle of
test_positions.py. `toy` is a per-layer, per-head learned scalar for each clipped distance:
e_ij = q_i k_j / sqrt(d) + b^l_h(clip(j - i, K)), K = `toy_max_distance` (T5's bias with exact buckets)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from conftest import tiny_config
from torch import nn

import hf_relpos
from hf_relpos import AttentionTerms, PositionContext, PositionScheme, integer_field, register_position_scheme
from hf_relpos.model.positions import clipped_distance
from hf_relpos.testing import check_position_scheme, softmax_attention_by_loop


@register_position_scheme("toy")
class ToyPositions(PositionScheme):
    config_fields = (integer_field("toy_max_distance", 2, "largest distance with its own bias", minimum=0,
                                   symbol="K"),)

    def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.max_distance = config.toy_max_distance
        self.bias = nn.Parameter(torch.zeros(num_layers, num_heads, 2 * self.max_distance + 1))

    def init_parameters(self, std):
        nn.init.normal_(self.bias, std=std)

    def prepare(self, context: PositionContext) -> PositionContext:
        query_positions, key_positions = context.query_and_key_positions()
        index = clipped_distance(key_positions[None, :] - query_positions[:, None], self.max_distance)
        return context.extend(ToyContext, index=index)

    def terms(self, layer_idx, query, key, context):
        dtype = torch.promote_types(context.dtype, torch.float32)
        return AttentionTerms(score_bias=self.bias[layer_idx].to(dtype)[:, context.index][None])


@dataclass(frozen=True)
class ToyContext(PositionContext):
    """`index` [n, m]: clip(j - i, K) + K."""

    index: torch.Tensor | None = None


def naive_toy(scheme, layer, q, k, v, allowed, query_at, key_at):
    """e_ij = q_i k_j / sqrt(d) + b^l_h(clip(j - i, K)), term by term in float64."""
    scores = torch.zeros(q.size(0), q.size(1), q.size(2), k.size(2), dtype=torch.float64)
    for b in range(q.size(0)):
        for h in range(q.size(1)):
            for i in range(q.size(2)):
                for j in range(k.size(2)):
                    distance = max(-scheme.max_distance, min(scheme.max_distance, key_at[j] - query_at[i]))
                    scores[b, h, i, j] = (q[b, h, i] @ k[b, h, j] / math.sqrt(q.size(-1))
                                          + scheme.bias[layer, h, distance + scheme.max_distance])
    return softmax_attention_by_loop(scores, allowed, lambda b, h, i, j: v[b, h, j])


ORACLE_CASES = [("toy", naive_toy, {}), ("toy", naive_toy, {"toy_max_distance": 0})]


def test_a_scheme_of_a_test_file_is_among_the_shared_tests_schemes():
    from conftest import SCHEMES  # conftest imports this file before it lists the schemes

    assert "toy" in SCHEMES and hf_relpos.POSITION_SCHEMES["toy"] is ToyPositions


def test_the_toy_bias_reaches_the_model():
    """Its terms change the encoder's states (the shared tests would pass for a scheme that never reached attention)."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("toy")).eval()
    input_ids = torch.randint(4, 40, (2, 6))
    with torch.no_grad():
        before = model.get_encoder()(input_ids=input_ids).last_hidden_state
        model.model.encoder.positions.bias.add_(4.0 * torch.arange(5.0))
        after = model.get_encoder()(input_ids=input_ids).last_hidden_state
    assert (before - after).abs().max() > 1e-3   # float32 noise is below 1e-6


def test_a_scheme_files_order_blind_schemes_are_left_out_of_the_reversal_test():
    """A scheme of a test file that cannot tell a sequence from its reversal (a bias of |i - j| alone, as ALiBi's)
    names itself in the file's ORDER_BLIND_SCHEMES, and the reversal test (ORDER_AWARE_SCHEMES) leaves it out, as it
    does `none` and `alibi`; toy's bias is by the signed distance, so toy stays in."""
    from types import SimpleNamespace

    from conftest import ORDER_AWARE_SCHEMES, order_aware_schemes

    assert "toy" in ORDER_AWARE_SCHEMES and "alibi" not in ORDER_AWARE_SCHEMES
    symmetric = SimpleNamespace(ORDER_BLIND_SCHEMES=("toy_symmetric",), ORACLE_CASES=[])
    assert order_aware_schemes(("shaw", "alibi", "toy", "toy_symmetric"), [symmetric]) == ("shaw", "toy")


def test_the_toy_scheme_passes_the_packages_check_as_a_users_scheme_would():
    """What a scheme kept in a package of its own calls from its tests: hf_relpos.testing.check_position_scheme, with
    its oracle and its config fields."""
    check_position_scheme("toy", oracle=naive_toy, config_overrides={"toy_max_distance": 3})
