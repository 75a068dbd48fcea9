"""`keep_absolute_positions`: the `absolute` scheme's sinusoids added under any other scheme, by the stack (the model
tests no scheme name). Declared once for every scheme, validated, saved, shown on the card."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_cached_generation_equals_uncached, tiny_config, tiny_model

from hf_relpos import RelPosTransformerConfig, RelPosTransformerForConditionalGeneration
from hf_relpos.publish.hub import render_model_card


def batch() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    input_ids = torch.randint(3, 40, (2, 7))
    input_ids[1, 5:] = 0
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(),
            "decoder_input_ids": torch.randint(3, 40, (2, 6))}


def float64_logits(model: RelPosTransformerForConditionalGeneration) -> torch.Tensor:
    with torch.no_grad():
        return model.double()(**batch()).logits


@pytest.mark.numerics
@pytest.mark.parametrize("randomized", [False, True])
def test_none_with_kept_positions_is_the_absolute_model(randomized):
    """`none` + the kept sinusoids computes exactly what `absolute` does with the same weights (float64), also at
    randomized positions (training mode draws them; the same seed draws the same ones)."""
    extra = {"position_randomization_max": 32} if randomized else {}
    absolute = tiny_model("absolute", **extra)
    hybrid = RelPosTransformerForConditionalGeneration(tiny_config("none", keep_absolute_positions=True, **extra))
    hybrid.load_state_dict(absolute.state_dict())
    if randomized:
        absolute.train(), hybrid.train()
    torch.manual_seed(7)
    expected = float64_logits(absolute)
    torch.manual_seed(7)
    assert (float64_logits(hybrid) - expected).abs().max() < 1e-12
    plain = RelPosTransformerForConditionalGeneration(tiny_config("none", **extra)).train(randomized)
    plain.load_state_dict(absolute.state_dict())
    torch.manual_seed(7)
    assert (float64_logits(plain) - expected).abs().max() > 1e-3   # the sinusoids matter


@pytest.mark.parametrize("scheme", ["shaw", "xl", "t5"])
def test_kept_positions_under_a_relative_scheme_decode_the_same_with_and_without_cache(scheme):
    """The decoder's sinusoids follow the cache (a decoding step at its true position)."""
    model = tiny_model(scheme, keep_absolute_positions=True)
    inputs = batch()
    assert_cached_generation_equals_uncached(model, inputs["input_ids"], inputs["attention_mask"], num_beams=1)
    assert_cached_generation_equals_uncached(model, inputs["input_ids"], inputs["attention_mask"], num_beams=3)


@pytest.mark.parametrize("scheme", ["shaw", "xl", "t5", "rope"])
def test_kept_positions_change_a_relative_model(scheme):
    plain = tiny_model(scheme)
    hybrid = RelPosTransformerForConditionalGeneration(tiny_config(scheme, keep_absolute_positions=True))
    hybrid.load_state_dict(plain.state_dict())
    assert (float64_logits(hybrid) - float64_logits(plain)).abs().max() > 1e-3


def test_the_field_is_validated_saved_and_shown_on_the_card(tmp_path):
    assert RelPosTransformerConfig().keep_absolute_positions is False
    for value in ("yes", 1, None):
        with pytest.raises(ValueError, match=f"keep_absolute_positions must be true or false, got {value!r}"):
            tiny_config("shaw", keep_absolute_positions=value)
    with pytest.raises(ValueError, match="keep_absolute_positions must be false with position_scheme 'absolute'"):
        tiny_config("absolute", keep_absolute_positions=True)
    config = tiny_config("shaw", keep_absolute_positions=True)
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["keep_absolute_positions"] is True
    assert RelPosTransformerConfig.from_pretrained(tmp_path).keep_absolute_positions is True
    card = render_model_card(config)
    assert "| `keep_absolute_positions` | sinusoidal absolute positions added to the embeddings as well |" in card
    assert "keep_absolute_positions" not in render_model_card(tiny_config("shaw"))   # shown when it is on


# --- absolute_positions_scale: the factor of the kept sinusoids (fade_absolute_positions lowers it) ------------------


@pytest.mark.numerics
@pytest.mark.parametrize("scale", [1.0, 0.25, 0.0])
def test_the_stack_adds_the_sinusoids_times_the_scale(scale):
    """The embedding of the stack, decoder after a cached prefix included: sqrt(d) E[x] + scale x PE(pos) (Vaswani et
    al. 2017 sec. 3.5), the sinusoids written out here from the paper's formula, in float64."""
    model = tiny_model("shaw", keep_absolute_positions=True, absolute_positions_scale=scale).double()
    input_ids = batch()["input_ids"]
    d_model = model.config.d_model
    for stack, past_length in ((model.model.encoder, 0), (model.model.decoder, 3)):
        with torch.no_grad():
            embedded, _ = stack.embed(input_ids, None, past_length)
        positions = torch.arange(past_length, past_length + input_ids.size(1), dtype=torch.float64)[:, None]
        rates = 1.0 / 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        encoding = torch.cat([torch.sin(positions * rates), torch.cos(positions * rates)], dim=-1)
        expected = stack.embed_tokens.weight[input_ids] * d_model**0.5 + scale * encoding
        assert (embedded - expected).abs().max() < 1e-12


@pytest.mark.numerics
def test_scale_zero_is_the_model_without_the_kept_positions():
    """At scale 0 the kept sinusoids are gone exactly: the same weights without keep_absolute_positions give the same
    float64 logits, bit for bit."""
    faded = tiny_model("xl", keep_absolute_positions=True, absolute_positions_scale=0.0)
    plain = RelPosTransformerForConditionalGeneration(tiny_config("xl"))
    plain.load_state_dict(faded.state_dict())
    assert torch.equal(float64_logits(faded), float64_logits(plain.eval()))


def test_the_scale_is_validated_saved_and_shown_on_the_card(tmp_path):
    assert RelPosTransformerConfig().absolute_positions_scale == 1.0
    for value in (-0.1, 1.5, "half", True, None):
        with pytest.raises(ValueError, match=rf"absolute_positions_scale must be a number in \[0, 1\], got {value!r}"):
            tiny_config("shaw", keep_absolute_positions=True, absolute_positions_scale=value)
    with pytest.raises(ValueError, match=r"absolute_positions_scale \(0.5\) scales the sinusoids of "
                                         "keep_absolute_positions, which is false"):
        tiny_config("shaw", absolute_positions_scale=0.5)
    config = tiny_config("shaw", keep_absolute_positions=True, absolute_positions_scale=0.5)
    config.save_pretrained(tmp_path)
    assert RelPosTransformerConfig.from_pretrained(tmp_path).absolute_positions_scale == 0.5
    assert "as well, times 0.5 (`absolute_positions_scale`) |" in render_model_card(config)
