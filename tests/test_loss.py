"""The loss follows the Trainer's contract: `num_items_in_batch` makes every labelled token of an optimizer step weigh
the same under gradient accumulation, with and without label smoothing, and a float64 model has a float64 loss; the
translation app's trainer keeps that over token-budget batches of uneven sizes, its label-smoothed loss in float64
too."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from conftest import tiny_config
from datasets import Dataset
from transformers import (
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

import hf_relpos
from hf_relpos import shift_tokens_right
from hf_relpos.translation.arguments import TranslationTrainingArguments
from hf_relpos.translation.tokenization import train_joint_tokenizer
from hf_relpos.translation.trainer import EvaluationSet, build_trainer

pytestmark = pytest.mark.numerics

LABELLED = (5, 1, 2, 4)  # labelled target tokens of the four examples: the micro-batches weigh differently


def seq2seq_examples() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(4)
    examples = []
    for count in LABELLED:
        labels = torch.randint(4, 40, (5,), generator=generator)
        labels[count:] = -100
        examples.append({
            "input_ids": torch.randint(4, 40, (6,), generator=generator),
            "attention_mask": torch.ones(6, dtype=torch.long),
            "decoder_input_ids": shift_tokens_right(labels[None], 0, 2)[0],
            "labels": labels,
        })
    return examples


def causal_examples() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    examples = []
    for count in LABELLED:
        input_ids = torch.randint(4, 40, (6,), generator=generator)
        labels = input_ids.clone()
        labels[count + 1:] = -100  # position 0 is never a target: `count` targets
        examples.append({"input_ids": input_ids, "labels": labels})
    return examples


def token_losses(model, batch: dict[str, torch.Tensor], label_smoothing: float) -> tuple[torch.Tensor, int]:
    """Sum over the labelled tokens of (1 - eps) (-log p_label) + eps mean_v (-log p_v), and their number."""
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    logits, labels = model(**inputs).logits, batch["labels"]
    if isinstance(model, hf_relpos.RelPosTransformerForCausalLM):
        logits, labels = logits[:, :-1], labels[:, 1:]
    log_probs = torch.log_softmax(logits, dim=-1)
    labelled = labels != -100
    nll = -log_probs.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    smooth = -log_probs.mean(-1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * smooth
    return per_token[labelled].sum(), int(labelled.sum())


def trainer_gradient(model, examples, label_smoothing: float, tmp_path) -> dict[str, torch.Tensor]:
    """One optimizer step of plain SGD (lr 1, no clipping) over two accumulated micro-batches of two examples: the
    parameter change is minus the gradient the Trainer applied."""
    seq2seq = not isinstance(model, hf_relpos.RelPosTransformerForCausalLM)
    arguments_class = Seq2SeqTrainingArguments if seq2seq else TrainingArguments
    args = arguments_class(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=1,
        learning_rate=1.0, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
        label_smoothing_factor=label_smoothing, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
        seed=0, dataloader_num_workers=0,
    )
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    trainer_class = Seq2SeqTrainer if seq2seq else Trainer
    trainer_class(model=model, args=args, train_dataset=examples, data_collator=default_data_collator).train()
    return {name: before[name] - parameter.detach() for name, parameter in model.named_parameters()}


def reference_gradient(model, examples, label_smoothing: float) -> dict[str, torch.Tensor]:
    """The gradient of the mean loss over all labelled tokens of all four examples, in one batch."""
    model.zero_grad()
    total, count = token_losses(model, default_data_collator(examples), label_smoothing)
    (total / count).backward()
    return {name: parameter.grad.detach().clone() for name, parameter in model.named_parameters()}


def tiny_float64(model_class):
    torch.manual_seed(0)
    return model_class(tiny_config("shaw")).double().train()


@pytest.mark.parametrize(
    "model_class, label_smoothing",
    [(hf_relpos.RelPosTransformerForConditionalGeneration, 0.0),
     (hf_relpos.RelPosTransformerForConditionalGeneration, 0.1),
     (hf_relpos.RelPosTransformerForCausalLM, 0.0),
     (hf_relpos.RelPosTransformerForCausalLM, 0.1)],
    ids=["seq2seq", "seq2seq-label_smoothing", "causal_lm", "causal_lm-label_smoothing"],
)
def test_gradient_accumulation_weighs_every_token_alike(model_class, label_smoothing, tmp_path):
    """The Trainer counts the labelled tokens of both micro-batches (`num_items_in_batch`); the model's loss (or
    the Trainer's LabelSmoother, which takes over the loss when label_smoothing_factor > 0) divides by that count,
    so the applied gradient is the one of the mean over all tokens of the step. Under a plain `Trainer` the
    LabelSmoother scores the causal LM's token t against label t+1 as the model's own loss does: transformers
    shifts only for the class names of its causal-LM table, which hf_relpos joins at import (it scored token t against
    label t, a copying objective, before)."""
    examples = seq2seq_examples() if model_class is hf_relpos.RelPosTransformerForConditionalGeneration else (
        causal_examples())
    expected = reference_gradient(tiny_float64(model_class), examples, label_smoothing)
    applied = trainer_gradient(tiny_float64(model_class), examples, label_smoothing, tmp_path)
    # transformers' LabelSmoother sums its smoothing term in float32, so the smoothed case is float32-exact only
    # (the translation app's trainer computes it in float64: test_the_apps_token_budget_steps_weigh_every_token_alike)
    tolerance = 1e-12 if label_smoothing == 0 else 1e-6
    for name, gradient in expected.items():
        assert (applied[name] - gradient).abs().max() < tolerance * max(1.0, gradient.abs().max().item()), name


@pytest.mark.parametrize("model_class", [hf_relpos.RelPosTransformerForConditionalGeneration,
                                         hf_relpos.RelPosTransformerForCausalLM], ids=["seq2seq", "causal_lm"])
def test_loss_is_the_token_sum_over_num_items_in_batch_and_stays_float64(model_class):
    model = tiny_float64(model_class).eval()
    examples = seq2seq_examples() if model_class is hf_relpos.RelPosTransformerForConditionalGeneration else (
        causal_examples())
    batch = default_data_collator(examples)
    with torch.no_grad():
        total, count = token_losses(model, batch, 0.0)
        mean = model(**batch).loss
        scaled = model(**batch, num_items_in_batch=torch.tensor(50)).loss
    assert mean.dtype == torch.float64 and model.accepts_loss_kwargs
    assert abs(mean.item() - total.item() / count) < 1e-12
    assert abs(scaled.item() - total.item() / 50) < 1e-12


@pytest.mark.parametrize(("labels", "decoder_input_ids", "message"), [
    (lambda ids: ids[0], None, r"labels must be a \[batch, length\] tensor of integer token ids \(-100: ignored\), got "
                               r"shape \[7\] and dtype torch.int64"),
    (lambda ids: ids.float(), None, r"labels must be a \[batch, length\] tensor of integer token ids \(-100: ignored\), "
                                    r"got shape \[2, 7\] and dtype torch.float32"),
    (lambda ids: ids, lambda ids: ids[:, :4], r"labels must hold one id per token of the decoder's inputs: shape "
                                              r"\[2, 4\], got \[2, 7\]"),
], ids=["one sentence", "float", "longer than the decoder inputs"])
def test_malformed_labels_are_one_error_naming_them(labels, decoder_input_ids, message):
    """A sentence's ids without the batch dimension, float ids, or one label per token of other decoder inputs: one
    ValueError naming labels, not an IndexError in the shift or a flattened size mismatch in the cross-entropy."""
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config())
    causal_lm = hf_relpos.RelPosTransformerForCausalLM(tiny_config(is_encoder_decoder=False))
    ids = torch.randint(3, 40, (2, 7))
    inputs = {} if decoder_input_ids is None else {"decoder_input_ids": decoder_input_ids(ids)}
    with pytest.raises(ValueError, match=f"^{message}$"):
        model(input_ids=ids, labels=labels(ids), **inputs)
    if decoder_input_ids is None:
        with pytest.raises(ValueError, match=f"^{message}$"):
            causal_lm(input_ids=ids, labels=labels(ids))
    else:
        with pytest.raises(ValueError, match=r"^labels must hold one id per token of the inputs: shape \[2, 4\], got "
                                             r"\[2, 7\]$"):
            causal_lm(input_ids=ids[:, :4], labels=labels(ids))


# (source, target) lengths, </s> included, of the token-budget examples: batches of a 20-token budget hold 1 to 3 of
# them, each with its own number of labelled tokens
TOKEN_BUDGET_LENGTHS = ((3, 2), (4, 6), (9, 3), (2, 4), (3, 2), (8, 7), (5, 5))


def token_budget_examples() -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(3)
    examples = []
    for source_length, target_length in TOKEN_BUDGET_LENGTHS:
        source = [*torch.randint(4, 40, (source_length - 1,), generator=generator).tolist(), 1]
        target = [*torch.randint(4, 40, (target_length - 1,), generator=generator).tolist(), 1]
        examples.append({"input_ids": source, "attention_mask": [1] * source_length, "labels": target,
                         "source_length": source_length, "target_length": target_length})
    return examples


@pytest.fixture(scope="module")
def pad_tokenizer():
    """A tokenizer for the app's collator (pad id 0, as the model's config), which pads the examples' ids."""
    return train_joint_tokenizer(["a small dog", "ein kleiner Hund"] * 10, vocab_size=270)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1], ids=["plain", "label_smoothing"])
