"""Stream training with Transformer-XL memory through the real Trainer, and stream perplexity."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from test_xl_memory import recurrence_by_loop
from transformers import TrainingArguments

import hf_relpos
from hf_relpos.model.modeling_relpos import token_cross_entropy
from hf_relpos.publish.records import RECIPE, RunRecord, read_run_records
from hf_relpos.tools.lm_memory import MemoryTrainer, SegmentedStream, stream_perplexity

BATCH, SEGMENT = 2, 5


def xl_lm(mem_len: int = SEGMENT) -> hf_relpos.RelPosTransformerForCausalLM:
    torch.manual_seed(0)
    return hf_relpos.RelPosTransformerForCausalLM(tiny_config("xl", mem_len=mem_len))


def tokens(count: int = 63) -> torch.Tensor:
    return torch.randint(4, 40, (count,), generator=torch.Generator().manual_seed(2))


def test_segmented_stream_rows_continue_across_batches_and_cover_every_target_once():
    stream = tokens()
    data = SegmentedStream(stream, BATCH, SEGMENT)
    row_length = (stream.numel() - 1) // BATCH
    assert len(data) == BATCH * (row_length // SEGMENT)
    for index in range(len(data)):
        item = data[index]
        row, segment = index % BATCH, index // BATCH
        start = row * row_length + segment * SEGMENT
        assert torch.equal(item["input_ids"], stream[start : start + SEGMENT])
        assert torch.equal(item["targets"], stream[start + 1 : start + SEGMENT + 1])
        assert item["segment"] == segment


def trainer_for(model, tmp_path, learning_rate: float, steps: int) -> MemoryTrainer:
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
        max_steps=steps, learning_rate=learning_rate, logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0,
    )
    data = SegmentedStream(tokens(), BATCH, SEGMENT)
    return MemoryTrainer(model=model, args=args, train_dataset=data, eval_dataset=data)


@pytest.mark.numerics
def test_trainer_carries_memory_between_steps(tmp_path):
    """With learning rate 0 the Trainer feeds each step exactly the mems a manual loop gets from the previous step,
    and its step losses equal the loop's."""
    model = xl_lm()
    trainer = trainer_for(model, tmp_path, learning_rate=0.0, steps=5)
    received = []
    forward = model.forward

    def recording_forward(*args, **kwargs):
        received.append(kwargs.get("mems"))
        return forward(*args, **kwargs)

    model.forward = recording_forward
    trainer.train()
    del model.forward
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    data = SegmentedStream(tokens(), BATCH, SEGMENT)
    model.eval()
    mems, expected_mems, expected = None, [], []
    with torch.no_grad():
        for step in range(5):
            expected_mems.append(mems)
            batch = [data[step * BATCH + row] for row in range(BATCH)]
            outputs = model(input_ids=torch.stack([b["input_ids"] for b in batch]), mems=mems)
            mems = outputs.mems
            expected.append(token_cross_entropy(outputs.logits, torch.stack([b["targets"] for b in batch])).item())
    assert len(logged) == 5 and len(received) == 5
    assert received[0] is None
    for got, want in zip(received[1:], expected_mems[1:], strict=True):
        assert len(got) == len(want) and all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want, strict=True))
        assert not any(g.requires_grad for g in got)
    assert all(math.isclose(a, b, rel_tol=1e-3) for a, b in zip(logged, expected, strict=True))


def test_trainer_batch_size_must_match_the_stream(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=BATCH + 1, report_to=[],
                             use_cpu=True)
    with pytest.raises(ValueError, match=r"per_device_train_batch_size \(3\) must equal the stream's batch_size \(2\)"):
        MemoryTrainer(model=xl_lm(), args=args, train_dataset=SegmentedStream(tokens(), BATCH, SEGMENT))


def test_trainer_refuses_label_smoothing_it_would_ignore(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=BATCH, report_to=[],
                             use_cpu=True, label_smoothing_factor=0.1)
    with pytest.raises(ValueError, match=r"label_smoothing_factor must be 0 for MemoryTrainer .*got 0.1"):
        MemoryTrainer(model=xl_lm(), args=args, train_dataset=SegmentedStream(tokens(), BATCH, SEGMENT))


