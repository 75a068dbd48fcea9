"""train_translation.py end to end on tiny generated corpora: argument parsing and errors, training, evaluation,
prediction, predict-only runs, checkpoint averaging and resuming."""

import importlib.util
import json
import logging
import math
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from conftest import MEMORISED_PAIRS, make_unwritable, run_killed_after_checkpoint, run_without_hf_relpos
from datasets import Dataset
from safetensors.torch import load_file, save_file
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerState
from transformers.utils import logging as transformers_logging

import hf_relpos  # noqa: F401 - registers the model with the Auto classes
import hf_relpos.translation.arguments as arguments_module
from hf_relpos import RelPosTransformerConfig, RelPosTransformerForConditionalGeneration
from hf_relpos.publish.hub import shown_command
from hf_relpos.publish.records import RUN_RECORD_FILE, load_recipe
from hf_relpos.tools.average import average_checkpoints
from hf_relpos.tools.average import main as average_main
from hf_relpos.tools.export import export_ctranslate2, is_ctranslate2_folder
from hf_relpos.tools.translate import main as translate_main
from hf_relpos.translation.arguments import ConfigError, TranslationTrainingArguments, parse_arguments
from hf_relpos.translation.batching import TokenBudgetBatchSampler
from hf_relpos.translation.checkpoints import complete_checkpoints
from hf_relpos.translation.demo_corpus import write_demo_corpus
from hf_relpos.translation.model_setup import log_model, max_new_tokens_for
from hf_relpos.translation.preflight import PreflightError
from hf_relpos.translation.safety import OutputDirError
from hf_relpos.translation.trainer import AbsolutePositionFadeCallback, SamplerEpochCallback, TranslationTrainer
from hf_relpos.translation.training import main as training_main
from hf_relpos.translation.training import run

REPO = Path(__file__).resolve().parents[1]
SIGNATURE_PREFIX = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:"

TINY_CONFIG = {
    "model": {
        "position_scheme": "shaw", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
        "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
        "max_relative_position": 4, "dropout": 0.0,
    },
    "source_lang": "en", "target_lang": "de",
    "tokenizer_vocab_size": 556,
    "max_source_length": 48, "max_target_length": 48,
    "do_train": True, "do_eval": True, "do_predict": True,
    "max_tokens_per_batch": 400,
    "max_steps": 6,
    "learning_rate": 1.0e-3, "lr_scheduler_type": "inverse_sqrt", "warmup_steps": 2,
    "optim": "adamw_torch", "adam_beta2": 0.98, "adam_epsilon": 1.0e-9, "label_smoothing_factor": 0.1,
    "per_device_eval_batch_size": 8, "generation_num_beams": 2, "generation_max_length_offset": 5,
    "logging_steps": 2, "save_strategy": "no", "report_to": "none", "use_cpu": True, "seed": 3,
    "disable_tqdm": True, "cpu_threads": 1,
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_demo_corpus(tmp_path_factory.mktemp("corpus"), 120, 12, 10, seed=5)


def write_config(path: Path, corpus: dict[str, Path], output_dir: Path, **overrides) -> Path:
    config = {**TINY_CONFIG, "train_file": str(corpus["train"]), "validation_file": str(corpus["validation"]),
              "test_file": str(corpus["test"]), "output_dir": str(output_dir), **overrides}
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> tuple[Path, dict]:
    """One tiny training run (6 steps, token budget), evaluated and predicted, shared by several tests."""
    folder = tmp_path_factory.mktemp("trained")
    config = write_config(folder / "tiny.yaml", corpus, folder / "out")
    return folder / "out", run([str(config)])


# --- parsing -------------------------------------------------------------------------------------------------------


def test_yaml_fills_the_arguments_and_flags_override(tmp_path, corpus):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", dataset_config_name=None)
    model_args, data_args, training_args = parse_arguments([
        str(config), "--learning_rate", "3e-4", "--model.d_model", "64", "--position_scheme", "xl",
        "--do_predict", "false", "--max-train-samples=50", "--report_to", "none",
    ])
    assert training_args.learning_rate == pytest.approx(3e-4)
    assert training_args.warmup_steps == 2 and training_args.lr_scheduler_type == "inverse_sqrt"
    assert training_args.adam_beta2 == pytest.approx(0.98) and training_args.adam_epsilon == pytest.approx(1e-9)
    assert training_args.do_train and not training_args.do_predict
    assert training_args.max_tokens_per_batch == 400 and training_args.generation_num_beams == 2
    assert model_args.model_config["d_model"] == 64 and model_args.model_config["position_scheme"] == "xl"
    assert model_args.model_config["encoder_layers"] == 1
    assert data_args.max_train_samples == 50 and data_args.train_file == str(corpus["train"])
    assert data_args.dataset_config_name is None


def test_numbers_in_exponent_form_are_numbers_in_model_flags_and_recipe_files(tmp_path, corpus):
    """YAML 1.2 floats (1e-1, 1e4, 2E-2), which PyYAML's YAML 1.1 reads as strings, are numbers in a --model.FIELD
    flag and in a recipe file's model: section, as they are in --learning_rate."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    config.write_text(config.read_text(encoding="utf-8").replace("  dropout: 0.0", "  dropout: 2E-2"), encoding="utf-8")
    model_args, _, _ = parse_arguments([str(config), "--model.attention_dropout", "1e-1", "--model.position_scheme",
                                        "rope", "--model.rope_theta", "1e4"])
    assert model_args.model_config["dropout"] == 0.02 and model_args.model_config["attention_dropout"] == 0.1
    assert model_args.model_config["rope_theta"] == 1e4


def test_flat_model_fields_in_yaml_go_to_the_model_config(tmp_path, corpus):
    section = {name: value for name, value in TINY_CONFIG["model"].items()
               if name not in ("position_scheme", "max_relative_position")}   # Shaw's k: not directional's
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", model=section, position_scheme="directional")
    model_args, _, _ = parse_arguments([str(config)])
    assert model_args.model_config["position_scheme"] == "directional"


@pytest.mark.parametrize(("name", "in_section", "flat"), [("dropout", 0.2, 0.3), ("position_scheme", "shaw", "xl"),
                                                          ("max_relative_position", 4, 4)])
def test_a_model_field_both_in_the_model_section_and_flat_is_one_error_naming_it(tmp_path, corpus, name, in_section,
                                                                                  flat):
    """A recipe that sets a config field in its model: section and again as a top-level key gives it twice, as a key
    repeated in one mapping does: the flat key silently replaced the section's value (dropout 0.3, position_scheme
    xl) instead of one error."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out",
                          model={**TINY_CONFIG["model"], name: in_section}, **{name: flat})
    with pytest.raises(ConfigError, match=rf"^{name} is given twice: in the 'model:' section \({name}: {in_section}\) "
                                          rf"and as a top-level key \({name}: {flat}\); give each field once$"):
        parse_arguments([str(config)])


@pytest.mark.parametrize(
    ("extra_yaml", "flags", "message"),
    [
        ({"learning_rat": 0.1}, [], r"unknown key\(s\): learning_rat \(did you mean learning_rate\?\)"),
        ({}, ["--no_such_flag", "1"], r"unknown key\(s\): --no_such_flag(?! \(did you mean)"),   # nothing like it
        ({}, ["--group_by_length", "true"], r"unknown key\(s\): --group_by_length \(a transformers 4 field; "
                                            r"transformers 5 has train_sampling_strategy group_by_length instead\)"),
        ({"no_cuda": True}, [], r"unknown key\(s\): no_cuda \(a transformers 4 field; transformers 5 has use_cpu"),
        ({}, ["--no-cuda", "true"], r"unknown key\(s\): --no-cuda \(a transformers 4 field; transformers 5 has use_cpu"),
        ({}, ["--logging-dir", "logs"], r"unknown key\(s\): --logging-dir \(a transformers 4 field; transformers 5 has "
                                        r"the TENSORBOARD_LOGGING_DIR environment variable instead\)"),
        ({}, ["--warmup_ratio", "0.1"], r"unknown key\(s\): --warmup_ratio \(a transformers 4 field; transformers 5 "
                                        r"has warmup_steps below 1, a fraction of the training steps \(warmup_steps "
                                        r"0\.1\) instead\)"),
        ({}, ["--learning-rat", "0.1"], r"unknown key\(s\): --learning-rat \(did you mean learning_rate\?\)"),
        ({"model": {**TINY_CONFIG["model"], "d_modle": 8}}, [], r"model\.d_modle \(did you mean d_model\?\)"),
        ({"model": {**TINY_CONFIG["model"], "vocab_size": 8}}, [], r"unknown key\(s\): model\.vocab_size"),
        ({}, ["--learning_rate", "fast"], r"argument --learning_rate/--learning-rate: invalid float value: 'fast'"),
        ({}, ["--position_scheme", "sandwich"], r"model: position_scheme must be one of"),
        ({}, ["--model.mem_len", "4"], r"^model: mem_len must be 0 for the encoder-decoder, got 4"),
        ({}, ["--model.decoder_layers", "0"], r"^model: decoder_layers must be at least 1 for the encoder-decoder"),
        ({}, ["--model.attention_dropout", "0.1", "--attn_implementation", "flex_attention"],
         r"^model: attention_dropout_kind 'probabilities' runs with attn_implementation \['eager', 'sdpa', "
         r"'relpos_triton'\], got 'flex_attention' with attention_dropout=0.1 in training; set attention_dropout_kind "
         r"to 'keys'"),
        ({}, ["--model.attention_dropout", "0.1", "--model.attention_dropout_kind", "keys", "--attn_implementation",
              "relpos_triton"],
         r"^model: attention_dropout_kind 'keys' runs with attn_implementation \['eager', 'sdpa', 'flex_attention'\], "
         r"got 'relpos_triton'"),
        ({}, ["--overlong_pairs", "drop"], r"overlong_pairs must be one of \['filter', 'truncate'\]"),
        # a NaN penalty ranked the beams by NaN scores after the whole training (other translations, no error)
        ({}, ["--generation_length_penalty", "nan"], r"^generation_length_penalty must be a finite number \(beam "
                                                     r"search ranks a hypothesis by its score / length\^penalty\), "
                                                     r"got nan$"),
        ({"generation_length_penalty": float("-inf")}, [], r"^generation_length_penalty must be a finite number"),
        # transformers' scheduler failed on it with "cannot convert float NaN to integer", once training started
        ({}, ["--warmup_steps", "nan"], r"^warmup_steps must be a finite number >= 0 \(0: no warm-up\), got nan$"),
        ({"warmup_steps": float("inf")}, [], r"^warmup_steps must be a finite number >= 0 \(0: no warm-up\), got inf$"),
        ({"source_lang": None}, [], r"source_lang cannot be null"),
        ({"do_train": False}, [], r"need model_name_or_path"),
        ({}, ["--bleu_tokenize", "zh-cn"], r"^bleu_tokenize must be one of none, zh, 13a, .*ja-mecab, ko-mecab.*; "
                                           r"got 'zh-cn'$"),
        ({"bleu_tokenize": "mecab"}, [], r"^bleu_tokenize must be one of none, zh, 13a, .*; got 'mecab'$"),
        ({}, ["--lr_scheduler_kwargs", "{min_lr: 1e-5}"],   # was json's "Expecting property name ...", naming no field
         r"""^lr_scheduler_kwargs must be a JSON object such as \{"key": 1\} \(its keys in double quotes\), got """
         r"'\{min_lr: 1e-5\}': Expecting property name enclosed in double quotes: line 1 column 2 \(char 1\)$"),
        pytest.param({}, ["--deepspeed", "ds_config.json"], r"'deepspeed>=[\d.]+' distribution was not found",
                     marks=pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None,
                                              reason="deepspeed is installed")),   # was a PackageNotFoundError traceback
    ],
)
def test_bad_configuration_is_one_clear_error(tmp_path, corpus, extra_yaml, flags, message):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", **extra_yaml)
    with pytest.raises(ConfigError, match=message):
        parse_arguments([str(config), *flags])


@pytest.mark.parametrize(("lines", "named"), [
    ("on: 1", "true"), ("~: 1\n1: 2", "null, 1"), ("model:\n  off: 1", "model.false"),
])
def test_a_recipe_key_that_yaml_reads_as_no_text_is_one_error_naming_it(tmp_path, corpus, lines, named):
    """A key YAML 1.1 reads as another value than text (on: as true, ~: as null, 1: as a number) failed as "'bool'
    object has no attribute 'removeprefix'" at the top level, and was named model.False in the model: section."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    text = config.read_text(encoding="utf-8")
    if lines.startswith("model:"):
        text = text.replace("model:\n", lines + "\n", 1)
    config.write_text(text + ("" if lines.startswith("model:") else lines + "\n"), encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^unknown key\(s\): {re.escape(named)}; "):
        parse_arguments([str(config)])


@pytest.mark.parametrize(("name", "names"), [
    ("train_file", "a data file or the prefix of plain-text files"),
    ("validation_file", "a data file or the prefix of plain-text files"),
    ("test_file", "a data file or the prefix of plain-text files"),
    ("dataset_name", "a Hub dataset, a local folder or 'demo'"),
    ("model_name_or_path", "a saved model folder or a Hub model id"),
    ("tokenizer_name", "a saved tokenizer folder or a Hub model id"), ("cache_dir", "a folder"),
    ("hub_model_id", "a Hub repository, USER/NAME or NAME"),
])
@pytest.mark.parametrize("blank", ["", " "])
def test_a_blank_name_is_one_error_naming_the_field(tmp_path, corpus, name, names, blank):
    """A setting that names a file, folder or Hub id given blank (`--train_file "$TRAIN"` with TRAIN unset) is not
    the setting left unset: train_file, validation_file and test_file "" read no local file, so the run went to the
    Hub for dataset_name's default, wmt/wmt14, without a word; hub_model_id "" pushed to output_dir's folder name."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    with pytest.raises(ConfigError, match=rf"^{name} must name {re.escape(names)}, or be null; got '{blank}'$"):
        parse_arguments([str(config), f"--{name}", blank])


@pytest.mark.parametrize(("field", "value"), [
    ("eval_strategy", "epohc"), ("lr_scheduler_type", "inverse_squrt"), ("optim", "adam"),
    ("train_sampling_strategy", "foo"), ("log_level", "verbose"), ("ddp_backend", "ncl"),
    ("dataloader_multiprocessing_context", "frk"),
])
def test_a_recipe_value_outside_a_fields_choices_is_one_error_naming_the_field(tmp_path, corpus, field, value):
    """A recipe's value is checked against the field's choices as a flag's is: argparse checks only the command line
    (the recipe fills its defaults), so transformers' enums refused it naming the enum, not the field ('epohc is not
    a valid IntervalStrategy'), ddp_backend failed as 'Default process group has not been initialized', and a
    train_sampling_strategy, log_level or dataloader_multiprocessing_context outside its choices was taken."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", **{field: value})
    with pytest.raises(ConfigError, match=rf"^{field} must be one of .*'{value}'"):
        parse_arguments([str(config)])


@pytest.mark.parametrize(("line", "name", "value"), [
    ("target_lang: no", "target_lang", "no"),   # Norwegian, which YAML 1.1 reads as false
    ("hub_model_id: 1.10", "hub_model_id", "1.10"), ("run_name: 010", "run_name", "010"),
    ("run_name: 1:30", "run_name", "1:30"), ("run_name: 2024-01-01", "run_name", "2024-01-01"),
    ("eval_strategy: no", "eval_strategy", "no"), ("<<: {run_name: 010}", "run_name", "010"),
    ('<<: {run_name: 010}\nrun_name: "new-run"', "run_name", "new-run"),   # a quoted value set beside the merge wins
])
def test_a_plain_yaml_scalar_of_a_text_field_is_its_text_as_written(tmp_path, corpus, line, name, value):
    """A text field takes a recipe's unquoted value as written, as it takes the same text as a flag: YAML 1.1 read
    `target_lang: no` as false (the run looked for a language 'false'), `hub_model_id: 1.10` as 1.1 (another
    repository), `run_name: 010` as 8 and `1:30` as 90 (base 60), and a date as a date object, which reached the
    arguments unconverted; `eval_strategy: no` was refused as 'false'."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    lines = [text for text in config.read_text(encoding="utf-8").splitlines() if not text.startswith(f"{name}:")]
    config.write_text("\n".join([*lines, line]) + "\n", encoding="utf-8")
    taken = [getattr(group, name) for group in parse_arguments([str(config)]) if hasattr(group, name)]
    assert [getattr(setting, "value", setting) for setting in taken] == [value]   # eval_strategy: an enum of text


