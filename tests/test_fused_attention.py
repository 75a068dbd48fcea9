"""The fused paths: Shaw's a^V from the row log-sum-exp (no probability matrix), and the once-per-forward `prepare`
stage (positions, masks, FlexAttention block masks, RoPE's rotations computed once, not per layer or per step)."""

from __future__ import annotations

import pytest
import torch
from conftest import SCHEMES, tiny_config

import hf_relpos
from hf_relpos.model import attention_functions
from hf_relpos.model.attention_functions import relative_value_masses
from hf_relpos.model.positions import PositionContext, RelativeBias, RelativeValues, clipped_rel_shift

BATCH, HEADS, HEAD_DIM = 2, 3, 5
TOLERANCE = 1e-12


def masked_scores(query, key, bias, allowed, scaling):
    """Scores with the bias added and disallowed keys at -inf, in float64."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling + bias
    return scores.masked_fill(~allowed, float("-inf"))


def allowed_keys(query_length, key_length, offset, causal, padded, keys_from=None):
    """[B, 1, n, m]: key j is real (the second sequence loses its last two keys when `padded`), not after query i in
    a causal stack, and j >= i + `keys_from` when given."""
    queries = torch.arange(offset, offset + query_length)[:, None]
    keys = torch.arange(key_length)[None, :]
    allowed = torch.ones(BATCH, 1, query_length, key_length, dtype=torch.bool)
    if padded:
        allowed[1, :, :, -2:] = False
    if causal:
        allowed &= keys <= queries
    if keys_from is not None:
        allowed &= keys >= queries + keys_from
    return allowed


@pytest.mark.parametrize("with_key_bias", [True, False], ids=["a^K+a^V", "a^V"])
@pytest.mark.parametrize("k", [0, 1, 2, 4, 20])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("shape", [("encoder", 7, 7, False), ("decoder", 7, 7, True), ("cached", 2, 9, True),
                                   ("encoder-long", 12, 12, False)], ids=lambda s: s[0])
def test_masses_from_the_log_sum_exp_equal_the_probabilities_summed_by_distance(shape, padded, k, with_key_bias):
    """M[i, r] = sum of p_ij over the keys at clipped distance r - k (Shaw et al. 2018, eq. 3 regrouped), computed
    from the band scores and two log-sum-exps, against the scatter of the explicit softmax: values and gradients
    (queries, keys, the a^K table) in float64 at 1e-12, with padding, a causal mask and a cached step's offset."""
    _, query_length, key_length, causal = shape
    offset = key_length - query_length
    generator = torch.Generator().manual_seed(17 * k + query_length)
    make = lambda *size: torch.randn(*size, generator=generator, dtype=torch.float64, requires_grad=True)  # noqa: E731
    query, key = make(BATCH, HEADS, query_length, HEAD_DIM), make(BATCH, HEADS, key_length, HEAD_DIM)
    key_table = make(BATCH, HEADS, query_length, 2 * k + 1)
    scaling = HEAD_DIM**-0.5
    score_bias = None
    dense = torch.zeros(BATCH, HEADS, query_length, key_length, dtype=torch.float64)
    if with_key_bias:
        score_bias = RelativeBias(table=key_table, bucket=lambda i, j: (j - i - offset).clamp(-k, k) + k,
                                  key_length=key_length)
        dense = clipped_rel_shift(key_table, key_length, k, offset)
    allowed = allowed_keys(query_length, key_length, offset, causal, padded)
    index = hf_relpos.relative_position_index(query_length, key_length, k, offset)
    values = RelativeValues(torch.zeros(2 * k + 1, HEAD_DIM, dtype=torch.float64), k, offset, index, True)

    scores = masked_scores(query, key, dense, allowed, scaling)
    expected = values.mass_by_distance(torch.softmax(scores, dim=-1))
    log_normalizer = torch.logsumexp(scores, dim=-1)
    right_log_mass = None
    if not causal:
        right_allowed = allowed_keys(query_length, key_length, offset, causal, padded, keys_from=k)
        right_log_mass = torch.logsumexp(masked_scores(query, key, dense, right_allowed, scaling), dim=-1)
    masses = relative_value_masses(query, key, scaling, score_bias, allowed, log_normalizer, right_log_mass, values)

    assert (masses - expected).abs().max().item() < TOLERANCE
    upstream = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    inputs = [query, key, key_table] if with_key_bias else [query, key]
    expected_grads = torch.autograd.grad((expected * upstream).sum(), inputs, retain_graph=True)
    if k == 0:  # one bucket holding each row's whole mass: a constant 1, whose gradient vanishes
        assert not masses.requires_grad
        grads = [torch.zeros_like(tensor) for tensor in inputs]
    else:
        grads = torch.autograd.grad((masses * upstream).sum(), inputs)
    for name, grad, expected_grad in zip(("query", "key", "a^K"), grads, expected_grads, strict=False):
        assert (grad - expected_grad).abs().max().item() < TOLERANCE, name


