"""Fault injection for train_translation.py: killed and resumed runs, kills while writing, unusable output
folders, a failing rank, bad input, non-finite losses, and safetensors-only weights. See docs/reliability.md."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import yaml
from conftest import Killed, checkout_first_on_path, die_while_writing, run_killed_after_checkpoint
from safetensors.torch import load_file
from test_train_distributed import launch_within
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, TrainerState
from transformers.trainer_callback import CallbackHandler

import hf_relpos
import hf_relpos.publish.files as files_module
import hf_relpos.translation.final_model as final_model_module
import hf_relpos.translation.run_outputs as run_outputs_module
import hf_relpos.translation.safety as safety_module
import hf_relpos.translation.tokenizer_setup as tokenizer_setup_module
import hf_relpos.translation.training as training_module
from hf_relpos.publish.hub import render_recipe_cards
from hf_relpos.tools.average import main as average_main
from hf_relpos.tools.translate import main as translate_main
from hf_relpos.translation.arguments import ConfigError, TranslationTrainingArguments, parse_arguments
from hf_relpos.translation.checkpoints import (
    TRAINER_STATE_FILE,
    complete_checkpoints,
    is_complete_checkpoint,
    last_complete_checkpoint,
)
from hf_relpos.translation.data import DatasetSchemaError
from hf_relpos.translation.demo_corpus import write_demo_corpus
from hf_relpos.translation.model_setup import estimated_weight_bytes, required_disk_bytes
from hf_relpos.translation.preflight import check_run_file_names
from hf_relpos.translation.safety import (
    NonFiniteLossError,
    OutputDirError,
    TrainingStoppedError,
    check_output_dir,
    format_bytes,
)
from hf_relpos.translation.tokenization import train_joint_tokenizer
from hf_relpos.translation.trainer import TranslationTrainer
from hf_relpos.translation.training import main, run

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "train_translation.py"
Model = hf_relpos.RelPosTransformerForConditionalGeneration

TINY = {
    "model": {
        "position_scheme": "shaw", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
        "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
        "max_relative_position": 4, "dropout": 0.1,
    },
    "source_lang": "en", "target_lang": "de", "tokenizer_vocab_size": 456,
    "max_source_length": 48, "max_target_length": 48,
    "do_train": True, "do_eval": False, "do_predict": False,
    "max_tokens_per_batch": 300, "max_steps": 4,
    "learning_rate": 1.0e-3, "lr_scheduler_type": "inverse_sqrt", "warmup_steps": 3, "optim": "adamw_torch",
    "per_device_eval_batch_size": 8, "generation_num_beams": 2, "generation_max_length_offset": 4,
    "logging_steps": 1, "save_strategy": "no", "report_to": "none", "use_cpu": True, "seed": 7,
    "disable_tqdm": True, "cpu_threads": 1, "dataloader_pin_memory": False,
}
SUBPROCESS_ENV = dict(os.environ, PYTHONPATH=checkout_first_on_path(), TRANSFORMERS_VERBOSITY="error")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_demo_corpus(tmp_path_factory.mktemp("corpus"), 60, 6, 4, seed=5)


def write_config(path: Path, corpus: dict[str, Path], output_dir: Path, **overrides) -> Path:
    config = {**TINY, "train_file": str(corpus["train"]), "validation_file": str(corpus["validation"]),
              "test_file": str(corpus["test"]), "output_dir": str(output_dir), **overrides}
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


def write_jsonl(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"translation": {"en": en, "de": de}}, ensure_ascii=False) + "\n"
                            for en, de in pairs), encoding="utf-8")
    return path


def learning_rate_and_loss_per_step(output_dir: Path) -> list[tuple[int, float, float]]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [(entry["step"], entry["learning_rate"], entry["loss"]) for entry in state["log_history"] if "loss" in entry]


def assert_same_weights(expected_folder: Path, actual_folder: Path) -> None:
    expected = load_file(expected_folder / "model.safetensors")
    actual = load_file(actual_folder / "model.safetensors")
    assert actual.keys() == expected.keys()
    different = [name for name, tensor in expected.items() if not torch.equal(actual[name], tensor)]
    assert not different, f"tensors differ: {different}"


def assert_safetensors_only(folder: Path) -> None:
    assert (folder / "model.safetensors").is_file()
    assert not list(folder.glob("pytorch_model*")) and not list(folder.glob("*.bin.index.json"))


# --- kill and resume -----------------------------------------------------------------------------------------------

# Runs the real train_translation.py with each training step slowed down (numerics untouched), so that the test can
# SIGKILL it between two checkpoints.
SLOW_STEPS = '''
import runpy, sys, time
from hf_relpos.translation import trainer

original_training_step = trainer.TranslationTrainer.training_step

def training_step(self, *args, **kwargs):
    time.sleep(0.15)
    return original_training_step(self, *args, **kwargs)

trainer.TranslationTrainer.training_step = training_step
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def test_killed_run_resumes_to_bitwise_the_same_weights(tmp_path, corpus):
    """SIGKILL after checkpoint-5 is complete, resume with "last": same weights (torch.equal), same learning rate and
    loss at every step (the loss per step pins the data order and dropout), as the uninterrupted run."""
    common = {"max_steps": 15, "save_strategy": "steps", "save_steps": 5}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])

    config = write_config(tmp_path / "killed.yaml", corpus, tmp_path / "killed", **common)
    (tmp_path / "slow.py").write_text(SLOW_STEPS, encoding="utf-8")
    log = open(tmp_path / "killed.log", "w")
    process = subprocess.Popen([sys.executable, str(tmp_path / "slow.py"), str(SCRIPT), str(config)],
                               stdout=log, stderr=subprocess.STDOUT, env=SUBPROCESS_ENV, cwd=tmp_path)
    first_checkpoint = tmp_path / "killed" / "checkpoint-5"
    deadline = time.monotonic() + 120
    while not is_complete_checkpoint(first_checkpoint) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-3000:]
    log.close()
    assert is_complete_checkpoint(first_checkpoint)
    assert not (tmp_path / "killed" / "model.safetensors").exists(), "killed before the end of training"
    assert_safetensors_only(first_checkpoint)

    completed = subprocess.run([sys.executable, str(SCRIPT), str(config), "--resume_from_checkpoint", "last"],
                               capture_output=True, text=True, env=SUBPROCESS_ENV, cwd=tmp_path, timeout=180)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert_same_weights(tmp_path / "reference", tmp_path / "killed")
    resumed_log = learning_rate_and_loss_per_step(tmp_path / "killed")
    assert [step for step, _, _ in resumed_log] == list(range(1, 16))
    assert resumed_log == learning_rate_and_loss_per_step(tmp_path / "reference")
    for checkpoint in (tmp_path / "killed").glob("checkpoint-*"):
        assert_safetensors_only(checkpoint)


@pytest.mark.slow   # a run's persistent workers end when the next run frees them, after torch's 5 s join timeout
@pytest.mark.parametrize("batching", [{}, {"max_tokens_per_batch": None, "per_device_train_batch_size": 8}],
                         ids=["token-budget-batches", "batches-of-pairs"])
def test_a_run_with_persistent_loader_workers_resumes_to_bitwise_the_same_weights(tmp_path, corpus, monkeypatch,
                                                                                  batching):
    """A run whose loaders keep their worker process across epochs and evaluations
    (`dataloader_persistent_workers`), killed after checkpoint-3 and resumed, ends with the uninterrupted run's
    evaluations, learning rate and loss at every step, and weights, bitwise (dropout on, an evaluation every 3 steps,
    a second epoch from step 8 or 9). Opening a loader's iterator drew its workers' base seed from the global
    generator that dropout draws from: the uninterrupted run opened each loader once, the resumed run its evaluation
    loader and its training loader once more (after the one that skips the trained batches), and its dropout masks
    differed from then on."""
    common = {"max_steps": 9, "save_strategy": "steps", "save_steps": 3, "do_eval": True, "eval_strategy": "steps",
              "eval_steps": 3, "dataloader_num_workers": 1, "dataloader_persistent_workers": True, **batching}
    run([str(write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common))])
    config = write_config(tmp_path / "resumed.yaml", corpus, tmp_path / "resumed", **common)

    run_killed_after_checkpoint(monkeypatch, run, [str(config)], 3)
    run([str(config), "--resume_from_checkpoint", "last"])
    assert_trained_as_uninterrupted(tmp_path / "reference", tmp_path / "resumed")


# --- kill while writing --------------------------------------------------------------------------------------------

# Dies (os._exit, like a SIGKILL: no cleanup runs) while writing checkpoint-4's weights, leaving half a file.
DIE_WHILE_WRITING = '''
import os, runpy, sys
import transformers.modeling_utils as modeling_utils

original_save = modeling_utils.safe_save_file

def save_file(tensors, filename, *args, **kwargs):
    original_save(tensors, filename, *args, **kwargs)
    if "checkpoint-4" in str(filename):
        size = os.path.getsize(filename)
        with open(filename, "r+b") as handle:
            handle.truncate(size // 2)
        os._exit(137)

modeling_utils.safe_save_file = save_file
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def test_kill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, corpus):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=6, save_strategy="steps",
                          save_steps=2, save_total_limit=1)
    (tmp_path / "die.py").write_text(DIE_WHILE_WRITING, encoding="utf-8")
    completed = subprocess.run([sys.executable, str(tmp_path / "die.py"), str(SCRIPT), str(config)],
                               capture_output=True, text=True, env=SUBPROCESS_ENV, cwd=tmp_path, timeout=180)
    assert completed.returncode == 137, completed.stdout[-3000:] + completed.stderr[-3000:]
    output_dir = tmp_path / "out"
    previous, partial = output_dir / "checkpoint-2", output_dir / "checkpoint-4"
    assert partial.is_dir() and not is_complete_checkpoint(partial)
    assert is_complete_checkpoint(previous), "save_total_limit=1 must not delete it before checkpoint-4 is complete"
    assert last_complete_checkpoint(output_dir) == previous
    Model.from_pretrained(previous)
    with pytest.raises(Exception, match="deserializing header|incomplete|truncat"):
        Model.from_pretrained(partial)
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        run([str(config), "--resume_from_checkpoint", str(partial)])

    results = run([str(config), "--resume_from_checkpoint", "true"])  # picks checkpoint-2, rewrites checkpoint-4
    assert results["train"]["epoch"] > 0
    assert json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == 6
    assert [path.name for path in output_dir.glob("checkpoint-*")] == ["checkpoint-6"]
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(output_dir), Model)


def test_a_kill_while_a_resumed_run_rewrites_an_earlier_attempts_checkpoint_leaves_it_incomplete(tmp_path, corpus,
                                                                                               monkeypatch):
    """A run resumed from checkpoint-2 rewrites the checkpoint-4 an earlier attempt left: killed while writing its
    weights, checkpoint-4 must not count as complete through the earlier attempt's state file."""
    from transformers import Seq2SeqTrainer

    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=4, save_strategy="steps", save_steps=2,
                          do_eval=False, do_predict=False)
    run([str(config)])
    assert is_complete_checkpoint(output_dir / "checkpoint-4")

    save_checkpoint = Seq2SeqTrainer._save_checkpoint

    def killed_while_writing_the_weights(self, model, trial):
        if self.state.global_step == 4:
            (output_dir / "checkpoint-4" / "model.safetensors").write_bytes(b"cut sh")
            raise Killed
        return save_checkpoint(self, model, trial)

    monkeypatch.setattr(Seq2SeqTrainer, "_save_checkpoint", killed_while_writing_the_weights)
    with pytest.raises(Killed):
        run([str(config), "--resume_from_checkpoint", str(output_dir / "checkpoint-2")])
    assert not is_complete_checkpoint(output_dir / "checkpoint-4")
    assert last_complete_checkpoint(output_dir) == output_dir / "checkpoint-2"


def test_a_checkpoint_is_marked_complete_only_after_every_process_saved_its_random_state(tmp_path, corpus,
                                                                                          monkeypatch):
    """Each process saves its own rng_state file and the main process alone writes trainer_state.json (which makes
    the checkpoint complete): the processes wait for each other between the two, so a kill cannot leave a
    "complete" checkpoint without some process's random state."""
    from accelerate import Accelerator

    events = []
    save, wait, save_state = torch.save, Accelerator.wait_for_everyone, TrainerState.save_to_json

    def recording_save(obj, path, *args, **kwargs):
        if Path(str(path)).name.startswith("rng_state"):
            events.append("rng")
        return save(obj, path, *args, **kwargs)

    def recording_wait(self):
        events.append("wait")
        return wait(self)

    def recording_state(self, path):
        if Path(path).parent.name.startswith("checkpoint-"):
            events.append("state")
        return save_state(self, path)

    monkeypatch.setattr(torch, "save", recording_save)
    monkeypatch.setattr(Accelerator, "wait_for_everyone", recording_wait)
    monkeypatch.setattr(TrainerState, "save_to_json", recording_state)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=4, save_strategy="steps",
                          save_steps=2, do_eval=False, do_predict=False)
    run([str(config)])
    checkpoints = "".join(event[0] for event in events if event in ("rng", "state", "wait"))
    saves = [index for index, event in enumerate(checkpoints) if event == "r"]
    assert len(saves) == 2 and all("w" in checkpoints[start:checkpoints.index("s", start)] for start in saves), events


