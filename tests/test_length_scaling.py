"""Log-length scaled cross-attention (`cross_attention_length_scaling`, Chiang & Cholak 2022): each
example's cross-attention logits times log m, m = its number of source tokens; checked against a loop in float64 on
every kernel, with padding, the KV cache, save/load and the model card."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import SCHEMES, TRANSFORMERS_KERNEL, assert_cached_generation_equals_uncached, tiny_config, tiny_model

import hf_relpos
from hf_relpos.model.modeling_relpos import RelPosAttention, attention_mask_for
from hf_relpos.publish.hub import render_model_card

pytestmark = pytest.mark.numerics


def cross_attention_by_loop(attention: RelPosAttention, states: torch.Tensor, source: torch.Tensor,
                            padding: torch.Tensor) -> torch.Tensor:
    """z_i = sum_j softmax_j(log(m) q_i . k_j / sqrt(d)) v_j per head over the m unpadded source tokens, then the
    output projection, term by term."""
    heads, head_dim = attention.num_heads, attention.head_dim
    batch, length = states.shape[:2]
    output = torch.zeros(batch, length, heads * head_dim, dtype=states.dtype)
    for b in range(batch):
        kept = [j for j in range(source.size(1)) if padding[b, j]]
        for i in range(length):
            query = attention.q_proj(states[b, i])
            for h in range(heads):
                part = slice(h * head_dim, (h + 1) * head_dim)
                logits = torch.stack([
                    math.log(len(kept)) * (query[part] @ attention.k_proj(source[b, j])[part]) / math.sqrt(head_dim)
                    for j in kept])
                weights = torch.softmax(logits, dim=0)
                output[b, i, part] = sum(w * attention.v_proj(source[b, j])[part] for w, j in zip(weights, kept, strict=True))
    return attention.out_proj(output)


@pytest.mark.parametrize("kernel", ["eager", "sdpa", "flex_attention"])
def test_scaled_cross_attention_is_the_equation_in_float64(kernel):
    config = tiny_config(cross_attention_length_scaling=True)
    config._attn_implementation = kernel
    torch.manual_seed(0)
    attention = RelPosAttention(config, 4, 0, is_cross_attention=True).double()
    states = torch.randn(3, 5, config.d_model, dtype=torch.float64)
    source = torch.randn(3, 9, config.d_model, dtype=torch.float64)
    padding = torch.ones(3, 9, dtype=torch.long)
    padding[1, 4:] = 0
    padding[2, 7:] = 0
    for given_padding in (padding, None):
        kept = padding if given_padding is not None else torch.ones_like(padding)
        mask = attention_mask_for(config, 3, 5, 9, 0, given_padding, causal=False, device=torch.device("cpu"))
        with torch.no_grad():
            output, _ = attention(states, mask, key_value_states=source)
            reference = cross_attention_by_loop(attention, states, source, kept)
        assert (output - reference).abs().max() < 1e-12
    attention.config = tiny_config(cross_attention_length_scaling=False)
    attention.config._attn_implementation = kernel
    with torch.no_grad():
        unscaled, _ = attention(states, mask, key_value_states=source)
    assert (unscaled - output).abs().max() > 1e-3


def sources() -> tuple[torch.Tensor, torch.Tensor]:
    input_ids = torch.randint(4, 40, (2, 11), generator=torch.Generator().manual_seed(5))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    return input_ids, attention_mask


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_a_padded_source_scores_as_it_does_alone(position_scheme):
    model = tiny_model(position_scheme, seed=2, cross_attention_length_scaling=True).double().eval()
    input_ids, attention_mask = sources()
    decoder_input_ids = input_ids[:, :5]
    with torch.no_grad():
        batched = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        alone = model(input_ids=input_ids[1:, :6], decoder_input_ids=decoder_input_ids[1:]).logits
        unscaled = tiny_model(position_scheme, seed=2).double().eval()(
            input_ids=input_ids[1:, :6], decoder_input_ids=decoder_input_ids[1:]).logits
    assert (batched[1] - alone[0]).abs().max() < 1e-12
    assert (alone - unscaled).abs().max() > 1e-6


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_scaled_cached_generation_equals_uncached(position_scheme, num_beams):
    model = tiny_model(position_scheme, seed=1, cross_attention_length_scaling=True)
    input_ids, attention_mask = sources()
    assert_cached_generation_equals_uncached(model, input_ids, attention_mask, num_beams)


def test_a_fully_padded_source_row_stays_finite():
    config = tiny_config(cross_attention_length_scaling=True)
    attention = RelPosAttention(config, 4, 0, is_cross_attention=True)
    padding = torch.ones(2, 6, dtype=torch.long)
    padding[1] = 0
    mask = attention_mask_for(config, 2, 3, 6, 0, padding, causal=False, device=torch.device("cpu"))
    with torch.no_grad():
        output, _ = attention(torch.randn(2, 3, config.d_model), mask, key_value_states=torch.randn(2, 6, config.d_model))
    assert torch.isfinite(output).all()


@pytest.mark.parametrize("value", [1, "true", None])
def test_cross_attention_length_scaling_is_validated(value):
    with pytest.raises(ValueError, match=rf"cross_attention_length_scaling must be true or false, got {value!r}"):
        tiny_config(cross_attention_length_scaling=value)


def test_a_transformers_kernel_refuses_length_scaling():
    model = tiny_model("rope", cross_attention_length_scaling=True)
    with pytest.raises(ValueError, match=r"cross_attention_length_scaling runs with attn_implementation \['eager', "
                                         rf"'sdpa', 'flex_attention', 'relpos_triton'\], got '{TRANSFORMERS_KERNEL}'"):
        model.set_attn_implementation(TRANSFORMERS_KERNEL)
    assert model.config._attn_implementation != TRANSFORMERS_KERNEL


def test_length_scaling_is_saved_and_named_in_the_model_card(tmp_path):
    model = tiny_model("shaw", cross_attention_length_scaling=True)
    model.save_pretrained(tmp_path)
    loaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.cross_attention_length_scaling is True
    assert "| cross-attention logits | times log(source length) |" in render_model_card(loaded.config)
    assert "| cross-attention logits | unscaled |" in render_model_card(tiny_config("shaw"))


@pytest.mark.parametrize("given_padding", [True, False], ids=["padding", "no_padding"])
def test_float16_counts_of_keys_beyond_its_largest_integer_stay_finite(given_padding):
    """log m is taken in float32 and rounded once into the queries' dtype: float16 holds no count above 65504 (the
    count cast first was inf, and so were the scaled queries and the output)."""
    config = tiny_config(cross_attention_length_scaling=True)
    config._attn_implementation = "sdpa"
    attention = RelPosAttention(config, 4, 0, is_cross_attention=True).half()
    key_length = 70_000
    padding = torch.ones(1, key_length, dtype=torch.long) if given_padding else None
    mask = attention_mask_for(config, 1, 2, key_length, 0, padding, causal=False, device=torch.device("cpu"))
    factor = attention.log_key_counts(mask, key_length, torch.float16)
    assert factor.dtype == torch.float16 and (factor == torch.tensor(math.log(key_length), dtype=torch.float16)).all()
    with torch.no_grad():
        output, _ = attention(torch.randn(1, 2, config.d_model, dtype=torch.float16), mask,
                              key_value_states=torch.randn(1, key_length, config.d_model, dtype=torch.float16))
    assert torch.isfinite(output).all()
