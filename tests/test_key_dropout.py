"""Key dropout (`attention_dropout_kind` "keys"): scores dropped before the softmax by a
counter-based hash of (seed, batch, head, query, key), the same on every kernel given the seed: the fused path's
dropout. Eager against FlexAttention (and sdpa) in float64 with every gradient; FlexAttention's backward does not run
on the CPU, so its kernel is `reference_flex` (test_fused_attention.py), reading the same score_mod and mask_mod;
torch's own uncompiled FlexAttention is compared in the forward."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config
from test_fused_attention import TOLERANCE, reference_flex

import hf_relpos
from hf_relpos.model import attention_functions
from hf_relpos.model.attention_functions import (
    KEEP_BITS,
    FlexMask,
    KeyDropout,
    eager_attention_forward,
    flex_attention_forward,
    sdpa_attention_forward,
)

P = 0.3
# schemes through every fused form: a score_mod (alibi), a table read by bucket and recomputed in the backward (xl),
# key regions merged with an explicit band (shaw's a^K and a^V, t5 with a short band), a per-head mask_mod
# (directional), plain attention (absolute)
SCHEMES = {
    "xl": {},
    "shaw": {},
    "t5": {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 5},
    "alibi": {},
    "directional": {},
    "absolute": {},
}


@pytest.fixture
def reference_kernel(monkeypatch):
    monkeypatch.setattr(attention_functions, "flex_kernel", lambda query: reference_flex)


def padded_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 40, (2, 12), generator=generator)
    labels = torch.randint(4, 40, (2, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -4:] = 0
    decoder_attention_mask = torch.ones_like(labels)
    decoder_attention_mask[0, -3:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
            "decoder_input_ids": labels, "decoder_attention_mask": decoder_attention_mask}


def train_step(scheme: str, kernel: str, seed: int = 5, **overrides) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and every parameter's gradient of one training step (float64, padded encoder and decoder)."""
    values = {"attention_dropout": P, "attention_dropout_kind": "keys", **SCHEMES[scheme], **overrides}
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(scheme, **values)).double().train()
    model.set_attn_implementation(kernel)
    torch.manual_seed(seed)
    outputs = model(**padded_batch())
    outputs.loss.backward()
    return outputs.logits.detach(), {name: parameter.grad for name, parameter in model.named_parameters()
                                     if parameter.grad is not None}


def max_difference(first: tuple, second: tuple) -> float:
    (logits, gradients), (other_logits, other_gradients) = first, second
    assert gradients.keys() == other_gradients.keys()
    return max([(logits - other_logits).abs().max().item()]
               + [(gradients[name] - other_gradients[name]).abs().max().item() for name in gradients])


@pytest.mark.numerics
@pytest.mark.parametrize("scheme", SCHEMES)
def test_flex_and_sdpa_drop_the_same_keys_as_eager(scheme, reference_kernel):
    """Encoder self-attention, decoder causal self-attention and cross-attention, padded: the fused path's logits and
    every gradient equal eager's at 1e-12 under the same seed, and so do sdpa's; the drop is real (the step differs
    from one without dropout) and another seed drops other keys."""
    eager = train_step(scheme, "eager")
    assert max_difference(eager, train_step(scheme, "flex_attention")) < TOLERANCE
    assert max_difference(eager, train_step(scheme, "sdpa")) < TOLERANCE
    assert max_difference(eager, train_step(scheme, "eager", attention_dropout=0.0)) > 1e-3
    assert max_difference(eager, train_step(scheme, "eager", seed=6)) > 1e-3


@pytest.mark.numerics
@pytest.mark.parametrize("scheme", ["alibi", "absolute"])
def test_sdpa_drops_the_probabilities_as_eager_does(scheme):
    """attention_dropout_kind "probabilities" on sdpa itself (a dense score bias, and none): the probabilities are
    dropped after the softmax as eager drops them, logits and every gradient equal eager's at 1e-12 under the same
    seed (the CPU's SDPA draws its mask as nn.functional.dropout does), and the drop is real."""
    eager = train_step(scheme, "eager", attention_dropout_kind="probabilities")
    assert max_difference(eager, train_step(scheme, "sdpa", attention_dropout_kind="probabilities")) < TOLERANCE
    assert max_difference(eager, train_step(scheme, "eager", attention_dropout=0.0)) > 1e-3


