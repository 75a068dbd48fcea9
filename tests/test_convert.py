"""A MarianMT model converted to hf_relpos (`marian_to_relpos`, `python -m hf_relpos.tools.convert marian`): with `absolute` it is
the same model (logits, beam search); with a relative scheme the sinusoids go and the scheme starts neutral; the
converted folder fine-tunes with train_translation.py as it is."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import SCHEMES, run_without_hf_relpos, tiny_config
from transformers import AutoTokenizer, MarianConfig, MarianMTModel

from hf_relpos import AttentionTerms, PositionScheme, RelPosTransformerForConditionalGeneration
from hf_relpos.publish.records import PEER, RECIPE, TRAINED_WEIGHTS, RunRecord, Scores, read_run_records
from hf_relpos.tools.convert import convert_marian, main, marian_state_to_relpos, marian_to_relpos, neutrality_gaps
from hf_relpos.translation.arguments import ConfigError
from hf_relpos.translation.demo_corpus import write_demo_corpus
from hf_relpos.translation.tokenization import train_joint_tokenizer
from hf_relpos.translation.training import parse_arguments

REPO = Path(__file__).resolve().parents[1]
PAD, EOS = 0, 1  # train_joint_tokenizer's <pad> and </s>
# Schemes whose additive terms vanish at zero parameters: the switch then removes exactly Marian's sinusoids.
ZERO_IS_NEUTRAL = ("shaw", "xl")


def marian_model(vocab_size: int = 60, **overrides) -> MarianMTModel:
    """A random MarianMTModel with Marian's conventions (scaled embeddings, swish, decoding starts with pad), weights
    large enough that beam search does not just repeat one token, and a non-zero final_logits_bias."""
    values = dict(
        vocab_size=vocab_size, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=64,
        activation_function="swish", scale_embedding=True, pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=PAD, forced_eos_token_id=EOS, bos_token_id=None, dropout=0.1, init_std=0.5,
    )
    values.update(overrides)
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(**values)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def padded_batch(vocab_size: int = 60) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    input_ids = torch.randint(2, vocab_size, (3, 9))
    input_ids[:, -1] = EOS
    input_ids[1, 6:], input_ids[1, 5] = PAD, EOS
    decoder_input_ids = torch.randint(2, vocab_size, (3, 7))
    decoder_input_ids[:, 0] = PAD
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(), "decoder_input_ids": decoder_input_ids}


def logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def assert_generates_as_marian(converted, marian, batch: dict[str, torch.Tensor]) -> None:
    """Greedy and beam-4 search give Marian's tokens. A random model with tied embeddings repeats its last token;
    banning repeated bigrams makes the search real (checked: the output holds more than four distinct tokens)."""
    generate = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "max_new_tokens": 12,
                "no_repeat_ngram_size": 2}
    for num_beams in (1, 4):
        expected = marian.generate(**generate, num_beams=num_beams)
        assert len(set(expected[:, 1:].flatten().tolist())) > 4
        assert torch.equal(converted.generate(**generate, num_beams=num_beams), expected)


def test_absolute_conversion_reproduces_marian_logits_and_beam_search():
    marian = marian_model()
    converted = marian_to_relpos(marian, position_scheme="absolute")
    assert not converted.training and converted.config.layer_norm_position == "post"
    batch = padded_batch()
    assert (logits(converted, batch) - logits(marian, batch)).abs().max() < 1e-5
    assert_generates_as_marian(converted, marian, batch)
    assert converted.generation_config.decoder_start_token_id == PAD
    assert converted.generation_config.forced_eos_token_id == EOS


def test_a_marian_model_with_its_own_output_layer_converts_untied():
    marian = marian_model(tie_word_embeddings=False)
    converted = marian_to_relpos(marian, position_scheme="absolute")
    assert not converted.config.tie_word_embeddings and converted.model.shared is None
    batch = padded_batch()
    assert (logits(converted, batch) - logits(marian, batch)).abs().max() < 1e-5
    assert_generates_as_marian(converted, marian, batch)


def test_a_marian_model_of_an_odd_width_converts_with_its_logits():
    """An odd d_model: Marian's table has one sine more than cosines, as `positions.sinusoids` (Vaswani et al.'s
    even dimensions 2i < d are sines)."""
    marian = marian_model(d_model=33, encoder_attention_heads=3, decoder_attention_heads=3)
    converted = marian_to_relpos(marian, position_scheme="absolute")
    batch = padded_batch()
    assert (logits(converted, batch) - logits(marian, batch)).abs().max() < 1e-5
    assert_generates_as_marian(converted, marian, batch)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_marian_model_converts_with_its_logits(dtype):
    """A checkpoint saved in float16 or bfloat16 (transformers loads it so): its sinusoid table is Marian's to that
    dtype's rounding, and the converted model computes Marian's logits in that dtype."""
    marian = marian_model().to(dtype)
    converted = marian_to_relpos(marian, position_scheme="absolute")
    assert next(converted.parameters()).dtype == dtype
    batch = padded_batch()
    assert torch.equal(logits(converted, batch), logits(marian, batch))


def exact_sinusoids(marian: MarianMTModel) -> MarianMTModel:
    """Marian's position tables recomputed in float64 (transformers builds them in float32, which float64 arithmetic
    would otherwise carry as a 1e-7 difference)."""
    for table in (marian.model.encoder.embed_positions, marian.model.decoder.embed_positions):
        rows, width = table.weight.shape
        angles = (torch.arange(rows, dtype=torch.float64)[:, None]
                  / 10000 ** (2 * torch.arange(width // 2, dtype=torch.float64)[None, :] / width))
        with torch.no_grad():
            table.weight.copy_(torch.cat([angles.sin(), angles.cos()], dim=-1))
    return marian


@pytest.mark.numerics
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_a_training_step_is_marians_with_the_same_weights_and_seed(kernel):
    """The peer and `absolute` in training mode, the peer's dropout settings (0.1 on embeddings and
    residuals, 0.1 on attention probabilities, none after the activation), float64: from the same weights and the same
    seed one step gives Marian's loss and gradients, dropout masks included, so the two place and draw every dropout
    alike and differ only where they start (their initial draws, and the decoder start token)."""
    marian = exact_sinusoids(marian_model(activation_function="gelu", dropout=0.1, attention_dropout=0.1,
                                          activation_dropout=0.0).double())
    converted = marian_to_relpos(marian, position_scheme="absolute").double()
    marian.set_attn_implementation(kernel)
    converted.set_attn_implementation(kernel)
    batch = padded_batch()
    labels = torch.cat([batch["decoder_input_ids"][:, 1:], torch.full((3, 1), EOS)], dim=1)
    steps = {}
    for name, model, seed in (("marian", marian, 7), ("converted", converted, 7), ("other draw", converted, 8)):
        model.train().zero_grad()
        torch.manual_seed(seed)
        loss = model(**batch, labels=labels).loss
        loss.backward()
        steps[name] = loss.detach(), {weight: parameter.grad.clone() for weight, parameter in model.named_parameters()
                                      if parameter.grad is not None}
    assert (steps["converted"][0] - steps["marian"][0]).abs() < 1e-12
    assert (steps["other draw"][0] - steps["marian"][0]).abs() > 1e-3   # dropout is on: another seed, another loss
    marian_gradients = marian_state_to_relpos(steps["marian"][1])
    assert marian_gradients.keys() == steps["converted"][1].keys()
    for weight, gradient in steps["converted"][1].items():
        assert (gradient - marian_gradients[weight]).abs().max() < 1e-10, weight


def test_every_marian_weight_is_copied_and_final_logits_bias_is_used():
    marian = marian_model()
    converted = marian_to_relpos(marian, position_scheme="absolute")
    source, target = marian.state_dict(), converted.state_dict()
    for name, tensor in source.items():
        if ".embed_positions." not in name:
            own = name.replace(".fc1.", ".feed_forward.fc1.").replace(".fc2.", ".feed_forward.fc2.")
            assert torch.equal(target[own], tensor), name
    assert converted.model.shared.weight.data_ptr() == converted.lm_head.weight.data_ptr()  # still tied
    batch = padded_batch()
    with torch.no_grad():
        converted.final_logits_bias.zero_()
    assert (logits(converted, batch) - logits(marian, batch)).abs().max() > 0.1


@pytest.mark.numerics
@pytest.mark.parametrize("scheme", ZERO_IS_NEUTRAL)
def test_relative_conversion_removes_the_sinusoids_and_adds_nothing_at_first(scheme):
    """Converted to a relative scheme, the model is Marian without its position table (zero parameters add nothing),
    and the new parameters still receive gradient. In float64, where both compute the same sums in the same order."""
    marian = marian_model().double()
    converted = marian_to_relpos(marian, position_scheme=scheme)
    scheme_parameters = [p for stack in (converted.model.encoder, converted.model.decoder)
                         for p in stack.positions.parameters()]
    assert scheme_parameters and all(not p.any() for p in scheme_parameters)
    batch = padded_batch()
    with torch.no_grad():
        for stack in (marian.model.encoder, marian.model.decoder):
            stack.embed_positions.weight.zero_()
    assert converted.dtype == torch.float64
    assert (logits(converted, batch) - logits(marian, batch)).abs().max() < 1e-12
    converted.train()
    converted(**batch, labels=batch["decoder_input_ids"]).loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in scheme_parameters)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_registered_scheme_takes_every_marian_weight(scheme):
    """Whatever the scheme, the Marian weights all land (strict mapping inside `marian_to_relpos`) and the model runs;
    only the scheme's own parameters are new, and they start where `start_neutral` puts them."""
    converted = marian_to_relpos(marian_model(), position_scheme=scheme)
    assert converted.config.position_scheme == scheme
    assert torch.isfinite(logits(converted, padded_batch())).all()


