"""attn_implementation "relpos_triton" (hf_relpos/model/triton_relative.py): the fused Triton kernel for Shaw's
relative attention, run on the CPU by Triton's interpreter (TRITON_INTERPRET=1, set for this module only), against a
float64 loop oracle of the equations and against the model's eager path: output, log-sum-exp, the masses by
distance and every gradient, padded and unpadded, encoder and decoder, cached steps, k = 0, 1, 16, lengths that are
not multiples of the interpreter's 16-wide blocks, with and without a^V, and attention dropout under the kernel's
own mask. conftest.py sets TRITON_INTERPRET=1 where there is no GPU (before triton is imported); on a GPU the same
tests run the compiled kernels on CUDA."""

from __future__ import annotations

import collections
import copy
import importlib.util
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import RecordMatmuls, requires_relpos_triton, tiny_config
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForSeq2SeqLM

import hf_relpos
from hf_relpos.model import attention_functions, triton_relative
from hf_relpos.model.positions import RelativeBias, RelativeValues, aligned_width
from hf_relpos.model.triton_relative import dropout_keep_mask, dropout_rate, relative_attention

DEVICE = torch.device("cpu" if triton_relative.interpreting() else "cuda")
pytestmark = requires_relpos_triton


def loop_oracle(query, key, value, table, key_start, key_end, scaling, query_offset, k, causal, keep=None,
                dropout=0.0):
    """Per row, term by term in float64: s_ij = c q_i . k_j + T[i, clip(j - i', k) + k] over the allowed keys,
    lse_i, D_ij = softmax_ij kappa_ij / (1 - p), o_i = sum_j D_ij v_j, M[i, r] = sum_{clip(j - i', k) + k = r} D_ij,
    p the rate the kernels drop at for `dropout` (`dropout_rate`)."""
    batch, heads, query_length, head_dim = query.shape
    distances = 2 * k + 1
    rows_out, masses_out, lse_out = [], [], []
    for b in range(batch):
        for h in range(heads):
            for i in range(query_length):
                keys = [j for j in range(int(key_start[b]), int(key_end[b])) if not causal or j <= i + query_offset]
                output = query.new_zeros(head_dim, dtype=torch.float64)
                masses = [query.new_zeros((), dtype=torch.float64) for _ in range(distances)]
                lse = torch.tensor(float("-inf"), dtype=torch.float64)
                if keys:
                    buckets = [max(-k, min(k, j - i - query_offset)) + k for j in keys]
                    scores = torch.stack([
                        scaling * (query[b, h, i].double() @ key[b, h, j].double())
                        + (table[b, h, i, r].double() if table is not None else 0.0)
                        for j, r in zip(keys, buckets, strict=True)])
                    lse = torch.logsumexp(scores, 0)
                    for position, (j, r) in enumerate(zip(keys, buckets, strict=True)):
                        dropped = torch.exp(scores[position] - lse)
                        if keep is not None:
                            dropped = dropped * (float(keep[b, h, i, j]) / (1.0 - dropout_rate(dropout)))
                        output = output + dropped * value[b, h, j].double()
                        masses[r] = masses[r] + dropped
                rows_out.append(output)
                masses_out.append(torch.stack(masses))
                lse_out.append(lse)
    shape = (batch, heads, query_length)
    return (torch.stack(rows_out).view(*shape, head_dim), torch.stack(masses_out).view(*shape, distances),
            torch.stack(lse_out).view(shape))


def natural(lse):
    """The op's row log-sum-exp (in base 2, lse log2(e)) in natural units."""
    return lse * math.log(2.0)


def mass_columns(k, with_masses):
    """The masses' width the model asks for: 2k+1 rounded up to the aligned width (0: no masses)."""
    return aligned_width(2 * k + 1) if with_masses else 0