def test_trainer_resume_true_skips_an_incomplete_checkpoint(tmp_path, corpus):
    """`TranslationTrainer.train(resume_from_checkpoint=True)` (the Python API) also ignores a half-written one."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=2, save_strategy="steps",
                          save_steps=2)
    run([str(config)])
    partial = tmp_path / "out" / "checkpoint-9"
    partial.mkdir()
    (partial / "trainer_state.json").write_text('{"global_step": 9, "log_his')
    model_args, data_args, arguments = parse_arguments([str(config)])
    resumed_from = []
    trainer = TranslationTrainer(model=Model.from_pretrained(tmp_path / "out"), args=arguments, evaluation_sets={})
    trainer._load_from_checkpoint = lambda folder, *args: resumed_from.append(Path(folder).name)
    trainer._inner_training_loop = lambda *args, **kwargs: None
    trainer.train(resume_from_checkpoint=True)
    assert resumed_from == ["checkpoint-2"]


def test_kill_while_writing_the_final_model_never_leaves_a_mixed_folder(tmp_path, corpus, monkeypatch):
    """The final model is written to a staging folder, then moved in file by file with the weights removed first
    and moved last. A crash while writing leaves no loadable model in a fresh output_dir, and the previous model
    untouched in a reused one (a run resumed to train further); a crash while moving leaves a folder that does not
    load."""
    import transformers.modeling_utils as modeling_utils

    original_save = modeling_utils.safe_save_file

    def crash_while_writing(tensors, filename, *args, **kwargs):
        original_save(tensors, filename, *args, **kwargs)
        with open(filename, "r+b") as handle:
            handle.truncate(os.path.getsize(filename) // 2)
        raise KeyboardInterrupt("simulated kill while writing the final model")

    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=2)
    with monkeypatch.context() as patch:
        patch.setattr(modeling_utils, "safe_save_file", crash_while_writing)
        with pytest.raises(KeyboardInterrupt):
            run([str(config)])
    assert not (output_dir / "config.json").exists() and not (output_dir / "model.safetensors").exists()
    assert_does_not_load(output_dir)

    run([str(config), "--save_strategy", "steps", "--save_steps", "2"])
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(output_dir), Model)
    assert not (output_dir / ".final-model-staging").exists()
    previous = load_file(output_dir / "model.safetensors")

    train_further = [str(config), "--max_steps", "3", "--resume_from_checkpoint", "last"]
    with monkeypatch.context() as patch:
        patch.setattr(modeling_utils, "safe_save_file", crash_while_writing)
        with pytest.raises(KeyboardInterrupt):
            run(train_further)
    reloaded = Model.from_pretrained(output_dir).state_dict()
    assert all(torch.equal(reloaded[name], tensor) for name, tensor in previous.items() if name in reloaded)

    original_replace = os.replace
    moved = []

    def crash_while_moving(source, destination):
        if Path(destination).parent == output_dir:   # a move out of the staging folder, not a write inside it
            if len(moved) == 1:
                raise KeyboardInterrupt("simulated kill while moving the final model in")
            moved.append(destination)
        original_replace(source, destination)

    with monkeypatch.context() as patch:
        patch.setattr(safety_module.os, "replace", crash_while_moving)
        with pytest.raises(KeyboardInterrupt):
            run(train_further)
    assert not (output_dir / "model.safetensors").exists()
    assert_does_not_load(output_dir)


def assert_does_not_load(folder: Path) -> None:
    with pytest.raises(OSError, match="no config.json|no file named model.safetensors"):
        Model.from_pretrained(folder)
    with pytest.raises((OSError, ValueError), match="config.json|model.safetensors"):
        AutoModelForSeq2SeqLM.from_pretrained(folder)


def test_a_replaced_final_model_never_keeps_the_previous_ones_record_card_or_scores(tmp_path, corpus, monkeypatch):
    """A resumed run killed after its new final model is in place but before it has scored and recorded it (here:
    while predicting) leaves a model without a record, card, scores or translations, never the new weights beside the
    record, card and scores of the model they replaced (which a push would publish as this model's); the metrics it
    wrote since are its own."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=2, do_predict=True,
                          save_strategy="steps", save_steps=2)
    run([str(config), "--average_checkpoints", "1"])
    previous = load_file(output_dir / "model.safetensors")
    described = ["run_record.json", "README.md", "test_results.json", "test_hypotheses.txt",
                 "averaged_checkpoints.json"]
    assert all((output_dir / name).is_file() for name in described)

    def killed_while_predicting(*args, **kwargs):
        raise KeyboardInterrupt("simulated kill while predicting")

    with monkeypatch.context() as patch:
        patch.setattr(TranslationTrainer, "predict", killed_while_predicting)
        with pytest.raises(KeyboardInterrupt, match="simulated kill"):
            run([str(config), "--max_steps", "3", "--resume_from_checkpoint", "last"])
    replaced = load_file(output_dir / "model.safetensors")
    assert any(not torch.equal(replaced[name], tensor) for name, tensor in previous.items())
    assert [name for name in described if (output_dir / name).exists()] == []
    assert json.loads((output_dir / TRAINER_STATE_FILE).read_text())["global_step"] == 3
    assert "test_bleu" not in json.loads((output_dir / "all_results.json").read_text())


def test_a_fresh_run_leaves_no_record_of_the_run_it_replaces(tmp_path, corpus, monkeypatch):
    """A run started afresh (`overwrite_output_dir`) over a finished one and killed before its own record is written
    leaves no record of the old run beside its checkpoints: hf-relpos-average would describe their average with it."""
    output_dir, averaged = tmp_path / "out", tmp_path / "averaged"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=2, save_strategy="steps", save_steps=2)
    run([str(config)])
    assert json.loads((output_dir / "run_record.json").read_text())["learning_rate"] == 1.0e-3

    def killed_before_the_final_model(*args, **kwargs):
        raise KeyboardInterrupt("simulated kill before the final model")

    with monkeypatch.context() as patch:
        patch.setattr(training_module, "save_final_model", killed_before_the_final_model)
        with pytest.raises(KeyboardInterrupt, match="simulated kill"):
            run([str(config), "--overwrite_output_dir", "true", "--learning_rate", "5e-4"])
    assert not (output_dir / "run_record.json").exists()
    average_main([str(output_dir), "--last_n", "1", "--output_dir", str(averaged)])
    assert not (averaged / "run_record.json").exists()



@contextlib.contextmanager
def sigterm_in_step_3(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Within the block, a SIGTERM arrives during training step 3, its JIT checkpoint requested at once (transformers'
    `CheckpointManager` waits 3 s for a SIGKILL to follow by default)."""
    from transformers.trainer_jit_checkpoint import CheckpointManager

    monkeypatch.setattr(CheckpointManager.__init__, "__defaults__", (0,))
    original_training_step = TranslationTrainer.training_step

    def sigterm_at_step_3(self, *args, **kwargs):
        if self.state.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)   # the handler's timer marks the checkpoint as requested
        return original_training_step(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(TranslationTrainer, "training_step", sigterm_at_step_3)
        yield


def test_a_run_stopped_by_sigterm_keeps_its_checkpoint_and_writes_no_final_model(tmp_path, corpus, monkeypatch,
                                                                                   capsys):
    """With `enable_jit_checkpoint` a SIGTERM (a scheduler ending the allocation) makes the Trainer save a checkpoint
    and stop; the run then ends with one error naming the checkpoint and how to resume, exit status 143, and writes no
    final model, scores, card or record that would present the stopped run as a finished one. Resumed, it finishes."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=6, do_predict=True,
                          enable_jit_checkpoint=True)
    with sigterm_in_step_3(monkeypatch), pytest.raises(SystemExit) as exit_info:
        main([str(config)])
    assert exit_info.value.code == 143
    checkpoint = last_complete_checkpoint(output_dir)
    assert checkpoint is not None and 2 <= int(checkpoint.name.removeprefix("checkpoint-")) < 6
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(error_lines) == 1 and re.fullmatch(
        rf"train_translation.py: error: training was stopped by SIGTERM at step \d+ \(enable_jit_checkpoint\): "
        rf"{checkpoint.name} is saved, .*; continue with --resume_from_checkpoint last", error_lines[0]), error_lines
    assert [path.name for path in output_dir.iterdir() if path.name in ("model.safetensors", "config.json",
            "run_record.json", "README.md", "test_results.json", "test_hypotheses.txt")] == []
    assert run([str(config), "--resume_from_checkpoint", "last"])["train"]["train_steps"] == 6
    assert json.loads((output_dir / "run_record.json").read_text())["steps"] == 6


def test_a_run_stopped_by_sigterm_resumes_to_bitwise_the_same_weights(tmp_path, corpus, monkeypatch):
    """The checkpoint of a SIGTERM noticed within step 3 is step 3's, saved once the step is taken and logged, as a
    regular one: resumed, the run ends with the uninterrupted run's weights, learning rate and loss at every step
    (dropout on). transformers saved checkpoint-2 before step 3's optimizer step, with the random state past step 3's
    dropout masks, and the resumed run redid step 3 with other masks."""
    common = {"max_steps": 5, "enable_jit_checkpoint": True}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in_step_3(monkeypatch), pytest.raises(TrainingStoppedError):
        run([str(config)])
    stopped_at = last_complete_checkpoint(tmp_path / "stopped").name
    run([str(config), "--resume_from_checkpoint", "last"])
    assert_same_weights(tmp_path / "reference", tmp_path / "stopped")
    assert learning_rate_and_loss_per_step(tmp_path / "stopped") == learning_rate_and_loss_per_step(
        tmp_path / "reference")
    assert stopped_at == "checkpoint-3"


@pytest.mark.parametrize("stop_step", [0, 7], ids=["before-the-first-step", "at-an-epoch-start"])
def test_a_sigterm_before_the_first_step_of_an_epoch_resumes_to_bitwise_the_same_weights(tmp_path, corpus,
                                                                                         monkeypatch, stop_step):
    """A SIGTERM noticed before the first step of an epoch (of the run: checkpoint-0; of its second epoch, 7 steps in:
    checkpoint-7, off the save schedule) is checkpointed with the random state of the epoch's start, where the
    Trainer restores a checkpoint's state when it resumes at an epoch start (before it opens the epoch's batches):
    resumed, the run ends with the uninterrupted run's weights, learning rate and loss at every step. The checkpoint
    held the state past the seed that opening the batches drew from it (when the training loader had no generator of
    its own), and the resumed run's dropout masks differed from its first step on."""
    common = {"max_steps": 9, "enable_jit_checkpoint": True, "save_strategy": "steps", "save_steps": 2}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "get_batch_samples", stop_step), pytest.raises(
            TrainingStoppedError, match=f"checkpoint-{stop_step} is saved"):
        run([str(config)])
    run([str(config), "--resume_from_checkpoint", "last"])
    assert learning_rate_and_loss_per_step(tmp_path / "stopped") == learning_rate_and_loss_per_step(
        tmp_path / "reference")
    assert_same_weights(tmp_path / "reference", tmp_path / "stopped")


def test_a_sigterm_in_a_step_with_an_evaluation_due_is_checkpointed_at_once_without_evaluating(tmp_path, corpus,
                                                                                               monkeypatch):
    """An evaluation (translations generated) may outlast the time a scheduler leaves after its SIGTERM: step 3, with
    an evaluation due, is checkpointed after its log entry and the evaluation left out; resumed, the run makes that
    evaluation before step 4 and ends as the uninterrupted run (as in the tests below)."""
    common = {"max_steps": 5, "enable_jit_checkpoint": True, "eval_strategy": "steps", "eval_steps": 3}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in_step_3(monkeypatch), pytest.raises(TrainingStoppedError):
        run([str(config)])
    checkpoint = last_complete_checkpoint(tmp_path / "stopped")
    state = json.loads((checkpoint / TRAINER_STATE_FILE).read_text())
    assert checkpoint.name == "checkpoint-3" and not [entry for entry in state["log_history"] if "eval_loss" in entry]
    run([str(config), "--resume_from_checkpoint", "last"])
    assert_trained_as_uninterrupted(tmp_path / "reference", tmp_path / "stopped")


def test_a_sigterm_mid_epoch_under_the_epoch_strategies_is_neither_evaluated_nor_saved_again(tmp_path, corpus,
                                                                                             monkeypatch):
    """Stopped by a SIGTERM in step 3 of an epoch of 7, the Trainer still ran its epoch end, where eval_strategy and
    save_strategy epoch (the Multi30k recipes') evaluated (translations generated, after the SIGTERM) and saved
    checkpoint-3 over again, its log now holding that evaluation. The checkpoint is now the step's, and nothing
    follows it."""
    evaluated_at = []
    evaluate = TranslationTrainer.evaluate

    def noting_evaluate(self, *args, **kwargs):
        evaluated_at.append(self.state.global_step)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(TranslationTrainer, "evaluate", noting_evaluate)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=20, enable_jit_checkpoint=True,
                          eval_strategy="epoch", save_strategy="epoch")
    with sigterm_in_step_3(monkeypatch), pytest.raises(TrainingStoppedError):
        run([str(config)])
    checkpoint = last_complete_checkpoint(tmp_path / "out")
    state = json.loads((checkpoint / TRAINER_STATE_FILE).read_text())
    assert checkpoint.name == "checkpoint-3" and state["epoch"] < 1
    assert evaluated_at == [] and not [entry for entry in state["log_history"] if "eval_loss" in entry]


def test_a_sigterm_in_the_last_step_leaves_a_finished_run(tmp_path, corpus, monkeypatch):
    """A SIGTERM whose checkpoint the Trainer saves in the run's last step stops nothing: training has reached
    max_steps, so the run saves its final model, scores and record as any finished run does (reporting it stopped
    would leave no model, and the resume it names is refused: the checkpoint has trained all max_steps)."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=3, do_predict=True,
                          enable_jit_checkpoint=True)
    with sigterm_in_step_3(monkeypatch):
        results = run([str(config)])
    assert results["train"]["train_steps"] == 3 and "test" in results
    assert last_complete_checkpoint(output_dir) is not None   # the Trainer's SIGTERM checkpoint
    assert json.loads((output_dir / "run_record.json").read_text())["steps"] == 3
    assert (output_dir / "model.safetensors").is_file() and (output_dir / "test_results.json").is_file()


@contextlib.contextmanager
def sigterm_in(monkeypatch: pytest.MonkeyPatch, method: str, step: int) -> Iterator[list[int]]:
    """Within the block, a SIGTERM arrives in the first call of `TranslationTrainer.<method>` once `step` steps are
    taken, its JIT checkpoint requested at once (as in `sigterm_in_step_3`); yields the steps taken at each later call
    of the method."""
    from transformers.trainer_jit_checkpoint import CheckpointManager

    monkeypatch.setattr(CheckpointManager.__init__, "__defaults__", (0,))
    original = getattr(TranslationTrainer, method)
    sent, later_calls = [], []

    def sigterm_once(self, *args, **kwargs):
        if sent:
            later_calls.append(self.state.global_step)
        elif self.state.global_step == step:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)   # the handler's timer marks the checkpoint as requested
        return original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(TranslationTrainer, method, sigterm_once)
        yield later_calls
    assert sent, f"no call of {method} after step {step}"


def steps_at_each_call(patch: pytest.MonkeyPatch, method: str) -> list[int]:
    """The steps taken at each call of `TranslationTrainer.<method>` from now on."""
    original, steps = getattr(TranslationTrainer, method), []

    def noting(self, *args, **kwargs):
        steps.append(self.state.global_step)
        return original(self, *args, **kwargs)

    patch.setattr(TranslationTrainer, method, noting)
    return steps


def test_a_sigterm_during_a_checkpoint_save_stops_before_the_next_step_without_saving_again(tmp_path, corpus,
                                                                                         monkeypatch):
    """A SIGTERM noticed between two steps, here while checkpoint-2 is saved, ends the run before step 3 with that
    checkpoint. transformers' handler, at step 3's start, saved checkpoint-2 again, whole (more time after the
    SIGTERM, for a large model the scheduler's whole wait), then trained step 3, thrown away, and the error named
    step 3. Resumed, the run ends with the uninterrupted run's weights, learning rate and loss at every step."""
    common = {"max_steps": 5, "enable_jit_checkpoint": True, "save_strategy": "steps", "save_steps": 2}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with monkeypatch.context() as patch:
        saved_at, trained_from = steps_at_each_call(patch, "_save_checkpoint"), steps_at_each_call(patch, "training_step")
        ended_at = []   # every callback's end of training (TensorBoard closes its writer, the progress bar ends)
        end_training = CallbackHandler.on_train_end
        patch.setattr(CallbackHandler, "on_train_end",
                      lambda handler, args, state, control: ended_at.append(state.global_step)
                      or end_training(handler, args, state, control))
        with sigterm_in(patch, "_save_checkpoint", 2), pytest.raises(
                TrainingStoppedError, match=r"at step 2 \(enable_jit_checkpoint\): checkpoint-2 is saved"):
            run([str(config)])
    assert saved_at == [2] and trained_from == [0, 1] and ended_at == [2]
    run([str(config), "--resume_from_checkpoint", "last"])
    assert_same_weights(tmp_path / "reference", tmp_path / "stopped")
    assert learning_rate_and_loss_per_step(tmp_path / "stopped") == learning_rate_and_loss_per_step(
        tmp_path / "reference")


def test_a_sigterm_before_a_resumed_runs_first_step_leaves_the_checkpoint_it_resumed_from_as_it_is(tmp_path, corpus,
                                                                                                     monkeypatch):
    """A resumed run stopped before its first step (a job preempted again while it loads) has trained nothing since
    the checkpoint it resumed from, which holds that step: it stops with that checkpoint, without saving it again.
    A second save would spend the scheduler's wait after the SIGTERM rewriting the run's newest complete checkpoint,
    incomplete from its first moment (its trainer_state.json goes first), so a SIGKILL then would lose it."""
    common = {"max_steps": 5, "enable_jit_checkpoint": True, "save_strategy": "steps", "save_steps": 2}
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "_save_checkpoint", 2), pytest.raises(TrainingStoppedError):
        run([str(config)])
    state_file = tmp_path / "stopped" / "checkpoint-2" / TRAINER_STATE_FILE
    written = state_file.read_bytes(), state_file.stat().st_mtime_ns
    with monkeypatch.context() as patch:
        saved_at, trained_from = steps_at_each_call(patch, "_save_checkpoint"), steps_at_each_call(patch, "training_step")
        with sigterm_in(patch, "_load_rng_state", 2), pytest.raises(
                TrainingStoppedError, match=r"at step 2 \(enable_jit_checkpoint\): checkpoint-2 is saved"):
            run([str(config), "--resume_from_checkpoint", "last"])
    assert saved_at == [] and trained_from == []
    assert (state_file.read_bytes(), state_file.stat().st_mtime_ns) == written


