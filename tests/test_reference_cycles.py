"""No reference cycles in the model's steps: an object of ours in a cycle (a closure that refers to the record holding
it) is freed only when Python's cycle collector runs, not when the step drops it, and keeps what it refers to alive
until then (a layer's score-bias table, its n x m dense bias on the eager and SDPA kernels: memory on a GPU for
steps), and makes the collector run and walk it (host time on a host-bound GPU step)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest
import torch
from conftest import requires_relpos_triton, tiny_config

from hf_relpos.model.modeling_relpos import RelPosTransformerForCausalLM, RelPosTransformerForConditionalGeneration
from hf_relpos.model.positions import built_in_schemes


def cyclic_garbage(run: Callable[[], None]) -> list[object]:
    """The objects that only the cycle collector frees after `run` (run once before, so that caches are filled)."""
    run()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def ours(garbage: list[object]) -> Iterator[str]:
    """What of ours, or any tensor, is among `garbage` (transformers' own cycles, such as those of
    `PreTrainedConfig.to_dict` that generate forms, are not ours to break)."""
    for item in garbage:
        module = getattr(item, "__module__", None) or type(item).__module__
        if isinstance(item, torch.Tensor) or module.startswith("hf_relpos"):
            name = getattr(item, "__qualname__", type(item).__qualname__)
            yield f"{type(item).__name__} {name}" + (f" {list(item.shape)}" if isinstance(item, torch.Tensor) else "")


def padded_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, 40, (2, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "labels": torch.randint(4, 40, (2, 6), generator=generator)}


def model_for(scheme: str, kernel: str | None = None, **overrides) -> RelPosTransformerForConditionalGeneration:
    """A tiny model with dropout, on `kernel` (None: the model's default)."""
    torch.manual_seed(0)
    model = RelPosTransformerForConditionalGeneration(tiny_config(scheme, dropout=0.1, attention_dropout=0.1,
                                                                  **overrides))
    if kernel is not None:
        model.set_attn_implementation(kernel)
    return model


def assert_no_cycles(*runs: Callable[[], None]) -> None:
    for run in runs:
        assert list(ours(cyclic_garbage(run))) == [], run.__name__


def check_no_cycles(model: RelPosTransformerForConditionalGeneration) -> None:
    batch = padded_batch()

    def training_step() -> None:
        model.train()
        model(**batch).loss.backward()

    def beam_search() -> None:
        model.eval()
        with torch.no_grad():
            model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=2,
                           max_new_tokens=4)

    assert_no_cycles(training_step, beam_search)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("scheme", built_in_schemes())
def test_training_step_and_beam_search_leave_no_cycles(scheme: str, kernel: str) -> None:
    check_no_cycles(model_for(scheme, kernel))


@pytest.mark.parametrize("overrides", [{"position_randomization_max": 40}, {"self_attention_window": 2}],
                         ids=["randomized_positions", "window"])
def test_shaws_variants_leave_no_cycles(overrides: dict) -> None:
    check_no_cycles(model_for("shaw", **overrides))


def test_transformer_xl_memory_leaves_no_cycles() -> None:
    """The causal LM with Transformer-XL segment memory: a training step and greedy decoding."""
    torch.manual_seed(0)
    model = RelPosTransformerForCausalLM(tiny_config("xl", dropout=0.1, attention_dropout=0.1,
                                                     is_encoder_decoder=False, mem_len=4))
    input_ids = padded_batch()["input_ids"]

    def training_step() -> None:
        model.train()
        model(input_ids=input_ids, labels=input_ids).loss.backward()

    def greedy_decoding() -> None:
        model.eval()
        with torch.no_grad():
            model.generate(input_ids=input_ids, max_new_tokens=4)

    assert_no_cycles(training_step, greedy_decoding)


@requires_relpos_triton
def test_fused_kernel_steps_leave_no_cycles() -> None:
    check_no_cycles(model_for("shaw", "relpos_triton"))


def test_the_check_finds_a_cycle() -> None:
    """The check sees a tensor kept by a closure that refers to its own holder (what shaw's dense bias was)."""

    def holder_with_cycle() -> None:
        holder = {"tensor": torch.zeros(3)}
        holder["densify"] = lambda: holder["tensor"]

    assert [found for found in ours(cyclic_garbage(holder_with_cycle)) if found.startswith("Tensor")] == ["Tensor Tensor [3]"]