def assert_matches_oracle(outputs, expected_outputs, inputs, with_masses, generator):
    """The kernel's (o, M, lse) equal the oracle's at 1e-12 (M only `with_masses`; its columns beyond 2k+1 exactly
    zero), and so do the gradients of a random linear function of o and M (its padding columns included, which
    must change nothing) with respect to every input (None inputs skipped)."""
    (output, masses, lse), (expected_output, expected_masses, expected_lse) = outputs, expected_outputs
    distances = expected_masses.size(-1)
    torch.testing.assert_close(output, expected_output, rtol=0, atol=1e-12)
    torch.testing.assert_close(natural(lse), expected_lse, rtol=0, atol=1e-12)
    if with_masses:
        torch.testing.assert_close(masses[..., :distances], expected_masses, rtol=0, atol=1e-12)
        assert masses.size(-1) >= distances and not masses[..., distances:].any()
    grad_output = torch.randn(output.shape, generator=generator, dtype=torch.float64).to(DEVICE)
    grad_masses = torch.randn(masses.shape if with_masses else expected_masses.shape, generator=generator,
                              dtype=torch.float64).to(DEVICE)
    inputs = [tensor for tensor in inputs if tensor is not None]
    loss = (output * grad_output).sum() + ((masses * grad_masses).sum() if with_masses else 0)
    expected_loss = ((expected_output * grad_output).sum()
                     + ((expected_masses * grad_masses[..., :distances]).sum() if with_masses else 0))
    expected_grads = torch.autograd.grad(expected_loss, inputs)
    for got, expected in zip(torch.autograd.grad(loss, inputs), expected_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


KERNEL_CASES = {
    # name: (k, query_length, key_length, query_offset, causal, padded, with_bias, with_masses, dropout)
    "encoder_k1_padded": (1, 21, 21, 0, False, True, True, True, 0.0),
    "encoder_k16_unpadded": (16, 21, 21, 0, False, False, True, True, 0.0),
    "encoder_k0_padded": (0, 19, 19, 0, False, True, True, True, 0.0),
    "decoder_k3_padded": (3, 33, 33, 0, True, True, True, True, 0.0),
    "cached_step": (3, 1, 21, 20, True, True, True, True, 0.0),
    "cached_chunk_k16": (16, 3, 35, 32, True, False, True, True, 0.0),
    "encoder_k16_padded_long": (16, 41, 41, 0, False, True, True, True, 0.0),   # three tiles of the band at k = 16
    "shaw_k_without_values": (2, 23, 23, 0, False, True, True, False, 0.0),
    "values_without_bias": (2, 23, 23, 0, True, True, False, True, 0.0),
    "dropout_encoder": (2, 21, 21, 0, False, True, True, True, 0.3),
    "dropout_decoder_cached": (16, 5, 23, 18, True, True, True, True, 0.25),
    # query blocks that meet tiles beyond -k, then beyond +k, then the band: the masses rescaled between them
    "encoder_k1_both_edges": (1, 48, 48, 0, False, False, False, True, 0.0),
    # k = 0, causal, one query ahead: the first query block's tile beyond +k holds key 16, which only row 15 may see
    "decoder_k0_diagonal_beyond_k": (0, 20, 21, 1, True, False, True, True, 0.0),
}


def kernel_inputs(case, dtype, seed=0):
    k, query_length, key_length, query_offset, causal, padded, with_bias, with_masses, dropout = case
    generator = torch.Generator().manual_seed(seed)
    batch, heads, head_dim = 2, 2, 8

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(DEVICE, dtype).requires_grad_()

    query = draw(batch, heads, query_length, head_dim)
    key, value = draw(batch, heads, key_length, head_dim), draw(batch, heads, key_length, head_dim)
    table = draw(batch, heads, query_length, 2 * k + 1) if with_bias else None
    # padded: the second sequence's keys [3, m - 4) (left and right padding); its first queries see no key when causal
    key_start = torch.tensor([0, 3 if padded else 0], dtype=torch.int32, device=DEVICE)
    key_end = torch.tensor([key_length, key_length - 4 if padded else key_length], dtype=torch.int32, device=DEVICE)
    return query, key, value, table, key_start, key_end


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_kernel_matches_float64_loop_oracle(name):
    """float64: o, M, lse and dq, dk, dv, dT at 1e-12 (with dropout: under the mask the kernel exposes)."""
    case = KERNEL_CASES[name]
    k, query_length, key_length, query_offset, causal, _, with_bias, with_masses, dropout = case
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float64)
    scaling = query.size(-1) ** -0.5
    seed = torch.tensor([2**40 + 7], device=DEVICE)
    output, masses, lse = relative_attention(query, key, value, table, key_start, key_end, seed, scaling, dropout,
                                             query_offset, k, causal, mass_columns(k, with_masses))
    keep = None
    if dropout > 0:
        keep = dropout_keep_mask(int(seed), dropout, *query.shape[:3], key_length, query.device)
        kept = keep.float().mean().item()
        assert abs(kept - (1 - dropout)) < 0.05 and not keep.all()
    expected_output, expected_masses, expected_lse = loop_oracle(query, key, value, table, key_start, key_end,
                                                                 scaling, query_offset, k, causal, keep, dropout)
    if not with_masses:
        assert masses.shape[-1] == 0
    assert_matches_oracle((output, masses, lse), (expected_output, expected_masses, expected_lse),
                          [query, key, value, table], with_masses, torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case_seed", range(24))
def test_kernel_matches_the_oracle_on_random_cases_with_unequal_blocks(case_seed, monkeypatch):
    """float64 at 1e-12, o, M, lse and every gradient, on cases drawn at random (k, lengths, query offset, causal,
    padding ranges, bias and a^V on or off, dropout) with blocks of unequal shapes under the interpreter, so that the
    edge and band tile ranges of the kernels' loops meet every alignment (on a GPU: the autotuned blocks)."""
    import random

    draw_case = random.Random(case_seed)
    monkeypatch.setattr(triton_relative, "INTERPRETER_BLOCKS", draw_case.choice([(16, 32), (32, 16), (32, 8),
                                                                                  (16, 16)]))
    k = draw_case.choice([0, 1, 2, 5, 9, 16])
    causal = draw_case.random() < 0.5
    query_length = draw_case.randint(1, 40)
    query_offset = draw_case.randint(0, 24) if causal and draw_case.random() < 0.5 else 0
    key_length = query_length + query_offset
    with_bias, with_masses = draw_case.random() < 0.8, draw_case.random() < 0.8
    dropout = draw_case.choice([0.0, 0.3])
    start = draw_case.randint(0, key_length)
    generator = torch.Generator().manual_seed(case_seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(DEVICE).requires_grad_()

    query, key, value = draw(2, 1, query_length, 8), draw(2, 1, key_length, 8), draw(2, 1, key_length, 8)
    table = draw(2, 1, query_length, 2 * k + 1) if with_bias else None
    key_start = torch.tensor([0, start], dtype=torch.int32, device=DEVICE)
    key_end = torch.tensor([key_length, draw_case.randint(start, key_length)], dtype=torch.int32, device=DEVICE)
    columns = mass_columns(k, with_masses) if draw_case.random() < 0.5 else (2 * k + 1) * with_masses  # any width
    seed = torch.tensor([2**40 + case_seed], device=DEVICE)
    output, masses, lse = relative_attention(query, key, value, table, key_start, key_end, seed, 8**-0.5, dropout,
                                             query_offset, k, causal, columns)
    keep = dropout_keep_mask(int(seed), dropout, 2, 1, query_length, key_length, DEVICE) if dropout else None
    expected_output, expected_masses, expected_lse = loop_oracle(query, key, value, table, key_start, key_end,
                                                                 8**-0.5, query_offset, k, causal, keep, dropout)
    assert_matches_oracle((output, masses, lse), (expected_output, expected_masses, expected_lse),
                          [query, key, value, table], with_masses, generator)


@pytest.mark.parametrize("name", ["encoder_k16_unpadded", "dropout_decoder_cached"])
def test_kernel_float32_matches_float64_oracle(name):
    """float32 inputs (float32 accumulation, IEEE matmuls) within float32 rounding of the float64 oracle."""
    case = KERNEL_CASES[name]
    k, _, key_length, query_offset, causal, _, _, with_masses, dropout = case
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float32)
    seed = torch.tensor([2**41 + 3], device=DEVICE)
    output, masses, lse = relative_attention(query, key, value, table, key_start, key_end, seed, 8**-0.5, dropout,
                                             query_offset, k, causal, mass_columns(k, with_masses))
    keep = dropout_keep_mask(int(seed), dropout, *query.shape[:3], key_length, query.device) if dropout else None
    expected = loop_oracle(query, key, value, table, key_start, key_end, 8**-0.5, query_offset, k, causal, keep,
                           dropout)
    for got, want in zip((output, masses[..., :2 * k + 1], natural(lse)), expected, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)
    grad_output = torch.randn(output.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    inputs = (query, key, value, table)
    grads = torch.autograd.grad((output * grad_output).sum() + masses.sum(), inputs)
    expected_grads = torch.autograd.grad((expected[0] * grad_output.double()).sum() + expected[1].sum(), inputs)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=5e-5)


def test_kernel_bfloat16_within_bfloat16_rounding_of_the_oracle():
    """bf16 inputs (float32 accumulation; under the interpreter the bf16 operands are multiplied as float32, as a
    GPU's tensor cores do): output, masses, lse and every gradient within bf16 rounding of the float64 oracle on the
    same bf16 inputs."""
    case = KERNEL_CASES["dropout_decoder_cached"]
    k, _, key_length, query_offset, causal, _, _, _, dropout = case
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.bfloat16)
    seed = torch.tensor([2**40 + 9])
    output, masses, lse = relative_attention(query, key, value, table, key_start, key_end, seed, 8**-0.5, dropout,
                                             query_offset, k, causal, mass_columns(k, True))
    assert output.dtype == torch.bfloat16 and masses.dtype == lse.dtype == torch.float32
    masses = masses[..., :2 * k + 1]
    keep = dropout_keep_mask(int(seed), dropout, *query.shape[:3], key_length, query.device)
    expected = loop_oracle(query, key, value, table, key_start, key_end, 8**-0.5, query_offset, k, causal, keep,
                           dropout)
    torch.testing.assert_close(output.double(), expected[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(masses.double(), expected[1], rtol=0, atol=1e-5)   # float32 sums of float32 P
    torch.testing.assert_close(natural(lse.double()), expected[2], rtol=0, atol=1e-5)
    inputs = (query, key, value, table)
    grads = torch.autograd.grad(output.float().square().sum() + masses.sum(), inputs)
    expected_grads = torch.autograd.grad(expected[0].square().sum() + expected[1].sum(), inputs)
    for got, want in zip(grads, expected_grads, strict=True):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.double(), want.double(), rtol=2e-2, atol=3e-2 * want.abs().max().item())


def test_the_bias_tables_gradient_comes_in_its_dtype_rounded_once():
    """dT comes back in the bias table's dtype (bf16, as under autocast), the kernel's float32 sums rounded once as
    it stores them: bit for bit the float32 table's dT rounded to bf16 (the same scores, bf16 being exact in
    float32), with no cast after the kernel. A GPU's conversion rounds to nearest even, as torch's does; Triton's
    interpreter truncates (its fp32 -> bf16 cast ignores the rounding mode), so there the float32 dT is truncated."""
    case = KERNEL_CASES["dropout_decoder_cached"]
    k, _, _, query_offset, causal, _, _, _, dropout = case
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.bfloat16)
    grad_output = torch.randn(query.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)

    def table_gradient(bias_table):
        output, masses, _ = relative_attention(query, key, value, bias_table, key_start, key_end,
                                               torch.tensor([2**40 + 9]), 8**-0.5, dropout, query_offset, k, causal,
                                               mass_columns(k, True))
        return torch.autograd.grad((output.float() * grad_output).sum() + masses.sum(), bias_table)[0]

    in_table_dtype = table_gradient(table)
    in_float32 = table_gradient(table.detach().float().requires_grad_())
    assert (in_table_dtype.dtype, in_float32.dtype) == (torch.bfloat16, torch.float32)
    if triton_relative.interpreting():   # drop the 16 low bits of each float32
        in_float32 = (in_float32.view(torch.int32) & -65536).view(torch.float32)
    assert in_float32.abs().max() > 0 and torch.equal(in_table_dtype, in_float32.to(torch.bfloat16))


@pytest.fixture
def nan_filled_outputs(monkeypatch):
    """The fused path's masses and table gradient allocated filled with NaN (`empty_in_order_of`), so that a column
    the kernels leave unwritten shows."""
    empty = triton_relative.empty_in_order_of
    monkeypatch.setattr(triton_relative, "empty_in_order_of", lambda *args: empty(*args).fill_(float("nan")))