@pytest.mark.parametrize("strategy, stop_step", [("steps", 2), ("epoch", 7)])
def test_a_sigterm_during_an_evaluation_in_training_stops_it_at_the_next_batch(tmp_path, corpus, monkeypatch,
                                                                               strategy, stop_step):
    """An evaluation in training (beam search over the validation set: minutes on a real one) outlasts the time a
    scheduler leaves after its SIGTERM: one noticed during it, at step 2 (eval_steps 2) or at the end of the first
    epoch (7 steps, eval_strategy and save_strategy epoch), stops it at the next batch and checkpoints the step
    without it, with the random state the evaluation began with. It ran to its end before (the checkpoint request
    was noticed when the next step began). Resumed, the run makes the evaluation again before the next step and ends
    with the uninterrupted run's evaluations, weights, learning rate and loss at every step."""
    common = {"max_steps": 9, "enable_jit_checkpoint": True, "eval_strategy": strategy, "eval_steps": 2,
              "save_strategy": "no" if strategy == "steps" else "epoch", "per_device_eval_batch_size": 2}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "prediction_step", stop_step) as later_batches, pytest.raises(
            TrainingStoppedError, match=rf"at step {stop_step} .*: checkpoint-{stop_step} is saved"):
        run([str(config)])
    assert later_batches == []   # of the validation set's 3 batches
    state = json.loads((tmp_path / "stopped" / f"checkpoint-{stop_step}" / TRAINER_STATE_FILE).read_text())
    assert not [entry for entry in state["log_history"] if "eval_loss" in entry]
    run([str(config), "--resume_from_checkpoint", "last"])
    assert_trained_as_uninterrupted(tmp_path / "reference", tmp_path / "stopped")


def assert_trained_as_uninterrupted(reference: Path, resumed: Path) -> None:
    """A run stopped and resumed in `resumed` logged the evaluations (timings aside), learning rates and losses of the
    uninterrupted run in `reference`, and ended with its weights, bitwise."""
    assert evaluations_but_timings(resumed) == evaluations_but_timings(reference)
    assert learning_rate_and_loss_per_step(resumed) == learning_rate_and_loss_per_step(reference)
    assert_same_weights(reference, resumed)


def evaluations_but_timings(output_dir: Path) -> list[dict]:
    """The evaluations in output_dir's trainer_state.json log, without their run-dependent timing fields."""
    state = json.loads((output_dir / TRAINER_STATE_FILE).read_text())
    timings = {field.format(prefix="eval") for field in RUN_DEPENDENT_METRICS}
    return [{name: value for name, value in entry.items() if name not in timings}
            for entry in state["log_history"] if "eval_loss" in entry]


@pytest.mark.parametrize("method, stop_step, stopped_at", [
    ("training_step", 1, 2), ("prediction_step", 2, 2), ("prediction_step", 0, 0), ("training_step", 2, 3)],
    ids=["in-the-step", "in-its-evaluation", "in-eval-on-start", "in-a-step-without-an-evaluation"])
def test_a_run_resumed_from_a_sigterm_checkpoint_that_left_its_evaluation_out_makes_it_and_ends_as_uninterrupted(
        tmp_path, corpus, monkeypatch, method, stop_step, stopped_at):
    """A SIGTERM in step 2, whose evaluation is due (eval_steps 2), or during that evaluation, or during eval_on_start's
    at step 0, checkpoints the step without it. The resumed run makes that evaluation before its first step, from the
    checkpoint's random state (the one the evaluation began with), as the uninterrupted run made it: the same
    evaluations at the same steps with the same scores, the same best checkpoint (step 2's, the best by
    greater_is_better on the loss, of load_best_model_at_end), early stopping at the same step (6 of 8), the same
    final model, scores, record and card, the same checkpoints (and the SIGTERM's). It went on from step 3 without it
    (early stopping and the best checkpoint went by the other evaluations) and with other dropout masks after step 2
    (the evaluation draws from the random state). The Trainer's eval_on_start evaluated at the start of every resumed
    run, also from a checkpoint (3) that owes none."""
    common = {"max_steps": 8, "eval_strategy": "steps", "eval_steps": 2, "eval_on_start": True,
              "load_best_model_at_end": True, "metric_for_best_model": "loss", "greater_is_better": True,
              "early_stopping_patience": 2, "per_device_eval_batch_size": 2, "do_eval": True}
    output_dir, reference = tmp_path / "out", tmp_path / "reference"
    command = requeued_job_command(tmp_path, corpus, output_dir, **common)
    expected = run(command)
    output_dir.rename(reference)
    with sigterm_in(monkeypatch, method, stop_step), pytest.raises(
            TrainingStoppedError, match=rf"checkpoint-{stopped_at} is saved"):
        run(command)
    state = json.loads((output_dir / f"checkpoint-{stopped_at}" / TRAINER_STATE_FILE).read_text())
    assert not [entry for entry in state["log_history"] if entry["step"] == stopped_at and "eval_loss" in entry]
    finished = run(command)

    final = {folder: json.loads((folder / TRAINER_STATE_FILE).read_text()) for folder in (reference, output_dir)}
    assert [entry["step"] for entry in evaluations_but_timings(reference)] == [0, 2, 4, 6]
    assert evaluations_but_timings(output_dir) == evaluations_but_timings(reference)
    assert [(Path(state["best_model_checkpoint"]).name, state["best_metric"], state["global_step"])
            for state in final.values()] == [("checkpoint-2", final[reference]["best_metric"], 6)] * 2
    assert learning_rate_and_loss_per_step(output_dir) == learning_rate_and_loss_per_step(reference)
    assert sorted(path.name for path in output_dir.glob("checkpoint-*")) == sorted(
        {*(path.name for path in reference.glob("checkpoint-*")), f"checkpoint-{stopped_at}"})
    assert_finished_as_uninterrupted(output_dir, reference, finished, expected, steps=6,
                                     resumed_from=f"checkpoint-{stopped_at}")
    # the resumed run's checkpoints save the run's arguments, eval_on_start included
    assert torch.load(output_dir / "checkpoint-6" / "training_args.bin", weights_only=False).eval_on_start


def test_a_sigterm_during_the_evaluation_a_resumed_run_owes_stops_it_and_the_next_resume_makes_it_again(
        tmp_path, corpus, monkeypatch):
    """A resumed run stopped by a SIGTERM during the evaluation its checkpoint owes (step 2's, left out by a SIGTERM in
    step 2) stops at that evaluation's next batch, trains nothing and leaves the checkpoint as it is (not saved
    again: rewriting it would leave the run's newest complete checkpoint incomplete meanwhile); the next resume makes
    the evaluation again and the run ends as the uninterrupted one (evaluations, learning rate and loss per step,
    weights)."""
    common = {"max_steps": 5, "enable_jit_checkpoint": True, "eval_strategy": "steps", "eval_steps": 2,
              "per_device_eval_batch_size": 2}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "training_step", 1), pytest.raises(TrainingStoppedError, match="checkpoint-2"):
        run([str(config)])
    state_file = tmp_path / "stopped" / "checkpoint-2" / TRAINER_STATE_FILE
    written = state_file.read_bytes(), state_file.stat().st_mtime_ns
    with monkeypatch.context() as patch:
        saved_at = steps_at_each_call(patch, "_save_checkpoint")
        trained_from = steps_at_each_call(patch, "training_step")
        with sigterm_in(patch, "prediction_step", 2) as later_batches, pytest.raises(
                TrainingStoppedError, match=r"at step 2 \(enable_jit_checkpoint\): checkpoint-2 is saved"):
            run([str(config), "--resume_from_checkpoint", "last"])
    assert saved_at == trained_from == later_batches == []
    assert (state_file.read_bytes(), state_file.stat().st_mtime_ns) == written
    run([str(config), "--resume_from_checkpoint", "last"])
    assert [entry["step"] for entry in evaluations_but_timings(tmp_path / "reference")] == [2, 4, 5]
    assert_trained_as_uninterrupted(tmp_path / "reference", tmp_path / "stopped")


def test_the_evaluation_a_resumed_run_owes_steps_reduce_lr_on_plateau_as_the_uninterrupted_runs_did(tmp_path, corpus,
                                                                                                   monkeypatch):
    """Under lr_scheduler_type reduce_lr_on_plateau the scheduler steps on each evaluation's metric: the evaluation
    a SIGTERM in step 2 left out, made by the resumed run, steps it, and the scheduler saved in checkpoint-4 is the
    uninterrupted run's (two steps taken, the same best); the run ends with its learning rates and weights."""
    common = {"max_steps": 6, "enable_jit_checkpoint": True, "eval_strategy": "steps", "eval_steps": 2,
              "save_strategy": "steps", "save_steps": 2, "per_device_eval_batch_size": 2,
              "lr_scheduler_type": "reduce_lr_on_plateau", "metric_for_best_model": "loss"}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "training_step", 1), pytest.raises(TrainingStoppedError, match="checkpoint-2"):
        run([str(config)])
    run([str(config), "--resume_from_checkpoint", "last"])
    schedulers = [torch.load(folder / "checkpoint-4" / "scheduler.pt", weights_only=True)
                  for folder in (tmp_path / "reference", tmp_path / "stopped")]
    assert schedulers[0]["last_epoch"] == 2 and schedulers[1] == schedulers[0]
    assert learning_rate_and_loss_per_step(tmp_path / "stopped") == learning_rate_and_loss_per_step(
        tmp_path / "reference")
    assert_same_weights(tmp_path / "reference", tmp_path / "stopped")


@pytest.mark.parametrize("stop_step, limit", [(7, 3), (5, None)])
def test_a_sigterm_checkpoint_neither_enters_the_average_nor_rotates_a_checkpoint_it_needs_away(
        tmp_path, corpus, monkeypatch, stop_step, limit):
    """With average_checkpoints 3 of checkpoints saved every 2 steps, a SIGTERM in step 7 (or 5) adds a checkpoint at
    that step, off the schedule. The resumed run's final model is bitwise the uninterrupted run's, the mean of
    checkpoints 4, 6 and 8: the SIGTERM checkpoint is not averaged in place of one of them (it was: 6, 7, 8 or 5, 6,
    8), and under save_total_limit 3 it takes no slot of the rotation, so checkpoint-4 is not deleted (it was, when
    checkpoint-8 was saved, leaving 6, 7 and 8), and it is deleted itself once the resumed run has saved checkpoint-8,
    the output folder then holding the uninterrupted run's checkpoints. Without a limit nothing is deleted."""
    common = {"max_steps": 8, "enable_jit_checkpoint": True, "save_strategy": "steps", "save_steps": 2,
              "save_total_limit": limit, "average_checkpoints": 3}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "training_step", stop_step - 1), pytest.raises(
            TrainingStoppedError, match=rf"at step {stop_step} .*: checkpoint-{stop_step} is saved"):
        run([str(config)])
    run([str(config), "--resume_from_checkpoint", "last"])
    averaged = json.loads((tmp_path / "reference" / "averaged_checkpoints.json").read_text())
    assert averaged["checkpoints"] == ["checkpoint-4", "checkpoint-6", "checkpoint-8"]
    assert json.loads((tmp_path / "stopped" / "averaged_checkpoints.json").read_text()) == averaged
    assert_same_weights(tmp_path / "reference", tmp_path / "stopped")
    kept = sorted(path.name for path in (tmp_path / "stopped").glob("checkpoint-*"))
    if limit is None:   # transformers keeps every checkpoint, and so the SIGTERM's
        assert kept == sorted(["checkpoint-2", "checkpoint-4", f"checkpoint-{stop_step}", "checkpoint-6",
                               "checkpoint-8"])
    else:
        assert kept == sorted(path.name for path in (tmp_path / "reference").glob("checkpoint-*"))


def test_rotation_deletes_a_checkpoint_off_the_schedule_only_past_the_limit_and_never_a_folder_named_otherwise(
        tmp_path):
    """Under save_total_limit 3 of checkpoints every 2 steps, a checkpoint off the schedule (checkpoint-3: a
    SIGTERM's, or an earlier run's at another save_steps) stays while the folder holds no more than 3 checkpoints,
    as transformers' rotation kept it, and goes first, before any on the schedule, once it holds more; a user's copy
    named otherwise (checkpoint-2-backup) is never deleted by the rotation."""
    def save(name: str, step: int, at: int) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))
        os.utime(folder, (at, at))
        return folder

    trainer = type("Trainer", (), {"state": TrainerState(), "saves_on_schedule": staticmethod(lambda step: step % 2 == 0)})
    for at, step in enumerate((2, 3, 4)):
        save(f"checkpoint-{step}", step, 1000 + 10 * at)
    save("checkpoint-2-backup", 2, 1005)
    TranslationTrainer._rotate_checkpoints(trainer, str(tmp_path), 3)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "checkpoint-2", "checkpoint-2-backup", "checkpoint-3", "checkpoint-4"]
    save("checkpoint-6", 6, 1030)
    TranslationTrainer._rotate_checkpoints(trainer, str(tmp_path), 3)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "checkpoint-2", "checkpoint-2-backup", "checkpoint-4", "checkpoint-6"]


