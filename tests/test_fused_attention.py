"""The fused path (FlexAttention): every scheme's fused form against eager in float64 with every gradient,
masks as `FlexMask` block masks, no n x n tensor at n = 1024, Shaw's regions merged by log-sum-exps, decoding steps
off the compiled kernel, bounded compiles, and the once-per-forward `prepare` stage.

FlexAttention has no backward on the CPU, so the kernel is replaced here by `reference_flex`: its equation in dense,
differentiable form, reading the same score_mod and the BlockMask's mask_mod. What is tested is the package's
composition around the kernel; the kernel itself is torch's (compared with eager on CUDA in test_kernels.py).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types

import pytest
import torch
from conftest import SCHEMES, tiny_config, warnings_logged
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import hf_relpos
from hf_relpos.model import attention_functions, positions
from hf_relpos.model.attention_functions import FlexMask, flex_attention_forward
from hf_relpos.model.modeling_relpos import RelPosAttention, attention_mask_for, with_scheme_mask
from hf_relpos.model.positions import (
    DenseBias,
    PositionContext,
    RelativeValues,
    aligned_width,
    built_in_schemes,
    get_scheme_class,
)

pytestmark = pytest.mark.numerics

BATCH, HEADS, HEAD_DIM = 2, 3, 4
TOLERANCE = 1e-12


def flex_returns(output, lse, return_aux, return_lse):
    """What FlexAttention returns for the log-sum-exp asked for: with `return_aux` (an AuxRequest) the output and an
    object holding `lse`, with `return_lse` (torch before AuxRequest) the pair, else the output alone."""
    if return_aux is not None:
        return output, types.SimpleNamespace(lse=lse)
    return (output, lse) if return_lse else output


def reference_flex(query, key, value, score_mod=None, block_mask=None, scale=None, return_aux=None, return_lse=False,
                   **kwargs):
    """softmax(score_mod(q k^T * scale), masked by block_mask.mask_mod) v and the row log-sum-exp, densely (zero
    output and -inf for a query with no key, as FlexAttention), asked for as torch's FlexAttention takes it:
    `return_aux` where torch has `AuxRequest`, else `return_lse` (torch 2.6 and 2.7)."""
    batch, heads, query_length, _ = query.shape
    b, h = torch.arange(batch)[:, None, None, None], torch.arange(heads)[None, :, None, None]
    q, kv = torch.arange(query_length)[None, None, :, None], torch.arange(key.size(-2))[None, None, None, :]
    compute = torch.promote_types(query.dtype, torch.float32)   # as FlexAttention: float32 scores, lse
    scores = torch.matmul(query.to(compute), key.to(compute).transpose(-1, -2)) * scale
    if score_mod is not None:
        scores = score_mod(scores, b, h, q, kv)
    if block_mask is not None:
        scores = scores.masked_fill(~block_mask.mask_mod(b, h, q, kv), float("-inf"))
    has_key = torch.isfinite(scores).any(-1, keepdim=True)
    log_normalizer = torch.logsumexp(torch.where(has_key, scores, 0.0), -1, keepdim=True)
    output = torch.matmul(torch.exp(scores - log_normalizer) * has_key, value.to(compute)).to(query.dtype)
    lse = torch.where(has_key, log_normalizer, float("-inf")).squeeze(-1)
    return flex_returns(output, lse, return_aux, return_lse)


@pytest.fixture
def reference_kernel(monkeypatch):
    monkeypatch.setattr(attention_functions, "flex_kernel", lambda query: reference_flex)


@pytest.mark.parametrize("kernel", [reference_flex, torch.nn.attention.flex_attention.flex_attention],
                         ids=["reference_flex", "flex_attention"])
@pytest.mark.parametrize("has_aux_request", [True, False], ids=["return_aux", "return_lse"])
def test_the_row_log_sum_exp_comes_back_from_either_api_of_flex_attention(kernel, has_aux_request, monkeypatch):
    """A torch without `AuxRequest` (2.6, 2.7) returns FlexAttention's log-sum-exp with `return_lse`:
    `with_log_sum_exp` gets the output and the row log-sum-exp [B, H, n] either way, from torch's kernel (forward
    only on the CPU) and from the test kernel `reference_flex` that the fused-form tests run instead."""
    flex = torch.nn.attention.flex_attention
    if not has_aux_request:   # the module as `with_log_sum_exp` imports it, less AuxRequest; torch's own stays whole
        without_aux_request = types.ModuleType(flex.__name__)
        vars(without_aux_request).update({name: value for name, value in vars(flex).items() if name != "AuxRequest"})
        monkeypatch.setattr(torch.nn.attention, "flex_attention", without_aux_request)
    elif not hasattr(flex, "AuxRequest"):
        pytest.skip("this torch's FlexAttention has no return_aux")
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(BATCH, HEADS, 6, HEAD_DIM, dtype=torch.float64, generator=generator)
                         for _ in range(3))
    causal = FlexMask(BATCH, 6, 6, highest=0)
    output, lse = attention_functions.with_log_sum_exp(kernel, query, key, value, None,
                                                       causal.block_mask(query.device), 0.5)
    scores = (query @ key.transpose(-1, -2) * 0.5).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), -torch.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(output, torch.softmax(scores, -1) @ value, rtol=0, atol=TOLERANCE)


CASES = [
    ("shaw", {}),
    ("shaw", {"use_relative_values": False}),
    ("shaw", {"use_relative_keys": False}),
    ("shaw", {"use_relative_keys": False, "use_relative_values": False}),   # no term: plain attention
    ("shaw", {"relative_embeddings_shared_across_heads": False}),
    ("shaw", {"max_relative_position": 0}),
    ("shaw", {"max_relative_position": 1}),
    ("shaw", {"max_relative_position": 20}),
    ("xl", {}),
    ("alibi", {}),
    ("t5", {}),
    ("t5", {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 5}),
    ("directional", {}),
    ("directional", {"directional_heads": ["forward", "both", "backward"], "directional_disable_diagonal": False}),
    ("rope", {}),
    ("absolute", {}),
]
SHAPES = {"encoder": (False, 9, 9), "decoder": (True, 9, 9), "cached": (True, 3, 10), "step": (True, 1, 10)}


def attention_for(position_scheme, is_causal, **overrides):
    config = tiny_config(position_scheme, d_model=HEADS * HEAD_DIM, encoder_attention_heads=HEADS,
                         decoder_attention_heads=HEADS, **overrides)
    scheme = get_scheme_class(position_scheme)(config, 2, HEADS, HEAD_DIM, is_causal=is_causal).double()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in scheme.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.5)
    return RelPosAttention(config, HEADS, 1, is_cross_attention=False, is_causal=is_causal).double(), scheme


def attend(attention, scheme, kernel, query, key, value, padding, is_causal):
    """Layer 1's self-attention on `kernel`, with the stack's mask and the scheme's terms, as the model runs it."""
    attention.config._attn_implementation = kernel
    query_length, key_length = query.size(-2), key.size(-2)
    offset = key_length - query_length
    mask = attention_mask_for(attention.config, BATCH, query_length, key_length, offset, padding, causal=is_causal,
                              device=torch.device("cpu"))
    context = scheme.prepare(PositionContext(query_length, key_length, offset, None, query.device, query.dtype))
    mask = with_scheme_mask(attention.config, scheme, context, mask)
    return attention.attend(query, scheme.transform_new_keys(1, key, context), value, mask, scheme, context)[0]


