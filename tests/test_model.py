"""Model-level behaviour of RelPosTransformerForConditionalGeneration for every registered scheme."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import RELATIVE_SCHEMES, SCHEMES, run_without_hf_relpos, tiny_config, tiny_model
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

import hf_relpos


def padded_batch():
    """Three sources of lengths 7, 4 and 2 (ids >= 4, so no special token), right-padded with pad id 0."""
    lengths = [7, 4, 2]
    input_ids = torch.zeros(3, 7, dtype=torch.long)
    attention_mask = torch.zeros(3, 7, dtype=torch.long)
    generator = torch.Generator().manual_seed(3)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(4, 40, (length,), generator=generator)
        attention_mask[row, :length] = 1
    return input_ids, attention_mask, lengths


@pytest.mark.parametrize("attention_type", SCHEMES)
def test_encoder_output_of_real_tokens_does_not_depend_on_padding(attention_type):
    model = tiny_model(attention_type)
    input_ids, attention_mask, lengths = padded_batch()
    with torch.no_grad():
        batched = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        for row, length in enumerate(lengths):
            alone = model.get_encoder()(input_ids=input_ids[row : row + 1, :length]).last_hidden_state
            assert (batched[row, :length] - alone[0]).abs().max() < 1e-5


@pytest.mark.parametrize("attention_type", SCHEMES)
@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
def test_no_nan_for_length_one_and_fully_padded_rows(attention_type, layer_norm_position):
    model = tiny_model(attention_type, layer_norm_position=layer_norm_position).train()
    cases = [
        (torch.tensor([[5]]), torch.tensor([[1]])),
        (torch.tensor([[5, 6, 7], [0, 0, 0]]), torch.tensor([[1, 1, 1], [0, 0, 0]])),
    ]
    for input_ids, attention_mask in cases:
        model.zero_grad()
        labels = torch.full((input_ids.size(0), 2), 9)
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        out.loss.backward()
        assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
        for name, parameter in model.named_parameters():
            assert parameter.grad is None or torch.isfinite(parameter.grad).all(), name


def test_directional_first_forward_token_outputs_zero_attention():
    """A forward head's first query has no earlier key (diagonal disabled): its attention output is exactly 0."""
    config = tiny_config("directional", directional_heads=["forward"])
    scheme = hf_relpos.ATTENTION_REGISTRY["directional"](config, 1, 4, 8, is_causal=False)
    q, k, v = (torch.randn(1, 4, 5, 8) for _ in range(3))
    out, _ = scheme.attend(0, q, k, v, None, 0)
    assert torch.all(out[:, :, 0] == 0) and torch.all(out[:, :, 1:].abs().sum(-1) > 0)


def test_directional_default_heads_split_the_encoder_and_all_look_back_in_the_decoder():
    model = tiny_model("directional")
    assert model.model.encoder.positions.head_directions == ["forward", "forward", "backward", "backward"]
    assert model.model.decoder.positions.head_directions == ["forward"] * 4
    explicit = tiny_model("directional", directional_heads=["backward", "both"])
    assert explicit.model.decoder.positions.head_directions == ["backward", "both", "backward", "both"]


@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
@pytest.mark.parametrize("attention_type", SCHEMES)
def test_training_reduces_loss_and_reaches_position_parameters(attention_type, layer_norm_position):
    model = tiny_model(attention_type, layer_norm_position=layer_norm_position).train()
    input_ids, attention_mask, _ = padded_batch()
    labels = input_ids.flip(-1).clone()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    scheme_parameters = {n: p for n, p in model.named_parameters() if ".positions." in n}
    if attention_type in ("shaw", "xl"):
        assert scheme_parameters
    for name, parameter in scheme_parameters.items():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_shaw_and_xl_expose_the_paper_parameters():
    shaw = tiny_model("shaw").model.encoder.positions
    assert shaw.relative_keys.shape == (2, 7, 8) and shaw.relative_values.shape == (2, 7, 8)
    per_head = tiny_model("shaw", relative_embeddings_shared_across_heads=False).model.encoder.positions
    assert per_head.relative_keys.shape == (2, 4, 7, 8)
    assert tiny_model("shaw", use_relative_values=False).model.encoder.positions.relative_values is None
    xl = tiny_model("xl").model.decoder.positions
    assert xl.content_bias.shape == (2, 4, 8) and xl.position_bias.shape == (2, 4, 8)
    assert tiny_model("xl", untie_relative_biases=False).model.decoder.positions.content_bias.shape == (1, 4, 8)
    assert not any(p.requires_grad for p in tiny_model("absolute").model.encoder.positions.parameters())