@pytest.mark.parametrize("value", ["no", "false", "yes"])
def test_a_resume_from_checkpoint_that_is_no_setting_is_one_error_naming_what_it_takes(tmp_path, corpus, value):
    """`resume_from_checkpoint: false` (or no, yes: the recipe's text, as a flag's) was "'false' is not a folder",
    naming neither last nor null; it is refused before anything is read or written."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    config.write_text(config.read_text(encoding="utf-8") + f"resume_from_checkpoint: {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^resume_from_checkpoint: '{value}' is not a folder; it takes a checkpoint "
                                          r"folder, last \(or true\) for output_dir's newest complete checkpoint, or "
                                          r"null to train from step 0$"):
        run([str(config)])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("written", "flags", "message"), [
    ("seed: 010", [], r"^seed: 010 is ambiguous: YAML 1\.1 .* takes it as the octal number 8, YAML 1\.2 as 10; write 8 "
                      r"or 10 without a leading zero$"),
    ("max_steps: 1:30", [], r"^max_steps: 1:30 is ambiguous: YAML 1\.1 .* takes it as the base-60 number 90, YAML 1\.2 as "
                            r"text; write the number as a decimal \(90 or what you meant\)$"),
    ("learning_rate: 1:30.5", [], r"^learning_rate: 1:30\.5 is ambiguous: .* base-60 number 90\.5"),
    ("  d_model: 032", [], r"^model\.d_model: 032 is ambiguous: .* octal number 26, YAML 1\.2 as 32"),
    # a model field given as a top-level key
    ("self_attention_window: 010", [], r"^self_attention_window: 010 is ambiguous: .* octal number 8, YAML 1\.2 as 10"),
    ("", ["--model.d_model", "032"], r"^argument --model\.d_model/--d_model: 032 is ambiguous: .* octal number 26"),
])
def test_a_number_yaml_1_1_reads_otherwise_than_yaml_1_2_is_one_error_naming_the_field(tmp_path, corpus, written,
                                                                                       flags, message):
    """YAML 1.1 reads an integer with a leading zero as octal (`seed: 010` was 8, where `--seed 010` is 10) and
    numbers joined by ':' in base 60 (`max_steps: 1:30` was 90): in a number field of a recipe (its `model:` section
    included, and a model field given as a top-level key) or a --model flag, either is one error naming the field, not a silent reading. A text field takes them
    as written (`test_a_plain_yaml_scalar_of_a_text_field_is_its_text_as_written`)."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    name = written.partition(":")[0]
    lines = [text if not (name and text.startswith(f"{name}:")) else written
             for text in config.read_text(encoding="utf-8").splitlines()]
    config.write_text("\n".join(lines if written in lines or not written else [*lines, written]) + "\n",
                      encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        parse_arguments([str(config), *flags])


def test_a_date_for_a_field_that_takes_no_text_is_one_error_naming_the_field(tmp_path, corpus):
    """YAML reads 2024-01-01 as a date, which reached a true/false field unconverted (do_predict a date: true)."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", do_predict=False)
    config.write_text(config.read_text(encoding="utf-8").replace("do_predict: false", "do_predict: 2024-01-01"),
                      encoding="utf-8")
    with pytest.raises(ConfigError,
                       match=r"^argument --do_predict/--do-predict: Truthy value expected: got 2024-01-01"):
        parse_arguments([str(config)])


def test_a_recipe_that_is_not_utf8_or_is_a_folder_is_one_error_naming_it(tmp_path):
    """A recipe saved in Latin-1 failed as "'utf-8' codec can't decode byte 0xe9 ...", naming no file; a folder was
    said not to exist."""
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("run_name: café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(recipe))}: not UTF-8 text \('utf-8' codec can't decode "
                                          r"byte 0xe9 .*\): save the recipe as UTF-8$"):
        parse_arguments([str(recipe)])
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(ConfigError, match=r"^config file '.*folder\.yaml' is a folder$"):
        parse_arguments([str(tmp_path / "folder.yaml")])


def test_a_field_given_twice_in_a_recipe_is_one_error_naming_it_and_both_lines(tmp_path, corpus):
    """PyYAML keeps the last of two equal keys without a word, so a field set twice in a recipe (a copied line, an
    edit at the top of a long file) was trained with whichever came last; a YAML merge (<<) still overrides."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", learning_rate=0.001)
    lines = config.read_text(encoding="utf-8").splitlines()
    first = next(number for number, line in enumerate(lines, 1) if line.startswith("learning_rate:"))
    config.write_text("\n".join([*lines, "learning_rate: 0.5"]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"invalid YAML: found the key 'learning_rate' twice in a mapping, on line "
                                          rf"{first} and line {len(lines) + 1}"):
        parse_arguments([str(config)])
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &base {dropout: 0.1, d_model: 8}\nmodel:\n  <<: *base\n  dropout: 0.2\n", encoding="utf-8")
    assert load_recipe(merged)["model"] == {"dropout": 0.2, "d_model": 8}


def test_the_suggested_name_does_not_depend_on_which_string_is_compared_with_which():
    """difflib's ratio is not symmetric: no_such_flag against source_lang is 0.61 one way and 0.43 the other, above
    and below get_close_matches' cutoff; the hint takes the smaller, so a name nothing like any field gets none."""
    from difflib import SequenceMatcher

    from hf_relpos.model.validation import closest_name

    ratios = [SequenceMatcher(None, *pair).ratio() for pair in (("no_such_flag", "source_lang"),
                                                                ("source_lang", "no_such_flag"))]
    assert max(ratios) >= 0.6 > min(ratios)
    assert closest_name("no_such_flag", ["source_lang", "target_lang"]) is None
    assert closest_name("learning_rat", ["learning_rate", "source_lang"]) == "learning_rate"
    assert closest_name("max_tokens", ["max_tokens_per_batch", "max_steps"]) == "max_tokens_per_batch"
    assert closest_name("anything", []) is None


def test_the_suggested_name_passes_over_names_whose_quick_ratio_is_below_the_cutoff(monkeypatch):
    """closest_name gives what the smaller ratio of both orders gives over every candidate, but computes the ratio
    only where difflib's quick ratios (its upper bounds) reach the cutoff: a config's unknown key met every field's
    two ratios (about 11 ms a key)."""
    import difflib
    import random

    from hf_relpos import RelPosTransformerConfig
    from hf_relpos.model.validation import closest_name

    fields = sorted(RelPosTransformerConfig().to_dict())
    generator = random.Random(0)
    names = [*fields, *("".join(generator.sample(field, len(field))) for field in fields),
             *(field[: generator.randrange(1, len(field))] for field in fields), "zz", "d_modle", "num_beam"]
    for name in names:
        scores = [(min(difflib.SequenceMatcher(None, name, field).ratio(),
                       difflib.SequenceMatcher(None, field, name).ratio()), field) for field in fields]
        score, best = max(scores)
        assert closest_name(name, fields) == (best if score >= 0.6 else None), name
    ratios = []
    full_ratio = difflib.SequenceMatcher.ratio
    monkeypatch.setattr(difflib.SequenceMatcher, "ratio", lambda self: ratios.append(self.b) or full_ratio(self))
    assert closest_name("zz", fields) is None and ratios == []
    assert closest_name("d_modle", fields) == "d_model" and 0 < len(ratios) < len(fields)


def test_command_line_error_exits_with_one_line_and_writes_nothing(tmp_path, corpus):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", learning_rat=0.1)
    completed = subprocess.run([sys.executable, str(REPO / "train_translation.py"), str(config)],
                               capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        "train_translation.py: error: " + completed.stderr.split("error: ", 1)[1].strip()
    ]
    assert "unknown key(s): learning_rat (did you mean learning_rate?)" in completed.stderr
    assert not (tmp_path / "out").exists()


def test_missing_language_stops_before_anything_is_written(tmp_path, corpus):
    bad_train = tmp_path / "train.jsonl"
    bad_train.write_text('{"translation": {"en": "Hello.", "fr": "Bonjour."}}\n', encoding="utf-8")
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", train_file=str(bad_train))
    with pytest.raises(ValueError, match=r"train\.jsonl:1, field 'translation': no 'de'"):
        run([str(config)])
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(importlib.util.find_spec("MeCab") is not None, reason="sacrebleu[ja] is installed")
@pytest.mark.parametrize("flags", [["--target_lang", "ja"], ["--bleu_tokenize", "ja-mecab"]])
def test_japanese_bleu_without_its_extra_is_refused_before_training(tmp_path, corpus, flags):
    """ja-mecab, chosen for a ja target or named, needs sacrebleu[ja]: one line when the arguments are read, not a
    failure at the first evaluation after training."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    with pytest.raises(ConfigError) as raised:
        parse_arguments([str(config), *flags])
    assert str(raised.value).startswith("bleu_tokenize: ") and "pip install sacrebleu[ja]" in str(raised.value)
    assert str(raised.value).endswith("or set bleu_tokenize to another tokenization (e.g. char, which needs no package)")
    assert "\n" not in str(raised.value)
    parse_arguments([str(config), *flags[:2], "--bleu_tokenize", "char"])   # the way out the error names
    parse_arguments([str(config), *flags, "--do_eval", "false", "--do_predict", "false"])   # nothing is scored


# --- end to end ----------------------------------------------------------------------------------------------------


def test_training_run_writes_scored_results_and_a_loadable_model(trained, corpus):
    output_dir, results = trained
    for prefix in ("eval", "test"):
        saved = json.loads((output_dir / f"{prefix}_results.json").read_text())
        assert 0.0 <= saved[f"{prefix}_bleu"] <= 100.0 and 0.0 <= saved[f"{prefix}_chrf"] <= 100.0
        assert saved[f"{prefix}_bleu_signature"].startswith(SIGNATURE_PREFIX)
        assert saved[f"{prefix}_bleu"] == pytest.approx(results[prefix][f"{prefix}_bleu"])
    expected_lines = {"eval": 12, "test": 10}
    for prefix, count in expected_lines.items():
        lines = (output_dir / f"{prefix}_hypotheses.txt").read_text(encoding="utf-8").split("\n")
        assert lines[-1] == "" and len(lines) - 1 == count
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    assert isinstance(model, RelPosTransformerForConditionalGeneration)
    assert model.config.vocab_size == len(tokenizer) and model.config.position_scheme == "shaw"
    assert model.config.use_cache is True   # as RelPosTransformerConfig's default, not the Trainer's training value
    assert model.generation_config.num_beams == 2 and model.generation_config.length_penalty == pytest.approx(0.6)
    assert not list(output_dir.glob(".tokenizer.*"))
    card = (output_dir / "README.md").read_text(encoding="utf-8")   # named as a push without hub_model_id names it
    assert "\n# out\n" in card and "model-index:\n- name: out\n" in card and "# tiny\n" not in card


def test_torch_compile_trains_token_budget_batches_without_a_recompile_per_length(tmp_path, corpus):
    """`torch_compile: true` (the Trainer's field) trains through the app: the token-budget batches of six steps,
    of changing sizes, compile two graphs (the first shape, then dynamic sizes), and the saved model is the plain
    model's weights (no compile wrapper in their names)."""
    import torch._dynamo

    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", torch_compile=True,
                          torch_compile_backend="aot_eager", do_eval=False, do_predict=False)
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    results = run([str(config)])
    assert results["train"]["train_steps"] == 6 and math.isfinite(results["train"]["train_loss"])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 2
    names = set(load_file(tmp_path / "out" / "model.safetensors"))
    assert names and not any("_orig_mod" in name for name in names)
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out"), RelPosTransformerForConditionalGeneration)


def test_the_saved_folder_translates_as_its_card_says_where_hf_relpos_is_not_installed(trained, tmp_path):
    """The card's `pipeline("translation", ..., trust_remote_code=True)` snippet, run on the folder the run saved in a
    Python in which hf_relpos cannot be imported: the folder ships the pipeline file and declares it."""
    output_dir, _ = trained
    assert (output_dir / "pipeline_relpos.py").is_file()
    config = json.loads((output_dir / "config.json").read_text(encoding="utf-8"))
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_relpos.TranslationPipeline"
    card = (output_dir / "README.md").read_text(encoding="utf-8")
    snippet = card.split("this repository ships one (`pipeline_relpos.py`):\n\n```python\n")[1].split("```")[0]
    assert 'model="REPO_ID", trust_remote_code=True' in snippet
    script = snippet.replace('"REPO_ID"', repr(str(output_dir))) + 'print("TRANSLATED", translator(["The cat."]))\n'
    result = run_without_hf_relpos(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TRANSLATED [{'translation_text': " in result.stdout


def test_generation_length_is_ratio_times_source_length_plus_offset_per_source(trained):
    """fairseq's max_len_a * |x| + max_len_b per source, under generation_max_length - 1 and the positions' ceiling;
    the trained folder saves the rule, not a number, so generate applies it to any source."""
    output_dir, _ = trained
    saved = json.loads((output_dir / "generation_config.json").read_text())
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    assert (saved["max_len_a"], saved["max_len_b"]) == (1.0, 5)  # the run's generation_max_length_offset
    assert saved["max_new_tokens"] == model.config.max_position_embeddings - 1
    assert (model.generation_config.max_len_a, model.generation_config.max_len_b) == (1.0, 5)
    arguments = TranslationTrainingArguments(output_dir=str(output_dir / "unused"), generation_max_length_offset=50,
                                             use_cpu=True, report_to="none")
    assert max_new_tokens_for(17, arguments, 1024) == 67
    arguments.generation_max_length_ratio = 1.5
    assert max_new_tokens_for(17, arguments, 1024) == 75  # floor(1.5 * 17 + 50)
    arguments.generation_max_length = 40  # generate's max_length: the decoder start token counts
    assert max_new_tokens_for(17, arguments, 1024) == 39
    assert max_new_tokens_for(17, arguments, 30) == 29


@pytest.mark.parametrize("beams", [2, 4])
def test_the_runs_beam_length_penalty_is_saved_with_beam_search(tmp_path, beams):
    """generation_length_penalty goes into the generation config whenever the run decodes with beams."""
    from transformers import GenerationConfig

    from hf_relpos.translation.model_setup import configure_decoding

    arguments = TranslationTrainingArguments(output_dir=str(tmp_path), generation_num_beams=beams,
                                             generation_length_penalty=0.8, use_cpu=True, report_to="none")
    generation = GenerationConfig()
    configure_decoding(generation, arguments, 64)
    assert (generation.num_beams, generation.length_penalty) == (beams, 0.8)


@pytest.fixture(scope="module")
def small_tokenizer():
    from hf_relpos.translation.tokenization import train_joint_tokenizer

    return train_joint_tokenizer(["a small dog", "ein kleiner Hund", "a small cat", "eine kleine Katze"] * 20,
                                 vocab_size=300)


def small_trainer(tokenizer, output_dir: Path, **arguments) -> TranslationTrainer:
    """The app's trainer (build_trainer) of a tiny absolute model, on CPU."""
    from hf_relpos.translation.trainer import build_trainer

    model = RelPosTransformerForConditionalGeneration(RelPosTransformerConfig(**RelPosTransformerConfig.held_fields(
        "absolute", {**TINY_CONFIG["model"], "position_scheme": "absolute"}), vocab_size=len(tokenizer)))
    training_arguments = TranslationTrainingArguments(output_dir=str(output_dir), use_cpu=True, report_to="none",
                                                      **arguments)
    return build_trainer(model, tokenizer, training_arguments, None, {}, "de")


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_trainer_keeps_the_models_use_cache_in_memory_and_in_its_checkpoints(small_tokenizer, tmp_path,
                                                                                 use_cache):
    """transformers' Trainer sets `config.use_cache` to its training argument (False), which a saved model had."""
    from hf_relpos.translation.trainer import build_trainer

    model = RelPosTransformerForConditionalGeneration(RelPosTransformerConfig(
        **TINY_CONFIG["model"], vocab_size=len(small_tokenizer), use_cache=use_cache))
    training_arguments = TranslationTrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True,
                                                      report_to="none")
    trainer = build_trainer(model, small_tokenizer, training_arguments, None, {}, "de")
    assert model.config.use_cache is use_cache
    trainer.save_model(str(tmp_path / "saved"))
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["use_cache"] is use_cache


def test_a_generated_translation_of_an_empty_source_is_scored_and_written_as_an_empty_line(small_tokenizer):
    """Whatever the model generates for an empty (or blank) source, its hypothesis is the empty line (the model
    would invent a sentence after </s> alone); other sources keep theirs, in source order."""
    from types import SimpleNamespace

    import numpy as np
    from transformers import EvalPrediction

    from hf_relpos.translation.trainer import EvaluationSet

    tokenizer = small_tokenizer
    invented = [tokenizer.bos_token_id, *tokenizer(text_target="ein kleiner Hund")["input_ids"]]
    sources = ["a small dog", "", "  ", "a dog"]
    evaluation = EvaluationSet(dataset=None, order=np.array([3, 0, 1, 2]), references=None, sources=sources)
    trainer = SimpleNamespace(evaluation_sets={"test": evaluation}, _active_prefix="test", processing_class=tokenizer,
                              args=SimpleNamespace(bleu_tokenize=None), target_lang="de",
                              _warn_of_capped_translations=lambda *_: None)   # its own test: a trained model's run
    TranslationTrainer._compute_translation_metrics(trainer, EvalPrediction(np.array([invented] * 4), None))
    assert evaluation.hypotheses == ["ein kleiner Hund", "", "", "ein kleiner Hund"]


def test_only_the_main_process_writes_the_results_files(tmp_path):
    """Under a launch every process holds the same metrics; the main process alone writes them (a merge of
    all_results.json by every process at once would race)."""
    from types import SimpleNamespace

    for main in (False, True):
        trainer = SimpleNamespace(is_world_process_zero=lambda main=main: main,
                                  args=SimpleNamespace(output_dir=str(tmp_path)))
        TranslationTrainer.save_metrics(trainer, "eval", {"eval_bleu": 1.0})
        assert sorted(path.name for path in tmp_path.iterdir()) == (
            ["all_results.json", "eval_results.json"] if main else [])


def test_evaluation_reads_its_examples_in_order_under_a_length_grouping_training_strategy(tmp_path, small_tokenizer):
    """Evaluation predictions are put back in source order by position: the evaluation sampler keeps dataset order
    even where train_sampling_strategy group_by_length would have the Trainer's group them by length."""
    trainer = small_trainer(small_tokenizer, tmp_path, train_sampling_strategy="group_by_length",
                            per_device_eval_batch_size=2)
    lengths = [3, 9, 1, 7, 2, 8, 5, 4, 6, 10, 3, 2]
    dataset = Dataset.from_dict({"input_ids": [[5] * length for length in lengths]})
    assert list(trainer._get_eval_sampler(dataset)) == list(range(len(lengths)))


def five_sorted_pairs(tokenizer) -> tuple[Dataset, list[int], list[str], list[str]]:
    """Five tokenized pairs sorted by source length (`sort_by_source_length`: the dataset and the order to restore),
    with their source and reference texts."""
    from hf_relpos.translation.data import sort_by_source_length

    sources = ["a small dog", "a cat", "a small small cat", "dog", "a dog"]
    references = ["ein kleiner Hund", "eine Katze", "eine kleine kleine Katze", "Hund", "ein Hund"]
    source_ids = [tokenizer(text)["input_ids"] for text in sources]
    target_ids = [tokenizer(text_target=text)["input_ids"] for text in references]
    dataset, order = sort_by_source_length(Dataset.from_dict({
        "input_ids": source_ids, "labels": target_ids, "source_length": [len(ids) for ids in source_ids],
        "target_length": [len(ids) for ids in target_ids]}))
    return dataset, order, sources, references


@pytest.mark.parametrize("split", ["eval", "test"])
def test_evaluation_translates_and_scores_every_sentence_under_dataloader_drop_last(tmp_path, small_tokenizer, split):
    """dataloader_drop_last drops the last incomplete batch of training pairs only: evaluation and prediction
    still translate every sentence (5 in batches of 2) and score all of them. The Trainer's loaders dropped the
    fifth, and putting 4 translations back in the order of 5 sources failed after training."""
    from hf_relpos.translation.trainer import EvaluationSet

    tokenizer = small_tokenizer
    dataset, order, sources, references = five_sorted_pairs(tokenizer)
    trainer = small_trainer(tokenizer, tmp_path, per_device_eval_batch_size=2, dataloader_drop_last=True,
                            generation_num_beams=1)
    trainer.model.generation_config.max_new_tokens = 2
    trainer.evaluation_sets = {split: EvaluationSet(dataset, order, references, sources)}
    loader = trainer.get_eval_dataloader(dataset) if split == "eval" else trainer.get_test_dataloader(dataset)
    assert [len(batch["input_ids"]) for batch in loader] == [2, 2, 1]
    assert trainer.args.dataloader_drop_last, "the training pairs' setting is left as it was"

    if split == "eval":
        metrics = trainer.evaluate(dataset)
    else:
        metrics = trainer.predict(dataset, metric_key_prefix="test").metrics
    assert f"{split}_bleu" in metrics and len(trainer.evaluation_sets[split].hypotheses) == 5


def test_the_collator_pads_labels_with_the_index_the_loss_ignores(tmp_path, small_tokenizer):
    """Label padding is -100, which the loss leaves out; padding with the pad token would train the model to
    predict padding."""
    tokenizer = small_tokenizer
    trainer = small_trainer(tokenizer, tmp_path)
    short, long = (tokenizer(text, text_target=text) for text in ("a cat", "a small cat and a small cat"))
    batch = trainer.data_collator([dict(short), dict(long)])
    padding = len(long["labels"]) - len(short["labels"])
    assert padding > 0
    assert batch["labels"][0, len(short["labels"]):].tolist() == [-100] * padding
    assert batch["labels"][0, :len(short["labels"])].tolist() == short["labels"]


def test_generate_with_max_new_tokens_on_a_trained_folder_does_not_warn(tmp_path, corpus, capfd, caplog):
    """The saved generation config caps lengths with max_new_tokens, never max_length (with both set, generate warns
    at every call), also after evaluations during training (Seq2SeqTrainer fills generate's defaults into it)."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", do_eval=False, do_predict=False,
                          eval_strategy="steps", eval_steps=3)
    run([str(config)])
    saved = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert "max_length" not in saved and saved["max_len_b"] == 5
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out")
    inputs = tokenizer(["The man sees the dog."], return_tensors="pt")
    capfd.readouterr()
    caplog.clear()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        transformers_logging.enable_propagation()
        try:
            short = model.generate(**inputs, max_new_tokens=3, num_beams=1, min_new_tokens=3)
            model.generate(**inputs)
        finally:
            transformers_logging.disable_propagation()
    printed = capfd.readouterr().err + caplog.text + " ".join(str(warning.message) for warning in caught)
    assert "max_length" not in printed and "max_new_tokens" not in printed
    assert short.shape[-1] == 1 + 3  # the decoder start token and 3 new tokens: max_new_tokens took effect


def test_evaluating_during_training_saves_the_generation_config_the_run_set_and_it_exports(trained, corpus, tmp_path):
    """Seq2SeqTrainer fills generate's defaults (num_beam_groups 1, top_k 50, ...) into the model's generation config
    when it evaluates: the final model and each checkpoint are still saved with the config a run without evaluations
    saves, and the folder exports to CTranslate2 (README: Deploy)."""
    pytest.importorskip("ctranslate2")
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", do_eval=False, do_predict=False,
                          eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=3)
    run([str(config)])
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "eval_bleu" in entry] == [3, 6]
    without_evaluations = json.loads((trained[0] / "generation_config.json").read_text())
    for folder in (tmp_path / "out", tmp_path / "out" / "checkpoint-3", tmp_path / "out" / "checkpoint-6"):
        assert json.loads((folder / "generation_config.json").read_text()) == without_evaluations, folder
    assert is_ctranslate2_folder(export_ctranslate2(tmp_path / "out", tmp_path / "ct2", quantization="int8"))


@pytest.mark.parametrize(("batching", "epochs"), [
    ({"max_tokens_per_batch": 100_000, "max_steps": 3}, 3),   # a token budget holding the corpus: one batch an epoch
    ({"max_tokens_per_batch": None, "per_device_train_batch_size": 16, "max_steps": 8}, 1),   # 7 x 16 + 8 pairs
])
def test_train_samples_per_second_counts_the_pairs_trained_on(tmp_path, corpus, batching, epochs):
    """train_samples_per_second x train_runtime is the number of pairs trained on (here every pair of the 120-pair
    corpus `epochs` times), not steps x per_device_train_batch_size; as printed, returned and saved."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", do_eval=False, do_predict=False, **batching)
    metrics = run([str(config)])["train"]
    assert metrics["train_samples"] == 120 and metrics["epoch"] == pytest.approx(epochs)
    # the rate is rounded to 3 decimals (as transformers rounds it): off by at most 0.0005 pairs a second
    assert metrics["train_samples_per_second"] * metrics["train_runtime"] == pytest.approx(
        120 * epochs, abs=0.0005 * metrics["train_runtime"] + 1e-6)
    saved = json.loads((tmp_path / "out" / "train_results.json").read_text())
    logged = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"][-1]
    assert saved["train_samples_per_second"] == logged["train_samples_per_second"] == (
        metrics["train_samples_per_second"])


def test_predict_only_run_on_the_saved_model_scores_the_test_file(trained, corpus, tmp_path):
    model_dir, results = trained
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "predict", model_name_or_path=str(model_dir),
                          do_train=False, do_eval=False)
    predicted = run([str(config)])
    assert set(predicted) == {"test"}
    assert predicted["test"]["test_bleu"] == pytest.approx(results["test"]["test_bleu"])
    assert (tmp_path / "predict" / "test_hypotheses.txt").read_text() == (model_dir / "test_hypotheses.txt").read_text()
    assert not (tmp_path / "predict" / "model.safetensors").exists()


@pytest.mark.parametrize("saving", [{"save_strategy": "epoch"},
                                    {"save_strategy": "best", "metric_for_best_model": "loss"}], ids=["epoch", "best"])
def test_predict_only_with_a_recipe_that_evaluates_every_epoch_needs_no_validation_file(memorised_model_folder,
                                                                                         tmp_path, saving):
    """A recipe's `eval_strategy: epoch` (the Multi30k recipes') schedules evaluations during training: a predict-only
    run of it (do_train false, do_eval false, only a test file) predicts and writes its test results, whether it
    saves checkpoints every epoch or at the best evaluation (save_strategy best, which needs evaluations only to
    train)."""
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({"translation": {"en": source, "de": target}}) + "\n"
                                 for source, target in MEMORISED_PAIRS), encoding="utf-8")
    recipe = {**TINY_CONFIG, "eval_strategy": "epoch", **saving, "generation_num_beams": 1}
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    output_dir = tmp_path / "predict"
    results = run([str(config), "--model_name_or_path", str(memorised_model_folder), "--do_train", "false",
                   "--do_eval", "false", "--test_file", str(test_file), "--output_dir", str(output_dir)])
    assert set(results) == {"test"}
    assert results["test"]["test_bleu"] == pytest.approx(100)
    assert (output_dir / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines() == [
        target for _, target in MEMORISED_PAIRS]
    assert json.loads((output_dir / "test_results.json").read_text())["test_bleu"] == pytest.approx(100)


def test_a_saved_model_that_returns_several_sequences_is_scored_on_one_translation_per_source(
        memorised_model_folder, tmp_path):
    """A model whose saved generation config has num_return_sequences 2 gave evaluation two rows per source, scored
    and written as the next sources' translations (test BLEU 20 for a model that has the test set by heart)."""
    folder = Path(shutil.copytree(memorised_model_folder, tmp_path / "model"))
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "num_beams": 2, "num_return_sequences": 2}))
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({"translation": {"en": source, "de": target}}) + "\n"
                                 for source, target in MEMORISED_PAIRS), encoding="utf-8")
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump({**TINY_CONFIG, "generation_num_beams": 2}), encoding="utf-8")
    results = run([str(config), "--model_name_or_path", str(folder), "--do_train", "false", "--do_eval", "false",
                   "--test_file", str(test_file), "--output_dir", str(tmp_path / "predict")])
    assert results["test"]["test_bleu"] == pytest.approx(100)
    assert (tmp_path / "predict" / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines() == [
        target for _, target in MEMORISED_PAIRS]


def test_bleu_is_tokenized_for_the_target_language_unless_bleu_tokenize_names_one(memorised_model_folder, tmp_path):
    """A zh target is scored with sacreBLEU's zh tokenization (its choice for zh), as the signature in the results
    says; an explicit bleu_tokenize wins."""
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({"translation": {"en": source, "zh": target}}) + "\n"
                                 for source, target in MEMORISED_PAIRS), encoding="utf-8")
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump({**TINY_CONFIG, "target_lang": "zh", "generation_num_beams": 1}),
                      encoding="utf-8")
    flags = ["--model_name_or_path", str(memorised_model_folder), "--do_train", "false", "--do_eval", "false",
             "--test_file", str(test_file)]
    chosen = run([str(config), *flags, "--output_dir", str(tmp_path / "chosen")])
    assert "|tok:zh|" in chosen["test"]["test_bleu_signature"]
    assert "|tok:zh|" in json.loads((tmp_path / "chosen" / "test_results.json").read_text())["test_bleu_signature"]
    named = run([str(config), *flags, "--output_dir", str(tmp_path / "named"), "--bleu_tokenize", "char"])
    assert "|tok:char|" in named["test"]["test_bleu_signature"]