def assert_fused_equals_eager(attention, scheme, is_causal, query_length, key_length, padded):
    """Layer 1's output and the gradients of queries, keys, values and every scheme parameter on flex_attention
    against eager, in float64 at 1e-12; `padded`: None, "right" (the second sequence loses its last two keys) or
    "holes" (its second key too)."""
    generator = torch.Generator().manual_seed(query_length + 7 * key_length)
    make = lambda n: torch.randn(BATCH, HEADS, n, HEAD_DIM, generator=generator, dtype=torch.float64,  # noqa: E731
                                 requires_grad=True)
    query, key, value = make(query_length), make(key_length), make(key_length)
    padding = None
    if padded:
        padding = torch.ones(BATCH, key_length, dtype=torch.long)
        padding[1, -2:] = 0
        if padded == "holes":
            padding[1, 1] = 0
    inputs = [query, key, value, *scheme.parameters()]
    results = {}
    for kernel in ("eager", "flex_attention"):
        output = attend(attention, scheme, kernel, query, key, value, padding, is_causal)
        upstream = torch.randn(output.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        grads = torch.autograd.grad((output * upstream).sum(), inputs, allow_unused=True)
        results[kernel] = output, grads
    assert (results["flex_attention"][0] - results["eager"][0]).abs().max().item() < TOLERANCE
    for index, (fused, expected) in enumerate(zip(results["flex_attention"][1], results["eager"][1], strict=True)):
        if expected is None:
            assert fused is None or fused.abs().max().item() == 0
            continue
        assert (fused - expected).abs().max().item() < TOLERANCE, f"gradient of input {index}"


@pytest.mark.parametrize("padded", [None, "right", "holes"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("position_scheme, overrides", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_the_fused_form_of_every_scheme_equals_eager_with_every_gradient(position_scheme, overrides, shape, padded,
                                                                          reference_kernel):
    """Outputs and the gradients of queries, keys, values and every scheme parameter (Shaw's a^K and a^V tables,
    T5's buckets, XL's u, v, W_kR), in float64 at 1e-12: encoder, decoder, a cached call and a decoding step,
    unpadded, right-padded (per-sequence key ranges) and with holes (a padding that is not one run)."""
    is_causal, query_length, key_length = SHAPES[shape]
    attention, scheme = attention_for(position_scheme, is_causal, **overrides)
    assert_fused_equals_eager(attention, scheme, is_causal, query_length, key_length, padded)


# the last bucket from offset 4 on in the encoder (band -3 .. 3), from -6 on in a decoder (band -5 .. 0)
T5_FAR = {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 6}


def t5_far(position_scheme: str) -> dict:
    """`T5_FAR` for a t5 config, nothing for another scheme's (which refuses T5's fields)."""
    return hf_relpos.RelPosTransformerConfig.held_fields(position_scheme, T5_FAR)


@pytest.mark.parametrize("padded", [None, "right", "holes"])
@pytest.mark.parametrize("is_causal, query_length, key_length, regions",
                         [(False, 20, 20, 2), (True, 20, 20, 1), (True, 7, 20, 1), (False, 4, 4, 0), (True, 2, 5, 0)],
                         ids=["encoder", "decoder", "cached", "encoder-short", "cached-short"])
def test_t5_runs_as_far_regions_without_score_mod_and_an_explicit_band(is_causal, query_length, key_length, regions,
                                                                      padded, monkeypatch):
    """T5 at consecutive positions: the keys whose offset has its half's last bucket form a left (and, in the
    encoder, a right) region, each one FlexAttention call without score_mod; the offsets between them are the band,
    clamped to the offsets the call meets (a short call runs as its band alone). Equal to eager in float64 at 1e-12
    with every gradient (T5's table included), longer and shorter than max_distance, cached calls included."""
    calls = []

    def recording_flex(query, key, value, score_mod=None, **kwargs):
        calls.append(score_mod)
        return reference_flex(query, key, value, score_mod, **kwargs)

    monkeypatch.setattr(attention_functions, "flex_kernel", lambda query: recording_flex)
    counts = count_calls(monkeypatch, positions, "band_scores")
    attention, scheme = attention_for("t5", is_causal, **T5_FAR)
    assert_fused_equals_eager(attention, scheme, is_causal, query_length, key_length, padded)
    assert calls == [None] * regions
    first, last = (-5, 0) if is_causal else (-3, 3)   # the band, clamped to the offsets the call meets
    offset = key_length - query_length
    expected = min(last, key_length - 1 - offset) - max(first, -(offset + query_length - 1)) + 1
    assert [args[-1] for args in counts] == [expected]


def test_the_t5_band_ends_where_the_last_bucket_begins():
    """The fused band holds exactly the offsets whose bucket is not their half's last one: 181 of T5's defaults'
    255 in the encoder (offsets -90 .. 90), 113 in a decoder (offsets -112 .. 0, every j > i being bucket 0)."""
    offsets = torch.arange(-1000, 1001)
    for is_causal, first, width in ((False, -90, 181), (True, -112, 113)):
        scheme = get_scheme_class("t5")(tiny_config("t5"), 1, HEADS, HEAD_DIM, is_causal=is_causal)
        buckets = scheme.bucket_of(offsets)
        left, right = buckets[0].item(), buckets[-1].item()
        assert scheme.band_first == first
        assert (buckets[offsets < first] == left).all() and buckets[offsets == first].item() != left
        assert (buckets[offsets >= first + width] == right).all()
        assert scheme.fused_buckets == (*buckets[(offsets >= first) & (offsets < first + width)].tolist(), left, right)


def captured_tensors(function, depth=4):
    """The tensors a function can read: those in its closure, in the partials and functions it closes over, and
    in the fields of the objects whose bound methods it holds (a few levels deep)."""
    found, pending = [], [(function, depth)]
    while pending:
        item, level = pending.pop()
        if torch.is_tensor(item):
            found.append(item)
        elif level == 0 or item is None:
            continue
        elif isinstance(item, functools.partial):
            pending += [(x, level - 1) for x in (item.func, *item.args, *item.keywords.values())]
        elif inspect.ismethod(item):
            pending += [(item.__func__, level - 1), (item.__self__, level - 1)]
        elif inspect.isfunction(item):
            pending += [(cell.cell_contents, level - 1) for cell in item.__closure__ or ()]
        elif isinstance(item, (list, tuple)):
            pending += [(x, level - 1) for x in item]
        elif dataclasses.is_dataclass(item) or isinstance(item, torch.nn.Module):
            pending += [(x, level - 1) for x in vars(item).values()]
    return found


@pytest.mark.parametrize("position_scheme", ["shaw", "t5"])
@pytest.mark.parametrize("randomized", [False, True])
def test_no_score_mod_of_shaw_or_t5_reads_a_parameter_that_needs_a_gradient(position_scheme, randomized, monkeypatch):
    """At consecutive positions, the fused path of Shaw and T5 gives FlexAttention no score_mod reading a tensor that
    requires a gradient (whose gradient Inductor would accumulate with atomic adds, pytorch#137452): their tables'
    gradients come by autograd outside the kernel. Under randomized positions T5 keeps its score_mod over the table
    (what this test detects; Shaw's a^V then runs on eager)."""
    score_mods = []

    def recording_flex(query, key, value, score_mod=None, **kwargs):
        score_mods.append(score_mod)
        return reference_flex(query, key, value, score_mod, **kwargs)

    monkeypatch.setattr(attention_functions, "flex_kernel", lambda query: recording_flex)
    overrides = {"position_randomization_max": 64} if randomized else {}
    model = hf_relpos.RelPosTransformerForConditionalGeneration(
        tiny_config(position_scheme, attention_dropout=0.0, **t5_far(position_scheme), **overrides)).double().train()
    model.set_attn_implementation("flex_attention")
    input_ids = torch.randint(4, 40, (2, 24))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -3:] = 0
    model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss.backward()
    assert score_mods, "FlexAttention never ran"
    reads_gradient = [mod for mod in score_mods if any(t.requires_grad for t in captured_tensors(mod))]
    if randomized and position_scheme == "t5":
        assert reads_gradient
    else:
        assert reads_gradient == []
    table = model.model.encoder.positions
    assert all(parameter.grad is not None and parameter.grad.abs().sum() > 0 for parameter in table.parameters())


def test_a_decoding_step_never_runs_flex_attention(monkeypatch):
    """One query's scores are [B, H, 1, m]: a cached step runs on sdpa (the eager equation), never a compiled
    kernel."""
    def refuse(query):
        raise AssertionError("a decoding step reached FlexAttention")

    monkeypatch.setattr(attention_functions, "flex_kernel", refuse)
    attention, scheme = attention_for("shaw", True)
    query, key, value = (torch.randn(BATCH, HEADS, n, HEAD_DIM, dtype=torch.float64) for n in (1, 6, 6))
    fused = attend(attention, scheme, "flex_attention", query, key, value, None, True)
    assert torch.equal(fused, attend(attention, scheme, "sdpa", query, key, value, None, True))
    assert (fused - attend(attention, scheme, "eager", query, key, value, None, True)).abs().max() < TOLERANCE


@pytest.mark.parametrize("query_length, key_length, offset", [(10, 13, 3), (13, 13, 0), (4, 17, 13)])
def test_block_masks_hold_exactly_the_blocks_the_mask_reaches(query_length, key_length, offset, monkeypatch):
    """A FlexMask's BlockMask, built a block of queries at a time, lists a block as full when every entry is
    allowed (within n and m), as partial when some is, and skips it otherwise: padding, a window, causality and a per-head mask."""
    monkeypatch.setattr(attention_functions, "FLEX_BLOCK", 4)
    key_valid = torch.ones(BATCH, key_length, dtype=torch.bool)
    key_valid[1, -5:] = False
    mask = FlexMask(BATCH, query_length, key_length, offset, key_valid=key_valid, lowest=-6, highest=0)
    mask = mask.with_head_mask(lambda h, i, j: (h == 0) | (j != i), HEADS)
    dense = mask.dense()
    assert dense.shape == (BATCH, HEADS, query_length, key_length)
    block_mask = mask.block_mask(torch.device("cpu"))
    padded = torch.zeros(BATCH, HEADS, 4 * -(-query_length // 4), 4 * -(-key_length // 4), dtype=torch.bool)
    padded[..., :query_length, :key_length] = dense
    blocks = padded.unflatten(-1, (-1, 4)).unflatten(-3, (-1, 4))   # [B, H, QB, 4, KB, 4]
    assert torch.equal(block_mask.to_dense().bool(), blocks.any(-1).any(-2))
    listed = torch.arange(block_mask.full_kv_indices.size(-1)) < block_mask.full_kv_num_blocks[..., None]
    full = torch.zeros_like(listed).scatter_(-1, block_mask.full_kv_indices.long(), listed)
    assert torch.equal(full, blocks.all(-1).all(-2))   # a block beyond n or m is never full


def test_shaw_masses_are_never_negative_and_sum_to_one_in_bfloat16(reference_kernel):
    """Shaw's a^V masses come from exponentials of float32 band scores and region log-sum-exps: bfloat16 queries and
    keys with large scores give masses >= 0 that sum to 1 (no left edge computed as 1 - the rest)."""
    attention, scheme = attention_for("shaw", False, max_relative_position=2)
    scheme.float()
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(BATCH, HEADS, 12, HEAD_DIM, generator=generator).mul(30).bfloat16()
                         for _ in range(3))
    mask = FlexMask(BATCH, 12, 12)
    context = scheme.prepare(PositionContext(12, 12, 0, None, query.device, query.dtype))
    _, masses = scheme.region_attention(context, 0, query, key, value, HEAD_DIM**-0.5, mask,
                                        attention_functions.flex_region)
    assert masses.dtype == torch.float32 and (masses >= 0).all()
    assert (masses.sum(-1) - 1).abs().max().item() < 1e-4   # float32 rounding of scores near 1e3


def test_shaw_band_and_masses_stay_in_float32_under_bfloat16_autocast(monkeypatch):
    """Under bf16 autocast the band scores, the merge and a^V's masses times w^V run in promote_types(bf16, float32)
    (autocast would run their products in bf16): the same results as without autocast, bit for bit."""
    def kernel_without_autocast(*args, **kwargs):   # as the compiled kernel, which runs with autocast off
        with torch.autocast("cpu", enabled=False):
            return reference_flex(*args, **kwargs)

    monkeypatch.setattr(attention_functions, "flex_kernel", lambda query: kernel_without_autocast)
    attention, scheme = attention_for("shaw", False, max_relative_position=3)
    scheme.float()
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(BATCH, HEADS, 20, HEAD_DIM, generator=generator).bfloat16() for _ in range(3))
    mask = FlexMask(BATCH, 20, 20)
    context = scheme.prepare(PositionContext(20, 20, 0, None, query.device, query.dtype))
    results = []
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            output, masses = scheme.region_attention(context, 0, query, key, value, HEAD_DIM**-0.5, mask,
                                                     attention_functions.flex_region)
            fused = scheme.fused_attention(context, 0, query, key, value, HEAD_DIM**-0.5, mask,
                                           attention_functions.flex_region)
        assert output.dtype == masses.dtype == torch.float32 and fused.dtype == torch.bfloat16
        results.append((output, masses, fused))
    for expected, actual in zip(*results, strict=True):
        assert torch.equal(actual, expected)


class LargeTensors(TorchDispatchMode):
    """Records every tensor an operation creates with at least `limit` elements."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.found = limit, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(result)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.numel() >= self.limit:
                self.found.append((str(func), tuple(tensor.shape)))
        return result


def opaque_flex(query, key, value, score_mod=None, block_mask=None, scale=None, return_aux=None, return_lse=False,
                **kwargs):
    """A stand-in for FlexAttention's kernel that creates nothing of n x m: the kernel is torch's, what is traced is
    the package's code around it."""
    output = query * value.mean(-2, keepdim=True)
    lse = (query * key.mean(-2, keepdim=True)).sum(-1)
    return flex_returns(output, lse, return_aux, return_lse)


@pytest.mark.parametrize("position_scheme", built_in_schemes())
def test_no_tensor_of_n_by_n_in_the_fused_forward_and_backward_at_1024(position_scheme, monkeypatch):
    """One batch entry, two heads, n = 1024 tokens in the encoder and the decoder, padded, forward and backward of the
    whole model: nothing the package creates has n x n elements or more, except XL's per-distance table
    (n x (n + m - 1) per head by nature), which is recomputed in the backward per layer instead of kept. The schemes
    hf_relpos ships: a scheme registered elsewhere (tests/test_scheme_toy.py) may give a dense [n, m] bias."""
    monkeypatch.setattr(attention_functions, "flex_kernel", lambda query: opaque_flex)
    length = 1024
    config = tiny_config(position_scheme, d_model=8, encoder_attention_heads=2, decoder_attention_heads=2,
                         encoder_layers=1, decoder_layers=1, encoder_ffn_dim=8, decoder_ffn_dim=8,
                         attention_dropout=0.0, max_position_embeddings=2 * length)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config)
    model.set_attn_implementation("flex_attention")
    input_ids = torch.randint(4, 40, (1, length))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[:, -100:] = 0
    recorder = LargeTensors(length * length)
    with recorder:
        model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss.backward()
    if position_scheme == "xl":   # the encoder's table (n + m - 1 distances) and the decoder's (m)
        assert recorder.found and {shape[-2:] for _, shape in recorder.found} == {(length, 2 * length - 1),
                                                                                   (length, length)}
    else:
        assert recorder.found == []


def test_the_fused_path_builds_no_dense_bias(monkeypatch, reference_kernel):
    """ALiBi's and T5's dense biases are built only for the kernels that read them."""
    built = []
    original = DenseBias.dense
    monkeypatch.setattr(DenseBias, "dense", lambda self: (self._dense is None and built.append(self)) or original(self))
    for position_scheme in ("alibi", "t5"):
        attention, scheme = attention_for(position_scheme, False)
        query, key, value = (torch.randn(BATCH, HEADS, 6, HEAD_DIM, dtype=torch.float64) for _ in range(3))
        attend(attention, scheme, "flex_attention", query, key, value, None, False)
        assert built == []
        attend(attention, scheme, "eager", query, key, value, None, False)
        assert len(built) == 1
        built.clear()


@pytest.mark.slow
def test_compiled_graphs_stay_bounded_over_many_lengths_and_the_limit_raises(monkeypatch):
    """FlexAttention compiled with dynamic shapes (Inductor's CPU backend, inference): batches of several sizes and
    lengths padded to FLEX_LENGTH_MULTIPLE (of more than one block), with padding, compile a few graphs, and more
    lengths add none; past the
    recompile limit the kernel raises FlexCompileError instead of running unfused. (`absolute`: torch 2.13's CPU
    template fails to compile ALiBi's and T5's score_mods, "cur_qSplitSize was not declared", which the kernel
    reports as a FlexCompileError; the CUDA template is another code path, tested in test_kernels.py.)"""
    monkeypatch.setattr(attention_functions, "COMPILE_ON_CPU", True)
    monkeypatch.setattr(attention_functions, "_compiled_flex_attention", None)
    attention, scheme = attention_for("absolute", False)
    attention.float(), scheme.float()
    multiple = attention_functions.length_multiple("flex_attention")

    def run(batch, length, dtype=torch.float32):
        query, key, value = (torch.randn(batch, HEADS, length, HEAD_DIM, dtype=dtype) for _ in range(3))
        padding = torch.ones(batch, length, dtype=torch.long)
        padding[0, -3:] = 0
        with torch.no_grad():
            attend(attention, scheme, "flex_attention", query, key, value, padding, False)

    start = attention_functions.compiled_graph_count()
    for batch, blocks in ((2, 3), (3, 4)):
        run(batch, multiple * blocks)
    first = attention_functions.compiled_graph_count() - start
    assert 1 <= first <= 3
    for batch, blocks in ((5, 5), (7, 6), (4, 8)):
        run(batch, multiple * blocks)
    assert attention_functions.compiled_graph_count() - start == first
    monkeypatch.setattr(attention_functions, "FLEX_RECOMPILE_LIMIT", 1)
    with pytest.raises(attention_functions.FlexCompileError, match="compiled graphs"):
        run(2, multiple, dtype=torch.bfloat16)


def test_the_recompile_limit_error_names_the_multiple_training_pads_to(monkeypatch):
    def compile_hitting_the_limit(function, **kwargs):
        def compiled(*args, **kwargs):
            raise torch._dynamo.exc.FailOnRecompileLimitHit("recompile_limit reached")
        return compiled

    monkeypatch.setattr(attention_functions, "COMPILE_ON_CPU", True)
    monkeypatch.setattr(attention_functions, "_compiled_flex_attention", None)
    monkeypatch.setattr(attention_functions.torch, "compile", compile_hitting_the_limit)
    query = torch.randn(1, 1, 4, 2)
    with pytest.raises(attention_functions.FlexCompileError,
                       match=f"pad lengths to a multiple of {attention_functions.FLEX_LENGTH_MULTIPLE} "):
        attention_functions.flex_kernel(query)(query, query, query)


def test_a_dense_bias_record_without_a_score_mod_is_read_per_score(reference_kernel):
    """A user scheme's `DenseBias` with no score_mod: the fused path reads its dense [B, H, n, m] bias (as eager)."""
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(BATCH, HEADS, 6, HEAD_DIM, generator=generator, dtype=torch.float64)
                         for _ in range(3))
    bias = torch.randn(1, HEADS, 6, 6, generator=generator, dtype=torch.float64)
    fused, _ = flex_attention_forward(None, query, key, value, None, score_bias=DenseBias(lambda: bias))
    expected, _ = attention_functions.eager_attention_forward(None, query, key, value, None, score_bias=bias)
    assert (fused - expected).abs().max().item() < TOLERANCE


def test_the_fused_path_pads_lengths_to_a_multiple():
    assert attention_functions.length_multiple("flex_attention") == attention_functions.FLEX_LENGTH_MULTIPLE
    assert attention_functions.length_multiple("sdpa") is None


def test_flex_attention_refuses_dropout_in_training(reference_kernel):
    query = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="attention_dropout"):
        flex_attention_forward(None, query, query, query, None, dropout=0.1)
    values = RelativeValues(torch.randn(3, 2), 1, 0, torch.zeros(4, 4, dtype=torch.long), consecutive=False)
    with pytest.raises(ValueError, match="attention_dropout"):   # also where the value term runs on eager
        flex_attention_forward(None, query, query, query, None, dropout=0.1, value_term=values)