@pytest.mark.parametrize("accumulation", [2, 3], ids=["two_of_three_batches", "whole_epoch"])
def test_the_apps_token_budget_steps_weigh_every_token_alike(pad_tokenizer, label_smoothing, accumulation, tmp_path):
    """The translation app's trainer (`build_trainer`, batches of at most max_tokens_per_batch padded tokens) takes
    one SGD step (lr 1) over `accumulation` token-budget batches of different sizes and numbers of labelled tokens:
    the step is minus the gradient of the mean loss over every labelled token of those batches in one batch, to
    1e-12 in float64, with label smoothing too (the Trainer's LabelSmoother summed its smoothing term in float32)."""
    examples = token_budget_examples()
    arguments = TranslationTrainingArguments(
        output_dir=str(tmp_path), max_tokens_per_batch=20, gradient_accumulation_steps=accumulation, max_steps=1,
        learning_rate=1.0, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
        label_smoothing_factor=label_smoothing, report_to="none", save_strategy="no", use_cpu=True,
        disable_tqdm=True, seed=0, dataloader_num_workers=0, generation_num_beams=1)
    model = tiny_float64(hf_relpos.RelPosTransformerForConditionalGeneration)
    trainer = build_trainer(model, pad_tokenizer, arguments, Dataset.from_list(examples), {}, "de")
    step_batches = list(trainer.token_budget_sampler)[:accumulation]
    labelled = [sum(TOKEN_BUDGET_LENGTHS[index][1] for index in batch) for batch in step_batches]
    assert len(set(labelled)) == len(labelled), "micro-batches of different weights"

    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 1
    applied = {name: before[name] - parameter.detach() for name, parameter in model.named_parameters()}

    reference = tiny_float64(hf_relpos.RelPosTransformerForConditionalGeneration)
    collator = DataCollatorForSeq2Seq(pad_tokenizer, model=reference, label_pad_token_id=-100)
    step_examples = [{name: examples[index][name] for name in ("input_ids", "attention_mask", "labels")}
                     for batch in step_batches for index in batch]
    total, count = token_losses(reference, collator(step_examples), label_smoothing)
    assert count == sum(labelled)
    (total / count).backward()
    for name, parameter in reference.named_parameters():
        gradient = parameter.grad
        assert (applied[name] - gradient).abs().max() < 1e-12 * max(1.0, gradient.abs().max().item()), name


