"""PEFT (LoRA) on the model, as MT engineers fine-tune with it: training with `Seq2SeqTrainer` changes only the
adapters, the adapter folder reloads to the same logits, `merge_and_unload` equals the unmerged adapter (float64,
1e-12) whichever modules it adapts (a scheme's own modules included), generate runs on the `PeftModel`, and
reentrant gradient checkpointing reaches the adapters of a frozen model."""

from __future__ import annotations

import pytest
import torch
from conftest import BUILT_IN_SCHEMES, tiny_config, tiny_model
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

from hf_relpos import RelPosTransformerForCausalLM, RelPosTransformerForConditionalGeneration

ATTENTION_TARGETS = ["q_proj", "v_proj"]


def lora(targets: list[str] | str = ATTENTION_TARGETS, **fields) -> LoraConfig:
    return LoraConfig(task_type="SEQ_2_SEQ_LM", r=4, lora_alpha=8, target_modules=targets, **fields)


def tiny_float64(scheme: str):
    return tiny_model(scheme, encoder_layers=1, decoder_layers=1).double()


def batch() -> dict[str, torch.Tensor]:
    """Two padded sources and their decoder inputs."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, 40, (2, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 5:], attention_mask[1, 5:] = 0, 0
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "decoder_input_ids": torch.randint(3, 40, (2, 5), generator=generator)}


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch()).logits


def reversal_pairs(count: int) -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(2)
    sources = torch.randint(3, 40, (count, 6), generator=generator).tolist()
    return [{"input_ids": source, "attention_mask": [1] * 6, "labels": source[::-1]} for source in sources]


@pytest.mark.parametrize("scheme", ["shaw", "xl", "t5"])
def test_lora_training_changes_only_the_adapters(scheme, tmp_path):
    model = tiny_float64(scheme)
    frozen = {name: weight.clone() for name, weight in model.state_dict().items()}
    peft_model = get_peft_model(model, lora())
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path), max_steps=12, per_device_train_batch_size=8,
                                         learning_rate=5e-2, logging_steps=1, report_to="none", save_strategy="no",
                                         use_cpu=True, disable_tqdm=True)
    trainer = Seq2SeqTrainer(model=peft_model, args=arguments, train_dataset=reversal_pairs(16))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0] - 0.5
    adapted = peft_model.get_base_model().state_dict()
    base = {name.replace(".base_layer", ""): weight for name, weight in adapted.items() if "lora_" not in name}
    assert base.keys() == frozen.keys()
    for name, weight in frozen.items():
        assert torch.equal(base[name], weight), name
    assert all(weight.abs().sum() > 0 for name, weight in adapted.items() if "lora_B" in name), "the adapters trained"


# every scheme with the attention projections; the schemes' own modules an adapter can target (XL's W_kR,
# T5's bucket embedding), and all linear layers (which include XL's W_kR)
ADAPTED = [(scheme, ATTENTION_TARGETS) for scheme in BUILT_IN_SCHEMES] + [
    ("xl", ["q_proj", "position_projections.0"]),
    ("xl", "all-linear"),
    ("t5", ["q_proj", "relative_attention_bias"]),
]


@pytest.mark.numerics
@pytest.mark.parametrize(("scheme", "targets"), ADAPTED)
def test_saved_adapter_reloads_and_merges_to_the_same_logits(scheme, targets, tmp_path):
    """Adapters initialised at random (`init_lora_weights=False`), so each one changes the logits it reaches."""
    torch.manual_seed(3)
    peft_model = get_peft_model(tiny_float64(scheme), lora(targets, init_lora_weights=False)).eval()
    expected = logits(peft_model)
    with peft_model.disable_adapter():
        assert not torch.allclose(logits(peft_model), expected)
    peft_model.save_pretrained(tmp_path)
    reloaded = PeftModel.from_pretrained(tiny_float64(scheme), tmp_path).eval()
    torch.testing.assert_close(logits(reloaded), expected, rtol=0, atol=0)
    merged = reloaded.merge_and_unload()
    assert not any("lora_" in name for name in merged.state_dict())
    torch.testing.assert_close(logits(merged), expected, rtol=0, atol=1e-12)
    merged.save_pretrained(tmp_path / "merged")
    plain = RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path / "merged").eval()
    torch.testing.assert_close(logits(plain), expected, rtol=0, atol=1e-12)


@pytest.mark.numerics
@pytest.mark.parametrize("scheme", ["t5", "xl"])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_on_the_peft_model_equals_the_merged_model(scheme, num_beams):
    torch.manual_seed(3)
    peft_model = get_peft_model(tiny_float64(scheme), lora("all-linear", init_lora_weights=False)).eval()
    inputs = {key: value for key, value in batch().items() if key != "decoder_input_ids"}
    settings = dict(max_new_tokens=6, num_beams=num_beams, do_sample=False, output_scores=True,
                    return_dict_in_generate=True)
    generated = peft_model.generate(**inputs, **settings)
    assert generated.sequences.shape[0] == 2 and generated.sequences.shape[1] > 1
    merged = peft_model.merge_and_unload().generate(**inputs, **settings)
    torch.testing.assert_close(merged.sequences, generated.sequences, rtol=0, atol=0)
    torch.testing.assert_close(merged.scores, generated.scores, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("scheme", "targets", "tie_word_embeddings"), [
    ("shaw", ATTENTION_TARGETS, True), ("shaw", ATTENTION_TARGETS, False), ("xl", "all-linear", True),
    ("t5", ["q_proj", "relative_attention_bias"], True)])
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_gradient_checkpointing_reaches_the_adapters_of_a_frozen_model(scheme, targets, tie_word_embeddings,
                                                                       use_reentrant):
    """`activation_checkpointing_enable` (what the Trainer calls; `gradient_checkpointing_enable` is its deprecated
    alias, warned about from transformers 5.25) hooks the embeddings so the checkpointed layers' inputs require grad;
    the adapters' gradients equal those without checkpointing."""
    def adapter_gradients(checkpointed: bool) -> dict[str, torch.Tensor]:
        model = tiny_model(scheme, tie_word_embeddings=tie_word_embeddings).double()
        if checkpointed:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": use_reentrant})
        torch.manual_seed(3)
        peft_model = get_peft_model(model, lora(targets, init_lora_weights=False)).train()
        inputs = batch()
        peft_model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                   labels=inputs["decoder_input_ids"]).loss.backward()
        return {name: weight.grad for name, weight in peft_model.named_parameters() if weight.requires_grad}

    expected = adapter_gradients(checkpointed=False)
    gradients = adapter_gradients(checkpointed=True)
    assert gradients.keys() == expected.keys()
    for name, gradient in gradients.items():
        assert gradient is not None and gradient.abs().sum() > 0, name
        torch.testing.assert_close(gradient, expected[name], rtol=0, atol=1e-12)