def test_under_save_strategy_epoch_a_sigterm_checkpoint_neither_enters_the_average_nor_takes_a_slot(tmp_path, corpus,
                                                                                                     monkeypatch):
    """The same under save_strategy epoch (the Multi30k recipes'; epochs of 7 steps here): checkpoints at the epoch
    ends 7 and 14 and at max_steps 16 are averaged, the SIGTERM's checkpoint-10 neither averaged nor kept."""
    common = {"max_steps": 16, "enable_jit_checkpoint": True, "save_strategy": "epoch", "save_total_limit": 3,
              "average_checkpoints": 3}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "training_step", 9), pytest.raises(TrainingStoppedError, match="checkpoint-10"):
        run([str(config)])
    run([str(config), "--resume_from_checkpoint", "last"])
    averaged = json.loads((tmp_path / "reference" / "averaged_checkpoints.json").read_text())
    assert averaged["checkpoints"] == ["checkpoint-7", "checkpoint-14", "checkpoint-16"]
    assert json.loads((tmp_path / "stopped" / "averaged_checkpoints.json").read_text()) == averaged
    assert_same_weights(tmp_path / "reference", tmp_path / "stopped")
    assert sorted(path.name for path in (tmp_path / "stopped").glob("checkpoint-*")) == sorted(
        path.name for path in (tmp_path / "reference").glob("checkpoint-*"))


def test_a_sigterm_checkpoint_takes_no_slot_of_the_best_and_newest_under_load_best_model_at_end(tmp_path, corpus,
                                                                                                 monkeypatch):
    """Under load_best_model_at_end and save_total_limit 2 the rotation keeps the best checkpoint and the newest, as
    transformers does, and a SIGTERM checkpoint (step 7, of checkpoints every 2 steps) takes neither slot: the resumed
    run keeps the uninterrupted run's checkpoints, records the same best one and ends with its weights. The best is
    the highest validation loss (greater_is_better), that of the first evaluation: an old checkpoint to keep."""
    common = {"max_steps": 8, "enable_jit_checkpoint": True, "save_strategy": "steps", "save_steps": 2,
              "eval_strategy": "steps", "eval_steps": 2, "save_total_limit": 2, "load_best_model_at_end": True,
              "metric_for_best_model": "loss", "greater_is_better": True, "per_device_eval_batch_size": 2}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "training_step", 6), pytest.raises(TrainingStoppedError, match="checkpoint-7"):
        run([str(config)])
    run([str(config), "--resume_from_checkpoint", "last"])
    best = {name: Path(json.loads((tmp_path / name / TRAINER_STATE_FILE).read_text())["best_model_checkpoint"]).name
            for name in ("reference", "stopped")}
    kept = {name: sorted(path.name for path in (tmp_path / name).glob("checkpoint-*"))
            for name in ("reference", "stopped")}
    assert best == {"reference": "checkpoint-2", "stopped": "checkpoint-2"}
    assert kept == {"reference": ["checkpoint-2", "checkpoint-8"], "stopped": ["checkpoint-2", "checkpoint-8"]}
    assert_same_weights(tmp_path / "reference", tmp_path / "stopped")


