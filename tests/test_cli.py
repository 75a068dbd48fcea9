"""The console commands installed with the package ([project.scripts]): each target is a callable main whose
`--help` exits 0, and `--attn_implementation` is checked on the training command line and in recipes."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BUILT_IN_SCHEMES, console_script_main, pyproject, unreachable_hub

from hf_relpos import POSITION_SCHEMES
from hf_relpos.translation.arguments import ModelArguments, attention_implementations, model_config_fields
from hf_relpos.translation.data import DataArguments
from hf_relpos.translation.training import ConfigError, parse_arguments

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {"hf-relpos-train": "hf_relpos.translation.training:main", "hf-relpos-translate": "hf_relpos.tools.translate:main",
           "hf-relpos-convert": "hf_relpos.tools.convert:main", "hf-relpos-average": "hf_relpos.tools.average:main",
           "hf-relpos-export": "hf_relpos.tools.export:main", "hf-relpos-score": "hf_relpos.tools.score:main"}


def test_pyproject_declares_the_six_commands():
    assert pyproject()["project"]["scripts"] == SCRIPTS


@pytest.mark.parametrize(("name", "shown"), [
    ("hf-relpos-train", "--attn_implementation"),
    ("hf-relpos-translate", "--dtype"),
    ("hf-relpos-convert", "marian"),
    ("hf-relpos-average", "--last_n"),
    ("hf-relpos-export", "ctranslate2"),
    ("hf-relpos-score", "--normalize"),
])
def test_every_command_has_a_working_help(name, shown, capsys):
    main = console_script_main(name)
    assert callable(main)
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert shown in capsys.readouterr().out


def test_the_training_help_lists_every_registered_position_scheme(capsys):
    import hf_relpos

    with pytest.raises(SystemExit):
        console_script_main("hf-relpos-train")(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert f"One of: {', '.join(sorted(hf_relpos.POSITION_SCHEMES))}." in shown
    assert {"absolute", "shaw", "xl", "directional", "rope", "alibi", "t5", "none"} <= set(hf_relpos.POSITION_SCHEMES)


def test_the_training_help_says_push_to_hub_pushes_once_and_where(capsys):
    """push_to_hub and hub_model_id are help of hf_relpos' own (docs/hub.md): one push after the run, the Trainer's
    pushes at every save being off, to output_dir's folder name unless hub_model_id names a repository."""
    with pytest.raises(SystemExit):
        console_script_main("hf-relpos-train")(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "push output_dir once" in shown and "The Trainer's own pushes (hub_strategy) stay off" in shown
    assert "every time the model is saved" not in shown and "keep in sync with the local `output_dir`" not in shown
    assert "null: the name of output_dir's folder. (default: null)" in shown


def test_the_training_guide_names_every_command():
    guide = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    introduction = guide.split("```", 1)[0]
    assert all(f"`{name}`" in introduction for name in SCRIPTS), [name for name in SCRIPTS if f"`{name}`" not in introduction]


def test_the_training_guides_field_reference_names_every_model_and_data_field():
    """docs/training.md's Field reference names each field of its model sections (the arguments, the config's own
    and the built-in schemes') and of its data section; the training section is transformers' own, named by
    example."""
    reference = (REPO / "docs" / "training.md").read_text(encoding="utf-8").split("## Field reference", 1)[1]
    argument_fields = {item.name for argument_class in (ModelArguments, DataArguments)
                       for item in dataclasses.fields(argument_class) if item.init}
    user_scheme_fields = {field.name for name, scheme in POSITION_SCHEMES.items() if name not in BUILT_IN_SCHEMES
                          for field in scheme.config_fields}
    built_in_scheme_fields = {field.name for name in BUILT_IN_SCHEMES for field in POSITION_SCHEMES[name].config_fields}
    fields = argument_fields | model_config_fields() - (user_scheme_fields - built_in_scheme_fields)
    assert sorted(name for name in fields if f"`{name}`" not in reference) == []


@pytest.mark.parametrize("name", ["hf-relpos-train", "hf-relpos-convert"])
def test_an_installed_command_names_itself_in_usage_and_errors(name, tmp_path):
    """Started as its console script, a command's usage and error lines carry that name (not the module's)."""
    script = Path(sys.executable).parent / name
    if not script.exists():
        pytest.skip(f"{name} is not installed next to this Python")
    completed = subprocess.run([str(script), "--no-such-flag"], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300)
    assert completed.returncode == 2
    assert f"{name}: error: " in completed.stderr
    assert "train_translation.py" not in completed.stderr and "python -m" not in completed.stderr


@pytest.mark.parametrize(("argv0", "script"), [
    ("/venv/bin/hf-relpos-train", "hf-relpos-train"), ("train_translation.py", "train_translation.py"),
    ("../train_translation.py", "../train_translation.py"),
    (str(REPO / "hf_relpos" / "translation" / "training.py"), "hf_relpos.translation.training"),
])
def test_the_help_launches_the_command_it_was_started_as_under_accelerate(argv0, script):
    """The help's `accelerate launch` example runs the program it names: a console script after `--no_python`, as
    accelerate would otherwise run `python hf-relpos-train` (no such file in the working directory), the script by
    the path it was started by, the module (`python -m`) after `-m`."""
    from accelerate.commands.launch import launch_command_parser

    code = f"import sys; sys.argv[0] = {argv0!r}; from hf_relpos.translation import arguments; print(arguments.EPILOG)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    example = next(line.split()[2:] for line in completed.stdout.splitlines() if "accelerate launch" in line)
    launched = launch_command_parser().parse_args(example)
    assert launched.training_script == script and bool(launched.no_python) == (script == "hf-relpos-train")
    assert bool(launched.module) == (script == "hf_relpos.translation.training")


def test_the_training_module_runs_as_a_program():
    """`python -m hf_relpos.translation.training` is the training command (as `python -m hf_relpos.tools.translate`
    is hf-relpos-translate), not a silent exit 0 that trained nothing; its errors and help name it so (a pip install
    has no train_translation.py to run)."""
    completed = subprocess.run([sys.executable, "-m", "hf_relpos.translation.training", "--no-such-flag"],
                               capture_output=True, text=True, cwd=REPO, timeout=300)
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert completed.stderr.startswith("python -m hf_relpos.translation.training: error: unknown key(s): "
                                       "--no-such-flag")
    assert "; python -m hf_relpos.translation.training --help lists every field" in completed.stderr
    shown = subprocess.run([sys.executable, "-m", "hf_relpos.translation.training", "--help"], capture_output=True,
                           text=True, cwd=REPO, timeout=300).stdout
    assert shown.startswith("usage: python -m hf_relpos.translation.training CONFIG.yaml")
    assert "accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m hf_relpos.translation.training " in shown


def test_train_translation_script_is_the_same_main():
    namespace: dict = {}
    exec((REPO / "train_translation.py").read_text(encoding="utf-8").replace('if __name__ == "__main__"', "if False"),
         namespace)
    assert namespace["main"] is console_script_main("hf-relpos-train")


def test_attn_implementation_from_the_recipe_and_the_command_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text((REPO / "configs" / "demo.yaml").read_text(encoding="utf-8") + "attn_implementation: eager\n",
                      encoding="utf-8")
    assert parse_arguments([str(recipe)])[0].attn_implementation == "eager"
    assert parse_arguments([str(recipe), "--attn_implementation", "flex_attention"])[0].attn_implementation == \
        "flex_attention"
    assert parse_arguments([str(REPO / "configs" / "demo.yaml")])[0].attn_implementation is None
    with pytest.raises(ConfigError, match=r"attn_implementation 'flash' is not a registered attention kernel: one of "
                                          r"\[.*'sdpa'.*\], a Hub kernel 'owner/repo'"):
        parse_arguments([str(recipe), "--attn_implementation", "flash"])
    assert {"eager", "sdpa", "flex_attention", "flash_attention_2"} <= set(attention_implementations())


def test_parsing_evaluates_the_argument_classes_annotations_once_per_process(monkeypatch):
    """The argument classes' field types are evaluated once, not once per field for every parse: typing.get_type_hints
    evaluates a class's every annotation per call, and a call per field (about 170) was most of a parse (0.36 s of 0.42 s)."""
    import typing

    recipe = str(REPO / "configs" / "demo.yaml")
    parse_arguments([recipe, "--max_train_samples", "null"])   # every path that asks a field's type, once
    evaluated = []
    real = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda *args, **kwargs: evaluated.append(args[0]) or real(*args, **kwargs))
    parse_arguments([recipe, "--max_train_samples", "null"])
    assert evaluated == []