def test_the_dropped_fraction_is_p_and_masks_vary_with_seed_and_position():
    """Over 2 x 8 x 256 x 256 scores the dropped fraction is p within 5 standard deviations; each (batch, head)
    slice, query row and key column has its own pattern; another seed gives another mask; a seed gives one mask."""
    torch.manual_seed(0)
    dropout = KeyDropout.draw(0.1, torch.device("cpu"))
    keeps = dropout.dense(2, 8, 256, 256)
    dropped = 1 - keeps.double().mean().item()
    assert abs(dropped - 0.1) < 5 * (0.1 * 0.9 / keeps.numel()) ** 0.5
    assert not torch.equal(keeps[0, 0], keeps[1, 0]) and not torch.equal(keeps[0, 0], keeps[0, 1])
    assert not torch.equal(keeps[0, 0, 0], keeps[0, 0, 1]) and not torch.equal(keeps[0, 0, :, 0], keeps[0, 0, :, 1])
    assert torch.equal(keeps, dropout.dense(2, 8, 256, 256))
    other = KeyDropout.draw(0.1, torch.device("cpu"))
    assert other.seed.item() != dropout.seed.item()
    overlap = (keeps == other.dense(2, 8, 256, 256)).double().mean().item()
    assert abs(overlap - (0.9**2 + 0.1**2)) < 0.005   # independent masks agree where both keep or both drop
    assert dropout.threshold == round(0.1 * 2**KEEP_BITS)


def test_the_seed_comes_from_torchs_generator():
    """One seed per attention call, drawn from torch's generator: the same under the same manual_seed."""
    torch.manual_seed(3)
    first = KeyDropout.draw(P, torch.device("cpu")).seed
    torch.manual_seed(3)
    assert torch.equal(first, KeyDropout.draw(P, torch.device("cpu")).seed)


@pytest.mark.parametrize("scheme", ["xl", "shaw"])
def test_evaluation_drops_nothing_and_draws_no_seed(scheme):
    """In eval mode key dropout is off: the logits are those of the same weights without attention dropout, and
    torch's generator is left as it was."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(
        tiny_config(scheme, attention_dropout=P, attention_dropout_kind="keys")).double().eval()
    batch = padded_batch()
    state = torch.get_rng_state()
    logits = model(**batch).logits
    assert torch.equal(state, torch.get_rng_state())
    torch.manual_seed(0)
    plain = hf_relpos.RelPosTransformerForConditionalGeneration(
        tiny_config(scheme, attention_dropout=0.0)).double().eval()
    assert torch.equal(logits, plain(**batch).logits)


def attention_inputs(query_length: int, key_length: int):
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(2, 3, n, 4, dtype=torch.float64, generator=generator).requires_grad_()
            for n in (query_length, key_length, key_length)]


@pytest.mark.numerics
@pytest.mark.parametrize("kernel", [eager_attention_forward, sdpa_attention_forward, flex_attention_forward])
def test_a_query_that_loses_every_key_outputs_zeros_without_nan(kernel, reference_kernel):
    """Every key dropped (threshold 2^KEEP_BITS): each query outputs zeros and every gradient is finite (zero)."""
    query, key, value = attention_inputs(5, 6)
    dropout = KeyDropout(torch.tensor([7]), 2**KEEP_BITS)
    output, _ = kernel(None, query, key, value, None, key_dropout=dropout)
    assert torch.equal(output, torch.zeros_like(output))
    output.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (query, key, value))


@pytest.mark.numerics
def test_rows_that_lose_every_key_match_across_kernels(reference_kernel):
    """A causal mask leaves the first queries one or two keys: at p = 0.5 some lose all of them; eager and the fused
    path agree on those (zeros) and on the others, output and gradients, at 1e-12."""
    query, key, value = attention_inputs(16, 16)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    dropout = KeyDropout(torch.tensor([11]), round(0.5 * 2**KEEP_BITS))
    assert not (dropout.dense(2, 3, 16, 16) & causal).any(-1).all(), "no row lost every key: pick another seed"
    results = []
    for kernel, mask in ((eager_attention_forward, causal), (flex_attention_forward, FlexMask(2, 16, 16, highest=0))):
        output, _ = kernel(None, query, key, value, mask, key_dropout=dropout)
        gradients = torch.autograd.grad((output * torch.arange(output.numel()).view_as(output)).sum(),
                                        (query, key, value))
        results.append((output, *gradients))
    for first, second in zip(*results, strict=True):
        assert (first - second).abs().max().item() < TOLERANCE


@pytest.mark.numerics
def test_torchs_flex_attention_drops_the_same_keys_as_eager():
    """torch's FlexAttention itself (uncompiled on the CPU, forward only), reading the key dropout's score_mod:
    eager's output at 1e-12 with padding, also for queries that lose every key."""
    query, key, value = (x.detach() for x in attention_inputs(70, 70))
    padding = torch.ones(2, 70, dtype=torch.long)
    padding[1, 60:] = 0
    mask = FlexMask.from_padding(padding, 70)
    for threshold in (round(0.3 * 2**KEEP_BITS), round(0.9 * 2**KEEP_BITS)):
        dropout = KeyDropout(torch.tensor([5]), threshold)
        fused, _ = flex_attention_forward(None, query, key, value, mask, key_dropout=dropout)
        expected, _ = eager_attention_forward(None, query, key, value, mask.dense(), key_dropout=dropout)
        assert (fused - expected).abs().max().item() < TOLERANCE