def test_a_value_term_without_a_fused_form_runs_eager_with_a_warning(reference_kernel, caplog):
    """Shaw's a^V at randomized positions (or a scheme's value term without fused_attention) forms the n x m
    probabilities on eager: said once, naming the cause; a decoding step (eager by design) says nothing."""
    query = torch.randn(1, 1, 4, 2, dtype=torch.float64)
    index = torch.randint(0, 3, (4, 4))
    values = RelativeValues(torch.randn(3, 2, dtype=torch.float64), 1, 0, index, consecutive=False)
    expected, _ = attention_functions.eager_attention_forward(None, query, query, query, None, value_term=values)
    outputs = []
    logged = warnings_logged(caplog, lambda: outputs.extend(
        flex_attention_forward(None, query, query, query, None, value_term=values)[0] for _ in range(2)))
    assert logged == ["flex_attention: Shaw's a^V at randomized positions has no fused form: it runs on eager, "
                      "forming the n x m attention probabilities"]
    assert all(torch.equal(output, expected) for output in outputs)
    logged = warnings_logged(caplog, lambda: flex_attention_forward(None, query, query, query, None,
                                                                    value_term=lambda probabilities: 0.0))
    assert logged == ["flex_attention: a value term (function) whose scheme gives no fused_attention has no fused "
                      "form: it runs on eager, forming the n x m attention probabilities"]
    step_values = RelativeValues(values.table, 1, 3, index[-1:], consecutive=False)
    assert warnings_logged(caplog, lambda: flex_attention_forward(None, query[..., -1:, :], query, query, None,
                                                                  value_term=step_values)) == []