def test_the_marian_config_fields_carry_over_where_they_differ_from_hf_relpos_defaults():
    """Marian's own values of the shared fields (not hf_relpos' defaults: scale_embedding true, init_std 0.02,
    decoder_start_token_id 2), and a dropout override a conversion may set."""
    config = marian_to_relpos(marian_model(scale_embedding=False, init_std=0.05, decoder_start_token_id=3),
                              "absolute").config
    assert (config.scale_embedding, config.init_std, config.decoder_start_token_id) == (False, 0.05, 3)
    assert marian_to_relpos(marian_model(), "shaw", attention_dropout=0.2).config.attention_dropout == 0.2


def test_scheme_settings_pass_through_and_bad_ones_name_the_field():
    converted = marian_to_relpos(
        marian_model(), position_scheme="shaw", max_relative_position=5, dropout=0.0)
    assert converted.config.max_relative_position == 5 and converted.config.dropout == 0.0
    assert converted.model.encoder.positions.relative_keys.shape[1] == 11
    with pytest.raises(ValueError, match="position_scheme must be one of"):
        marian_to_relpos(marian_model(), position_scheme="sinusoid")
    with pytest.raises(ValueError, match="max_relative_position"):
        marian_to_relpos(marian_model(), "shaw", max_relative_position=-1)
    with pytest.raises(ValueError, match="d_model, layer_norm_position come.s. from the Marian model"):
        marian_to_relpos(marian_model(), "shaw", d_model=64,
                                                              layer_norm_position="pre")


@pytest.mark.parametrize(("scheme", "overrides", "message"), [
    ("shaw", {"num_beams": 1}, r"^num_beams is a generation setting, not a config field: .* edit generation_config"),
    ("shaw", {"unknownfield": 1}, r"^unknownfield cannot be set in a conversion; settable: .*max_relative_position"),
    ("absolute", {"self_attention_window": 8}, r"^self_attention_window cannot be set in a conversion \(it changes "
                                               r"what the model computes, and a absolute conversion reproduces Marian"),
    ("shaw", {"attn_implementation": "flex_attention"},
     r"^attn_implementation is not saved with a model, so a conversion cannot set it: pass it when the converted "
     r"folder is loaded"),
    ("shaw", {"keep_absolute_positions": True, "cross_attention_length_scaling": True},
     r"^cross_attention_length_scaling cannot be set in a conversion \(.* a shaw conversion with "
     r"keep_absolute_positions reproduces Marian\)"),
])
def test_a_setting_a_conversion_cannot_take_is_one_error_naming_it(scheme, overrides, message):
    """A generation setting (silently dropped before), the kernel (accepted, then lost on saving: the folder loaded
    on sdpa), a name the config does not know (written into config.json),
    and, where the conversion promises Marian's logits, a field that changes attention beyond the scheme (a window
    or length scaling changed them by up to 1.7)."""
    with pytest.raises(ValueError, match=message):
        marian_to_relpos(marian_model(), scheme, **overrides)