def test_a_query_with_no_key_has_zero_masses_and_finite_gradients():
    """A fully padded row (log-sum-exp -inf) gets no mass and no NaN, in the values or the gradients."""
    query = torch.randn(BATCH, HEADS, 4, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    key = torch.randn(BATCH, HEADS, 4, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    allowed = allowed_keys(4, 4, 0, False, False)
    allowed[1] = False
    scores = masked_scores(query, key, 0.0, allowed, 1.0)
    right = torch.logsumexp(scores.masked_fill(~allowed_keys(4, 4, 0, False, False, keys_from=2), float("-inf")), -1)
    values = RelativeValues(torch.zeros(5, HEAD_DIM), 2, 0, hf_relpos.relative_position_index(4, 4, 2), True)
    masses = relative_value_masses(query, key, 1.0, None, allowed, torch.logsumexp(scores, -1), right, values)
    assert torch.all(masses[1] == 0) and torch.allclose(masses[0].sum(-1), torch.ones(HEADS, 4, dtype=torch.float64))
    masses.sum().backward()
    assert torch.isfinite(query.grad).all() and torch.isfinite(key.grad).all()


def count_calls(monkeypatch, owner, name):
    calls = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.mark.parametrize("attention_type", SCHEMES)
def test_prepare_runs_once_per_stack_call_and_terms_once_per_layer(attention_type, monkeypatch):
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(attention_type, encoder_layers=3)).eval()
    scheme_class = hf_relpos.ATTENTION_REGISTRY[attention_type]
    prepares = count_calls(monkeypatch, scheme_class, "prepare")
    terms = count_calls(monkeypatch, scheme_class, "terms")
    input_ids = torch.randint(4, 40, (2, 6))
    with torch.no_grad():
        model(input_ids=input_ids, decoder_input_ids=input_ids[:, :4])
    assert len(prepares) == 2  # encoder + decoder
    assert len(terms) == 3 + 2


def test_cached_rope_decoding_rotates_only_the_new_token(monkeypatch):
    """The KV cache holds rotated keys: a decoding step rotates one query and one key per layer, never the cache."""
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("rope")).eval()
    rotated_lengths = []
    rotate = hf_relpos.model.positions_rope.RotaryPositions.rotate

    def recorded(self, states, cos, sin):
        rotated_lengths.append(states.size(-2))
        return rotate(self, states, cos, sin)

    monkeypatch.setattr(hf_relpos.model.positions_rope.RotaryPositions, "rotate", recorded)
    input_ids = torch.randint(4, 40, (1, 6))
    with torch.no_grad():
        out = model(input_ids=input_ids, decoder_input_ids=input_ids[:, :3], use_cache=True)
        rotated_lengths.clear()
        model(encoder_outputs=(out.encoder_last_hidden_state,), decoder_input_ids=input_ids[:, 3:4], use_cache=True,
              cache=out.cache)
    assert rotated_lengths == [1, 1] * 2  # a key and a query in each of the decoder's two layers


@pytest.mark.parametrize("attention_type", ["shaw", "directional", "t5"])
def test_flex_block_masks_are_built_once_per_mask_not_per_layer(attention_type, monkeypatch):
    """Every layer of a stack shares its self-attention mask (the scheme's mask combined once) and so its BlockMask."""
    config = tiny_config(attention_type, encoder_layers=4, decoder_layers=4)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).eval()
    model.set_attn_implementation("flex_attention")
    import torch.nn.attention.flex_attention as flex

    builds = count_calls(monkeypatch, flex, "create_block_mask")
    input_ids = torch.randint(4, 40, (2, 6))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 4:] = 0
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids)
    right_edge = 1 if attention_type == "shaw" else 0  # Shaw's a^V: the encoder's right-edge mask
    assert len(builds) == 3 + right_edge  # encoder self, decoder self, cross


def test_the_dense_t5_bias_is_expanded_once_per_forward(monkeypatch):
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("t5", encoder_layers=4)).eval()
    densified = count_calls(monkeypatch, RelativeBias, "dense")
    input_ids = torch.randint(4, 40, (2, 6))
    computed = []
    original = attention_functions.dense_bias

    def recorded(score_bias, dtype):
        result = original(score_bias, dtype)
        computed.append(result.data_ptr())
        return result

    monkeypatch.setattr(attention_functions, "dense_bias", recorded)
    with torch.no_grad():
        model(input_ids=input_ids, decoder_input_ids=input_ids)
    assert len(densified) == 4 + 2 and len(set(computed)) == 2  # one tensor per stack, read by every layer


def test_prepare_sees_the_cached_positions():
    """A decoding step's context starts at the cache length (the true distance of the new query)."""
    scheme = hf_relpos.ATTENTION_REGISTRY["shaw"](tiny_config("shaw"), 1, 4, 8, is_causal=True)
    context = scheme.prepare(PositionContext(1, 7, 6, None, torch.device("cpu"), torch.float64))
    assert context.index.tolist() == [[max(0, 3 - 6 + j) for j in range(7)]]