def test_trainer_learns_and_evaluates_with_memory(tmp_path):
    model = xl_lm()
    trainer = trainer_for(model, tmp_path, learning_rate=3e-3, steps=30)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < before


@pytest.mark.numerics
def test_stream_perplexity_with_full_memory_equals_one_long_pass():
    model = xl_lm(mem_len=0).double()
    stream = tokens(31)
    with torch.no_grad():
        logits = model(input_ids=stream[None, :30]).logits
    whole = math.exp(token_cross_entropy(logits, stream[None, 1:31]).item())
    assert math.isclose(stream_perplexity(model, stream, segment_length=6, mem_len=30), whole, rel_tol=1e-12)
    assert not math.isclose(stream_perplexity(model, stream, segment_length=6, mem_len=0), whole, rel_tol=1e-6)


@pytest.mark.numerics
@pytest.mark.parametrize(("batch_size", "segment_length", "mem_len"), [(2, 5, 3), (3, 4, 6)])
def test_stream_perplexity_with_a_memory_shorter_than_the_stream_is_the_recurrence_by_hand(batch_size, segment_length,
                                                                                          mem_len):
    """exp of the mean NLL of every target of the batchified stream, with logits of the float64 recurrence over each
    row alone (memory shorter than the row, another mem_len than the config's)."""
    model = xl_lm(mem_len=SEGMENT).double()
    stream = tokens(34)
    row_length = (stream.numel() - 1) // batch_size
    usable = row_length // segment_length * segment_length
    negative_log_likelihood = 0.0
    with torch.no_grad():
        for row in range(batch_size):
            start = row * row_length
            log_probabilities = recurrence_by_loop(model, stream[start : start + usable], segment_length,
                                                   mem_len).log_softmax(-1)
            for position, target in enumerate(stream[start + 1 : start + usable + 1].tolist()):
                negative_log_likelihood -= float(log_probabilities[position, target])
    expected = math.exp(negative_log_likelihood / (batch_size * usable))
    got = stream_perplexity(model, stream, segment_length=segment_length, mem_len=mem_len, batch_size=batch_size)
    assert math.isclose(got, expected, rel_tol=1e-12)