class DispatchedOperators(TorchDispatchMode):
    """Counts the aten operators dispatched under it, by name (the eager path's own: a custom op hides its inner
    operators)."""

    def __init__(self):
        super().__init__()
        self.names = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_a_bias_table_wider_than_2k_plus_1_is_read_by_its_first_columns(nan_filled_outputs):
    """T [B, H, n, W > 2k+1] (Shaw's aligned product): the kernels read its first 2k+1 columns only, so o, M, lse and
    dq, dk, dv equal those of T's first 2k+1 columns at 1e-12 whatever the others hold, and dT is as wide as T, equal
    on those columns and zero beyond them (from NaN-filled memory: the dq/dT kernel writes them)."""
    case = KERNEL_CASES["encoder_k1_padded"]
    k, _, _, query_offset, causal, _, _, _, dropout = case
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float64)
    wide = torch.cat([table.detach(), torch.full_like(table.detach()[..., :1], 1e6).expand(-1, -1, -1, 5)], -1)
    wide.requires_grad_()
    grad_output = torch.randn(query.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    def run(bias_table):
        outputs = relative_attention(query, key, value, bias_table, key_start, key_end, torch.tensor([2**40]),
                                     8**-0.5, dropout, query_offset, k, causal, mass_columns(k, True))
        loss = (outputs[0] * grad_output.to(DEVICE)).sum() + outputs[1].sum()
        return outputs, torch.autograd.grad(loss, (query, key, value, bias_table))

    (narrow_outputs, narrow_grads), (wide_outputs, wide_grads) = run(table), run(wide)
    for got, expected in zip((*wide_outputs, *wide_grads[:3]), (*narrow_outputs, *narrow_grads[:3]), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert wide_grads[3].shape == wide.shape
    torch.testing.assert_close(wide_grads[3][..., :2 * k + 1], narrow_grads[3], rtol=0, atol=1e-12)
    assert not wide_grads[3][..., 2 * k + 1:].isnan().any() and not wide_grads[3][..., 2 * k + 1:].any()
    with pytest.raises(ValueError, match=r"the bias table has 2 columns, fewer than 2k \+ 1 = 3"):
        relative_attention(query, key, value, table[..., :2], key_start, key_end, torch.tensor([2**40]), 8**-0.5,
                           dropout, query_offset, k, causal, mass_columns(k, True))


def test_shaws_training_step_on_the_kernel_takes_its_table_unsliced(triton_calls):
    """The model hands the kernel Shaw's aligned product q a^K^T whole (its columns beyond 2k+1 zero): no slice, so
    no slice's backward (a fill and a copy per layer on a GPU) in the training step."""
    from hf_relpos.model.positions import aligned_width

    tables = []
    original = triton_relative.FusedAttention.apply
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw")).double().to(DEVICE)
    k = model.config.max_relative_position

    def recording(*inputs):
        tables.append(inputs[3])
        return original(*inputs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_relative.FusedAttention, "apply", recording)
        with DispatchedOperators() as dispatched:
            run_model(model, "relpos_triton", seq2seq_batch())
    assert len(triton_calls) == 4 and len(tables) == 4
    assert all(table.size(-1) == aligned_width(2 * k + 1) > 2 * k + 1 for table in tables)
    assert all(not table[..., 2 * k + 1:].any() for table in tables)
    assert dispatched.names["slice_backward"] == 0 and dispatched.names["mm"] > 0, dispatched.names


@pytest.mark.parametrize("width", [8, 24])
def test_the_forward_kernel_writes_the_masses_padding_columns(width, nan_filled_outputs):
    """M's columns beyond 2k+1 (up to its aligned width, or any wider one) come back zero from memory that held NaN:
    the forward kernel writes them, eight at a time (no fill runs before it)."""
    case = KERNEL_CASES["encoder_k1_padded"]
    k, _, _, query_offset, causal, _, _, _, dropout = case
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float64)

    with DispatchedOperators() as dispatched:   # the eager path's own operators (the custom op would hide them)
        _, masses, _ = triton_relative.FusedAttention.apply(query, key, value, table, key_start, key_end,
                                                            torch.tensor([2**40]), 8**-0.5, dropout, query_offset, k,
                                                            causal, width)
    assert "empty_like" in dispatched.names, dispatched.names
    # one fill, the NaN above; none of the op's own
    assert dispatched.names["fill_"] == 1 and not {"zero_", "zeros", "new_zeros"} & set(dispatched.names), dispatched
    assert masses.shape[-1] == width > 2 * k + 1 and masses.isfinite().all()
    assert masses[..., :2 * k + 1].sum(-1).max() > 0 and not masses[..., 2 * k + 1:].any()


def test_a_scale_that_is_not_positive_is_one_clear_error():
    """The kernels take the row max of q . k scaled by c on tiles beyond +-k before scaling: c must be positive (the
    model's is head_dim^-1/2)."""
    query, key, value, table, key_start, key_end = kernel_inputs(KERNEL_CASES["encoder_k1_padded"], torch.float64)
    for scaling in (0.0, -0.35):
        with pytest.raises(ValueError, match=f"the attention scale must be positive, got {scaling}"):
            relative_attention(query, key, value, table, key_start, key_end, torch.tensor([2**40]), scaling, 0.0, 0,
                               1, False, mass_columns(1, True))


def test_backward_is_deterministic():
    """Two backward passes of the same call give bitwise-equal gradients (no atomics: each program writes its rows)."""
    case = KERNEL_CASES["dropout_encoder"]
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float32)
    output, masses, _ = relative_attention(query, key, value, table, key_start, key_end, torch.tensor([2**40 + 5]),
                                           8**-0.5, 0.3, 0, 2, False, mass_columns(2, True))
    loss = output.square().sum() + masses.square().sum()
    first = torch.autograd.grad(loss, (query, key, value, table), retain_graph=True)
    second = torch.autograd.grad(loss, (query, key, value, table))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def layout(tensor, form, generator):
    """`tensor` [B, H, n, d] (float64, a leaf; d may be T's 2k+1) as the same values in another memory
    layout: "contiguous" (head-major),
    "token-major" ([B, n, H, d] memory, as the model's projections are split into heads) or "fused" (one of three
    slices of a [B, n, 3, H, d] buffer: no dense layout), a new leaf."""
    batch, heads, length, head_dim = tensor.shape
    if form == "contiguous":
        laid = tensor.detach().clone()
    elif form == "token-major":
        laid = tensor.detach().transpose(1, 2).contiguous().transpose(1, 2)
    else:
        buffer = torch.randn(batch, length, 3, heads, head_dim, generator=generator, dtype=tensor.dtype).to(DEVICE)
        buffer[:, :, 1] = tensor.detach().transpose(1, 2)
        laid = buffer[:, :, 1].transpose(1, 2)
    return laid.requires_grad_(tensor.requires_grad)


@pytest.mark.parametrize("form", ["token-major", "fused"])
def test_any_input_layout_gives_the_same_results_and_gradients_in_the_inputs_layout(form):
    """float64: q, k, v, the bias table T and dO laid out token-major or as slices of a fused buffer give bitwise the
    results and gradients of head-major inputs; o and dq, dk, dv come dense in their inputs' order of dimensions
    (token-major: merging the heads afterwards is a view, no copy)."""
    case = KERNEL_CASES["dropout_encoder"]
    k, _, _, query_offset, causal, _, _, _, dropout = case
    generator = torch.Generator().manual_seed(3)
    inputs = kernel_inputs(case, torch.float64)
    seed = torch.tensor([2**40 + 11], device=DEVICE)
    results = {}
    for name in ("contiguous", form):
        query, key, value, table = (layout(tensor, name, generator) for tensor in inputs[:4])
        output, masses, lse = relative_attention(query, key, value, table, *inputs[4:], seed, 8**-0.5, dropout,
                                                 query_offset, k, causal, mass_columns(k, True))
        grad_output = layout(torch.linspace(-1, 1, output.numel(), dtype=torch.float64).view(output.shape), name,
                             generator)
        loss = (output * grad_output).sum() + masses.square().sum()
        grads = torch.autograd.grad(loss, (query, key, value, table))
        results[name] = (output, masses, lse, *grads)
        for laid_out in (output, *grads[:3]):   # in the inputs' order of dimensions, dense
            assert (laid_out if name == "contiguous" else laid_out.transpose(1, 2)).is_contiguous()
    for got, expected in zip(results[form], results["contiguous"], strict=True):
        assert torch.equal(got, expected)


def test_a_head_beyond_32_bit_row_offsets_is_one_clear_error():
    """The kernels address rows with 32-bit offsets from a 64-bit head base: a head spanning more elements (a huge
    row stride) is refused with the field and the limit, not read out of bounds."""
    fits = torch.empty_strided((2, 2, 3, 8), (2**33, 2**32, 2**28, 1), device="meta")
    triton_relative.check_row_spans(query=fits)   # batch and head strides beyond 2^31 are fine: 64-bit bases
    too_far = torch.empty_strided((1, 1, 3, 8), (2**32, 2**31, 2**30, 1), device="meta")
    with pytest.raises(ValueError, match=r"one head of grad_output spans 2147483656 elements .* \(2147483647\)"):
        triton_relative.check_row_spans(grad_output=too_far)


def test_the_grid_keeps_batch_times_heads_within_cudas_limit_and_is_unchanged_below_it():
    """CUDA launches at most 65,535 programs along a grid's dimension 1 or 2: batch x heads beyond it is split over
    both, (min(B H, 65,535), ceil(B H / 65,535)), covering B H with less than one slice of dimension 1 to spare; up to
    it the grid is (tiles, B H, 1), the launch of (tiles, B H) (Triton pads a grid to three dimensions with 1s)."""
    limit = triton_relative.GRID_LIMIT
    assert limit == 65535
    for batch_heads, split in ((65535, (65535, 1)), (65536, (65535, 2)), (200_000, (65535, 4))):
        tiles, across, slices = triton_relative.program_grid(7, batch_heads)
        assert (tiles, across, slices) == (7, *split)
        assert across <= limit and slices <= limit and across * (slices - 1) < batch_heads <= across * slices
    for batch_heads in (1, 8, 4096 * 15):
        assert triton_relative.program_grid(5, batch_heads) == (5, batch_heads, 1)


