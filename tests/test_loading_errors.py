"""Model folders that are incomplete, corrupt or foreign fail loudly instead of loading random weights."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SCHEMES, run_without_hf_relpos, tiny_config, tiny_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel

import hf_relpos

Model = hf_relpos.RelPosTransformerForConditionalGeneration


@pytest.fixture
def saved(tmp_path):
    folder = tmp_path / "model"
    tiny_model("shaw").save_pretrained(folder)
    return folder


def test_missing_weights_file_is_a_clear_error(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(OSError, match="model.safetensors|safetensors"):
        Model.from_pretrained(saved)


def test_truncated_weights_file_is_an_error(saved):
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(Exception, match="deserializing header"):
        Model.from_pretrained(saved)


def test_weights_missing_from_the_file_are_refused_not_randomised(saved):
    tensors = load_file(saved / "model.safetensors")
    dropped = [name for name in tensors if "positions.relative_keys" in name]
    save_file({k: v for k, v in tensors.items() if k not in dropped}, saved / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="relative_keys"):
        Model.from_pretrained(saved)
    model, info = Model.from_pretrained(saved, allow_missing_weights=True, output_loading_info=True)
    assert set(info["missing_keys"]) == set(dropped)


def test_weights_of_the_wrong_shape_are_refused(saved):
    config = json.loads((saved / "config.json").read_text())
    config["max_relative_position"] = 5
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="size|shape"):
        Model.from_pretrained(saved)


def test_config_of_another_model_type_is_refused(tmp_path):
    marian = MarianMTModel(MarianConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2,
                                        encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                                        pad_token_id=0, decoder_start_token_id=0))
    marian.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="marian"):
        Model.from_pretrained(tmp_path)
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(tmp_path), MarianMTModel)


@pytest.mark.parametrize("model_class", [Model, hf_relpos.RelPosTransformerModel])
def test_a_causal_lms_config_does_not_build_the_encoder_decoder(tmp_path, model_class):
    """A causal LM saves is_encoder_decoder false: the encoder-decoder classes refuse its config, built or loaded,
    instead of building a model whose generate fails on an unrelated missing input."""
    hf_relpos.RelPosTransformerForCausalLM(tiny_config()).save_pretrained(tmp_path)
    config = hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path)
    message = r"is_encoder_decoder is false: this is a causal LM's config .* RelPosTransformerForCausalLM"
    with pytest.raises(ValueError, match=message):
        model_class(config)
    with pytest.raises(ValueError, match=message):
        model_class.from_pretrained(tmp_path)


def test_pickled_weights_are_never_read(saved):
    """A pytorch_model.bin beside (or instead of) safetensors is ignored: weights load only from safetensors."""
    state = load_file(saved / "model.safetensors")
    (saved / "model.safetensors").unlink()
    torch.save(state, saved / "pytorch_model.bin")
    with pytest.raises(OSError):
        Model.from_pretrained(saved)


def test_remote_code_folder_without_trust_remote_code_says_why(saved, tmp_path):
    script = f"""
        from transformers import AutoModelForSeq2SeqLM
        try:
            AutoModelForSeq2SeqLM.from_pretrained({str(saved)!r})
        except Exception as error:
            print("ERROR:", error)
        """
    result = run_without_hf_relpos(script, tmp_path)
    assert "ERROR:" in result.stdout and "trust_remote_code" in result.stdout, result.stdout + result.stderr[-2000:]


def test_beam_wider_than_the_vocabulary_is_a_clear_error():
    model = tiny_model("shaw")
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(input_ids=torch.tensor([[5, 6, 1]]), num_beams=41, max_new_tokens=3)


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_a_source_of_only_the_end_token_translates(position_scheme):
    """An empty source string tokenizes to just `</s>`; generation still runs and returns finite scores."""
    model = tiny_model(position_scheme)
    out = model.generate(input_ids=torch.tensor([[1]]), max_new_tokens=4, num_beams=2, output_scores=True,
                         return_dict_in_generate=True)
    assert out.sequences.shape[0] == 1 and all(torch.isfinite(score).any() for score in out.scores)


def test_folder_without_config_is_an_error_not_a_default_model(saved):
    (saved / "config.json").unlink()
    with pytest.raises(OSError, match="config.json"):
        hf_relpos.RelPosTransformerConfig.from_pretrained(saved)
    with pytest.raises(OSError, match="config.json"):
        Model.from_pretrained(saved)


@pytest.mark.parametrize("position_scheme", ["absolute", "shaw", "rope"])
def test_a_device_map_that_splits_a_stacks_layers_from_its_scheme_over_devices_is_refused(position_scheme):
    """Every layer reads the position context its stack's scheme builds on the scheme's device, which accelerate's
    hooks do not move: a device_map that runs a stack's layers (or its scheme) on two GPUs, as device_map="auto"
    does for a model larger than one GPU, is one error naming the stack; a map of whole stacks, and one offloading
    layers to the CPU or disk where the scheme runs on the first GPU (accelerate runs them there), is not."""
    from hf_relpos.model.modeling_relpos import check_schemes_placed

    model = tiny_model(position_scheme)
    whole = {"model.shared": 0, "model.encoder": 0, "model.decoder": 1, "lm_head": 1, "final_logits_bias": 1}
    split = {**whole, "model.decoder.embed_tokens": 1, "model.decoder.positions": 1, "model.decoder.layers.0": 1,
             "model.decoder.layers.1": 2, "model.decoder.layer_norm": 2}
    del split["model.decoder"]
    offloaded = {**whole, "model.encoder": "cpu", "model.decoder": 0, "model.decoder.layers.1": "disk"}
    for device_map, refused in ((whole, False), (split, True), (offloaded, False),
                                ({**offloaded, "model.encoder.positions": 1}, True)):
        model.hf_device_map = device_map
        if refused:
            with pytest.raises(ValueError, match=r"device_map runs the layers of model\.(de|en)coder and its position "
                                                 r"scheme \(model\.(de|en)coder\.positions\) on more than one device"):
                check_schemes_placed(model)
        else:
            check_schemes_placed(model)


@pytest.mark.parametrize("position_scheme", ["shaw", "xl", "t5"])
def test_a_device_map_that_offloads_a_schemes_parameters_is_refused_naming_them(position_scheme, tmp_path):
    """A device_map that offloads a position scheme with parameters (to "disk") is one
    error at load naming the module: the attention layers read its parameters outside its forward, where accelerate's
    hooks never load them (the first forward was `Cannot copy out of meta tensor`). With the scheme on a device and
    the layers offloaded, the model loads and gives the logits of a plain load."""
    pytest.importorskip("accelerate")
    folder = tmp_path / "model"
    tiny_model(position_scheme).save_pretrained(folder)
    device_map = {"model.shared": "cpu", "lm_head": "cpu", "final_logits_bias": "cpu", "model.encoder": "cpu",
                  "model.decoder.embed_tokens": "cpu", "model.decoder.positions": "disk", "model.decoder.layers": "disk"}
    with pytest.raises(ValueError, match=r"model\.decoder\.positions .*'disk'"):
        Model.from_pretrained(folder, device_map=device_map, offload_folder=str(tmp_path / "offload"))
    device_map["model.decoder.positions"] = "cpu"
    offloaded = Model.from_pretrained(folder, device_map=device_map, offload_folder=str(tmp_path / "offload")).eval()
    inputs = dict(input_ids=torch.tensor([[5, 6, 7, 1]]), decoder_input_ids=torch.tensor([[2, 8, 9]]))
    with torch.no_grad():
        assert torch.equal(offloaded(**inputs).logits, Model.from_pretrained(folder).eval()(**inputs).logits)