def test_a_sigterm_checkpoint_after_an_evaluation_off_the_save_schedule_never_becomes_the_best(tmp_path, corpus,
                                                                                               monkeypatch):
    """Under load_best_model_at_end with an evaluation every step and a checkpoint every 2, the best evaluation is
    step 1's (greater_is_better on the loss), which has no checkpoint: transformers keeps best_model_checkpoint among
    the checkpoints saved, none here, and the uninterrupted run ends with its last weights. A SIGTERM noticed after
    step 1's evaluation saves checkpoint-1, off the save schedule, which transformers made the best checkpoint: the
    resumed run loaded it as its final model. It is not made the best; the resumed run ends with the uninterrupted
    run's weights, best checkpoint (none) and checkpoints."""
    common = {"max_steps": 4, "enable_jit_checkpoint": True, "save_strategy": "steps", "save_steps": 2,
              "eval_strategy": "steps", "eval_steps": 1, "save_total_limit": 2, "load_best_model_at_end": True,
              "metric_for_best_model": "loss", "greater_is_better": True, "per_device_eval_batch_size": 4}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "_determine_best_metric", 1), pytest.raises(
            TrainingStoppedError, match="at step 1 .*checkpoint-1 is saved"):
        run([str(config)])
    state = json.loads((tmp_path / "stopped" / "checkpoint-1" / TRAINER_STATE_FILE).read_text())
    assert state["best_global_step"] == 1 and state["best_model_checkpoint"] is None
    run([str(config), "--resume_from_checkpoint", "last"])
    final = {name: json.loads((tmp_path / name / TRAINER_STATE_FILE).read_text()) for name in ("reference", "stopped")}
    assert [(state["best_global_step"], state["best_model_checkpoint"]) for state in final.values()] == [(1, None)] * 2
    assert sorted(path.name for path in (tmp_path / "stopped").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert_same_weights(tmp_path / "reference", tmp_path / "stopped")


def test_a_run_that_trains_nothing_leaves_sigterm_to_end_it(tmp_path, corpus, monkeypatch):
    """enable_jit_checkpoint saves a checkpoint of training; a run that only scores a model (do_train false) has none
    to save, and a SIGTERM ends it as it would without the setting (the Trainer's handler, installed when it is built
    and restored only when training ends, would leave the signal ignored for the rest of the process)."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, do_predict=True)
    run([str(config)])
    with sigterm_ends_the_process_in(monkeypatch, TranslationTrainer, "predict"):
        run([str(config), "--do_train", "false", "--model_name_or_path", str(output_dir),
             "--enable_jit_checkpoint", "true"])


# --- a requeued job: the same command at every start ---------------------------------------------------------------

FROM_STEP_0 = "no checkpoint to resume from was found in output_dir"


def warnings_of_a_start_from_step_0(capfd: pytest.CaptureFixture[str]) -> list[str]:
    printed = capfd.readouterr()
    return [line.split(": ", 1)[1] for line in (printed.out + printed.err).splitlines() if FROM_STEP_0 in line]


def test_a_requeued_job_runs_the_same_resume_last_command_at_every_start(tmp_path, corpus, monkeypatch, capfd):
    """A job that its scheduler requeues (SLURM --requeue) reruns the same command at each start. At its first,
    output_dir does not exist yet: `--resume_from_checkpoint last` trains from step 0 (it was an error: no
    checkpoint), with one warning naming output_dir; stopped there by a SIGTERM (enable_jit_checkpoint), the same
    command resumes from the checkpoint and ends with bitwise the weights, learning rates and losses of an
    uninterrupted run."""
    common = {"max_steps": 5, "enable_jit_checkpoint": True}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    output_dir = tmp_path / "job"
    command = [str(write_config(tmp_path / "job.yaml", corpus, output_dir, **common)), "--resume_from_checkpoint",
               "last"]
    capfd.readouterr()
    with sigterm_in_step_3(monkeypatch), pytest.raises(SystemExit) as exit_info:
        main(command)
    assert exit_info.value.code == 143
    assert warnings_of_a_start_from_step_0(capfd) == [
        f"resume_from_checkpoint=last: {FROM_STEP_0} {output_dir} (it does not exist yet): training from step 0"]
    assert last_complete_checkpoint(output_dir) == output_dir / "checkpoint-3"
    assert run(command)["train"]["train_steps"] == 5
    assert warnings_of_a_start_from_step_0(capfd) == []
    assert json.loads((output_dir / "run_record.json").read_text())["resumed_from"] == "checkpoint-3"
    assert_same_weights(tmp_path / "reference", output_dir)
    assert learning_rate_and_loss_per_step(output_dir) == learning_rate_and_loss_per_step(tmp_path / "reference")


def test_resume_last_after_a_kill_in_the_first_checkpoint_save_trains_from_step_0_and_rewrites_it(tmp_path, corpus,
                                                                                                   capfd):
    """Killed while writing its first checkpoint (checkpoint-2's weights cut short, no trainer_state.json), a run
    leaves nothing to resume: `--resume_from_checkpoint true` (as `last`) trains from step 0 with one warning naming
    the incomplete folder, and its save at step 2 rewrites that folder whole: complete, loading, and holding the
    uninterrupted run's step-2 weights, as the final model holds its last ones. A rerun without the flag is still
    refused (it says neither resume nor start again)."""
    common = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, **common)
    (tmp_path / "die.py").write_text(DIE_WHILE_WRITING.replace("checkpoint-4", "checkpoint-2"), encoding="utf-8")
    completed = subprocess.run([sys.executable, str(tmp_path / "die.py"), str(SCRIPT), str(config)],
                               capture_output=True, text=True, env=SUBPROCESS_ENV, cwd=tmp_path, timeout=180)
    assert completed.returncode == 137, completed.stdout[-3000:] + completed.stderr[-3000:]
    partial = output_dir / "checkpoint-2"
    assert [path.name for path in output_dir.glob("checkpoint-*")] == ["checkpoint-2"]
    assert (partial / "model.safetensors").is_file() and not is_complete_checkpoint(partial)
    with pytest.raises(OutputDirError, match="already holds a trained model or checkpoints"):
        run([str(config)])
    capfd.readouterr()
    run([str(config), "--resume_from_checkpoint", "true"])
    assert warnings_of_a_start_from_step_0(capfd) == [
        f"resume_from_checkpoint=true: {FROM_STEP_0} {output_dir} (incomplete, their writing cut short: "
        "checkpoint-2): training from step 0"]
    assert [path.name for path in output_dir.glob("checkpoint-*") if is_complete_checkpoint(path)] == [
        "checkpoint-2", "checkpoint-4"]
    Model.from_pretrained(partial)
    assert_same_weights(tmp_path / "reference" / "checkpoint-2", partial)
    assert_same_weights(tmp_path / "reference", output_dir)
    assert json.loads((output_dir / "run_record.json").read_text())["resumed_from"] is None


def test_resume_last_takes_up_what_a_run_stopped_before_training_left(tmp_path, corpus, capfd):
    """A run stopped before its Trainer was built leaves the tokenizer and the prepared data (`prepare_only` stops
    there, given `last` or not: it trains nothing, so it warns of no start from step 0), which is also all that the
    main process of a launch writes before the other processes decide what `last` means: `--resume_from_checkpoint
    last` trains from step 0 on them (one warning), reusing the tokenizer as a run without the flag does, and records
    a run from the start."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=2)
    capfd.readouterr()
    run([str(config), "--prepare_only", "true", "--resume_from_checkpoint", "last"])   # it trains nothing: no warning
    assert warnings_of_a_start_from_step_0(capfd) == []
    assert (output_dir / "tokenizer.json").is_file() and (output_dir / "prepared_data").is_dir()
    run([str(config), "--resume_from_checkpoint", "last"])
    printed = capfd.readouterr()
    assert "Reusing the tokenizer saved in" in printed.out and "Training a joint BPE tokenizer" not in printed.out
    assert [line.split(": ", 1)[1] for line in printed.out.splitlines() if FROM_STEP_0 in line] == [
        f"resume_from_checkpoint=last: {FROM_STEP_0} {output_dir} (it holds none): training from step 0"]
    record = json.loads((output_dir / "run_record.json").read_text())
    assert record["resumed_from"] is None and record["trained_as"] == str(config) and record["steps"] == 2


def test_resume_last_still_refuses_where_a_run_from_step_0_would_replace_a_model(tmp_path, corpus, capfd):
    """Without a complete checkpoint, `last` trains from step 0 only where that loses nothing: beside a finished model
    (saved without checkpoints) it is one error naming the model's files, and nothing is written; a checkpoint named
    by its path stays strict (a missing folder is an error), and so does `last` in a run that trains nothing."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1)
    run([str(config)])
    before = {path.name: path.read_bytes() for path in output_dir.iterdir() if path.is_file()}
    with pytest.raises(ConfigError) as error:
        run([str(config), "--resume_from_checkpoint", "last"])
    assert str(error.value) == (
        f"resume_from_checkpoint=last: no checkpoint-<step> folder in {output_dir} is complete, and it holds a trained "
        f"model (model.safetensors, config.json), which a run from step 0 would replace: score it with --do_train "
        f"false, train on from it with --model_name_or_path {output_dir} (into another output_dir), or train from "
        "scratch with --overwrite_output_dir true (without --resume_from_checkpoint)")
    assert {path.name: path.read_bytes() for path in output_dir.iterdir() if path.is_file()} == before
    with pytest.raises(ConfigError, match=r"resume_from_checkpoint: '.*checkpoint-7' is not a folder"):
        run([str(config), "--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint",
             str(tmp_path / "new" / "checkpoint-7")])
    with pytest.raises(ConfigError, match="no checkpoint-<step> folder in .* is complete$"):
        run([str(config), "--output_dir", str(tmp_path / "scores"), "--resume_from_checkpoint", "last",
             "--do_train", "false", "--do_predict", "true", "--model_name_or_path", str(output_dir)])
    assert not (tmp_path / "new").exists() and not (tmp_path / "scores").exists()
    assert FROM_STEP_0 not in capfd.readouterr().out


class Terminated(Exception):
    """What a SIGTERM raises in the tests below (`sigterm_ends_the_process_in`), in place of ending the process."""


@contextlib.contextmanager
def sigterm_ends_the_process_in(monkeypatch: pytest.MonkeyPatch, target: object, name: str) -> Iterator[None]:
    """Within the block, a SIGTERM arrives in the first call of `target.<name>` and ends the run at once,
    as it ends the process after training (the Trainer's SIGTERM handler is gone once training ends): the signal's
    default action, which would end pytest too, is replaced by `Terminated`."""
    def terminated(signum, frame):
        raise Terminated

    def sigterm(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        raise AssertionError("the SIGTERM did not end the run")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(target, name, sigterm)
            with pytest.raises(Terminated):
                yield
        assert signal.getsignal(signal.SIGTERM) is terminated, "the Trainer's handler was left in place"
    finally:
        signal.signal(signal.SIGTERM, previous)


# What differs between two runs of one command by its nature: when it ran, and how long its training took (the
# finishing run records the training time of the run it finishes, whose segment trained). `prepared_from` differs in
# its "reused" flags alone (compared apart): the finishing run reused the data that the stopped run prepared.
RUN_DEPENDENT_RECORD_FIELDS = {"date", "training_seconds", "prepared_from"}
# (the finishing run prepares its model for evaluation, which training prepared in the uninterrupted one: timed too)
RUN_DEPENDENT_METRICS = {"{prefix}_runtime", "{prefix}_samples_per_second", "{prefix}_steps_per_second",
                         "{prefix}_model_preparation_time"}


def metrics_but_timings(path: Path, prefix: str) -> dict:
    metrics = json.loads(path.read_text())
    return {name: value for name, value in metrics.items()
            if name not in {field.format(prefix=prefix) for field in RUN_DEPENDENT_METRICS}}


def card_but_training_time(path: Path) -> str:
    return re.sub(r"Training time: [0-9.]+ (minutes|seconds)", "Training time: T", path.read_text(encoding="utf-8"))


def assert_finished_as_uninterrupted(output_dir: Path, reference: Path, finished: dict, expected: dict,
                                     steps: int, resumed_from: str | None = None,
                                     reference_resumed_from: str | None = None) -> dict:
    """A run finished by `--resume_from_checkpoint last` (`finished`: its metrics; output_dir) scored, recorded and
    carded as the uninterrupted run (`expected`; reference) but for the run-dependent record fields, with its
    weights, trained `steps` steps, its training resumed from `resumed_from` (the reference's from
    `reference_resumed_from`); returns its record."""
    assert finished.keys() == expected.keys() == {"train", "eval", "test"}
    assert finished["train"].keys() == expected["train"].keys() and finished["train"]["train_steps"] == steps
    for prefix in ("eval", "test"):
        assert metrics_but_timings(output_dir / f"{prefix}_results.json", prefix) == metrics_but_timings(
            reference / f"{prefix}_results.json", prefix)
        assert (output_dir / f"{prefix}_hypotheses.txt").read_text() == (
            reference / f"{prefix}_hypotheses.txt").read_text()
    record, uninterrupted = (json.loads((folder / "run_record.json").read_text()) for folder in (output_dir, reference))
    assert record.keys() == uninterrupted.keys()
    differing = {name for name in record if name != "resumed_from" and record[name] != uninterrupted[name]}
    assert differing <= RUN_DEPENDENT_RECORD_FIELDS, {name: (record[name], uninterrupted[name]) for name in differing}
    assert record["steps"] == steps
    assert (record["resumed_from"], uninterrupted["resumed_from"]) == (resumed_from, reference_resumed_from)
    for split, source in record["prepared_from"].items():
        assert source == {**uninterrupted["prepared_from"][split], "reused": True}
    cards = [card_but_training_time(folder / "README.md") for folder in (output_dir, reference)]
    if resumed_from != reference_resumed_from:   # which the card names, twice
        cards = [re.sub(r", resumed from `[^`]*`| \(the segment resumed from `[^`]*`; the time before it is not "
                        r"recorded\)", "", card) for card in cards]
    assert cards[0] == cards[1]
    assert_same_weights(reference, output_dir)
    return record


def requeued_job_command(tmp_path: Path, corpus: dict[str, Path], output_dir: Path, **overrides) -> list[str]:
    """The command a requeued job runs at every start, of the finishing tests: 4 steps, a checkpoint every 2,
    predicting, SIGTERM checkpoints, `--resume_from_checkpoint last` (`overrides` on top)."""
    settings = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2, "do_predict": True,
                "enable_jit_checkpoint": True, **overrides}
    config = write_config(tmp_path / "job.yaml", corpus, output_dir, **settings)
    return [str(config), "--resume_from_checkpoint", "last"]


@pytest.mark.parametrize("method", ["predict", "evaluate"])
@pytest.mark.parametrize("segment", ["first", "resumed", "averaged", "faded"])
def test_a_requeued_job_stopped_after_training_is_finished_by_the_same_command(tmp_path, corpus, monkeypatch,
                                                                                method, segment):
    """A SIGTERM after the last step (here in the final prediction or evaluation, which on WMT outlast a scheduler's
    wait) ends the process at once, leaving the final model and its training report without scores, card or record.
    The requeued job's same command (`--resume_from_checkpoint last`) then finishes the run without training: it
    scores the final model saved there and writes the record and card that the command run uninterrupted writes, field
    by field (but the date and the training time, here the stopped run's, whose training segment it records) with
    the same scores, translations and weights; `resumed_from` names the checkpoint the training segment resumed from
    (a run that trained from step 0, or one resumed from checkpoint-3 after a SIGTERM in step 3). The model scored is
    the one saved: the average of the last two checkpoints (`average_checkpoints`), or weights trained to a faded
    absolute position scale (`fade_absolute_positions`), which comes back with them. all_results.json, of either run,
    merges the training metrics without `train_resumed_from` (train_results.json's alone)."""
    settings = {"averaged": {"average_checkpoints": 2},
                "faded": {"fade_absolute_positions": 8, "model": {**TINY["model"], "keep_absolute_positions": True}}}
    output_dir, reference = tmp_path / "out", tmp_path / "reference"
    command = requeued_job_command(tmp_path, corpus, output_dir, do_eval=True, **settings.get(segment, {}))

    def first_segment() -> None:
        if segment == "resumed":   # stopped by a SIGTERM in step 3: resumed from checkpoint-3
            with sigterm_in_step_3(monkeypatch), pytest.raises(TrainingStoppedError):
                run(command)

    first_segment()
    expected = run(command)
    output_dir.rename(reference)
    first_segment()
    with sigterm_ends_the_process_in(monkeypatch, TranslationTrainer, method):
        run(command)
    assert not (output_dir / "run_record.json").exists() and not (output_dir / "README.md").exists()
    assert (output_dir / "model.safetensors").is_file()
    evaluated = []
    with monkeypatch.context() as patch:
        training_steps = steps_at_each_call(patch, "training_step")
        original_evaluate = TranslationTrainer.evaluate
        patch.setattr(TranslationTrainer, "evaluate",
                      lambda self, *args, **kwargs: evaluated.append(1) or original_evaluate(self, *args, **kwargs))
        finished = run(command)
    assert training_steps == [] and evaluated == [1], "not trained again; evaluated once, as the run asks"

    assert finished.keys() == expected.keys() == {"train", "eval", "test"}
    saved = json.loads((output_dir / "train_results.json").read_text())
    assert finished["train"] == {name: value for name, value in saved.items() if name != "train_resumed_from"}
    assert saved["train_resumed_from"] == ("checkpoint-3" if segment == "resumed" else None)
    for folder in (output_dir, reference):   # the key is train_results.json's, for the finishing run, not a metric
        combined = json.loads((folder / "all_results.json").read_text())
        assert "train_resumed_from" not in combined and set(finished["train"]) <= combined.keys()
    resumed_from = "checkpoint-3" if segment == "resumed" else None
    record = assert_finished_as_uninterrupted(output_dir, reference, finished, expected, steps=4,
                                              resumed_from=resumed_from, reference_resumed_from=resumed_from)
    for prefix in ("eval", "test"):
        assert finished[prefix][f"{prefix}_bleu"] == expected[prefix][f"{prefix}_bleu"]
        assert finished[prefix][f"{prefix}_chrf"] == expected[prefix][f"{prefix}_chrf"]
    uninterrupted = json.loads((reference / "run_record.json").read_text())
    assert record["prepared_from"].keys() == uninterrupted["prepared_from"].keys() == {"train", "validation", "test"}
    assert record["training_seconds"] == json.loads((output_dir / "train_results.json").read_text())["train_runtime"]
    assert (output_dir / "config.json").read_text() == (reference / "config.json").read_text()
    if segment == "averaged":
        assert json.loads((output_dir / "averaged_checkpoints.json").read_text())["checkpoints"] == [
            "checkpoint-2", "checkpoint-4"]
    if segment == "faded":
        assert json.loads((output_dir / "config.json").read_text())["absolute_positions_scale"] == 0.5


@pytest.mark.parametrize("save_steps", [1, 2], ids=["checkpoint-at-the-stop", "checkpoint-before-the-stop"])
def test_a_requeued_job_that_early_stopping_ended_is_finished_by_the_same_command(tmp_path, corpus, monkeypatch,
                                                                                  save_steps):
    """Early stopping ends training at step 3 of 6 (`early_stopping_patience` reached); a SIGTERM in the final
    prediction ends the process, leaving the final model and training report without record. The requeued job's same
    command (`--resume_from_checkpoint last`) finishes it without training, as it finishes a run that trained all its
    steps: record and card of the uninterrupted run, field by field (but date, training time and prepared data
    reused). The step training ended at is the trainer state's of output_dir (3), not the newest checkpoint's: a
    save on the stop step (checkpoint-3) or not (checkpoint-2, saved before it)."""
    output_dir, reference = tmp_path / "out", tmp_path / "reference"
    command = [str(write_config(tmp_path / "job.yaml", corpus, output_dir, early_stopping_patience=2,
                                early_stopping_threshold=100, eval_strategy="steps", eval_steps=1,
                                save_strategy="steps", save_steps=save_steps, do_eval=True, do_predict=True,
                                enable_jit_checkpoint=True)), "--resume_from_checkpoint", "last"]
    expected = run(command)
    assert TrainerState.load_from_json(str(reference.parent / "out" / "trainer_state.json")).global_step == 3
    output_dir.rename(reference)
    with sigterm_ends_the_process_in(monkeypatch, TranslationTrainer, "predict"):
        run(command)
    assert not (output_dir / "run_record.json").exists() and (output_dir / "model.safetensors").is_file()
    assert last_complete_checkpoint(str(output_dir)).name == f"checkpoint-{3 // save_steps * save_steps}"
    with monkeypatch.context() as patch:
        training_steps = steps_at_each_call(patch, "training_step")
        finished = run(command)
    assert training_steps == [], "not trained again"
    record = assert_finished_as_uninterrupted(output_dir, reference, finished, expected, steps=3)
    assert record["early_stopping_patience"] == 2


@pytest.mark.parametrize("ending", ["all-steps", "early-stopping"])
def test_a_requeued_job_stopped_after_training_before_its_first_checkpoint_is_finished_by_the_same_command(
        tmp_path, corpus, monkeypatch, ending):
    """A run that saved no checkpoint (`save_strategy: no`; or early stopping ended it, at step 3, before its first
    save) and was ended by a SIGTERM in its final prediction keeps its final model and training report without
    record. The requeued job's same command (`--resume_from_checkpoint last`) finishes it without training, as it
    finishes a run with checkpoints: the step training ended at is that of output_dir's trainer state (the report's),
    and the record and card are the uninterrupted run's (but date, training time and prepared data reused). It was
    refused as a folder holding a trained model that a run from step 0 would replace."""
    settings = {"all-steps": {"save_strategy": "no"},
                "early-stopping": {"save_strategy": "steps", "save_steps": 10, "early_stopping_patience": 2,
                                   "early_stopping_threshold": 100, "eval_strategy": "steps", "eval_steps": 1}}[ending]
    output_dir, reference = tmp_path / "out", tmp_path / "reference"
    command = requeued_job_command(tmp_path, corpus, output_dir, do_eval=True, **settings)
    expected = run(command)
    steps = 4 if ending == "all-steps" else 3
    assert TrainerState.load_from_json(str(output_dir / "trainer_state.json")).global_step == steps
    assert last_complete_checkpoint(output_dir) is None
    output_dir.rename(reference)
    with sigterm_ends_the_process_in(monkeypatch, TranslationTrainer, "predict"):
        run(command)
    assert not (output_dir / "run_record.json").exists() and (output_dir / "model.safetensors").is_file()
    with monkeypatch.context() as patch:
        training_steps = steps_at_each_call(patch, "training_step")
        finished = run(command)
    assert training_steps == [], "not trained again"
    assert_finished_as_uninterrupted(output_dir, reference, finished, expected, steps=steps)
    assert not list(output_dir.glob("checkpoint-*"))


def test_a_run_ended_while_saving_its_final_model_is_not_finished_by_resume_last(tmp_path, corpus, monkeypatch):
    """A run ended after its last step, while it saved its final model (or before its training report, which says
    the model is whole, was written) cannot be finished from it: `--resume_from_checkpoint last` stays one error,
    saying so and what to do, and changes nothing."""
    output_dir = tmp_path / "out"
    command = requeued_job_command(tmp_path, corpus, output_dir)
    with sigterm_ends_the_process_in(monkeypatch, final_model_module, "move_folder_contents"):
        run(command)
    assert last_complete_checkpoint(output_dir) == output_dir / "checkpoint-4"
    assert not (output_dir / "model.safetensors").exists()
    before = folder_contents(output_dir)
    with pytest.raises(ConfigError) as error:
        run(command)
    checkpoint = output_dir / "checkpoint-4"
    assert str(error.value) == (
        f"resume_from_checkpoint: {str(checkpoint)!r} has already trained max_steps=4 (step 4, epoch "
        f"{json.loads((checkpoint / TRAINER_STATE_FILE).read_text())['epoch']:g}), and the run's final model or its "
        f"training report in {output_dir} was not written to the end (no train_results.json and trainer_state.json "
        "of step 4 there: the run was ended while saving them), so the run cannot be finished from them: train it "
        "again with --overwrite_output_dir true (without --resume_from_checkpoint), raise max_steps to train on, or "
        f"score {str(checkpoint)!r} with --do_train false --model_name_or_path {checkpoint} into another output_dir")
    assert folder_contents(output_dir) == before


def test_a_stopped_run_whose_training_report_predates_train_resumed_from_is_refused_for_what_it_is(tmp_path, corpus,
                                                                                                   monkeypatch):
    """A run stopped after training whose train_results.json was written by an hf_relpos version before
    `train_resumed_from` (its final model and report whole) cannot be finished by `--resume_from_checkpoint last`:
    the error says so, not that the run was ended while saving them, and changes nothing; adding the key, as it
    says, lets the same command finish the run."""
    output_dir = tmp_path / "out"
    command = requeued_job_command(tmp_path, corpus, output_dir)
    with sigterm_ends_the_process_in(monkeypatch, TranslationTrainer, "predict"):
        run(command)
    results = output_dir / "train_results.json"
    old_report = json.loads(results.read_text())
    del old_report["train_resumed_from"]   # as report_training wrote it before 2d12f24
    results.write_text(json.dumps(old_report, indent=4, sort_keys=True) + "\n")
    before = folder_contents(output_dir)
    with pytest.raises(ConfigError) as error:
        run(command)
    checkpoint = output_dir / "checkpoint-4"
    assert str(error.value) == (
        f"resume_from_checkpoint: {str(checkpoint)!r} has already trained max_steps=4 (step 4, epoch "
        f"{json.loads((checkpoint / TRAINER_STATE_FILE).read_text())['epoch']:g}), and the run's final model and "
        f"training report of step 4 in {output_dir} are there, but its train_results.json was written by an earlier "
        "version of hf_relpos, without \"train_resumed_from\" (the checkpoint its training resumed from, which the "
        "record of the finished run names), so the run cannot be finished from it: add \"train_resumed_from\": null "
        "(its training started at step 0) or the checkpoint's name (\"checkpoint-<step>\") to "
        f"{results} and run the same command again, or score the final model with --do_train false "
        f"--model_name_or_path {output_dir} (no run record is written)")
    assert folder_contents(output_dir) == before
    results.write_text(json.dumps({**old_report, "train_resumed_from": None}, indent=4, sort_keys=True) + "\n")
    run(command)
    assert json.loads((output_dir / "run_record.json").read_text())["resumed_from"] is None


def test_a_stopped_run_is_finished_on_a_disk_without_room_for_the_checkpoints_it_no_longer_writes(tmp_path, corpus,
                                                                                                   monkeypatch):
    """The run that finishes a stopped one (`finished_training`) trains nothing: it writes scores, translations, the
    record and card, no model and no checkpoint. Its output_dir check asks for no room for them: on a disk that the
    stopped run's checkpoints have filled (here 1 KB free, far below the final model and checkpoints a run from
    step 0 asks for), the same `--resume_from_checkpoint last` command still finishes it."""
    output_dir = tmp_path / "out"
    command = requeued_job_command(tmp_path, corpus, output_dir, save_total_limit=2)
    with sigterm_ends_the_process_in(monkeypatch, TranslationTrainer, "predict"):
        run(command)
    assert not (output_dir / "run_record.json").exists()
    monkeypatch.setattr(safety_module.shutil, "disk_usage", lambda path: DiskUsage(10**6, 10**6 - 1000, 1000))
    finished = run(command)
    assert finished["train"]["train_steps"] == 4 and "test" in finished
    assert json.loads((output_dir / "run_record.json").read_text())["steps"] == 4
    with pytest.raises(OutputDirError, match=r"only 1\.0 KB free on its disk, but the run needs about"):
        run([*command[:1], "--output_dir", str(tmp_path / "other"), *command[1:]])   # a run that trains: refused


def test_a_run_ended_in_its_push_has_its_record_and_is_not_finished_again_by_resume_last(tmp_path, corpus,
                                                                                          monkeypatch):
    """`push_to_hub` pushes after the run record and card are written (record_run): a SIGTERM in the push leaves a
    run that has finished, with its record, and `--resume_from_checkpoint last` refuses it as any finished run (it
    does not push again: the folder is pushed again by hand, docs/hub.md)."""
    output_dir = tmp_path / "out"
    command = [*requeued_job_command(tmp_path, corpus, output_dir), "--push_to_hub", "true"]
    monkeypatch.setattr(training_module, "check_hub_login", lambda token: "someone")
    with sigterm_ends_the_process_in(monkeypatch, run_outputs_module, "push_training_output"):
        run(command)
    assert (output_dir / "run_record.json").is_file() and (output_dir / "README.md").is_file()
    with pytest.raises(ConfigError, match=r"has already trained max_steps=4 \(step 4, epoch [\d.]+\): raise max_steps "
                                          "to train on, or score the run's model with --do_train false$"):
        run(command)


@pytest.mark.parametrize("name", ["test_hypotheses.txt", "test_results.json", "all_results.json"])
def test_kill_while_writing_a_runs_scores_keeps_the_previous_file(tmp_path, corpus, monkeypatch, name):
    """A run killed while it writes its translations or scores leaves the previous file whole (never one cut short
    that looks finished, or a JSON file that the next run's merge into all_results.json or the card fails on), and
    the next run goes through."""
    output_dir = tmp_path / "out"
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=2, do_predict=True)
    run([str(config)])
    before = (output_dir / name).read_text(encoding="utf-8")
    score_again = [str(config), "--do_train", "false", "--model_name_or_path", str(output_dir)]
    with monkeypatch.context() as patch:
        die_while_writing(patch, output_dir / name)
        with pytest.raises(KeyboardInterrupt, match="simulated kill"):
            run(score_again)
    assert (output_dir / name).read_text(encoding="utf-8") == before
    assert run(score_again)["test"]["test_samples"] == 4


def test_kill_while_rendering_a_recipe_card_keeps_the_previous_card(tmp_path, monkeypatch):
    """`python -m hf_relpos.publish.hub render-cards` killed while it writes a card leaves the previous card whole."""
    card = tmp_path / "demo.md"
    render_recipe_cards([REPO / "configs" / "demo.yaml"], tmp_path)
    card.write_text(card.read_text(encoding="utf-8") + "rendered before\n", encoding="utf-8")
    before = card.read_text(encoding="utf-8")
    with monkeypatch.context() as patch:
        die_while_writing(patch, card)
        with pytest.raises(KeyboardInterrupt, match="simulated kill"):
            render_recipe_cards([REPO / "configs" / "demo.yaml"], tmp_path)
    assert card.read_text(encoding="utf-8") == before


def test_kill_while_writing_the_trainer_state_leaves_none(tmp_path, corpus, monkeypatch):
    """output_dir/trainer_state.json (which a resumed run reads for early stopping) is whole or absent after a kill
    while the Trainer writes it."""
    output_dir = tmp_path / "out"
    with monkeypatch.context() as patch:
        die_while_writing(patch, output_dir / TRAINER_STATE_FILE)
        with pytest.raises(KeyboardInterrupt, match="simulated kill"):
            run([str(write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=2))])
    assert (output_dir / "model.safetensors").is_file()   # killed after the final model, in save_state
    assert not (output_dir / TRAINER_STATE_FILE).exists()


# --- output folder -------------------------------------------------------------------------------------------------


def test_output_dir_under_a_file_is_one_error_before_data_is_read(tmp_path, corpus):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    config = write_config(tmp_path / "c.yaml", corpus, blocker / "out", train_file=str(tmp_path / "missing.jsonl"))
    with pytest.raises(OutputDirError, match=re.escape(f"{str(blocker)!r} is a file, not a folder")):
        run([str(config)])
    completed = subprocess.run([sys.executable, str(SCRIPT), str(config)], capture_output=True, text=True,
                               env=SUBPROCESS_ENV, cwd=tmp_path, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip().startswith("train_translation.py: error: output_dir ")
    assert "is a file, not a folder" in completed.stderr


@pytest.mark.parametrize("kind", ["folder", "link_to_nothing"])
@pytest.mark.parametrize("name", ["test_results.json", "config.json", "README.md"])
def test_a_folder_where_the_run_writes_a_file_is_one_error_before_training(tmp_path, corpus, name, kind):
    """A folder in output_dir named as a file the run writes: config.json failed with IsADirectoryError after the
    whole training; test_results.json or README.md (a previous model's scores, card) was deleted with its contents
    when the final model replaced them. A link to nothing named README.md (or config.json) was let through and the
    card failed with FileNotFoundError after the training. Now the run names it before anything is written. A fresh
    run (overwrite_output_dir) removes it with the rest of the previous run, as before."""
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    if kind == "folder":
        (output_dir / name).mkdir()
    else:
        (output_dir / name).symlink_to(f"missing/{name}")
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1)
    described = "a folder" if kind == "folder" else "an entry that is not a file"
    with pytest.raises(OutputDirError, match=re.escape(f"output_dir {str(output_dir)!r} holds {described} {name!r} "
                                                       "where the run writes a file")):
        run([str(config)])
    assert sorted(path.name for path in output_dir.iterdir()) == [name]
    run([str(config), "--overwrite_output_dir", "true"])
    assert not (output_dir / name).is_dir() and not (output_dir / name).is_symlink()
    assert (output_dir / "train_results.json").is_file()


@pytest.mark.parametrize("kind", ["file", "link_to_nothing"])
@pytest.mark.parametrize("name", ["checkpoint-1", ".final-model-staging"])
def test_a_file_where_the_run_writes_a_folder_is_one_error_before_training(tmp_path, corpus, name, kind):
    """A file, or a link to nothing (a checkpoint moved to another disk), in output_dir named as a folder the run
    writes (checkpoint-<step>, the final model's staging): the run trained, then failed with a NotADirectoryError or
    FileExistsError traceback at its first save. Now the run names it before anything is written; a fresh run
    (overwrite_output_dir) removes it with the rest of the previous run. A file of another name
    (checkpoint-1-notes.txt) is not refused."""
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    if kind == "file":
        (output_dir / name).write_text("mine\n")
    else:
        (output_dir / name).symlink_to(tmp_path / "moved" / name)
    (output_dir / "checkpoint-1-notes.txt").write_text("mine\n")
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1, save_strategy="steps", save_steps=1)
    described = "a file" if kind == "file" else "an entry that is not a folder"
    with pytest.raises(OutputDirError, match=re.escape(f"output_dir {str(output_dir)!r} holds {described} {name!r} "
                                                       "where the run writes a folder")):
        run([str(config)])
    assert sorted(path.name for path in output_dir.iterdir()) == sorted([name, "checkpoint-1-notes.txt"])
    (output_dir / name).unlink()
    check_run_file_names(output_dir, training=True)   # checkpoint-1-notes.txt alone passes
    (output_dir / name).write_text("mine\n")
    run([str(config), "--overwrite_output_dir", "true"])
    assert (output_dir / "checkpoint-1").is_dir()


@pytest.mark.parametrize("resume", [False, True])
def test_a_readme_in_an_output_dir_without_a_run_is_one_error_before_training(tmp_path, corpus, resume):
    """output_dir holding a README.md of its own (output_dir '.' in a project, a folder of notes) but no trained model
    or checkpoints: the run trained and then deleted it for its model card. Now the run names it before anything is
    written (also with resume_from_checkpoint last, which finds nothing to resume and trains from step 0); a fresh run
    (overwrite_output_dir) removes it with the rest of the folder's previous run, as before."""
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / "README.md").write_text("my notes on this experiment\n")
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, max_steps=1)
    flags = ["--resume_from_checkpoint", "last"] if resume else []
    with pytest.raises(OutputDirError, match=re.escape(f"output_dir {str(output_dir)!r} holds a README.md but no "
                                                       "trained model or checkpoints")):
        run([str(config), *flags])
    assert sorted(path.name for path in output_dir.iterdir()) == ["README.md"]
    assert (output_dir / "README.md").read_text() == "my notes on this experiment\n"
    run([str(config), "--overwrite_output_dir", "true"])
    assert (output_dir / "README.md").read_text().startswith("---\n")   # the run's card


