"""The deprecated names `register_attention`, `ATTENTION_REGISTRY` and `attention_type` (the config field) work as
aliases of `register_position_scheme`, `POSITION_SCHEMES` and `position_scheme`, each with a FutureWarning naming its
replacement; a config.json saved with `attention_type` loads into the same model, and saves `position_scheme`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_without_hf_relpos, tiny_model
from transformers import AutoModelForSeq2SeqLM

import hf_relpos
from hf_relpos.model.positions import POSITION_SCHEMES, PositionScheme, SchemeCard
from hf_relpos.publish.hub import measurements_from_record
from hf_relpos.publish.records import RunRecord, legacy_model_runs, load_recipe, read_run_records
from hf_relpos.tools.convert import build_parser
from hf_relpos.translation.arguments import ConfigError, parse_arguments

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def test_the_old_decorator_warns_and_registers():
    class DeprecatedlyRegistered(PositionScheme):
        card = SchemeCard(title="a scheme registered under the old decorator name")

    try:
        with pytest.warns(FutureWarning, match="register_attention is deprecated.*use register_position_scheme"):
            decorated = hf_relpos.register_attention("deprecatedly_registered")(DeprecatedlyRegistered)
        assert decorated is DeprecatedlyRegistered and decorated.name == "deprecatedly_registered"
        assert POSITION_SCHEMES["deprecatedly_registered"] is DeprecatedlyRegistered
        assert hf_relpos.RelPosTransformerConfig(position_scheme="deprecatedly_registered").position_scheme == (
            "deprecatedly_registered")
    finally:
        POSITION_SCHEMES.pop("deprecatedly_registered", None)


def test_the_old_registry_name_is_the_registry():
    with pytest.warns(FutureWarning, match="ATTENTION_REGISTRY is deprecated.*use POSITION_SCHEMES"):
        assert hf_relpos.ATTENTION_REGISTRY is hf_relpos.POSITION_SCHEMES
    with pytest.warns(FutureWarning, match="ATTENTION_REGISTRY is deprecated"):
        from hf_relpos.model.positions import ATTENTION_REGISTRY
    assert ATTENTION_REGISTRY is POSITION_SCHEMES
    assert "ATTENTION_REGISTRY" not in hf_relpos.__all__ and "register_attention" not in hf_relpos.__all__
    with pytest.raises(AttributeError, match="no attribute 'NOT_A_NAME'"):
        hf_relpos.NOT_A_NAME  # noqa: B018


def test_the_old_config_keyword_and_attribute_warn_and_stand_for_position_scheme():
    with pytest.warns(FutureWarning, match="attention_type is deprecated.*use position_scheme"):
        config = hf_relpos.RelPosTransformerConfig(attention_type="shaw", max_relative_position=5)
    assert config.position_scheme == "shaw" and config.max_relative_position == 5
    assert "attention_type" not in config.to_dict() and config.to_dict()["position_scheme"] == "shaw"
    with pytest.warns(FutureWarning, match="attention_type is deprecated"):
        assert config.attention_type == "shaw"
    with pytest.warns(FutureWarning, match="attention_type is deprecated"):
        config.attention_type = "t5"
    assert config.position_scheme == "t5"


def test_both_names_with_different_values_are_one_error_naming_both():
    with pytest.raises(ValueError, match="attention_type is the deprecated name of position_scheme.*'xl'.*'directional'"):
        hf_relpos.RelPosTransformerConfig(attention_type="xl", position_scheme="directional")  # the default, given
    with pytest.warns(FutureWarning):
        assert hf_relpos.RelPosTransformerConfig(attention_type="xl", position_scheme="xl").position_scheme == "xl"


def test_a_bad_scheme_names_the_new_field_and_the_allowed_values():
    with pytest.raises(ValueError, match=r"position_scheme must be one of \[.*'shaw'.*\], got 'shaww'"):
        hf_relpos.RelPosTransformerConfig(position_scheme="shaww")


def test_the_new_name_round_trips_through_save_and_load(tmp_path):
    model = tiny_model("xl")
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["position_scheme"] == "xl" and "attention_type" not in saved
    loaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.position_scheme == "xl"


def with_old_key(folder) -> dict:
    """Rewrites folder/config.json as earlier versions saved it: the scheme under `attention_type`."""
    config = json.loads((folder / "config.json").read_text())
    config = {("attention_type" if key == "position_scheme" else key): value for key, value in config.items()}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return config


@pytest.mark.parametrize("scheme", ["shaw", "t5"])
def test_an_old_config_json_loads_to_the_same_model_and_saves_the_new_name(scheme, tmp_path):
    model = tiny_model(scheme, seed=3)
    model.save_pretrained(tmp_path / "old")
    with_old_key(tmp_path / "old")
    with pytest.warns(FutureWarning, match="attention_type is deprecated"):
        loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "old").eval()
    assert loaded.config.position_scheme == scheme
    assert {**loaded.config.to_dict(), "_name_or_path": ""} == model.config.to_dict()
    source = torch.tensor([[5, 9, 4, 12, 7], [8, 6, 11, 1, 0]])
    with torch.no_grad():
        expected = model(input_ids=source, attention_mask=(source != 0).long(), decoder_input_ids=source).logits
        logits = loaded(input_ids=source, attention_mask=(source != 0).long(), decoder_input_ids=source).logits
    assert torch.equal(logits, expected)
    loaded.save_pretrained(tmp_path / "new")
    saved = json.loads((tmp_path / "new" / "config.json").read_text())
    assert saved["position_scheme"] == scheme and "attention_type" not in saved


def test_a_config_json_with_both_keys_differing_is_one_clear_error(tmp_path):
    tiny_model("shaw").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "attention_type": "xl"}))
    with pytest.raises(ValueError, match="attention_type is the deprecated name of position_scheme"):
        hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path)


def test_from_pretrained_takes_the_old_keyword(tmp_path):
    tiny_model("shaw").save_pretrained(tmp_path)
    with pytest.warns(FutureWarning, match="attention_type is deprecated"):
        config = hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path, attention_type="t5")
    assert config.position_scheme == "t5"


def test_an_old_config_json_loads_as_remote_code_without_hf_relpos(tmp_path):
    """A Hub folder saved by an earlier version (trust_remote_code, its own code copied beside it) loads on a machine
    with transformers only, and computes what the model computed (float64 at 1e-12: the two processes' BLAS may
    split a product over other thread counts under load, which moves float32 logits by an ulp)."""
    model = tiny_model("shaw", seed=5).double()
    model.save_pretrained(tmp_path / "old")
    with_old_key(tmp_path / "old")
    source = torch.tensor([[5, 9, 4, 12, 7]])
    with torch.no_grad():
        expected = model(input_ids=source, decoder_input_ids=source).logits
    torch.save(expected, tmp_path / "expected.pt")
    script = f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "old")!r}, trust_remote_code=True).eval()
        source = torch.tensor([[5, 9, 4, 12, 7]])
        with torch.no_grad():
            logits = model(input_ids=source, decoder_input_ids=source).logits
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        print("SCHEME", model.config.position_scheme, logits.dtype)
        print("EQUAL", torch.allclose(logits, expected, rtol=0, atol=1e-12))
        """
    result = run_without_hf_relpos(script, tmp_path)
    assert "SCHEME shaw torch.float64" in result.stdout and "EQUAL True" in result.stdout, (
        result.stdout + result.stderr[-2000:])