def test_the_runs_bleu_tokenization_is_recorded_and_translate_scores_with_it(tmp_path, corpus, capsys):
    """A run trained with `--bleu_tokenize char` records it in run_record.json, and hf-relpos-translate --reference
    on its folder scores BLEU as the run did (the same signature) without being told."""
    from hf_relpos.tools.translate import main as translate_main

    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, do_eval=False, max_train_samples=40,
                          max_predict_samples=4, generation_num_beams=1)
    results = run([str(config), "--bleu_tokenize", "char"])
    assert json.loads((output_dir / RUN_RECORD_FILE).read_text())["bleu_tokenize"] == "char"
    pairs = [json.loads(line)["translation"] for line in corpus["test"].read_text(encoding="utf-8").splitlines()[:4]]
    for lang in ("en", "de"):
        (tmp_path / f"test.{lang}").write_text("".join(pair[lang] + "\n" for pair in pairs), encoding="utf-8")
    capsys.readouterr()
    translate_main([str(output_dir), str(tmp_path / "test.en"), "--output", str(tmp_path / "hyp.de"), "--no_progress",
                    "--reference", str(tmp_path / "test.de")])
    signature = re.search(r"^sacreBLEU \S+  \((.*)\)$", capsys.readouterr().out, re.MULTILINE).group(1)
    assert "|tok:char|" in signature and signature == results["test"]["test_bleu_signature"]


def test_translations_that_reach_their_length_cap_are_counted_in_one_warning_per_split(tmp_path, corpus, capsys):
    """A model trained one step repeats itself up to the source-relative cap: the evaluation and the prediction each
    say how many of their translations reached it, the count hf-relpos-translate --no_split_sentences gives for the
    same sources (so that a BLEU near 0 comes with its cause, as it does from the translate tool and the pipeline)."""
    from hf_relpos.tools.translate import main as translate_main

    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, max_eval_samples=6,
                          max_predict_samples=4, generation_num_beams=1)
    run([str(config)])
    printed = capsys.readouterr()
    counts = dict(re.findall(r"\b(eval|test): (\d+) of \d+ translations reached their length cap \(max_len_a x source "
                             r"tokens \+ max_len_b, at most max_new_tokens: generation_max_length_ratio, "
                             r"generation_max_length_offset\) and may be cut; a translation that repeats itself up to "
                             r"the cap is the model's loop", printed.out + printed.err))
    assert set(counts) == {"eval", "test"} and int(counts["test"]) > 0
    sources = [json.loads(line)["translation"]["en"] for line in corpus["test"].read_text(encoding="utf-8").splitlines()]
    (tmp_path / "test.en").write_text("".join(source + "\n" for source in sources[:4]), encoding="utf-8")
    translate_main([str(output_dir), str(tmp_path / "test.en"), "--output", str(tmp_path / "hyp.de"), "--no_progress",
                    "--no_split_sentences"])
    assert f"{counts['test']} translation(s) reached the length cap" in capsys.readouterr().err
    assert (tmp_path / "hyp.de").read_text(encoding="utf-8") == (output_dir / "test_hypotheses.txt").read_text(
        encoding="utf-8")


def test_evaluations_during_training_are_off_when_nothing_trains(memorised_model_folder, tmp_path, corpus):
    """eval_strategy (and load_best_model_at_end, which keeps the best of those evaluations) apply only to training;
    a training run keeps them."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", eval_strategy="epoch", save_strategy="epoch",
                          load_best_model_at_end=True, do_eval=False)
    training_args = parse_arguments([str(config), "--do_train", "false", "--model_name_or_path",
                                     str(memorised_model_folder)])[2]
    assert (training_args.eval_strategy, training_args.do_eval, training_args.load_best_model_at_end) == (
        "no", False, False)
    training_args = parse_arguments([str(config)])[2]
    assert (training_args.eval_strategy, training_args.do_eval, training_args.load_best_model_at_end) == (
        "epoch", True, True)
    own = TranslationTrainingArguments(output_dir=str(tmp_path / "own"), eval_strategy="epoch", save_strategy="epoch",
                                       load_best_model_at_end=True, use_cpu=True, report_to="none")
    assert (own.do_train, own.eval_strategy, own.load_best_model_at_end) == (False, "epoch", True)   # a script's own


def test_do_eval_false_with_evaluations_during_training_is_a_warning(tmp_path, corpus, caplog):
    """--do_eval false given to a run that evaluates during training does not apply (transformers turns do_eval on
    again), so it is one warning naming the flag that skips every evaluation; the recipe's own values pass silently."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", eval_strategy="epoch", do_eval=False)
    with caplog.at_level(logging.WARNING, logger="hf_relpos.translation.arguments"):
        assert parse_arguments([str(config)])[2].do_eval
        assert "--do_eval false" not in caplog.text
        assert parse_arguments([str(config), "--do_eval", "false"])[2].do_eval
    assert "--do_eval false does not apply" in caplog.text and "--eval_strategy no" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_relpos.translation.arguments"):
        assert not parse_arguments([str(config), "--do_eval", "false", "--eval_strategy", "no"])[2].do_eval
    assert "--do_eval false" not in caplog.text


def test_the_notes_of_parsing_the_arguments_are_in_the_runs_log(tmp_path, corpus, capsys, monkeypatch):
    """A note said while the arguments are parsed (a recipe's evaluations during training left out of a run that
    trains nothing) is in the run's log on stdout, although the run's logging is set up by what is parsed."""
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)   # as a fresh process starts
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", eval_strategy="epoch")
    with pytest.raises(ConfigError, match="model_name_or_path"):
        run([str(config), "--do_train", "false", "--model_name_or_path", str(tmp_path / "no_model")])
    assert "do_train is false: eval_strategy 'epoch' (evaluations during training) does not apply" in (
        capsys.readouterr().out)


@pytest.mark.parametrize(("local_rank", "said"), [("0", True), ("1", False)])
def test_a_warning_of_parsing_is_said_by_the_main_process_of_each_machine(tmp_path, corpus, caplog, monkeypatch,
                                                                           local_rank, said):
    """Every process of a launch parses the same arguments, before the run's logging is set up: a warning of parsing
    (here --do_eval false beside evaluations during training) comes from LOCAL_RANK 0 only, and the other ranks' own
    logging is as it was afterwards."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", eval_strategy="epoch")
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert arguments_module.local_main_process() is said
    monkeypatch.delenv("LOCAL_RANK")   # the training arguments would join the launch's process group
    monkeypatch.setattr(arguments_module, "local_main_process", lambda: said)
    with caplog.at_level(logging.WARNING):
        assert parse_arguments([str(config), "--do_eval", "false"])[2].do_eval
    assert ("--do_eval false does not apply" in caplog.text) is said
    assert logging.getLogger("hf_relpos.translation.arguments").isEnabledFor(logging.WARNING)


@pytest.mark.parametrize(("start", "token"), [("pad", "<pad>"), ("eos", "</s>")])
def test_the_decoder_start_token_can_be_marians_or_fairseqs(tmp_path, corpus, start, token):
    """decoder_start_token: the new model's config and saved generation config start decoding from that token, its
    labels are shifted in behind it, and a fine-tuned copy keeps it."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=2, do_eval=False, do_predict=False,
                          decoder_start_token=start)
    run([str(config)])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out")
    start_id = tokenizer.convert_tokens_to_ids(token)
    assert model.config.decoder_start_token_id == model.generation_config.decoder_start_token_id == start_id
    labels = torch.tensor([[5, 6, tokenizer.eos_token_id]])
    assert model.prepare_decoder_input_ids_from_labels(labels=labels)[0].tolist() == [start_id, 5, 6]
    assert model.generate(**tokenizer(["A dog."], return_tensors="pt"), max_new_tokens=3)[0, 0] == start_id
    tuned = write_config(tmp_path / "t.yaml", corpus, tmp_path / "tuned", max_steps=1, do_eval=False,
                         do_predict=False, model_name_or_path=str(tmp_path / "out"))
    run([str(tuned), "--decoder_start_token", start])   # the same start: accepted
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "tuned").generation_config.decoder_start_token_id == start_id
    with pytest.raises(ConfigError, match=rf"decoder_start_token 'bos': '.*out' was trained to start decoding from "
                                          rf"token id {start_id}, which a pretrained model keeps"):
        run([str(tuned), "--decoder_start_token", "bos", "--output_dir", str(tmp_path / "other")])
    assert not (tmp_path / "other").exists()


def test_an_unknown_decoder_start_token_is_one_error(tmp_path, corpus):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", decoder_start_token="sos")
    with pytest.raises(ConfigError, match=r"decoder_start_token must be one of \['bos', 'pad', 'eos'\], got 'sos'"):
        parse_arguments([str(config)])
    assert not (tmp_path / "out").exists()


def test_fine_tuning_starts_from_the_saved_weights_with_model_overrides(trained, corpus, tmp_path):
    model_dir, _ = trained
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "tuned", model_name_or_path=str(model_dir),
                          model={"dropout": 0.2}, max_steps=2, learning_rate=1.0e-7, warmup_steps=0,
                          do_eval=False, do_predict=False)
    run([str(config)])
    tuned = load_file(tmp_path / "tuned" / "model.safetensors")
    start = load_file(model_dir / "model.safetensors")
    assert tuned.keys() == start.keys()
    assert max((tuned[name] - start[name]).abs().max().item() for name in start) < 1e-4
    assert RelPosTransformerConfig.from_pretrained(tmp_path / "tuned").dropout == pytest.approx(0.2)


def test_the_model_is_logged_with_its_parameter_count_in_full(caplog):
    """The count in full, as the Trainer logs it (7,264), not rounded to millions, which read 0.0M for a small model."""
    model = RelPosTransformerForConditionalGeneration(RelPosTransformerConfig(
        position_scheme="shaw", vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32))
    with caplog.at_level(logging.INFO, logger="hf_relpos.translation.model_setup"):
        log_model(model, SimpleNamespace(model_name_or_path=None, model_config={}), SimpleNamespace(do_train=True))
    assert caplog.messages == ["RelPosTransformerForConditionalGeneration: shaw positions, 7,264 parameters"]


@pytest.mark.parametrize(("model_overrides", "logged_at_info", "warned"), [
    ({"dropout": 0.2, "attention_dropout": 0.1}, "attention_dropout=0.1, dropout=0.2", None),
    ({"dropout": 0.2, "activation_function": "gelu"}, "dropout=0.2", "activation_function='gelu'"),
    ({"scale_embedding": False}, None, "scale_embedding=False"),
])
def test_fine_tuning_overrides_that_change_what_the_weights_compute_are_a_warning(trained, corpus, tmp_path, caplog,
                                                                                  model_overrides, logged_at_info,
                                                                                  warned):
    """A recipe's dropout differing from the saved model's is the ordinary fine-tuning override (logged at INFO); an
    activation or an embedding scale differing from it makes the trained weights compute something else from the
    first step on, which a recipe written for another model sets without the user meaning to: a warning naming
    them, and them only (a dropout beside them stays at INFO, not among the fields said to change what the weights
    compute)."""
    model_dir, _ = trained
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "tuned", model_name_or_path=str(model_dir),
                          model=model_overrides, do_eval=False, do_predict=False)
    model_args, _, training_args = parse_arguments([str(config)])
    assert model_args.model_config == model_overrides
    with caplog.at_level(logging.INFO, logger="hf_relpos.translation.model_setup"):
        log_model(RelPosTransformerForConditionalGeneration.from_pretrained(model_dir), model_args, training_args)
    logged = {record.levelno: record.getMessage() for record in caplog.records
              if "overrides of the saved config" in record.getMessage()}
    prefix = f"model: overrides of the saved config of {model_dir}: "
    expected = {}
    if logged_at_info is not None:
        expected[logging.INFO] = prefix + logged_at_info
    if warned is not None:
        expected[logging.WARNING] = (prefix + warned
                                     + " (these change what its trained weights compute, from the first step on)")
    assert logged == expected


def test_fine_tuning_with_a_recipe_that_sets_another_schemes_field(corpus, tmp_path, caplog):
    """The Multi30k recipes set Shaw's max_relative_position (at its default) whatever their scheme; a model of
    another scheme saves no such field. Fine-tuning it with its recipe trains (the field is not passed on as an
    override), and evaluating it warns of nothing."""
    recipe_model = {**TINY_CONFIG["model"], "position_scheme": "directional", "max_relative_position": 16}
    base = write_config(tmp_path / "base.yaml", corpus, tmp_path / "base", model=recipe_model, max_steps=1,
                        do_eval=False, do_predict=False)
    run([str(base)])
    assert "max_relative_position" not in RelPosTransformerConfig.from_pretrained(tmp_path / "base").to_dict()
    tuned = write_config(tmp_path / "tuned.yaml", corpus, tmp_path / "tuned", model=recipe_model, max_steps=1,
                         do_eval=False, do_predict=False, model_name_or_path=str(tmp_path / "base"))
    model_args, _, _ = parse_arguments([str(tuned)])
    assert model_args.model_config == {}
    run([str(tuned)])
    assert load_file(tmp_path / "tuned" / "model.safetensors").keys() == load_file(
        tmp_path / "base" / "model.safetensors").keys()
    with caplog.at_level(logging.WARNING, logger="hf_relpos.translation.arguments"):
        parse_arguments([str(tuned), "--do_train", "false", "--do_predict", "true", "--output_dir", str(tmp_path / "eval")])
    assert not [record for record in caplog.records if record.name == "hf_relpos.translation.arguments"]


@pytest.mark.parametrize(
    ("model_overrides", "message"),
    [
        ({"layer_norm_position": "sandwich"}, r"model: layer_norm_position must be one of \['pre', 'post'\]"),
        ({"max_relative_position": -1}, r"model: max_relative_position must be an integer from 0 to 65535 \(.*\), "
                                         r"got -1"),
        ({"dropout": 1.5}, r"model: dropout must be a number in \[0, 1\), got 1\.5"),
    ],
)
def test_fine_tuning_overrides_are_validated_before_anything_is_written(trained, corpus, tmp_path, model_overrides,
                                                                        message):
    model_dir, _ = trained
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "tuned", model_name_or_path=str(model_dir),
                          model=model_overrides)
    with pytest.raises(ConfigError, match=message):
        run([str(config)])
    assert not (tmp_path / "tuned").exists()


def test_token_budget_smaller_than_a_pair_stops_before_anything_is_written(tmp_path, corpus):
    """Checked on the tokenized pairs before the prepared splits are saved into output_dir, as is the tokenizer."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_tokens_per_batch=16)
    with pytest.raises(ConfigError, match=r"max_tokens_per_batch=16 is smaller than \d+ training pair"):
        run([str(config)])
    assert not (tmp_path / "out").exists()


def test_a_kernel_that_cannot_run_on_the_runs_device_stops_before_anything_is_written(tmp_path, corpus, monkeypatch):
    """relpos_triton on a CPU run (without Triton's interpreter): one error before the tokenizer is trained, not a
    traceback from the first forward; a prepare_only run, which runs no model, goes on."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    with pytest.raises(PreflightError, match=r"^attn_implementation 'relpos_triton' runs on CUDA GPUs .* not on "
                                             r"'cpu': use 'sdpa' or 'eager' on this device$"):
        run([str(config), "--attn_implementation", "relpos_triton", "--use_cpu", "true"])
    assert not (tmp_path / "out").exists()
    assert run([str(config), "--attn_implementation", "relpos_triton", "--use_cpu", "true", "--prepare_only",
                "true"]) == {}


def test_training_on_flex_attention_on_a_cpu_stops_before_anything_is_written(tmp_path, corpus):
    """torch's FlexAttention has no backward on the CPU: training there on flex_attention is one error before the
    tokenizer is trained, not a NotImplementedError traceback from the first step after the data was prepared;
    evaluating on it there runs (forward only)."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    with pytest.raises(PreflightError, match=r"^attn_implementation 'flex_attention' has no backward on 'cpu' .*: "
                                             r"train with 'sdpa' or 'eager' on this device"):
        run([str(config), "--attn_implementation", "flex_attention", "--use_cpu", "true"])
    assert not (tmp_path / "out").exists()
    run([str(config), "--use_cpu", "true", "--do_predict", "false", "--save_strategy", "no"])
    scored = run([str(config), "--attn_implementation", "flex_attention", "--use_cpu", "true", "--do_train", "false",
                  "--model_name_or_path", str(tmp_path / "out"), "--output_dir", str(tmp_path / "scored")])
    assert "test_bleu" in scored["test"]


def test_fp16_on_a_cpu_run_stops_before_anything_is_written(tmp_path, corpus):
    """fp16 on the CPU (use_cpu, or no GPU): accelerate leaves float16 autocast off there without a word, so the run
    trained in float32 while its record and card said fp16: one error naming fp16 before the tokenizer is trained."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    with pytest.raises(PreflightError, match=r"^fp16 \(float16 autocast\) runs on GPUs, not on 'cpu'"):
        run([str(config), "--fp16", "true", "--use_cpu", "true"])
    assert not (tmp_path / "out").exists()


