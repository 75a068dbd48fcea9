"""Kernels (eager, SDPA, FlexAttention) agree at model level, and mixed precision works for every scheme."""

from __future__ import annotations

import pytest
import torch
from conftest import SCHEMES, tiny_config

import hf_relpos

FLEX_SCHEMES = [("absolute", {}), ("shaw", {"use_relative_values": False}), ("xl", {}), ("directional", {})]


def batch(device: str = "cpu"):
    input_ids = torch.randint(4, 40, (3, 9), generator=torch.Generator().manual_seed(0)).to(device)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[2, 2:] = 0
    return input_ids, attention_mask


def model_with(kernel: str, attention_type: str, device: str = "cpu", **overrides):
    torch.manual_seed(0)
    config = tiny_config(attention_type, **overrides)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).to(device)
    model.set_attn_implementation(kernel)
    return model


@pytest.mark.parametrize("attention_type, overrides", FLEX_SCHEMES, ids=[s for s, _ in FLEX_SCHEMES])
def test_flex_attention_matches_eager_at_model_level(attention_type, overrides):
    input_ids, attention_mask = batch()
    logits = {}
    for kernel in ("eager", "sdpa", "flex_attention"):
        model = model_with(kernel, attention_type, **overrides).eval()
        assert model.config._attn_implementation == kernel
        with torch.no_grad():
            logits[kernel] = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).logits
    assert (logits["sdpa"] - logits["eager"]).abs().max() < 1e-5
    assert (logits["flex_attention"] - logits["eager"]).abs().max() < 1e-5


def test_flex_attention_selected_at_load_time(tmp_path):
    model_with("sdpa", "xl").save_pretrained(tmp_path)
    loaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(
        tmp_path, attn_implementation="flex_attention"
    )
    assert loaded.config._attn_implementation == "flex_attention"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled FlexAttention with backward needs CUDA")
@pytest.mark.parametrize("attention_type, overrides", FLEX_SCHEMES, ids=[s for s, _ in FLEX_SCHEMES])
def test_compiled_flex_attention_cuda_matches_eager_with_gradients(attention_type, overrides):
    input_ids, attention_mask = batch("cuda")
    results = {}
    for kernel in ("eager", "flex_attention"):
        model = model_with(kernel, attention_type, device="cuda", **overrides).train()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss
        loss.backward()
        results[kernel] = (loss.detach(), {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None})
    assert torch.allclose(results["flex_attention"][0], results["eager"][0], atol=1e-4)
    for name, grad in results["eager"][1].items():
        assert torch.allclose(results["flex_attention"][1][name], grad, atol=1e-3, rtol=1e-3), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("attention_type", SCHEMES)
def test_training_steps_under_autocast_stay_finite(attention_type, dtype):
    """Mixed precision: no NaN/inf or dtype error, including a fully padded row and a length-1 source."""
    model = model_with("sdpa", attention_type, layer_norm_position="pre").train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    input_ids, attention_mask = batch()
    attention_mask[2] = 0
    for step in range(3):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss
            single = model(input_ids=input_ids[:1, :1], labels=input_ids[:1, :2]).loss
        (loss + single).backward()
        assert torch.isfinite(loss) and torch.isfinite(single), step
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()


@pytest.mark.parametrize("attention_type", SCHEMES)
def test_eager_attention_weights_are_returned(attention_type):
    model = model_with("eager", attention_type).eval()
    input_ids, attention_mask = batch()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4],
                    output_attentions=True, output_hidden_states=True)
    assert len(out.encoder_attentions) == 2 and out.encoder_attentions[0].shape == (3, 4, 9, 9)
    assert out.cross_attentions[0].shape == (3, 4, 4, 9)
    assert len(out.encoder_hidden_states) == 3
    assert torch.all(out.encoder_attentions[0][1, :, :, 6:] == 0)


def test_xl_inference_table_follows_weight_updates():
    """XL keeps projected encodings at inference; an optimizer step must invalidate them."""
    model = model_with("sdpa", "xl")
    input_ids, attention_mask = batch()

    def logits(no_grad: bool):
        with torch.set_grad_enabled(not no_grad):
            return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids).logits.detach()

    model.eval()
    assert torch.allclose(logits(no_grad=True), logits(no_grad=False), atol=1e-6)
    with torch.no_grad():  # an in-place update, as an optimizer step or load_state_dict makes
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    assert torch.allclose(logits(no_grad=True), logits(no_grad=False), atol=1e-6)