@pytest.mark.parametrize("kernel", ["eager", "flex_attention"])
def test_the_model_is_built_with_the_requested_kernel(kernel, tmp_path):
    from hf_relpos.translation.model_setup import build_model
    from hf_relpos.translation.tokenization import train_joint_tokenizer

    tokenizer = train_joint_tokenizer(["a small cat", "eine kleine Katze"] * 20, vocab_size=300)
    model_args, data_args, training_args = parse_arguments(
        [str(REPO / "configs" / "demo.yaml"), "--attn_implementation", kernel, "--output_dir", str(tmp_path)])
    model = build_model(model_args, tokenizer, data_args, training_args)
    assert model.config._attn_implementation == kernel
    model.save_pretrained(tmp_path / "saved")
    model_args, data_args, training_args = parse_arguments(
        [str(REPO / "configs" / "demo.yaml"), "--model_name_or_path", str(tmp_path / "saved"), "--attn_implementation",
         "eager", "--output_dir", str(tmp_path)])
    assert build_model(model_args, tokenizer, data_args, training_args).config._attn_implementation == "eager"


def test_a_kernel_whose_package_is_missing_is_one_config_error(tmp_path):
    from transformers.utils import is_flash_attn_2_available

    from hf_relpos.translation.model_setup import build_model
    from hf_relpos.translation.tokenization import train_joint_tokenizer

    if is_flash_attn_2_available():
        pytest.skip("flash-attn is installed here")
    tokenizer = train_joint_tokenizer(["a small cat", "eine kleine Katze"] * 20, vocab_size=300)
    arguments = parse_arguments([str(REPO / "configs" / "demo.yaml"), "--attn_implementation", "flash_attention_2",
                                 "--output_dir", str(tmp_path)])
    with pytest.raises(ConfigError, match=r"attn_implementation 'flash_attention_2': .*FlashAttention2"):
        build_model(arguments[0], tokenizer, arguments[1], arguments[2])


