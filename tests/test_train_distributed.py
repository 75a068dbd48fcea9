"""Data-parallel training on CPU: `accelerate launch --config_file configs/accelerate/cpu_2proc.yaml
train_translation.py CONFIG --use_cpu true` runs two gloo processes (`--use_cpu true` makes the Trainer pick the
CPU/gloo backend). Both ranks must train on disjoint token-budget batches covering the data, their step must weigh
every labelled token of both alike, and only the main process may write the model. Without `--use_cpu true` on a machine without GPUs, the run stops before writing anything."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import MEMORISED_PAIRS, checkout_first_on_path

from hf_relpos.translation.checkpoints import last_complete_checkpoint
from hf_relpos.translation.demo_corpus import write_demo_corpus

REPO = Path(__file__).resolve().parents[1]

# Runs train_translation.py's main() in each process, recording what that rank trained on and saved.
WORKER = '''
import json, os, sys
from accelerate import PartialState
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from hf_relpos.translation import trainer, training

record = {"steps": 0, "saved": []}
original_training_step = trainer.TranslationTrainer.training_step
original_model_save = PreTrainedModel.save_pretrained
original_tokenizer_save = PreTrainedTokenizerBase.save_pretrained

def training_step(self, model, inputs, *args, **kwargs):
    record["steps"] += 1
    return original_training_step(self, model, inputs, *args, **kwargs)

def model_save(self, *args, **kwargs):
    record["saved"].append("model")
    return original_model_save(self, *args, **kwargs)

def tokenizer_save(self, *args, **kwargs):
    record["saved"].append("tokenizer")
    return original_tokenizer_save(self, *args, **kwargs)

trainer.TranslationTrainer.training_step = training_step
PreTrainedModel.save_pretrained = model_save
PreTrainedTokenizerBase.save_pretrained = tokenizer_save
original_get_train_dataloader = trainer.TranslationTrainer.get_train_dataloader

def get_train_dataloader(self):
    loader = original_get_train_dataloader(self)
    record["epoch_batches"] = [list(map(int, batch)) for batch in loader.batch_sampler]
    return loader

trainer.TranslationTrainer.get_train_dataloader = get_train_dataloader
training.main(sys.argv[1:])
import torch.distributed
state = PartialState()
record.update(rank=state.process_index, world_size=state.num_processes, backend=state.backend,
              group_open_after_main=torch.distributed.is_initialized())
with open(os.path.join(os.environ["RECORD_DIR"], f"rank{state.process_index}.json"), "w") as handle:
    json.dump(record, handle)
'''


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


CPU_CONFIG = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"


def write_config(tmp_path: Path) -> tuple[Path, Path]:
    """(YAML of a tiny two-process run, its output_dir)."""
    corpus = write_demo_corpus(tmp_path / "corpus", 60, 6, 4, seed=2)
    output_dir = tmp_path / "out"
    config = {
        "model": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
                  "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64},
        "train_file": str(corpus["train"]), "validation_file": str(corpus["validation"]),
        "tokenizer_vocab_size": 456, "output_dir": str(output_dir),
        "do_train": True, "do_eval": True, "num_train_epochs": 1, "max_tokens_per_batch": 300,
        "learning_rate": 1.0e-3, "per_device_eval_batch_size": 4, "generation_num_beams": 1,
        "generation_max_length_offset": 3, "save_strategy": "no", "logging_steps": 1, "report_to": "none",
        "disable_tqdm": True, "seed": 1, "ddp_find_unused_parameters": False,
    }
    config_path = tmp_path / "ddp.yaml"
    config_path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return config_path, output_dir


def launch(tmp_path: Path, script: Path, *arguments: str, config_file: Path = CPU_CONFIG,
           launch_flags: tuple[str, ...] = (), environment: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The documented command: accelerate launch --config_file configs/accelerate/cpu_2proc.yaml SCRIPT ..."""
    environment = dict(os.environ, RECORD_DIR=str(tmp_path / "records"), PYTHONPATH=checkout_first_on_path(),
                       **(environment or {}))
    return subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file), *launch_flags,
         "--main_process_port", str(free_port()), str(script), *arguments],
        capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=300,
    )