def test_zero_length_pool_factor_is_refused_before_anything_is_written(tmp_path, corpus):
    with pytest.raises(ConfigError, match=r"length_pool_factor must be null \(not set\) or an integer >= 1, got 0"):
        run([str(write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", length_pool_factor=0))])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size must be an integer >= 1, got 0"),
    ({"per_device_eval_batch_size": 0}, "per_device_eval_batch_size must be an integer >= 1, got 0"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be an integer >= 1, got 0"),
    ({"dataloader_num_workers": -1}, "dataloader_num_workers must be an integer >= 0, got -1"),
    ({"label_smoothing_factor": 1.1}, r"label_smoothing_factor must be a number in \[0, 1\), got 1.1"),
    ({"label_smoothing_factor": -0.1}, r"label_smoothing_factor must be a number in \[0, 1\), got -0.1"),
    ({"adam_beta2": 1.5}, r"adam_beta2 must be a number in \[0, 1\), got 1.5 \(optim 'adamw_torch'\)"),
    ({"max_steps": -1, "num_train_epochs": 0}, "num_train_epochs must be a positive number when max_steps is not set, "
                                               "got 0.0: the run would train no step"),
    ({"max_steps": 0}, r"max_steps must be an integer >= 1, or -1 \(not set: train num_train_epochs\), got 0 "
                       r"\(transformers' Trainer trains one step at 0\)"),
    ({"output_dir": ""}, "output_dir must name a folder, got ''"),
    ({"learning_rate": -0.001}, r"learning_rate must be a finite number >= 0 \(0: no update\), got -0.001"),
    ({"weight_decay": -0.1}, r"weight_decay must be a finite number >= 0 \(0: no decay\), got -0.1"),
    ({"max_grad_norm": "nan"}, r"max_grad_norm must be a finite number >= 0 \(0: no clipping\), got nan"),
    ({"adam_epsilon": 0}, r"adam_epsilon must be a finite number > 0 \(optim 'adamw_torch' divides by sqrt\(v\) \+ "
                          r"epsilon\), got 0.0"),
    ({"save_strategy": "steps", "save_steps": 0}, r"save_steps must be a number of steps >= 1, or a fraction of the "
                                                  r"training steps in \(0, 1\), with save_strategy steps, got 0.0 "
                                                  r"\(0 would never save: for no checkpoints use save_strategy no\)"),
    ({"eval_strategy": "steps", "eval_steps": -2}, "eval_steps must be a number of steps >= 1, or a fraction of the "
                                                   r"training steps in \(0, 1\), with eval_strategy steps, got -2.0$"),
    ({"save_total_limit": 0}, r"save_total_limit must be null \(not set\) or an integer >= 1, got 0"),
    ({"eval_accumulation_steps": 0}, r"eval_accumulation_steps must be null \(not set\) or an integer >= 1, got 0"),
    ({"save_strategy": "best"}, "save_strategy best saves a checkpoint whenever metric_for_best_model improves: set "
                                "metric_for_best_model, one of bleu, .*, loss, nll_loss$"),
    ({"save_strategy": "best", "metric_for_best_model": "loss"}, "save_strategy best saves a checkpoint when an "
     "evaluation during training improves metric_for_best_model, and eval_strategy no evaluates only after training"),
    ({"seed": -1}, r"seed must be an integer in \[0, 2\*\*32 - 1\], got -1"),
    ({"data_seed": 2**32}, r"data_seed must be an integer in \[0, 2\*\*32 - 1\], got 4294967296"),
    ({"generation_max_length": 1}, r"generation_max_length must be at least 2 \(it counts the decoder start token\), "
                                   "got 1"),
], ids=["batch_size", "eval_batch_size", "accumulation", "workers", "smoothing>1", "smoothing<0", "beta", "epochs",
        "max_steps", "output_dir", "learning_rate", "weight_decay", "grad_norm", "epsilon", "save_steps", "eval_steps",
        "save_total_limit", "eval_accumulation_steps", "save_best", "save_best_without_evaluations", "seed",
        "data_seed", "generation_max_length"])
def test_a_training_argument_transformers_leaves_unchecked_is_one_error_before_anything_is_written(
        tmp_path, corpus, monkeypatch, overrides, message):
    """Left to transformers these fail once training starts (a traceback, with output_dir already written: batch size
    0, gradient accumulation 0, negative workers, an Adam beta >= 1), or train silently wrong (label smoothing outside
    [0, 1) weighs the label's own log-likelihood by 1 - epsilon <= 0; a negative learning rate ascends the loss, a
    negative weight decay grows the weights, a negative max_grad_norm turns clipping off, a zero Adam epsilon divides
    by zero, save_steps 0 saves no checkpoint, a negative eval_steps evaluates only at the end, save_total_limit 0
    keeps every checkpoint; a seed outside numpy's range was a ValueError traceback; eval_accumulation_steps 0 was a
    ZeroDivisionError traceback at the first evaluation, after the model was saved; save_strategy best without
    metric_for_best_model was the Trainer's ValueError traceback once the tokenizer and data were saved; with eval_strategy
    no it saved no checkpoint, silently; max_steps 0 trained one step, its card naming num_train_epochs) or not at all
    (no epoch: a model saved untrained)."""
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    flags = [item for name, value in overrides.items() for item in (f"--{name}", str(value))]
    with pytest.raises(ConfigError, match=f"^{message}"):
        run([str(config), *flags, "--max_tokens_per_batch", "null"])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.yaml"]


@pytest.mark.parametrize(("optimizer", "overrides", "message"), [
    ("sgd", {"adam_epsilon": 0, "adam_beta1": 1.5, "adam_beta2": -1}, None),
    ("adafactor", {"adam_epsilon": 0, "adam_beta2": 2}, None),
    ("lion_32bit", {"adam_epsilon": 0}, None),
    ("lion_32bit", {"adam_beta1": 1.0}, r"adam_beta1 must be a number in \[0, 1\), got 1.0 \(optim 'lion_32bit'\)"),
    ("adamw_torch_fused", {"adam_epsilon": 0}, "adam_epsilon must be a finite number > 0 .optim 'adamw_torch_fused'"),
    ("ademamix", {"adam_epsilon": -1e-8}, "adam_epsilon must be a finite number > 0 .optim 'ademamix'"),
])
def test_the_adam_fields_are_checked_only_for_the_optimizers_that_read_them(tmp_path, corpus, optimizer, overrides,
                                                                           message):
    """adam_epsilon is Adam's m / (sqrt(v) + epsilon): 0 divides by zero there, while SGD, Adagrad, RMSprop and
    Adafactor never read it nor the betas (Lion reads the betas only), so a value left in a recipe switched to such
    an optimizer is no error."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", optim=optimizer, **overrides)
    if message is None:
        training_args = parse_arguments([str(config)])[2]
        assert [getattr(training_args, name) for name in overrides] == list(overrides.values())
    else:
        with pytest.raises(ConfigError, match=f"^{message}"):
            parse_arguments([str(config)])


@pytest.mark.parametrize(("name", "value", "shape", "flag_value"), [
    ("seed", [1], "a list", "2"), ("max_source_length", [48], "a list", "64"),
    ("generation_num_beams", {"beams": 4}, "a mapping", "2"), ("source_lang", ["en"], "a list", "en"),
    ("run_name", ["tiny"], "a list", "tiny"), ("bleu_tokenize", ["13a"], "a list", "13a"),
])
def test_a_list_or_mapping_in_the_yaml_for_a_single_value_is_one_error_naming_the_field(tmp_path, corpus, name, value,
                                                                                        shape, flag_value):
    """A YAML list or mapping passed on unconverted to a single-valued field crashed later: `seed: [1]` in the
    Trainer's seeding (a traceback), `max_source_length: [48]` as "'<' not supported between list and int",
    `output_dir: [out]` as "expected str, bytes or os.PathLike object, not list", naming no field; `source_lang: [en]`
    and `run_name: [tiny]` were taken. A flag of the field replaces the YAML's value, so then the run goes on."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", **{name: value})
    with pytest.raises(ConfigError, match=rf"^{name} must be a single value, got {shape} {re.escape(repr(value))}$"):
        parse_arguments([str(config)])
    arguments = parse_arguments([str(config), f"--{name}", flag_value])
    assert [str(getattr(group, name)) for group in arguments if hasattr(group, name)] == [flag_value]
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", report_to=["none"])
    assert parse_arguments([str(config)])[2].report_to == []   # a field that takes a list still does


def test_length_pool_factor_without_a_token_budget_is_ignored_with_a_warning(tmp_path, corpus, caplog):
    """A recipe's pools do not stop a sentence-batch override (`--max_tokens_per_batch null`)."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", length_pool_factor=4)
    with caplog.at_level("WARNING"):
        _, _, training_args = parse_arguments([str(config), "--max_tokens_per_batch", "null",
                                               "--per_device_train_batch_size", "8"])
    assert training_args.max_tokens_per_batch is None and training_args.length_pool_factor == 4
    assert "length_pool_factor=4 has no effect without max_tokens_per_batch" in caplog.text


def test_token_budget_batches_are_logged_with_what_the_trainers_batch_size_means(tmp_path, corpus, capsys):
    """Under max_tokens_per_batch the Trainer's 'Instantaneous batch size per device' and trainer_state.json's
    train_batch_size are per_device_train_batch_size, which the batches do not use: the run's log (stdout) says how
    many batches an epoch has and how many pairs each holds on average, and what that figure is."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_eval=False,
                          do_predict=False)
    run([str(config)])
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    noted = re.findall(r"INFO hf_relpos\.translation\.trainer: (max_tokens_per_batch=.*)", capsys.readouterr().out)
    assert len(noted) == 1 and re.fullmatch(
        r"max_tokens_per_batch=400: \d+ batches an epoch, \d+\.\d training pairs each on average; the Trainer's batch "
        r"sizes \(its log's 'Instantaneous batch size per device', trainer_state.json's train_batch_size\) show "
        rf"per_device_train_batch_size={state['train_batch_size']}, which these batches do not use", noted[0]), noted


@pytest.mark.parametrize("strategy", ["group_by_length", "sequential"])
def test_a_train_sampling_strategy_with_a_token_budget_is_refused(tmp_path, corpus, strategy):
    """The token-budget sampler makes the batches: a sampling strategy of the Trainer's would have no effect."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", train_sampling_strategy=strategy)
    with pytest.raises(ConfigError, match=rf"train_sampling_strategy='{strategy}' orders batches of "
                                          r"per_device_train_batch_size pairs, but max_tokens_per_batch=400"):
        run([str(config)])
    assert not (tmp_path / "out").exists()


def test_auto_find_batch_size_with_a_token_budget_is_one_error_before_training(tmp_path, corpus):
    """auto_find_batch_size retries with a smaller per_device_train_batch_size, which token-budget batches never
    read: refused before anything is written; with batches of pairs it is the Trainer's."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", auto_find_batch_size=True)
    with pytest.raises(ConfigError, match=r"auto_find_batch_size lowers per_device_train_batch_size after an "
                                          r"out-of-memory error, but max_tokens_per_batch=400 batches by tokens"):
        run([str(config)])
    assert not (tmp_path / "out").exists()
    _, _, training_args = parse_arguments([str(config), "--max_tokens_per_batch", "null"])
    assert training_args.auto_find_batch_size


@pytest.mark.parametrize(("setting", "value"), [("batch_eval_metrics", True), ("eval_do_concat_batches", False)])
def test_per_batch_evaluation_metrics_are_one_error_before_training(tmp_path, corpus, setting, value):
    """Corpus BLEU needs every translation of the split at once: metrics per batch, or predictions left as a list of
    batches, failed at the first evaluation after training (a TypeError, a ragged array); refused before anything is
    written, and allowed where only the loss is evaluated."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", **{setting: value})
    with pytest.raises(ConfigError, match=rf"{setting} must be {str(not value).lower()} with predict_with_generate: "
                                          r"corpus BLEU and chrF are scored over all the split's translations"):
        run([str(config)])
    assert not (tmp_path / "out").exists()
    _, _, training_args = parse_arguments([str(config), "--predict_with_generate", "false"])
    assert getattr(training_args, setting) == value


def test_a_train_sampling_strategy_applies_to_batches_of_pairs(tmp_path, corpus):
    """Without a token budget the strategy is the Trainer's, as in transformers."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", train_sampling_strategy="group_by_length")
    _, _, training_args = parse_arguments([str(config), "--max_tokens_per_batch", "null"])
    assert training_args.train_sampling_strategy == "group_by_length"


@pytest.mark.parametrize(("warmup_steps", "warned"), [(3, True), (2, False)])
def test_a_warmup_as_long_as_the_run_is_one_warning(tmp_path, corpus, capfd, warmup_steps, warned):
    """A run whose warm-up does not end before its last step says so once (its learning rate never reaches
    learning_rate); one whose warm-up ends says nothing."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=3, warmup_steps=warmup_steps,
                          do_eval=False, do_predict=False, save_strategy="no")
    run([str(config)])
    message = (f"warmup_steps {warmup_steps} is not below the run's 3 training steps: the learning rate never "
               "reaches learning_rate 0.001")
    printed = capfd.readouterr()
    assert (printed.out + printed.err).count(message) == warned


def test_corrupt_model_weights_are_one_clear_command_line_error(trained, corpus, tmp_path):
    model_dir, _ = trained
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in model_dir.iterdir():
        if item.is_file():
            (broken / item.name).write_bytes(item.read_bytes())
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "predict", model_name_or_path=str(broken),
                          do_train=False, do_eval=False)
    completed = subprocess.run([sys.executable, str(REPO / "train_translation.py"), str(config)],
                               capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr
    assert f"model_name_or_path {str(broken)!r}: its weights file is cut short or corrupt (" in completed.stderr


@pytest.mark.parametrize("field", ["model_name_or_path", "tokenizer_name"])
def test_a_folder_without_a_saved_tokenizer_is_one_error_line_naming_the_field(trained, corpus, tmp_path, field):
    """A model folder saved without its tokenizer (`model.save_pretrained` alone): it was transformers' five lines
    "Couldn't instantiate the backend tokenizer from one of: ... You need to have sentencepiece or tiktoken installed",
    advice that does not apply."""
    model_dir, _ = trained
    without = tmp_path / "model_only"
    without.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copyfile(model_dir / name, without / name)
    starts_from = {"model_name_or_path": str(without), "do_train": False} if field == "model_name_or_path" else {
        "model_name_or_path": str(model_dir), "tokenizer_name": str(without), "do_train": False}
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", **starts_from)
    completed = subprocess.run([sys.executable, str(REPO / "train_translation.py"), str(config)],
                               capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert completed.stderr.splitlines()[-1:] == [
        f"train_translation.py: error: {field} {str(without)!r}: cannot load its tokenizer: the folder holds no saved "
        "tokenizer (tokenizer.json or tokenizer_config.json): save one there with tokenizer.save_pretrained"]
    assert "sentencepiece" not in completed.stderr and not (tmp_path / "out").exists()


def test_plain_batch_size_and_a_rerun_needs_resume_or_overwrite(tmp_path, corpus):
    """Without a token budget the Trainer batches by per_device_train_batch_size. A second run into the same
    output_dir is refused (it would silently train from step 0 over the model); with --overwrite_output_dir true it is
    a fresh run: the tokenizer is trained again (here with the new vocabulary size) and the old checkpoints go."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_tokens_per_batch=None,
                          per_device_train_batch_size=4, max_steps=2, do_eval=False, do_predict=False,
                          tokenizer_vocab_size=506, save_strategy="steps", save_steps=1)
    run([str(config)])
    assert {path.name for path in output_dir.glob("checkpoint-*")} == {"checkpoint-1", "checkpoint-2"}
    before = {path.name: path.stat().st_mtime_ns for path in output_dir.iterdir()}
    with pytest.raises(OutputDirError) as refused:
        run([str(config), "--tokenizer_vocab_size", "536"])
    message = str(refused.value)
    assert f"output_dir {str(output_dir)!r} already holds a trained model or checkpoints" in message
    assert "continue from its newest checkpoint with --resume_from_checkpoint last" in message
    assert "train from scratch with --overwrite_output_dir true" in message
    assert {path.name: path.stat().st_mtime_ns for path in output_dir.iterdir()} == before

    run([str(config), "--tokenizer_vocab_size", "536", "--overwrite_output_dir", "true", "--save_strategy", "no"])
    assert len(AutoTokenizer.from_pretrained(output_dir)) == 536
    assert RelPosTransformerConfig.from_pretrained(output_dir).vocab_size == 536
    assert not list(output_dir.glob("checkpoint-*"))


# A position scheme of the user's own, in a module of its own (what --import_modules imports).
HOW_SCHEMES_ARE_KNOWN = ("A scheme registered outside hf_relpos (@register_position_scheme('cli_headbias') in your own "
                         "code) is known only in a process that has imported the module that registers it: import "
                         "that module before the config or model is built or loaded (from_pretrained, pipeline)")
USER_SCHEME_MODULE = """
import torch
from hf_relpos import AttentionTerms, PositionScheme, integer_field, register_position_scheme


@register_position_scheme("cli_headbias")
class CliHeadBias(PositionScheme):
    config_fields = (integer_field("cli_headbias_k", 2, "clipping distance", minimum=0),)

    def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.table = torch.nn.Parameter(torch.zeros(num_heads, 2 * config.cli_headbias_k + 1))

    def terms(self, layer_idx, query, key, context):
        i, j = context.query_and_key_positions()
        k = self.config.cli_headbias_k
        return AttentionTerms(score_bias=self.table[:, (j[None, :] - i[:, None]).clamp(-k, k) + k])
"""


@pytest.fixture
def user_scheme_module(tmp_path, monkeypatch):
    """tmp_path/cli_schemes.py registering the scheme "cli_headbias", tmp_path the current directory; the registry,
    sys.path and sys.modules as they were after the test."""
    (tmp_path / "cli_schemes.py").write_text(USER_SCHEME_MODULE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = dict(hf_relpos.POSITION_SCHEMES)
    yield "cli_schemes"
    sys.modules.pop("cli_schemes", None)
    hf_relpos.POSITION_SCHEMES.clear()
    hf_relpos.POSITION_SCHEMES.update(before)


def test_a_scheme_of_ones_own_trains_from_the_command_line_with_import_modules(user_scheme_module, tmp_path, corpus,
                                                                               capsys):
    """`--import_modules MODULE` imports the module that registers the scheme before the model fields are read: its
    field is a flag, the run trains and saves, and the card's and run record's command carries the flag. In a
    process that has not imported it, translating or fine-tuning the saved model without the flag is one error that
    names the flag."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=2, do_eval=False, do_predict=False)
    run([str(config), "--import_modules", user_scheme_module, "--model.position_scheme", "cli_headbias",
         "--model.cli_headbias_k", "3"])
    output_dir = tmp_path / "out"
    assert AutoModelForSeq2SeqLM.from_pretrained(output_dir).config.cli_headbias_k == 3
    command = f"{config} --import_modules cli_schemes --model.position_scheme cli_headbias --model.cli_headbias_k 3"
    record = json.loads((output_dir / RUN_RECORD_FILE).read_text())
    assert record["trained_as"] == command
    card = (output_dir / "README.md").read_text(encoding="utf-8")   # the recipe's absolute path as the card shows it
    assert shown_command(command, record["working_directory"]) in card and str(tmp_path) not in card
    del hf_relpos.POSITION_SCHEMES["cli_headbias"], sys.modules["cli_schemes"]   # a new process, as translating is
    (tmp_path / "src.txt").write_text("a small test\n", encoding="utf-8")
    hint = "; with this command, name that module with --import_modules MODULE (a module or a .py file)"
    with pytest.raises(SystemExit):
        translate_main([str(output_dir), "src.txt", "--output", "hyp.txt"])
    assert capsys.readouterr().err.endswith(f"got 'cli_headbias'. {HOW_SCHEMES_ARE_KNOWN}{hint}\n")
    with pytest.raises(ConfigError) as refused:
        parse_arguments([str(config), "--model_name_or_path", str(output_dir), "--output_dir", str(tmp_path / "ft")])
    assert str(refused.value).endswith(hint)
    translate_main([str(output_dir), "src.txt", "--output", "hyp.txt", "--import_modules", "cli_schemes.py"])
    assert len((tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines()) == 1


def test_a_field_of_ones_own_scheme_without_import_modules_is_one_error_naming_the_flag(user_scheme_module, tmp_path,
                                                                                       corpus):
    """The field of a scheme of one's own given without --import_modules (as a flag or a recipe's model key) is an
    unknown key, and the error says how a scheme's fields become known, where it named --help alone; with the module
    imported, an unknown key is a typo and the error says nothing of it."""
    hint = ("; the fields of a position scheme registered in your own code are known once --import_modules MODULE (a "
            "recipe's 'import_modules:') names the module that registers it")
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    with pytest.raises(ConfigError, match="^unknown key\\(s\\): --model.cli_headbias_k;") as refused:
        parse_arguments([str(config), "--model.position_scheme", "cli_headbias", "--model.cli_headbias_k", "3"])
    assert str(refused.value).endswith(hint)
    recipe = write_config(tmp_path / "r.yaml", corpus, tmp_path / "out", model={"cli_headbias_k": 3})
    with pytest.raises(ConfigError, match="^unknown key\\(s\\): model.cli_headbias_k") as refused:
        parse_arguments([str(recipe)])
    assert str(refused.value).endswith(hint)
    with pytest.raises(ConfigError, match="^unknown key\\(s\\): --model.cli_headbias_kk") as refused:
        parse_arguments([str(config), "--import_modules", user_scheme_module, "--model.cli_headbias_kk", "3"])
    assert "import_modules" not in str(refused.value)


@pytest.mark.parametrize("module", ["no_such_module", "no_such_file.py"])
def test_a_missing_import_modules_module_is_one_error_naming_the_flag(module, tmp_path, corpus):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    with pytest.raises(ConfigError, match=f"^import_modules: no (module named|such file) '{module}'"):
        run([str(config), "--import_modules", module])
    assert not (tmp_path / "out").exists()


# --- checkpoints ---------------------------------------------------------------------------------------------------


def tiny_model(seed: int, **config_fields: Any) -> RelPosTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    config = RelPosTransformerConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, **config_fields)
    return RelPosTransformerForConditionalGeneration(config)


def save_checkpoint(model: RelPosTransformerForConditionalGeneration, folder: Path) -> None:
    """`model` saved as the Trainer's checkpoint `folder` (checkpoint-<step>): weights, then its state, last."""
    model.save_pretrained(folder)
    TrainerState(global_step=int(folder.name.rpartition("-")[2])).save_to_json(str(folder / "trainer_state.json"))


