"""The everyday loop around train_translation.py: --help, safe reruns, evaluating a saved model with the
recipe YAML, source-only test files, checks that fire before anything is written, the model card and the saved
generation settings."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import checkout_first_on_path, hub_error
from huggingface_hub import ModelCard
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
from transformers import AutoTokenizer, GenerationConfig

import hf_relpos.translation.arguments as arguments_module
import hf_relpos.translation.data as data_module
import hf_relpos.translation.preflight as preflight_module
from hf_relpos import POSITION_SCHEMES, RelPosTransformerConfig
from hf_relpos.translation.arguments import (
    ConfigError,
    ModelArguments,
    TranslationTrainingArguments,
    config_field_help,
    model_config_fields,
    parse_arguments,
)
from hf_relpos.translation.data import DataArguments, DatasetSchemaError
from hf_relpos.translation.demo_corpus import write_demo_corpus
from hf_relpos.translation.preflight import PreflightError, check_fresh_run_keeps
from hf_relpos.translation.safety import OutputDirError
from hf_relpos.translation.trainer import TranslationTrainer
from hf_relpos.translation.training import run

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "train_translation.py"
# COLUMNS: argparse wraps --help to the terminal width; one line per field keeps the checks simple.
ENV = dict(os.environ, PYTHONPATH=checkout_first_on_path(), TRANSFORMERS_VERBOSITY="error", COLUMNS="1000")
TINY = {
    "model": {"position_scheme": "shaw", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
              "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
              "decoder_ffn_dim": 64, "max_relative_position": 4, "dropout": 0.1},
    "source_lang": "en", "target_lang": "de", "tokenizer_vocab_size": 456,
    "max_source_length": 48, "max_target_length": 48,
    "do_train": True, "do_eval": False, "do_predict": True,
    "max_tokens_per_batch": 300, "max_steps": 3, "learning_rate": 1.0e-3, "warmup_steps": 1,
    "per_device_eval_batch_size": 8, "generation_num_beams": 2, "generation_max_length_offset": 4,
    "logging_steps": 1, "save_strategy": "no", "report_to": "none", "use_cpu": True, "seed": 7,
    "disable_tqdm": True, "cpu_threads": 1, "dataloader_pin_memory": False,
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_demo_corpus(tmp_path_factory.mktemp("corpus"), 60, 6, 5, seed=3)


def write_config(path: Path, corpus: dict[str, Path], output_dir: Path, **overrides) -> Path:
    config = {**TINY, "train_file": str(corpus["train"]), "validation_file": str(corpus["validation"]),
              "test_file": str(corpus["test"]), "output_dir": str(output_dir), **overrides}
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> tuple[Path, Path, dict]:
    """A run trained with a --model override (k=2 where the YAML says 4) and --generation_max_length: (output_dir,
    its YAML, results)."""
    folder = tmp_path_factory.mktemp("trained")
    config = write_config(folder / "recipe.yaml", corpus, folder / "out")
    results = run([str(config), "--model.max_relative_position", "2", "--generation_max_length", "30"])
    return folder / "out", config, results


def run_script(*arguments: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, cwd=cwd,
                          env=env or ENV, timeout=300, stdin=subprocess.DEVNULL)


# --- 1. --help -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [["--help"], ["-h"], []], ids=["help", "h", "no_arguments"])
def test_help_shows_the_usage_and_every_field_by_section(flags, tmp_path):
    completed = run_script(*flags, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    text = completed.stdout
    assert text.startswith("usage: train_translation.py CONFIG.yaml [--FIELD VALUE ...] [--model.FIELD VALUE ...]")
    assert "The YAML file (first argument) fills the fields below; flags after it override the YAML" in text
    headings = [line for line in text.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert [heading.split(":")[0] for heading in headings[1:5]] == ["model", "model", "data", "training"]
    sections = dict(zip([heading.split(" (")[0].rstrip(":") for heading in headings],
                        re.split("|".join(re.escape(heading) for heading in headings), text)[1:], strict=True))
    architecture = sections["model: architecture"]
    registered_by_tests = {field.name for scheme in POSITION_SCHEMES.values()
                           if not scheme.__module__.startswith("hf_relpos") for field in scheme.config_fields}
    for name in model_config_fields() - registered_by_tests:  # the script's fresh process has the built-in schemes
        assert f"--model.{name} [VALUE]" in architecture, name
    assert re.search(r"--model\.max_relative_position \[VALUE\], --max_relative_position \[VALUE\]\s+clipping "
                     r"distance:\s+relative\s+distances\s+beyond\s+±k\s+share\s+one\s+vector\s+\(default:\s+16\)\n",
                     architecture)  # the help text the Shaw scheme declares for its field
    assert re.search(r"--model\.d_model \[VALUE\], --d_model \[VALUE\]\s+the width of the token embeddings.*"
                     r"\(default: 512\)", architecture)
    assert re.search(r"--tokenizer_vocab_size TOKENIZER_VOCAB_SIZE, --tokenizer-vocab-size TOKENIZER_VOCAB_SIZE\s+"
                     r"Vocabulary size .*\(default: 8000\)\n", sections["model: where to start from"])
    assert re.search(r"--tokenizer_character_coverage TOKENIZER_CHARACTER_COVERAGE, --tokenizer-character-coverage "
                     r"TOKENIZER_CHARACTER_COVERAGE\s+SentencePiece's\s+character_coverage.*byte\s+fallback.*"
                     r"\(default: 1.0\)\n", sections["model: where to start from"], re.DOTALL)
    for name, help_start in (("max_source_length", "Longest source, in tokens"),
                             ("overlong_pairs", "Training pairs over")):
        assert re.search(rf"--{name} \S+, --\S+ \S+\s+{help_start}.*\(default: \S+\)\n", sections["data"]), name
    training = sections["training: Seq2SeqTrainingArguments and hf_relpos's additions"]
    for name in ("learning_rate", "overwrite_output_dir", "max_tokens_per_batch", "generation_max_length"):
        assert f"--{name} " in training, name
    assert re.search(r"--learning_rate LEARNING_RATE, --learning-rate LEARNING_RATE\s+The initial learning rate "
                     r".*\(default: 5e-05\)\n", training)
    assert "(default: None)" not in text  # an unset field reads as the YAML writes it
    assert re.search(r"--max_train_samples MAX_TRAIN_SAMPLES, --max-train-samples MAX_TRAIN_SAMPLES\s+.*"
                     r"\(default: null\)\n", sections["data"])
    assert not list(tmp_path.iterdir())


def test_every_model_field_has_help_of_its_own():
    """Each `model:` field's --help text comes from hf_relpos (a scheme's declaration or RelPosTransformerConfig's
    docstring), none borrowed from another model's docs."""
    missing = [name for name in sorted(model_config_fields()) if not config_field_help(name)]
    assert missing == []
    assert config_field_help("scale_embedding").startswith("multiply the token embeddings by sqrt(d_model)")