def test_a_kernel_that_cannot_run_the_recipes_scheme_is_one_config_error_before_anything_is_written(tmp_path):
    """transformers' paged eager kernel (continuous batching) runs no scheme of this model: the run stops while the
    model is built, before a tokenizer, a model or a checkpoint is written (the output folder holds only the
    generated demo corpus)."""
    from hf_relpos.translation.training import run

    output_dir = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"attn_implementation 'paged\|eager'.* is transformers' kernel for "
                                          r"continuous batching"):
        run([str(REPO / "configs" / "demo.yaml"), "--attn_implementation", "paged|eager", "--output_dir",
             str(output_dir), "--demo_train_pairs", "200"])
    assert [path.name for path in output_dir.iterdir()] == ["demo_data"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--model.position_randomization_max", "64", "--max_source_length", "100"],
     r"position_randomization_max \(64\) must be at least the longest sequence the run gives the model: "
     r"max_source_length = 100; raise position_randomization_max to 100 or shorten them"),
    (["--model.position_randomization_max", "100", "--model.position_randomization_at_inference", "true",
      "--max_source_length", "64", "--max_target_length", "64"],
     r"position_randomization_max \(100\) must be at least .*: the longest generated output \(decoder start \+ "
     r"min\(generation_max_length_ratio x max_source_length \+ generation_max_length_offset, .*\)\) = 115;"),
])
def test_randomized_positions_shorter_than_the_runs_sequences_are_refused_when_the_model_is_built(
        flags, message, tmp_path):
    """Ruoss et al.'s draw needs a range at least as long as each sequence: the lengths the run allows are checked
    before training (the model itself would stop at the first longer batch)."""
    from hf_relpos.translation.model_setup import build_model
    from hf_relpos.translation.tokenization import train_joint_tokenizer

    tokenizer = train_joint_tokenizer(["a small cat", "eine kleine Katze"] * 20, vocab_size=300)
    model_args, data_args, training_args = parse_arguments(
        [str(REPO / "configs" / "demo.yaml"), "--output_dir", str(tmp_path), *flags])
    with pytest.raises(ConfigError, match=message):
        build_model(model_args, tokenizer, data_args, training_args)
    model_args, data_args, training_args = parse_arguments(
        [str(REPO / "configs" / "demo.yaml"), "--output_dir", str(tmp_path), *flags[:-4],
         "--model.position_randomization_max", "300"])
    assert build_model(model_args, tokenizer, data_args, training_args).config.position_randomization_max == 300