def test_batch_times_heads_beyond_the_grid_limit_matches_the_oracle(monkeypatch):
    """float64 at 1e-12, with the grid's limit lowered to 3 so that B H = 4 x 2 = 8 is split as (tiles, 3, 3), its
    last program past B H returning: o, M, lse, the dropout mask and every gradient (the forward and both backward
    kernels, the dq/dT one storing Delta, each recover b H + h from the two dimensions), sequences with unlike key
    ranges."""
    monkeypatch.setattr(triton_relative, "GRID_LIMIT", 3)
    k, length, dropout = 2, 21, 0.3
    generator = torch.Generator().manual_seed(5)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(DEVICE).requires_grad_()

    query, key, value = (draw(4, 2, length, 8) for _ in range(3))
    table = draw(4, 2, length, 2 * k + 1)
    key_start = torch.tensor([0, 3, 1, 6], dtype=torch.int32, device=DEVICE)
    key_end = torch.tensor([length, 17, 20, 12], dtype=torch.int32, device=DEVICE)
    seed = torch.tensor([2**40 + 13], device=DEVICE)
    output, masses, lse = relative_attention(query, key, value, table, key_start, key_end, seed, 8**-0.5, dropout, 0,
                                             k, False, mass_columns(k, True))
    keep = dropout_keep_mask(int(seed), dropout, 4, 2, length, length, DEVICE)
    expected = loop_oracle(query, key, value, table, key_start, key_end, 8**-0.5, 0, k, False, keep, dropout)
    assert_matches_oracle((output, masses, lse), expected, [query, key, value, table], True, generator)


def test_a_shaw_layers_training_step_copies_no_head_sized_tensor():
    """The fused path in the model: one self-attention layer's forward and backward under bf16 autocast with attention
    dropout, counting every copy (clone, copy_, dtype casts) of a tensor of q's size split into heads (4-D): none (the
    kernels read and write the token-major heads as they are, and T = c q a^K^T is multiplied in that order); sdpa's
    path, which hands the probabilities to eager for a^V, copies."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from benchmarks.bench_training import attention_case
    from benchmarks.common import SHAPES

    copies = {torch.ops.aten.clone.default, torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}

    class CountCopies(TorchDispatchMode):
        def __init__(self, size):
            super().__init__()
            self.size, self.count = size, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            self.count += func in copies and result.dim() == 4 and result.numel() == self.size
            return result

    counts = {}
    for kernel in ("relpos_triton", "sdpa"):
        case = attention_case("shaw", SHAPES["tiny"], 16, 2, "cpu", "bfloat16", kernel, 0.1)
        case.step()
        with CountCopies(2 * 16 * SHAPES["tiny"].d_model) as counter:
            case.step()
        counts[kernel] = counter.count
    assert counts["relpos_triton"] == 0 and counts["sdpa"] > 0, counts


@pytest.mark.parametrize("kernel, dropout", [("relpos_triton", 0.1), ("sdpa", 0.1), ("flex_attention", 0.0)])
def test_a_shaw_layers_products_with_the_distance_tables_are_aligned(kernel, dropout):
    """Every matmul of a shaw layer's training step (a^K's T = c q a^K^T, a^V's M a^V, their gradients; bf16 autocast,
    attention dropout where the kernel takes it) has the distance dimension 2k + 1 padded to a multiple of 8: none has
    a dimension 2k + 1, which cuBLAS runs on unaligned kernels (sm75 CUTLASS, align1, on the H200 of
    docs/results/gpu_check/2026-11-28_h200_1f3e7bf)."""
    from benchmarks.bench_training import attention_case
    from benchmarks.common import SHAPES

    case = attention_case("shaw", SHAPES["tiny"], 16, 2, "cpu", "bfloat16", kernel, dropout)
    distances = 2 * case.module["scheme"].max_relative_position + 1
    with RecordMatmuls() as recorded:
        case.step()
    shapes = recorded.shapes
    with_tables = [operands for operands in shapes if any(aligned_width(distances) in shape for shape in operands)]
    assert len(with_tables) >= 6, shapes   # T, M a^V, and two gradients of each
    assert not [operands for operands in shapes if any(distances in shape for shape in operands)], shapes


def test_the_autotuner_keys_on_the_flags_and_the_length_bucket(monkeypatch):
    """The three kernels are tuned per flag set and power-of-two bucket of the longer side (64 to 8192), not per
    shape; forward and backward of one call pass the same bucket."""
    from hf_relpos.model import triton_relative_kernels as kernels

    assert [triton_relative.length_bucket(n, m) for n, m in ((1, 1), (64, 10), (3, 65), (300, 100), (9000, 1))] == [
        64, 64, 128, 512, 8192]
    for tuned in (kernels.tuned_forward, kernels.tuned_backward_keys, kernels.tuned_backward_queries):
        assert tuned.keys == [*kernels.TUNING_KEY, *(["BLOCK_I"] if tuned is not kernels.tuned_backward_keys else [])]
        assert "length_bucket" in tuned.keys and "length_bucket" in kernels.RUNTIME_INTS   # no compile per bucket
    buckets, launch = [], triton_relative.launch

    def recording_launch(kernel, tuned, blocks, rows, batch_heads, *args, **settings):
        buckets.append(args[kernel.arg_names.index("length_bucket")])
        return launch(kernel, tuned, blocks, rows, batch_heads, *args, **settings)

    monkeypatch.setattr(triton_relative, "launch", recording_launch)
    cached_chunk = (16, 3, 70, 67, True, False, True, True, 0.0)   # 3 queries after 67 cached keys
    query, key, value, table, key_start, key_end = kernel_inputs(cached_chunk, torch.float32)
    output, masses, _ = relative_attention(query, key, value, table, key_start, key_end, torch.tensor([2**40]),
                                           8**-0.5, 0.0, 67, 16, True, mass_columns(16, True))
    (output.sum() + masses.sum()).backward()
    assert buckets == [128, 128, 128]


def forward_launches_recorded(monkeypatch):
    """The GPU path of `fused_forward` with the forward kernel's launches recorded, not run: (the autotuner, the
    launches as (args, grid, kwargs), forward(length), which runs one call of that length). The autotuner's
    benchmark is stubbed to time a config at BLOCK_M + num_warps, so it chooses (32, 64, 4, 2)."""
    from hf_relpos.model import triton_relative_kernels as kernels

    tuned = kernels.tuned_forward
    launched = []
    monkeypatch.setenv("TRITON_INTERPRET", "0")   # the GPU path (the kernels' module is imported already)
    monkeypatch.setattr(tuned, "cache", {})
    monkeypatch.setattr(tuned, "_bench", lambda *args, config, **meta: [float(config.kwargs["BLOCK_M"] + config.num_warps)])
    monkeypatch.setattr(tuned.fn, "run", lambda *args, grid, warmup, **kwargs: launched.append(
        (args, grid(kwargs) if callable(grid) else grid, kwargs)))

    def forward(length):
        query, key, value, table, key_start, key_end = kernel_inputs((4, length, length, 0, False, False, True, True,
                                                                      0.0), torch.float32)
        triton_relative.fused_forward(query, key, value, table, key_start, key_end, torch.tensor([2**40]), 0.5, 0.0,
                                      0, 4, False, mass_columns(4, True))

    return tuned, launched, forward


def test_a_tuned_key_launches_with_the_autotuners_choice_without_its_launch_path(monkeypatch):
    """On a GPU, the first call of a key goes through triton's autotuner (which benchmarks the configs and caches
    its choice under its key); later calls of that key launch the kernel with the cached choice directly, with the
    arguments and grid the autotuner would pass; a new length bucket is tuned again. The kernels' launches are
    recorded, not run; `autotuner_key` is the key triton's Autotuner.run forms."""
    tuned, launched, forward = forward_launches_recorded(monkeypatch)
    tuned_runs = []
    autotuner_run = type(tuned).run
    monkeypatch.setattr(tuned, "run", lambda *args, **kwargs: tuned_runs.append(1) or autotuner_run(tuned, *args, **kwargs))

    forward(70)
    assert len(tuned_runs) == 1 and len(launched) == 1
    (key, choice), = tuned.cache.items()
    assert (choice.kwargs["BLOCK_M"], choice.num_warps) == (32, 4)   # the smallest of the stubbed timings
    args, grid, settings = launched[0]
    assert triton_relative.autotuner_key(tuned, args, {name: value for name, value in settings.items()
                                                       if name not in choice.all_kwargs()}) == key
    forward(90)   # the same bucket (128): the cached choice, launched directly with what the autotuner passed
    assert len(tuned_runs) == 1 and len(launched) == 2
    assert launched[1][1] == (3, 4, 1) and launched[1][2] == launched[0][2]   # ceil(90 / 32) blocks, B H = 4
    forward(130)   # bucket 256: tuned again
    assert len(tuned_runs) == 2 and len(tuned.cache) == 2 and len(launched) == 3