# what a Trainer checkpoint holds besides the model's files (trainer_state.json aside): none belongs in a model folder
TRAINER_ONLY_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth", "rng_state_1.pth",
                      "training_args.bin")


def test_average_checkpoints_equals_the_hand_computed_mean(tmp_path):
    """A finished run's folder: the checkpoints, and the final model at the top level (which is not averaged)."""
    run_dir = tmp_path / "run"
    models = [tiny_model(seed) for seed in range(4)]
    for step, model in zip((100, 200, 300, 1000), models, strict=True):
        save_checkpoint(model, run_dir / f"checkpoint-{step}")
        for trainer_file in TRAINER_ONLY_FILES:
            (run_dir / f"checkpoint-{step}" / trainer_file).write_bytes(b"not copied")
    tiny_model(99).save_pretrained(run_dir)
    averaged_dir = average_checkpoints(run_dir, last_n=3, output_dir=tmp_path / "averaged")
    averaged = RelPosTransformerForConditionalGeneration.from_pretrained(averaged_dir)
    newest = [dict(model.named_parameters()) for model in models[1:]]
    for name, parameter in averaged.named_parameters():
        expected = (newest[0][name] + newest[1][name] + newest[2][name]) / 3
        torch.testing.assert_close(parameter, expected, rtol=0, atol=1e-6)
    assert not any((averaged_dir / trainer_file).exists() for trainer_file in (*TRAINER_ONLY_FILES, "trainer_state.json"))
    provenance = json.loads((averaged_dir / "averaged_checkpoints.json").read_text())
    assert [Path(path).name for path in provenance["checkpoints"]] == ["checkpoint-200", "checkpoint-300",
                                                                        "checkpoint-1000"]
    assert all(Path(path).is_absolute() for path in provenance["checkpoints"])   # readable from any directory
    assert "\n# averaged\n" in (averaged_dir / "README.md").read_text(encoding="utf-8")   # the folder's name
    with pytest.raises(ValueError, match="output_dir .* exists and is not an empty folder"):
        average_checkpoints(run_dir, last_n=2, output_dir=averaged_dir)
    with pytest.raises(ValueError, match="last_n=5 but only 4") as raised:
        average_checkpoints(run_dir, last_n=5, output_dir=tmp_path / "other")
    assert "average at most last_n=4, or train with more checkpoints kept (save_strategy steps" in str(raised.value)


def test_a_checkpoint_saved_before_a_config_field_existed_averages_with_one_at_its_default(tmp_path):
    """A config field added after a checkpoint was saved loads at its default: that checkpoint has the same config
    as a newer one saved with the default value, and the two average."""
    run_dir = tmp_path / "run"
    for step, seed in ((100, 0), (200, 1)):
        save_checkpoint(tiny_model(seed), run_dir / f"checkpoint-{step}")
    older = run_dir / "checkpoint-100" / "config.json"
    config = json.loads(older.read_text())
    assert config.pop("absolute_positions_scale") == RelPosTransformerConfig().absolute_positions_scale
    older.write_text(json.dumps(config))
    averaged_dir = average_checkpoints(run_dir, last_n=2, output_dir=tmp_path / "averaged")
    assert RelPosTransformerConfig.from_pretrained(averaged_dir).absolute_positions_scale == (
        RelPosTransformerConfig().absolute_positions_scale)


def test_checkpoints_that_differ_in_use_cache_alone_average_with_the_newests_config(tmp_path):
    """transformers' Trainer saved `use_cache: false` in checkpoints before `TranslationTrainer` kept the model's
    value: a run resumed across that change averages all its checkpoints, the result taking the newest's value."""
    run_dir = tmp_path / "run"
    for step, seed, use_cache in ((100, 0, False), (200, 1, True)):
        save_checkpoint(tiny_model(seed, use_cache=use_cache), run_dir / f"checkpoint-{step}")
    averaged_dir = average_checkpoints(run_dir, last_n=2, output_dir=tmp_path / "averaged")
    assert len(json.loads((averaged_dir / "averaged_checkpoints.json").read_text())["checkpoints"]) == 2
    assert RelPosTransformerConfig.from_pretrained(averaged_dir).use_cache is True


def test_a_runs_final_model_averages_with_its_checkpoints_though_only_it_declares_the_pipeline(tmp_path):
    """A run's final model is saved with the translation pipeline declared in its config.json (`custom_pipelines`),
    its checkpoints without: listing checkpoints and the final model was refused as checkpoints of different
    configs, though the declaration changes nothing the weights compute. They average, in either order, and the
    result declares the pipeline."""
    from hf_relpos.publish.hub import add_translation_pipeline

    run_dir = tmp_path / "run"
    save_checkpoint(tiny_model(0), run_dir / "checkpoint-100")
    tiny_model(1).save_pretrained(run_dir)
    add_translation_pipeline(run_dir)
    for order, folders in enumerate(([run_dir / "checkpoint-100", run_dir], [run_dir, run_dir / "checkpoint-100"])):
        averaged_dir = average_checkpoints(folders, None, tmp_path / f"averaged{order}")
        assert "custom_pipelines" in json.loads((averaged_dir / "config.json").read_text())


def test_folders_listed_are_averaged_themselves_even_when_they_hold_checkpoints(tmp_path):
    """Two training output folders listed (the final models of two runs) average their own weights, not the
    checkpoint-<step> folders inside the first."""
    runs = []
    for seed in (0, 1):
        run_dir = tmp_path / f"run{seed}"
        tiny_model(seed).save_pretrained(run_dir)
        save_checkpoint(tiny_model(10 + seed), run_dir / "checkpoint-100")
        runs.append(run_dir)
    averaged = load_file(average_checkpoints(runs, None, tmp_path / "averaged") / "model.safetensors")
    first, second = (load_file(run_dir / "model.safetensors") for run_dir in runs)
    assert averaged.keys() == first.keys()
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (first[name] + second[name]) / 2, rtol=0, atol=1e-6)


def test_models_saved_with_different_tokenizers_are_refused_not_averaged(tmp_path, capsys):
    """The final models of two runs whose tokenizers were trained on other texts share a config and tensor shapes,
    but not their token ids: one error naming both folders and the tokenizer file, nothing written. The same
    tokenizer in both averages (a formatting of tokenizer.json's merges by another release counts as the same)."""
    from hf_relpos.translation.tokenization import train_joint_tokenizer

    texts = ["a small dog", "ein kleiner Hund", "a small cat", "eine kleine Katze"] * 20
    tokenizers = [train_joint_tokenizer(texts, vocab_size=300), train_joint_tokenizer([t.upper() for t in texts], 300)]
    folders = []
    for seed, tokenizer in enumerate(tokenizers):
        tiny_model(seed).save_pretrained(tmp_path / f"run{seed}")
        tokenizer.save_pretrained(tmp_path / f"run{seed}")
        folders.append(str(tmp_path / f"run{seed}"))
    with pytest.raises(SystemExit):
        average_main([*folders, "--output_dir", str(tmp_path / "avg")])
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hf-relpos-average: error: {folders[0]!r} and {folders[1]!r} hold different tokenizers (tokenizer.json): "
        "weights trained for other token ids do not average into a model of either; average checkpoints of one "
        "tokenizer")
    assert not (tmp_path / "avg").exists()
    tokenizers[0].save_pretrained(tmp_path / "run1")
    saved = json.loads((tmp_path / "run1" / "tokenizer.json").read_text(encoding="utf-8"))
    saved["model"]["merges"] = [" ".join(merge) for merge in saved["model"]["merges"]]   # the older format
    (tmp_path / "run1" / "tokenizer.json").write_text(json.dumps(saved), encoding="utf-8")
    average_main([*folders, "--output_dir", str(tmp_path / "avg")])
    assert (tmp_path / "avg" / "model.safetensors").is_file()


def test_models_whose_tokenizers_differ_in_an_added_tag_are_refused_not_averaged(tmp_path, capsys):
    """Two runs of one trained tokenizer to which other language tags were added (">>deu<<" is id 300 in one and
    ">>fra<<" in the other) share vocabulary and merges but not the tags' ids: refused as different tokenizers.
    The same tags added alike average."""
    from hf_relpos.translation.tokenization import train_joint_tokenizer

    texts = ["a small dog", "ein kleiner Hund", "a small cat", "eine kleine Katze"] * 20
    folders = []
    for seed, tags in enumerate(([">>deu<<", ">>fra<<"], [">>fra<<", ">>deu<<"])):
        tokenizer = train_joint_tokenizer(texts, vocab_size=300)
        tokenizer.add_special_tokens({"additional_special_tokens": tags})
        tiny_model(seed).save_pretrained(tmp_path / f"run{seed}")
        tokenizer.save_pretrained(tmp_path / f"run{seed}")
        folders.append(str(tmp_path / f"run{seed}"))
    with pytest.raises(SystemExit):
        average_main([*folders, "--output_dir", str(tmp_path / "avg")])
    assert "hold different tokenizers (tokenizer.json)" in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "avg").exists()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(Path(folders[0]) / name, Path(folders[1]) / name)
    average_main([*folders, "--output_dir", str(tmp_path / "avg")])
    assert (tmp_path / "avg" / "model.safetensors").is_file()


def test_average_checkpoints_command_line_takes_explicit_folders(tmp_path, capsys):
    """Folders listed are all averaged unless --last_n picks the newest of them."""
    folders = []
    for seed in range(3):
        tiny_model(seed).save_pretrained(tmp_path / f"c{seed}")
        folders.append(str(tmp_path / f"c{seed}"))
    average_main([*folders[1:], "--output_dir", str(tmp_path / "avg")])
    assert capsys.readouterr().out == f"averaged 2 checkpoint(s) into {tmp_path / 'avg'}\n"
    average_main([*folders, "--last_n", "2", "--output_dir", str(tmp_path / "newest")])
    assert load_file(tmp_path / "newest" / "model.safetensors").keys() == load_file(
        tmp_path / "avg" / "model.safetensors").keys()
    for name, tensor in load_file(tmp_path / "newest" / "model.safetensors").items():
        torch.testing.assert_close(tensor, load_file(tmp_path / "avg" / "model.safetensors")[name], rtol=0, atol=0)
    first, second = (load_file(Path(folder) / "model.safetensors") for folder in folders[1:])
    averaged = load_file(tmp_path / "avg" / "model.safetensors")
    assert averaged.keys() == first.keys()
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (first[name] + second[name]) / 2, rtol=0, atol=1e-6)
    # the checkpoints ship remote code, so the averaged folder also ships the translation pipeline of a trained one
    assert (tmp_path / "avg" / "modeling_relpos.py").is_file() and (tmp_path / "avg" / "pipeline_relpos.py").is_file()
    config = json.loads((tmp_path / "avg" / "config.json").read_text(encoding="utf-8"))
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_relpos.TranslationPipeline"