def test_flex_attention_off_cuda_and_off_the_cpu_runs_uncompiled_with_a_warning(caplog):
    logged = warnings_logged(caplog, lambda: attention_functions.flex_kernel(torch.empty(1, device="meta")))
    assert logged == ["flex_attention on meta: FlexAttention is compiled on CUDA only, so it runs uncompiled here "
                      "(slow, forming every score); use 'sdpa' on this device"]
    assert warnings_logged(caplog, lambda: attention_functions.flex_kernel(torch.empty(1))) == []


def count_calls(monkeypatch, owner, name):
    calls = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_prepare_runs_once_per_stack_call_and_terms_once_per_layer(position_scheme, monkeypatch):
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(position_scheme, encoder_layers=3)).eval()
    scheme_class = hf_relpos.POSITION_SCHEMES[position_scheme]
    prepares = count_calls(monkeypatch, scheme_class, "prepare")
    terms = count_calls(monkeypatch, scheme_class, "terms")
    input_ids = torch.randint(4, 40, (2, 6))
    with torch.no_grad():
        model(input_ids=input_ids, decoder_input_ids=input_ids[:, :4])
    assert len(prepares) == 2  # encoder + decoder
    assert len(terms) == 3 + 2


class RecordPads(TorchDispatchMode):
    """The input shape of every constant_pad_nd, the shape of every copy_'s destination, and the number of
    select_backward calls, run inside it."""

    def __init__(self):
        super().__init__()
        self.pads, self.copies, self.select_backwards = [], [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.constant_pad_nd.default:
            self.pads.append(tuple(args[0].shape))
        if func is torch.ops.aten.copy_.default:
            self.copies.append(tuple(args[0].shape))
        self.select_backwards += func is torch.ops.aten.select_backward.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_shaws_tables_are_padded_once_per_stack_call_in_a_training_step(kernel):
    """A training step of shaw (forward and backward) pads each distance table [L, 2k+1, d] to its aligned rows once
    per stack call, whatever the number of layers (`ShawContext.aligned_tables`), and never selects one layer's
    table from the stacked parameter (a select's backward fills a zero [L, 2k+1, d] per layer): 3 + 2 layers, two
    tables, two stacks, each padded once forward, and its gradient's rows copied out of the padded gradient once
    backward (`ZeroRowsAfter`)."""
    config = tiny_config("shaw", encoder_layers=3, decoder_layers=2)
    config._attn_implementation = kernel
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).train()
    distances, head_dim = 2 * config.max_relative_position + 1, config.d_model // config.encoder_attention_heads
    input_ids = torch.randint(4, 40, (2, 6))
    with RecordPads() as recorded:
        model(input_ids=input_ids, labels=input_ids[:, :4]).loss.backward()
    tables = [shape for shape in recorded.pads if shape[-1] == head_dim and shape[-2] >= distances]
    assert sorted(shape[0] for shape in tables) == [2, 2, 3, 3]   # [L, ...]: stacked, never per layer
    gradients = [shape for shape in recorded.copies if shape[-2:] == (distances, head_dim)]
    assert sorted(shape[0] for shape in gradients) == [2, 2, 3, 3]
    assert recorded.select_backwards == 0
    assert all(parameter.grad is not None for name, parameter in model.named_parameters() if "relative_" in name)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_a_checkpointed_training_step_scales_and_pads_one_layers_tables_per_read(kernel):
    """Under gradient checkpointing (`reuse_across_layers` false, so `computed_once` recomputes at every read) a
    layer's products scale and pad that layer's table [2k+1, d] alone, never the stacked tables [L, 2k+1, d] of the
    stack's every layer (L times the work at every read: in a 6 + 6-layer step 360 operators more than tables read
    per layer); the gradients equal those without checkpointing."""
    config = tiny_config("shaw", encoder_layers=3, decoder_layers=2)
    config._attn_implementation = kernel
    distances, head_dim = 2 * config.max_relative_position + 1, config.d_model // config.encoder_attention_heads
    input_ids = torch.randint(4, 40, (2, 6))
    gradients = {}
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = hf_relpos.RelPosTransformerForConditionalGeneration(config).double().train()
        if checkpointed:
            model.activation_checkpointing_enable({"use_reentrant": False})
        with RecordPads() as recorded:
            model(input_ids=input_ids, labels=input_ids[:, :4]).loss.backward()
        gradients[checkpointed] = {name: parameter.grad for name, parameter in model.named_parameters()
                                   if "relative_" in name}
    tables = [shape for shape in recorded.pads if shape[-1] == head_dim and shape[-2] >= distances]
    assert tables and all(len(shape) == 2 for shape in tables), set(tables)   # one layer's, not [L, ...]
    for name, gradient in gradients[True].items():
        assert gradient is not None and (gradient - gradients[False][name]).abs().max().item() < 1e-12, name