def test_pinned_blocks_launch_though_the_autotuner_has_a_choice_cached_for_the_key(monkeypatch):
    """With one config (ablate_relpos_triton pins the blocks so), triton's autotuner launches that config whatever
    its cache holds for the key: so does the direct launch of a tuned key. The kernels' launches are recorded, not
    run."""
    from hf_relpos.model import triton_relative_kernels as kernels

    tuned, launched, forward = forward_launches_recorded(monkeypatch)
    forward(70)   # tuned: (32, 64, 4, 2) cached for the key
    assert launched[-1][2]["BLOCK_M"] == 32 and len(tuned.cache) == 1
    monkeypatch.setattr(tuned, "configs", kernels.block_configs(((128, 64, 8, 2),)))   # pinned, as the ablation
    forward(70)
    assert (launched[-1][2]["BLOCK_M"], launched[-1][2]["num_warps"]) == (128, 8)


def test_dropout_mask_depends_on_seed_and_position():
    """Different seeds draw different masks; the mask is not the same for every row or head."""
    first = dropout_keep_mask(2**40 + 1, 0.5, 2, 2, 17, 17, DEVICE)
    second = dropout_keep_mask(2**40 + 2, 0.5, 2, 2, 17, 17, DEVICE)
    assert not torch.equal(first, second)
    assert not torch.equal(first[0, 0], first[0, 1]) and not torch.equal(first[0, 0, 0], first[0, 0, 1])


