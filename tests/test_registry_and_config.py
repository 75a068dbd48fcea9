"""The registry is open to user schemes, and every invalid config value gets one clear error."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

import hf_relpos
from hf_relpos import PositionScheme, attention_core, register_attention


@register_attention("test_alibi")
class LearnedAlibi(PositionScheme):
    """ALiBi (Press et al. 2022) with a learned slope per layer and head: score bias -m_h |i - j|."""

    def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.slopes = torch.nn.Parameter(torch.empty(num_layers, num_heads))

    def init_parameters(self, std):
        with torch.no_grad():
            self.slopes.copy_(2.0 ** -torch.arange(1, self.num_heads + 1, dtype=torch.float32).repeat(self.num_layers, 1))

    def attend(self, layer_idx, query, key, value, allowed, query_offset, dropout=0.0, output_attentions=False):
        queries = torch.arange(query_offset, query_offset + query.size(-2), device=query.device)
        distance = (queries[:, None] - torch.arange(key.size(-2), device=query.device)[None, :]).abs()
        bias = -self.slopes[layer_idx][:, None, None] * distance
        return attention_core(query, key, value, allowed, score_bias=bias, dropout=dropout,
                              kernel=self.kernel, output_attentions=output_attentions)


def test_user_registered_scheme_trains_and_round_trips(tmp_path):
    assert hf_relpos.ATTENTION_REGISTRY["test_alibi"] is LearnedAlibi
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("test_alibi")).train()
    assert torch.equal(model.model.encoder.positions.slopes[0], torch.tensor([0.5, 0.25, 0.125, 0.0625]))
    input_ids = torch.randint(4, 40, (2, 6))
    loss = model(input_ids=input_ids, labels=input_ids.flip(-1)).loss
    loss.backward()
    assert model.model.encoder.positions.slopes.grad.abs().sum() > 0
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    model.eval().save_pretrained(tmp_path)
    reloaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert reloaded.config.attention_type == "test_alibi"
    assert torch.equal(reloaded.model.encoder.positions.slopes, model.model.encoder.positions.slopes)
    with torch.no_grad():
        expected = model(input_ids=input_ids, decoder_input_ids=input_ids).logits
        assert torch.equal(reloaded(input_ids=input_ids, decoder_input_ids=input_ids).logits, expected)


def test_registering_a_different_class_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_attention("shaw")(type("OtherShaw", (PositionScheme,), {}))
    with pytest.raises(TypeError, match="PositionScheme subclass"):
        register_attention("not_a_scheme")(int)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"attention_type": "rope"}, "attention_type"),
        ({"max_relative_position": -1}, "max_relative_position"),
        ({"d_model": 30}, "d_model"),
        ({"decoder_attention_heads": 5}, "decoder_attention_heads"),
        ({"layer_norm_position": "sandwich"}, "layer_norm_position"),
        ({"pad_token_id": 40}, "pad_token_id"),
        ({"eos_token_id": -1}, "eos_token_id"),
        ({"decoder_start_token_id": 99}, "decoder_start_token_id"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"encoder_layers": -2}, "encoder_layers"),
        ({"dropout": 1.5}, "dropout"),
        ({"clamp_len": -3}, "clamp_len"),
        ({"activation_function": "swishy"}, "activation_function"),
        ({"attention_type": "directional", "directional_heads": ["sideways"]}, "directional_heads"),
        ({"attention_type": "directional", "directional_heads": []}, "directional_heads"),
        ({"d_model": "512"}, "d_model"),
        ({"max_relativ_position": 8}, "max_relative_position"),
        ({"use_relative_value": False}, "use_relative_values"),
        ({"use_relative_keys": "no"}, "use_relative_keys"),
        ({"untie_relative_biases": "x"}, "untie_relative_biases"),
        ({"init_std": -1.0}, "init_std"),
    ],
)
def test_invalid_config_values_raise_a_clear_error(overrides, field):
    with pytest.raises(ValueError) as error:
        tiny_config(**overrides)
    assert field in str(error.value)


@pytest.mark.parametrize(
    "overrides, field",
    [({"layer_norm_position": "sandwich"}, "layer_norm_position"), ({"dropout": 1.5}, "dropout"),
     ({"max_relative_position": -1}, "max_relative_position"), ({"pad_token_id": 999}, "pad_token_id")],
)
def test_overrides_given_to_from_pretrained_are_validated(tmp_path, overrides, field):
    """transformers sets from_pretrained's keyword overrides after the config is built; they are checked too."""
    hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config()).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as error:
        hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path, **overrides)
    assert field in str(error.value)


def test_unknown_scheme_error_lists_the_registered_ones():
    with pytest.raises(ValueError) as error:
        tiny_config("rope")
    for name in ("absolute", "shaw", "xl", "directional"):
        assert name in str(error.value)


def test_hf_bookkeeping_keys_are_still_accepted():
    config = tiny_config(auto_map={"AutoConfig": "configuration_relpos.RelPosTransformerConfig"}, name_or_path="x")
    assert config.auto_map["AutoConfig"].endswith("RelPosTransformerConfig")