class RecordCasts(TorchDispatchMode):
    """The input shape and target dtype of every cast (_to_copy) run inside it."""

    def __init__(self):
        super().__init__()
        self.casts = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.casts.append((tuple(args[0].shape), (kwargs or {}).get("dtype")))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("values", [False, True])
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_under_autocast_shaws_tables_are_cast_once_per_stack_call(kernel, values):
    """Under bfloat16 autocast the a^K tables meet bfloat16 queries and the a^V tables the masses that autocast's
    matmul casts to bfloat16: each stack call casts its stacked table [L, R', d] once (its backward one cast back),
    not every layer's product its own [R', d]; the step's loss and every gradient equal, bit for bit, those of the
    checkpointed step, whose layers cast their own tables."""
    config = tiny_config("shaw", encoder_layers=3, decoder_layers=2, dropout=0.0, attention_dropout=0.0,
                         use_relative_values=values)
    config._attn_implementation = kernel
    rows = aligned_width(2 * config.max_relative_position + 1)
    head_dim = config.d_model // config.encoder_attention_heads
    input_ids = torch.randint(4, 40, (2, 6))
    results = {}
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = hf_relpos.RelPosTransformerForConditionalGeneration(config).train()
        if checkpointed:
            model.activation_checkpointing_enable({"use_reentrant": False})
        with RecordCasts() as recorded, torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, labels=input_ids[:, :4]).loss
        loss.backward()
        tables = [shape for shape, dtype in recorded.casts if dtype == torch.bfloat16 and shape[-2:] == (rows, head_dim)]
        results[checkpointed] = loss, {name: parameter.grad for name, parameter in model.named_parameters()}, tables
    (loss, gradients, tables), (checkpointed_loss, checkpointed_gradients, per_layer) = results[False], results[True]
    assert sorted(tables) == sorted([(2, rows, head_dim), (3, rows, head_dim)] * (1 + values))   # per stack call
    assert per_layer == [(rows, head_dim)] * (3 + 2) * (1 + values)
    assert torch.equal(loss, checkpointed_loss)
    for name, gradient in gradients.items():
        assert torch.equal(gradient, checkpointed_gradients[name]), name