def test_dropout_mask_follows_the_documented_philox_counter():
    """kappa_ij = (draw >= round(2^16 p)), the draw bits [16 c, 16 c + 16) of the t-th word of triton's Philox-4x32-7
    (`tl.randint4x`, 7 rounds) at the counter ((b H + h) n + i) ceil(m / 8) + j // 8, with j % 8 = 2 t + c: the
    kernels' mask against that formula computed apart."""
    import triton
    import triton.language as tl

    @triton.jit
    def four_words(OUT, seed, count, BLOCK: tl.constexpr):
        counters = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        words = tl.randint4x(seed, counters.to(tl.int64), 7)
        for t in tl.static_range(4):
            tl.store(OUT + 4 * counters + t, words[t].to(tl.int64), mask=counters < count)

    seed, dropout, batch, heads, query_length, key_length = 2**40 + 5, 0.4, 2, 3, 7, 23
    groups = -(-key_length // 8)
    count = batch * heads * query_length * groups
    words = torch.empty(4 * count, dtype=torch.int64, device=DEVICE)
    four_words[(-(-count // 64),)](words, seed, count, BLOCK=64)
    bh = torch.arange(batch * heads, device=DEVICE)[:, None, None]
    i = torch.arange(query_length, device=DEVICE)[None, :, None]
    j = torch.arange(key_length, device=DEVICE)[None, None, :]
    word = words[((bh * query_length + i) * groups + j // 8) * 4 + (j % 8) // 2]
    draw = (word >> (16 * (j % 2))) & 0xFFFF
    expected = draw >= round(dropout * 2**16)
    mask = dropout_keep_mask(seed, dropout, batch, heads, query_length, key_length, DEVICE)
    assert torch.equal(mask, expected.view(batch, heads, query_length, key_length))


def test_no_kernel_specialises_on_the_seed_or_the_dropout_threshold():
    """Triton makes an int argument equal to 1 a constant: a threshold of 1 (p near 2^-16) would then not compile on a
    GPU (no .to on a constant), and a new value would compile again; every kernel that draws the mask takes both as
    runtime ints."""
    from hf_relpos.model import triton_relative_kernels as kernels

    for kernel in (kernels.relative_forward_kernel, kernels.relative_backward_keys_kernel,
                   kernels.relative_backward_queries_kernel, kernels.dropout_keep_kernel):
        if triton_relative.interpreting():   # the interpreter's function keeps the decorator's arguments
            runtime = set(kernel.kwargs["do_not_specialize"])
        else:
            runtime = {parameter.name for parameter in kernel.params if parameter.do_not_specialize}
        assert {"seed", "dropout_threshold"} <= runtime, kernel.fn.__name__


@pytest.mark.parametrize("dropout", [0.1, 0.3])
def test_dropout_keeps_each_key_at_the_stated_rate_and_is_unbiased(dropout):
    """The kernels drop at p = round(2^16 p_asked) / 2^16 (within 2^-17 of the asked rate) and scale kept
    probabilities by 1 / (1 - p): over 2 x 2 x 64 x 512 draws the kept share is 1 - p within four standard errors,
    every column parity and row keeps alike (no pattern from the 16-bit halves), and rates that round to 1 are one
    clear error."""
    rate = dropout_rate(dropout)
    assert abs(rate - dropout) <= 2**-17 and rate * 2**16 == round(rate * 2**16)
    keep = dropout_keep_mask(2**40 + 21, dropout, 2, 2, 64, 512, DEVICE).double()
    error = 4 * (rate * (1 - rate) / keep.numel()) ** 0.5
    assert abs(keep.mean().item() - (1 - rate)) < error
    for parity in range(8):   # the key's place among the eight draws of one Philox call
        column_keep = keep[..., parity::8]
        assert abs(column_keep.mean().item() - (1 - rate)) < 4 * (rate * (1 - rate) / column_keep.numel()) ** 0.5
    scaled = triton_relative.scales(torch.empty(1, dtype=torch.float64), 1.0, dropout)[1].item()
    assert scaled == 1 / (1 - rate)
    with pytest.raises(ValueError, match=r"attention dropout 0.999999 must be in \[0, 1 - 2\^-17\)"):
        triton_relative.dropout_threshold(0.999999)


def run_model(model, kernel, batch, backward=True):
    model.set_attn_implementation(kernel)
    model.zero_grad()
    output = model(**batch)
    if backward:
        output.loss.backward()
    grads = {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.grad is not None}
    return output.logits.detach(), grads


def seq2seq_batch():
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(3, 40, (2, 13), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    labels = torch.randint(3, 40, (2, 11), generator=generator)
    return {name: tensor.to(DEVICE) for name, tensor in
            dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels).items()}


@pytest.fixture
def triton_calls(monkeypatch):
    """How many attention calls ran the Triton kernel."""
    calls = []
    original = attention_functions.clipped_relative_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(attention_functions, "clipped_relative_attention", counted)
    return calls


@pytest.mark.numerics
@pytest.mark.parametrize("overrides", [
    dict(max_relative_position=16),
    {},
    dict(use_relative_values=False),   # shaw-k
    dict(use_relative_keys=False, max_relative_position=1),
    dict(relative_embeddings_shared_across_heads=False),
], ids=["shaw_k16", "shaw_k3", "shaw_k", "values_only_k1", "per_head_tables"])
def test_model_matches_eager_with_gradients(overrides, triton_calls):
    """float64 WMT-shaped tiny model: logits and every parameter's gradient (a^K, a^V tables included) equal eager's
    at 1e-12, padded encoder and causal decoder, and Shaw's self-attention runs on the kernel (cross-attention on
    sdpa)."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw", **overrides)).double().to(DEVICE)
    logits, grads = run_model(model, "eager", seq2seq_batch())
    triton_logits, triton_grads = run_model(model, "relpos_triton", seq2seq_batch())
    assert len(triton_calls) == 4   # 2 encoder + 2 decoder self-attention layers
    torch.testing.assert_close(triton_logits, logits, rtol=0, atol=1e-12)
    assert triton_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(triton_grads[name], grad, rtol=0, atol=1e-12, msg=name)


@pytest.mark.numerics
def test_model_attention_dropout_matches_eager_under_the_kernels_mask(monkeypatch, triton_calls):
    """Training a decoder-only LM (self-attention only, left-padded) with attention_dropout 0.3: the kernel's seeds
    recorded, eager's dropout replaced by the kernel's mask for the same seeds in the same layer order: logits and
    gradients equal at 1e-12 (the a^V term sees the dropped probabilities in both)."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForCausalLM(tiny_config("shaw", attention_dropout=0.3)).double().to(DEVICE)
    model.train()
    generator = torch.Generator().manual_seed(4)
    input_ids = torch.randint(3, 40, (2, 15), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :4] = 0
    batch = {name: tensor.to(DEVICE) for name, tensor in
             dict(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).items()}
    seeds = iter(range(2**40, 2**40 + 100))
    used = []

    def recorded_seed():
        used.append(next(seeds))
        return torch.tensor([used[-1]])

    monkeypatch.setattr(triton_relative, "dropout_seed", recorded_seed)
    triton_logits, triton_grads = run_model(model, "relpos_triton", batch)
    assert len(used) == len(triton_calls) == 2
    replay = iter(used)
    dropout = torch.nn.functional.dropout

    def kernel_mask_dropout(probabilities, p=0.5, training=True, inplace=False):
        if probabilities.dim() != 4 or p == 0:
            return dropout(probabilities, p, training, inplace)
        keep = dropout_keep_mask(next(replay), p, *probabilities.shape, probabilities.device)
        return probabilities * keep / (1 - dropout_rate(p))

    monkeypatch.setattr(torch.nn.functional, "dropout", kernel_mask_dropout)
    logits, grads = run_model(model, "eager", batch)
    assert next(replay, None) is None
    torch.testing.assert_close(triton_logits, logits, rtol=0, atol=1e-12)
    for name, grad in grads.items():
        torch.testing.assert_close(triton_grads[name], grad, rtol=0, atol=1e-12, msg=name)


def test_without_dropout_the_kernel_leaves_torchs_random_stream_as_sdpa_does(triton_calls):
    """Training at attention_dropout 0: no dropout seed is drawn, so the random numbers after a step are sdpa's."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw")).double().to(DEVICE).train()
    states = {}
    for kernel in ("sdpa", "relpos_triton"):
        torch.manual_seed(5)
        run_model(model, kernel, seq2seq_batch())
        states[kernel] = torch.get_rng_state()
    assert len(triton_calls) == 4
    assert torch.equal(states["relpos_triton"], states["sdpa"])


@pytest.mark.numerics
def test_bfloat16_autocast_as_close_to_float32_eager_as_eager_is(triton_calls):
    """Under bf16 autocast, the kernel's logits and every gradient are as close to float32 eager as bf16 eager's
    (at most twice its error, plus 1e-3 of the gradient's scale): the kernel's bf16 goal, on the CPU."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw")).to(DEVICE)
    logits, grads = run_model(model, "eager", seq2seq_batch())
    results = {}
    for kernel in ("eager", "relpos_triton"):
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            results[kernel] = run_model(model, kernel, seq2seq_batch())
    assert len(triton_calls) == 4
    errors = {kernel: (got.float() - logits).abs().max().item() for kernel, (got, _) in results.items()}
    assert errors["relpos_triton"] <= 2 * errors["eager"] + 1e-3 * logits.abs().max().item(), errors
    for name, grad in grads.items():
        error, eager_error = ((results[kernel][1][name] - grad).abs().max().item() for kernel in ("relpos_triton", "eager"))
        # + 1e-6: gradients that are zero in exact arithmetic (the keys' bias) are rounding noise in both
        assert error <= 2 * eager_error + 1e-3 * grad.abs().max().item() + 1e-6, (name, error, eager_error)


@pytest.mark.numerics
def test_cached_generation_matches_eager(triton_calls):
    """Greedy decoding with the KV cache (one query at an offset per step) gives eager's tokens and scores."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw")).double().to(DEVICE).eval()
    batch = seq2seq_batch()
    outputs = {}
    for kernel in ("eager", "relpos_triton"):
        model.set_attn_implementation(kernel)
        outputs[kernel] = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                         max_new_tokens=6, do_sample=False, num_beams=1, output_scores=True,
                                         return_dict_in_generate=True)
    assert torch.equal(outputs["relpos_triton"].sequences, outputs["eager"].sequences)
    for got, expected in zip(outputs["relpos_triton"].scores, outputs["eager"].scores, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    # the encoder ran on the kernel; a decoding step's one query, plain attention over k_j + a^K_ij and
    # v_j + a^V_ij, on sdpa
    assert triton_calls and all(shape[2] > 1 for shape in triton_calls)


@pytest.mark.parametrize("padded", [False, True], ids=["no_decoder_mask", "left_padded_decoder"])
def test_a_cached_step_reads_no_mask_on_the_host(triton_calls, padded):
    """A cached decoding step's one query runs as plain attention over the keys k_j + a^K_ij and the values
    v_j + a^V_ij (on sdpa), so it never reads a mask on the host: neither without a decoder mask (one query after all
    its keys) nor with a left-padded one, where the kernel's padding check compared the mask with the key ranges
    (torch.equal, a device sync in every step)."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw")).to(DEVICE).eval()
    model.set_attn_implementation("relpos_triton")
    batch = seq2seq_batch()
    decoder_mask = torch.ones(batch["labels"].size(0), 4, dtype=torch.long, device=DEVICE)
    decoder_mask[1, 0] = 0
    with torch.no_grad():
        prefix = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=batch["labels"][:, :3], use_cache=True,
                       decoder_attention_mask=decoder_mask[:, :3] if padded else None)
        triton_calls.clear()
        with CountEqual() as counted:
            model(encoder_outputs=(prefix.encoder_last_hidden_state,), attention_mask=batch["attention_mask"],
                  decoder_input_ids=batch["labels"][:, 3:4], cache=prefix.cache,
                  decoder_attention_mask=decoder_mask if padded else None)
    assert counted.count == 0 and not triton_calls


@pytest.mark.numerics
def test_generation_on_a_static_cache_matches_eager_on_the_dynamic_one(triton_calls):
    """cache_implementation "static": the kernel reads the cache's fill level (a tensor) as its query offset and
    the unused slots as keys past the causal limit (the decoder's first call: the start token and a forced prefix of
    3 tokens; each later step's one query is plain attention on sdpa); greedy decoding gives eager's tokens and scores on the
    dynamic cache."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw")).double().to(DEVICE).eval()
    batch = seq2seq_batch()
    prefix = batch["labels"][:, :3]
    outputs = {}
    for kernel, cache_implementation in (("eager", None), ("relpos_triton", "static")):
        model.set_attn_implementation(kernel)
        outputs[kernel] = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                         decoder_input_ids=prefix, max_new_tokens=6, do_sample=False, num_beams=1,
                                         output_scores=True, return_dict_in_generate=True,
                                         cache_implementation=cache_implementation)
    assert torch.equal(outputs["relpos_triton"].sequences, outputs["eager"].sequences)
    for got, expected in zip(outputs["relpos_triton"].scores, outputs["eager"].scores, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    # the decoder's first call (the start token and the prefix) on the kernel
    assert any(shape[2] == 1 + prefix.size(1) for shape in triton_calls)


def test_generate_does_not_compile_a_static_cache_step_on_the_kernel(caplog):
    """The kernel reads a static cache's fill level on the host, so a compiled step would recompile at every fill
    level: generate, which compiles a static-cache step on CUDA (here on every device, as CompileConfig allows),
    decodes uncompiled on it with one warning naming sdpa, and compiles on sdpa as transformers decides."""
    from transformers import CompileConfig, EncoderDecoderCache, StaticCache

    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw")).double().to(DEVICE).eval()
    cache = EncoderDecoderCache(StaticCache(config=model.config, max_cache_len=8),
                                StaticCache(config=model.config, max_cache_len=8))
    config = copy.deepcopy(model.generation_config)
    config.compile_config = CompileConfig()
    config.compile_config._compile_all_devices = True
    decisions = {}
    for kernel in ("sdpa", "relpos_triton"):
        model.set_attn_implementation(kernel)
        with caplog.at_level(logging.WARNING):
            decisions[kernel] = model._valid_auto_compile_criteria({"cache": cache}, config)
    assert decisions == {"sdpa": True, "relpos_triton": False}
    assert "does not compile the decoding step on attn_implementation 'relpos_triton'" in caplog.text


@pytest.mark.numerics
def test_other_schemes_and_cross_attention_run_on_sdpa(triton_calls):
    """What the kernel does not cover (T5's buckets, plain attention) runs on sdpa: the same logits, no kernel call."""
    torch.manual_seed(0)
    for scheme in ("t5", "absolute"):
        model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(scheme)).double().to(DEVICE).eval()
        sdpa_logits, _ = run_model(model, "sdpa", seq2seq_batch(), backward=False)
        triton_logits, _ = run_model(model, "relpos_triton", seq2seq_batch(), backward=False)
        torch.testing.assert_close(triton_logits, sdpa_logits, rtol=0, atol=1e-12)
    assert triton_calls == []


def test_the_kernel_takes_only_one_clip_and_offset_and_masks_of_padding_ranges():
    """What the kernel reads is one k and one query offset for a^K and a^V, and one key range per sequence:
    terms clipped at different k or offsets (a user scheme's) and a mask per head are not its calls (None: they run on
    sdpa), while a^K and a^V of one clip, and a padding mask shared by the heads, are."""
    def bias(k, offset):
        return RelativeBias(table=torch.zeros(1, 1, 3, 2 * k + 1), bucket=None, key_length=3, clip_distance=k,
                            query_offset=offset)

    def values(k, offset):
        return RelativeValues(torch.zeros(2 * k + 1, 4), k, offset, torch.zeros(3, 3, dtype=torch.long), True)

    assert attention_functions.triton_clipped_terms(bias(2, 1), values(2, 1)) == (2, 1)
    assert attention_functions.triton_clipped_terms(bias(2, 1), values(3, 1)) is None
    assert attention_functions.triton_clipped_terms(bias(2, 0), values(2, 1)) is None
    padding = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    padding[1, ..., 2] = False
    ranges = triton_relative.key_ranges(padding, 2, 3, 3, 0, False, torch.device("cpu"))
    assert [bound.tolist() for bound in ranges] == [[0, 0], [3, 2]]
    per_head = padding.expand(2, 2, 3, 3).clone()
    per_head[0, 1, :, 0] = False
    assert triton_relative.key_ranges(per_head, 2, 3, 3, 0, False, torch.device("cpu")) is None


@pytest.mark.numerics
@pytest.mark.parametrize(("overrides", "call", "cause"), [
    (dict(self_attention_window=2), {}, "a mask other than padding ranges and causality (self_attention_window, "
                                        "padding with holes)"),
    ({}, dict(output_attentions=True), "output_attentions"),
    (dict(position_randomization_max=40, position_randomization_at_inference=True), {}, "randomized positions"),
    (dict(position_randomization_max=40, position_randomization_at_inference=True, use_relative_values=False), {},
     "randomized positions"),
], ids=["window", "output_attentions", "randomized_positions", "randomized_positions_shaw_k"])
def test_shaw_off_the_kernel_runs_on_sdpa_with_a_warning(overrides, call, cause, triton_calls, caplog):
    """Shaw's terms that the kernel does not cover run on sdpa/eager (the same logits), said once with the cause;
    a scheme the kernel never covers (T5) says nothing. Under randomized positions nothing reads the mask for the
    kernel (`PositionContext.clip_distance` is None)."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw", **overrides)).double().to(DEVICE)
    model.eval()
    batch = seq2seq_batch()
    model.set_attn_implementation("sdpa")
    torch.manual_seed(1)
    expected = model(**batch, **call).logits
    logging.Logger.warning_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        model.set_attn_implementation("relpos_triton")
        torch.manual_seed(1)
        with CountEqual() as counted:
            logits = model(**batch, **call).logits
        model(**batch, **call)
    assert triton_calls == []
    if cause == "randomized positions":
        assert counted.count == 0
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)
    assert [record.getMessage() for record in caplog.records if "relpos_triton" in record.getMessage()] == [
        f"relpos_triton: Shaw's relative attention with {cause} runs on sdpa and eager, not on the fused kernel "
        "(slower, forming every score)"]
    caplog.clear()
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("t5")).double().to(DEVICE).eval()
    with caplog.at_level(logging.WARNING):
        model.set_attn_implementation("relpos_triton")
        model(**batch)
    assert not [record for record in caplog.records if "relpos_triton" in record.getMessage()]


def test_selected_by_name_in_from_config_and_from_pretrained(tmp_path):
    """transformers accepts the name: from_config, from_pretrained and set_attn_implementation."""
    config = tiny_config("shaw")
    model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="relpos_triton")
    assert model.config._attn_implementation == "relpos_triton"
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="relpos_triton")
    assert loaded.config._attn_implementation == "relpos_triton"


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the CPU's refusal")
def test_refused_on_cpu_without_the_interpreter(monkeypatch):
    """On the CPU outside Triton's interpreter: one clear error naming the kernel and what to use instead."""
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw"))
    model.set_attn_implementation("relpos_triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"'relpos_triton' runs on CUDA GPUs .*TRITON_INTERPRET=1.*'sdpa' or 'eager'"):
        model(**seq2seq_batch())


def test_the_device_check_a_run_makes_first_finds_a_missing_triton(monkeypatch):
    """`check_kernel_device`, which train_translation.py and hf-relpos-translate run before anything else: triton's
    absence is the kernels' own ImportError there, not at the first forward; kernels without a device rule pass."""
    monkeypatch.delitem(sys.modules, "hf_relpos.model.triton_relative_kernels", raising=False)
    monkeypatch.delattr(hf_relpos.model, "triton_relative_kernels", raising=False)
    monkeypatch.setattr("transformers.utils.import_utils.is_triton_available", lambda: False)
    for name in ("relpos_triton", "paged|relpos_triton"):   # transformers runs relpos_triton for both names
        with pytest.raises(ImportError, match=r"^attn_implementation 'relpos_triton' needs triton: pip install "
                                              "triton"):
            attention_functions.check_kernel_device(name, DEVICE)
    for kernel in (None, "eager", "sdpa", "flex_attention", "paged|sdpa", "paged|eager"):
        attention_functions.check_kernel_device(kernel, torch.device("cpu"))


def test_custom_op_registrations():
    """torch.library's checks of the op: schema, fake (meta) kernel and the registered autograd."""
    case = KERNEL_CASES["decoder_k3_padded"]
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float64)
    arguments = (query, key, value, table, key_start, key_end, torch.tensor([2**40], device=DEVICE), 8**-0.5, 0.0, 0, 3, True,
                 mass_columns(3, True))
    torch.library.opcheck(relative_attention, arguments,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.numerics
def test_custom_op_under_torch_compile():
    """torch.compile (fullgraph, AOT autograd) traces the op and its backward as opaque ops: the same values and
    gradients as the uncompiled call."""
    case = KERNEL_CASES["dropout_encoder"]
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float64)

    def attend(query, key, value, table):
        output, masses, _ = relative_attention(query, key, value, table, key_start, key_end,
                                               torch.tensor([2**40 + 11]), 8**-0.5, 0.3, 0, 2, False,
                                               mass_columns(2, True))
        return (output.sum(-1) + masses.sum(-1)).square().sum()

    inputs = (query, key, value, table)
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    expected, got = attend(*inputs), compiled(*inputs)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    for got_grad, expected_grad in zip(torch.autograd.grad(got, inputs), torch.autograd.grad(expected, inputs),
                                       strict=True):
        torch.testing.assert_close(got_grad, expected_grad, rtol=0, atol=1e-12)


def test_a_second_copy_of_the_module_registers_its_own_ops(tmp_path):
    """A Hub folder's remote-code copy of triton_relative.py loads beside hf_relpos' own (no op registered twice)."""
    spec = importlib.util.spec_from_file_location("transformers_modules.me.model.triton_relative",
                                                  triton_relative.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert copy.OP_NAMESPACE == "transformers_modules_me_model" != triton_relative.OP_NAMESPACE == "hf_relpos_model"
    assert copy.relative_attention._qualname != triton_relative.relative_attention._qualname


@pytest.mark.slow
def test_kernels_compile_for_an_h100_without_a_gpu():
    """Triton's compiler and bundled ptxas build the forward and both backward kernels (first autotuning
    configuration) for sm_90 in bf16, within its shared memory: no GPU needed, so CI catches what the interpreter
    cannot."""
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "benchmarks.compile_triton_kernels", "--arch", "90", "--quick",
                             "--sass"],
                            cwd=Path(__file__).resolve().parents[1], env=environment, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert [line.split()[1] for line in lines] == ["forward", "backward_keys", "backward_queries"], result.stdout
    assert all("(fits)" in line for line in lines), result.stdout
    counts = [re.search(r"SASS (\d+) instructions, STL (\d+), LDL (\d+)", line) for line in lines]
    assert all(count and int(count[1]) > 1000 for count in counts), result.stdout   # whole kernels were disassembled


def test_float64_inputs_on_a_triton_without_float64_dot_are_one_error(monkeypatch):
    """Before triton 3.5 tl.dot has no float64 operands: a float64 call is one error naming the version needed,
    while float32 runs as before."""
    from hf_relpos.model import triton_relative_kernels

    monkeypatch.setattr(triton_relative_kernels, "FLOAT64_DOT", False)
    case = KERNEL_CASES["encoder_k1_padded"]
    k, _, _, query_offset, causal, _, _, with_masses, dropout = case

    def arguments(dtype):
        return (*kernel_inputs(case, dtype), torch.tensor([0]), 8**-0.5, dropout, query_offset, k, causal,
                mass_columns(k, with_masses))

    with pytest.raises(RuntimeError, match=r"float64 inputs with triton 3\.5 or newer.*float32 or bfloat16"):
        relative_attention(*arguments(torch.float64))
    assert relative_attention(*arguments(torch.float32))[0].dtype == torch.float32


@pytest.mark.parametrize("name", ["dropout_decoder_cached", "shaw_k_without_values", "values_without_bias"])
def test_the_eager_function_is_the_custom_op(name):
    """`FusedAttention` (eager mode: no custom-op dispatch per call) returns what the custom op returns, and the
    same gradients of every input, bit for bit (float64, dropout where the case has it)."""
    case = KERNEL_CASES[name]
    k, _, _, query_offset, causal, _, _, with_masses, dropout = case
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float64)
    inputs = [tensor for tensor in (query, key, value, table) if tensor is not None]
    arguments = (query, key, value, table, key_start, key_end, torch.tensor([2**40 + 3]), 8**-0.5, dropout,
                 query_offset, k, causal, mass_columns(k, with_masses))
    results = {}
    for label, fused in (("op", relative_attention), ("eager", triton_relative.FusedAttention.apply)):
        output, masses, lse = fused(*arguments)
        loss = (output.sum(-1) + masses.sum(-1)).square().sum()
        results[label] = (output, masses, lse, *torch.autograd.grad(loss, inputs))
    for got, expected in zip(results["eager"], results["op"], strict=True):
        assert torch.equal(got, expected)


def test_the_model_calls_the_custom_op_only_when_compiled():
    """clipped_relative_attention: eager calls never dispatch the custom ops (their per-call host cost), a
    torch.compile'd call traces the forward op as one node of the graph."""
    from torch.utils._python_dispatch import TorchDispatchMode

    case = KERNEL_CASES["dropout_encoder"]
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float64)

    def attend(query, key, value, table):
        return triton_relative.clipped_relative_attention(query, key, value, table, key_start, key_end, 8**-0.5, 0.0,
                                                          0, 2, False).sum()

    class RecordOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.name())
            return func(*args, **(kwargs or {}))

    with RecordOps() as recorded:
        attend(query, key, value, table).backward()
    assert recorded.names and not any(name.startswith(triton_relative.OP_NAMESPACE) for name in recorded.names)

    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    torch.compile(attend, backend=backend, fullgraph=True)(query, key, value, table)
    targets = [str(node.target) for graph in graphs for node in graph.graph.nodes]
    assert sum(target == f"{triton_relative.OP_NAMESPACE}.relative_attention.default" for target in targets) == 1, \
        targets