def test_help_after_a_yaml_shows_its_values_as_defaults(tmp_path):
    completed = run_script(str(REPO / "configs" / "demo.yaml"), "--help", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert re.search(r"--model\.d_model \[VALUE\], --d_model \[VALUE\]\s+the width .*\(default: 128\)\n", completed.stdout)
    assert re.search(r"--learning_rate LEARNING_RATE, --learning-rate LEARNING_RATE\s+.*\(default: 0\.002\)\n", completed.stdout)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("flags", "parsed"), [
    (["--model.d-model", "48"], {"d_model": 48}),
    (["--model.directional_heads", "[forward, backward]", "--position_scheme=directional"],
     {"directional_heads": ["forward", "backward"], "position_scheme": "directional"}),
    (["--use_relative_values"], {"use_relative_values": True}),
])
def test_model_flags_are_read_as_yaml(tmp_path, corpus, flags, parsed):
    model_args, _, _ = parse_arguments([str(write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")), *flags])
    assert {name: model_args.model_config[name] for name in parsed} == parsed


def test_optional_fields_take_null_and_prefixes_are_not_guessed(tmp_path, corpus):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_train_samples=10)
    _, data_args, training_args = parse_arguments([str(config), "--max_train_samples", "null",
                                                   "--max_tokens_per_batch", "None"])
    assert data_args.max_train_samples is None and training_args.max_tokens_per_batch is None
    with pytest.raises(ConfigError, match=r"unknown key\(s\): --learning_rat \(did you mean learning_rate\?\)"):
        parse_arguments([str(config), "--learning_rat", "0.1"])  # argparse would take it as --learning_rate
    with pytest.raises(ConfigError, match=r"argument --max_steps/--max-steps: invalid int value: '1\.5'"):
        parse_arguments([str(write_config(tmp_path / "d.yaml", corpus, tmp_path / "out", max_steps=1.5))])


# --- 2. safe reruns ------------------------------------------------------------------------------------------------


def test_a_rerun_into_a_trained_folder_is_one_error_line(trained, tmp_path):
    output_dir, config, _ = trained
    completed = run_script(str(config), cwd=tmp_path)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        f"train_translation.py: error: output_dir {str(output_dir)!r} already holds a trained model or checkpoints "
        "(model.safetensors, config.json): it has no complete checkpoint to continue from with "
        "--resume_from_checkpoint last (save_strategy: steps keeps some); train on from its model with "
        "--model_name_or_path, train from scratch with --overwrite_output_dir true (the old model and checkpoints are "
        "removed when the new run starts writing), or choose another output_dir"]


def test_overwrite_removes_the_old_run_only_once_the_new_one_starts_writing(tmp_path, corpus):
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, save_strategy="steps", save_steps=1,
                          do_predict=False)
    run([str(config)])
    old = sorted(path.name for path in output_dir.iterdir())
    assert {"checkpoint-1", "checkpoint-2", "checkpoint-3", "model.safetensors", "tokenizer.json"} <= set(old)
    with pytest.raises(DatasetSchemaError):
        run([str(config), "--overwrite_output_dir", "true", "--train_file", str(tmp_path / "missing.jsonl")])
    assert sorted(path.name for path in output_dir.iterdir()) == old, "a run that failed its checks removed nothing"
    with pytest.raises(ConfigError, match="overwrite_output_dir .* and resume_from_checkpoint .* contradict"):
        run([str(config), "--overwrite_output_dir", "true", "--resume_from_checkpoint", "last"])

    run([str(config), "--overwrite_output_dir", "true", "--save_strategy", "no", "--tokenizer_vocab_size", "430"])
    assert not list(output_dir.glob("checkpoint-*"))
    assert len(AutoTokenizer.from_pretrained(output_dir)) == 430
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and state["max_steps"] == 3