def test_read_only_output_dir_is_detected(tmp_path, monkeypatch):
    """A folder without write permission (when not root), else one on which file creation fails as on a read-only
    mount: the probe's OSError is reported before training."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            def read_only_mkdtemp(*args, **kwargs):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))

            monkeypatch.setattr("tempfile.mkdtemp", read_only_mkdtemp)
        with pytest.raises(OutputDirError, match="is not writable: cannot create files in"):
            check_output_dir(folder / "out")
    finally:
        folder.chmod(0o700)


def test_full_disk_while_probing_is_detected(tmp_path, monkeypatch):
    def full_disk_write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", full_disk_write)
    with pytest.raises(OutputDirError, match=r"is not writable: cannot create files in .*No space left on device"):
        check_output_dir(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_preflight_probe_leaves_nothing_behind(tmp_path):
    check_output_dir(tmp_path / "new" / "out")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "existing").mkdir()
    check_output_dir(tmp_path / "existing")
    assert list((tmp_path / "existing").iterdir()) == []


def test_full_disk_is_detected_before_training(tmp_path, corpus, monkeypatch):
    monkeypatch.setattr(safety_module.shutil, "disk_usage", lambda path: DiskUsage(10**6, 10**6 - 1000, 1000))
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", save_strategy="steps", save_steps=2,
                          save_total_limit=2)
    with pytest.raises(OutputDirError, match=r"only 1\.0 KB free on its disk, but the run needs about [\d.]+ MB"):
        run([str(config)])
    assert not (tmp_path / "out").exists()


def test_a_resumed_run_needs_room_for_one_more_checkpoint_not_for_all_it_keeps(tmp_path, corpus, monkeypatch):
    """A requeued job stopped by a SIGTERM with save_total_limit (2) checkpoints in output_dir resumes on a disk with
    room for one more checkpoint and the final model, though not for the save_total_limit + 1 checkpoints a run from
    step 0 asks for (they were counted against the used space twice); with one byte less it is refused, naming the
    free space and the amount it needs."""
    output_dir = tmp_path / "out"
    command = [str(write_config(tmp_path / "job.yaml", corpus, output_dir, max_steps=5, save_strategy="steps",
                                save_steps=1, save_total_limit=2, enable_jit_checkpoint=True)),
               "--resume_from_checkpoint", "last"]
    with sigterm_in_step_3(monkeypatch), pytest.raises(TrainingStoppedError):
        run(command)
    assert [path.name for path in complete_checkpoints(output_dir)] == ["checkpoint-2", "checkpoint-3"]
    weights = estimated_weight_bytes(parse_arguments(command)[0])
    one_more = weights * (1 + 3 * 1)
    assert required_disk_bytes(weights, parse_arguments([*command[:1], "--output_dir", str(tmp_path / "new")])[2]) \
        == weights * (1 + 3 * 3)   # a run from step 0: the final model and 3 checkpoints, as before
    monkeypatch.setattr(safety_module.shutil, "disk_usage", lambda path: DiskUsage(10**9, 10**9 - one_more + 1,
                                                                                   one_more - 1))
    with pytest.raises(OutputDirError, match=rf"only {re.escape(format_bytes(one_more - 1))} free on its disk, but the "
                                             rf"run needs about {re.escape(format_bytes(one_more))} "):
        run(command)
    monkeypatch.setattr(safety_module.shutil, "disk_usage", lambda path: DiskUsage(10**9, 10**9 - one_more, one_more))
    assert run(command)["train"]["train_steps"] == 5
    assert json.loads((output_dir / "run_record.json").read_text())["resumed_from"] == "checkpoint-3"


class DiskUsage(NamedTuple):
    total: int
    used: int
    free: int


def test_disk_estimate_counts_the_final_model_and_the_kept_checkpoints(tmp_path, monkeypatch):
    def arguments(**values) -> TranslationTrainingArguments:
        return TranslationTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **values)

    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert required_disk_bytes(100, arguments(do_train=True, save_strategy="no")) == 100
    assert required_disk_bytes(100, arguments(do_train=True, save_strategy="steps")) == 100 + 3 * 100
    assert required_disk_bytes(100, arguments(do_train=True, save_strategy="steps", save_total_limit=2)) == 1000
    assert required_disk_bytes(100, arguments(do_train=False, do_predict=True)) == 0
    # an FSDP launch (fsdp.yaml, the big recipe's): each checkpoint holds the weights twice (model.safetensors and
    # accelerate's pytorch_model_fsdp.bin) besides Adam's state; the big recipe keeps 20, so 21 at a time
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert required_disk_bytes(100, arguments(do_train=True, save_strategy="steps", save_total_limit=20)) == \
        100 + 4 * 100 * 21


def test_a_resumed_runs_disk_estimate_counts_the_checkpoints_already_in_output_dir(tmp_path, monkeypatch):
    """A resumed run's checkpoints in output_dir take disk space already: with save_total_limit N and k complete
    ones there, it needs room for N + 1 - k more (the one written before rotation deletes the oldest), never fewer
    than one. A run from step 0 asks for N + 1 as before, whatever the folder holds; incomplete checkpoints count
    for nothing."""
    def arguments(**values) -> TranslationTrainingArguments:
        return TranslationTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, do_train=True,
                                            save_strategy="steps", **values)

    def checkpoint(step: int, complete: bool = True) -> None:
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            (tmp_path / f"checkpoint-{step}" / TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))

    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    checkpoint(2)
    checkpoint(4, complete=False)
    assert required_disk_bytes(100, arguments(save_total_limit=3, resume_from_checkpoint="last")) == 100 + 3 * 100 * 3
    checkpoint(6)
    assert required_disk_bytes(100, arguments(save_total_limit=3, resume_from_checkpoint="last")) == 100 + 3 * 100 * 2
    checkpoint(7)   # a SIGTERM's, off the save schedule, beside 3 on it: one more is written before any is deleted
    checkpoint(8)
    for limit in (3, 2, None):
        assert required_disk_bytes(100, arguments(save_total_limit=limit, resume_from_checkpoint="last")) == 400
    assert required_disk_bytes(100, arguments(save_total_limit=3)) == 100 + 3 * 100 * 4   # from step 0
    assert required_disk_bytes(100, arguments(save_total_limit=3, resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
                               ) == 400


# --- a failing rank ------------------------------------------------------------------------------------------------

# Rank 1 raises in its second training step; rank 0 is then waiting for it in the gradient all-reduce. Each rank writes
# its pid to RECORD_DIR/pid<rank> (launch_within kills them if the launch does not end).
FAILING_RANK = '''
import os, runpy, sys
from hf_relpos.translation import trainer

with open(os.path.join(os.environ["RECORD_DIR"], f"pid{os.environ['RANK']}"), "w") as handle:
    handle.write(str(os.getpid()))

original_training_step = trainer.TranslationTrainer.training_step

def training_step(self, *args, **kwargs):
    if self.args.process_index == 1 and self.state.global_step == 1:
        raise RuntimeError("injected failure on rank 1 at step 2")
    return original_training_step(self, *args, **kwargs)

trainer.TranslationTrainer.training_step = training_step
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def test_one_failing_rank_stops_the_whole_job_with_its_error(tmp_path, corpus):
    """Rank 1 raises in step 2 while rank 0 waits for it in the gradient all-reduce: the launch ends within the
    test's 180 s, non-zero, with that error, and saves no model. ddp_timeout stays at its default (1800 s), so a
    rank left waiting in the collective fails here instead of ending by the timeout; on failure launch_within kills
    the ranks too (a timeout of subprocess.run killed the launcher alone and left both ranks running)."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=6,
                          ddp_find_unused_parameters=False)
    (tmp_path / "fail.py").write_text(FAILING_RANK, encoding="utf-8")
    (tmp_path / "records").mkdir()
    completed = launch_within(180, tmp_path, tmp_path / "fail.py", str(SCRIPT), str(config),
                              environment={"TRANSFORMERS_VERBOSITY": "error"})
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0
    assert "injected failure on rank 1 at step 2" in output, output[-4000:]
    assert not (tmp_path / "out" / "model.safetensors").exists()


