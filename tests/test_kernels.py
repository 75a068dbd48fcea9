"""Kernels (eager, SDPA, FlexAttention, transformers' own) at model level, and mixed precision for every scheme."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import SCHEMES, TRANSFORMERS_KERNEL, tiny_config

import hf_relpos
from hf_relpos.model.attention_functions import SDPA_MASK_ALIGNMENT_BYTES, aligned_mask
from hf_relpos.model.positions import rel_shift
from hf_relpos.testing import check_kernels_agree

pytestmark = pytest.mark.numerics

FLEX_SCHEMES = [("absolute", {}), ("shaw", {"use_relative_values": False}), ("xl", {}), ("directional", {}),
                ("none", {}), ("alibi", {}), ("t5", {}), ("rope", {"rotary_dim": 4})]
MODEL_SCHEMES = [*FLEX_SCHEMES, ("shaw", {})]
MODEL_SCHEME_IDS = ["absolute", "shaw-k", "xl", "directional", "none", "alibi", "t5", "rope-partial", "shaw"]


def batch(device: str = "cpu"):
    input_ids = torch.randint(4, 40, (3, 9), generator=torch.Generator().manual_seed(0)).to(device)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[2, 2:] = 0
    return input_ids, attention_mask


def model_with(kernel: str, position_scheme: str, device: str = "cpu", **overrides):
    torch.manual_seed(0)
    config = tiny_config(position_scheme, **overrides)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).to(device)
    model.set_attn_implementation(kernel)
    return model


@pytest.mark.parametrize("position_scheme, overrides", MODEL_SCHEMES, ids=MODEL_SCHEME_IDS)
def test_every_kernel_gives_the_same_model_in_float64(position_scheme, overrides):
    """Loss and logits of a float64 model agree to float64 precision on every kernel, and eager's and SDPA's
    gradients too, with and without a padding mask (hf_relpos.testing.check_kernels_agree, which
    check_position_scheme runs on a user's scheme); the loss stays float64."""
    check_kernels_agree(position_scheme, config_overrides=overrides)
    model = model_with("sdpa", position_scheme, **overrides).double().eval()
    input_ids, attention_mask = batch()
    with torch.no_grad():
        assert model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss.dtype == torch.float64


@pytest.mark.parametrize("position_scheme", ["absolute", "none", "rope"])
def test_a_transformers_kernel_runs_a_scheme_that_adds_nothing_to_attention(position_scheme):
    """Kernels of transformers' (flash_attention_2/3, Hub kernels; here its SDPA under another name) take the
    model-level mask from masking_utils and run a scheme that adds nothing to attention or only replaces queries and
    keys (RoPE), with the same logits as hf_relpos' SDPA."""
    input_ids, attention_mask = batch()
    reference = model_with("sdpa", position_scheme).double().eval()
    model = model_with(TRANSFORMERS_KERNEL, position_scheme).double().eval()
    with torch.no_grad():
        for inputs in (dict(input_ids=input_ids, attention_mask=attention_mask), dict(input_ids=input_ids)):
            expected = reference(**inputs, decoder_input_ids=input_ids).logits
            assert (model(**inputs, decoder_input_ids=input_ids).logits - expected).abs().max() < 1e-12


def test_a_kernel_without_a_mask_function_is_warned_of_when_a_batch_has_padding(caplog, monkeypatch):
    """transformers' convention: a kernel registered without a mask function gets no mask. On a padded batch that
    attends to padding, so the model says so once, naming the registration that fixes it."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hf_relpos.model import modeling_relpos

    unmasked = "transformers_sdpa_without_a_mask_for_tests"
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, unmasked, ALL_ATTENTION_FUNCTIONS[TRANSFORMERS_KERNEL])
    monkeypatch.setattr(modeling_relpos.logger, "warning_once", modeling_relpos.logger.warning)   # not cached
    input_ids, attention_mask = batch()
    model = model_with(unmasked, "absolute").eval()
    with torch.no_grad(), caplog.at_level("WARNING"):
        model(input_ids=input_ids, decoder_input_ids=input_ids)   # no padding: nothing to say
        assert not caplog.records
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids)
    assert f"attn_implementation {unmasked!r} has no mask function registered" in caplog.text
    assert f"AttentionMaskInterface.register({unmasked!r}" in caplog.text
    assert unmasked not in ALL_MASK_ATTENTION_FUNCTIONS


@pytest.mark.parametrize(("position_scheme", "additions"), [
    ("shaw", "a score bias and a value term"), ("xl", "a score bias"), ("directional", "an attention mask"),
    ("alibi", "a score bias"), ("t5", "a score bias"),
])
def test_a_kernel_that_cannot_run_the_scheme_is_refused_when_set_built_or_loaded(position_scheme, additions, tmp_path):
    """A transformers kernel is refused for a scheme that adds to attention before anything runs: by
    set_attn_implementation (the model keeps its kernel), by the constructor and by from_pretrained."""
    message = (f"position_scheme '{position_scheme}' adds {additions} to attention, which attn_implementation "
               f"'{TRANSFORMERS_KERNEL}' cannot take")
    model = model_with("sdpa", position_scheme)
    with pytest.raises(ValueError, match=message):
        model.set_attn_implementation(TRANSFORMERS_KERNEL)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match=message):
        hf_relpos.RelPosTransformerForConditionalGeneration(
            tiny_config(position_scheme, attn_implementation=TRANSFORMERS_KERNEL))
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=message):
        hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(
            tmp_path, attn_implementation=TRANSFORMERS_KERNEL)


def test_an_unknown_kernel_name_is_an_error_not_sdpa():
    model = model_with("sdpa", "absolute")
    model.config._attn_implementation = "no_such_kernel"
    with pytest.raises(KeyError, match="no_such_kernel"):
        model(input_ids=batch()[0], decoder_input_ids=batch()[0])


@pytest.mark.parametrize("position_scheme", ["shaw", "absolute"])
def test_a_kernel_name_nobody_registered_is_one_error_listing_the_kernels(position_scheme):
    model = model_with("sdpa", position_scheme)
    with pytest.raises(ValueError, match=r"attn_implementation 'bogus' is not a registered attention kernel: one of "
                                         r"\['eager', .*'relpos_triton', 'sdpa'"):
        model.set_attn_implementation("bogus")
    assert model.config._attn_implementation == "sdpa"


def test_a_kernel_name_nobody_registered_is_the_same_error_when_the_model_is_built_or_loaded(tmp_path):
    """Building or loading with an unknown kernel lists hf_relpos' kernels too, not only transformers' own."""
    model_with("sdpa", "shaw").save_pretrained(tmp_path)
    listing = r"attn_implementation 'bogus' is not a registered attention kernel: one of \[.*'relpos_triton', 'sdpa'"
    with pytest.raises(ValueError, match=listing):
        hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="bogus")
    config = hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path, attn_implementation="bogus")
    with pytest.raises(ValueError, match=listing):
        hf_relpos.RelPosTransformerForConditionalGeneration(config)


def test_the_app_and_the_model_take_the_same_kernel_names():
    """One rule (attention_functions.check_kernel_name) for the model and the apps' flags: a Hub kernel 'owner/repo'
    and a paged kernel pass it, a name nobody registered does not."""
    from hf_relpos.model.attention_functions import check_kernel_name
    from hf_relpos.translation.arguments import check_attn_implementation

    for name in ("sdpa", "relpos_triton", "paged|sdpa", "paged|eager", "kernels-community/flash-attn2"):
        assert check_kernel_name(name) == check_attn_implementation(name) == name
    for check in (check_kernel_name, check_attn_implementation):
        with pytest.raises(ValueError, match="'bogus' is not a registered attention kernel"):
            check("bogus")


@pytest.mark.parametrize("name, runs", [("paged|sdpa", "sdpa"), ("paged|eager", None)])
def test_a_paged_kernel_name_is_taken_alike_at_load_and_when_set(tmp_path, name, runs):
    """transformers runs sdpa for "paged|sdpa" (it drops the prefix of every kernel but "paged|eager"): shaw, which
    runs on sdpa, takes that name when it is set as when it is loaded; "paged|eager", transformers' own kernel, is
    refused both ways, naming the kernel."""
    model_with("sdpa", "shaw").save_pretrained(tmp_path)
    load = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained
    if runs is None:
        for attempt in (lambda: load(tmp_path, attn_implementation=name), lambda: model_with(name, "shaw")):
            with pytest.raises(ValueError, match=r"attn_implementation 'paged\|eager' is transformers' kernel for "):
                attempt()
        return
    with pytest.warns(FutureWarning, match="paged"):
        loaded, built = load(tmp_path, attn_implementation=name), model_with(name, "shaw")
    assert loaded.config._attn_implementation == built.config._attn_implementation == runs


@pytest.mark.parametrize("position_scheme", ["absolute", "rope", "none"])
def test_paged_eager_is_refused_even_for_a_scheme_that_adds_nothing_to_attention(tmp_path, position_scheme):
    """transformers' "paged|eager" is its continuous-batching kernel: outside a PagedAttentionCache it gets no mask
    (no mask function is registered for it) and ignores `is_causal`, so the decoder would attend to later tokens and
    a padded batch to its padding. Refused when the model is built, loaded or switched, naming the kernels that run."""
    model_with("sdpa", position_scheme).save_pretrained(tmp_path)
    message = (r"^attn_implementation 'paged\|eager' is transformers' kernel for continuous batching, which this "
               r"model does not run: .*; use one of \['eager', 'sdpa', 'flex_attention', 'relpos_triton'\]$")
    for attempt in (
            lambda: model_with("paged|eager", position_scheme),
            lambda: hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(
                tmp_path, attn_implementation="paged|eager"),
            lambda: model_with("sdpa", position_scheme).set_attn_implementation("paged|eager"),
            lambda: hf_relpos.RelPosTransformerForCausalLM(hf_relpos.RelPosTransformerConfig(
                d_model=16, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=16, vocab_size=30,
                is_encoder_decoder=False, position_scheme=position_scheme, attn_implementation="paged|eager"))):
        with pytest.raises(ValueError, match=message):
            attempt()


@pytest.mark.parametrize("model_class", ["RelPosTransformerForConditionalGeneration", "RelPosTransformerForCausalLM"])
@pytest.mark.parametrize("entry", ["generate_batch", "init_continuous_batching", "continuous_batching_context_manager"])
def test_continuous_batching_is_refused_before_any_request_is_queued(model_class, entry):
    """transformers' continuous batching packs the requests on a PagedAttentionCache, which this model's attention
    does not read: each entry point raises one NotImplementedError naming them and `generate` (generate_batch used
    to return every request failed with an AttributeError from inside the decoder)."""
    config = tiny_config("absolute", is_encoder_decoder=model_class.endswith("ConditionalGeneration"))
    model = getattr(hf_relpos, model_class)(config).eval()
    calls = {"generate_batch": lambda: model.generate_batch(inputs=[[5, 6, 7], [8, 9]]),
             "init_continuous_batching": model.init_continuous_batching,
             "continuous_batching_context_manager": lambda: model.continuous_batching_context_manager().__enter__()}
    with pytest.raises(NotImplementedError, match=rf"^continuous batching \(generate_batch, .*\) is not supported by "
                                                  rf"{model_class}: .*; use generate on a padded batch$"):
        calls[entry]()


def test_flex_attention_selected_at_load_time(tmp_path):
    model_with("sdpa", "xl").save_pretrained(tmp_path)
    loaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(
        tmp_path, attn_implementation="flex_attention"
    )
    assert loaded.config._attn_implementation == "flex_attention"


def pronounced(model):
    """The model with its position terms made large: scheme parameters N(0, 0.5) and self-attention queries and
    keys scaled up, so that every term moves the logits well above float32 (and bf16) rounding."""
    with torch.no_grad():
        for stack in (model.model.encoder, model.model.decoder):
            for parameter in stack.positions.parameters():
                parameter.normal_(0.0, 0.5, generator=torch.Generator(parameter.device).manual_seed(0))
            for layer in stack.layers:
                layer.self_attn.q_proj.weight.mul_(8.0)
                layer.self_attn.k_proj.weight.mul_(8.0)
    return model


def without_positions(model, device: str = "cpu"):
    """The same weights under position_scheme 'none': the model with every term of its scheme removed."""
    config = copy.deepcopy(model.config)
    config.position_scheme = "none"
    plain = hf_relpos.RelPosTransformerForConditionalGeneration(config).to(device)
    plain.load_state_dict(model.state_dict(), strict=False)
    plain.set_attn_implementation("eager")
    return plain.train(model.training)


@pytest.fixture
def exact_float32_matmuls():
    """float32 matrix products without TF32, so kernels can be compared at float32 precision."""
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def check_flex_against_eager_on_cuda(position_scheme, overrides, input_ids, attention_mask):
    """One float32 training step on eager and on compiled FlexAttention from the same weights and seed: logits to
    2e-5 and every gradient to 1e-4 of its size. Returns the FlexAttention model and eager's logits."""
    results = {}
    for kernel in ("eager", "flex_attention"):
        model = pronounced(model_with(kernel, position_scheme, device="cuda", d_model=64, **overrides)).train()
        torch.manual_seed(1)
        output = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids)
        output.loss.backward()
        results[kernel] = (output.logits.detach(), {n: p.grad.detach() for n, p in model.named_parameters()
                                                    if p.grad is not None})
    logits, grads = results["eager"]
    assert (results["flex_attention"][0] - logits).abs().max().item() < 2e-5
    for name, grad in grads.items():
        error = (results["flex_attention"][1][name] - grad).abs().max().item()
        assert error <= 1e-4 * grad.abs().max().item() + 1e-7, (name, error)
    return model, logits


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled FlexAttention with backward needs CUDA")
@pytest.mark.parametrize("position_scheme, overrides", MODEL_SCHEMES, ids=MODEL_SCHEME_IDS)
def test_compiled_flex_attention_cuda_matches_eager_with_gradients(position_scheme, overrides, exact_float32_matmuls):
    """The fused path (compiled FlexAttention, which needs a head dimension >= 16; Shaw's a^V from the log-sum-exp)
    against eager in float32 on a padded batch: logits to 2e-5 and every gradient to 1e-4 of its size, while removing the scheme's terms moves the logits
    by 250 times that (so a dropped bias, mask or value term fails)."""
    input_ids, attention_mask = batch("cuda")
    model, logits = check_flex_against_eager_on_cuda(position_scheme, overrides, input_ids, attention_mask)
    if position_scheme != "none":
        with torch.no_grad():
            plain = without_positions(model, "cuda")(input_ids=input_ids, attention_mask=attention_mask,
                                                     labels=input_ids).logits
        assert (plain - logits).abs().max().item() > 5e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled FlexAttention with backward needs CUDA")