@pytest.mark.parametrize("setting", ["model_name_or_path", "tokenizer_name"])
def test_a_fresh_run_never_deletes_the_model_or_tokenizer_it_starts_from(trained, tmp_path, corpus, setting):
    """A fresh run (overwrite_output_dir) empties output_dir of its previous run before training: a
    model_name_or_path or tokenizer_name that is output_dir (however spelled) or one of its checkpoints was deleted
    before the run trained on it, and lost for good if the run then failed."""
    output_dir = tmp_path / "out"
    shutil.copytree(trained[0], tmp_path / "checkpoint-1")
    shutil.copytree(trained[0], output_dir)
    shutil.move(tmp_path / "checkpoint-1", output_dir / "checkpoint-1")
    config = write_config(tmp_path / "c.yaml", corpus, output_dir)
    before = sorted(str(path.relative_to(output_dir)) for path in output_dir.rglob("*"))
    for given, how in ((f"{tmp_path}/./out/", "is"), (str(output_dir / "checkpoint-1"), "is in")):
        with pytest.raises(OutputDirError, match=f"^{setting} '{re.escape(given)}' {how} output_dir "
                                                 f"'{re.escape(str(output_dir))}': a fresh run"):
            run([str(config), "--overwrite_output_dir", "true", f"--{setting}", given, "--model.max_relative_position",
                 "2"])
    assert sorted(str(path.relative_to(output_dir)) for path in output_dir.rglob("*")) == before


@pytest.mark.parametrize(("output_dir", "given", "refused"), [
    (".", "Helsinki-NLP/opus-mt-en-de", False), ("work", "work/base_model", False), (".", "work", False),
    ("work", "link", True), ("work", "link/checkpoint-2", True), ("link", "work/checkpoint-2", True),
])
def test_a_fresh_run_refuses_only_a_start_it_would_delete(tmp_path, monkeypatch, output_dir, given, refused):
    """Only output_dir itself (through a link too) and what the fresh run deletes in it (a checkpoint) are refused: a
    Hub id, or a folder in output_dir that the run leaves alone, is no reason to stop it."""
    monkeypatch.chdir(tmp_path)
    for folder in ("work/base_model", "work/checkpoint-2"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "link").symlink_to("work")
    for setting in ("model_name_or_path", "tokenizer_name"):
        if refused:
            with pytest.raises(OutputDirError, match=f"^{setting} '{re.escape(given)}' is (in )?output_dir "
                                                     f"'{output_dir}': a fresh run"):
                check_fresh_run_keeps(output_dir, {setting: given})
        else:
            check_fresh_run_keeps(output_dir, {setting: given})


def test_a_stale_tokenizer_is_never_reused_silently(tmp_path, corpus, monkeypatch):
    """A run that died before its first checkpoint leaves only its tokenizer; a rerun reuses it only when it was
    trained with the same settings (data and vocabulary size), or when asked for by tokenizer_name."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, do_predict=False)

    def die(self, *args, **kwargs):
        raise KeyboardInterrupt("killed before the first checkpoint")

    with monkeypatch.context() as patch:
        patch.setattr(TranslationTrainer, "train", die)
        with pytest.raises(KeyboardInterrupt):
            run([str(config)])
    saved = (output_dir / "tokenizer.json").read_text()
    settings = json.loads((output_dir / "tokenizer_training.json").read_text())
    assert settings["tokenizer_vocab_size"] == 456 and settings["normalizer"] == "NFC" and settings["byte_fallback"]

    with pytest.raises(ConfigError) as stale:
        run([str(config), "--tokenizer_vocab_size", "430", "--max_train_samples", "40"])
    message = str(stale.value)
    assert f"output_dir {str(output_dir)!r} holds a tokenizer trained with other settings than this run's" in message
    assert "tokenizer_vocab_size 456 -> 430" in message and "training text differs" in message
    assert "--overwrite_output_dir true" in message and f"--tokenizer_name {output_dir}" in message
    assert (output_dir / "tokenizer.json").read_text() == saved

    run([str(config), "--tokenizer_vocab_size", "430", "--tokenizer_name", str(output_dir)])  # asked for
    assert len(AutoTokenizer.from_pretrained(output_dir)) == 456


# --- 3. evaluating a saved model with the recipe -------------------------------------------------------------------


def test_evaluation_refuses_a_command_line_flag_that_changes_the_shapes_in_one_line(trained, tmp_path):
    """Only the flag is named: the recipe's differing max_relative_position is ignored when evaluating."""
    output_dir, config, _ = trained
    with pytest.raises(ConfigError) as refused:
        parse_arguments([str(config), "--model_name_or_path", str(output_dir), "--do_train", "false",
                         "--output_dir", str(tmp_path / "eval"), "--model.encoder_ffn_dim", "96"])
    message = str(refused.value)
    assert "\n" not in message
    assert message == (
        f"model_name_or_path {str(output_dir)!r}: its saved config is the architecture, but model: "
        "encoder_ffn_dim=96 (saved: 64) would change the shapes of its weights; "
        "remove them from the 'model:' section or the flags (or set the saved values)")


