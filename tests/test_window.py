"""Local self-attention (`self_attention_window`): the mask is the definition |i - j| <= w, every kernel and the KV
cache honour it, and a token's states depend on its neighbourhood only."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    RELATIVE_SCHEMES,
    SCHEMES,
    TRANSFORMERS_KERNEL,
    assert_cached_generation_equals_uncached,
    tiny_config,
    tiny_model,
)

import hf_relpos
from hf_relpos.model.modeling_relpos import attention_mask_for
from hf_relpos.publish.hub import render_model_card

pytestmark = pytest.mark.numerics

WINDOW = 2


def mask_by_loop(padding: torch.Tensor, query_length: int, offset: int, causal: bool, window: int) -> torch.Tensor:
    """[B, 1, n, m]: query i (at position offset + i) may attend to key j when j is not padding, |offset + i - j| <=
    window and, if causal, j <= offset + i."""
    batch, key_length = padding.shape
    mask = torch.zeros(batch, 1, query_length, key_length, dtype=torch.bool)
    for b in range(batch):
        for i in range(query_length):
            for j in range(key_length):
                position = offset + i
                mask[b, 0, i, j] = bool(padding[b, j]) and abs(position - j) <= window and (not causal or j <= position)
    return mask


@pytest.mark.parametrize("causal, query_length, offset", [(False, 7, 0), (True, 7, 0), (True, 2, 5)],
                         ids=["encoder", "decoder", "cached-decoder"])
@pytest.mark.parametrize("window", [1, 2, 10])
def test_window_mask_is_the_definition(causal, query_length, offset, window):
    padding = torch.ones(3, offset + query_length, dtype=torch.long)
    padding[1, -2:] = 0
    padding[2, 1] = 0
    config = tiny_config(self_attention_window=window)
    for given_padding in (padding, None):
        mask = attention_mask_for(config, 3, query_length, offset + query_length, offset, given_padding, causal=causal,
                                  device=torch.device("cpu"), window=window)
        expected = mask_by_loop(padding if given_padding is not None else torch.ones_like(padding), query_length,
                                offset, causal, window)
        assert torch.equal(mask.expand_as(expected), expected)


def sources(changed_position: int | None = None) -> torch.Tensor:
    input_ids = torch.randint(4, 40, (2, 12), generator=torch.Generator().manual_seed(5))
    if changed_position is not None:
        input_ids[:, changed_position] = 4 + (input_ids[:, changed_position] - 4 + 7) % 36
    return input_ids


@pytest.mark.parametrize("position_scheme", RELATIVE_SCHEMES)
def test_with_a_window_a_token_depends_on_its_neighbourhood_only(position_scheme):
    """L layers of window w: encoder position 0 sees the tokens 0 .. L w, so changing token L w + 1 leaves its state
    unchanged (float64, 1e-12) and changing token L w changes it; the same holds in the decoder, causally."""
    model = tiny_model(position_scheme, seed=2, self_attention_window=WINDOW).double()
    reach = model.config.encoder_layers * WINDOW
    with torch.no_grad():
        encode = model.get_encoder()
        reference = encode(input_ids=sources()).last_hidden_state[:, 0]
        outside = encode(input_ids=sources(reach + 1)).last_hidden_state[:, 0]
        inside = encode(input_ids=sources(reach)).last_hidden_state[:, 0]
        assert (outside - reference).abs().max() < 1e-12
        assert (inside - reference).abs().max() > 1e-6

        def last_decoder_state(decoder_input_ids):
            return model(input_ids=sources(), decoder_input_ids=decoder_input_ids).logits[:, -1]

        reference = last_decoder_state(sources())
        last = sources().size(1) - 1
        assert (last_decoder_state(sources(last - reach - 1)) - reference).abs().max() < 1e-12
        assert (last_decoder_state(sources(last - reach)) - reference).abs().max() > 1e-6


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_a_window_as_long_as_the_sequence_changes_nothing(position_scheme):
    input_ids = sources()
    outputs = []
    for window in (None, input_ids.size(1)):
        model = tiny_model(position_scheme, seed=3, self_attention_window=window).double()
        with torch.no_grad():
            outputs.append(model(input_ids=input_ids, decoder_input_ids=input_ids).logits)
    assert (outputs[0] - outputs[1]).abs().max() < 1e-12


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_every_kernel_gives_the_same_windowed_model_in_float64(position_scheme):
    input_ids = sources()
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    logits = {}
    for kernel in ("eager", "sdpa", "flex_attention"):
        model = tiny_model(position_scheme, seed=4, self_attention_window=WINDOW).double()
        model.set_attn_implementation(kernel)
        with torch.no_grad():
            logits[kernel] = model(input_ids=input_ids, attention_mask=attention_mask,
                                   decoder_input_ids=input_ids).logits
    for kernel in ("sdpa", "flex_attention"):
        assert (logits[kernel] - logits["eager"]).abs().max() < 1e-12


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_windowed_cached_generation_equals_uncached(position_scheme, num_beams):
    model = tiny_model(position_scheme, seed=1, self_attention_window=WINDOW)
    input_ids = sources()
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    assert_cached_generation_equals_uncached(model, input_ids, attention_mask, num_beams)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "4"])
def test_self_attention_window_is_validated(value):
    with pytest.raises(ValueError, match=r"self_attention_window must be null \(the whole sequence\) or an integer "
                                         rf">= 1, got {value!r}"):
        tiny_config(self_attention_window=value)


def test_a_transformers_kernel_refuses_the_window():
    model = tiny_model("rope", self_attention_window=WINDOW)
    with pytest.raises(ValueError, match=r"self_attention_window runs with attn_implementation \['eager', 'sdpa', "
                                         rf"'flex_attention', 'relpos_triton'\], got '{TRANSFORMERS_KERNEL}'"):
        model.set_attn_implementation(TRANSFORMERS_KERNEL)
    assert model.config._attn_implementation != TRANSFORMERS_KERNEL


def test_the_window_is_saved_and_named_in_the_model_card(tmp_path):
    model = tiny_model("shaw", self_attention_window=WINDOW)
    model.save_pretrained(tmp_path)
    loaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.self_attention_window == WINDOW
    assert f"| self-attention window | keys within {WINDOW} positions of the query |" in render_model_card(loaded.config)
    assert "| self-attention window | the whole sequence |" in render_model_card(tiny_config("shaw"))