def test_compiled_flex_attention_cuda_drops_the_same_keys_as_eager(exact_float32_matmuls):
    """Key dropout (attention_dropout_kind "keys") compiled into FlexAttention's score_mod (the hash in Triton, int64
    xor, shifts and multiplies) drops the keys eager drops under the same seed: logits and every gradient as in
    the test above, on xl (a table read by bucket, recomputed in the backward), while the dropout moves the logits."""
    input_ids, attention_mask = batch("cuda")
    model, logits = check_flex_against_eager_on_cuda("xl", {"attention_dropout": 0.3, "attention_dropout_kind": "keys"},
                                                     input_ids, attention_mask)
    with torch.no_grad():
        undropped = model.eval()(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).logits
    assert (undropped - logits).abs().max().item() > 5e-3


def test_aligned_mask_copies_a_rel_shift_view_that_starts_off_the_boundary_and_keeps_aligned_masks():
    """XL's decoding bias on an H100 (bf16, 32 unpadded source tokens): a rel-shift view 62 bytes into its storage,
    which stopped SDPA's memory-efficient kernel with "misaligned address"."""
    scores = torch.randn(2, 8, 32, 63, dtype=torch.bfloat16)
    shifted = rel_shift(scores, 32)
    assert shifted.data_ptr() % SDPA_MASK_ALIGNMENT_BYTES != 0
    aligned = aligned_mask(shifted)
    assert aligned.data_ptr() % SDPA_MASK_ALIGNMENT_BYTES == 0
    assert aligned.is_contiguous() and torch.equal(aligned, shifted)
    fresh = torch.randn(2, 8, 32, 32, dtype=torch.bfloat16)
    assert aligned_mask(fresh) is fresh


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the misaligned-address failure is a CUDA kernel's")
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_sdpa_on_cuda_matches_eager_on_an_unpadded_batch(position_scheme, exact_float32_matmuls):
    """Every scheme's score bias reaches SDPA's CUDA kernels without padding (XL's rel-shift view once did not): in
    float32 the logits agree with eager to 2e-5, far below what the scheme's terms contribute; under bf16 autocast
    forward and beam search run and stay within bf16 rounding of the float32 logits."""
    input_ids = torch.randint(4, 40, (4, 32), generator=torch.Generator().manual_seed(0)).cuda()
    logits = {}
    for kernel in ("eager", "sdpa"):
        model = pronounced(model_with(kernel, position_scheme, device="cuda")).eval()
        with torch.inference_mode():
            logits[kernel] = model(input_ids=input_ids, decoder_input_ids=input_ids).logits
            with torch.autocast("cuda", dtype=torch.bfloat16):
                low_precision = model(input_ids=input_ids, decoder_input_ids=input_ids).logits.float()
                model.generate(input_ids=input_ids, max_new_tokens=8, num_beams=2)
        assert (low_precision - logits[kernel]).abs().max().item() < 0.05 * logits[kernel].abs().max().item()
    assert (logits["sdpa"] - logits["eager"]).abs().max().item() < 2e-5
    if position_scheme != "none":
        with torch.inference_mode():
            plain = without_positions(model, "cuda")(input_ids=input_ids, decoder_input_ids=input_ids).logits
        assert (plain - logits["eager"]).abs().max().item() > 5e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_training_steps_under_autocast_stay_finite(position_scheme, dtype):
    """Mixed precision: no NaN/inf or dtype error, including a fully padded row and a length-1 source."""
    model = model_with("sdpa", position_scheme, layer_norm_position="pre").train()
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


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_eager_attention_weights_are_returned(position_scheme):
    model = model_with("eager", position_scheme).eval()
    input_ids, attention_mask = batch()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4],
                    output_attentions=True, output_hidden_states=True)
    assert len(out.encoder_attentions) == 2 and out.encoder_attentions[0].shape == (3, 4, 9, 9)
    assert out.cross_attentions[0].shape == (3, 4, 4, 9)
    assert len(out.encoder_hidden_states) == 3
    assert torch.all(out.encoder_attentions[0][1, :, :, 6:] == 0)