def test_the_old_training_flag_and_recipe_key_set_position_scheme(tmp_path):
    """`--model.attention_type` overrides the recipe's `position_scheme` (as `--model.position_scheme` does); a recipe
    whose `model:` section says `attention_type` still trains that scheme; both keys differing are one error."""
    with pytest.warns(FutureWarning, match="attention_type is deprecated"):
        model_args, _, _ = parse_arguments([str(DEMO), "--model.attention_type", "rope", "--output_dir", str(tmp_path)])
    assert model_args.model_config["position_scheme"] == "rope" and "attention_type" not in model_args.model_config
    demo = DEMO.read_text(encoding="utf-8")
    assert "  position_scheme: shaw " in demo
    recipe = tmp_path / "old.yaml"
    recipe.write_text(demo.replace("  position_scheme: shaw ", "  attention_type: shaw "), encoding="utf-8")
    with pytest.warns(FutureWarning, match="attention_type is deprecated"):
        model_args, _, _ = parse_arguments([str(recipe)])
    assert model_args.model_config["position_scheme"] == "shaw" and "attention_type" not in model_args.model_config
    recipe.write_text(demo.replace("  position_scheme: shaw ", "  attention_type: xl\n  position_scheme: shaw "),
                      encoding="utf-8")
    with pytest.raises(ConfigError, match="attention_type is the deprecated name of position_scheme"):
        parse_arguments([str(recipe)])


def test_the_old_converter_flag_warns_and_sets_position_scheme():
    with pytest.warns(FutureWarning, match="--attention_type is deprecated.*use --position_scheme"):
        arguments = build_parser().parse_args(["marian", "source", "out", "--attention_type", "xl"])
    assert arguments.position_scheme == "xl"
    assert build_parser().parse_args(["marian", "source", "out", "--position_scheme", "t5"]).position_scheme == "t5"



RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def test_records_written_with_the_deprecated_field_read_under_the_current_one():
    """Committed records keep `attention_type` (a result's runs, a run's `--model.attention_type` flag, a run record's
    model section); the readers give it as `position_scheme`, silently, and the records stay as written."""
    path = RESULTS / "length_generalization" / "length_generalization.json"
    result = json.loads(path.read_text(encoding="utf-8"))
    written = [run["attention_type"] for run in result["runs"]]   # the deprecated key, as the run wrote it
    records = legacy_model_runs(result)
    assert [record.model["position_scheme"] for record in records] == [
        scheme for run, scheme in zip(result["runs"], written, strict=True)
        for _ in ([None] if "result" in run else result["settings"]["seeds"])]
    assert all("attention_type" not in record.model for record in records)
    matched = [run for run in read_run_records(RESULTS / "vs_marian" / "eight_schemes_three_seeds" / "vs_marian.json")
               if run.system == "rope-matched"]
    assert matched and all(run.model == {"position_scheme": "rope"} for run in matched)
    assert RunRecord.from_json({"model": {"attention_type": "xl", "mem_len": 4}}).model == {
        "position_scheme": "xl", "mem_len": 4}


def test_the_decoder_stack_takes_its_old_positions_keyword_as_draw():
    """`RelPosDecoder.forward(positions=...)`, the keyword's name before `draw`, still places the tokens (a
    FutureWarning), not swallowed by **kwargs; both names at once are one error."""
    model = tiny_model("shaw", seed=4)
    decoder = model.get_decoder()
    tokens = torch.tensor([[5, 9, 4, 12, 7]])
    memory = model.get_encoder()(input_ids=tokens).last_hidden_state
    draw = hf_relpos.PositionDraw(torch.tensor([0, 3, 7, 8, 30]))
    with torch.no_grad():
        expected = decoder(input_ids=tokens, encoder_hidden_states=memory, draw=draw).last_hidden_state
        ordinary = decoder(input_ids=tokens, encoder_hidden_states=memory).last_hidden_state
        with pytest.warns(FutureWarning, match="`positions` is deprecated.*Use `draw` instead"):
            renamed = decoder(input_ids=tokens, encoder_hidden_states=memory, positions=draw).last_hidden_state
    assert not torch.allclose(expected, ordinary)   # the draw moves the positions Shaw's terms read
    assert torch.equal(renamed, expected)
    with pytest.raises(ValueError, match="Both `positions` and `draw` are set"):
        decoder(input_ids=tokens, encoder_hidden_states=memory, positions=draw, draw=draw)


def test_a_recipe_with_the_old_key_gets_its_runs_on_its_card(monkeypatch):
    """A recipe whose `model:` section says `attention_type` (as recipes did before the rename) is read with the
    scheme under `position_scheme`, so its card's measurements are those of the recipe as it says it today (the
    runs are matched by their scheme: without the rename none would match)."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    recipe = load_recipe(Path("configs") / "multi30k_small_absolute.yaml")
    old = {**recipe, "model": {("attention_type" if key == "position_scheme" else key): value
                               for key, value in recipe["model"].items()}}
    assert "attention_type" in old["model"]
    record, old_record = RunRecord.from_recipe(recipe), RunRecord.from_recipe(old)
    assert old_record.model == record.model
    path = "docs/results/convergence/one_commit_seeds_1_2/convergence.json"
    measured = measurements_from_record(path, "multi30k_small_absolute", record)
    assert measured and measurements_from_record(path, "multi30k_small_absolute", old_record) == measured


def test_each_deprecation_warning_points_at_the_line_that_used_the_old_name(tmp_path):
    """Whether the old name comes as a keyword, an attribute, a module attribute, a call or a config.json key read by
    transformers' from_pretrained, the warning is attributed to the caller's file, not to hf_relpos or transformers."""
    tiny_model("shaw").save_pretrained(tmp_path)
    with_old_key(tmp_path)
    uses = {
        "keyword": lambda: hf_relpos.RelPosTransformerConfig(attention_type="shaw"),
        "attribute": lambda: hf_relpos.RelPosTransformerConfig().attention_type,
        "module attribute": lambda: hf_relpos.ATTENTION_REGISTRY,
        "call": lambda: hf_relpos.register_attention("never_applied"),
        "config.json": lambda: AutoModelForSeq2SeqLM.from_pretrained(tmp_path),
    }
    for use, line in uses.items():
        with pytest.warns(FutureWarning, match="is deprecated") as caught:
            line()
        assert [Path(warning.filename) for warning in caught if warning.category is FutureWarning] == [
            Path(__file__)], use