def test_modules_to_save_trains_a_schemes_own_tables(tmp_path):
    """Shaw's a^K/a^V tables are parameters of the stack's `positions` module: `modules_to_save` trains a copy and
    saves it with the adapter."""
    model = tiny_float64("shaw")
    original = model.model.encoder.positions.relative_keys.detach().clone()
    peft_model = get_peft_model(model, lora(modules_to_save=["positions"])).train()
    optimizer = torch.optim.SGD([weight for weight in peft_model.parameters() if weight.requires_grad], lr=0.1)
    inputs = batch()
    for _ in range(2):
        optimizer.zero_grad()
        peft_model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                   labels=inputs["decoder_input_ids"]).loss.backward()
        optimizer.step()
    encoder_positions = peft_model.get_base_model().model.encoder.positions
    assert torch.equal(encoder_positions.original_module.relative_keys, original)
    assert not torch.equal(encoder_positions.relative_keys, original)
    peft_model.eval()
    expected = logits(peft_model)
    peft_model.save_pretrained(tmp_path)
    reloaded = PeftModel.from_pretrained(tiny_float64("shaw"), tmp_path).eval()
    torch.testing.assert_close(logits(reloaded), expected, rtol=0, atol=0)
    torch.testing.assert_close(logits(reloaded.merge_and_unload()), expected, rtol=0, atol=1e-12)


def test_modules_to_save_trains_the_schemes_parameters_of_a_causal_lm_with_memory():
    """The XL causal LM with a Transformer-XL memory (mem_len > 0), its `positions` (u, v, W_kR) trained as
    `modules_to_save`: every forward raised AttributeError ('ModulesToSaveWrapper' has no attribute 'embed') where the
    decoder checked the scheme's class, not the scheme, for an embedding-level encoding. A second segment continues
    the first through the memory, and the merged model gives the adapted model's logits (float64, 1e-12)."""
    torch.manual_seed(3)
    model = RelPosTransformerForCausalLM(tiny_config("xl", mem_len=6, decoder_layers=1)).double()
    adapters = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=ATTENTION_TARGETS,
                          modules_to_save=["positions"], init_lora_weights=False)
    peft_model = get_peft_model(model, adapters).train()
    tokens = torch.randint(3, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    first = peft_model(input_ids=tokens[:, :6], labels=tokens[:, :6])
    second = peft_model(input_ids=tokens[:, 6:], labels=tokens[:, 6:], mems=first.mems)
    (first.loss + second.loss).backward()
    positions = peft_model.get_base_model().decoder.positions
    assert positions.modules_to_save["default"].content_bias.grad.abs().sum() > 0
    assert positions.original_module.content_bias.grad is None
    peft_model.eval()
    with torch.no_grad():
        memory = peft_model(input_ids=tokens[:, :6]).mems
        expected = peft_model(input_ids=tokens[:, 6:], mems=memory).logits
        merged = peft_model.merge_and_unload()
        merged_memory = merged(input_ids=tokens[:, :6]).mems
        torch.testing.assert_close(merged(input_ids=tokens[:, 6:], mems=merged_memory).logits, expected, rtol=0,
                                   atol=1e-12)