# --- bad input -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("train_text", "message"),
    [
        (None, r"data file '.*missing\.jsonl' does not exist"),
        ('{"translation": {"en": "a", "de": "b"}}\n{"translation": {"en": "c",\n', r"bad\.jsonl:2: invalid JSON"),
        ('{"translation": {"en": "a", "fr": "b"}}\n', r"bad\.jsonl:1, field 'translation': no 'de'"),
        ('{"translation": {"en": "", "de": "b"}}\n{"translation": {"en": " ", "de": "c"}}\n',
         r"train file '.*bad\.jsonl': the source side \('en'\) is empty on every one of its 2 lines"),
        ('{"translation": {"en": "a", "de": ""}}\n', r"the target side \('de'\) is empty on every one of its 1 lines"),
        ("\n", r"train file '.*bad\.jsonl' holds no pairs"),
    ],
    ids=["missing_file", "malformed_json_line", "missing_language", "empty_source", "empty_target", "empty_file"],
)
def test_bad_training_data_is_one_error_and_writes_nothing(tmp_path, corpus, train_text, message):
    train = tmp_path / ("missing.jsonl" if train_text is None else "bad.jsonl")
    if train_text is not None:
        train.write_text(train_text, encoding="utf-8")
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", train_file=str(train))
    with pytest.raises(DatasetSchemaError, match=message):
        run([str(config)])
    assert not (tmp_path / "out").exists()


# Per case: the file given for the split, the files written for it, the error after "train_translation.py: error: ".
BAD_SPLIT_FILES = {
    "missing_prefix": ("valdi", {}, r"data file '.*valdi' does not exist, nor does the plain-text pair it would name "
                                    r"as a prefix \(.*valdi\.en \+ .*valdi\.de: .*"),
    "missing_tsv": ("nope.tsv", {}, r"data file '.*nope\.tsv' does not exist"),
    "line_counts": ("pair", {"pair.en": "a\nb\nc\nd\n", "pair.de": "A\nB\nC\n"},
                    r".*pair\.en has 4 lines but .*pair\.de has 3; parallel plain-text files need one line per "
                    r"sentence, .*"),
    "tab_in_tsv": ("tab.tsv", {"tab.tsv": "en\tde\na cat\teine Katze\na\tdog\tein Hund\n"},
                   r".*tab\.tsv:3: 3 tab-separated fields, but the header has 2 \(en, de\); a \.tsv file has no "
                   r"quoting, so a sentence may not contain a tab"),
    "malformed_jsonl": ("bad.jsonl", {"bad.jsonl": '{"translation": {"en": "a", "de": "b"}}\n{"translation": {"en": \n'},
                        r".*bad\.jsonl:2: invalid JSON \(.*\)"),
}


def refuse_to_train_a_tokenizer(*args, **kwargs):
    raise AssertionError("a tokenizer was trained before every data file was checked")


def folder_contents(folder: Path) -> dict[str, bytes | None]:
    return {str(path.relative_to(folder)): path.read_bytes() if path.is_file() else None
            for path in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("split", ["validation", "test"])
@pytest.mark.parametrize("case", list(BAD_SPLIT_FILES))
def test_bad_evaluation_data_is_one_error_before_a_tokenizer_is_trained(tmp_path, corpus, monkeypatch, capsys, split,
                                                                       case):
    """A typo in the validation or test files stops a fresh run over an earlier one (overwrite_output_dir) with the
    error the training split would give, before a tokenizer is trained: output_dir is left exactly as it was."""
    given, files, message = BAD_SPLIT_FILES[case]
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    output_dir = tmp_path / "out"
    for name, content in {"model.safetensors": "weights", "config.json": "{}", "tokenizer.json": "{}",
                          "prepared_data/train-0123/manifest.json": "{}"}.items():
        (output_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (output_dir / name).write_text(content, encoding="utf-8")
    before = folder_contents(output_dir)
    config = write_config(tmp_path / "c.yaml", corpus, output_dir, overwrite_output_dir=True,
                          do_eval=split == "validation", do_predict=split == "test",
                          **{f"{split}_file": str(tmp_path / given)})
    monkeypatch.setattr(tokenizer_setup_module, "train_joint_tokenizer", refuse_to_train_a_tokenizer)
    with pytest.raises(SystemExit) as exited:
        main([str(config)])
    assert exited.value.code == 2
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(error_lines) == 1 and re.fullmatch(rf"train_translation.py: error: {message}", error_lines[0]), \
        error_lines
    assert folder_contents(output_dir) == before


def test_bad_validation_data_with_a_given_tokenizer_prepares_no_split(tmp_path, corpus):
    """With a tokenizer given (nothing to train), every split to prepare is read before the first is saved."""
    train_joint_tokenizer(corpus["train"].read_text(encoding="utf-8").splitlines(), 456).save_pretrained(
        tmp_path / "tokenizer")
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", tokenizer_name=str(tmp_path / "tokenizer"),
                          do_eval=True, validation_file=str(tmp_path / "nope.tsv"))
    with pytest.raises(DatasetSchemaError, match=r"data file '.*nope\.tsv' does not exist"):
        run([str(config)])
    assert not (tmp_path / "out").exists()


def test_corpus_empty_after_length_filtering_is_one_error_and_writes_nothing(tmp_path, corpus):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_source_length=2, max_target_length=2)
    with pytest.raises(DatasetSchemaError, match=r"no training pairs left after filtering: train: kept 0 of 60 pairs "
                                                 r".*raise max_source_length \(2\)"):
        run([str(config)])
    assert not (tmp_path / "out").exists()


def test_tokenizer_larger_than_the_model_vocabulary_is_one_error(tmp_path, corpus):
    small_model = tmp_path / "small_model"
    Model(hf_relpos.RelPosTransformerConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                            encoder_attention_heads=2, decoder_attention_heads=2,
                                            encoder_ffn_dim=32, decoder_ffn_dim=32)).save_pretrained(small_model)
    texts = corpus["train"].read_text(encoding="utf-8").splitlines()
    tokenizer = train_joint_tokenizer(texts, 456)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", model_name_or_path=str(small_model),
                          tokenizer_name=str(tmp_path / "tokenizer"), model={})
    with pytest.raises(ConfigError, match=rf"the tokenizer has {len(tokenizer)} tokens but the model only 40 "
                                          r"embeddings: .*model.resize_token_embeddings\(len\(tokenizer\)\)"):
        run([str(config)])
    assert not (tmp_path / "out").exists()


def test_a_model_vocabulary_of_exactly_the_tokenizers_size_is_accepted_and_one_less_refused(tmp_path, corpus):
    from hf_relpos.translation.model_setup import build_model

    texts = corpus["train"].read_text(encoding="utf-8").splitlines()
    tokenizer = train_joint_tokenizer(texts, 456)
    for vocab_size, fits in ((len(tokenizer), True), (len(tokenizer) - 1, False)):
        model = tmp_path / f"model-{vocab_size}"
        Model(hf_relpos.RelPosTransformerConfig(vocab_size=vocab_size, d_model=16, encoder_layers=1, decoder_layers=1,
                                                encoder_attention_heads=2, decoder_attention_heads=2,
                                                encoder_ffn_dim=32, decoder_ffn_dim=32)).save_pretrained(model)
        config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", model_name_or_path=str(model), model={})
        model_args, data_args, training_args = parse_arguments([str(config)])
        if fits:
            assert build_model(model_args, tokenizer, data_args, training_args).config.vocab_size == len(tokenizer)
        else:
            with pytest.raises(ConfigError, match=rf"the tokenizer has {len(tokenizer)} tokens but the model only "
                                                  rf"{vocab_size} embeddings"):
                build_model(model_args, tokenizer, data_args, training_args)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> Path:
    folder = tmp_path_factory.mktemp("trained")
    config = write_config(folder / "c.yaml", corpus, folder / "out", max_steps=4)
    run([str(config)])
    return folder / "out"


def test_a_tokenizer_other_than_the_models_own_is_one_warning_naming_both(tmp_path, corpus, trained, capsys):
    """`tokenizer_name` with a pretrained `model_name_or_path` whose saved tokenizer has another vocabulary (here a
    smaller one, which the model's embeddings hold) is one warning naming both folders; the model's own tokenizer
    saved elsewhere is none."""
    texts = corpus["train"].read_text(encoding="utf-8").splitlines()
    train_joint_tokenizer(texts, 300).save_pretrained(tmp_path / "other")
    AutoTokenizer.from_pretrained(trained).save_pretrained(tmp_path / "same")
    for name in ("other", "same"):
        config = write_config(tmp_path / f"{name}.yaml", corpus, tmp_path / f"out_{name}",
                              model_name_or_path=str(trained), tokenizer_name=str(tmp_path / name), model={},
                              prepare_only=True)
        capsys.readouterr()
        run([str(config)])
        warned = [line for line in capsys.readouterr().out.splitlines() if "is not the tokenizer saved" in line]
        if name == "same":
            assert warned == []
        else:
            (line,) = warned
            assert re.search(rf" WARNING hf_relpos\.translation\.tokenizer_setup: tokenizer_name {tmp_path / name} is "
                             rf"not the tokenizer saved with model_name_or_path {trained} \(\d+ of its 300 tokens are "
                             r"missing there or have another id; that one has 456\): .*leave tokenizer_name null", line)


def test_more_beams_than_vocabulary_is_an_error_before_generating(tmp_path, corpus, trained):
    vocabulary = AutoModelForSeq2SeqLM.from_pretrained(trained).config.vocab_size
    predict = write_config(tmp_path / "p.yaml", corpus, tmp_path / "predict", model_name_or_path=str(trained),
                           do_train=False, do_predict=True, model={}, generation_num_beams=vocabulary + 1)
    with pytest.raises(ConfigError, match=rf"generation_num_beams \({vocabulary + 1}\) is larger than the vocabulary "
                                          rf"\({vocabulary} tokens\)"):
        run([str(predict)])
    assert not (tmp_path / "predict").exists()
    scratch = write_config(tmp_path / "s.yaml", corpus, tmp_path / "scratch", generation_num_beams=5000)
    with pytest.raises(ConfigError, match=r"generation_num_beams \(5000\) is larger than the vocabulary"):
        run([str(scratch)])
    assert not (tmp_path / "scratch").exists(), "no tokenizer saved before the error"


def test_empty_and_overlong_sources_translate_whole(tmp_path, corpus, trained, capsys):
    """An empty source translates to an empty line (the model would invent a sentence after </s> alone); a source
    over max_source_length (a limit of the training pairs) is translated whole, as hf-relpos-translate translates
    it, and gets its line of output."""
    long_source = " ".join(["the man sees the dog"] * 40)
    test_file = write_jsonl(tmp_path / "test.jsonl", [("", "Hallo."), (long_source, "Der Mann."), ("A dog.", "Ein Hund.")])
    config = write_config(tmp_path / "p.yaml", corpus, tmp_path / "predict", model_name_or_path=str(trained),
                          do_train=False, do_predict=True, model={}, test_file=str(test_file), max_source_length=16)
    results = run([str(config)])
    assert results["test"]["test_samples"] == 3
    assert "test: kept 3 of 3 pairs (0 with an empty side dropped, 1 over the length limits kept whole)" in (
        capsys.readouterr().out)
    lines = (tmp_path / "predict" / "test_hypotheses.txt").read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[0] == "" and lines[1] != "" and lines[-1] == ""
    (tmp_path / "src.txt").write_text(f"\n{long_source}\nA dog.\n", encoding="utf-8")
    translate_main([str(trained), "--input", str(tmp_path / "src.txt"), "--output",
                    str(tmp_path / "tool.txt"), "--no_progress", "--no_split_sentences"])
    assert (tmp_path / "tool.txt").read_text(encoding="utf-8").split("\n") == lines   # the same translations


# --- numerical health ----------------------------------------------------------------------------------------------


def test_nan_loss_stops_training_naming_the_step_and_keeps_the_checkpoint(tmp_path, corpus, monkeypatch):
    original_compute_loss = TranslationTrainer.compute_loss

    def compute_loss(self, *args, **kwargs):
        loss = original_compute_loss(self, *args, **kwargs)
        if self.state.global_step == 2:  # the third step
            return (loss[0] * float("nan"), *loss[1:]) if isinstance(loss, tuple) else loss * float("nan")
        return loss

    monkeypatch.setattr(TranslationTrainer, "compute_loss", compute_loss)
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=6, save_strategy="steps",
                          save_steps=2)
    with pytest.raises(NonFiniteLossError, match=r"training loss is nan at step 3 \(epoch [\d.]+\)") as raised:
        run([str(config)])
    assert raised.value.step == 3
    output_dir = tmp_path / "out"
    assert not (output_dir / "model.safetensors").exists() and not (output_dir / "config.json").exists()
    assert [path.name for path in output_dir.glob("checkpoint-*")] == ["checkpoint-2"]
    assert is_complete_checkpoint(output_dir / "checkpoint-2")
    assert_safetensors_only(output_dir / "checkpoint-2")
    weights = load_file(output_dir / "checkpoint-2" / "model.safetensors")
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())
    assert TrainerState.load_from_json(str(output_dir / "checkpoint-2" / "trainer_state.json")).global_step == 2