def test_cached_rope_decoding_rotates_only_the_new_token(monkeypatch):
    """The KV cache holds rotated keys: a decoding step rotates one query and one key per layer, never the cache."""
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("rope")).eval()
    rotated_lengths = []
    rotate = hf_relpos.model.positions_rope.RotaryPositions.rotate

    def recorded(self, states, *rotation):
        rotated_lengths.append(states.size(-2))
        return rotate(self, states, *rotation)

    monkeypatch.setattr(hf_relpos.model.positions_rope.RotaryPositions, "rotate", recorded)
    input_ids = torch.randint(4, 40, (1, 6))
    with torch.no_grad():
        out = model(input_ids=input_ids, decoder_input_ids=input_ids[:, :3], use_cache=True)
        rotated_lengths.clear()
        model(encoder_outputs=(out.encoder_last_hidden_state,), decoder_input_ids=input_ids[:, 3:4], use_cache=True,
              cache=out.cache)
    assert rotated_lengths == [1, 1] * 2  # a key and a query in each of the decoder's two layers


@pytest.mark.parametrize("position_scheme", ["shaw", "directional", "t5"])
def test_flex_block_masks_are_built_once_per_mask_not_per_layer(position_scheme, monkeypatch):
    """Every layer of a stack shares its self-attention FlexMask (the scheme's mask combined once) and so its
    BlockMask (Shaw, T5: one per key region beyond the band; T5's decoder's 6 tokens lie within its band)."""
    config = tiny_config(position_scheme, encoder_layers=4, decoder_layers=4, **t5_far(position_scheme))
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).eval()
    model.set_attn_implementation("flex_attention")
    builds = count_calls(monkeypatch, FlexMask, "_build_block_mask")
    input_ids = torch.randint(4, 40, (2, 6))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 4:] = 0
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids)
    regions = {"shaw": 2 + 1, "directional": 1 + 1, "t5": 2 + 0}[position_scheme]  # encoder + decoder self-attention
    assert len(builds) == regions + 1  # and the cross-attention's