def test_average_output_dir_through_a_link_dot_or_dotdot_is_the_folder_meant(tmp_path, monkeypatch, capsys):
    """An empty output folder named through a link (kept as the link, its folder filled), as `.` (the working folder)
    or with `..` over a folder not there yet: each once ended in `[Errno 20] Not a directory`, `[Errno 22] Invalid
    argument` or `[Errno 39] Directory not empty` after the averaging, the last leaving that folder behind."""
    for seed in range(2):
        tiny_model(seed).save_pretrained(tmp_path / f"c{seed}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to("empty")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    for output_dir in (tmp_path / "link", ".", tmp_path / "new" / "sub" / ".."):
        average_main([str(tmp_path / "c0"), str(tmp_path / "c1"), "--output_dir", str(output_dir)])
        assert capsys.readouterr().out == f"averaged 2 checkpoint(s) into {output_dir}\n"
    assert (tmp_path / "link").is_symlink() and (tmp_path / "link").readlink() == Path("empty")
    for folder in ("empty", "here", "new"):
        assert (tmp_path / folder / "model.safetensors").is_file()
    assert not (tmp_path / "new" / "sub").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c0", "c1", "empty", "here", "link", "new"]


@pytest.mark.parametrize("output", ["file", "file/averaged", "read_only/averaged"])
def test_average_checkpoints_to_an_output_dir_it_cannot_create_is_one_error_naming_it(output, tmp_path, capsys,
                                                                                      monkeypatch):
    for seed in range(2):
        tiny_model(seed).save_pretrained(tmp_path / f"c{seed}")
    (tmp_path / "file").write_text("mine")
    (tmp_path / "read_only").mkdir()
    make_unwritable(monkeypatch, tmp_path / "read_only")
    with pytest.raises(SystemExit) as exited:
        average_main([str(tmp_path / "c0"), str(tmp_path / "c1"), "--output_dir", str(tmp_path / output)])
    assert exited.value.code == 2
    reason = "is not writable: cannot create files in" if output.startswith("read_only") else "is a file, not a folder"
    error = capsys.readouterr().err
    assert f"error: output_dir '{tmp_path / output}'" in error and reason in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c0", "c1", "file", "read_only"]
    assert (tmp_path / "file").read_text() == "mine" and not any((tmp_path / "read_only").iterdir())


def test_averaging_into_a_folder_named_as_a_checkpoint_of_the_run_is_one_error(tmp_path, capsys):
    """RUN/checkpoint-9 beside the run's checkpoints: the Trainer's rotation (save_total_limit) deleted it as an old
    checkpoint, a resumed run reaching step 9 wrote into it, and the next average of RUN took it for a checkpoint.
    Elsewhere the name is free."""
    run_dir = tmp_path / "run"
    for step in (1, 2):
        save_checkpoint(tiny_model(step), run_dir / f"checkpoint-{step}")
    with pytest.raises(SystemExit) as exited:
        average_main([str(run_dir), "--last_n", "2", "--output_dir", str(run_dir / "checkpoint-9")])
    assert exited.value.code == 2
    assert (f"error: output_dir '{run_dir / 'checkpoint-9'}' is named as a checkpoint of the training run in "
            f"'{run_dir}'") in capsys.readouterr().err
    assert sorted(path.name for path in run_dir.iterdir()) == ["checkpoint-1", "checkpoint-2"]
    average_main([str(run_dir), "--last_n", "2", "--output_dir", str(run_dir / "averaged")])
    average_main([str(run_dir), "--last_n", "2", "--output_dir", str(tmp_path / "checkpoint-9")])
    assert (tmp_path / "checkpoint-9" / "model.safetensors").is_file()

def test_a_checkpoint_listed_twice_is_one_error_not_averaged_double(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for seed in range(2):
        tiny_model(seed).save_pretrained(tmp_path / f"c{seed}")
    with pytest.raises(SystemExit) as exited:
        average_main(["c0", "c1", str(tmp_path / "c0"), "--output_dir", "avg"])
    assert exited.value.code == 2
    assert (f"error: '{tmp_path / 'c0'}' is listed twice (also as 'c0'): the average would weigh it double; list each "
            "checkpoint once") in capsys.readouterr().err
    assert not (tmp_path / "avg").exists()


def test_average_checkpoints_of_a_training_folder_takes_the_newest_5_unless_told(tmp_path, capsys):
    run_dir = tmp_path / "run"
    for step in range(1, 7):
        save_checkpoint(tiny_model(step), run_dir / f"checkpoint-{step}")
    average_main([str(run_dir), "--output_dir", str(tmp_path / "avg")])
    provenance = json.loads((tmp_path / "avg" / "averaged_checkpoints.json").read_text())
    assert [Path(path).name for path in provenance["checkpoints"]] == [f"checkpoint-{step}" for step in range(2, 7)]
    assert provenance["last_n"] == 5
    for step in range(1, 3):
        save_checkpoint(tiny_model(step), tmp_path / "short" / f"checkpoint-{step}")
    with pytest.raises(ValueError, match=r"last_n=5 \(the default for a training output folder\) but only 2"):
        average_checkpoints(tmp_path / "short", None, tmp_path / "other")
    shutil.rmtree(tmp_path / "short" / "checkpoint-2")   # one checkpoint left: keeping more is the only way out
    with pytest.raises(ValueError, match=r"but only 1 checkpoint\(s\): .*; train with more checkpoints kept"):
        average_checkpoints(tmp_path / "short", None, tmp_path / "other")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        average_main(["--help"])
    assert "(default: 5 of a training output folder's, all of the checkpoint folders listed)" in " ".join(
        capsys.readouterr().out.split())
    tiny_model(1).save_pretrained(tmp_path / "final")   # a folder of one model, no checkpoints: nothing to average
    with pytest.raises(ValueError, match=r"'.*final' is one model without checkpoint-<step> folders: nothing to "
                                         r"average"):
        average_checkpoints(tmp_path / "final", None, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
    for last_n in (["--last_n", "1"], []):   # --last_n 1 alike: a copy of the one model is no average
        with pytest.raises(SystemExit, match="2"):
            average_main([str(tmp_path / "final"), *last_n, "--output_dir", str(tmp_path / "copy")])
        assert "final' is one model without checkpoint-<step> folders: nothing to average" in capsys.readouterr().err
        assert not (tmp_path / "copy").exists()
    with pytest.raises(ValueError, match=r"'.*final' is one model without checkpoint-<step> folders"):
        average_checkpoints(tmp_path / "final", 1, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_averaging_a_training_folder_skips_the_checkpoints_the_trainer_did_not_finish(tmp_path, capsys, caplog):
    """As the app's `average_checkpoints`: the newest complete checkpoints of a training folder (a kill while the
    Trainer wrote checkpoint-4 left it without its trainer_state.json; checkpoint-3's state names another step), with
    a warning naming those skipped; none complete is one error; listed folders are averaged as given."""
    run_dir = tmp_path / "run"
    for step in (1, 2, 3, 4):
        save_checkpoint(tiny_model(step), run_dir / f"checkpoint-{step}")
    (run_dir / "checkpoint-4" / "trainer_state.json").unlink()
    TrainerState(global_step=2).save_to_json(str(run_dir / "checkpoint-3" / "trainer_state.json"))
    with caplog.at_level(logging.WARNING):
        average_main([str(run_dir), "--last_n", "2", "--output_dir", str(tmp_path / "avg")])
    provenance = json.loads((tmp_path / "avg" / "averaged_checkpoints.json").read_text())
    assert [Path(path).name for path in provenance["checkpoints"]] == ["checkpoint-1", "checkpoint-2"]
    assert "skipping checkpoint-3, checkpoint-4 (no trainer_state.json for the folder's step" in caplog.text
    assert complete_checkpoints(run_dir) == [Path(path) for path in provenance["checkpoints"]]   # the app's choice
    average_main([str(run_dir / "checkpoint-3"), str(run_dir / "checkpoint-4"), "--output_dir", str(tmp_path / "as")])
    assert [Path(path).name for path in json.loads((tmp_path / "as" / "averaged_checkpoints.json").read_text())[
        "checkpoints"]] == ["checkpoint-3", "checkpoint-4"]
    for step in (1, 2):
        (run_dir / f"checkpoint-{step}" / "trainer_state.json").unlink()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        average_main([str(run_dir), "--output_dir", str(tmp_path / "none")])
    assert "no complete checkpoint-<step> folder (checkpoint-1, checkpoint-2, checkpoint-3, checkpoint-4: no " \
           "trainer_state.json" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_averaging_a_checkpoint_whose_weights_were_cut_short_is_one_error_naming_it(tmp_path, capsys):
    """A checkpoint whose model.safetensors a kill cut short (safetensors before 0.8 writes it in place) is refused
    with one line naming the checkpoint, not a traceback, and nothing is written."""
    run_dir = tmp_path / "run"
    for step in (1, 2):
        save_checkpoint(tiny_model(step), run_dir / f"checkpoint-{step}")
    weights = run_dir / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(SystemExit) as exit_info:
        average_main([str(run_dir), "--last_n", "2", "--output_dir", str(tmp_path / "avg")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"hf-relpos-average: error: {str(weights.parent)!r}: its weights file model.safetensors is "
                            "cut short or corrupt (")
    assert "Traceback" not in error
    assert not (tmp_path / "avg").exists()


def test_a_checkpoint_shard_cut_short_is_one_error_naming_the_shard(tmp_path):
    """A checkpoint saved in shards, one of them cut short: the error names that shard, not only the checkpoint."""
    from hf_relpos.translation.checkpoints import load_weights

    checkpoint = tmp_path / "checkpoint-1"
    tiny_model(1).save_pretrained(checkpoint, max_shard_size="20KB")
    shards = sorted(checkpoint.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1
    shards[-1].write_bytes(shards[-1].read_bytes()[: shards[-1].stat().st_size // 2])
    with pytest.raises(ValueError, match=f"^{re.escape(repr(str(checkpoint)))}: its weights file "
                                         f"{re.escape(shards[-1].name)} is cut short or corrupt \\("):
        load_weights(checkpoint)


@pytest.mark.parametrize(("schedule", "goal"), [({"max_steps": 4}, "max_steps=4"),
                                              ({"max_steps": -1, "num_train_epochs": 1}, "num_train_epochs=1")])
def test_resuming_a_run_that_trained_all_its_steps_is_refused(tmp_path, corpus, schedule, goal):
    """The Trainer would train one step past the end and replace the final model: one error, nothing changed."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", save_strategy="steps", save_steps=2,
                          do_eval=False, do_predict=False, max_train_samples=40, **schedule)
    run([str(config)])
    final = (tmp_path / "out" / "model.safetensors").read_bytes()
    with pytest.raises(ConfigError, match=rf"resume_from_checkpoint: '.*checkpoint-\d+' has already trained {goal} "
                                          rf"\(step \d+, epoch [\d.]+\): raise {goal.split('=')[0]} to train on"):
        run([str(config), "--resume_from_checkpoint", "last"])
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == final


@pytest.mark.parametrize(("save_steps", "refusal"), [
    (1, r"resume_from_checkpoint: '.*checkpoint-3' has already reached early_stopping_patience=2 \(2 evaluations "
        r"without improvement; step 3, epoch [\d.]+\): raise early_stopping_patience to train on"),
    (2, r"resume_from_checkpoint: the run in .* went on from '.*checkpoint-2' \(step 2\) and stopped at step 3, where "
        r"early_stopping_patience=2 was reached \(2 evaluations without improvement\); resumed, it would train those "
        r"steps again"),
], ids=["checkpoint-at-the-stop", "checkpoint-before-the-stop"])
def test_resuming_a_run_that_early_stopping_ended_is_refused(tmp_path, corpus, save_steps, refusal):
    """Stopped by early stopping at step 3 of 6: resumed from a checkpoint at that step, the same command would train
    on to max_steps; from the checkpoint before it (step 2), it would train step 3 again and stop there. Either
    replaces the final model and card: one error, nothing changed. With more patience it trains on; with another
    threshold (which may stop elsewhere) the earlier checkpoint resumes."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, early_stopping_patience=2,
                          early_stopping_threshold=100, eval_strategy="steps", eval_steps=1, save_strategy="steps",
                          save_steps=save_steps, do_predict=False)
    run([str(config)])
    assert TrainerState.load_from_json(str(output_dir / "trainer_state.json")).global_step == 3
    last = f"checkpoint-{3 // save_steps * save_steps}"
    assert max(output_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1])).name == last
    written = {path.name: path.read_bytes() for path in output_dir.iterdir() if path.is_file()}
    with pytest.raises(ConfigError, match=refusal):
        run([str(config), "--resume_from_checkpoint", "last"])
    assert {path.name: path.read_bytes() for path in output_dir.iterdir() if path.is_file()} == written
    if save_steps == 2:
        run([str(config), "--resume_from_checkpoint", "last", "--early_stopping_threshold", "0"])
        assert json.loads((output_dir / RUN_RECORD_FILE).read_text())["resumed_from"] == last
    run([str(config), "--resume_from_checkpoint", str(output_dir / last), "--early_stopping_patience", "4"])
    assert TrainerState.load_from_json(str(output_dir / "trainer_state.json")).global_step == 5


def test_the_card_of_a_resumed_run_reproduces_it_from_the_start_and_says_where_it_resumed(tmp_path, corpus):
    """`--resume_from_checkpoint last` in a new folder finds no checkpoint (it trains from step 0): the card's command
    leaves it out and says which checkpoint the run resumed from; its training time is that last segment's, and says
    so."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, save_strategy="steps", save_steps=2, max_steps=2,
                          do_eval=False, do_predict=False, max_train_samples=40)
    run([str(config)])
    run([str(config), "--max_steps", "4", "--resume_from_checkpoint", "last"])
    record = json.loads((output_dir / RUN_RECORD_FILE).read_text())
    assert record["trained_as"] == f"{config} --max_steps 4" and record["resumed_from"] == "checkpoint-2"
    card = (output_dir / "README.md").read_text()
    shown = shown_command(f"{config} --max_steps 4", record["working_directory"])   # no absolute path in a card
    assert f"{shown}`, resumed from `checkpoint-2`" in card and "--resume_from_checkpoint" not in card
    assert re.search(r"Training time: \d+\.\d (minutes|seconds) \(the segment resumed from `checkpoint-2`; the time "
                     r"before it is not recorded\)\.", card)


def test_the_card_of_a_run_whose_recipe_resumes_trains_it_from_the_start(tmp_path, corpus):
    """A recipe YAML that sets `resume_from_checkpoint: last` resumes whatever the flags: the card's command says
    `--resume_from_checkpoint null`, and parsed, that command trains from the start."""
    output_dir = tmp_path / "out"
    common = {"save_strategy": "steps", "save_steps": 2, "do_eval": False, "do_predict": False, "max_train_samples": 40}
    run([str(write_config(tmp_path / "first.yaml", corpus, output_dir, max_steps=2, **common))])
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=4, resume_from_checkpoint="last",
                          **common)
    run([str(config)])
    record = json.loads((output_dir / RUN_RECORD_FILE).read_text())
    assert record["trained_as"] == f"{config} --resume_from_checkpoint null" and record["resumed_from"] == "checkpoint-2"
    assert parse_arguments(shlex.split(record["trained_as"]))[2].resume_from_checkpoint is None
    run([str(config), "--resume_from_checkpoint", "last", "--max_steps", "6"])
    assert json.loads((output_dir / RUN_RECORD_FILE).read_text())["trained_as"] == (
        f"{config} --max_steps 6 --resume_from_checkpoint null")


@pytest.mark.parametrize("batching", [{}, {"length_pool_factor": 1}],
                         ids=["sorted-batches", "pooled-batches"])
def test_resume_continues_from_the_saved_step(tmp_path, corpus, batching):
    """A run resumed from checkpoint-5 (mid-way through the second epoch) ends with the same weights as the
    uninterrupted run: optimizer, schedule, data order and epoch all continue from the saved step."""
    common = {"max_steps": 8, "save_strategy": "steps", "save_steps": 5, "do_eval": False, "do_predict": False,
              "max_train_samples": 40, **batching}
    full = write_config(tmp_path / "full.yaml", corpus, tmp_path / "full", **common)
    run([str(full)])
    state = json.loads((tmp_path / "full" / "checkpoint-5" / "trainer_state.json").read_text())
    assert state["global_step"] == 5 and 1.0 < state["epoch"] < 2.0
    resumed = write_config(tmp_path / "resumed.yaml", corpus, tmp_path / "resumed", **common,
                           resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-5"),
                           tokenizer_name=str(tmp_path / "full"))
    results = run([str(resumed)])
    assert json.loads((tmp_path / "resumed" / "trainer_state.json").read_text())["global_step"] == 8
    assert results["train"]["epoch"] == pytest.approx(json.loads(
        (tmp_path / "full" / "trainer_state.json").read_text())["epoch"])
    expected = load_file(tmp_path / "full" / "model.safetensors")
    actual = load_file(tmp_path / "resumed" / "model.safetensors")
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name
    untrained = load_file(tmp_path / "full" / "checkpoint-5" / "model.safetensors")
    assert any(not torch.equal(untrained[name], tensor) for name, tensor in expected.items())


BATCH_ORDER_CHANGED = "the resumed run no longer follows the recorded run's batch order"


def lines_of_a_resumed_run(config: Path, capfd, max_steps: int, needle: str, *flags: str) -> list[str]:
    """The printed lines holding `needle` of the run of `config` resumed from its last checkpoint up to `max_steps`."""
    capfd.readouterr()
    run([str(config), "--resume_from_checkpoint", "last", "--max_steps", str(max_steps), *flags])
    printed = capfd.readouterr()
    return [line for line in (printed.out + printed.err).splitlines() if needle in line]


def test_resuming_with_settings_that_change_the_batch_order_warns_once_for_each(tmp_path, corpus, capfd):
    """Each checkpoint records the settings that decide the batch order (`batch_order_settings`, in trainer_state.json
    under stateful_callbacks); a run resumed with other values trains on (a legitimate change) with one warning per
    changed setting, naming both values: seed (data_seed being unset) and max_tokens_per_batch here. Resumed with
    the same values, or with another seed beside an unchanged data_seed, it says nothing; a checkpoint saved without
    the record is not compared. The record is the resumed run's own, also where the Trainer restores the checkpoint's
    (restore_callback_states_from_checkpoint)."""
    output_dir = tmp_path / "run"
    config = write_config(tmp_path / "run.yaml", corpus, output_dir, max_steps=2, save_strategy="steps", save_steps=2,
                          do_eval=False, do_predict=False, max_train_samples=40)
    run([str(config)])

    def resume(max_steps: int, *flags: str) -> list[str]:
        return lines_of_a_resumed_run(config, capfd, max_steps, BATCH_ORDER_CHANGED, *flags)

    warned = resume(4, "--seed", "4", "--max_tokens_per_batch", "300", "--restore_callback_states_from_checkpoint",
                    "true")
    assert len(warned) == 2 and all(" WARNING " in line for line in warned)
    assert (f"max_tokens_per_batch is 300 in this run, 400 in the run that saved {output_dir / 'checkpoint-2'}: "
            f"{BATCH_ORDER_CHANGED}") in warned[0]
    assert "data_seed (data_seed if set, else seed) is 4 in this run, 3 in the run that saved" in warned[1]
    state = json.loads((output_dir / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["BatchOrderRecord"]["args"]["batch_order"] == {
        "max_tokens_per_batch": 300, "gradient_accumulation_steps": 1, "world_size": 1, "data_seed": 4,
        "length_pool_factor": None}
    assert resume(6, "--data_seed", "4", "--seed", "4", "--max_tokens_per_batch", "300") == []
    assert resume(8, "--data_seed", "4", "--seed", "11", "--max_tokens_per_batch", "300") == []
    state = json.loads((output_dir / "checkpoint-8" / "trainer_state.json").read_text())
    del state["stateful_callbacks"]["BatchOrderRecord"]   # as an earlier version saved it
    (output_dir / "checkpoint-8" / "trainer_state.json").write_text(json.dumps(state))
    assert resume(10) == []
    assert "BatchOrderRecord" in json.loads((output_dir / "checkpoint-10" / "trainer_state.json").read_text())[
        "stateful_callbacks"]


def test_resuming_from_a_checkpoint_saved_with_save_only_model_is_refused_before_anything_is_written(tmp_path,
                                                                                                     corpus):
    """A checkpoint of save_only_model holds the weights alone: the Trainer resumed from it with a new optimizer
    state and learning-rate schedule, whose warm-up began again at the checkpoint's step (a learning rate of 0 at
    step 3, after 1e-3 at step 2), without a word. Resuming from it, by its path or as `last`, is one error naming it
    and the new run that trains on from its weights; that run trains."""
    output_dir = tmp_path / "run"
    config = write_config(tmp_path / "run.yaml", corpus, output_dir, max_steps=2, save_strategy="steps", save_steps=2,
                          do_eval=False, do_predict=False, max_train_samples=40, save_only_model=True)
    run([str(config)])
    before = {path: path.stat().st_mtime_ns for path in output_dir.rglob("*")}
    for resume in ("last", str(output_dir / "checkpoint-2")):
        with pytest.raises(ConfigError, match=re.escape(
                f"resume_from_checkpoint: '{output_dir / 'checkpoint-2'}' holds the weights without the optimizer and "
                "learning-rate schedule (no scheduler.pt: saved with save_only_model); resumed, the run would start a "
                "new optimizer state and the schedule's warm-up again at step 2. Train on from its weights in a new "
                f"run (--model_name_or_path {output_dir / 'checkpoint-2'})")):
            run([str(config), "--resume_from_checkpoint", resume, "--max_steps", "4"])
    assert {path: path.stat().st_mtime_ns for path in output_dir.rglob("*")} == before
    assert run([str(config), "--model_name_or_path", str(output_dir / "checkpoint-2"), "--output_dir",
                str(tmp_path / "new")])["train"]["train_steps"] == 2


def test_resuming_with_another_learning_rate_warns_that_the_checkpoints_own_applies(tmp_path, corpus, capfd):
    """A resumed run takes the checkpoint's optimizer and learning-rate schedule, and with them the learning_rate
    they were saved with: resumed with --learning_rate 1e-4 from a checkpoint of 1e-3, it trains on 1e-3's schedule,
    and one warning names both values and the new run that would train at 1e-4. It said nothing (docs/training.md
    proposed resuming with a lower learning_rate after a NaN loss). Resumed again with 1e-3 from the checkpoint that
    run saved (its optimizer still 1e-3's), it says nothing."""
    output_dir = tmp_path / "run"
    config = write_config(tmp_path / "run.yaml", corpus, output_dir, max_steps=2, save_strategy="steps", save_steps=2,
                          do_eval=False, do_predict=False, max_train_samples=40)
    run([str(config)])

    def resume(max_steps: int, *flags: str) -> list[str]:
        return lines_of_a_resumed_run(config, capfd, max_steps, "learning_rate is", *flags)

    warned = resume(4, "--learning_rate", "1e-4")
    assert len(warned) == 1 and " WARNING " in warned[0]
    assert (f"learning_rate is 0.0001 in this run, 0.001 in the optimizer and learning-rate schedule of "
            f"{output_dir / 'checkpoint-2'}, which the resumed run trains on with: this run's learning_rate does not "
            f"apply. To train on from its weights at another learning rate, start a new run with --model_name_or_path "
            f"{output_dir / 'checkpoint-2'}") in warned[0]
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert [entry["learning_rate"] for entry in state["log_history"] if "loss" in entry][-1] == pytest.approx(
        1.0e-3 * (2 / 3) ** 0.5)   # inverse_sqrt, warmup_steps 2: the learning rate of step 4 at 1e-3
    assert resume(6) == []


@pytest.mark.parametrize(("trained_with", "resumed_with", "refusal"), [
    ({"position_scheme": "alibi"}, ["--model.position_scheme", "rope"],
     r"checkpoint-2': its weights were trained with position_scheme alibi, but model: position_scheme=rope would run "
     r"them under another scheme"),
    ({}, ["--model.d_model", "16"],
     r"checkpoint-2': its saved config is the architecture, but model: d_model=16 \(saved: 32\) would change the "
     r"shapes of its weights"),
], ids=["scheme-without-parameters", "shapes"])
def test_resuming_with_a_model_section_of_another_architecture_is_refused_before_anything_is_written(
        tmp_path, corpus, trained_with, resumed_with, refusal):
    """A resumed run trains on the checkpoint's weights: another position_scheme (alibi's weights trained on as rope,
    silently) or other shapes (the Trainer's traceback after the data was prepared) is one error, as for
    model_name_or_path; a dropout rate still changes."""
    output_dir = tmp_path / "run"
    model = {**TINY_CONFIG["model"], **trained_with}
    model = RelPosTransformerConfig.held_fields(model["position_scheme"], model)   # alibi reads no Shaw k
    config = write_config(tmp_path / "run.yaml", corpus, output_dir, max_steps=2, save_strategy="steps", save_steps=2,
                          do_eval=False, do_predict=False, model=model)
    run([str(config)])
    resume = [str(config), "--resume_from_checkpoint", "last", "--max_steps", "4"]
    before = {path: path.stat().st_mtime_ns for path in output_dir.rglob("*")}
    with pytest.raises(ConfigError, match=refusal):
        run([*resume, *resumed_with])
    assert {path: path.stat().st_mtime_ns for path in output_dir.rglob("*")} == before
    assert run([*resume, "--model.dropout", "0.2"])["train"]["train_steps"] == 4


@pytest.mark.parametrize(("field", "value", "refusal"), [
    ("position_scheme", "rope", r"checkpoint-2': its weights were trained with position_scheme rope, but model: "
                                r"position_scheme=directional would run them under another scheme"),
    ("d_model", 32, r"checkpoint-2': its saved config is the architecture, but model: d_model=512 \(saved: 32\) would "
                    r"change the shapes of its weights"),
], ids=["scheme-without-parameters", "shapes"])
def test_resuming_without_the_model_flag_the_run_was_trained_with_is_refused(tmp_path, corpus, field, value, refusal):
    """A field the model: section leaves out takes its default in the model a resumed run builds: trained with
    --model.FIELD and resumed without it, the run trained rope's weights on under the default scheme (directional),
    silently, or failed to load a d_model 32 checkpoint into the default d_model 512 after the data was prepared."""
    output_dir = tmp_path / "run"
    model = {name: setting for name, setting in TINY_CONFIG["model"].items() if name != field}
    if field == "position_scheme":
        del model["max_relative_position"]   # Shaw's k, which neither rope nor the default scheme reads
    config = write_config(tmp_path / "run.yaml", corpus, output_dir, max_steps=2, save_strategy="steps", save_steps=2,
                          do_eval=False, do_predict=False, model=model)
    run([str(config), f"--model.{field}", str(value)])
    resume = [str(config), "--resume_from_checkpoint", "last", "--max_steps", "4"]
    before = {path: path.stat().st_mtime_ns for path in output_dir.rglob("*")}
    with pytest.raises(ConfigError, match=refusal):
        run(resume)
    assert {path: path.stat().st_mtime_ns for path in output_dir.rglob("*")} == before
    assert run([*resume, f"--model.{field}", str(value)])["train"]["train_steps"] == 4


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_trainer_resuming_from_a_checkpoint_ties_what_it_left_out_and_names_any_other_missing_key(
        tmp_path, caplog, tied):
    """`save_pretrained` writes each tied weight once; the HF `Trainer` resuming from such a checkpoint restores every
    weight, tied as before, without warning of "missing keys", and still names a weight the checkpoint lacks."""
    trained = tiny_model(0, tie_word_embeddings=tied)
    trained.save_pretrained(tmp_path / "checkpoint")
    saved = load_file(tmp_path / "checkpoint" / "model.safetensors")
    assert bool(set(trained.all_tied_weights_keys)) == tied
    assert set(saved) == set(trained.state_dict()) - set(trained.all_tied_weights_keys)

    def warnings_when_loading(model: RelPosTransformerForConditionalGeneration) -> str:
        trainer = Seq2SeqTrainer(model=model, args=Seq2SeqTrainingArguments(
            output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            transformers_logging.enable_propagation()
            try:
                trainer._load_from_checkpoint(str(tmp_path / "checkpoint"))
            finally:
                transformers_logging.disable_propagation()
        return caplog.text

    resumed = tiny_model(1, tie_word_embeddings=tied)
    assert "missing keys" not in warnings_when_loading(resumed)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name
    assert (resumed.lm_head.weight is resumed.get_input_embeddings().weight) == tied

    lacking = "model.encoder.layers.0.final_layer_norm.weight"
    save_file({name: tensor for name, tensor in saved.items() if name != lacking},
              str(tmp_path / "checkpoint" / "model.safetensors"), metadata={"format": "pt"})
    logged = warnings_when_loading(tiny_model(1, tie_word_embeddings=tied))
    assert "missing keys in the checkpoint model loaded" in logged and lacking in logged


@pytest.mark.parametrize("batching", [{"max_tokens_per_batch": 20}, {"per_device_train_batch_size": 2}],
                         ids=["token-budget-batches", "batches-of-pairs"])
def test_opening_the_training_loader_or_evaluating_leaves_the_random_state_dropout_draws_from(
        tmp_path, small_tokenizer, batching):
    """Opening a loader's iterator draws its workers' base seed, from the global generator that dropout draws from
    unless the loader has its own: the training loader has its own (seeded with data_seed), and an evaluation
    leaves the random state as it found it. A loader with persistent workers opens its iterator once, and a resumed
    run opened its loaders once more than the uninterrupted run, so its dropout masks differed from then on (end to
    end: tests/test_reliability.py::test_a_run_with_persistent_loader_workers_resumes_to_bitwise_the_same_weights)."""
    from hf_relpos.translation.trainer import EvaluationSet, build_trainer

    dataset, order, sources, references = five_sorted_pairs(small_tokenizer)
    model = RelPosTransformerForConditionalGeneration(RelPosTransformerConfig(
        **RelPosTransformerConfig.held_fields("absolute", {**TINY_CONFIG["model"], "position_scheme": "absolute"}),
        vocab_size=len(small_tokenizer)))
    model.generation_config.max_new_tokens = 2
    arguments = TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                                             generation_num_beams=1, **batching)
    trainer = build_trainer(model, small_tokenizer, arguments, dataset,
                            {"eval": EvaluationSet(dataset, order, references, sources)}, "de")
    state = torch.random.get_rng_state()
    next(iter(trainer.get_train_dataloader()))
    assert torch.equal(torch.random.get_rng_state(), state), "opening the training loader drew from it"
    trainer.evaluate(dataset)
    assert torch.equal(torch.random.get_rng_state(), state), "the evaluation drew from it"


def test_token_budget_loader_keeps_the_trainers_loader_settings(tmp_path):
    dataset = Dataset.from_dict({"input_ids": [[5, 6, 1]] * 8, "labels": [[7, 1]] * 8, "source_length": [3] * 8,
                                 "target_length": [2] * 8})
    arguments = TranslationTrainingArguments(
        output_dir=str(tmp_path), max_tokens_per_batch=9, dataloader_num_workers=1, dataloader_persistent_workers=True,
        dataloader_prefetch_factor=3, dataloader_multiprocessing_context="spawn", use_cpu=True, report_to="none")
    trainer = TranslationTrainer(model=tiny_model(0), args=arguments, train_dataset=dataset, evaluation_sets={})
    loader = trainer.get_train_dataloader()
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (1, True, 3)
    assert loader.multiprocessing_context.get_start_method() == "spawn"
    assert sorted(len(batch) for batch in loader.batch_sampler) == [2, 3, 3]


def test_a_run_stops_its_persistent_loader_workers_before_it_returns(tmp_path, corpus, monkeypatch):
    """The workers the loaders keep (`dataloader_persistent_workers`) have exited of themselves (exit code 0) when
    run() returns: left to the garbage collector, they would be alive, then terminated after torch's join timeout."""
    iterators = []
    opened = _MultiProcessingDataLoaderIter.__init__

    def record(self, loader):
        iterators.append(self)
        opened(self, loader)

    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "__init__", record)
    config = write_config(tmp_path / "workers.yaml", corpus, tmp_path / "out", max_steps=2, dataloader_num_workers=2,
                          dataloader_persistent_workers=True)
    run([str(config)])
    assert len(iterators) == 3   # training, evaluation (reused by the final evaluation), prediction
    assert [[worker.exitcode for worker in iterator._workers] for iterator in iterators] == [[0, 0]] * 3


def test_the_token_budget_counts_the_padding_of_the_flex_kernel(tmp_path):
    """flex_attention batches are padded to a multiple of 64 tokens: a budget of 128 holds two 3-token pairs, not 8."""
    dataset = Dataset.from_dict({"input_ids": [[5, 6, 1]] * 8, "labels": [[7, 1]] * 8, "source_length": [3] * 8,
                                 "target_length": [2] * 8})
    arguments = TranslationTrainingArguments(output_dir=str(tmp_path), max_tokens_per_batch=128, use_cpu=True,
                                             report_to="none")
    sizes = {}
    for kernel in ("eager", "flex_attention"):
        model = tiny_model(0)
        model.set_attn_implementation(kernel)
        trainer = TranslationTrainer(model=model, args=arguments, train_dataset=dataset, evaluation_sets={})
        sizes[kernel] = sorted(len(batch) for batch in trainer.token_budget_sampler)
    assert sizes == {"eager": [8], "flex_attention": [2, 2, 2, 2]}


def test_epoch_callback_sets_the_sampler_epoch_on_resume():
    sampler = TokenBudgetBatchSampler([3] * 10, [3] * 10, max_tokens=9)
    callback = SamplerEpochCallback(sampler)
    for epoch, expected in ((0.0, 0), (1.6667, 1), (2.0, 2), (2.9999999, 2)):
        callback.on_epoch_begin(None, TrainerState(epoch=epoch), None)
        assert sampler.epoch == expected


# --- the embedded demo ---------------------------------------------------------------------------------------------


def test_demo_learns_the_reordering_grammar(tmp_path):
    """`python train_translation.py configs/demo.yaml`: the tiny model must really learn the word order.
    Threshold: sacreBLEU > 80 on dev and test (it reaches ~99 in about 90 s on 2 CPU cores)."""
    output_dir = tmp_path / "demo"
    results = run([str(REPO / "configs" / "demo.yaml"), "--output_dir", str(output_dir)])
    assert results["eval"]["eval_bleu"] > 80 and results["test"]["test_bleu"] > 80
    hypotheses = (output_dir / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    references = [json.loads(line)["translation"]["de"]
                  for line in (output_dir / "demo_data" / "test.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(hypotheses) == len(references)
    exact = sum(hypothesis == reference for hypothesis, reference in zip(hypotheses, references, strict=True))
    assert exact > 0.5 * len(references), "line i of the hypotheses translates line i of the sources"
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    inputs = tokenizer(["Today the man opens the door."], return_tensors="pt")
    translation = tokenizer.decode(model.generate(**inputs)[0], skip_special_tokens=True)
    assert translation == "Heute macht der Mann die Tür auf."


# --- the main process first, without ddp_timeout -------------------------------------------------------------------


def run_ranks(prefix: Path, blocks: dict[int, callable]) -> tuple[list[str], dict[int, BaseException]]:
    """Run `local_main_first` on one thread per local rank; returns the event log and each rank's exception."""
    import threading

    from hf_relpos.translation.coordination import local_main_first

    events: list[str] = []
    errors: dict[int, BaseException] = {}

    def rank_thread(rank: int) -> None:
        try:
            with local_main_first(prefix, rank, len(blocks), "tokenizer training", poll_seconds=0.01):
                events.append(f"{rank} starts")
                blocks[rank]()
                events.append(f"{rank} ends")
            events.append(f"{rank} leaves")
        except BaseException as error:  # noqa: BLE001 - recorded for the assertions
            errors[rank] = error

    threads = [threading.Thread(target=rank_thread, args=(rank,)) for rank in sorted(blocks, reverse=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return events, errors


def test_other_ranks_wait_for_the_main_one_however_long_it_takes(tmp_path, monkeypatch, caplog):
    import time

    monkeypatch.setattr("hf_relpos.translation.coordination.TURN_LOG_SECONDS", 0.05)  # the "still waiting" line, soon
    with caplog.at_level(logging.INFO, logger="hf_relpos.translation.coordination"):
        events, errors = run_ranks(tmp_path / "turn", {0: lambda: time.sleep(0.4), 1: lambda: None, 2: lambda: None})
    assert not errors
    assert "still waiting for the main process to finish tokenizer training" in caplog.text
    assert events[:2] == ["0 starts", "0 ends"]  # the others start only once the main rank has ended
    assert {event for event in events[2:] if "leaves" not in event} == {"1 starts", "1 ends", "2 starts", "2 ends"}
    leaving = [index for index, event in enumerate(events) if "leaves" in event]
    assert min(leaving) > max(index for index, event in enumerate(events) if "ends" in event)  # after all have run it


def test_a_failing_main_rank_stops_the_waiting_ones(tmp_path):
    from hf_relpos.translation.preflight import ProcessGroupError

    def fail() -> None:
        raise ValueError("no such data file")

    events, errors = run_ranks(tmp_path / "turn", {0: fail, 1: lambda: None})
    assert isinstance(errors[0], ValueError)
    assert isinstance(errors[1], ProcessGroupError) and "failed during tokenizer training" in str(errors[1])
    assert events == ["0 starts"]


@pytest.mark.parametrize("stop", [SystemExit(2), KeyboardInterrupt()], ids=["exit", "interrupt"])
def test_a_main_rank_stopped_by_an_exit_or_an_interrupt_stops_the_waiting_ones(tmp_path, stop):
    """A main rank that leaves its block by SystemExit (a check's exit status 2) or Ctrl-C, not an Exception, still
    marks the turn failed: the waiting ranks stop instead of polling for ever."""
    from hf_relpos.translation.preflight import ProcessGroupError

    def leave() -> None:
        raise stop

    try:
        events, errors = run_ranks(tmp_path / "turn", {0: leave, 1: lambda: None})
    finally:
        (tmp_path / "turn.0.done").touch()   # lets a rank that would still wait leave (the check then fails)
    assert type(errors[0]) is type(stop)
    assert isinstance(errors.get(1), ProcessGroupError) and "failed during tokenizer training" in str(errors[1])
    assert events == ["0 starts"]


@pytest.mark.parametrize(("rank", "lines"), [(None, 1), ("0", 1), ("1", 0)])
def test_a_check_error_is_one_line_from_the_main_process_and_exit_status_2_on_every_process(tmp_path, monkeypatch,
                                                                                          capsys, rank, lines):
    """Under accelerate launch every process fails the same check: only process 0 (RANK 0, or no launcher) says so."""
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as exited:
        training_main([str(REPO / "configs" / "demo.yaml"), "--output_dir", str(tmp_path / "out"), "--do_train",
                       "false"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error == "train_translation.py: error: do_eval/do_predict without do_train need model_name_or_path (a " \
                    "trained model)\n" * lines


def test_prepare_only_saves_the_tokenizer_that_the_training_run_reuses(tmp_path, corpus, monkeypatch):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=1, do_eval=False, do_predict=False)
    assert run([str(config), "--prepare_only", "true"]) == {}
    assert (tmp_path / "out" / "tokenizer.json").is_file() and not (tmp_path / "out" / "model.safetensors").exists()
    monkeypatch.setattr("hf_relpos.translation.tokenizer_setup.train_joint_tokenizer",
                        lambda *args, **kwargs: pytest.fail("trained the tokenizer again"))
    assert "train" in run([str(config)])
    assert (tmp_path / "out" / "model.safetensors").is_file()
    with pytest.raises(ConfigError, match="prepare_only trains the tokenizer on the training split: it needs do_train"):
        parse_arguments([str(config), "--prepare_only", "true", "--do_train", "false", "--do_eval", "true",
                         "--model_name_or_path", "x"])


def test_generation_max_length_must_leave_room_for_a_token_after_the_decoder_start(tmp_path, corpus):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out")
    with pytest.raises(ConfigError, match=r"generation_max_length must be at least 2 \(it counts the decoder start "
                                          r"token\), got 1"):
        parse_arguments([str(config), "--generation_max_length", "1"])
    assert parse_arguments([str(config), "--generation_max_length", "2"])[2].generation_max_length == 2


def test_data_seed_draws_the_data_when_set_and_seed_otherwise(tmp_path, corpus):
    """The batches and the joined pairs are drawn with data_seed when it is set, else with seed."""
    from hf_relpos.translation.arguments import data_seed

    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", seed=3)
    assert data_seed(parse_arguments([str(config)])[2]) == 3
    assert data_seed(parse_arguments([str(config), "--data_seed", "11"])[2]) == 11


def test_a_run_that_evaluates_only_when_asked_needs_no_validation_split_to_train(tmp_path, corpus):
    """do_train with eval_strategy 'no' and do_eval false reads no validation split; evaluation during training
    (eval_strategy 'steps') or at the end (do_eval) needs it."""
    from hf_relpos.translation.data_preparation import splits_to_read

    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", do_eval=False, do_predict=False)
    assert splits_to_read(parse_arguments([str(config)])[2]) == ("train",)
    assert splits_to_read(parse_arguments([str(config), "--eval_strategy", "steps", "--eval_steps", "2"])[2]) == (
        "train", "validation")
    assert splits_to_read(parse_arguments([str(config), "--do_eval", "true"])[2]) == ("train", "validation")


# --- average_checkpoints ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"average_checkpoints": 3}, r"average_checkpoints=3 needs checkpoints: save_strategy must be 'steps' or "
                                     r"'epoch', got 'no'"),
        ({"average_checkpoints": 3, "save_strategy": "steps", "save_steps": 2, "save_total_limit": 2},
         r"save_total_limit must be null or >= 3, got 2"),
        ({"average_checkpoints": 0}, r"average_checkpoints must be null \(not set\) or an integer >= 1, got 0"),
        ({"average_checkpoints": 2, "save_strategy": "steps", "save_steps": 2, "eval_strategy": "steps",
          "eval_steps": 2, "load_best_model_at_end": True}, r"average_checkpoints and load_best_model_at_end"),
        ({"average_checkpoints": 2, "save_strategy": "steps", "save_steps": 2, "save_total_limit": 2,
          "eval_strategy": "steps", "eval_steps": 2, "early_stopping_patience": 3},
         r"with metric_for_best_model='bleu' \(early_stopping_patience\) transformers keeps the best checkpoint "
         r"besides the save_total_limit newest: save_total_limit must be null or >= 3, got 2"),
        # the conflict itself first (a save_total_limit raised as the limit error asked only led to it), and the
        # metric named for what set it: load_best_model_at_end's, not early_stopping_patience's
        ({"average_checkpoints": 2, "save_strategy": "steps", "save_steps": 2, "save_total_limit": 2,
          "eval_strategy": "steps", "eval_steps": 2, "load_best_model_at_end": True},
         r"^average_checkpoints and load_best_model_at_end both choose the final weights: set one$"),
        ({"average_checkpoints": 2, "save_strategy": "steps", "save_steps": 2, "save_total_limit": 2,
          "eval_strategy": "steps", "eval_steps": 2, "metric_for_best_model": "chrf"},
         r"with metric_for_best_model='chrf' transformers keeps the best checkpoint besides the save_total_limit "
         r"newest: save_total_limit must be null or >= 3, got 2$"),
    ],
)
def test_average_checkpoints_needs_the_checkpoints_it_averages(tmp_path, corpus, overrides, message):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", **overrides)
    with pytest.raises(ConfigError, match=message):
        parse_arguments([str(config)])


def test_average_checkpoints_makes_the_final_model_the_mean_of_the_last_checkpoints(tmp_path, corpus):
    """6 steps, a checkpoint every 2 (steps 2, 4, 6): the saved model is the float64 mean of checkpoints 4 and 6 cast
    back (tied weights included), evaluation and prediction score that model, and the card and
    averaged_checkpoints.json say which checkpoints."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, save_strategy="steps", save_steps=2,
                          save_total_limit=3, average_checkpoints=2, do_eval=False)
    results = run([str(config)])
    first, second = (load_file(output_dir / f"checkpoint-{step}" / "model.safetensors") for step in (4, 6))
    final = load_file(output_dir / "model.safetensors")
    assert final.keys() == first.keys()
    for name, tensor in final.items():
        expected = ((first[name].double() + second[name].double()) / 2).to(tensor.dtype)
        assert torch.equal(tensor, expected), name
    assert any(not torch.equal(first[name], second[name]) for name in first)   # two different checkpoints
    assert json.loads((output_dir / "averaged_checkpoints.json").read_text()) == {
        "average_checkpoints": 2, "checkpoints": ["checkpoint-4", "checkpoint-6"]}
    model = RelPosTransformerForConditionalGeneration.from_pretrained(output_dir)
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert torch.equal(model.get_input_embeddings().weight, final["model.shared.weight"])
    assert "average_checkpoints" in (output_dir / "README.md").read_text()
    # the test split was scored with the averaged model: decoding it again from the saved folder gives the same BLEU
    # (with the same recipe: its average_checkpoints, a training run's choice, does not apply when nothing is trained)
    again = run([str(config), "--do_train", "false", "--model_name_or_path", str(output_dir),
                 "--output_dir", str(tmp_path / "again")])
    assert again["test"]["test_bleu"] == results["test"]["test_bleu"]


def test_average_checkpoints_leaves_out_an_earlier_runs_checkpoints_past_the_step_the_run_ended_at(
        tmp_path, corpus, monkeypatch, capsys):
    """A run killed after checkpoint-6, resumed from its checkpoint-2 with max_steps 4, ends at step 4: its final
    model averages checkpoints 2 and 4, and checkpoint-6 (the killed run's, 2 steps further) is named in a warning.
    The newest checkpoints in output_dir were averaged, checkpoint-6 among them: a 4-step model held 6 steps'
    weights."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, save_strategy="steps", save_steps=2,
                          average_checkpoints=2, do_eval=False, do_predict=False, max_train_samples=40)

    run_killed_after_checkpoint(monkeypatch, run, [str(config)], 6)
    capsys.readouterr()
    run([str(config), "--resume_from_checkpoint", str(output_dir / "checkpoint-2"), "--max_steps", "4"])
    assert json.loads((output_dir / "averaged_checkpoints.json").read_text()) == {
        "average_checkpoints": 2, "checkpoints": ["checkpoint-2", "checkpoint-4"]}
    assert "WARNING hf_relpos.translation.final_model: average_checkpoints=2: checkpoint-6 left out, saved past step " \
           "4, where this run ended" in capsys.readouterr().out


def test_a_recipes_average_checkpoints_does_not_apply_to_a_run_that_trains_nothing(tmp_path, corpus, trained, caplog):
    """The WMT14 recipes set average_checkpoints: scoring or translating a saved model with such a recipe
    (`--do_train false`) was refused ('average_checkpoints ... it needs do_train'); the recipe's value is now left
    out with a note, and only the flag itself, which asks for an average that cannot be made, is an error."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", save_strategy="steps", save_steps=2,
                          save_total_limit=2, average_checkpoints=2)
    assert parse_arguments([str(config)])[2].average_checkpoints == 2
    not_training = [str(config), "--do_train", "false", "--model_name_or_path", str(trained[0])]
    with caplog.at_level(logging.INFO, logger="hf_relpos.translation.arguments"):
        assert parse_arguments(not_training)[2].average_checkpoints is None
    assert "do_train is false: the recipe's average_checkpoints 2" in caplog.text
    with pytest.raises(ConfigError, match="average_checkpoints averages the checkpoints of this run's training: it "
                                          "needs do_train"):
        parse_arguments([*not_training, "--average_checkpoints", "2"])


def test_average_checkpoints_averages_what_a_short_run_saved(tmp_path, corpus, capsys):
    """6 steps, save_steps 4: the Trainer saves steps 4 and 6 (the last step always), two of the three asked for."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, save_strategy="steps", save_steps=4,
                          average_checkpoints=3, do_eval=False, do_predict=False)
    run([str(config)])   # logs to stdout
    assert "average_checkpoints=3: the run saved only 2 checkpoint(s); averaging those" in capsys.readouterr().out
    assert json.loads((output_dir / "averaged_checkpoints.json").read_text())["checkpoints"] == [
        "checkpoint-4", "checkpoint-6"]


def test_hf_relpos_average_writes_the_card_of_the_run_it_averages(tmp_path, corpus, capsys):
    """hf-relpos-average on a training folder: the averaged folder has a model card from the run's record (its recipe
    and languages), no scores of its own, and a section naming the checkpoints averaged."""
    from huggingface_hub import ModelCard

    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, save_strategy="steps", save_steps=3,
                          do_eval=False, do_predict=False)
    run([str(config)])
    average_main([str(output_dir), "--last_n", "2", "--output_dir", str(tmp_path / "averaged")])
    card = ModelCard.load(tmp_path / "averaged" / "README.md")
    assert card.data.language == ["en", "de"] and card.data.eval_results is None
    assert "Not measured: these averaged weights were not evaluated (Checkpoint averaging, below)." in card.text
    assert "this run wrote no scores" not in card.text
    assert "## Checkpoint averaging" in card.text
    assert "parameter average of 2 checkpoint(s) (`checkpoint-3`, `checkpoint-6`) of `out`" in card.text
    assert "hf-relpos-train" in card.text or "train_translation.py" in card.text   # the run's command, from its record
    # the run's record travels with the averaged weights: hf-relpos-translate scores BLEU for its target language
    assert (tmp_path / "averaged" / "run_record.json").read_bytes() == (output_dir / "run_record.json").read_bytes()


# --- early_stopping_patience -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"early_stopping_patience": 2}, r"early_stopping_patience=2 needs evaluations during training: eval_strategy "
                                         r"must be 'steps' or 'epoch', got 'no'"),
        ({"early_stopping_patience": 0}, r"early_stopping_patience must be null \(not set\) or an integer >= 1, got 0"),
        ({"early_stopping_patience": 2, "eval_strategy": "steps", "eval_steps": 1, "early_stopping_threshold": -1},
         r"early_stopping_threshold must be a finite number >= 0, got -1"),
        ({"early_stopping_patience": 2, "eval_strategy": "steps", "eval_steps": 1, "predict_with_generate": False},
         r"metric_for_best_model='bleu' is scored on generated translations: it needs predict_with_generate true"),
        ({"early_stopping_patience": 2, "eval_strategy": "steps", "eval_steps": 1, "metric_for_best_model": "blue"},
         r"metric_for_best_model must be one of bleu, brevity_penalty, chrf, gen_len, length_ratio, loss, nll_loss, "
         r"got 'blue'"),
        ({"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 2, "save_strategy": "steps",
          "save_steps": 2, "predict_with_generate": False, "metric_for_best_model": "eval_chrf"},
         r"metric_for_best_model='chrf' is scored on generated translations"),
        ({"early_stopping_patience": 2, "eval_strategy": "steps", "eval_steps": 1, "do_train": False,
          "model_name_or_path": "."}, r"early_stopping_patience=2 stops training: it needs do_train"),
    ],
)
def test_early_stopping_needs_evaluations_of_a_metric_they_compute(tmp_path, corpus, overrides, message):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", **overrides)
    with pytest.raises(ConfigError, match=message):
        parse_arguments([str(config)])


def test_early_stopping_watches_validation_bleu_unless_told_otherwise(tmp_path, corpus):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", early_stopping_patience=3,
                          eval_strategy="steps", eval_steps=2)
    training_args = parse_arguments([str(config)])[2]
    assert (training_args.metric_for_best_model, training_args.greater_is_better) == ("bleu", True)
    training_args = parse_arguments([str(config), "--metric_for_best_model", "loss"])[2]
    assert (training_args.metric_for_best_model, training_args.greater_is_better) == ("loss", False)
    # load_best_model_at_end keeps the best checkpoint by the same metric (transformers alone would pick the loss)
    training_args = parse_arguments([str(config), "--load_best_model_at_end", "true", "--save_strategy", "steps",
                                     "--save_steps", "2"])[2]
    assert (training_args.metric_for_best_model, training_args.greater_is_better) == ("bleu", True)


@pytest.mark.parametrize(("metric", "greater_is_better", "warned"), [
    ("loss", "true", "greater_is_better true with metric_for_best_model 'loss', whose lower values are better"),
    ("bleu", "false", "greater_is_better false with metric_for_best_model 'bleu', whose higher values are better"),
    ("loss", "false", None), ("bleu", "true", None), ("length_ratio", "false", None), ("length_ratio", "true", None),
])
def test_greater_is_better_against_the_metrics_direction_warns_that_the_worst_evaluation_counts_as_the_best(
        tmp_path, corpus, caplog, metric, greater_is_better, warned):
    """`greater_is_better: true` with the loss (or false with BLEU) made the worst evaluation the best without a
    word: one warning names both; it stays allowed, as in transformers (the tests keep an early checkpoint that way).
    A metric without a direction (length_ratio) says nothing either way."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", eval_strategy="steps", eval_steps=2,
                          load_best_model_at_end=True, save_strategy="steps", save_steps=2)
    with caplog.at_level("WARNING"):
        training_args = parse_arguments([str(config), "--metric_for_best_model", metric, "--greater_is_better",
                                         greater_is_better])[2]
    assert training_args.greater_is_better == (greater_is_better == "true")
    assert (warned in caplog.text) if warned else ("greater_is_better" not in caplog.text)


def test_early_stopping_ends_the_run_after_patience_evaluations_without_improvement(tmp_path, corpus, capsys):
    """Evaluated every step with a threshold no BLEU change can pass: the first evaluation sets the best, the next
    two do not improve on it, so the run stops at step 3 of 6 and says why, once; the final model is saved and
    scored."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, early_stopping_patience=2,
                          early_stopping_threshold=100, eval_strategy="steps", eval_steps=1)
    results = run([str(config)])   # logs to stdout, transformers' warnings to stderr
    printed, warned = capsys.readouterr()
    state = TrainerState.load_from_json(str(output_dir / "trainer_state.json"))
    assert state.global_step == 3
    assert [entry["step"] for entry in state.log_history if "eval_bleu" in entry] == [1, 2, 3]
    assert state.best_metric == next(entry["eval_bleu"] for entry in state.log_history if "eval_bleu" in entry)
    assert "early_stopping_patience=2: eval_bleu has not improved on its best" in printed
    assert printed.count("training stops") == 1   # the final model's evaluation after training does not count
    assert "in 2 evaluations: training stops at step 3" in printed
    assert "load_best_model_at_end" not in printed + warned
    assert (output_dir / "model.safetensors").is_file() and "test_bleu" in results["test"]
    record = json.loads((output_dir / RUN_RECORD_FILE).read_text())   # the card's record: where and why it stopped
    assert (record["steps"], record["early_stopping_patience"], record["early_stopping_threshold"],
            record["metric_for_best_model"]) == (3, 2, 100, "bleu")
    assert "| `early_stopping_patience` | 2 |" in (output_dir / "README.md").read_text()
    # with more patience than evaluations the run goes its 6 steps, and nothing says it stopped early
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "patient", early_stopping_patience=6,
                          early_stopping_threshold=100, eval_strategy="steps", eval_steps=1)
    run([str(config)])
    assert TrainerState.load_from_json(str(tmp_path / "patient" / "trainer_state.json")).global_step == 6
    assert "training stops" not in capsys.readouterr().out