def generate(model, use_cache: bool, num_beams: int):
    input_ids, attention_mask, _ = padded_batch()
    with torch.no_grad():
        return model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            num_beams=num_beams,
            do_sample=False,
            max_new_tokens=8,
            min_new_tokens=8,
            use_cache=use_cache,
            output_logits=True,
            return_dict_in_generate=True,
        )


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
@pytest.mark.parametrize("attention_type", SCHEMES)
def test_cached_generation_equals_uncached(attention_type, num_beams):
    model = tiny_model(attention_type, seed=1)
    cached, uncached = generate(model, True, num_beams), generate(model, False, num_beams)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < 1e-5


@pytest.mark.parametrize("attention_type", RELATIVE_SCHEMES)
def test_inputs_far_longer_than_training_run(attention_type):
    model = tiny_model(attention_type)
    input_ids = torch.randint(4, 40, (1, 1000))
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    assert out.sequences.shape == (1, 4)
    assert all(torch.isfinite(step).all() for step in out.logits)


def test_absolute_positions_extend_past_max_position_embeddings():
    model = tiny_model("absolute", max_position_embeddings=16)
    with torch.no_grad():
        out = model(input_ids=torch.randint(4, 40, (1, 40)), decoder_input_ids=torch.tensor([[2]]))
    assert torch.isfinite(out.logits).all()


def test_tied_embeddings_share_one_matrix_and_untied_do_not():
    tied = tiny_model("shaw")
    assert tied.lm_head.weight is tied.model.shared.weight is tied.model.encoder.embed_tokens.weight
    assert tied.model.decoder.embed_tokens.weight is tied.model.shared.weight
    untied = tiny_model("shaw", tie_word_embeddings=False)
    assert untied.lm_head.weight is not untied.model.shared.weight


def logits_of(model):
    input_ids, attention_mask, _ = padded_batch()
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4]).logits


@pytest.mark.parametrize("attention_type", SCHEMES)
def test_save_load_round_trip_with_package_and_auto_classes(attention_type, tmp_path):
    model = tiny_model(attention_type, tie_word_embeddings=attention_type != "xl")
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not (tmp_path / "pytorch_model.bin").exists()
    expected = logits_of(model)
    reloaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert torch.equal(logits_of(reloaded), expected)
    auto = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(auto, hf_relpos.RelPosTransformerForConditionalGeneration)
    assert torch.equal(logits_of(auto), expected)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), hf_relpos.RelPosTransformerConfig)
    base = AutoModel.from_pretrained(tmp_path)
    assert isinstance(base, hf_relpos.RelPosTransformerModel)
    assert torch.equal(base.shared.weight, model.model.shared.weight)


def test_remote_code_loads_without_hf_relpos_installed(tmp_path):
    model = tiny_model("shaw")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    torch.save(logits_of(model), tmp_path / "expected.pt")
    script = f"""
        import torch
        from transformers import AutoModel, AutoModelForSeq2SeqLM
        try:
            import hf_relpos
            raise SystemExit("hf_relpos was importable")
        except ImportError:
            pass
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        base = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        assert type(base).__name__ == "RelPosTransformerModel", type(base)
        lengths = [7, 4, 2]
        input_ids = torch.zeros(3, 7, dtype=torch.long)
        attention_mask = torch.zeros(3, 7, dtype=torch.long)
        generator = torch.Generator().manual_seed(3)
        for row, length in enumerate(lengths):
            input_ids[row, :length] = torch.randint(4, 40, (length,), generator=generator)
            attention_mask[row, :length] = 1
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4]).logits
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        assert torch.equal(logits, expected), (logits - expected).abs().max()
        print("REMOTE_OK")
        """
    result = run_without_hf_relpos(script, tmp_path)
    assert "REMOTE_OK" in result.stdout, result.stderr[-3000:]
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_relpos.RelPosTransformerConfig",
        "AutoModel": "modeling_relpos.RelPosTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_relpos.RelPosTransformerForConditionalGeneration",
    }


def reversal_batch(count: int = 24, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.zeros(count, 8, dtype=torch.long)
    attention_mask = torch.zeros(count, 8, dtype=torch.long)
    labels = torch.full((count, 9), -100, dtype=torch.long)
    for row in range(count):
        length = int(torch.randint(3, 9, (1,), generator=generator))
        tokens = torch.randint(4, 40, (length,), generator=generator)
        input_ids[row, :length], attention_mask[row, :length] = tokens, 1
        labels[row, :length], labels[row, length] = tokens.flip(0), 1
    return input_ids, attention_mask, labels


REVERSAL_LOSS_THRESHOLD = 0.1


@pytest.mark.parametrize("attention_type", SCHEMES)
def test_tiny_model_overfits_reversal(attention_type):
    """Reversal needs positions: a model that learns it to a low loss really uses its scheme."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(
        tiny_config(attention_type, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, max_relative_position=8)
    ).train()
    input_ids, attention_mask, labels = reversal_batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(300):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
    assert loss.item() < REVERSAL_LOSS_THRESHOLD