def test_xl_perplexity_experiment_runs_end_to_end(tmp_path):
    """The docs/results.md perplexity command, shrunk: every variant and context gets a finite perplexity."""
    script = Path(__file__).resolve().parents[1] / "experiments" / "xl_perplexity.py"
    command = [sys.executable, str(script), "--steps", "3", "--d-model", "16", "--layers", "1", "--heads", "2",
               "--segment", "8", "--contexts", "8", "16", "--eval-tokens", "400", "--batch-size", "2",
               "--out", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    for variant in ("xl+memory", "xl", "absolute"):
        assert set(results[variant]["perplexity"]) == {"8", "16"}
        assert all(math.isfinite(p) and p > 1 for p in results[variant]["perplexity"].values())
    assert (tmp_path / "perplexity_vs_context.png").stat().st_size > 0
    # every model's typed run record: its scheme and memory, and its perplexities as metrics
    typed = {record.system: record for record in read_run_records(tmp_path / "results.json")}
    assert {name: (record.model["position_scheme"], record.model["mem_len"]) for name, record in typed.items()} == {
        "xl+memory": ("xl", 8), "xl": ("xl", 0), "absolute": ("absolute", 0)}
    for variant, record in typed.items():
        assert (record.role, record.steps, record.seed) == (RECIPE, 3, 0)
        assert record.metrics == {f"context {context}": {"perplexity": value}
                                  for context, value in results[variant]["perplexity"].items()}
        assert RunRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


@pytest.mark.parametrize(("segment", "contexts", "message"), [
    ("8", ["4", "16"], "--contexts must each be at least --segment (8), got 4"),
    ("8", ["0"], "--contexts must each be at least --segment (8), got 0"),
    ("0", ["8"], "--segment must be at least 1, got 0"),
])
def test_xl_perplexity_refuses_contexts_shorter_than_a_segment_before_training(tmp_path, segment, contexts, message):
    """A context below --segment is one usage error before any model trains: xl+memory would score a whole segment
    under that context's label, and a context of 0 stopped with ZeroDivisionError after the first model trained."""
    script = Path(__file__).resolve().parents[1] / "experiments" / "xl_perplexity.py"
    command = [sys.executable, str(script), "--steps", "3", "--d-model", "16", "--layers", "1", "--heads", "2",
               "--segment", segment, "--contexts", *contexts, "--eval-tokens", "400", "--batch-size", "2",
               "--out", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr[-3000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out" / "results.json").exists()


@pytest.mark.parametrize(("options", "message"), [
    (["--eval-tokens", "100000000"], "--eval-tokens 100000000: leaves 0 bytes of the"),
    (["--eval-tokens", "16"], "--eval-tokens 16: 16 bytes to evaluate on, fewer than the longest --contexts + 1 = 17"),
])
def test_xl_perplexity_refuses_a_text_too_short_for_its_split_before_training(tmp_path, options, message):
    """An --eval-tokens that leaves no training segment per row, or too few bytes for the longest context, is one
    error before any model trains (it was the Trainer's `ValueError: __len__() should return >= 0`, or
    SegmentedStream's ValueError after the first model had trained)."""
    script = Path(__file__).resolve().parents[1] / "experiments" / "xl_perplexity.py"
    command = [sys.executable, str(script), "--steps", "3", "--d-model", "16", "--layers", "1", "--heads", "2",
               "--segment", "8", "--contexts", "8", "16", "--batch-size", "2", *options, "--out", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result.stderr[-3000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out" / "results.json").exists()


@pytest.mark.parametrize("length", [0, 1, 2])
def test_a_stream_too_short_for_one_segment_per_row_is_refused_even_when_empty(length):
    """An empty stream is refused with the same message as any stream too short (it had a negative length, which
    the Trainer reported as `__len__() should return >= 0`)."""
    with pytest.raises(ValueError, match=f"a stream of {length} tokens is too short for batch_size=2"):
        SegmentedStream(torch.arange(length), 2, 4)


@pytest.mark.parametrize("training", [True, False])
def test_stream_perplexity_leaves_the_model_in_the_mode_it_was_given_in(training):
    """It switched the model to eval mode and left it there, so a training loop that measured perplexity between
    steps went on training without dropout; the mode is restored on return and on an error."""
    model = xl_lm().train(training)
    stream_perplexity(model, tokens(), segment_length=SEGMENT, mem_len=SEGMENT)
    assert model.training is training and all(module.training is training for module in model.modules())
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        stream_perplexity(model, tokens(), segment_length=SEGMENT, mem_len=SEGMENT, batch_size=0)
    assert model.training is training and all(module.training is training for module in model.modules())


def test_stream_perplexity_gives_each_module_its_own_mode_back():
    """It restored one flag for the whole model: a training model whose decoder's dropout had been frozen
    (`decoder.eval()`) came back with every module training; each module's own mode is restored, also on an error."""
    model = xl_lm().train()
    model.decoder.layers[0].eval()
    modes = {name: module.training for name, module in model.named_modules()}
    stream_perplexity(model, tokens(), segment_length=SEGMENT, mem_len=SEGMENT)
    assert {name: module.training for name, module in model.named_modules()} == modes
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        stream_perplexity(model, tokens(), segment_length=SEGMENT, mem_len=SEGMENT, batch_size=0)
    assert {name: module.training for name, module in model.named_modules()} == modes


@pytest.mark.parametrize(("batch_size", "segment_length", "message"), [
    (0, 4, r"batch_size must be an integer >= 1, got 0"),
    (-1, 4, r"batch_size must be an integer >= 1, got -1"),
    (2, 0, r"segment_length must be an integer >= 1, got 0"),
    (2, 2.5, r"segment_length must be an integer >= 1, got 2.5"),
])
def test_a_stream_batch_size_or_segment_length_below_1_is_one_error_naming_it(batch_size, segment_length, message):
    """0 was a raw ZeroDivisionError, a negative one called the stream too short; stream_perplexity cuts through
    SegmentedStream and says the same."""
    with pytest.raises(ValueError, match=f"^{message}$"):
        SegmentedStream(tokens(), batch_size, segment_length)
    with pytest.raises(ValueError, match=f"^{message}$"):
        stream_perplexity(xl_lm(), tokens(), segment_length=segment_length, mem_len=SEGMENT, batch_size=batch_size)