def test_a_run_without_early_stopping_records_none_of_its_settings(trained):
    output_dir, results = trained
    record = json.loads((output_dir / RUN_RECORD_FILE).read_text())
    assert record["steps"] == results["train"]["train_steps"] == 6
    assert record["early_stopping_patience"] is None and record["early_stopping_threshold"] is None
    assert "early_stopping" not in (output_dir / "README.md").read_text()


def test_load_best_model_at_end_saves_the_best_checkpoint_and_its_card_says_so(tmp_path, corpus, trained):
    """The final model is the weights of the best checkpoint by metric_for_best_model and greater_is_better
    (transformers' rule; here the highest loss, not the last step), and the run record and card say that the weights
    are the best checkpoint's, not the last step's; a run without it records nothing of it."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, eval_strategy="steps", eval_steps=2,
                          save_strategy="steps", save_steps=2, load_best_model_at_end=True,
                          metric_for_best_model="loss", greater_is_better=True, do_predict=False)
    results = run([str(config)])
    state = TrainerState.load_from_json(str(output_dir / "trainer_state.json"))
    losses = {entry["step"]: entry["eval_loss"] for entry in state.log_history if "eval_loss" in entry and
              entry["step"] <= state.global_step and "eval_runtime" in entry}
    best_step = max(losses, key=losses.get)
    assert state.best_model_checkpoint == str(output_dir / f"checkpoint-{best_step}")
    final, best = load_file(output_dir / "model.safetensors"), load_file(Path(state.best_model_checkpoint) /
                                                                         "model.safetensors")
    assert final.keys() == best.keys() and all(torch.equal(final[name], best[name]) for name in final)
    assert results["eval"]["eval_loss"] == pytest.approx(losses[best_step])
    record = json.loads((output_dir / RUN_RECORD_FILE).read_text())
    assert (record["load_best_model_at_end"], record["metric_for_best_model"]) == (True, "loss")
    assert "| `load_best_model_at_end` | True |" in (output_dir / "README.md").read_text()
    plain_output_dir, _ = trained
    assert json.loads((plain_output_dir / RUN_RECORD_FILE).read_text())["load_best_model_at_end"] is None
    assert "load_best_model_at_end" not in (plain_output_dir / "README.md").read_text()


def test_scoring_a_trained_folder_in_place_updates_its_record_and_card(tmp_path, corpus):
    """A run that only scores (do_train false) the model of its own output_dir: the test scores the training run did
    not compute go into its run record and card beside its validation scores, so that both match the results files
    a push publishes."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, do_predict=False)
    run([str(config)])
    assert "test.jsonl (" not in (output_dir / "README.md").read_text()
    validation = json.loads((output_dir / RUN_RECORD_FILE).read_text())["scores"][""]["validation"]
    results = run([str(config), "--do_train", "false", "--model_name_or_path", str(output_dir), "--do_eval", "false",
                   "--do_predict", "true"])
    scores = json.loads((output_dir / RUN_RECORD_FILE).read_text())["scores"][""]
    assert scores["validation"] == validation
    assert scores["test"]["chrf"] == pytest.approx(results["test"]["test_chrf"])
    card = (output_dir / "README.md").read_text()
    assert f"| test.jsonl ({len(corpus['test'].read_text().splitlines())} pairs) | " in card
    assert f" | {results['test']['test_chrf']:.2f} | " in card