def test_two_process_training_uses_both_ranks_and_saves_once(tmp_path):
    config_path, output_dir = write_config(tmp_path)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    records = tmp_path / "records"
    records.mkdir()
    completed = launch(tmp_path, worker, str(config_path), "--use_cpu", "true",
                       environment={"PYTHONWARNINGS": "default", "TQDM_DISABLE": "1"})
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "world size 2, process 0" in completed.stdout
    assert completed.stderr == "", "no warning from either rank (Python's, DDP's, transformers'); no progress bar"
    assert [completed.stdout.count(line) for line in ("eval: sacreBLEU", "***** train metrics *****",
                                                      f"{output_dir} holds the model")] == [1, 1, 1], "said once"

    ranks = [json.loads((records / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [(r["rank"], r["world_size"], r["backend"]) for r in ranks] == [(0, 2, "gloo"), (1, 2, "gloo")]
    assert [r["group_open_after_main"] for r in ranks] == [False, False], "main() closes the process group"
    assert ranks[0]["steps"] > 0 and ranks[0]["steps"] == ranks[1]["steps"] == len(ranks[0]["epoch_batches"])
    examples = [{index for batch in r["epoch_batches"] for index in batch} for r in ranks]
    assert examples[0].isdisjoint(examples[1]), "each rank trains on its own batches"
    assert examples[0] | examples[1] == set(range(60)), "together the ranks cover the epoch"
    assert sum(len(batch) for r in ranks for batch in r["epoch_batches"]) == 60, "no example repeated"

    assert "model" in ranks[0]["saved"] and ranks[1]["saved"] == []
    assert (output_dir / "model.safetensors").is_file() and (output_dir / "eval_results.json").is_file()
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == ranks[0]["steps"]
    metrics = json.loads((output_dir / "train_results.json").read_text())
    assert metrics["train_samples_per_second"] * metrics["train_runtime"] == pytest.approx(   # rate: 3 decimals
        60, abs=0.0005 * metrics["train_runtime"] + 1e-6), "the pairs both ranks trained on"
    eval_lines = (output_dir / "eval_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    assert len(eval_lines) == 6


# What both float64 workers below start with: the app's trainer, a tiny tokenizer, the 7 token-budget examples of
# tests/test_loss.py, and the label smoothing given as the first argument.
TOKEN_BUDGET_WORKER_START = '''
import json, os, sys
sys.path.insert(0, os.environ["TESTS_DIR"])
from accelerate import PartialState
from datasets import Dataset
import hf_relpos
from hf_relpos.translation.arguments import TranslationTrainingArguments
from hf_relpos.translation.tokenization import train_joint_tokenizer
from hf_relpos.translation.trainer import EvaluationSet, build_trainer
from test_loss import TOKEN_BUDGET_LENGTHS, set_token_means, tiny_float64, token_budget_examples, token_losses

label_smoothing = float(sys.argv[1])
tokenizer = train_joint_tokenizer(["a small dog", "ein kleiner Hund"] * 10, vocab_size=270)
examples = token_budget_examples()
'''
# No rank may exit while another still works (the main process writes the record): gloo torn down in one
# interpreter's shutdown while the other still runs can abort it (SIGABRT, "terminate called without an active
# exception"), as train_translation.py's main() guards against.
TOKEN_BUDGET_WORKER_END = '''
state.wait_for_everyone()
state.destroy_process_group()
'''

def test_two_processes_given_resume_last_in_a_new_output_dir_both_train_from_step_0(tmp_path):
    """A requeued job's first start under `accelerate launch`: output_dir does not exist, and with
    `--resume_from_checkpoint last` every process decides alike to train from step 0 (the main process writing
    output_dir, its tokenizer and prepared data meanwhile changes nothing in that decision), the warning said once,
    by the main process, and the run finishes as a run without the flag does."""
    config_path, output_dir = write_config(tmp_path)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    records = tmp_path / "records"
    records.mkdir()
    completed = launch(tmp_path, worker, str(config_path), "--use_cpu", "true", "--resume_from_checkpoint", "last")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    printed = (completed.stdout + completed.stderr).splitlines()
    assert [line.split(": ", 1)[1] for line in printed if "no checkpoint to resume from" in line] == [
        f"resume_from_checkpoint=last: no checkpoint to resume from was found in output_dir {output_dir} (it does "
        "not exist yet): training from step 0"]
    ranks = [json.loads((records / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0]["steps"] > 0 and ranks[0]["steps"] == ranks[1]["steps"] == len(ranks[0]["epoch_batches"])
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == ranks[0]["steps"] and (output_dir / "model.safetensors").is_file()
    assert json.loads((output_dir / "run_record.json").read_text())["resumed_from"] is None

def run_token_budget_worker(tmp_path: Path, source: str, name: str) -> dict:
    """Runs a worker of TOKEN_BUDGET_WORKER_START in two gloo processes at label smoothing 0.1; its record
    `name`.json."""
    worker = tmp_path / f"{name}_worker.py"
    worker.write_text(source, encoding="utf-8")
    (tmp_path / "records").mkdir()
    completed = launch(tmp_path, worker, "0.1", environment={"TESTS_DIR": str(REPO / "tests")})
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return json.loads((tmp_path / "records" / f"{name}.json").read_text())


# One SGD step (lr 1) of the app's trainer, float64, over two accumulated token-budget batches in each of two
# processes (7 examples, 4 batches of different sizes and labelled tokens: the ranks' shares differ); process 0
# compares the step with the gradient of the token-mean loss of all four batches in one batch.
GRADIENT_WORKER = TOKEN_BUDGET_WORKER_START + '''
import torch
from transformers import DataCollatorForSeq2Seq
arguments = TranslationTrainingArguments(
    output_dir=os.path.join(os.environ["RECORD_DIR"], "out"), max_tokens_per_batch=20, gradient_accumulation_steps=2,
    max_steps=1, learning_rate=1.0, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
    label_smoothing_factor=label_smoothing, report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True,
    seed=0, dataloader_num_workers=0, generation_num_beams=1, ddp_find_unused_parameters=False)
model = tiny_float64(hf_relpos.RelPosTransformerForConditionalGeneration)
trainer = build_trainer(model, tokenizer, arguments, Dataset.from_list(examples), {}, "de")
batches = list(trainer.token_budget_sampler)   # the global list: process r trains on batches r, r + 2, ...
before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
trainer.train()
state = PartialState()
if state.is_main_process:
    applied = {name: before[name] - parameter.detach() for name, parameter in model.named_parameters()}
    reference = tiny_float64(hf_relpos.RelPosTransformerForConditionalGeneration)
    collator = DataCollatorForSeq2Seq(tokenizer, model=reference, label_pad_token_id=-100)
    total, count = token_losses(reference, collator([{name: examples[index][name] for name in
                                                      ("input_ids", "attention_mask", "labels")}
                                                     for batch in batches for index in batch]), label_smoothing)
    (total / count).backward()
    error = max(((applied[name] - parameter.grad).abs().max() / max(1.0, parameter.grad.abs().max().item())).item()
                for name, parameter in reference.named_parameters())
    labelled = [sum(TOKEN_BUDGET_LENGTHS[index][1] for index in batch) for batch in batches]
    record = {"world_size": state.num_processes, "steps": trainer.state.global_step, "batches": batches,
              "labelled": labelled, "count": count, "relative_error": error}
    with open(os.path.join(os.environ["RECORD_DIR"], "gradient.json"), "w") as handle:
        json.dump(record, handle)
''' + TOKEN_BUDGET_WORKER_END


def test_two_processes_weigh_every_token_of_their_uneven_token_budget_batches_alike(tmp_path):
    """Two gloo processes, each accumulating two token-budget batches of its own (the ranks hold different numbers
    of labelled tokens): the Trainer's num_items_in_batch (summed over the processes) and the app's label-smoothed
    loss make the step the gradient of the mean over every labelled token of the four batches, to 1e-12 in
    float64."""
    record = run_token_budget_worker(tmp_path, GRADIENT_WORKER, "gradient")
    assert (record["world_size"], record["steps"], len(record["batches"])) == (2, 1, 4)
    assert sorted(index for batch in record["batches"] for index in batch) == list(range(7))
    per_rank = [sum(record["labelled"][rank::2]) for rank in range(2)]
    assert per_rank[0] != per_rank[1] and sum(per_rank) == record["count"]
    assert record["relative_error"] < 1e-12


# The app's evaluation and prediction, float64, of the 7 token-budget examples in batches of 2 under two processes:
# the second step's batches are [4, 5] and [6, 0], the 0 a copy that pads rank 1's batch. Process 0 records the
# metrics beside the naive token means of the 7 sentences in one batch.
EVAL_WORKER = TOKEN_BUDGET_WORKER_START + '''
import numpy as np
arguments = TranslationTrainingArguments(
    output_dir=os.path.join(os.environ["RECORD_DIR"], "out"), per_device_eval_batch_size=2,
    label_smoothing_factor=label_smoothing, report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
    dataloader_num_workers=0, generation_num_beams=1)
model = tiny_float64(hf_relpos.RelPosTransformerForConditionalGeneration).eval()
dataset = Dataset.from_list(examples)
evaluation_sets = {prefix: EvaluationSet(dataset, np.arange(7), ["ein Hund"] * 7, ["a dog"] * 7)
                   for prefix in ("eval", "test")}
trainer = build_trainer(model, tokenizer, arguments, None, evaluation_sets, "de")
steps = len(trainer.get_eval_dataloader(dataset))
evaluated = trainer.evaluate(dataset)
predicted = trainer.predict(dataset).metrics
state = PartialState()
if state.is_main_process:
    loss, nll_loss = set_token_means(model, tokenizer, examples, label_smoothing)
    record = {"world_size": state.num_processes, "steps": steps, "loss": loss, "nll_loss": nll_loss,
              "eval": evaluated, "test": predicted}
    with open(os.path.join(os.environ["RECORD_DIR"], "evaluation.json"), "w") as handle:
        json.dump(record, handle)
''' + TOKEN_BUDGET_WORKER_END


def test_two_process_eval_and_test_loss_are_the_token_mean_over_the_set_without_padding_copies(tmp_path):
    """Two gloo processes evaluate and predict 7 sentences in batches of 2 (2 steps: 8 places, one filled by a copy
    of the first sentence): eval_loss / test_loss (label-smoothed, as the run trains) and eval_nll_loss /
    test_nll_loss are the means over every labelled token of the 7 sentences, each counted once, to 1e-12 in
    float64, and BLEU is still scored."""
    record = run_token_budget_worker(tmp_path, EVAL_WORKER, "evaluation")
    assert (record["world_size"], record["steps"]) == (2, 2)
    assert record["nll_loss"] != record["loss"]
    for prefix in ("eval", "test"):
        metrics = record[prefix]
        assert abs(metrics[f"{prefix}_loss"] - record["loss"]) < 1e-12 * record["loss"], prefix
        assert abs(metrics[f"{prefix}_nll_loss"] - record["nll_loss"]) < 1e-12 * record["nll_loss"], prefix
        assert f"{prefix}_bleu" in metrics, prefix


def test_two_process_evaluation_translates_and_scores_every_sentence_once(tmp_path, memorised_model_folder):
    """A predict-only run under two processes: 6 validation and 6 test sentences in batches of 2 are dealt to the
    ranks (3 batches: accelerate pads the second step with a copy of the first batch), gathered and put back in
    source order: each split's translations are its references line by line (a model that memorised them), none
    twice and none missing, and BLEU over the whole set is 100."""
    pairs = {"validation": MEMORISED_PAIRS, "test": MEMORISED_PAIRS[::-1]}
    for split, split_pairs in pairs.items():
        (tmp_path / f"{split}.jsonl").write_text("".join(
            json.dumps({"translation": {"en": source, "de": target}}) + "\n" for source, target in split_pairs),
            encoding="utf-8")
    config = {"model_name_or_path": str(memorised_model_folder), "source_lang": "en", "target_lang": "de",
              "validation_file": str(tmp_path / "validation.jsonl"), "test_file": str(tmp_path / "test.jsonl"),
              "output_dir": str(tmp_path / "out"), "do_train": False, "do_eval": True, "do_predict": True,
              "per_device_eval_batch_size": 2, "generation_num_beams": 1, "report_to": "none", "disable_tqdm": True}
    config_path = tmp_path / "predict.yaml"
    config_path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    completed = launch(tmp_path, REPO / "train_translation.py", str(config_path), "--use_cpu", "true")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "world size 2, process 0" in completed.stdout
    for prefix, split in (("eval", "validation"), ("test", "test")):
        hypotheses = (tmp_path / "out" / f"{prefix}_hypotheses.txt").read_text(encoding="utf-8").splitlines()
        assert hypotheses == [target for _, target in pairs[split]], prefix
        results = json.loads((tmp_path / "out" / f"{prefix}_results.json").read_text())
        assert results[f"{prefix}_bleu"] == pytest.approx(100) and results[f"{prefix}_samples"] == 6


# Runs train_translation.py's main(); once checkpoint-<KILL_AT_STEP> is saved, every process ends at once (os._exit,
# as after a SIGKILL: no cleanup), after the others have saved it too.
KILLED_AFTER_A_CHECKPOINT_WORKER = '''
import os, sys
from hf_relpos.translation import trainer, training

kill_at_step = int(os.environ.get("KILL_AT_STEP", "0"))
save_checkpoint = trainer.TranslationTrainer._save_checkpoint

def save_checkpoint_then_die(self, model, trial):
    save_checkpoint(self, model, trial)
    if self.state.global_step == kill_at_step:
        self.accelerator.wait_for_everyone()
        os._exit(137)

trainer.TranslationTrainer._save_checkpoint = save_checkpoint_then_die
training.main(sys.argv[1:])
'''


def logged_steps_and_evaluations(output_dir: Path) -> tuple[list[tuple], list[tuple]]:
    """(step, loss, learning rate) of each logged training step and (step, loss, BLEU) of each evaluation in
    output_dir's trainer_state.json."""
    log = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return ([(entry["step"], entry["loss"], entry["learning_rate"]) for entry in log if "loss" in entry],
            [(entry["step"], entry["eval_loss"], entry["eval_bleu"]) for entry in log if "eval_loss" in entry])


@pytest.mark.slow
def test_two_processes_killed_after_a_checkpoint_resume_to_bitwise_the_weights_of_an_uninterrupted_run(tmp_path):
    """Both processes killed once checkpoint-3 is saved (the first step of the second epoch: gradient accumulation 3
    over each process's batches, the last step of an epoch taking the remainder), resumed with `last`, end with the
    losses, learning rates and evaluations (every 3 steps) of an uninterrupted two-process run, and bitwise its
    weights: each process's random state, its share of the token-budget batches and the batches skipped in the
    resumed epoch, with loader workers kept across epochs (`dataloader_persistent_workers`)."""
    from safetensors.torch import load_file

    config_path, _ = write_config(tmp_path)
    worker = tmp_path / "worker.py"
    worker.write_text(KILLED_AFTER_A_CHECKPOINT_WORKER, encoding="utf-8")
    settings = ["--use_cpu", "true", "--max_steps", "6", "--gradient_accumulation_steps", "3", "--save_strategy",
                "steps", "--save_steps", "3", "--eval_strategy", "steps", "--eval_steps", "3",
                "--dataloader_num_workers", "1", "--dataloader_persistent_workers", "true"]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    completed = launch(tmp_path, worker, str(config_path), *settings, "--output_dir", str(reference))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    completed = launch(tmp_path, worker, str(config_path), *settings, "--output_dir", str(resumed),
                       environment={"KILL_AT_STEP": "3"})
    assert completed.returncode != 0 and last_complete_checkpoint(resumed).name == "checkpoint-3"
    assert not (resumed / "model.safetensors").exists()
    completed = launch(tmp_path, worker, str(config_path), *settings, "--output_dir", str(resumed),
                       "--resume_from_checkpoint", "last")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert logged_steps_and_evaluations(resumed) == logged_steps_and_evaluations(reference)
    expected, actual = (load_file(folder / "model.safetensors") for folder in (reference, resumed))
    assert [name for name, tensor in expected.items() if not torch.equal(actual[name], tensor)] == []


@pytest.mark.slow
def test_two_process_training_with_pooled_batches_splits_each_epoch(tmp_path):
    """length_pool_factor: an epoch is a fixed-length slice of the stream of pooled passes; the ranks still train
    the same number of steps on disjoint batches of that slice (the first epoch lies within the first pass: each
    example at most once)."""
    config_path, _ = write_config(tmp_path)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    (tmp_path / "records").mkdir()
    completed = launch(tmp_path, worker, str(config_path), "--use_cpu", "true", "--length_pool_factor", "1",
                       "--warmup_steps", "1000")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    # the same warning on each rank was printed once per process (8 copies on 8 GPUs)
    assert (completed.stdout + completed.stderr).count("warmup_steps 1000 is not below the run's") == 1
    ranks = [json.loads((tmp_path / "records" / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0]["steps"] > 0 and ranks[0]["steps"] == ranks[1]["steps"] == len(ranks[0]["epoch_batches"])
    examples = [index for r in ranks for batch in r["epoch_batches"] for index in batch]
    assert len(examples) == len(set(examples)), "no example twice in one epoch, across both ranks"


# One backward of a one-layer shaw model under DistributedDataParallel (gloo), each rank printing that it ended.
SHAW_DDP_WORKER = '''
import torch, torch.distributed
import hf_relpos
from hf_relpos.testing import tiny_config
torch.distributed.init_process_group("gloo")
torch.manual_seed(0)
config = tiny_config("shaw", encoder_layers=1, decoder_layers=1)
model = torch.nn.parallel.DistributedDataParallel(hf_relpos.RelPosTransformerForConditionalGeneration(config).train())
model(input_ids=torch.randint(3, 40, (2, 7)), labels=torch.randint(3, 40, (2, 5))).loss.backward()
print(f"rank {torch.distributed.get_rank()} backward done", flush=True)
torch.distributed.destroy_process_group()
'''


@pytest.mark.slow
def test_a_one_layer_shaw_model_under_ddp_has_gradients_in_its_buckets_layout(tmp_path):
    """DDP copies each gradient into its bucket and warns where the strides differ: a one-layer stack's a^K / a^V
    tables [1, 2k+1, d] get gradients laid out as they are (`padded_table`), not as the padded tables."""
    worker = tmp_path / "shaw_ddp.py"
    worker.write_text(SHAW_DDP_WORKER, encoding="utf-8")
    completed = launch(tmp_path, worker)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "rank 0 backward done" in completed.stdout and "rank 1 backward done" in completed.stdout
    assert "Grad strides do not match bucket view strides" not in completed.stderr, completed.stderr[-3000:]


@pytest.mark.slow
def test_processes_the_trainer_does_not_use_stop_before_anything_is_written(tmp_path):
    """Without --use_cpu true on a machine without GPUs, accelerate starts two processes in one gloo group but the
    Trainer runs each on its own (world size 1): each would train alone and write the same output_dir."""
    if torch.cuda.is_available():
        pytest.skip("with GPUs the Trainer uses the process group")
    config_path, output_dir = write_config(tmp_path)
    completed = launch(tmp_path, REPO / "train_translation.py", str(config_path))
    assert completed.returncode != 0
    message = (
        "train_translation.py: error: a torch.distributed process group of 2 processes is initialised, but the "
        "Trainer uses world size 1: each process would train alone and write the same output_dir. On CPU, pass "
        "--use_cpu true (accelerate launch --config_file configs/accelerate/cpu_2proc.yaml train_translation.py "
        "CONFIG.yaml --use_cpu true); on GPUs, check that CUDA is available")
    # One error; the other process's warnings share the stream and may follow it on the same line.
    assert completed.stderr.count("train_translation.py: error:") == 1, completed.stderr[-3000:]
    assert message in completed.stderr, completed.stderr[-3000:]
    assert not output_dir.exists()


def test_too_few_training_pairs_for_the_processes_stop_before_anything_is_written(tmp_path):
    """3 training pairs of 41 tokens (40 words the tokenizer keeps whole, and </s>), each alone in a batch at
    max_tokens_per_batch 64, make 3 batches, which 2 processes cannot take one each per step (a batch of one pair
    does not split): one error line naming the settings (exit status 2, no traceback), found when the training pairs
    are tokenized, before the tokenizer or any prepared data is saved."""
    config_path, output_dir = write_config(tmp_path)
    english = ["house", "cat", "dog", "tree", "water", "light", "stone", "bird"]
    german = ["haus", "katze", "hund", "baum", "wasser", "licht", "stein", "vogel"]
    lines = [json.dumps({"translation": {"en": " ".join(english[(i * start) % 8] for i in range(40)),
                                         "de": " ".join(german[(i * start) % 8] for i in range(40))}})
             for start in (1, 3, 5)]
    train_file = tmp_path / "three.jsonl"
    train_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    completed = launch(tmp_path, REPO / "train_translation.py", str(config_path), "--use_cpu", "true",
                       "--train_file", str(train_file), "--max_tokens_per_batch", "64")
    assert completed.returncode != 0
    assert "exitcode  : 2 " in completed.stderr, completed.stderr[-3000:]   # rank 0, as torchrun reports it
    assert "ValueError" not in completed.stderr and "hf_relpos" not in completed.stderr, completed.stderr[-3000:]
    assert completed.stderr.count("train_translation.py: error:") == 1, completed.stderr[-3000:]
    assert (
        "train_translation.py: error: max_tokens_per_batch=64 cuts the 3 training pairs into 3 batches, and 2 "
        "processes need a multiple of 2 non-empty batches (each process takes one per step), which splitting batches "
        "cannot reach with 3 pairs: raise max_tokens_per_batch (fewer, fuller batches), use more training pairs, or "
        "launch fewer processes") in completed.stderr
    assert not output_dir.exists()


def launch_machines(tmp_path: Path, script: Path, *arguments: str) -> list[subprocess.CompletedProcess]:
    """Two machines of one process each, simulated on this one: two `accelerate launch --num_machines 2` commands
    (machine ranks 0 and 1, one rendezvous), each with its own temporary folder as separate machines have; the
    output_dir of the arguments is the folder the machines share (a network filesystem)."""
    port = str(free_port())
    started = []
    for machine in range(2):
        temporary = tmp_path / f"machine{machine}-tmp"
        temporary.mkdir()
        environment = dict(os.environ, PYTHONPATH=checkout_first_on_path(), TMPDIR=str(temporary))
        logs = [(tmp_path / f"machine{machine}.{stream}").open("w+", encoding="utf-8") for stream in ("out", "err")]
        started.append((subprocess.Popen(
            [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "2",
             "--machine_rank", str(machine), "--num_processes", "2", "--main_process_ip", "127.0.0.1",
             "--main_process_port", port, "--rdzv_backend", "static", "--same_network", "--mixed_precision", "no",
             "--dynamo_backend", "no", str(script), *arguments],
            stdout=logs[0], stderr=logs[1], text=True, cwd=tmp_path, env=environment), logs))
    completed = []
    for process, logs in started:
        try:
            process.wait(timeout=300)
        finally:
            process.kill()
        stdout, stderr = (log.seek(0) or log.read() for log in logs)
        for log in logs:
            log.close()
        completed.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return completed
    return completed


def test_two_machines_sharing_output_dir_start_afresh_over_an_earlier_runs_tokenizer(tmp_path):
    """A fresh run (overwrite_output_dir) of two machines into an output_dir they share, holding the tokenizer of an
    earlier run with other settings: process 0, which replaces it, prepares first, and the other machine's process
    then loads the new tokenizer and data it saved. It used to prepare at the same time on its own machine, read the
    earlier run's tokenizer there and stop with "holds a tokenizer trained with other settings" (a fresh run does
    not keep it), while process 0 trained on."""
    from hf_relpos.translation.tokenization import tokenizer_settings, train_joint_tokenizer
    from hf_relpos.translation.tokenizer_setup import save_tokenizer

    config_path, output_dir = write_config(tmp_path)
    earlier = train_joint_tokenizer(["an earlier corpus", "ein früherer Korpus"] * 5, vocab_size=270)
    save_tokenizer(earlier, output_dir, tokenizer_settings("0" * 64, 270, 1.0, "an earlier corpus"))
    machines = launch_machines(tmp_path, REPO / "train_translation.py", str(config_path), "--use_cpu", "true",
                               "--overwrite_output_dir", "true")
    for machine, completed in enumerate(machines):
        assert completed.returncode == 0, f"machine {machine}: " + completed.stdout[-3000:] + completed.stderr[-3000:]
    first, second = (completed.stdout for completed in machines)
    assert "world size 2, process 0" in first
    assert "Training a joint BPE tokenizer" in first and "Training a joint BPE tokenizer" not in second
    assert f"Reusing the tokenizer saved in {output_dir} (trained with this run's settings)" in second
    assert "Reusing the train data prepared in" in second
    settings = json.loads((output_dir / "tokenizer_training.json").read_text())
    assert settings["tokenizer_vocab_size"] == 456 and settings["training_data_sha256"] != "0" * 64
    assert (output_dir / "model.safetensors").is_file() and (output_dir / "eval_hypotheses.txt").is_file()


@pytest.mark.parametrize(("rank", "local_rank", "prints"), [(0, 0, True), (1, 1, False), (2, 0, True)],
                         ids=["process_0", "another_process_of_machine_0", "main_process_of_machine_1"])
def test_a_checks_error_is_printed_once_on_each_machine(monkeypatch, capsys, rank, local_rank, prints):
    """Under accelerate launch on two machines of two processes, the main process of each machine prints the one-line
    error (exit status 2 on every process): an error that machine 1's processes alone meet (its files, its disk) used
    to be printed by no process at all, since only process 0 printed, leaving an exit status 2 and no reason."""
    from hf_relpos.translation import training
    from hf_relpos.translation.arguments import ConfigError

    def stop(argv):
        raise ConfigError("output_dir 'out' holds a tokenizer trained with other settings")

    monkeypatch.setattr(training, "run", stop)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as stopped:
        training.main(["config.yaml"])
    assert stopped.value.code == 2
    line = "train_translation.py: error: output_dir 'out' holds a tokenizer trained with other settings\n"
    assert capsys.readouterr().err == (line if prints else "")


# Runs train_translation.py's main() in each process; the rank SIGTERM_RANK sends itself a SIGTERM (to its own pid
# alone, the other rank gets none) in its first call of TranslationTrainer.<SIGTERM_METHOD> once SIGTERM_STEP steps
# are taken, its JIT checkpoint requested at once (transformers waits 3 s for a SIGKILL to follow by default; KILL_WAIT
# sets it). With SIGTERM_TO=launcher it sends the SIGTERM to the `accelerate launch` process instead (its pid in
# RECORD_DIR/launcher, written by `launch_within`) and waits in that call until its own request is marked. Each rank
# records the steps it trained from, saved a checkpoint at, evaluated at and stopped at, when SIGTERMs reached it,
# and its exit status.
SIGTERM_WORKER = '''
import json, os, signal, sys, time
from transformers.trainer_jit_checkpoint import CheckpointManager
from hf_relpos.translation import trainer, training

CheckpointManager.__init__.__defaults__ = (int(os.environ.get("KILL_WAIT", "0")),)
Trainer = trainer.TranslationTrainer
rank, records = int(os.environ["RANK"]), os.environ["RECORD_DIR"]
with open(os.path.join(records, f"pid{rank}"), "w") as handle:
    handle.write(str(os.getpid()))
record = {"rank": rank, "trained_from": [], "saved_at": [], "evaluated_at": [], "calls_after_the_signal": 0,
          "signalled": False, "sigterms_at": []}
sigterm_handler = CheckpointManager._sigterm_handler

def noted_sigterm(self, *args):
    record["sigterms_at"].append(time.time())
    return sigterm_handler(self, *args)

CheckpointManager._sigterm_handler = noted_sigterm

def noting(name, steps):
    original = getattr(Trainer, name)

    def noted(self, *args, **kwargs):
        record[steps].append(self.state.global_step)
        return original(self, *args, **kwargs)

    setattr(Trainer, name, noted)

if os.environ.get("STOP_GROUP_OF_ITS_OWN") and hasattr(trainer, "_StopAgreement"):
    # as under nccl, whose default group takes no CPU tensors: the agreement creates a gloo group of its own
    import torch.distributed as dist
    among_the_processes = trainer._StopAgreement.among_the_processes.__func__

    def among_nccl_processes(cls):
        get_backend, dist.get_backend = dist.get_backend, lambda group=None: "nccl"
        try:
            agreement = among_the_processes(cls)
        finally:
            dist.get_backend = get_backend
        record["group_of_its_own"] = agreement.group is not None and dist.get_backend(agreement.group) == "gloo"
        return agreement

    trainer._StopAgreement.among_the_processes = classmethod(among_nccl_processes)
noting("training_step", "trained_from")
noting("_save_checkpoint", "saved_at")
noting("evaluate", "evaluated_at")
method = os.environ.get("SIGTERM_METHOD")
if method:
    original = getattr(Trainer, method)

    def signalled(self, *args, **kwargs):
        if record["signalled"]:
            record["calls_after_the_signal"] += 1
        elif rank == int(os.environ["SIGTERM_RANK"]) and self.state.global_step == int(os.environ["SIGTERM_STEP"]):
            record["signalled"] = True
            target = os.getpid()
            if os.environ.get("SIGTERM_TO") == "launcher":   # the `accelerate launch` process the test started
                with open(os.path.join(records, "launcher")) as handle:
                    target = int(handle.read())
                record.update(launcher=target, parent=os.getppid(), signalled_at=time.time())
            os.kill(target, signal.SIGTERM)
            if target == os.getpid():
                time.sleep(0.5)   # the handler's timer marks the checkpoint as requested
            else:   # until the launcher's SIGTERM has come and the handler's timer has marked the request
                manager = self._jit_checkpoint.jit_manager
                while not manager.is_checkpoint_requested and time.time() < record["signalled_at"] + 60:
                    time.sleep(0.05)
                record["requested_at"] = time.time()
        return original(self, *args, **kwargs)

    setattr(Trainer, method, signalled)
original_train = Trainer.train

def train(self, *args, **kwargs):
    try:
        return original_train(self, *args, **kwargs)
    finally:
        record["stopped_at"] = self.state.global_step

Trainer.train = train
try:
    training.main(sys.argv[1:])
    record["exit"] = 0
except SystemExit as exit:
    record["exit"] = exit.code
    raise
finally:
    with open(os.path.join(records, f"{os.environ['RECORD_NAME']}{rank}.json"), "w") as handle:
        json.dump(record, handle)
'''


def launch_within(seconds: float, tmp_path: Path, script: Path, *arguments: str,
                  environment: dict[str, str]) -> subprocess.CompletedProcess:
    """`launch`, failing the test when it has not ended within `seconds` (processes waiting on each other in
    collectives), after killing the launcher and the workers (in sessions of their own: they write their pids to
    RECORD_DIR/pid<rank>). The launcher's pid is written to RECORD_DIR/launcher as soon as it has started."""
    environment = dict(os.environ, RECORD_DIR=str(tmp_path / "records"), PYTHONPATH=checkout_first_on_path(),
                       **environment)
    process = subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_CONFIG),
         "--main_process_port", str(free_port()), str(script), *arguments],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=environment)
    (tmp_path / "records" / "launcher").write_text(str(process.pid))
    try:
        stdout, stderr = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        for pid_file in (tmp_path / "records").glob("pid*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"the launch did not end within {seconds} s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.parametrize(("method", "rank", "stop_step", "group_of_its_own"),
                         [("training_step", 1, 3, False), ("prediction_step", 0, 2, True)],
                         ids=["in-a-step-to-rank-1", "in-an-evaluation-to-rank-0-gloo-group-of-its-own"])
def test_a_sigterm_to_one_rank_stops_both_at_the_same_step_with_its_checkpoint(tmp_path, method, rank, stop_step,
                                                                               group_of_its_own):
    """enable_jit_checkpoint under two processes, a SIGTERM delivered to one rank only (to its pid: a scheduler's
    SIGTERMs reach the ranks at different instants, or only one): the ranks agree on the stop at each check, so both
    stop at the same step, rank 1's SIGTERM in step 3 (checkpointed at the step's end), or rank 0's in the first
    evaluation batch at step 2 (eval_steps 2: the evaluation stops at that batch on both), save its checkpoint
    together and end with exit status 143, the error said once (by the main process). Each noticed the request by
    itself before: the one that had it entered the checkpoint's collectives while the other ran the next step's or
    batch's, and both waited there (until ddp_timeout). Resumed, both go on from that step to max_steps, the
    evaluation the SIGTERM stopped made again by both before their first step (it was left out). The
    agreement's all-reduce runs on the default group under gloo, and on a gloo group of its own otherwise (nccl,
    whose group takes no CPU tensors: its backend made to read "nccl" in the second case)."""
    config_path, output_dir = write_config(tmp_path)
    settings = ["--use_cpu", "true", "--max_steps", "5", "--enable_jit_checkpoint", "true", "--do_eval", "false",
                "--eval_strategy", "steps", "--eval_steps", "2", "--per_device_eval_batch_size", "1"]
    worker = tmp_path / "worker.py"
    worker.write_text(SIGTERM_WORKER, encoding="utf-8")
    records = tmp_path / "records"
    records.mkdir()
    signal_at = {"SIGTERM_METHOD": method, "SIGTERM_RANK": str(rank), "SIGTERM_STEP": str(stop_step - 1)
                 if method == "training_step" else str(stop_step), "RECORD_NAME": "stopped",
                 **({"STOP_GROUP_OF_ITS_OWN": "1"} if group_of_its_own else {})}
    completed = launch_within(120, tmp_path, worker, str(config_path), *settings, environment=signal_at)
    output = completed.stdout[-3000:] + completed.stderr[-3000:]
    stopped = [json.loads((records / f"stopped{r}.json").read_text()) for r in range(2)]
    assert [r["signalled"] for r in stopped] == [r == rank for r in range(2)], output
    assert [r.get("group_of_its_own", False) for r in stopped] == [group_of_its_own] * 2, output
    assert [(r["exit"], r["stopped_at"], r["saved_at"]) for r in stopped] == [(143, stop_step, [stop_step])] * 2, output
    assert [r["calls_after_the_signal"] for r in stopped] == [0, 0], output   # no step or batch after it
    assert completed.returncode != 0, output
    assert completed.stderr.count(f"error: training was stopped by SIGTERM at step {stop_step} ") == 1, output
    assert last_complete_checkpoint(output_dir).name == f"checkpoint-{stop_step}"
    assert sorted(path.name for path in (output_dir / f"checkpoint-{stop_step}").glob("rng_state_*")) == [
        "rng_state_0.pth", "rng_state_1.pth"]

    completed = launch_within(120, tmp_path, worker, str(config_path), *settings, "--resume_from_checkpoint", "last",
                              environment={"RECORD_NAME": "resumed"})
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    resumed = [json.loads((records / f"resumed{r}.json").read_text()) for r in range(2)]
    assert [r["trained_from"] for r in resumed] == [list(range(stop_step, 5))] * 2
    assert [r["evaluated_at"] for r in resumed] == [   # at 5, the last step's and the final model's
        [*([2] if method == "prediction_step" else []), 4, 5, 5]] * 2
    assert json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == 5


def test_a_sigterm_to_the_launcher_alone_stops_both_ranks_at_the_same_step_with_its_checkpoint(tmp_path):
    """enable_jit_checkpoint under `accelerate launch` with two processes, a SIGTERM sent to the launcher alone (the
    `accelerate launch` process the test started, whose torchrun elastic agent sends SIGTERM to each process and
    SIGKILL TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s, later), by rank 0 in step 3: both ranks stop at step 3 with its
    checkpoint, saved whole, and end with exit status 143 before any SIGKILL, the launcher too (128 + SIGTERM), well
    within the 30 s; resumed, both go on from step 3 to max_steps."""
    config_path, output_dir = write_config(tmp_path)
    settings = ["--use_cpu", "true", "--max_steps", "5", "--enable_jit_checkpoint", "true", "--do_eval", "false"]
    worker = tmp_path / "worker.py"
    worker.write_text(SIGTERM_WORKER, encoding="utf-8")
    records = tmp_path / "records"
    records.mkdir()
    signal_at = {"SIGTERM_METHOD": "training_step", "SIGTERM_RANK": "0", "SIGTERM_STEP": "2",
                 "SIGTERM_TO": "launcher", "KILL_WAIT": "3", "RECORD_NAME": "stopped"}
    completed = launch_within(120, tmp_path, worker, str(config_path), *settings, environment=signal_at)
    ended_at = time.time()
    output = completed.stdout[-3000:] + completed.stderr[-3000:]
    stopped = [json.loads((records / f"stopped{r}.json").read_text()) for r in range(2)]
    launcher = int((records / "launcher").read_text())
    assert (stopped[0]["launcher"], stopped[0]["parent"]) == (launcher, launcher), output   # not a rank's pid
    assert [r["signalled"] for r in stopped] == [True, False], output
    signalled_at = stopped[0]["signalled_at"]
    assert [len(r["sigterms_at"]) for r in stopped] == [1, 1], output   # forwarded to each, once
    assert all(signalled_at < r["sigterms_at"][0] < signalled_at + 5 for r in stopped), output
    assert [(r["exit"], r["stopped_at"], r["saved_at"]) for r in stopped] == [(143, 3, [3])] * 2, output
    assert [r["calls_after_the_signal"] for r in stopped] == [0, 0], output
    assert completed.returncode == 143, output
    # torchrun's agent logs its SIGKILLs as "Unable to shutdown process P via 15, forcefully exiting via 9"
    assert "forcefully exiting" not in completed.stderr, output
    assert completed.stderr.count("error: training was stopped by SIGTERM at step 3 ") == 1, output
    assert last_complete_checkpoint(output_dir).name == "checkpoint-3"
    assert sorted(path.name for path in (output_dir / "checkpoint-3").glob("rng_state_*")) == [
        "rng_state_0.pth", "rng_state_1.pth"]
    assert ended_at - signalled_at < 20, output   # 5.5 s (of them the 3 s wait) on a shared 2-core machine

    completed = launch_within(120, tmp_path, worker, str(config_path), *settings, "--resume_from_checkpoint", "last",
                              environment={"RECORD_NAME": "resumed"})
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    resumed = [json.loads((records / f"resumed{r}.json").read_text()) for r in range(2)]
    assert [r["trained_from"] for r in resumed] == [list(range(3, 5))] * 2
    assert json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == 5