def set_token_means(model, tokenizer, examples: list[dict[str, Any]], label_smoothing: float) -> tuple[float, float]:
    """(loss, -log p_label) averaged over every labelled target token of `examples`, in one batch: the naive oracle
    of an evaluation's `eval_loss` and `eval_nll_loss`."""
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    batch = collator([{name: example[name] for name in ("input_ids", "attention_mask", "labels")}
                      for example in examples])
    with torch.no_grad():
        total, count = token_losses(model, batch, label_smoothing)
        nll, _ = token_losses(model, batch, 0.0)
    return total.item() / count, nll.item() / count


@pytest.mark.parametrize("predict_with_generate", [False, True], ids=["loss_only", "generate"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1], ids=["plain", "label_smoothing"])
def test_the_apps_eval_and_test_loss_are_the_token_mean_over_the_whole_set(pad_tokenizer, label_smoothing,
                                                                           predict_with_generate, tmp_path):
    """The app's evaluation (and prediction) of 7 sentences in batches of 3, 3 and 1 holding 11, 13 and 5 labelled
    tokens: eval_loss / test_loss is the training objective (label-smoothed when training is) averaged over every
    labelled token of the set, and eval_nll_loss / test_nll_loss the mean -log p_label, to 1e-12 in float64 (the
    Trainer's mean of the batches' token means, weighted by their sentences, was 6.197 against the set's 6.129)."""
    examples = token_budget_examples()
    arguments = TranslationTrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=3, label_smoothing_factor=label_smoothing,
        predict_with_generate=predict_with_generate, report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
        dataloader_num_workers=0, generation_num_beams=1)
    model = tiny_float64(hf_relpos.RelPosTransformerForConditionalGeneration).eval()
    dataset = Dataset.from_list(examples)
    evaluation_sets = {prefix: EvaluationSet(dataset, np.arange(len(examples)), ["ein Hund"] * len(examples),
                                             ["a dog"] * len(examples)) for prefix in ("eval", "test")}
    trainer = build_trainer(model, pad_tokenizer, arguments, None, evaluation_sets, "de")
    labelled = [sum(TOKEN_BUDGET_LENGTHS[index][1] for index in batch) for batch in ((0, 1, 2), (3, 4, 5), (6,))]
    assert labelled == [11, 13, 5]
    loss, nll_loss = set_token_means(model, pad_tokenizer, examples, label_smoothing)
    evaluated = trainer.evaluate(dataset)
    predicted = trainer.predict(dataset).metrics
    for metrics, prefix in ((evaluated, "eval"), (predicted, "test")):
        assert abs(metrics[f"{prefix}_loss"] - loss) < 1e-12 * loss, prefix
        assert abs(metrics[f"{prefix}_nll_loss"] - nll_loss) < 1e-12 * nll_loss, prefix
        assert (f"{prefix}_bleu" in metrics) == predict_with_generate
    assert (nll_loss == loss) == (label_smoothing == 0)