@pytest.mark.numerics
def test_a_compiled_training_step_is_the_eager_one(triton_calls):
    """torch.compile of a padded training step on relpos_triton (AOT autograd; the padding check breaks the graph
    where it reads the mask): the eager step's loss and gradients in float64, every self-attention on the kernel."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("shaw")).to(DEVICE, torch.float64).train()
    model.set_attn_implementation("relpos_triton")
    batch = seq2seq_batch()

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        return loss.detach(), [parameter.grad for parameter in model.parameters()]

    expected_loss, expected_grads = step()
    eager_calls = len(triton_calls)
    got_loss, got_grads = torch.compile(step, backend="aot_eager")()
    assert eager_calls == 4 and len(triton_calls) > eager_calls
    torch.testing.assert_close(got_loss, expected_loss, rtol=0, atol=1e-12)
    for got, expected in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


class CountEqual(TorchDispatchMode):
    """How many torch.equal calls (the padding check's host reads of the mask) run inside it."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten.equal.default
        return func(*args, **(kwargs or {}))


def deep_shaw_on_triton(layers: int) -> hf_relpos.RelPosTransformerForConditionalGeneration:
    """A tiny shaw model of `layers` + `layers` layers on relpos_triton, in training mode (seed 0)."""
    torch.manual_seed(0)
    config = tiny_config("shaw", encoder_layers=layers, decoder_layers=layers)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).to(DEVICE).train()
    model.set_attn_implementation("relpos_triton")
    return model