def test_diverging_learning_rate_exits_with_the_step(tmp_path, corpus, capsys):
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", learning_rate=1.0e30, warmup_steps=0,
                          lr_scheduler_type="constant", max_steps=8)
    with pytest.raises(SystemExit) as exited:
        main([str(config)])
    assert exited.value.code == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"train_translation.py: error: training loss is (nan|inf|-inf) at step [2-8] .*", error), error
    assert not (tmp_path / "out" / "model.safetensors").exists()


# --- security ------------------------------------------------------------------------------------------------------


def test_no_package_module_unpickles_weights():
    """Weights are read with safetensors only: no torch.load / pickle anywhere in the package. (The Trainer itself
    torch.loads optimizer, scheduler and random states when resuming; that is training state, not weights.)"""
    offenders = []
    package = Path(hf_relpos.__file__).parent
    for source in sorted(package.rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        offenders += [f"{source.relative_to(package)}: {match}"
                      for match in re.findall(r"torch\.load\(|\bpickle\b|weights_only", text)]
    assert offenders == []


def test_saved_models_and_checkpoints_hold_safetensors_only(trained):
    assert_safetensors_only(trained)


def modes_under(folder: Path) -> dict[str, int]:
    """The permission bits of `folder` and of everything in it, by path relative to `folder` ("." for itself)."""
    return {str(path.relative_to(folder)): stat.S_IMODE(path.stat().st_mode) for path in [folder, *folder.rglob("*")]}


@pytest.mark.parametrize(("umask", "file_mode", "folder_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_saved_files_and_folders_get_the_modes_the_umask_gives(tmp_path, corpus, umask, file_mode, folder_mode):
    """A run with checkpoints (its final model, card and run record) and the folder hf-relpos-average makes of it
    hold files and folders with the modes open() and mkdir() give under the umask, although safetensors and tempfile
    create theirs owner-only."""
    output, averaged = tmp_path / "out", tmp_path / "averaged"
    previous = os.umask(umask)
    try:
        run([str(write_config(tmp_path / "c.yaml", corpus, output, save_strategy="steps", save_steps=2))])
        average_main([str(output), "--last_n", "2", "--output_dir", str(averaged)])
    finally:
        os.umask(previous)
    assert {"README.md", "run_record.json", "model.safetensors", "checkpoint-2/model.safetensors",
            "checkpoint-4/model.safetensors"} <= modes_under(output).keys()
    for folder in (output, averaged):
        modes = modes_under(folder)
        expected = {name: folder_mode if (folder / name).is_dir() else file_mode for name in modes}
        assert {name: oct(mode) for name, mode in modes.items()} == {name: oct(mode) for name, mode in expected.items()}


def test_atomic_text_write_keeps_the_old_file_and_no_temporary_when_it_fails(tmp_path):
    path = tmp_path / "card.md"
    files_module.write_text_atomic(path, "old ü\n")
    with pytest.raises(UnicodeEncodeError):
        files_module.write_text_atomic(path, "new \ud800\n")  # a lone surrogate fails half-way through the write
    assert path.read_text(encoding="utf-8") == "old ü\n"
    assert [item.name for item in tmp_path.iterdir()] == ["card.md"]
    files_module.write_text_atomic(path, "new\n")
    assert path.read_text(encoding="utf-8") == "new\n"
    assert [item.name for item in tmp_path.iterdir()] == ["card.md"]


def disk_full_when_moving(monkeypatch, name: str) -> None:
    """os.replace, as hf_relpos.publish.files calls it, fails with ENOSPC for a target named `name`."""
    replace = os.replace

    def replace_all_but(source, target):
        if Path(target).name == name:
            raise OSError(28, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(files_module.os, "replace", replace_all_but)


def test_an_existing_empty_output_folder_is_filled_in_place_with_its_last_file_last(tmp_path, monkeypatch):
    """A mount point (`docker run -v host:/out`) or the working folder cannot be removed or renamed over (EBUSY,
    EXDEV): an existing empty output folder is kept and filled, the file it loads by moved in last, so a fill cut short
    does not load; a new folder is still renamed into place whole."""
    out = tmp_path / "out"
    out.mkdir()
    folder_identity = out.stat().st_ino
    with files_module.staged_folder(out, last="config.json") as staging:
        (staging / "config.json").write_text("{}")
        (staging / "model.safetensors").write_bytes(b"weights")
    assert out.stat().st_ino == folder_identity
    assert sorted(path.name for path in out.iterdir()) == ["config.json", "model.safetensors"]
    cut_short = tmp_path / "cut_short"
    cut_short.mkdir()
    disk_full_when_moving(monkeypatch, "config.json")
    with pytest.raises(OSError, match="No space left"), \
            files_module.staged_folder(cut_short, last="config.json") as staging:
        (staging / "config.json").write_text("{}")
        (staging / "model.safetensors").write_bytes(b"weights")
    assert [path.name for path in cut_short.iterdir()] == ["model.safetensors"]   # no config: it does not load


def test_files_moved_over_an_earlier_model_never_leave_its_config_with_the_new_weights(tmp_path, monkeypatch):
    """Moving a new model over an earlier one (a replaced final model): the earlier file the folder loads by goes
    first, so a move cut short leaves a folder that does not load, never the new weights under the old config."""
    target, staging = tmp_path / "model", tmp_path / "staging"
    for folder, version in ((target, "old"), (staging, "new")):
        folder.mkdir()
        (folder / "config.json").write_text(version)
        (folder / "model.safetensors").write_text(f"{version} weights")
    disk_full_when_moving(monkeypatch, "config.json")
    with pytest.raises(OSError, match="No space left"):
        files_module.move_folder_contents(staging, target, last="config.json")
    assert [path.name for path in target.iterdir()] == ["model.safetensors"]


def test_staged_files_and_folders_get_what_open_and_mkdir_give_under_a_group_writable_umask(tmp_path):
    """Under umask 002 (a shared group) open() gives 664 and mkdir() 775: an atomic write and a staged folder too."""
    previous = os.umask(0o002)
    try:
        (tmp_path / "opened").write_text("text")
        (tmp_path / "made").mkdir()
        files_module.write_text_atomic(tmp_path / "card.md", "text")
        with files_module.staged_folder(tmp_path / "out", last="config.json") as staging:
            (staging / "config.json").write_text("{}")
    finally:
        os.umask(previous)
    modes = {name: oct(stat.S_IMODE((tmp_path / name).stat().st_mode)) for name in ("opened", "made", "card.md", "out")}
    assert modes == {"opened": "0o664", "made": "0o775", "card.md": "0o664", "out": "0o775"}


def test_an_existing_output_folder_a_killed_fill_left_its_staging_in_is_filled_again(tmp_path):
    """A fill of an existing empty folder (a mount point) killed while it staged leaves its hidden staging folder
    inside: the next average / convert / export takes the folder as empty and removes it, where it refused the folder
    as not empty; a staging of another machine (a new container has a new host name) is named in the refusal."""
    from hf_relpos.translation.safety import OutputDirError, check_new_output_dir

    out = tmp_path / "out"
    out.mkdir()
    subprocess.run([sys.executable, "-c", "import os, signal; from hf_relpos.publish.files import staged_folder\n"
                    f"with staged_folder({str(out)!r}, last='config.json') as staging:\n"
                    "    (staging / 'model.safetensors').write_bytes(b'half')\n"
                    "    os.kill(os.getpid(), signal.SIGKILL)"], timeout=120)
    assert [entry.name.startswith(".out.") for entry in out.iterdir()] == [True]
    check_new_output_dir(out)
    with files_module.staged_folder(out, last="config.json") as staging:
        (staging / "config.json").write_text("{}")
    assert [entry.name for entry in out.iterdir()] == ["config.json"]
    (out / "config.json").unlink()
    (out / ".out.elsewhere-1-x").mkdir()
    with pytest.raises(OutputDirError, match=r"not an empty folder; it holds '\.out\.elsewhere-1-x', a fill's staging "
                                             r"folder \(of another machine or a process still running\); remove it"):
        check_new_output_dir(out)


def test_atomic_text_write_through_a_link_keeps_the_link_and_the_old_file_when_it_fails(tmp_path):
    """A destination that is a link (a run record or card linked elsewhere) stays a link, and the file it leads to is
    replaced whole like any other: written through, a failed write left that file cut short."""
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "card.md"
    target.write_text("old\n", encoding="utf-8")
    (tmp_path / "card.md").symlink_to(target)
    with pytest.raises(UnicodeEncodeError):
        files_module.write_text_atomic(tmp_path / "card.md", "new " * 1000 + "\ud800\n")   # fails after the first part
    assert target.read_text(encoding="utf-8") == "old\n"
    files_module.write_text_atomic(tmp_path / "card.md", "new\n")
    assert (tmp_path / "card.md").readlink() == target and target.read_text(encoding="utf-8") == "new\n"
    assert sorted(item.name for item in tmp_path.rglob("*")) == ["card.md", "card.md", "elsewhere"]


def test_atomic_text_write_to_dev_stdout_on_a_deleted_file_writes_to_it_and_makes_no_file(tmp_path):
    """/dev/stdout on a file deleted since it was opened leads to a path 'FILE (deleted)' that does not exist: the
    text goes to the open file, and no file of that name is made."""
    held = tmp_path / "out.txt"
    with open(held, "w+", encoding="utf-8") as stdout:
        held.unlink()
        subprocess.run([sys.executable, "-c", "from hf_relpos.publish.files import write_text_atomic; "
                        "write_text_atomic('/dev/stdout', 'whole\\n')"], stdout=stdout, check=True, timeout=120)
        stdout.seek(0)
        assert stdout.read() == "whole\n"
    assert list(tmp_path.iterdir()) == []


def test_a_text_output_to_a_descriptor_appends_where_the_shell_opened_it_to_append(tmp_path):
    """/dev/stdout (and /dev/fd/N) name this process's open descriptor: `>> log` appends to log, as the shell opened
    it; log is not replaced and no temporary is made beside it."""
    log = tmp_path / "log.txt"
    log.write_text("earlier\n", encoding="utf-8")
    with open(log, "a", encoding="utf-8") as stdout:
        subprocess.run([sys.executable, "-c", "from hf_relpos.publish.files import text_output\n"
                        "for path, text in (('/dev/stdout', 'whole\\n'), ('/dev/fd/1', 'again\\n')):\n"
                        "    with text_output(path) as output:\n"
                        "        output.write(text)"], stdout=stdout, check=True, timeout=120)
    assert log.read_text(encoding="utf-8") == "earlier\nwhole\nagain\n"
    assert list(tmp_path.iterdir()) == [log]


def test_named_descriptor_follows_links_to_this_process_descriptors_only(tmp_path):
    (tmp_path / "out").symlink_to("/dev/stdout")
    assert [files_module.named_descriptor(path) for path in ("/dev/stdout", "/dev/fd/2", tmp_path / "out")] == [1, 2, 1]
    (tmp_path / "plain").write_text("")
    assert [files_module.named_descriptor(path) for path in (tmp_path / "plain", "/dev/null", tmp_path / "gone",
                                                               f"/proc/{os.getppid()}/fd/1")] == [None] * 4


def test_a_write_removes_the_temporaries_a_killed_write_of_the_same_destination_left(tmp_path):
    """A write killed part-way (SIGKILL, out of memory) leaves its temporary beside the destination (a staged model
    folder can be gigabytes); the next write of that destination removes those of processes that are gone on this
    machine, and keeps a running process's and another machine's."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    for destination in ("card.md", "averaged"):
        abandoned = [tmp_path / f".{destination}.{host}-{gone.pid}-x1.partial", tmp_path / f".{destination}.{host}-{gone.pid}-x2"]
        kept = [tmp_path / f".{destination}.{host}-{os.getpid()}-x3", tmp_path / f".{destination}.elsewhere-{gone.pid}-x4",
                tmp_path / f".other.{host}-{gone.pid}-x5"]
        abandoned[0].write_text("half")
        abandoned[1].mkdir()
        (abandoned[1] / "model.safetensors").write_bytes(b"\0" * 8)
        for path in kept:
            path.write_text("")
        if destination == "card.md":
            files_module.write_text_atomic(tmp_path / destination, "whole\n")
        else:
            with files_module.staged_folder(tmp_path / destination, last="config.json") as staging:
                (staging / "config.json").write_text("{}")
        assert not any(path.exists() for path in abandoned) and all(path.exists() for path in kept)
        for path in kept:
            path.unlink()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["averaged", "card.md"]


def test_a_sigterm_checkpoint_before_the_first_step_is_off_the_save_schedule(tmp_path, corpus, monkeypatch):
    """A SIGTERM before the run's first step saves checkpoint-0 (the initial weights), a step at which save_strategy
    steps never saves. It is off the save schedule as every SIGTERM checkpoint between two scheduled ones is: the
    resumed run neither averages the untrained weights into its final model nor gives checkpoint-0 a slot of
    save_total_limit (it counted as on the schedule, 0 being a multiple of save_steps: checkpoints 0, 2 and 4 were
    averaged, where the uninterrupted run averages 2 and 4); within the limit it is kept, as every checkpoint off the
    schedule is until the folder holds more than the limit."""
    common = {"max_steps": 4, "enable_jit_checkpoint": True, "save_strategy": "steps", "save_steps": 2,
              "save_total_limit": 3, "average_checkpoints": 3}
    reference = write_config(tmp_path / "reference.yaml", corpus, tmp_path / "reference", **common)
    run([str(reference)])
    config = write_config(tmp_path / "stopped.yaml", corpus, tmp_path / "stopped", **common)
    with sigterm_in(monkeypatch, "set_initial_training_values", 0), pytest.raises(
            TrainingStoppedError, match="at step 0 .*checkpoint-0 is saved"):
        run([str(config)])
    run([str(config), "--resume_from_checkpoint", "last"])
    averaged = json.loads((tmp_path / "reference" / "averaged_checkpoints.json").read_text())
    assert averaged["checkpoints"] == ["checkpoint-2", "checkpoint-4"]
    assert json.loads((tmp_path / "stopped" / "averaged_checkpoints.json").read_text()) == averaged
    assert sorted(path.name for path in (tmp_path / "stopped").glob("checkpoint-*")) == [
        "checkpoint-0", "checkpoint-2", "checkpoint-4"]



def test_a_checkpoint_records_the_runs_save_total_limit(tmp_path, corpus):
    """Every checkpoint's training_args.bin (the Trainer's record of the run's arguments) holds the run's
    save_total_limit, though TranslationTrainer rotates the checkpoints itself (`_rotate_checkpoints`): it held None,
    the value set aside while the Trainer saved the checkpoint, so that it would not rotate them too."""
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", max_steps=4, save_strategy="steps",
                          save_steps=2, save_total_limit=3)
    run([str(config)])
    for step in (2, 4):
        saved = torch.load(tmp_path / "out" / f"checkpoint-{step}" / "training_args.bin", weights_only=False)
        assert saved.save_total_limit == 3, step
    assert torch.load(tmp_path / "out" / "training_args.bin", weights_only=False).save_total_limit == 3