def test_evaluation_ignores_the_recipes_differing_model_fields_with_one_warning(trained, caplog):
    """The recipe says max_relative_position 4, the saved model has 2 (its other model: fields are the saved values):
    that field is named, in one warning, and nothing overrides the saved config."""
    output_dir, config, _ = trained
    with caplog.at_level(logging.WARNING, logger="hf_relpos.translation.arguments"):
        model_args, _, _ = parse_arguments([str(config), "--model_name_or_path", str(output_dir), "--do_train",
                                            "false"])
    assert model_args.model_config == {}
    warnings = [record.getMessage() for record in caplog.records if record.name == "hf_relpos.translation.arguments"]
    assert warnings == [f"model_name_or_path {str(output_dir)!r}: its saved config is the architecture; the recipe's "
                        "model: max_relative_position=4 (saved: 2) differ from it and are ignored"]


def test_fine_tuning_refuses_the_recipes_shape_changes(trained, tmp_path):
    """Training from a saved model: a recipe field that would change the weights' shapes is still an error."""
    output_dir, config, _ = trained
    with pytest.raises(ConfigError, match=r"model: max_relative_position=4 \(saved: 2\) would change the shapes"):
        parse_arguments([str(config), "--model_name_or_path", str(output_dir), "--output_dir", str(tmp_path / "ft")])


@pytest.mark.parametrize("training", ["true", "false"])
def test_another_position_scheme_of_the_same_shapes_is_refused(corpus, tmp_path, training):
    """alibi and rope have no parameters, so an alibi model's weights have rope's shapes: asking for rope is still one
    error naming the field, not an alibi-trained model fine-tuned (or scored) as a rope model."""
    saved = tmp_path / "alibi"
    RelPosTransformerConfig(**RelPosTransformerConfig.held_fields("alibi", {**TINY["model"], "position_scheme": "alibi"}),
                            vocab_size=456).save_pretrained(saved)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    with pytest.raises(ConfigError) as refused:
        parse_arguments([str(config), "--model_name_or_path", str(saved), "--do_train", training,
                         "--model.position_scheme", "rope"])
    assert str(refused.value) == (
        f"model_name_or_path {str(saved)!r}: its weights were trained with position_scheme alibi, but model: "
        "position_scheme=rope would run them under another scheme; remove it from the 'model:' section or the flags "
        "(or set the saved value)")


def test_new_tokenizer_flags_with_a_reused_tokenizer_are_one_warning(trained, tmp_path, caplog):
    """Fine-tuning uses the saved model's tokenizer: --tokenizer_vocab_size and --tokenizer_character_coverage on the
    command line are named in one warning (they change nothing); the recipe's own values are not."""
    output_dir, config, _ = trained
    fine_tune = [str(config), "--model_name_or_path", str(output_dir), "--output_dir", str(tmp_path / "ft"),
                 "--model.max_relative_position", "2"]   # the saved value (the recipe says 4)
    with caplog.at_level(logging.WARNING, logger="hf_relpos.translation.arguments"):
        parse_arguments(fine_tune)
        assert not [record for record in caplog.records if record.name == "hf_relpos.translation.arguments"]
        parse_arguments([*fine_tune, "--tokenizer_vocab_size", "2000", "--tokenizer-character-coverage=0.99"])
    warnings = [record.getMessage() for record in caplog.records if record.name == "hf_relpos.translation.arguments"]
    assert warnings == [f"--tokenizer_vocab_size, --tokenizer_character_coverage: the run uses the tokenizer of "
                        f"{str(output_dir)!r} and trains none, so each (a setting of a newly trained tokenizer) does "
                        "not apply"]