def test_scoring_in_place_keeps_the_cards_hub_repository(tmp_path, corpus):
    """The card of a run trained with hub_model_id names that repository (title, usage); scoring its folder in place
    without the flag re-renders the card with the new scores and the same repository."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, do_predict=False, hub_model_id="someone/tiny-relpos")
    run([str(config)])
    assert 'from_pretrained("someone/tiny-relpos"' in (output_dir / "README.md").read_text()
    scoring = write_config(tmp_path / "s.yaml", corpus, output_dir, do_predict=False)
    run([str(scoring), "--do_train", "false", "--model_name_or_path", str(output_dir), "--do_eval", "false",
         "--do_predict", "true"])
    card = (output_dir / "README.md").read_text()
    assert "test.jsonl (" in card
    assert 'from_pretrained("someone/tiny-relpos"' in card


@pytest.mark.parametrize(("flags", "refusal"), [
    (["--generation_num_beams", "1"], r"this run's differ \(generation_num_beams 1 \(recorded 2\)\)"),
    (["--max_predict_samples", "3"], r"this run's differ \(max_predict_samples 3 \(recorded None\)\)"),
    (["--max_eval_samples", "3"], r"this run's differ \(max_eval_samples 3 \(recorded None\)\)"),
    (["--generation_max_length_ratio", "1.5", "--generation_max_length", "40"],
     r"this run's differ \(generation_max_length_ratio 1\.5 \(recorded None\); generation_max_length 40 "
     r"\(recorded None\)\)"),
    (["--model_name_or_path", "CHECKPOINT"], r"holds another trained model than the one scored \('.*checkpoint-6'\)"),
    (["AVERAGED"], r"was written by hf-relpos-average, and its card says its weights were not evaluated"),
])
def test_scoring_into_a_trained_folder_with_other_settings_or_another_model_is_refused(tmp_path, trained, flags,
                                                                                       refusal):
    """Scores written into a trained model's folder are taken (card, push) for its weights under its record's
    settings: scoring another model there, or with other decoding or test data than its recorded scores had, is one
    error naming what differs, and nothing in the folder changes."""
    output_dir = tmp_path / "run"
    shutil.copytree(trained[0], output_dir)
    recipe = TINY_CONFIG | {"output_dir": str(output_dir)}
    if "AVERAGED" in flags:   # what hf-relpos-average writes beside the weights it averaged
        flags = []
        (output_dir / "averaged_checkpoints.json").write_text(json.dumps({"checkpoints": ["a", "b"], "last_n": 2}))
    before = {path.name: path.read_bytes() for path in output_dir.iterdir() if path.is_file()}
    if "CHECKPOINT" in flags:
        RelPosTransformerForConditionalGeneration.from_pretrained(output_dir).save_pretrained(output_dir / "checkpoint-6")
    flags = [str(output_dir / "checkpoint-6") if flag == "CHECKPOINT" else flag for flag in flags]
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**recipe, **{name: json.loads((output_dir / RUN_RECORD_FILE).read_text())[name]
                                                  for name in ("train_file", "validation_file", "test_file")}}))
    with pytest.raises(OutputDirError, match=refusal):
        run([str(config), "--do_train", "false", "--model_name_or_path", str(output_dir), *flags])
    assert {path.name: path.read_bytes() for path in output_dir.iterdir() if path.is_file()} == before


def test_scoring_in_place_with_other_training_length_limits_is_accepted(tmp_path, trained):
    """max_source_length / max_target_length bound the training pairs only: a fine-tuned folder (trained with 48)
    scored in place by a recipe of other limits gets the same scores, and its record keeps the limits it trained
    with."""
    output_dir = tmp_path / "run"
    shutil.copytree(trained[0], output_dir)
    record = json.loads((output_dir / RUN_RECORD_FILE).read_text())
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**TINY_CONFIG, "output_dir": str(output_dir),
                                      **{name: record[name] for name in ("train_file", "validation_file", "test_file")}}))
    results = run([str(config), "--do_train", "false", "--model_name_or_path", str(output_dir), "--do_eval", "false",
                   "--max_source_length", "64", "--max_target_length", "64"])
    assert results["test"]["test_bleu"] == pytest.approx(trained[1]["test"]["test_bleu"])
    rescored = json.loads((output_dir / RUN_RECORD_FILE).read_text())
    assert (rescored["max_source_length"], rescored["max_target_length"]) == (48, 48)
    assert rescored["scores"][""]["test"]["bleu"] == pytest.approx(results["test"]["test_bleu"])


def test_load_best_model_at_end_without_an_evaluation_records_the_last_weights(tmp_path, corpus, capsys):
    """No evaluation within the steps trained (eval_delay past max_steps; transformers otherwise evaluates at the last
    step): there is no best checkpoint, the final model is the last step's weights, and the record, card and log say
    so rather than load_best_model_at_end true."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, eval_strategy="steps", eval_steps=2, eval_delay=100,
                          save_strategy="steps", save_steps=2, load_best_model_at_end=True, do_predict=False)
    run([str(config)])
    state = TrainerState.load_from_json(str(output_dir / "trainer_state.json"))
    assert state.best_model_checkpoint is None and state.global_step == 6
    assert json.loads((output_dir / RUN_RECORD_FILE).read_text())["load_best_model_at_end"] is False
    assert "| `load_best_model_at_end` | True |" not in (output_dir / "README.md").read_text()
    assert "no evaluation ran during the 6 steps trained" in capsys.readouterr().out


def test_early_stopping_on_the_loss_runs_without_generating(tmp_path, corpus, capsys):
    """predict_with_generate false: evaluations compute the loss alone (no translation is scored), which early
    stopping can watch; a threshold no loss change passes stops the run after 1 + patience evaluations."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, early_stopping_patience=1,
                          early_stopping_threshold=100, eval_strategy="steps", eval_steps=1,
                          metric_for_best_model="loss", predict_with_generate=False, do_predict=False)
    results = run([str(config)])
    state = TrainerState.load_from_json(str(output_dir / "trainer_state.json"))
    assert state.global_step == 2 and "eval_loss" in results["eval"] and "eval_bleu" not in results["eval"]
    assert "early_stopping_patience=1: eval_loss has not improved on its best" in capsys.readouterr().out


def test_early_stopping_resumed_counts_the_evaluations_before_the_checkpoint(tmp_path, corpus):
    """A run stopped at step 3 (max_steps) with 2 evaluations past its best, resumed to 6 steps with patience 4:
    the counter comes back with the checkpoint, so the run stops at step 5 (from 0 it would go to step 6). A
    checkpoint saved without early stopping resumes with it."""
    def resumed(name: str, **first_run) -> TrainerState:
        output_dir = tmp_path / name
        common = dict(eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=3, do_predict=False)
        run([str(write_config(tmp_path / f"{name}.yaml", corpus, output_dir, max_steps=3, **common, **first_run))])
        run([str(write_config(tmp_path / f"{name}.yaml", corpus, output_dir, max_steps=6, **common,
                              early_stopping_patience=4, early_stopping_threshold=100,
                              resume_from_checkpoint="last"))])
        return TrainerState.load_from_json(str(output_dir / "trainer_state.json"))

    assert resumed("counted", early_stopping_patience=4, early_stopping_threshold=100).global_step == 5
    # without early stopping before: the first evaluation after resuming sets the best, the next 2 do not improve
    state = resumed("plain")
    assert state.global_step == 6 and state.stateful_callbacks["EarlyStopping"]["attributes"][
        "early_stopping_patience_counter"] == 2


# --- fade_absolute_positions -----------------------------------------------------------------------------------------


def test_a_fade_that_ends_at_the_last_step_gives_no_warning(tmp_path, corpus, caplog):
    """fade_absolute_positions = max_steps fades the sinusoids out by the run's end: nothing to warn about."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", fade_absolute_positions=6)
    with caplog.at_level(logging.WARNING):
        parse_arguments([str(config)])   # max_steps 6
    assert "fade_absolute_positions" not in caplog.text


def test_fade_absolute_positions_is_refused_where_it_cannot_apply(tmp_path, corpus, caplog):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", fade_absolute_positions=8)
    with caplog.at_level(logging.WARNING):
        parse_arguments([str(config)])   # max_steps 6: allowed, but said
    assert "fade_absolute_positions=8 is longer than max_steps=6: the run ends with the sinusoids at 0.25" in caplog.text
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", fade_absolute_positions=0)
    with pytest.raises(ConfigError, match=r"fade_absolute_positions must be null \(not set\) or an integer >= 1"):
        parse_arguments([str(config)])
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", fade_absolute_positions=4, do_train=False,
                          model_name_or_path=str(tmp_path))
    with pytest.raises(ConfigError, match="fade_absolute_positions changes the model step by step during training"):
        parse_arguments([str(config)])
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", fade_absolute_positions=4)
    with pytest.raises(ConfigError, match="fade_absolute_positions fades out the sinusoids of "
                                          "keep_absolute_positions, which this model does not have"):
        run([str(config)])
    assert not (tmp_path / "out").exists()   # refused before anything was written


def test_the_fade_callback_follows_the_step_from_the_starting_scale(tmp_path):
    """s0 (1 - step / N), clipped at 0: from a fresh start, from a resumed step, from a model saved mid-fade; the best
    checkpoint's saved scale comes back with its weights."""
    model = RelPosTransformerForConditionalGeneration(RelPosTransformerConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, keep_absolute_positions=True))
    args = TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    for start_scale, first_step, expected in ((1.0, 0, [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]),
                                              (1.0, 3, [0.25, 0.0, 0.0]),
                                              (0.5, 0, [0.5, 0.375, 0.25, 0.125, 0.0])):
        model.config.absolute_positions_scale = start_scale
        callback, state = AbsolutePositionFadeCallback(4), TrainerState(global_step=first_step)
        callback.on_train_begin(args, state, None, model=model)
        seen = [model.config.absolute_positions_scale]
        for _ in expected[1:]:
            state.global_step += 1
            callback.on_step_end(args, state, None, model=model)
            seen.append(model.config.absolute_positions_scale)
        assert seen == expected
    best = tmp_path / "checkpoint-2"
    best.mkdir()
    (best / "config.json").write_text(json.dumps({"absolute_positions_scale": 0.5}))
    args = TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                                        load_best_model_at_end=True, eval_strategy="steps", save_strategy="steps")
    callback.on_train_end(args, TrainerState(global_step=6, best_model_checkpoint=str(best)), None, model=model)
    assert model.config.absolute_positions_scale == 0.5


def test_fade_absolute_positions_saves_each_checkpoint_at_its_scale_and_averages_only_alike(tmp_path, corpus, capsys):
    """6 steps, fade over 4, a checkpoint every 2: checkpoints 2, 4, 6 hold scales 0.5, 0, 0; average_checkpoints=3
    leaves out checkpoint 2 (trained to another scale) with a warning, and hf-relpos-average refuses to mix them."""
    output_dir = tmp_path / "out"
    model = {**TINY_CONFIG["model"], "keep_absolute_positions": True}
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, model=model, fade_absolute_positions=4,
                          save_strategy="steps", save_steps=2, save_total_limit=3, average_checkpoints=3,
                          do_eval=False, do_predict=False)
    run([str(config)])
    saved = {step: json.loads((output_dir / f"checkpoint-{step}" / "config.json").read_text())
             for step in (2, 4, 6)}
    assert [saved[step]["absolute_positions_scale"] for step in (2, 4, 6)] == [0.5, 0.0, 0.0]
    assert "checkpoint-2 saved another config than checkpoint-6" in capsys.readouterr().out
    assert json.loads((output_dir / "averaged_checkpoints.json").read_text())["checkpoints"] == [
        "checkpoint-4", "checkpoint-6"]
    final = RelPosTransformerConfig.from_pretrained(output_dir)
    assert (final.keep_absolute_positions, final.absolute_positions_scale) == (True, 0.0)
    card = (output_dir / "README.md").read_text()
    assert "times 0 (`absolute_positions_scale`)" in card and "fade_absolute_positions" in card
    with pytest.raises(ValueError, match=r"differ in their config \(absolute_positions_scale: 0.5 vs 0.0\)"):
        average_checkpoints(output_dir, last_n=3, output_dir=tmp_path / "averaged")
    assert not (tmp_path / "averaged").exists()


def test_a_resumed_run_continues_the_fade_and_the_best_model_brings_its_scale(tmp_path, corpus):
    """Fade over 8 of 6 steps, a checkpoint every 2 (scales 0.75, 0.5, 0.25). Resumed from checkpoint-4 into another
    folder, the run continues the fade where it stopped: its checkpoint-6 and final model at 0.25, the same weights
    as the uninterrupted run's. With load_best_model_at_end the final model has the best checkpoint's scale."""
    model = {**TINY_CONFIG["model"], "keep_absolute_positions": True}
    common = {"model": model, "fade_absolute_positions": 8, "save_strategy": "steps", "save_steps": 2,
              "do_eval": False, "do_predict": False}
    full = write_config(tmp_path / "full.yaml", corpus, tmp_path / "full", **common)
    run([str(full)])
    scales = [json.loads((tmp_path / "full" / f"checkpoint-{step}" / "config.json").read_text())[
        "absolute_positions_scale"] for step in (2, 4, 6)]
    assert scales == [0.75, 0.5, 0.25]
    resumed = write_config(tmp_path / "resumed.yaml", corpus, tmp_path / "resumed", **common,
                           resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-4"),
                           tokenizer_name=str(tmp_path / "full"))
    run([str(resumed)])
    assert RelPosTransformerConfig.from_pretrained(tmp_path / "resumed").absolute_positions_scale == 0.25
    expected, actual = (load_file(tmp_path / folder / "model.safetensors") for folder in ("full", "resumed"))
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name

    best = write_config(tmp_path / "best.yaml", corpus, tmp_path / "best", **{**common, "do_eval": True},
                        eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
                        metric_for_best_model="loss", greater_is_better=True)   # "best" = an early checkpoint
    run([str(best)])
    state = json.loads((tmp_path / "best" / "trainer_state.json").read_text())
    best_step = int(state["best_model_checkpoint"].rsplit("-", 1)[1])
    assert best_step < 6   # not the last step, whose scale the run ends with anyway
    assert RelPosTransformerConfig.from_pretrained(tmp_path / "best").absolute_positions_scale == 1 - best_step / 8