def test_randomized_positions_at_inference_must_hold_the_longest_evaluation_source(tmp_path):
    """Evaluation translates sources whole, so with positions randomized at inference the range must hold the
    longest one and its output: one error before training, naming the split, with only the prepared data written."""
    from hf_relpos.translation.demo_corpus import write_demo_corpus
    from hf_relpos.translation.training import run

    files = write_demo_corpus(tmp_path / "data", 100, 8, 8, seed=1)
    lines = files["test"].read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[0])
    record["translation"]["en"] = " ".join([record["translation"]["en"]] * 12)
    files["test"].write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n", encoding="utf-8")
    flags = [str(REPO / "configs" / "demo.yaml"), "--train_file", str(files["train"]), "--validation_file",
             str(files["validation"]), "--test_file", str(files["test"]), "--output_dir", str(tmp_path / "out"),
             "--model.position_randomization_max", "64", "--model.position_randomization_at_inference", "true",
             "--max_source_length", "24", "--max_target_length", "24", "--generation_max_length_offset", "5",
             "--max_steps", "1"]
    with pytest.raises(ConfigError, match=r"position_randomization_max \(64\) must hold the test split's longest source "
                                          r"\((\d+) tokens\) and the longest output generated for it"):
        run(flags)
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["prepared_data"]


@pytest.mark.parametrize(("name", "kind"), [("model_name_or_path", "model"), ("tokenizer_name", "model"),
                                           ("dataset_name", "dataset")])