def test_the_dense_t5_bias_is_built_once_per_forward(monkeypatch):
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("t5", encoder_layers=4)).eval()
    built = []
    original = DenseBias.dense
    monkeypatch.setattr(DenseBias, "dense", lambda self: (self._dense is None and built.append(self)) or original(self))
    input_ids = torch.randint(4, 40, (2, 6))
    with torch.no_grad():
        model(input_ids=input_ids, decoder_input_ids=input_ids)
    assert len(built) == 2  # one tensor per stack, read by every layer


def test_prepare_sees_the_cached_positions():
    """A decoding step's context starts at the cache length (the true distance of the new query)."""
    scheme = hf_relpos.POSITION_SCHEMES["shaw"](tiny_config("shaw"), 1, 4, 8, is_causal=True)
    context = scheme.prepare(PositionContext(1, 7, 6, None, torch.device("cpu"), torch.float64))
    assert context.index.tolist() == [[max(0, 3 - 6 + j) for j in range(7)]]


def test_padding_becomes_per_sequence_key_ranges_when_each_sequence_is_one_run():
    """Right and left padding give key ranges [start, end) (what the compiled mask_mod reads); a padding with holes
    keeps the [B, m] booleans; either way the mask is the padding."""
    runs = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    mask = FlexMask.from_padding(runs, 2)
    assert mask.key_start.tolist() == [0, 2, 0] and mask.key_end.tolist() == [3, 5, 0] and mask.key_valid is None
    holes = torch.tensor([[1, 0, 1, 1, 1]])
    assert torch.equal(FlexMask.from_padding(holes, 2).key_valid, holes.bool())
    for padding in (runs, holes):
        assert torch.equal(FlexMask.from_padding(padding, 2).dense(), padding.bool()[:, None, None, :].expand(-1, 1, 2, -1))


def test_xl_recomputes_its_position_table_in_the_backward(monkeypatch, reference_kernel):
    """XL's per-distance table (n x (n + m - 1) per head) is not kept for the backward: the attention call is
    checkpointed, so the table is computed once in the forward and once more in the backward."""
    computed = count_calls(monkeypatch, get_scheme_class("xl"), "position_scores")
    attention, scheme = attention_for("xl", False)
    query, key, value = (torch.randn(BATCH, HEADS, 6, HEAD_DIM, dtype=torch.float64, requires_grad=True)
                         for _ in range(3))
    output = attend(attention, scheme, "flex_attention", query, key, value, None, False)
    assert len(computed) == 1
    output.sum().backward()
    assert len(computed) == 2 and torch.isfinite(query.grad).all()