def test_use_cache_is_settable_though_generate_also_reads_it():
    """use_cache is a config field a conversion may set (docs/conversion.md), not refused as a generation setting."""
    for scheme in ("absolute", "shaw"):
        assert marian_to_relpos(marian_model(), scheme, use_cache=False).config.use_cache is False


def test_a_plain_switch_takes_the_fields_that_change_attention_beyond_the_scheme():
    converted = marian_to_relpos(marian_model(), "shaw", self_attention_window=8, cross_attention_length_scaling=True)
    assert converted.config.self_attention_window == 8 and converted.config.cross_attention_length_scaling


@pytest.mark.parametrize(("alias", "field"), [("num_attention_heads", "encoder_attention_heads"),
                                              ("num_hidden_layers", "encoder_layers"), ("hidden_size", "d_model")])
def test_an_alias_of_a_field_from_marian_is_refused_as_that_field(alias, field):
    """transformers' common names are resolved before the check: num_attention_heads=1 would change the heads."""
    with pytest.raises(ValueError, match=rf"^{alias} \(= {field}\) come\(s\) from the Marian model"):
        marian_to_relpos(marian_model(), "absolute", **{alias: 1})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings must be true"),
        ({"decoder_vocab_size": 70}, r"decoder_vocab_size \(70\) must equal vocab_size \(60\)"),
    ],
)
def test_marian_features_hf_relpos_lacks_are_refused(overrides, message):
    """Separate vocabularies."""
    with pytest.raises(ValueError, match=message):
        marian_to_relpos(marian_model(**overrides), position_scheme="absolute")


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory) -> Path:
    """A saved MarianMTModel with its tokenizer (a joint BPE on the demo corpus), as a Hub folder holds them."""
    folder = tmp_path_factory.mktemp("marian")
    write_demo_corpus(folder / "data", 60, 6, 6, seed=2)
    texts = [text for line in (folder / "data" / "train.jsonl").read_text().splitlines()
             for text in json.loads(line)["translation"].values()]
    tokenizer = train_joint_tokenizer(texts, 320)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (PAD, EOS)
    marian_model(vocab_size=len(tokenizer)).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return folder