def test_a_mistyped_local_folder_is_one_error_without_a_hub_lookup(name, kind, tmp_path, monkeypatch):
    """`outputs/my_modle` (a path whose parent exists) is a missing folder, not a Hub id to retry for half a minute."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    monkeypatch.setattr("huggingface_hub.file_download.hf_hub_download",
                        lambda *args, **kwargs: pytest.fail("looked the folder up on the Hub"))
    monkeypatch.setattr("huggingface_hub.HfApi.dataset_info",
                        lambda *args, **kwargs: pytest.fail("looked the folder up on the Hub"))
    with pytest.raises(ConfigError, match=rf"^{name} 'outputs/my_modle': no such folder \(the nearest existing folder "
                                          rf"is 'outputs'\); a Hub {kind} id has the form owner/name$"):
        parse_arguments([str(REPO / "configs" / "demo.yaml"), f"--{name}", "outputs/my_modle"])


def test_the_dataset_name_local_files_replace_is_not_checked_as_a_folder(tmp_path, monkeypatch):
    """With train_file (or validation_file, test_file) dataset_name is ignored, the default wmt/wmt14 too: a working
    folder that holds a `wmt/` folder of one's own data stopped every such run with `dataset_name 'wmt/wmt14': no
    such folder`, a field it had not set and does not read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wmt").mkdir()
    (tmp_path / "wmt" / "train.jsonl").write_text(
        json.dumps({"translation": {"en": "a house", "de": "ein Haus"}}) + "\n", encoding="utf-8")
    _, data_args, _ = parse_arguments([str(REPO / "configs" / "wmt14_en_de_base_shaw.yaml"), "--train_file",
                                       "wmt/train.jsonl", "--validation_file", "wmt/train.jsonl", "--test_file",
                                       "wmt/train.jsonl"])
    assert data_args.uses_local_files and data_args.dataset_name == "wmt/wmt14"
    with pytest.raises(ConfigError, match=r"^dataset_name 'wmt/wmt14': no such folder"):   # read: still checked
        parse_arguments([str(REPO / "configs" / "wmt14_en_de_base_shaw.yaml")])


def test_only_paths_count_as_missing_local_folders(tmp_path, monkeypatch):
    """A bare name (`t5-small`) and namespace/name without such a folder here stay Hub ids; a path-like name that does
    not exist is a missing folder."""
    from hf_relpos.translation.preflight import missing_local_folder

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    assert missing_local_folder("t5-small") is None and missing_local_folder("Helsinki-NLP/opus-mt-en-de") is None
    assert missing_local_folder("outputs") is None  # exists
    for name in ("outputs/model", "./model", "runs/a/b", "/no/such/folder"):
        assert missing_local_folder(name) is not None, name


def test_the_run_record_says_how_the_run_was_launched_without_its_hub_token(tmp_path):
    """`trained_as` (run_record.json and the model card, pushed to the Hub with push_to_hub) quotes the recipe and
    the flags as given, except a secret's value (`--hub_token`, `--hub-token=...`), hidden as transformers'
    TrainingArguments.to_dict hides it."""
    from hf_relpos.translation.run_outputs import run_record

    demo = str(REPO / "configs" / "demo.yaml")
    for flags, shown in ((["--hub_token", "hf_SECRET"], "--hub_token '<HUB_TOKEN>'"),
                         (["--hub-token=hf_SECRET"], "'--hub-token=<HUB_TOKEN>'")):
        model_args, data_args, training_args = parse_arguments(
            [demo, "--seed", "7", *flags, "--output_dir", str(tmp_path)])
        assert training_args.hub_token == "hf_SECRET"   # the run itself has it
        record = run_record(model_args, data_args, training_args)
        assert record.trained_as == f"{demo} --seed 7 {shown} --output_dir {tmp_path}"
        assert record.recipe == "demo" and "hf_SECRET" not in json.dumps(record.to_json())


def test_the_run_record_names_the_folder_its_relative_paths_start_from(tmp_path, monkeypatch):
    """A recipe and flags given by relative paths (the recipe through a link, a data file, a module to import) parse
    to the same arguments again when the recorded command runs in the working directory run_record.json records;
    from another folder they would name other files or none. The card, which goes to the Hub, gives the command
    without that local folder."""
    from conftest import tiny_config

    from hf_relpos.publish.hub import render_model_card
    from hf_relpos.translation.run_outputs import run_record

    started_in = tmp_path / "runs"
    (started_in / "recipes").mkdir(parents=True)
    (started_in / "recipes" / "mine.yaml").symlink_to(REPO / "configs" / "demo.yaml")
    (started_in / "extra.py").write_text("", encoding="utf-8")
    monkeypatch.syspath_prepend(str(started_in))
    monkeypatch.chdir(started_in)
    arguments = parse_arguments(["recipes/mine.yaml", "--max_steps", "4", "--model.dropout", "0.2",
                                 "--dataset_name=null", "--train_file", "data/train.jsonl",
                                 "--run_name", "a 'quoted' name", "--import_modules", "extra.py",
                                 "--output_dir", "out"])
    record = run_record(*arguments)
    assert record.working_directory == str(started_in)
    monkeypatch.chdir(record.working_directory)
    again = parse_arguments(shlex.split(record.trained_as))
    assert again[0].model_config == arguments[0].model_config and again[1] == arguments[1]
    assert again[2].to_dict() == arguments[2].to_dict()
    card = render_model_card(tiny_config(), record)
    assert f"`python train_translation.py {record.trained_as}`" in card and str(started_in) not in card


def test_the_output_length_limits_are_recorded_decoding_settings(tmp_path):
    """generation_max_length_ratio and generation_max_length decide the scores as the beam size does: the record
    and its card's decoding table state them, and a run that scores the recorded model in place with other values is
    told they differ (the card, reading the ratio as 1 unless set, would state settings the scores were not made
    with)."""
    from conftest import tiny_config

    from hf_relpos.publish.hub import render_model_card
    from hf_relpos.translation.run_outputs import run_record, scoring_differences

    demo = str(REPO / "configs" / "demo.yaml")
    recorded = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path)]))
    assert (recorded.generation_max_length_ratio, recorded.generation_max_length) == (None, None)
    current = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path), "--generation_max_length_ratio", "1.5",
                                           "--generation_max_length", "40"]))
    assert scoring_differences(recorded, current, ()) == ["generation_max_length_ratio 1.5 (recorded None)",
                                                          "generation_max_length 40 (recorded None)"]
    card = render_model_card(tiny_config(), current)
    assert "| `generation_max_length_ratio` | 1.5 |" in card and "| `generation_max_length` | 40 |" in card


def test_a_half_precision_evaluation_is_a_recorded_decoding_setting(tmp_path):
    """fp16_full_eval / bf16_full_eval cast the model for the final evaluation and prediction, so they decide the
    scores: the record and its card's decoding table state them where on (a run without them records neither, as
    records written before they were fields), and scoring in place with them is told it differs."""
    from conftest import tiny_config

    from hf_relpos.publish.hub import render_model_card
    from hf_relpos.translation.run_outputs import run_record, scoring_differences

    demo = str(REPO / "configs" / "demo.yaml")
    recorded = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path)]))
    assert (recorded.bf16_full_eval, recorded.fp16_full_eval) == (None, None)
    assert "_full_eval" not in render_model_card(tiny_config(), recorded)
    current = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path), "--fp16_full_eval", "true"]))
    assert (current.bf16_full_eval, current.fp16_full_eval) == (None, True)
    assert "| `fp16_full_eval` | True |" in render_model_card(tiny_config(), current)
    assert scoring_differences(recorded, current, ()) == ["fp16_full_eval True (recorded None)"]


def test_the_demo_corpus_settings_are_recorded_and_decide_scores_in_place(tmp_path):
    """The demo corpus's sizes and seed decide its every split: a demo run's record and card state them, a run on
    local files records none, and scoring a demo folder in place with another demo test set is told they differ
    (a record written before they were recorded has none to compare)."""
    from conftest import tiny_config

    from hf_relpos.publish.hub import render_model_card
    from hf_relpos.translation.run_outputs import run_record, scoring_differences

    demo = str(REPO / "configs" / "demo.yaml")
    recorded = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path)]))
    assert (recorded.demo_train_pairs, recorded.demo_validation_pairs, recorded.demo_test_pairs,
            recorded.demo_seed) == (8000, 200, 200, 1234)
    assert "| `demo_test_pairs` | 200 |" in render_model_card(tiny_config(), recorded)
    recorded.scores = {"": {"test": {"bleu": 50.0}}}
    current = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path), "--demo_test_pairs", "50",
                                           "--demo_seed", "7"]))
    assert scoring_differences(recorded, current, ("test",)) == ["demo_test_pairs 50 (recorded 200)",
                                                                 "demo_seed 7 (recorded 1234)"]
    assert scoring_differences(recorded, current, ("validation",)) == []   # no validation scores recorded
    recorded.demo_test_pairs = recorded.demo_seed = None
    assert scoring_differences(recorded, current, ("test",)) == []
    local = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path), "--train_file", str(tmp_path / "t.tsv"),
                                         "--do_eval", "false", "--do_predict", "false"]))
    assert (local.demo_train_pairs, local.demo_seed) == (None, None)


def test_the_run_record_leaves_out_settings_the_run_did_not_read(tmp_path):
    """An optimizer that takes no Adam moments (sgd) leaves the recipe's adam_beta1/2 and adam_epsilon unread, and
    batches of pairs leave a token budget's length_pool_factor unread (one warning says so), and without joined pairs
    max_pairs_per_join is unread, and a new tokenizer's settings with a reused tokenizer: neither the record nor the
    card's tables state them as settings of the run; a Lion optimizer's betas are, and the join size of a run that
    joins pairs."""
    from conftest import tiny_config

    from hf_relpos.publish.hub import render_model_card
    from hf_relpos.translation.run_outputs import run_record

    demo = str(REPO / "configs" / "demo.yaml")
    record = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path), "--optim", "sgd",
                                          "--max_tokens_per_batch", "null", "--length_pool_factor", "4"]))
    unread = ("adam_beta1", "adam_beta2", "adam_epsilon", "length_pool_factor", "max_pairs_per_join")
    assert [getattr(record, name) for name in unread] == [None] * 5
    card = render_model_card(tiny_config(), record)
    assert not any(f"`{name}`" in card for name in unread) and "| `optim` | sgd |" in card
    lion = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path), "--optim", "lion_32bit"]))
    assert (lion.adam_beta1, lion.adam_beta2, lion.adam_epsilon) == (0.9, 0.98, None)
    joined = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path), "--concatenated_pairs", "0.5",
                                          "--max_pairs_per_join", "3"]))
    assert (joined.concatenated_pairs, joined.max_pairs_per_join) == (0.5, 3)
    reused = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path), "--tokenizer_name", str(tmp_path)]))
    assert (reused.tokenizer_vocab_size, reused.tokenizer_character_coverage) == (None, None)
    assert run_record(*parse_arguments([demo, "--output_dir", str(tmp_path)])).tokenizer_vocab_size is not None


def test_the_run_record_keeps_the_data_seed_that_drew_the_batches(tmp_path):
    """data_seed (when set) draws the batch order and the joined pairs in place of seed: a run reproduced from its
    record without it trains on other batches."""
    from conftest import tiny_config

    from hf_relpos.publish.hub import render_model_card
    from hf_relpos.translation.run_outputs import run_record

    demo = str(REPO / "configs" / "demo.yaml")
    assert run_record(*parse_arguments([demo, "--output_dir", str(tmp_path)])).data_seed is None
    record = run_record(*parse_arguments([demo, "--output_dir", str(tmp_path), "--data_seed", "11"]))
    assert record.data_seed == 11 and "| `data_seed` | 11 |" in render_model_card(tiny_config(), record)


@pytest.mark.parametrize(("name", "argv", "named"), [
    ("hf-relpos-train", ["missing.yaml"], "missing.yaml"),
    ("hf-relpos-translate", ["./missing_model", "--input", "source.txt"], "missing_model"),
    ("hf-relpos-convert", ["marian", "./missing_model", "out", "--position_scheme", "shaw"], "missing_model"),
    ("hf-relpos-average", ["./missing_run", "--output_dir", "out"], "missing_run"),
    ("hf-relpos-export", ["ctranslate2", "./missing_model", "out"], "missing_model"),
])
def test_every_command_refuses_a_missing_input_alike(name, argv, named, tmp_path):
    """Each console command stops on bad input the same way: exit status 2, one line `NAME: error: ...` naming the
    path, nothing written."""
    script = Path(sys.executable).parent / name
    if not script.exists():
        pytest.skip(f"{name} is not installed next to this Python")
    (tmp_path / "source.txt").write_text("A dog runs.\n")
    completed = subprocess.run([str(script), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert completed.stderr.startswith(f"{name}: error: ") and completed.stderr.count("\n") == 1, completed.stderr
    assert named in completed.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["source.txt"]


def test_a_path_that_starts_with_a_tilde_is_in_the_home_folder(memorised_model_folder, tmp_path, monkeypatch, capsys):
    """A `~` no shell expanded (a quoted flag, a recipe value, a Python argument) is the home folder for every command,
    as transformers takes it for output_dir: it was a Hub id error (translate), "not a folder" (average, export), or a
    folder named `~` in the working folder (prepared_data_dir)."""
    from conftest import MEMORISED_PAIRS

    from hf_relpos.publish import hub
    from hf_relpos.tools import average, export, translate

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    for name in ("model", "copy"):
        shutil.copytree(memorised_model_folder, home / name)
    (home / "src.txt").write_text("".join(source + "\n" for source, _ in MEMORISED_PAIRS[:2]), encoding="utf-8")
    translate.main(["~/model", "--input", "~/src.txt", "--output", "~/hyp.txt", "--no_progress"])
    assert (home / "hyp.txt").read_text(encoding="utf-8") == "".join(target + "\n" for _, target in MEMORISED_PAIRS[:2])
    average.main(["~/model", "~/copy", "--output_dir", "~/averaged"])
    assert (home / "averaged" / "model.safetensors").is_file()
    if importlib.util.find_spec("ctranslate2") is not None:
        export.main(["ctranslate2", "~/model", "~/ct2"])
        assert (home / "ct2" / "model.bin").is_file()
    shutil.copyfile(REPO / "configs" / "demo.yaml", home / "demo.yaml")
    hub.main(["render-cards", "~/demo.yaml", "--out", "~/cards"])
    assert (home / "cards" / "demo.md").is_file()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((REPO / "configs" / "demo.yaml").read_text(encoding="utf-8") + "prepared_data_dir: ~/prepared\n"
                      "train_file: ~/train.jsonl\ntokenizer_name: ~/model\nresume_from_checkpoint: ~/run/checkpoint-2\n",
                      encoding="utf-8")
    model_args, data_args, training_args = parse_arguments([str(recipe), "--output_dir", "~/run", "--do_train", "false",
                                                            "--model_name_or_path", "~/model"])
    assert (model_args.model_name_or_path, model_args.tokenizer_name) == (str(home / "model"), str(home / "model"))
    assert (data_args.prepared_data_dir, data_args.train_file) == (str(home / "prepared"), str(home / "train.jsonl"))
    assert (training_args.output_dir, training_args.resume_from_checkpoint) == (
        str(home / "run"), str(home / "run" / "checkpoint-2"))
    assert not (tmp_path / "~").exists()
    capsys.readouterr()


def test_an_unreachable_hub_model_is_one_error_without_retries(monkeypatch, tmp_path):
    """model_name_or_path or tokenizer_name naming a Hub model with no network: transformers' loaders retried for
    half a minute and ended in two lines; it is one request and one line naming the field."""
    unreachable_hub(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr("transformers.utils.hub.hf_hub_download",
                        lambda *args, **kwargs: pytest.fail("the loader asked the Hub (with its retries)"))
    for name in ("model_name_or_path", "tokenizer_name"):
        with pytest.raises(ConfigError, match=rf"^{name} 'x/y' is neither a local folder nor a Hub model in the local "
                                              r"cache, and the Hugging Face Hub cannot be reached \(ConnectionError: "):
            parse_arguments([str(REPO / "configs" / "demo.yaml"), f"--{name}", "x/y"])