def test_flex_attention_still_refuses_probability_dropout_and_names_the_keys_option(reference_kernel):
    query = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="attention_dropout_kind to 'keys'"):
        flex_attention_forward(None, query, query, query, None, dropout=0.1)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("xl", attention_dropout=0.1)).train()
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match="attention_dropout_kind"):
        model(**padded_batch())


def test_relpos_triton_refuses_key_dropout():
    query = torch.randn(1, 1, 4, 2)
    dropout = KeyDropout.draw(0.25, query.device)
    with pytest.raises(ValueError, match=r"^attention_dropout_kind 'keys' runs with attn_implementation \['eager', "
                                         r"'sdpa', 'flex_attention'\], got 'relpos_triton' with attention_dropout=0.25"):
        attention_functions.relpos_triton_attention_forward(None, query, query, query, None, key_dropout=dropout)


def test_the_kind_is_validated_and_saved(tmp_path):
    with pytest.raises(ValueError, match=r"attention_dropout_kind must be one of \['probabilities', 'keys'\], got 'k'"):
        tiny_config("xl", attention_dropout_kind="k")
    assert tiny_config("xl").attention_dropout_kind == "probabilities"
    tiny_config("xl", attention_dropout_kind="keys").save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["attention_dropout_kind"] == "keys"
    assert hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path).attention_dropout_kind == "keys"


def test_a_model_on_relpos_triton_refuses_key_dropout_naming_the_kernels_that_take_it():
    """The model's check names the kernels that run key dropout (relpos_triton drops probabilities instead), before
    any kernel runs."""
    model = hf_relpos.RelPosTransformerForConditionalGeneration(
        tiny_config("shaw", attention_dropout=P, attention_dropout_kind="keys")).train()
    model.set_attn_implementation(attention_functions.TRITON_KERNEL)
    with pytest.raises(ValueError, match=r"runs with attn_implementation \['eager', 'sdpa', 'flex_attention'\], got "
                                         r"'relpos_triton'"):
        model(**padded_batch())


@pytest.mark.parametrize(("kernel", "dropout", "kind", "refused"), [
    (None, P, "keys", False), ("sdpa", P, "keys", False), ("flex_attention", P, "keys", False),
    ("relpos_triton", P, "keys", True), ("kernels-community/flash-attn", P, "keys", True),
    ("eager", P, "probabilities", False), ("relpos_triton", P, "probabilities", False),
    ("kernels-community/flash-attn", P, "probabilities", False), ("flex_attention", P, "probabilities", True),
    ("flex_attention", 0.0, "probabilities", False), ("relpos_triton", 0.0, "keys", False),
])
def test_one_rule_says_which_kernels_run_which_attention_dropout(kernel, dropout, kind, refused):
    """`check_dropout_kernel`, which the model's attention and the training app's early check both apply: key
    dropout runs on the kernels that draw it (any other would ignore the draw: a Hub kernel too), probability
    dropout on every kernel but flex_attention; no dropout runs anywhere."""
    if refused:
        with pytest.raises(ValueError, match=rf"^attention_dropout_kind '{kind}' runs with attn_implementation"):
            attention_functions.check_dropout_kernel(kernel, dropout, kind)
    else:
        attention_functions.check_dropout_kernel(kernel, dropout, kind)