def test_the_padding_check_reads_the_mask_once_per_stack_call_and_compiled_graphs_do_not_grow_with_depth(
        triton_calls):
    """`key_ranges` reads the self-attention mask on the host once per stack call, before the layers
    (`prepare_kernel`), and every layer reuses it: one torch.equal per padded stack in eager mode (the decoder's
    mask, built from causality alone, is not read), and under torch.compile the graph breaks only there, so a deeper
    model compiles into as many graphs (a break inside the layer loop makes dynamo compile each layer on its own). A
    scheme the kernel does not take never reads the mask."""
    graph_counts = {}
    for layers in (1, 3):
        model, batch = deep_shaw_on_triton(layers), seq2seq_batch()
        with CountEqual() as counted:
            model(**batch)
        assert counted.count == 1 and len(triton_calls) == 2 * layers
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(lambda model=model, batch=batch: model(**batch).loss)()
        frames = [[frame.name for frame in reason.user_stack] for reason in explanation.break_reasons]
        assert all(names[-1] == "key_ranges" and "attend" not in names for names in frames), frames
        graph_counts[layers] = explanation.graph_count
        triton_calls.clear()
    assert graph_counts[1] == graph_counts[3], graph_counts
    absolute = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("absolute")).to(DEVICE).train()
    absolute.set_attn_implementation("relpos_triton")
    with CountEqual() as counted:
        absolute(**seq2seq_batch())
    assert counted.count == 0 and not triton_calls


def test_a_decoder_mask_of_causality_alone_is_not_read_and_trains_as_a_checked_one(triton_calls):
    """In training the decoder gets no padding mask: its self-attention mask holds causality alone, which the kernel
    applies itself, so its key ranges are every key without reading the mask (a host sync on a GPU). The same step
    with a decoder padding mask of ones, which is read and checked, gives the same loss and gradients bit for bit
    (float64); a decoder padding mask with padding is read."""
    def step(decoder_attention_mask):
        model = deep_shaw_on_triton(2).double()
        batch = seq2seq_batch()
        if decoder_attention_mask is not None:
            batch["decoder_attention_mask"] = decoder_attention_mask(batch["labels"])
        with CountEqual() as counted:
            loss = model(**batch).loss
        loss.backward()
        return counted.count, loss.detach(), [parameter.grad for parameter in model.parameters()]

    unread, loss, grads = step(None)
    read, checked_loss, checked_grads = step(torch.ones_like)
    assert (unread, read) == (1, 2)   # the encoder's padding, then the decoder's mask of ones too
    assert torch.equal(loss, checked_loss)
    assert all(torch.equal(got, expected) for got, expected in zip(grads, checked_grads, strict=True))

    def padded(labels):
        mask = torch.ones_like(labels)
        mask[1, 8:] = 0
        return mask

    assert step(padded)[0] == 2


class CountRangeFills(TorchDispatchMode):
    """The int32 fills (zeros, full) run inside it: the key ranges of a stack call without a mask."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += (func in (torch.ops.aten.zeros.default, torch.ops.aten.full.default)
                       and (kwargs or {}).get("dtype") == torch.int32)
        return func(*args, **(kwargs or {}))


def test_a_stack_call_without_a_mask_builds_its_key_ranges_once(triton_calls):
    """A stack call without a padding mask (the encoder's without a mask, the decoder's with causality alone) has
    every key in range: the ranges (two int32 fills) are built once per stack call and shared by its layers, as a
    mask's are, whatever the depth."""
    fills = {}
    for layers in (1, 3):
        model, batch = deep_shaw_on_triton(layers), seq2seq_batch()
        with CountRangeFills() as counted:
            model(input_ids=batch["input_ids"], labels=batch["labels"])   # no padding: no encoder mask
        assert len(triton_calls) == 2 * layers
        fills[layers] = counted.count
        triton_calls.clear()
    assert fills == {1: 4, 3: 4}, fills


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "op"])
def test_a_second_derivative_is_refused_not_wrong(compiled):
    """Double backward through the fused attention (create_graph) raises on both paths: the kernels' gradients have
    no derivative of their own, and taking them as constants would give a wrong second derivative silently."""
    case = KERNEL_CASES["encoder_k1_padded"]
    query, key, value, table, key_start, key_end = kernel_inputs(case, torch.float64)
    weight = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    fused = relative_attention if compiled else triton_relative.FusedAttention.apply
    output, _, _ = fused(query.detach() * weight, key, value, table, key_start, key_end, torch.tensor([2**40]),
                         8**-0.5, 0.0, 0, 1, False, mass_columns(1, True))
    (grad,) = torch.autograd.grad(output.square().sum() + weight**3, weight, create_graph=True)
    with pytest.raises(RuntimeError, match="relative_attention_backward"):
        torch.autograd.grad(grad, weight)


@pytest.mark.numerics
def test_activation_checkpointing_recomputes_the_same_dropout(triton_calls):
    """A padded training step with attention and residual dropout on relpos_triton, with activation checkpointing
    (each layer's forward recomputed in the backward, torch's random state restored) and without: the same loss and
    the same gradients, exactly (float64): the recomputed kernels draw the dropout seeds of the first pass."""
    def step(checkpointing):
        triton_calls.clear()
        torch.manual_seed(0)
        model = hf_relpos.RelPosTransformerForConditionalGeneration(
            tiny_config("shaw", attention_dropout=0.2, dropout=0.1)).to(DEVICE, torch.float64).train()
        model.set_attn_implementation("relpos_triton")
        if checkpointing:
            model.activation_checkpointing_enable()
        torch.manual_seed(5)
        loss = model(**seq2seq_batch()).loss
        loss.backward()
        assert len(triton_calls) == (8 if checkpointing else 4)   # 2 + 2 self-attentions, recomputed when checkpointed
        return loss.detach(), [parameter.grad for parameter in model.parameters()]

    (plain_loss, plain_grads), (loss, grads) = step(False), step(True)
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(got, expected) for got, expected in zip(grads, plain_grads, strict=True))