def test_cli_writes_model_tokenizer_and_generation_config(marian_folder, tmp_path):
    output = tmp_path / "shaw"
    completed = subprocess.run(
        [sys.executable, "-m", "hf_relpos.tools.convert", "marian", str(marian_folder / "model"), str(output),
         "--position_scheme", "shaw", "--set", "max_relative_position=6"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr
    loaded = RelPosTransformerForConditionalGeneration.from_pretrained(output)
    assert (loaded.config.position_scheme, loaded.config.max_relative_position) == ("shaw", 6)
    assert json.loads((output / "generation_config.json").read_text())["decoder_start_token_id"] == PAD
    source_tokenizer = AutoTokenizer.from_pretrained(marian_folder / "model")
    assert AutoTokenizer.from_pretrained(output)("Der Mann.").input_ids == source_tokenizer("Der Mann.").input_ids
    expected = marian_to_relpos(marian_folder / "model", "shaw",
                                                                   max_relative_position=6)
    batch = padded_batch(len(source_tokenizer))
    assert torch.equal(logits(loaded.eval(), batch), logits(expected, batch))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["shaw"]  # no staging folder left



def test_a_converted_folder_translates_through_the_pipeline_where_hf_relpos_is_not_installed(marian_folder, tmp_path):
    """The converted folder ships the translation pipeline a trained one does: `pipeline("translation", model=OUT,
    trust_remote_code=True)` in a Python without hf_relpos gives the converted model's own beam search (without the
    declaration, transformers 5 has no translation task: KeyError)."""
    output = convert_marian(marian_folder / "model", tmp_path / "absolute", "absolute")
    tokenizer = AutoTokenizer.from_pretrained(output)
    model = RelPosTransformerForConditionalGeneration.from_pretrained(output).eval()
    sources = ["Der Mann.", "Die Frau sieht den Hund."]
    expected = tokenizer.batch_decode(model.generate(**tokenizer(sources, padding=True, return_tensors="pt")),
                                      skip_special_tokens=True)
    script = f"""
from transformers import pipeline
translator = pipeline("translation", model={str(output)!r}, trust_remote_code=True, device="cpu")
print([output["translation_text"] for output in translator({sources!r})])
"""
    result = run_without_hf_relpos(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == str(expected)

def test_cli_errors_are_one_line_and_write_nothing(marian_folder, tmp_path, capsys):
    output = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["marian", str(marian_folder / "model"), str(output), "--position_scheme", "rotary"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err   # the flag named with its deprecated alias: --position_scheme/--attention_type
    assert "argument --position_scheme/--attention_type: position_scheme must be one of ['absolute', " in error
    assert error.rstrip().endswith("got 'rotary'. A scheme registered outside hf_relpos (@register_position_scheme("
                                   "'rotary') in your own code) is known only in a process that has imported the "
                                   "module that registers it: import that module before the config or model is built "
                                   "or loaded (from_pretrained, pipeline); with this command, name that module with "
                                   "--import_modules MODULE (a module or a .py file)")
    assert main(["marian", str(marian_folder / "model"), str(output), "--position_scheme", "shaw",
                 "--set", "max_relative_position=-1"]) == 2
    assert "max_relative_position" in capsys.readouterr().err
    assert main(["marian", str(marian_folder / "data"), str(output), "--position_scheme", "shaw"]) == 2
    assert "error:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["marian", str(marian_folder / "model"), str(output), "--position_scheme", "shaw",
              "--set", "position_scheme=rope"])
    assert exit_info.value.code == 2
    assert "position_scheme is chosen with --position_scheme, not --set" in capsys.readouterr().err
    assert main(["marian", str(marian_folder / "model"), str(output), "--position_scheme", "shaw",
                 "--set", "hidden_size=64"]) == 2
    assert "hidden_size (= d_model) come(s) from the Marian model" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    output.mkdir()
    (output / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="output_dir .* exists and is not an empty folder"):
        convert_marian(marian_folder / "model", output, "absolute")
    assert [path.name for path in tmp_path.iterdir()] == ["out"] and [p.name for p in output.iterdir()] == ["keep.txt"]


def test_an_output_dir_under_a_file_is_one_error_naming_it(marian_folder, tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    assert main(["marian", str(marian_folder / "model"), str(tmp_path / "file" / "out"), "--position_scheme",
                 "shaw"]) == 2
    assert f"error: output_dir '{tmp_path / 'file' / 'out'}': '{tmp_path / 'file'}' is a file, not a folder" in (
        capsys.readouterr().err)
    assert [path.name for path in tmp_path.iterdir()] == ["file"]


def test_a_mistyped_local_marian_folder_is_one_error_without_a_hub_lookup(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    monkeypatch.setattr("huggingface_hub.file_download.hf_hub_download",
                        lambda *args, **kwargs: pytest.fail("looked the folder up on the Hub"))
    assert main(["marian", "models/opus-mt-en-dee", "out", "--position_scheme", "shaw"]) == 2
    assert capsys.readouterr().err == ("python -m hf_relpos.tools.convert: error: source 'models/opus-mt-en-dee': no "
                                       "such folder (the nearest existing folder is 'models'); a Hub model id has the "
                                       "form owner/name\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["models"]


def test_a_marian_folder_without_tokenizer_files_is_one_error_naming_them(marian_folder, tmp_path, capsys):
    folder = tmp_path / "weights_only"
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copyfile(marian_folder / "model" / name, folder / name)
    assert main(["marian", str(folder), str(tmp_path / "out"), "--position_scheme", "shaw"]) == 2
    error = capsys.readouterr().err
    assert "cannot load its tokenizer" in error and error.count("\n") == 1
    if importlib.util.find_spec("sentencepiece") is not None:   # else the error names the missing package
        assert "MarianTokenizer needs source.spm, target.spm, vocab.json; the folder lacks source.spm, target.spm, " \
               "vocab.json" in error
    assert not (tmp_path / "out").exists()


def test_a_corrupt_sentencepiece_model_is_one_error_naming_the_tokenizer(marian_folder, tmp_path, capsys):
    pytest.importorskip("sentencepiece")
    folder = tmp_path / "corrupt"
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copyfile(marian_folder / "model" / name, folder / name)
    (folder / "vocab.json").write_text(json.dumps({"<pad>": 0, "</s>": 1, "<unk>": 2}))
    for name in ("source.spm", "target.spm"):
        (folder / name).write_text("garbage")
    assert main(["marian", str(folder), str(tmp_path / "out"), "--position_scheme", "shaw"]) == 2
    error = capsys.readouterr().err
    assert "cannot load its tokenizer" in error and error.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_finetune_recipe_parses_and_names_no_architecture(marian_folder, tmp_path):
    recipe = REPO / "configs" / "finetune_marian_en_de_shaw.yaml"
    assert yaml.safe_load(recipe.read_text())["model_name_or_path"] == "outputs/opus-mt-en-de-shaw"
    converted = convert_marian(marian_folder / "model", tmp_path / "converted", "shaw")
    model_args, data_args, training_args = parse_arguments([str(recipe), "--model_name_or_path", str(converted)])
    assert "position_scheme" not in model_args.model_config and "d_model" not in model_args.model_config
    assert (data_args.source_lang, data_args.target_lang) == ("en", "de")
    assert training_args.generation_num_beams == 4


@pytest.mark.slow
def test_train_translation_fine_tunes_a_converted_model_as_it_is(marian_folder, tmp_path):
    converted = convert_marian(marian_folder / "model", tmp_path / "converted", "shaw")
    data = marian_folder / "data"
    output = tmp_path / "finetuned"
    completed = subprocess.run(
        [sys.executable, str(REPO / "train_translation.py"), str(REPO / "configs" / "finetune_marian_en_de_shaw.yaml"),
         "--model_name_or_path", str(converted), "--train_file", str(data / "train.jsonl"),
         "--validation_file", str(data / "validation.jsonl"), "--test_file", str(data / "test.jsonl"),
         "--output_dir", str(output), "--max_steps", "3", "--eval_strategy", "no", "--save_strategy", "no",
         "--max_tokens_per_batch", "256", "--warmup_steps", "1", "--do_eval", "false", "--cpu_threads", "1"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    finetuned = RelPosTransformerForConditionalGeneration.from_pretrained(output)
    assert finetuned.config.position_scheme == "shaw" and finetuned.config.decoder_start_token_id == PAD
    assert finetuned.generation_config.decoder_start_token_id == PAD  # not the tokenizer's <s>
    assert finetuned.model.encoder.positions.relative_keys.abs().sum() > 0  # the new tables learned
    from sacrebleu.metrics import BLEU  # the reported BLEU is sacreBLEU's on the written hypotheses

    hypotheses = (output / "test_hypotheses.txt").read_bytes().decode("utf-8").split("\n")[:-1]
    references = [json.loads(line)["translation"]["de"] for line in (data / "test.jsonl").read_text().splitlines()]
    assert json.loads((output / "test_results.json").read_text())["test_bleu"] == pytest.approx(
        BLEU().corpus_score(hypotheses, [references]).score)


def test_resizing_the_vocabulary_keeps_final_logits_bias_in_step():
    converted = marian_to_relpos(marian_model(), position_scheme="shaw")
    bias = converted.final_logits_bias.clone()
    converted.resize_token_embeddings(64)
    assert converted.final_logits_bias.shape == (1, 64) and torch.equal(converted.final_logits_bias[:, :60], bias)
    assert not converted.final_logits_bias[:, 60:].any()
    converted.resize_token_embeddings(50)
    assert torch.equal(converted.final_logits_bias, bias[:, :50])
    assert logits(converted, padded_batch(50)).shape[-1] == 50


@pytest.mark.slow
def test_conversion_experiment_quick_run_writes_its_report(tmp_path):
    """experiments/marian_conversion.py end to end on the generated demo corpus: train Marian, convert, fine-tune with
    train_translation.py, score; absolute and the hybrids (shaw+absolute, and shaw+absolute-fade, which ends with its
    sinusoids faded out) right after the conversion translate exactly as Marian, also on the long-sentence bucket. A second run converts that trained Marian (--marian-model), fine-tunes
    with two seeds and records the recovery curve (--eval-every)."""
    def run_experiment(work: Path, out: Path, *options: str) -> dict:
        subprocess.run([sys.executable, str(REPO / "experiments" / "marian_conversion.py"), "--quick", "--work",
                        str(work), "--out", str(out), *options], check=True, timeout=900, cwd=REPO,
                       capture_output=True)
        return json.loads((out / "marian_conversion.json").read_text())

    out = tmp_path / "out"
    results = run_experiment(tmp_path / "work", out, "--schemes", "shaw+absolute", "shaw+absolute-fade",
                             "--long-pairs", "2")
    assert list(results["schemes"]) == ["absolute", "shaw+absolute", "shaw+absolute-fade"]
    hybrid, fading = results["schemes"]["shaw+absolute"], results["schemes"]["shaw+absolute-fade"]
    assert (hybrid["position_scheme"], hybrid["keep_absolute_positions"], hybrid["fade_absolute_positions"]) == (
        "shaw", True, None)
    assert (fading["position_scheme"], fading["keep_absolute_positions"], fading["fade_absolute_positions"]) == (
        "shaw", True, 1)   # --quick: 2 fine-tuning steps, faded over the first half
    assert not (tmp_path / "work" / "converted_shaw+absolute-fade").exists()   # it starts from the hybrid's folder
    faded = json.loads((tmp_path / "work" / "finetuned_shaw+absolute-fade1_seed1" / "config.json").read_text())
    kept = json.loads((tmp_path / "work" / "finetuned_shaw+absolute_seed1" / "config.json").read_text())
    assert (faded["absolute_positions_scale"], kept["absolute_positions_scale"]) == (0.0, 1.0)
    assert results["long_bucket"]["pairs"] == 2
    for run in results["schemes"].values():
        assert run["converted"]["first_hypotheses"] == results["marian"]["first_hypotheses"]
        assert run["converted"]["bleu"] == results["marian"]["bleu"]
        assert run["converted_long"]["first_hypotheses"] == results["marian_long"]["first_hypotheses"]
        assert list(run["seeds"]) == ["1"]
        seed = run["seeds"]["1"]
        assert 0.0 <= seed["finetuned"]["bleu"] <= 100.0 and seed["finetune_seconds"] > 0 and not seed["reused"]
        assert 0.0 <= seed["finetuned_long"]["bleu"] <= 100.0 and "curve" not in seed
        assert run["summary"]["finetuned_bleu"] == [seed["finetuned"]["bleu"], 0.0]
    table = (out / "marian_conversion.md").read_text()
    assert (f"| shaw+absolute | {results['marian']['bleu']:.2f} | {hybrid['converted']['bleu']:.2f} | "
            f"{hybrid['seeds']['1']['finetuned']['bleu']:.2f} |") in table
    assert "Long-sentence bucket: 2 sources longer than the longest training source" in table
    assert "`NAME+absolute-fade`: the hybrid fine-tuned with `fade_absolute_positions: 1`" in table
    # the typed run records: Marian (the peer), then each fine-tuning, with the recipe train_translation.py recorded
    typed = read_run_records(out / "marian_conversion.json")
    assert [(record.role, record.system, record.seed) for record in typed] == [
        (PEER, "marian", 1), (RECIPE, "absolute", 1), (RECIPE, "shaw+absolute", 1), (RECIPE, "shaw+absolute-fade", 1)]
    assert typed[0].scores[TRAINED_WEIGHTS]["long"].bleu == results["marian_long"]["bleu"]
    for record in typed[1:]:
        run = results["schemes"][record.system]
        assert (record.recipe, record.max_steps) == ("finetune_marian_en_de_shaw", 2)
        assert record.model_name_or_path.endswith(f"converted_{record.system.removesuffix('-fade')}")
        assert record.scores["converted"]["test"] == Scores(run["converted"]["bleu"], run["converted"]["chrf"],
                                                            run["converted"]["signature"],
                                                            run["converted"]["length_ratio"])
        assert record.scores["finetuned"]["long"].bleu == run["seeds"]["1"]["finetuned_long"]["bleu"]
        assert RunRecord.from_json(json.loads(json.dumps(record.to_json()))) == record

    reused = run_experiment(tmp_path / "work_reused", tmp_path / "out_reused", "--marian-model",
                            str(tmp_path / "work" / "marian"), "--eval-every", "1", "--seeds", "1", "2")
    assert reused["marian"]["first_hypotheses"] == results["marian"]["first_hypotheses"]
    assert not (tmp_path / "work_reused" / "marian").exists() and not (tmp_path / "work_reused" / "tokenizer").exists()
    for scheme, run in reused["schemes"].items():
        assert list(run["seeds"]) == ["1", "2"], scheme
        for seed in run["seeds"].values():
            assert [point["step"] for point in seed["curve"]] == [0, 1, 2], scheme
        mean = [sum(seed["curve"][index]["bleu"] for seed in run["seeds"].values()) / 2 for index in range(3)]
        assert [point["bleu"] for point in run["summary"]["curve"]] == pytest.approx(mean)
    level = reused["schemes"]["absolute"]["summary"]["curve"][0]["bleu"]
    assert reused["recovery"]["level"] == level
    shaw_curve = reused["schemes"]["shaw"]["summary"]["curve"]
    assert reused["recovery"]["recovered_at"]["shaw"] == next(
        (point["step"] for point in shaw_curve if point["bleu"] >= level), None)
    table = (tmp_path / "out_reused" / "marian_conversion.md").read_text()
    assert f"MarianMTModel from {tmp_path / 'work' / 'marian'};" in table and "mean ± sd over seeds 1, 2" in table
    assert f"| 0 | {level:.2f} | {shaw_curve[0]['bleu']:.2f} |" in table
    assert f"Code `{reused['source_version']}`; torch {torch.__version__}" in table
    shaw_seeds, absolute_seeds = reused["schemes"]["shaw"]["seeds"], reused["schemes"]["absolute"]["seeds"]
    differences = " / ".join(f"{shaw_seeds[seed]['finetuned']['bleu'] - absolute_seeds[seed]['finetuned']['bleu']:+.2f}"
                             for seed in ("1", "2"))
    assert f"| shaw | {differences} | - |" in table

    # a third seed fine-tuned by another invocation, then one record of the three by --merge
    third = run_experiment(tmp_path / "work_reused", tmp_path / "out_seed3", "--marian-model",
                           str(tmp_path / "work" / "marian"), "--eval-every", "1", "--seeds", "3")
    subprocess.run([sys.executable, str(REPO / "experiments" / "marian_conversion.py"), "--out",
                    str(tmp_path / "out_merged"), "--merge", str(tmp_path / "out_reused" / "marian_conversion.json"),
                    str(tmp_path / "out_seed3" / "marian_conversion.json")], check=True, timeout=300, cwd=REPO,
                   capture_output=True)
    merged = json.loads((tmp_path / "out_merged" / "marian_conversion.json").read_text())
    assert merged["settings"]["seeds"] == [1, 2, 3]
    for scheme, run in merged["schemes"].items():
        assert run["seeds"] == {**reused["schemes"][scheme]["seeds"], **third["schemes"][scheme]["seeds"]}
    assert "mean ± sd over seeds 1, 2, 3" in (tmp_path / "out_merged" / "marian_conversion.md").read_text()
    merged_runs = [(record.system, record.seed) for record in read_run_records(tmp_path / "out_merged" /
                                                                               "marian_conversion.json")]
    assert merged_runs == [("marian", None), *((scheme, seed) for scheme in ("absolute", "shaw") for seed in (1, 2)),
                           *((scheme, 3) for scheme in ("absolute", "shaw"))]


def test_conversion_experiment_reports_each_scheme_minus_absolute_seed_by_seed(monkeypatch):
    from test_experiments import load_experiment

    module = load_experiment(REPO / "experiments" / "marian_conversion.py", monkeypatch)

    def seeds(*bleus: tuple[float, float]) -> dict:
        return {"seeds": {str(seed): {"finetuned": {"bleu": test}, "finetuned_long": {"bleu": long}}
                          for seed, (test, long) in enumerate(bleus, start=1)}}

    results = {"settings": {"seeds": [1, 2]}, "schemes": {
        "absolute": seeds((30.0, 20.0), (31.0, 21.5)), "shaw+absolute": seeds((30.25, 19.0), (30.5, 22.0))}}
    lines = module.paired_differences(results)
    assert lines[-1] == "| shaw+absolute | +0.25 / -0.50 | -1.00 / +0.50 |"
    assert module.paired_differences({"settings": {"seeds": [1]}, "schemes": results["schemes"]}) == []


def test_conversion_experiment_merges_records_of_other_seeds_and_refuses_another_experiment(tmp_path, monkeypatch):
    from test_experiments import load_experiment

    module = load_experiment(REPO / "experiments" / "marian_conversion.py", monkeypatch)

    def record(seed: int, bleu: float, **settings) -> Path:
        path = tmp_path / f"{seed}-{bleu}-{len(settings)}.json"
        path.write_text(json.dumps({
            "settings": {"seeds": [seed], "finetune_steps": 600, "work": f"/tmp/w{seed}", "out": "o", **settings},
            "source_version": "abc", "versions": {"torch": "t"}, "marian": {"bleu": 30.0},
            "schemes": {"absolute": {"converted": {"bleu": 30.0}, "seeds": {
                str(seed): {"finetuned": {"bleu": bleu, "chrf": 50.0}, "finetune_seconds": 1.0}}}}}))
        return path

    merged = module.merge_records([record(3, 34.0), record(1, 32.0)])
    assert merged["settings"]["seeds"] == [1, 3] and list(merged["schemes"]["absolute"]["seeds"]) == ["1", "3"]
    assert merged["schemes"]["absolute"]["summary"]["finetuned_bleu"] == pytest.approx((33.0, 2**0.5))
    with pytest.raises(SystemExit, match=r"another experiment .*finetune_steps"):
        module.merge_records([record(1, 32.0), record(2, 33.0, finetune_steps=300)])
    with pytest.raises(SystemExit, match=r"seed\(s\) \['1'\] of absolute in more than one record"):
        module.merge_records([record(1, 32.0), record(1, 31.0)])


def test_conversion_experiment_long_bucket_and_scheme_entries(monkeypatch):
    """The long bucket joins consecutive test pairs until a source outgrows every training source; `--schemes`
    entries are NAME, NAME+absolute or NAME+absolute-fade."""
    from test_experiments import load_experiment

    module = load_experiment(REPO / "experiments" / "marian_conversion.py", monkeypatch)
    train = [("a b c", "x"), ("a b c d", "x y")]          # longest source: 4 words
    test = [("one two three", "1"), ("four five", "2"), ("six seven eight nine ten", "3"), ("x", "4"), ("y", "5")]
    assert module.long_pairs(train, test, 5) == [("one two three four five", "1 2"),
                                                 ("six seven eight nine ten", "3")]
    assert module.long_pairs(train, test, 1) == [("one two three four five", "1 2")]
    assert module.long_pairs(train, test, 0) == []
    assert module.scheme_of("shaw") == ("shaw", False, False)
    assert module.scheme_of("xl+absolute") == ("xl", True, False)
    assert module.scheme_of("xl+absolute-fade") == ("xl", True, True)
    with pytest.raises(SystemExit, match="'shaw\\+rope' must be NAME, NAME\\+absolute or NAME\\+absolute-fade"):
        module.scheme_of("shaw+rope")


def test_conversion_experiment_describes_the_long_bucket_against_both_caps(monkeypatch):
    """Token lengths of the bucket under a tokenizer, and each source's floor(a x tokens + b) against the fixed cap."""
    from test_experiments import load_experiment

    module = load_experiment(REPO / "experiments" / "marian_conversion.py", monkeypatch)

    def words_and_eos(text=None, text_target=None):
        return {"input_ids": [0] * (len((text or text_target).split()) + 1)}

    bucket = [("a b c", "x y"), ("a b c d e f g", "x y z w v u t s r")]
    described = module.describe_long_bucket(bucket, words_and_eos, max_new_tokens=12, max_len_a=1.5, max_len_b=2)
    assert described["source_tokens"] == {"mean": 6.0, "max": 8} and described["reference_tokens"] == {"mean": 6.5,
                                                                                                        "max": 10}
    assert described["source_relative_caps"] == {"min": 8, "max": 14}   # floor(1.5 x 4 + 2), floor(1.5 x 8 + 2)
    assert described["sources_whose_relative_cap_exceeds_max_new_tokens"] == 1


def test_conversion_experiment_reuses_a_fine_tuned_run_only_with_the_same_steps_and_evaluations(tmp_path, monkeypatch):
    """A finished fine-tuning run in --work is reused when its steps and evaluation steps are the ones asked for, and
    refused with the folder named otherwise (a stale recovery curve must not be reported as this run's)."""
    import argparse

    from test_experiments import load_experiment

    module = load_experiment(REPO / "experiments" / "marian_conversion.py", monkeypatch)
    finished = tmp_path / "finetuned_shaw"
    finished.mkdir()
    (finished / "model.safetensors").write_bytes(b"")
    history = [{"step": step, "eval_bleu": 1.0, "eval_chrf": 1.0} for step in (0, 4, 8, 10)]
    (finished / "trainer_state.json").write_text(json.dumps({"max_steps": 10, "log_history": history}))

    def args(finetune_steps: int, eval_every: int) -> argparse.Namespace:
        return argparse.Namespace(finetune_steps=finetune_steps, eval_every=eval_every)

    assert module.evaluation_steps(args(10, 4)) == [0, 4, 8, 10]
    assert module.evaluation_steps(args(8, 4)) == [0, 4, 8]
    assert module.evaluation_steps(args(10, 0)) == []
    assert module.finetune(tmp_path / "converted", finished, args(10, 4), seed=1) == finished
    for finetune_steps, eval_every in ((12, 4), (10, 5), (10, 0)):
        with pytest.raises(SystemExit, match="finetuned_shaw holds a run of 10 steps evaluated at steps"):
            module.finetune(tmp_path / "converted", finished, args(finetune_steps, eval_every), seed=1)


def test_the_fine_tuning_recipe_gets_no_card_of_a_default_architecture(tmp_path):
    """Recipe cards describe the architecture a recipe trains; a fine-tuning recipe has none of its own (rendering
    one would describe a default d_model 512 model that the converted Marian is not)."""
    from hf_relpos.publish.hub import render_recipe_cards

    rendered = {path.name for path in render_recipe_cards([REPO / "configs"], tmp_path)}
    assert "multi30k_small_shaw.md" in rendered and "finetune_marian_en_de_shaw.md" not in rendered


# keep_absolute_positions: the relative scheme on top of Marian's own sinusoids, starting neutral.
NEUTRAL_ON_TOP = ("shaw", "xl", "t5", "none")   # terms that vanish at start_neutral (none has no terms)
NOT_NEUTRAL = {"rope": "it transforms the queries and it transforms the keys", "alibi": "it adds a non-zero score bias",
               "directional": "it masks query-key pairs"}


def float64_marian() -> MarianMTModel:
    """`marian_model()` in float64 with its sinusoid tables computed in float64 (Marian stores them rounded to
    float32, which a float64 comparison at 1e-12 would see)."""
    from hf_relpos.model.positions import sinusoids

    marian = marian_model().double()
    with torch.no_grad():
        for stack in (marian.model.encoder, marian.model.decoder):
            table = stack.embed_positions.weight
            table.copy_(sinusoids(torch.arange(table.size(0)), table.size(1), torch.float64))
    return marian


@pytest.mark.numerics
@pytest.mark.parametrize("scheme", NEUTRAL_ON_TOP)
def test_hybrid_conversion_is_the_marian_model_in_float64_logits_and_beam_search(scheme):
    marian = float64_marian()
    converted = marian_to_relpos(marian, scheme, keep_absolute_positions=True)
    assert converted.config.keep_absolute_positions and converted.dtype == torch.float64
    assert all(not p.any() for stack in (converted.model.encoder, converted.model.decoder)
               for p in stack.positions.parameters())
    batch = padded_batch()
    assert (logits(converted, batch) - logits(marian, batch)).abs().max() < 1e-12
    assert_generates_as_marian(converted, marian, batch)


def test_hybrid_conversion_in_float32_generates_as_marian():
    """The float32 model as saved: Marian's float32-rounded table against the sinusoids computed on the fly."""
    marian = marian_model()
    converted = marian_to_relpos(marian, "shaw", keep_absolute_positions=True)
    batch = padded_batch()
    assert (logits(converted, batch) - logits(marian, batch)).abs().max() < 1e-4   # float32 rounding of |logits| ~ 5
    generate = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "max_new_tokens": 12,
                "no_repeat_ngram_size": 2, "num_beams": 4}
    assert torch.equal(converted.generate(**generate), marian.generate(**generate))


@pytest.mark.parametrize(("scheme", "learned"), [
    ("shaw", ("relative_keys", "relative_values")), ("xl", ("position_projections",)),
    ("t5", ("relative_attention_bias",)),
])
def test_hybrid_relative_terms_get_gradients_from_the_neutral_start(scheme, learned):
    """Zero tables are neutral, not dead: one backward pass reaches a^K and a^V (Shaw), W_kR (XL), the bucket biases
    (T5) in both stacks."""
    converted = marian_to_relpos(float64_marian(), scheme,
                                                                    keep_absolute_positions=True).train()
    batch = padded_batch()
    converted(**batch, labels=batch["decoder_input_ids"]).loss.backward()
    for stack in (converted.model.encoder, converted.model.decoder):
        for name, parameter in stack.positions.named_parameters():
            if name.startswith(learned):
                assert parameter.grad is not None and parameter.grad.abs().sum() > 0, (scheme, name)


@pytest.mark.parametrize("scheme", sorted(NOT_NEUTRAL))
def test_hybrid_conversion_refuses_schemes_without_an_exact_neutral_start(scheme):
    with pytest.raises(ValueError, match=rf"position_scheme '{scheme}' cannot be added to the kept absolute positions: "
                                         rf"after start_neutral\(\) {NOT_NEUTRAL[scheme]}"):
        marian_to_relpos(marian_model(), scheme, keep_absolute_positions=True)


def test_a_scheme_that_adds_to_the_values_is_not_neutral():
    """A scheme's `value_bias` (a term of the key alone added to the values) changes attention like a value term: a
    non-zero one is a gap of the neutral start, not missed by the probe."""
    class ValueShift(PositionScheme):
        def terms(self, layer_idx, query, key, context):
            return AttentionTerms(value_bias=torch.full((key.size(-1),), 0.5, dtype=key.dtype))

    assert neutrality_gaps(ValueShift(tiny_config("none"), 1, 2, 4, is_causal=False)) == ["it adds a non-zero value bias"]


def test_hybrid_conversion_of_absolute_is_refused_by_the_config():
    with pytest.raises(ValueError, match="keep_absolute_positions must be false with position_scheme 'absolute'"):
        marian_to_relpos(marian_model(), "absolute", keep_absolute_positions=True)


def test_cli_keep_absolute_positions_writes_the_hybrid(marian_folder, tmp_path):
    output = tmp_path / "hybrid"
    assert main(["marian", str(marian_folder / "model"), str(output), "--position_scheme", "xl",
                 "--keep_absolute_positions"]) == 0
    assert json.loads((output / "config.json").read_text())["keep_absolute_positions"] is True
    loaded = RelPosTransformerForConditionalGeneration.from_pretrained(output).eval()
    marian = MarianMTModel.from_pretrained(marian_folder / "model").eval()
    batch = padded_batch(marian.config.vocab_size)
    assert (logits(loaded, batch) - logits(marian, batch)).abs().max() < 1e-4
    assert main(["marian", str(marian_folder / "model"), str(tmp_path / "rope"), "--position_scheme", "rope",
                 "--keep_absolute_positions"]) == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hybrid"]


def test_conversion_experiment_reports_the_time_of_the_fine_tunes_it_ran(monkeypatch):
    """A fine-tuned model reused from an earlier invocation is not timed as if it trained in no time: the column shows
    the mean over the seeds trained here, or "reused" (older records, without the flag: under a second)."""
    from test_experiments import load_experiment

    module = load_experiment(REPO / "experiments" / "marian_conversion.py", monkeypatch)

    def run(*seeds: tuple[float, bool | None]) -> dict:
        return {"seeds": {str(index): {"finetune_seconds": seconds, **({} if reused is None else {"reused": reused})}
                          for index, (seconds, reused) in enumerate(seeds)}}

    assert module.fine_tuning_seconds(run((600.0, False), (700.0, False))) == "650"
    assert module.fine_tuning_seconds(run((600.0, False), (0.2, True))) == "600"
    assert module.fine_tuning_seconds(run((0.2, True), (0.3, True))) == "reused"
    assert module.fine_tuning_seconds(run((0.01, None), (800.0, None))) == "800"


@pytest.mark.parametrize(("options", "message"), [
    (["--schemes", "shaw", "--fade-steps", "1"], "--fade-steps applies to NAME\\+absolute-fade entries"),
    (["--schemes", "xl+absolute-fade", "--fade-steps", "0"], r"--fade-steps must be an integer in \[1, "),
    (["--schemes", "xl+absolute-fade", "--fade-steps", "3"], r"\[1, --finetune-steps=2\], got 3"),
])
def test_conversion_experiment_refuses_a_fade_it_cannot_run(tmp_path, monkeypatch, capsys, options, message):
    """Checked before anything is written (--quick fine-tunes 2 steps)."""
    from test_experiments import load_experiment

    module = load_experiment(REPO / "experiments" / "marian_conversion.py", monkeypatch)
    with pytest.raises(SystemExit):
        module.main(["--quick", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), *options])
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "work").exists()


def test_a_marian_folder_given_to_a_run_is_one_error_naming_the_conversion(marian_folder, tmp_path):
    """A MarianMT folder given as model_name_or_path: the error names that setting (not the model: section) and the
    command that converts the folder."""
    recipe = REPO / "configs" / "finetune_marian_en_de_shaw.yaml"
    source = str(marian_folder / "model")
    with pytest.raises(ConfigError, match=(
            rf"^model_name_or_path '{re.escape(source)}': config model_type is 'marian'; .* a MarianMT model is "
            rf"fine-tuned here once converted: hf-relpos-convert marian {re.escape(source)} OUT --position_scheme")):
        parse_arguments([str(recipe), "--model_name_or_path", source, "--output_dir", str(tmp_path / "out")])


def test_a_set_value_that_yaml_1_1_reads_otherwise_is_one_error_naming_the_field(tmp_path, capsys):
    """--set VALUE is read as a recipe's value is: a number YAML 1.1 reads otherwise than YAML 1.2 (016: octal 14)
    is the error that names both readings, as for a --model flag, not a refusal of the text as no integer."""
    with pytest.raises(SystemExit) as exit_info:
        main(["marian", str(tmp_path / "model"), str(tmp_path / "out"), "--position_scheme", "shaw",
              "--set", "max_relative_position=016"])
    assert exit_info.value.code == 2
    assert ("argument --set: max_relative_position: 016 is ambiguous: YAML 1.1 (how recipes and --model.NAME values "
            "are read) takes it as the octal number 14, YAML 1.2 as 16" in capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_the_converted_folder_saves_the_tokenizer_config_it_read(marian_folder, tmp_path):
    """The converted folder's tokenizer_config.json is the Marian folder's: nothing of how the converter loaded it
    (transformers keeps `is_local` and `local_files_only` among a loaded tokenizer's init_kwargs)."""
    assert main(["marian", str(marian_folder / "model"), str(tmp_path / "out"), "--position_scheme", "shaw"]) == 0
    assert (json.loads((tmp_path / "out" / "tokenizer_config.json").read_text(encoding="utf-8"))
            == json.loads((marian_folder / "model" / "tokenizer_config.json").read_text(encoding="utf-8")))