def test_a_new_model_trained_without_a_recipe_is_one_warning_naming_the_fine_tuning_defaults(corpus, trained, tmp_path,
                                                                                          caplog):
    """Without a recipe YAML, the training settings the flags leave out are transformers' fine-tuning defaults: one
    warning names those left so and the recipe to start from; none once the flags set them all, with a recipe, or
    when fine-tuning a saved model."""
    flags = ["--train_file", str(corpus["train"]), "--source_lang", "en", "--target_lang", "de",
             "--output_dir", str(tmp_path / "out")]
    chosen = ["--learning_rate", "1e-3", "--warmup_steps", "100", "--label_smoothing_factor", "0.1"]

    def warnings_of(argv):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hf_relpos.translation.arguments"):
            parse_arguments(argv)
        return [record.getMessage() for record in caplog.records if record.name == "hf_relpos.translation.arguments"]

    assert warnings_of([*flags, "--do_train", "true"]) == [
        "training a new model without a recipe YAML: learning_rate 5e-05, warmup_steps 0, "
        "per_device_train_batch_size 8, label_smoothing_factor 0.0 are transformers' defaults for fine-tuning a "
        "pretrained model, with which a model trained from scratch learns little; start from a recipe and override "
        f"what differs, e.g. {arguments_module.PROGRAM} configs/multi30k_small_directional.yaml --train_file ... "
        "(docs/training.md)"]
    assert warnings_of([*flags, "--do_train", "true", *chosen]) == [
        "training a new model without a recipe YAML: per_device_train_batch_size 8 is transformers' default for "
        "fine-tuning a pretrained model, with which a model trained from scratch learns little; start from a recipe "
        f"and override what differs, e.g. {arguments_module.PROGRAM} configs/multi30k_small_directional.yaml "
        "--train_file ... (docs/training.md)"]
    assert warnings_of([*flags, "--do_train", "true", *chosen, "--max_tokens_per_batch", "4096"]) == []
    assert warnings_of([str(write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")), *flags]) == []
    saved_model = trained[0]   # fine-tuning: the defaults are made for it
    assert warnings_of(["--model_name_or_path", str(saved_model), *flags, "--do_train", "true"]) == []


def test_evaluation_takes_the_saved_architecture_and_command_line_overrides(trained, tmp_path, capsys):
    output_dir, config, results = trained
    model_args, _, _ = parse_arguments([str(config), "--model_name_or_path", str(output_dir), "--do_train", "false",
                                        "--model.dropout", "0.3"])
    assert model_args.model_config == {"dropout": 0.3}  # the flag; the recipe's max_relative_position is ignored
    evaluated = run([str(config), "--model_name_or_path", str(output_dir), "--do_train", "false",
                     "--model.dropout", "0.3",
                     "--output_dir", str(tmp_path / "eval"), "--generation_max_length", "30"])
    assert evaluated["test"]["test_bleu"] == pytest.approx(results["test"]["test_bleu"])
    assert (tmp_path / "eval" / "test_hypotheses.txt").read_text() == (output_dir / "test_hypotheses.txt").read_text()
    assert f"WARNING hf_relpos.translation.model_setup: model: overrides of the saved config of {output_dir}: dropout=0.3" in (
        capsys.readouterr().out)


# --- 4. source-only test files -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_predict_on_a_source_only_file_writes_hypotheses_and_skips_bleu(trained, corpus, tmp_path, capsys, kind):
    output_dir, config, _ = trained
    sources = [json.loads(line)["translation"]["en"] for line in corpus["test"].read_text().splitlines()]
    sources.insert(2, "")
    if kind == "txt":
        test_file = tmp_path / "sources.txt"
        test_file.write_text("\n".join(sources) + "\n", encoding="utf-8")
    else:
        test_file = tmp_path / "sources.jsonl"
        test_file.write_text("".join(json.dumps({"en": source}) + "\n" for source in sources), encoding="utf-8")
    predicted = run([str(config), "--model_name_or_path", str(output_dir), "--do_train", "false",
                     "--test_file", str(test_file), "--output_dir", str(tmp_path / "predict"),
                     "--model.max_relative_position", "2", "--generation_max_length", "30"])
    assert "test_bleu" not in predicted["test"] and "test_loss" not in predicted["test"]
    # nor its -log p part (a loss against no reference: it was left in, in test_results.json too)
    saved = json.loads((tmp_path / "predict" / "test_results.json").read_text(encoding="utf-8"))
    assert not [name for name in {*predicted["test"], *saved} if name.endswith("_loss")]
    hypotheses = (tmp_path / "predict" / "test_hypotheses.txt").read_text(encoding="utf-8").split("\n")
    assert len(hypotheses) == len(sources) + 1 and hypotheses[2] == "" and hypotheses[-1] == ""
    reference_run = (output_dir / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    assert hypotheses[:2] + hypotheses[3:-1] == reference_run
    assert "the source-only file has no references, so BLEU and chrF are skipped" in capsys.readouterr().out


def test_a_txt_file_cannot_train(tmp_path, corpus):
    with pytest.raises(ConfigError, match=r"train_file '.*s\.txt': a \.txt file holds sources only"):
        parse_arguments([str(write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", train_file="s.txt"))])


# --- 6. checks before anything is written --------------------------------------------------------------------------


def test_zero_beams_is_an_error_before_training(tmp_path, corpus):
    completed = run_script(str(write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")),
                           "--generation_num_beams", "0", cwd=tmp_path)
    assert completed.returncode == 2
    assert completed.stderr.strip() == (
        "train_translation.py: error: generation_num_beams must be null (not set) or an integer >= 1, got 0")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("integration", ["tensorboard", "wandb"])
def test_a_reporting_integration_without_its_package_is_an_error(tmp_path, corpus, monkeypatch, integration):
    monkeypatch.setattr(arguments_module, "get_available_reporting_integrations", lambda: [])
    with pytest.raises(ConfigError, match=rf"report_to {integration} needs the {integration} package, which is not "
                                          rf"installed: pip install '\.\[{integration}\]' in the hf_relpos "
                                          "checkout, or set report_to: none"):
        run([str(write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")), "--report_to", integration])
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"report_to 'tensorbord' is not an integration"):
        parse_arguments([str(write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")), "--report_to",
                         "tensorbord"])


def test_an_unreachable_hub_dataset_is_one_error_without_retries(tmp_path, monkeypatch):
    def unreachable(self, repo_id, **kwargs):
        raise ConnectionError("[Errno -2] Name or service not known")

    def never(*args, **kwargs):
        raise AssertionError("load_dataset must not be tried (its retries take half a minute)")

    monkeypatch.setattr(data_module.HfApi, "dataset_info", unreachable)
    monkeypatch.setattr(data_module, "load_dataset", never)
    config = {key: value for key, value in TINY.items()} | {"dataset_name": "bentrevett/multi30k",
                                                            "dataset_config_name": None,
                                                            "output_dir": str(tmp_path / "out")}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(DatasetSchemaError) as unreachable_error:
        run([str(tmp_path / "c.yaml")])
    assert str(unreachable_error.value) == (
        "dataset 'bentrevett/multi30k': the Hugging Face Hub cannot be reached (ConnectionError: [Errno -2] Name or "
        "service not known); connect to the network, set HF_HUB_OFFLINE=1 to use a copy in the local cache, or give "
        "local files (train_file, validation_file, test_file)")
    assert not (tmp_path / "out").exists()


def test_the_hub_probe_names_a_missing_dataset_and_leaves_local_ones_alone(tmp_path, monkeypatch):
    def missing(self, repo_id, **kwargs):
        if repo_id == str(tmp_path):
            raise AssertionError("a local folder is no Hub dataset")
        raise hub_error(RepositoryNotFoundError, f"404 Client Error: {repo_id}")

    monkeypatch.setattr(data_module.HfApi, "dataset_info", missing)
    with pytest.raises(DatasetSchemaError, match=r"dataset 'me/no-such-data' is not on the Hugging Face Hub \(or it "
                                                 r"is private: log in with `hf auth login`\)"):
        data_module.check_hub_dataset("me/no-such-data")
    data_module.check_hub_dataset(str(tmp_path))


def test_a_gated_hub_dataset_or_model_is_named_gated_not_missing(tmp_path, monkeypatch):
    """huggingface_hub's GatedRepoError is a RepositoryNotFoundError: the probes name it gated, not absent."""
    def gated(self, repo_id, **kwargs):
        raise hub_error(GatedRepoError, f"403 Client Error: Cannot access gated repo {repo_id}")

    monkeypatch.setattr(data_module.HfApi, "dataset_info", gated)
    with pytest.raises(DatasetSchemaError) as dataset_error:
        data_module.check_hub_dataset("me/gated-data")
    assert str(dataset_error.value) == ("dataset 'me/gated-data' is gated: accept its conditions on its Hub page and "
                                        "log in with `hf auth login`")
    monkeypatch.setattr(preflight_module.HfApi, "model_info", gated)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ValueError) as model_error:
        preflight_module.check_model_source("me/gated-model", "model_name_or_path")
    assert str(model_error.value) == ("model_name_or_path 'me/gated-model' is a gated model on the Hugging Face Hub: "
                                      "accept its conditions on its Hub page and log in with `hf auth login`")


def test_an_uncached_hub_dataset_offline_is_one_error_line(tmp_path):
    config = dict(TINY, dataset_name="hf-relpos-tests/not-cached", dataset_config_name=None,
                  output_dir=str(tmp_path / "out"))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    completed = run_script(str(tmp_path / "c.yaml"), cwd=tmp_path,
                           env=dict(ENV, HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "cache")))
    assert completed.returncode == 2
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith("train_translation.py: error: dataset 'hf-relpos-tests/not-cached' could not be loaded "
                           "(HF_HUB_OFFLINE is set: only a dataset in the local cache loads): ")
    assert not (tmp_path / "out").exists()


def test_push_to_hub_checks_the_login_before_training(tmp_path, corpus, monkeypatch):
    monkeypatch.setattr(preflight_module, "get_token", lambda: None)
    with pytest.raises(PreflightError, match=r"push_to_hub needs a Hugging Face login and none was found: run `hf "
                                             r"auth login`"):
        run([str(write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")), "--push_to_hub", "true"])
    assert not (tmp_path / "out").exists()

    def rejected(self, *args, **kwargs):
        raise OSError("401 Client Error: Invalid credentials")

    monkeypatch.setattr(preflight_module.HfApi, "whoami", rejected)
    with pytest.raises(PreflightError, match=r"push_to_hub: the Hugging Face login could not be checked \(OSError: "
                                             r"401 Client Error: Invalid credentials\)"):
        run([str(write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")), "--push_to_hub", "true",
             "--hub_token", "hf_invalid"])
    assert not (tmp_path / "out").exists()


def test_dropping_a_large_share_of_the_training_pairs_is_a_warning(tmp_path, corpus, capsys):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_source_length=12, max_target_length=12,
                          max_steps=1, do_predict=False)
    run([str(config)])
    (warning,) = [line for line in capsys.readouterr().out.splitlines() if "of the training pairs are dropped" in line]
    assert re.search(r" WARNING hf_relpos\.translation\.data: \d+\.\d% of the training pairs are dropped: train: kept \d+ of 60 "
                     r"pairs \(0 with an empty side dropped, \d+ over the length limits dropped\); raise "
                     r"max_source_length \(12\) / max_target_length \(12\) or set overlong_pairs: truncate$", warning)


# --- 7. the model card ---------------------------------------------------------------------------------------------


def test_the_output_dir_has_the_model_card_with_this_runs_results(trained):
    output_dir, _, results = trained
    card = ModelCard((output_dir / "README.md").read_text(encoding="utf-8"))
    assert card.data.pipeline_tag == "translation" and card.data.language == ["en", "de"]
    (bleu,) = [result for result in card.data.eval_results if result.metric_type == "sacrebleu"]
    assert bleu.dataset_split == "test" and bleu.metric_value == round(results["test"]["test_bleu"], 2)
    assert "| `max_relative_position` (k) | 2 |" in card.text


def test_a_run_gives_no_warning_but_its_own(tmp_path, corpus):
    """A run of every stage (evaluations and checkpoints during training, label smoothing, the last checkpoints
    averaged, evaluation, prediction) shows no Python warning (DeprecationWarning included: what calls into
    transformers, torch, datasets or accelerate that they deprecate), no warning of transformers' own log and nothing
    else on stderr (progress bars off); its log's warnings are the app's, here the untrained model's translations
    reaching their length cap."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", do_eval=True, eval_strategy="steps",
                          eval_steps=2, save_strategy="steps", save_steps=1, average_checkpoints=2,
                          label_smoothing_factor=0.1, max_steps=4)
    completed = run_script(str(config), cwd=tmp_path, env=dict(ENV, PYTHONWARNINGS="default", TQDM_DISABLE="1",
                                                                TRANSFORMERS_VERBOSITY="warning"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stderr == ""
    warned = [line for line in completed.stdout.splitlines() if " WARNING " in line]
    assert warned and all(re.search(r" WARNING hf_relpos\.translation\.trainer: (eval|test): \d+ of \d+ translations "
                                    "reached their length cap", line) for line in warned), warned


def test_a_run_ends_saying_where_its_model_card_metrics_and_translations_are(trained, tmp_path, corpus, capsys):
    """The last line of a run's log names what output_dir holds, as the Trainer's own log of a plain Seq2SeqTrainer
    run names where it saved the model: after training, the model, its card, the metrics and the translations; after
    scoring a model elsewhere, the metrics and translations alone."""
    output_dir = tmp_path / "out"
    run([str(write_config(tmp_path / "c.yaml", corpus, output_dir, do_eval=True))])
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        f" INFO hf_relpos.translation.training: {output_dir} holds the model and its tokenizer, the model card "
        "README.md, the metrics all_results.json and the translations eval_hypotheses.txt, test_hypotheses.txt")
    trained_dir, config, _ = trained
    run([str(config), "--model_name_or_path", str(trained_dir), "--do_train", "false", "--output_dir",
         str(tmp_path / "scored"), "--model.max_relative_position", "2", "--generation_max_length", "30"])
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        f" INFO hf_relpos.translation.training: {tmp_path / 'scored'} holds the metrics all_results.json and the "
        "translations test_hypotheses.txt")


# --- 8. the saved generation settings ------------------------------------------------------------------------------


def test_the_saved_generation_config_holds_the_requested_max_length(trained, tmp_path, corpus):
    """As max_new_tokens (generation_max_length counts the decoder start token), never max_length: with both saved,
    every generate(max_new_tokens=...) call warns."""
    output_dir, _, _ = trained
    generation = GenerationConfig.from_pretrained(output_dir)
    assert (generation.max_new_tokens, generation.num_beams, generation.length_penalty) == (29, 2, 0.6)
    assert generation.max_length is None
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_predict=False)
    run([str(config)])  # no generation_max_length: the positions' ceiling, under the per-source rule
    generation = GenerationConfig.from_pretrained(tmp_path / "out")
    assert (generation.max_new_tokens, generation.max_length) == (1024 - 1, None)
    assert (generation.max_len_a, generation.max_len_b) == (1.0, 4)  # 1 x source tokens + generation offset


def test_argument_classes_are_the_ones_training_exports():
    assert (ModelArguments, DataArguments, TranslationTrainingArguments) == arguments_module.ARGUMENT_CLASSES
    assert RelPosTransformerConfig.model_type == "relpos_transformer"


def test_shape_changes_valid_only_together_are_named(trained, tmp_path):
    """d_model 48 with 3 heads: 3 heads alone do not divide the saved d_model 32; both are named."""
    output_dir, config, _ = trained
    with pytest.raises(ConfigError, match=r"model: d_model=48 \(saved: 32\), decoder_attention_heads=3 \(saved: 2\), "
                                          r"encoder_attention_heads=3 \(saved: 2\) would change the shapes"):
        parse_arguments([str(config), "--model_name_or_path", str(output_dir), "--do_train", "false",
                         "--model.d_model", "48", "--model.encoder_attention_heads", "3",
                         "--model.decoder_attention_heads", "3"])


def test_cpu_runs_do_not_pin_dataloader_memory(tmp_path, corpus, monkeypatch):
    """Without an accelerator there is nothing to pin to (torch warns once per DataLoader); with one, the Trainer's
    default stays."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", use_cpu=False, dataloader_pin_memory=True)
    for accelerator_available in (False, True):
        monkeypatch.setattr(arguments_module.torch.accelerator, "is_available", lambda available=accelerator_available: available)
        *_, training_args = parse_arguments([str(config)])
        assert training_args.dataloader_pin_memory is accelerator_available


def test_remove_matching_removes_each_entry_once_links_to_nothing_and_folder_links_included(tmp_path):
    """An entry two patterns match is removed once; a link to nothing is found by a plain name (Path.glob skips it);
    a link to a folder is unlinked, the folder kept."""
    from hf_relpos.translation.preflight import remove_matching

    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "README.md").symlink_to(tmp_path / "missing" / "README.md")
    (tmp_path / "kept").mkdir()
    (tmp_path / "checkpoint-1").symlink_to(tmp_path / "kept", target_is_directory=True)
    removed = remove_matching(tmp_path, ["tokenizer*.json", "*_config.json", "README.md", "checkpoint-*"])
    assert removed == ["tokenizer_config.json", "README.md", "checkpoint-1"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kept"]


def fake_hub_cache(cache: Path, repo_id: str, model_folder: Path) -> Path:
    """`cache` laid out as huggingface_hub's cache holding `model_folder`'s files as `repo_id` at main
    (models--OWNER--NAME/refs/main -> a commit, snapshots/COMMIT/<files>)."""
    commit = "0" * 40
    repository = cache / f"models--{repo_id.replace('/', '--')}"
    (repository / "refs").mkdir(parents=True)
    (repository / "refs" / "main").write_text(commit)
    shutil.copytree(model_folder, repository / "snapshots" / commit)
    return cache


def unreachable_hub(self, repo_id, **kwargs):
    assert kwargs.get("timeout") == preflight_module.HUB_TIMEOUT_SECONDS
    raise ConnectionError("[Errno -2] Name or service not known")


def test_a_hub_model_is_checked_with_one_request_naming_the_field(tmp_path, monkeypatch):
    """A Hub model id (owner/name) that is no folder is asked of the Hub once, without retries: unreachable, or
    unknown there, it is one line naming the field; with HF_HUB_OFFLINE set only the local cache is looked in."""
    monkeypatch.setattr(preflight_module.HfApi, "model_info", unreachable_hub)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ValueError) as unreachable:
        preflight_module.check_model_source("nope/model", "model")
    assert str(unreachable.value) == (
        "model 'nope/model' is neither a local folder nor a Hub model in the local cache, and the Hugging Face Hub "
        "cannot be reached (ConnectionError: [Errno -2] Name or service not known): connect to the network, or give "
        "a saved model folder (HF_HUB_OFFLINE=1 loads a Hub model from the local cache without asking the Hub)")

    def missing(self, repo_id, **kwargs):
        raise hub_error(RepositoryNotFoundError, f"404 Client Error: {repo_id}")

    monkeypatch.setattr(preflight_module.HfApi, "model_info", missing)
    with pytest.raises(ValueError, match=r"^tokenizer_name 'me/no-such-model' is neither a local folder nor a model "
                                         r"on the Hugging Face Hub \(or it is private: log in with `hf auth login`\)"):
        preflight_module.check_model_source("me/no-such-model", "tokenizer_name")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"^model 'nope/model' is neither a local folder nor a Hub model in the local "
                                         r"cache, and HF_HUB_OFFLINE is set \(the Hub is not asked\)"):
        preflight_module.check_model_source("nope/model", "model")


def test_a_cached_hub_model_passes_and_folders_and_other_names_are_not_asked_of_the_hub(tmp_path, monkeypatch,
                                                                                        caplog):
    """A Hub model in the local cache (the default one, or cache_dir) loads as before: with HF_HUB_OFFLINE without a
    request; with an unreachable Hub after the loaders' retries, which one warning announces with the HF_HUB_OFFLINE
    hint. A folder and a name that is no Hub id are never asked of the Hub."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cache = fake_hub_cache(tmp_path / "cache", "me/tiny", tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(preflight_module.HfApi, "model_info", unreachable_hub)
    for cached_in in (None, str(cache)):   # the default cache, or cache_dir
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache if cached_in is None else tmp_path))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=preflight_module.__name__):
            preflight_module.check_model_source("me/tiny", "model_name_or_path", cache_dir=cached_in)
        assert [record.getMessage() for record in caplog.records] == [
            "model_name_or_path 'me/tiny': the Hugging Face Hub cannot be reached (ConnectionError: [Errno -2] Name or "
            "service not known); it loads from the local cache once the loaders' retries of the Hub give up (minutes); "
            "set HF_HUB_OFFLINE=1 to load it from there at once"]
    monkeypatch.setattr(preflight_module.HfApi, "model_info", lambda *args, **kwargs: pytest.fail("asked the Hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    preflight_module.check_model_source("me/tiny", "model_name_or_path", cache_dir=str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    for name in ("model", str(tmp_path / "model"), "not a hub id"):
        preflight_module.check_model_source(name, "model")


def test_a_hub_model_in_cache_dir_evaluates_offline_with_its_tokenizer(trained, corpus, tmp_path, monkeypatch):
    """cache_dir is the Hub cache of the run's models: with HF_HUB_OFFLINE, model_name_or_path as a Hub id held only
    there loads its config, weights and tokenizer from it (the tokenizer was looked for in the default cache alone:
    `cannot load its tokenizer`)."""
    output_dir, _, _ = trained
    model_folder = tmp_path / "model"
    shutil.copytree(output_dir, model_folder, ignore=shutil.ignore_patterns("checkpoint-*", "prepared_data"))
    cache = fake_hub_cache(tmp_path / "cache", "me/tiny", model_folder)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-default-cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", do_train=False, do_eval=True,
                          do_predict=False, model_name_or_path="me/tiny", cache_dir=str(cache))
    assert "eval_loss" in run([str(config)])["eval"]