def test_xl_follows_data_writes_to_its_weights():
    """Nothing derived from the weights outlives a forward pass: after `.data` writes (EMA, manual averaging; they
    bump no version counter) the model computes exactly what a fresh model with those weights computes."""
    model = model_with("sdpa", "xl").eval()
    input_ids, attention_mask = batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids)
    with torch.no_grad():
        model(**inputs)
        for parameter in model.parameters():
            parameter.data.mul_(0.9).add_(0.01)
        fresh = model_with("sdpa", "xl").eval()
        fresh.load_state_dict(model.state_dict())
        assert torch.equal(model(**inputs).logits, fresh(**inputs).logits)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled FlexAttention with backward needs CUDA")
def test_compiled_flex_attention_cuda_graphs_stay_bounded_in_training():
    """Training steps (forward and backward) on batches of many sizes and padded lengths compile a bounded number of
    FlexAttention graphs, and lengths after the first few compile none."""
    from hf_relpos.model import attention_functions

    model = model_with("flex_attention", "t5", device="cuda", d_model=64).train()
    multiple = attention_functions.length_multiple("flex_attention")

    def step(batch_size, blocks):
        input_ids = torch.randint(4, 40, (batch_size, multiple * blocks), device="cuda")
        attention_mask = torch.ones_like(input_ids)
        attention_mask[0, -5:] = 0
        model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss.backward()

    start = attention_functions.compiled_graph_count()
    for batch_size, blocks in ((2, 1), (3, 2), (5, 3)):
        step(batch_size, blocks)
    first = attention_functions.compiled_graph_count() - start
    assert first <= 24   # encoder, decoder and cross-attention, forward and backward, one and several blocks
    for batch_size, blocks in ((4, 4), (2, 6), (3, 8)):
        step(batch_size, blocks)
    assert attention_functions.compiled_graph_count() - start == first
