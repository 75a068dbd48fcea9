"""Each position scheme against a naive reference written straight from its paper's equations (float64 loops), on
every kernel, with and without padding, in the encoder, the decoder and a cached decoding step, at float64 precision
(1e-12: a float32 step anywhere fails)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import pytest
import torch
from conftest import (
    SCHEME_ORACLES,
    SCHEMES,
    TRANSFORMERS_KERNEL,
    RecordMatmuls,
    requires_relpos_triton,
    sinusoid_by_loop,
    tiny_config,
)

import hf_relpos
from hf_relpos import AttentionTerms, PositionScheme, register_position_scheme
from hf_relpos.model.positions import (
    QUERY_BLOCK,
    PositionContext,
    RelativeBias,
    RelativeValues,
    aligned_width,
    clipped_distance,
    clipped_rel_shift,
    computed_once,
    times_table,
)
from hf_relpos.model.positions_t5 import last_bucket_from, relative_position_bucket
from hf_relpos.model.positions_xl import XLContext
from hf_relpos.testing import (
    BATCH,
    HEAD_DIM,
    HEADS,
    KERNELS,
    SHAPES,
    TOLERANCE,
    check_oracle_case,
    fast_attention,
    inputs,
    make_attention,
    naive_allowed,
)
from hf_relpos.testing import softmax_attention_by_loop as naive_softmax_attention

pytestmark = pytest.mark.numerics


def test_relative_position_index_matches_the_paper_table():
    index = hf_relpos.relative_position_index(10, 10, 3)
    assert index[0].tolist() == [3, 4, 5, 6, 6, 6, 6, 6, 6, 6]
    assert index[9].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 2, 3]
    for i in range(10):
        for j in range(10):
            assert index[i, j] == max(-3, min(3, j - i)) + 3


def test_relative_position_index_offset_is_the_absolute_query_position():
    full = hf_relpos.relative_position_index(7, 7, 2)
    assert torch.equal(hf_relpos.relative_position_index(1, 7, 2, query_offset=6), full[6:7])
    assert torch.equal(hf_relpos.relative_position_index(3, 7, 2, query_offset=4), full[4:7])


def test_relative_position_index_never_out_of_range_for_long_inputs():
    index = hf_relpos.relative_position_index(3000, 3000, 16)
    assert index.min() == 0 and index.max() == 32


@pytest.mark.parametrize("scheme", ["shaw", "xl"])
@pytest.mark.parametrize("source_length", [5, 65, 129])
def test_the_packages_dense_relative_biases_give_rel_shift_a_view_to_take(monkeypatch, scheme, source_length):
    """Shaw's clipped bias and XL's encoder (query blocks, a last block of one query at n = 65 and 129) and decoder
    (a zero encoding more) hand rel_shift at least m + 1 distance columns or one query: no padded copy."""
    import hf_relpos.model.positions as positions_module
    import hf_relpos.model.positions_xl as xl_module

    widths = []

    def recorded(scores, key_length):
        widths.append((scores.size(-2), scores.size(-1), key_length))
        return rel_shift(scores, key_length)

    rel_shift = positions_module.rel_shift
    monkeypatch.setattr(positions_module, "rel_shift", recorded)
    monkeypatch.setattr(xl_module, "rel_shift", recorded)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(scheme)).eval()
    model.set_attn_implementation("sdpa")
    input_ids = torch.randint(3, 40, (2, source_length))
    model(input_ids=input_ids, decoder_input_ids=input_ids[:, :7])
    assert widths and all(rows == 1 or columns > key_length for rows, columns, key_length in widths), widths


@pytest.mark.parametrize(("n", "m", "offset", "distances"), [
    (4, 9, 5, 12),   # every distance: n + m - 1 columns
    (4, 9, 5, 10),   # m + 1 columns
    (4, 9, 5, 9),    # m columns (a causal table): padded first
    (1, 9, 8, 9),    # one query
    (1, 9, 8, 5),    # one query, fewer columns than keys: padded first
    (2, 1, 0, 2),
])
def test_rel_shift_aligns_every_distance_it_has_and_is_a_view_when_rows_have_m_plus_one_columns(n, m, offset, distances):
    """rel_shift: out[t, j] = the score of distance offset + t - j wherever the table has that distance (largest
    first); a view of the table (no copy) when it has at least m + 1 columns, or one query."""
    largest = offset + n - 1
    table = torch.arange(largest, largest - distances, -1).to(torch.float64)[None, None, :].expand(3, n, -1).clone()
    shifted = hf_relpos.rel_shift(table, m)
    assert shifted.shape == (3, n, m)
    for t in range(n):
        for j in range(m):
            if n - 1 - t + j < distances:
                assert (shifted[:, t, j] == offset + t - j).all()
    shares_storage = shifted.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()
    assert shares_storage == (distances > m or (n == 1 and distances >= m))


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("token_major", [False, True])
def test_products_with_a_distance_table_pad_it_to_an_aligned_width_and_equal_the_plain_products(per_head, token_major):
    """times_table in float64 at 1e-12, values and gradients: x . w_r for the 2k+1 = 33 distances is a view of a
    40-wide product (rows a multiple of 8 apart); masses 40 wide (zero beyond 33) times the table equal the 33-wide
    masses times it, and the table's gradient has its own shape."""
    generator = torch.Generator().manual_seed(5)
    heads, distances, head_dim = 3, 33, 8
    assert aligned_width(distances) == 40 and aligned_width(8) == 8 and aligned_width(1) == 8

    def leaf(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    x = leaf(2, 5, heads, head_dim)
    x_heads = x.transpose(1, 2) if token_major else x.transpose(1, 2).contiguous()
    table = leaf(*((heads,) if per_head else ()), distances, head_dim)
    profile = times_table(x_heads, table)
    heads_table = table if per_head else table.expand(heads, -1, -1)
    expected = torch.einsum("bhnd,hrd->bhnr", x_heads, heads_table)
    assert profile.shape == expected.shape and profile.stride(-2) % 8 == 0 and profile.stride(1) % 8 == 0
    torch.testing.assert_close(profile, expected, rtol=0, atol=1e-12)
    masses = torch.rand(2, heads, 5, distances, generator=generator, dtype=torch.float64)
    wide = torch.nn.functional.pad(masses, (0, 7))
    term = times_table(wide, table, transpose=False)
    expected_term = torch.einsum("bhnr,hrd->bhnd", masses, heads_table)
    torch.testing.assert_close(term, expected_term, rtol=0, atol=1e-12)
    with RecordMatmuls() as recorded:   # 33-wide masses (FlexAttention's regions) are padded before the product
        torch.testing.assert_close(times_table(masses, table, transpose=False), expected_term, rtol=0, atol=1e-12)
    assert recorded.shapes and not any(distances in shape for shapes in recorded.shapes for shape in shapes)
    upstream = torch.randn(profile.shape, generator=generator, dtype=torch.float64)
    upstream_term = torch.randn(term.shape, generator=generator, dtype=torch.float64)
    grads = torch.autograd.grad((profile * upstream).sum() + (term * upstream_term).sum(), (x, table))
    expected_grads = torch.autograd.grad((expected * upstream).sum() + (expected_term * upstream_term).sum(),
                                         (x, table))
    for got, want in zip(grads, expected_grads, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_shaws_masses_by_distance_are_as_wide_as_the_aligned_table():
    """RelativeValues sums each row's probabilities by clipped distance into mass_columns = aligned(2k+1) columns,
    zero beyond 2k+1; the term equals the loop over eq. 3 in float64."""
    k, n = 2, 6
    generator = torch.Generator().manual_seed(2)
    table = torch.randn(2 * k + 1, 4, generator=generator, dtype=torch.float64)
    index = hf_relpos.relative_position_index(n, n, k)
    values = RelativeValues(table, k, 0, index, consecutive=True)
    probabilities = torch.softmax(torch.randn(1, 2, n, n, generator=generator, dtype=torch.float64), -1)
    masses = values.mass_by_distance(probabilities)
    assert values.mass_columns == 8 and masses.shape == (1, 2, n, 8) and not masses[..., 2 * k + 1:].any()
    expected = torch.zeros(1, 2, n, 4, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            expected[:, :, i] += probabilities[:, :, i, j, None] * table[max(-k, min(k, j - i)) + k]
    torch.testing.assert_close(values(probabilities), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_shaws_masses_of_half_precision_probabilities_are_summed_in_float32(dtype, device):
    """An edge bucket of a^V (eager, SDPA) sums up to m probabilities: in promote_types(dtype, float32), as the fused
    kernels' masses are, not in the probabilities' dtype (CUDA's scatter-add rounds after every addition: bf16 additions
    in sequence give a 0.99 edge mass over 1000 keys as 0.58, an error that grows with the length). The term comes in
    the probabilities' dtype, within its rounding of the float64 term."""
    n, k = 1024, 4
    generator = torch.Generator().manual_seed(3)
    probabilities = torch.softmax(torch.randn(1, 2, n, n, generator=generator, dtype=torch.float64) * 0.5, -1).to(dtype)
    table = torch.randn(2 * k + 1, 8, generator=generator, dtype=torch.float64).to(dtype)
    index = hf_relpos.relative_position_index(n, n, k)
    exact = RelativeValues(table.double(), k, 0, index, consecutive=True)
    values = RelativeValues(table.to(device), k, 0, index.to(device), consecutive=True)
    masses = values.mass_by_distance(probabilities.to(device)).cpu()
    mass_error = (masses.double() - exact.mass_by_distance(probabilities.double())).abs().max().item()
    assert mass_error < 2e-5, mass_error
    term = values(probabilities.to(device)).cpu()
    expected = exact(probabilities.double())
    assert term.dtype == dtype
    term_error = (term.double() - expected).abs().max().item()
    assert term_error <= 2 * torch.finfo(dtype).eps * expected.abs().max().item(), term_error


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_a_gathered_bias_sums_its_buckets_gradients_in_float32(dtype, device):
    """Shaw's a^K at randomized positions is gathered by bucket (`RelativeBias.dense`): its backward sums the gradient
    of every key in a bucket, up to m for an edge bucket. The gather runs in promote_types(dtype, float32), so the
    sum does too (CUDA's scatter-add rounds after every addition); the bias keeps the table's dtype and values."""
    n, m, k = 4, 1024, 4
    generator = torch.Generator().manual_seed(4)
    positions = torch.sort(torch.randperm(4 * m, generator=generator)[:m]).values
    index = clipped_distance(positions[None, :] - positions[-n:, None], k)
    table = torch.randn(1, 2, n, 2 * k + 1, generator=generator, dtype=torch.float64)
    upstream = torch.rand(1, 2, n, m, generator=generator, dtype=torch.float64).to(dtype)
    half = table.to(dtype).to(device).requires_grad_()
    bias = RelativeBias(table=half, bucket=lambda i, j: index.to(device)[i, j], key_length=m, consecutive=False)
    gathered = []

    class RecordGathers(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.gather:
                gathered.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    with RecordGathers():
        dense = bias.dense()
    assert gathered == [torch.float32] and dense.dtype == dtype
    assert torch.equal(dense.cpu(), torch.gather(half.detach().cpu(), -1, index.expand(1, 2, n, m)))
    (dense * upstream.to(device)).sum().backward()
    expected = torch.zeros_like(table).scatter_add_(-1, index.expand(1, 2, n, m), upstream.double())
    error = (half.grad.cpu().double() - expected).abs().max().item()
    assert error <= torch.finfo(dtype).eps * expected.abs().max().item(), error


@pytest.mark.parametrize("k", [0, 2, 16])
def test_clipped_rel_shift_reads_the_first_2k_plus_1_columns_of_a_wider_table(k):
    """Shaw's aligned table (2k+1 distances, then padding columns): the bias and its gradient are those of its first
    2k+1 columns, exactly, and the padding columns get a zero gradient."""
    generator = torch.Generator().manual_seed(k)
    table = torch.randn(2, 3, 6, 2 * k + 1, generator=generator, dtype=torch.float64, requires_grad=True)
    wide = torch.cat([table.detach(), torch.randn(2, 3, 6, 7, generator=generator, dtype=torch.float64)], -1)
    wide.requires_grad_()
    upstream = torch.randn(2, 3, 6, 9, generator=generator, dtype=torch.float64)
    narrow_bias = hf_relpos.model.positions.clipped_rel_shift(table, 9, k, 3)
    wide_bias = hf_relpos.model.positions.clipped_rel_shift(wide, 9, k, 3)
    assert torch.equal(wide_bias, narrow_bias)
    (narrow_grad,), (wide_grad,) = (torch.autograd.grad((bias * upstream).sum(), source)
                                    for bias, source in ((narrow_bias, table), (wide_bias, wide)))
    assert torch.equal(wide_grad[..., :2 * k + 1], narrow_grad) and not wide_grad[..., 2 * k + 1:].any()


@pytest.mark.parametrize("n, m, k, offset", [(1, 1, 0, 0), (1, 12, 3, 11), (5, 5, 2, 0), (5, 5, 16, 0),
                                              (3, 10, 2, 7), (4, 9, 0, 5), (6, 6, 1, 0), (2, 30, 4, 28)])
def test_clipped_rel_shift_reads_the_table_at_each_clipped_distance_and_its_gradient_sums_per_bucket(n, m, k, offset):
    """Shaw's gather-free a^K bias against an explicit loop over clip(j - i', k) + k (Shaw et al. 2018, eq. 5), values
    and gradients in float64."""
    generator = torch.Generator().manual_seed(n * 100 + m)
    table = torch.randn(2, 3, n, 2 * k + 1, generator=generator, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 3, n, m, generator=generator, dtype=torch.float64)
    shifted = hf_relpos.model.positions.clipped_rel_shift(table, m, k, offset)
    expected = torch.empty(2, 3, n, m, dtype=torch.float64)
    expected_grad = torch.zeros_like(table)
    for i in range(n):
        for j in range(m):
            bucket = max(-k, min(k, j - (i + offset))) + k
            expected[:, :, i, j] = table[:, :, i, bucket]
            expected_grad[:, :, i, bucket] += upstream[:, :, i, j]
    torch.testing.assert_close(shifted, expected.detach(), rtol=0, atol=0)
    (shifted * upstream).sum().backward()
    torch.testing.assert_close(table.grad, expected_grad, rtol=0, atol=1e-12)


def naive_shaw(scheme, layer, q, k, v, allowed, query_at, key_at):
    """Shaw et al. eqs. 3-4: e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_z), z_i = sum_j alpha_ij (v_j + a^V_ij).

    Every reference takes the absolute position of query i (`query_at[i]`) and key j (`key_at[j]`)."""
    kmax = scheme.max_relative_position

    def table(tables, h, i, j):
        if tables is None:
            return torch.zeros(HEAD_DIM, dtype=torch.float64)
        per_layer = tables[layer]
        per_head = per_layer[h] if per_layer.dim() == 3 else per_layer
        return per_head[max(-kmax, min(kmax, key_at[j] - query_at[i])) + kmax]

    scores = torch.zeros(BATCH, HEADS, q.size(2), k.size(2), dtype=torch.float64)
    for b in range(BATCH):
        for h in range(HEADS):
            for i in range(q.size(2)):
                for j in range(k.size(2)):
                    a_key = table(scheme.relative_keys, h, i, j)
                    scores[b, h, i, j] = q[b, h, i] @ (k[b, h, j] + a_key) / math.sqrt(HEAD_DIM)
    return naive_softmax_attention(scores, allowed, lambda b, h, i, j: v[b, h, j] + table(scheme.relative_values, h, i, j))


def naive_xl(scheme, layer, q, k, v, allowed, query_at, key_at):
    """Dai et al. eq. in sec. 3.3: A_ij = q_i.k_j + q_i.W_kR R_(i-j) + u.k_j + v.W_kR R_(i-j), scaled by 1/sqrt(d)."""
    projection = scheme.position_projections[layer].weight
    bias_layer = layer if scheme.content_bias.size(0) > 1 else 0
    u, v_bias = scheme.content_bias[bias_layer], scheme.position_bias[bias_layer]
    clamp = scheme.clamp_len
    scores = torch.zeros(BATCH, HEADS, q.size(2), k.size(2), dtype=torch.float64)
    for i in range(q.size(2)):
        for j in range(k.size(2)):
            distance = query_at[i] - key_at[j]
            distance = distance if clamp is None else max(-clamp, min(clamp, distance))
            relative = (projection @ sinusoid_by_loop(distance, scheme.config.d_model)).view(HEADS, HEAD_DIM)
            for b in range(BATCH):
                for h in range(HEADS):
                    term_a = q[b, h, i] @ k[b, h, j]
                    term_b = q[b, h, i] @ relative[h]
                    term_c = u[h] @ k[b, h, j]
                    term_d = v_bias[h] @ relative[h]
                    scores[b, h, i, j] = (term_a + term_b + term_c + term_d) / math.sqrt(HEAD_DIM)
    return naive_softmax_attention(scores, allowed, lambda b, h, i, j: v[b, h, j])


def disan_allowed(direction: str, i: int, j: int, disable_diagonal: bool) -> bool:
    """Shen et al. (2018) masks: M_ij = 0 (attend) iff j < i (forward), j > i (backward), j != i (diag-disabled)."""
    if i == j:
        return not disable_diagonal
    return {"forward": j < i, "backward": j > i, "both": True}[direction]


def naive_directional(scheme, layer, q, k, v, allowed, query_at, key_at):
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
    combined = allowed.clone()
    for h, direction in enumerate(scheme.head_directions):
        for i in range(q.size(2)):
            for j in range(k.size(2)):
                combined[:, h, i, j] &= disan_allowed(direction, query_at[i], key_at[j], scheme.disable_diagonal)
    return naive_softmax_attention(scores, combined, lambda b, h, i, j: v[b, h, j])


def naive_absolute(scheme, layer, q, k, v, allowed, query_at, key_at):
    """Plain attention: `absolute` adds its sinusoids to the embeddings (tested in test_model.py), `none` nothing."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
    return naive_softmax_attention(scores, allowed, lambda b, h, i, j: v[b, h, j])


def paper_alibi_slopes(n):
    """`get_slopes` from the ALiBi paper's reference code (Press et al. 2022, github.com/ofirpress/attention_with_linear_biases)."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + paper_alibi_slopes(2 * closest_power_of_2)[0::2][
        : n - closest_power_of_2
    ]


def naive_alibi(scheme, layer, q, k, v, allowed, query_at, key_at):
    """Press et al. (2022) sec. 3: softmax(q_i k_j / sqrt(d) - m_h |i - j|), the causal mask doing the rest."""
    slopes = paper_alibi_slopes(HEADS)
    scores = torch.zeros(BATCH, HEADS, q.size(2), k.size(2), dtype=torch.float64)
    for b in range(BATCH):
        for h in range(HEADS):
            for i in range(q.size(2)):
                for j in range(k.size(2)):
                    distance = abs(query_at[i] - key_at[j])
                    scores[b, h, i, j] = q[b, h, i] @ k[b, h, j] / math.sqrt(HEAD_DIM) - slopes[h] * distance
    return naive_softmax_attention(scores, allowed, lambda b, h, i, j: v[b, h, j])


def t5_bucket_by_loop(relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Raffel et al. (2020) sec. 2.1 for one offset j - i: "ranges that increase in size logarithmically up to an offset
    of max_distance beyond which we assign all relative positions to the same embedding"; half the buckets exact, half
    logarithmic, split by sign when bidirectional (mesh-tensorflow's layout)."""
    bucket, distance = 0, -relative_position  # i - j
    if bidirectional:
        num_buckets //= 2
        if distance < 0:
            bucket, distance = num_buckets, -distance
    else:
        distance = max(distance, 0)
    exact = num_buckets // 2
    if distance < exact:
        return bucket + distance
    logarithmic = exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return bucket + min(logarithmic, num_buckets - 1)


def naive_t5(scheme, layer, q, k, v, allowed, query_at, key_at):
    """e_ij = q_i k_j / sqrt(d) + b_h(bucket(j - i)), one table for every layer."""
    table = scheme.relative_attention_bias.weight
    scores = torch.zeros(BATCH, HEADS, q.size(2), k.size(2), dtype=torch.float64)
    for i in range(q.size(2)):
        for j in range(k.size(2)):
            bucket = t5_bucket_by_loop(key_at[j] - query_at[i], not scheme.is_causal, scheme.num_buckets,
                                       scheme.max_distance)
            for b in range(BATCH):
                for h in range(HEADS):
                    scores[b, h, i, j] = q[b, h, i] @ k[b, h, j] / math.sqrt(HEAD_DIM) + table[bucket, h]
    return naive_softmax_attention(scores, allowed, lambda b, h, i, j: v[b, h, j])


def rotation_by_loop(position: int, theta: float, rotary_dim: int) -> torch.Tensor:
    """RoFormer eq. 34: the block-diagonal R_{Theta,m}, a 2x2 rotation by m theta_t in the plane (2t, 2t+1), theta_t =
    theta^(-2t/d_rot), identity on the dimensions past `rotary_dim`."""
    rotation = torch.eye(HEAD_DIM, dtype=torch.float64)
    for t in range(rotary_dim // 2):
        angle = position * theta ** (-2 * t / rotary_dim)
        rotation[2 * t, 2 * t], rotation[2 * t, 2 * t + 1] = math.cos(angle), -math.sin(angle)
        rotation[2 * t + 1, 2 * t], rotation[2 * t + 1, 2 * t + 1] = math.sin(angle), math.cos(angle)
    return rotation


def naive_rope(scheme, layer, q, k, v, allowed, query_at, key_at):
    """e_ij = (R_{Theta,i} q_i)^T (R_{Theta,j} k_j) / sqrt(d) (RoFormer eq. 16)."""
    theta, rotary_dim = scheme.config.rope_theta, scheme.config.rotary_dim or HEAD_DIM
    scores = torch.zeros(BATCH, HEADS, q.size(2), k.size(2), dtype=torch.float64)
    for i in range(q.size(2)):
        for j in range(k.size(2)):
            rotate_query = rotation_by_loop(query_at[i], theta, rotary_dim)
            rotate_key = rotation_by_loop(key_at[j], theta, rotary_dim)
            for b in range(BATCH):
                for h in range(HEADS):
                    scores[b, h, i, j] = (rotate_query @ q[b, h, i]) @ (rotate_key @ k[b, h, j]) / math.sqrt(HEAD_DIM)
    return naive_softmax_attention(scores, allowed, lambda b, h, i, j: v[b, h, j])


CASES = [
    ("shaw", naive_shaw, {}),
    ("shaw", naive_shaw, {"use_relative_values": False}),
    ("shaw", naive_shaw, {"use_relative_keys": False}),
    ("shaw", naive_shaw, {"relative_embeddings_shared_across_heads": False}),
    ("shaw", naive_shaw, {"max_relative_position": 0}),
    ("xl", naive_xl, {}),
    ("xl", naive_xl, {"untie_relative_biases": False, "clamp_len": 2}),
    ("xl", naive_xl, {"clamp_len": None}),
    ("directional", naive_directional, {}),
    ("directional", naive_directional, {"directional_heads": ["forward", "both", "backward"]}),
    ("directional", naive_directional, {"directional_disable_diagonal": False}),
    ("directional", naive_directional, {"directional_heads": ["forward", "both", "backward"],
                                        "directional_disable_diagonal": False}),
    ("absolute", naive_absolute, {}),
    ("none", naive_absolute, {}),
    ("alibi", naive_alibi, {}),
    ("t5", naive_t5, {}),
    ("t5", naive_t5, {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 5}),
    ("rope", naive_rope, {}),
    ("rope", naive_rope, {"rotary_dim": 4, "rope_theta": 100.0}),
    *SCHEME_ORACLES,   # those of the schemes that tests/test_scheme_*.py register
]


def test_a_value_computed_once_is_computed_on_the_first_read_only_and_kept_by_its_own_context():
    """`computed_once` reads its method once per context and keeps the value in the context's own __dict__: later
    reads return the same object, another context computes its own."""
    calls = []

    @dataclasses.dataclass(frozen=True)
    class CountingContext(PositionContext):
        @computed_once
        def table(self) -> torch.Tensor:
            """A table."""
            calls.append(self.query_length)
            return torch.arange(self.query_length)

    first, second = (CountingContext(n, n, 0, None, torch.device("cpu"), torch.float32) for n in (3, 5))
    assert calls == []
    assert first.table is first.table and calls == [3]
    assert second.table.tolist() == [0, 1, 2, 3, 4] and calls == [3, 5]
    assert CountingContext.table.__doc__ == "A table."
    assert first.__dict__["table"] is first.table


def test_every_scheme_has_an_oracle():
    """A scheme without a naive reference would pass every other shared test untested against its equations."""
    assert set(SCHEMES) <= {case[0] for case in CASES}


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("position_scheme, reference, overrides", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_scheme_matches_naive_equations(position_scheme, reference, overrides, shape, kernel, padded):
    """Every kernel (FlexAttention unfused here on CPU; compiled on CUDA in test_kernels.py) is exact in float64
    (hf_relpos.testing.check_oracle_case, what check_position_scheme runs on a user's oracle)."""
    check_oracle_case(position_scheme, reference, overrides, kernel=kernel, shape=shape, padded=padded)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("position_scheme, reference, overrides", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_scheme_matches_naive_equations_at_randomized_positions(position_scheme, reference, overrides, shape, kernel):
    """Randomized positions (`position_randomization_max`, Ruoss et al. 2023): given the keys' positions, a sorted
    subset of 0 .. 39 with gaps, each scheme computes its paper equation at those positions, on every kernel."""
    key_length = SHAPES[shape][2]
    key_positions = torch.randperm(40, generator=torch.Generator().manual_seed(5))[:key_length].sort().values
    check_oracle_case(position_scheme, reference, overrides, kernel=kernel, shape=shape, padded=True,
                      key_positions=key_positions)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_shaws_value_term_sees_the_dropped_probabilities(kernel):
    """Attention dropout (kind "probabilities") drops alpha_ij in both of eq. 3's terms: z_i = sum_j alpha'_ij (v_j +
    a^V_ij), alpha' = nn.functional.dropout(alpha) under the same seed."""
    attention, scheme = make_attention("shaw", False, kernel, attention_dropout=0.4)
    attention.train()
    q, k, v = inputs(6, 6)
    context = scheme.prepare(PositionContext(6, 6, 0, None, q.device, q.dtype))
    torch.manual_seed(3)
    with torch.no_grad():
        output, _ = attention.attend(q, k, v, None, scheme, context, False)
    kmax = scheme.max_relative_position

    def relative(tables, i, j):
        return tables[1][max(-kmax, min(kmax, j - i)) + kmax]

    scores = torch.zeros(BATCH, HEADS, 6, 6, dtype=torch.float64)
    for b, h, i, j in itertools.product(range(BATCH), range(HEADS), range(6), range(6)):
        scores[b, h, i, j] = q[b, h, i] @ (k[b, h, j] + relative(scheme.relative_keys, i, j)) / math.sqrt(HEAD_DIM)
    torch.manual_seed(3)
    dropped = torch.nn.functional.dropout(scores.softmax(-1), 0.4)
    expected = torch.zeros(BATCH, HEADS, 6, HEAD_DIM, dtype=torch.float64)
    for b, h, i, j in itertools.product(range(BATCH), range(HEADS), range(6), range(6)):
        expected[b, h, i] += dropped[b, h, i, j] * (v[b, h, j] + relative(scheme.relative_values, i, j))
    assert (dropped == 0).any() and (output.transpose(1, 2) - expected).abs().max().item() < TOLERANCE


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("overrides", [{}, {"relative_embeddings_shared_across_heads": False},
                                       {"use_relative_keys": False}], ids=["shared", "per-head", "values-only"])
def test_shaws_one_query_terms_on_the_keys_and_values_equal_its_bias_and_masses(overrides, kernel):
    """A decoding step's query i (one query after 6 keys): the keys k_j + a^K_ij and the values v_j + a^V_ij
    (eqs. 3-4 unfactored, plain attention) equal in float64 the same query as the last of a call of two (the bias
    q . w^K_r laid out over the keys, a^V from the probabilities' masses per distance), gradients of q, k, v and both
    tables too; a batch row whose keys are all masked outputs zeros."""
    results = {}
    for query_length in (1, 2):
        torch.manual_seed(0)
        attention, scheme = make_attention("shaw", True, kernel, **overrides)
        q, k, v = inputs(2, 7)
        q = q[..., 2 - query_length:, :].clone().requires_grad_()
        k, v = k.requires_grad_(), v.requires_grad_()
        context = scheme.prepare(PositionContext(query_length, 7, 7 - query_length, None, q.device, q.dtype))
        terms = scheme.terms(1, q, k, context)
        assert (terms.value_term is None and terms.score_bias is None) == (query_length == 1)
        allowed = torch.ones(BATCH, 1, query_length, 7, dtype=torch.bool).tril(7 - query_length)
        allowed[1] = False
        output, _ = attention.attend(q, k, v, allowed, scheme, context, False)
        step = output[:, -1:]
        weights = torch.randn(step.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        (step * weights).sum().backward()
        tables = [table for table in (scheme.relative_keys, scheme.relative_values) if table is not None]
        results[query_length] = [step, q.grad[..., -1:, :], k.grad, v.grad, *(table.grad for table in tables)]
    assert results[1][0][1].abs().max() == 0 and results[1][0][0].abs().min() > 0
    for got, want in zip(results[1], results[2], strict=True):
        assert (got - want).abs().max().item() < TOLERANCE


@pytest.mark.parametrize("kernel", ["eager", "sdpa", pytest.param("relpos_triton", marks=requires_relpos_triton)])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-head"])
def test_shaws_table_gradients_have_their_tables_strides(kernel, layers, shared):
    """The a^K and a^V tables' gradients are laid out as the tables are (AccumulateGrad's layout contract, and the
    strides DDP compares with its bucket views), for a stack of one layer (a size-1 leading dimension, whose stride
    AccumulateGrad does not compare) and of two, from the padded tables the products use (`padded_table`)."""
    torch.manual_seed(0)
    config = tiny_config("shaw", encoder_layers=layers, decoder_layers=layers, max_relative_position=3,
                         relative_embeddings_shared_across_heads=shared)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).double().train()
    model.set_attn_implementation(kernel)
    sources, targets = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5))
    model(input_ids=sources, labels=targets).loss.backward()
    tables = {name: table for name, table in model.named_parameters() if name.endswith(("relative_keys",
                                                                                          "relative_values"))}
    assert len(tables) == 4
    strides = {name: (table.grad.stride(), table.stride()) for name, table in tables.items()}
    assert all(got == want for got, want in strides.values()), strides


def test_a_padded_table_of_overlapping_strides_gets_its_gradient():
    """`padded_table` of a table whose strides overlap (one expanded over heads) backpropagates: its gradient is laid
    out densely, as AccumulateGrad lays out such a gradient (its strides cannot be copied), and is the pad's (float64
    gradcheck and second derivatives on a plain table)."""
    table = torch.randn(1, 7, 8, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 8, 8, dtype=torch.float64)
    (hf_relpos.model.positions.padded_table(table.expand(3, 7, 8)) * weights).sum().backward()
    assert torch.equal(table.grad, weights[:, :7].sum(0, keepdim=True))
    plain = torch.randn(2, 7, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(hf_relpos.model.positions.padded_table, (plain,))
    assert torch.autograd.gradgradcheck(hf_relpos.model.positions.padded_table, (plain,))


@pytest.mark.parametrize("heads", range(1, 65))
def test_alibi_slopes_are_the_papers_for_every_head_count(heads):
    """Geometric 2^(-8h/H) for powers of 2; other head counts interleave two sequences, as the paper's code does."""
    assert hf_relpos.model.positions_alibi.alibi_slopes(heads) == pytest.approx(paper_alibi_slopes(heads), rel=1e-13, abs=0)


def test_alibi_slopes_for_eight_heads_are_the_papers_example():
    """Press et al. (2022) sec. 3: "For models with 8 heads, the slopes ... are 1/2^1, 1/2^2, ..., 1/2^8"."""
    assert hf_relpos.model.positions_alibi.alibi_slopes(8) == [2.0**-h for h in range(1, 9)]


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 5), (16, 64), (64, 500), (5, 7), (33, 17)])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "unidirectional"])
def test_t5_relative_position_bucket_matches_the_paper_loop_and_transformers(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    relative_position = torch.arange(-1000, 1001)[:, None] + torch.zeros(1, 3, dtype=torch.long)  # any shape
    buckets = relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance)
    expected = T5Attention._relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance)
    assert torch.equal(buckets, expected)
    for offset, bucket in zip(relative_position[:, 0].tolist(), buckets[:, 0].tolist(), strict=True):
        assert bucket == t5_bucket_by_loop(offset, bidirectional, num_buckets, max_distance), offset
    assert 0 <= buckets.min() and buckets.max() < num_buckets


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 5), (16, 64), (5, 7)])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "unidirectional"])
def test_t5s_far_regions_begin_where_each_halfs_last_bucket_begins(bidirectional, num_buckets, max_distance):
    """`last_bucket_from` is the smallest D >= 1 from which every offset of a sign has the bucket of sign x
    max_distance: the fused path's band stops there (a later D is exact too, but forms diagonals it need not)."""
    bucket_of = functools.partial(relative_position_bucket, bidirectional=bidirectional, num_buckets=num_buckets,
                                  max_distance=max_distance)
    for sign in (-1, 1):
        first = last_bucket_from(bucket_of, max_distance, sign)
        offsets = sign * torch.arange(first, max_distance + 1000)
        assert torch.equal(bucket_of(offsets), bucket_of(torch.full_like(offsets, sign * max_distance)))
        assert first == 1 or bucket_of(torch.tensor(sign * (first - 1))) != bucket_of(torch.tensor(sign * max_distance))


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("position_scheme", ["absolute", "none", "rope"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_transformers_kernel_runs_a_scheme_that_adds_nothing_to_attention(shape, position_scheme, padded):
    """`absolute` and `none` add nothing to attention, `rope` only replaces queries and keys, so any kernel of
    transformers' runs them (here transformers' own SDPA function registered under another name, standing in for
    flash_attention_2/3 and Hub kernels)."""
    is_causal, query_length, key_length = SHAPES[shape]
    attention, scheme = make_attention(position_scheme, is_causal, TRANSFORMERS_KERNEL)
    (q, k, v), fast, _ = fast_attention(attention, scheme, query_length, key_length, is_causal, padded)
    offset = key_length - query_length
    reference = naive_rope if position_scheme == "rope" else naive_absolute
    expected = reference(scheme, 1, q, k, v, naive_allowed(query_length, key_length, offset, is_causal, padded),
                              range(offset, key_length), range(key_length))
    assert (fast - expected).abs().max().item() < TOLERANCE


@register_position_scheme("test_query_key_transform")
class QueryKeyTransform(PositionScheme):
    """Replaces queries and keys only (q -> 2q, k -> k + 1), as RoPE's rotations will: nothing a kernel must take."""

    def terms(self, layer_idx, query, key, context):
        return AttentionTerms(query=2 * query, key=key + 1)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("kernel", [*KERNELS, TRANSFORMERS_KERNEL])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_replaced_queries_and_keys_run_on_every_kernel(shape, kernel, padded):
    is_causal, query_length, key_length = SHAPES[shape]
    attention, scheme = make_attention("test_query_key_transform", is_causal, kernel)
    (q, k, v), fast, _ = fast_attention(attention, scheme, query_length, key_length, is_causal, padded)
    offset = key_length - query_length
    scores = torch.matmul(2 * q, (k + 1).transpose(-1, -2)) / math.sqrt(HEAD_DIM)
    allowed = naive_allowed(query_length, key_length, offset, is_causal, padded)
    expected = naive_softmax_attention(scores, allowed, lambda b, h, i, j: v[b, h, j])
    assert (fast - expected).abs().max().item() < TOLERANCE


@pytest.mark.parametrize("position_scheme, added", [("shaw", "a score bias and a value term"), ("xl", "a score bias"),
                                                    ("directional", "an attention mask"), ("alibi", "a score bias"),
                                                    ("t5", "a score bias")])
def test_a_transformers_kernel_refuses_a_scheme_it_cannot_run(position_scheme, added):
    attention, scheme = make_attention(position_scheme, False, TRANSFORMERS_KERNEL)
    with pytest.raises(ValueError) as error:
        fast_attention(attention, scheme, 4, 4, False, padded=False)
    message = str(error.value)
    assert f"position_scheme {position_scheme!r} adds {added}" in message and TRANSFORMERS_KERNEL in message
    assert "['eager', 'sdpa', 'flex_attention', 'relpos_triton']" in message


def test_xl_position_scores_in_both_orders_match_the_loop():
    """`XLPositions.position_scores` projects the distances (many queries) or the queries (few, as in cached
    decoding); both orders give (q + v) . W_kR R_d / sqrt(d) exactly, also for distances beyond the sinusoid table's
    first size (64), which grows from the span its caller computes."""
    attention, scheme = make_attention("xl", True, "eager", clamp_len=None)
    projection = scheme.position_projections[0].weight
    # 12 queries vs 6 distances; 1 query vs 40; distances down to -295; a decoding step 200 tokens in
    for batch, query_length, count, largest in [(2, 6, 6, 9), (1, 1, 40, 4), (1, 1, 300, 4), (1, 1, 201, 200)]:
        position_query = torch.randn(batch, HEADS, query_length, HEAD_DIM, dtype=torch.float64)
        distances = torch.arange(largest, largest - count, -1)
        encodings = scheme.encodings(distances, max(abs(largest), abs(largest - count + 1)), torch.float64)
        context = PositionContext(query_length, count, 0, None, position_query.device, torch.float64).extend(
            XLContext, encodings=encodings, score_scale=HEAD_DIM**-0.5)
        scores = scheme.position_scores(0, position_query, context)
        for p in range(count):
            relative = (projection @ sinusoid_by_loop(largest - p, scheme.config.d_model)).view(HEADS, HEAD_DIM)
            expected = torch.einsum("bhnd,hd->bhn", position_query, relative) / math.sqrt(HEAD_DIM)
            assert (scores[..., p] - expected).abs().max().item() < TOLERANCE


@pytest.mark.parametrize("batch", [1, 64])   # W_kR^T (q + v) dotted with each R_d; (q + v) dotted with W_kR R_d
@pytest.mark.parametrize("projection", ["linear", "module"])
@pytest.mark.parametrize("tied", [False, True])
def test_xl_cached_step_bias_is_the_equation_for_one_query(batch, projection, tied):
    """A decoding step's dense (b)+(d) bias, one query at position m - 1 after m keys, per distance without a
    rel-shift: (q + v) . W_kR R_(m-1-j) / sqrt(d) from the sinusoids by loop, and so are the gradients of the query,
    W_kR and v (float64, 1e-12), in both orders of the product (few and many queries), with W_kR behind a module
    (an adapter's: projected by its forward) and with u and v tied across layers."""
    attention, scheme = make_attention("xl", True, "eager", clamp_len=None, untie_relative_biases=not tied)
    key_length, layer = 9, 1
    weight = scheme.position_projections[layer].weight
    if projection == "module":
        scheme.position_projections[layer] = torch.nn.Sequential(scheme.position_projections[layer])
    query = torch.randn(batch, HEADS, 1, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    key = torch.randn(batch, HEADS, key_length, HEAD_DIM, dtype=torch.float64)
    context = scheme.prepare(PositionContext(1, key_length, key_length - 1, None, query.device, query.dtype))
    dense = scheme.terms(layer, query, key, context).score_bias.dense()
    v_bias = scheme.position_bias[0 if tied else layer]
    relative = torch.stack([(weight @ sinusoid_by_loop(key_length - 1 - j, scheme.config.d_model)).view(HEADS, HEAD_DIM)
                            for j in range(key_length)])
    expected = torch.einsum("bhid,jhd->bhij", query + v_bias[:, None, :], relative) / math.sqrt(HEAD_DIM)
    assert dense.shape == (batch, HEADS, 1, key_length)
    assert (dense - expected).abs().max().item() < TOLERANCE
    upstream = torch.randn_like(dense)
    fast = torch.autograd.grad((dense * upstream).sum(), (query, weight, scheme.position_bias))
    slow = torch.autograd.grad((expected * upstream).sum(), (query, weight, scheme.position_bias))
    for fast_grad, slow_grad in zip(fast, slow, strict=True):
        assert (fast_grad - slow_grad).abs().max().item() < TOLERANCE * max(1.0, slow_grad.abs().max().item())


@pytest.mark.parametrize("query_length, key_length, offset", [
    (5, 5, 0), (QUERY_BLOCK, QUERY_BLOCK, 0), (QUERY_BLOCK + 1, QUERY_BLOCK + 1, 0), (2 * QUERY_BLOCK + 7, 150, 13),
    (1, 150, 149), (150, 40, 0),
])
@pytest.mark.parametrize("k", [0, 1, 3, 70, 300])
def test_clipped_rel_shift_of_query_blocks_is_the_clipped_gather(query_length, key_length, offset, k):
    """Shaw's dense a^K bias, built QUERY_BLOCK queries at a time: table[i, clip(j - i - offset, k) + k] for every
    key, its gradient the scatter-add into the 2k + 1 buckets (float64, 1e-12), at block edges, with a query offset
    (cached decoding), fewer keys than queries and k beyond the sequence."""
    table = torch.randn(2, 3, query_length, 2 * k + 1, dtype=torch.float64, requires_grad=True)
    dense = clipped_rel_shift(table, key_length, k, offset)
    relative = torch.arange(key_length)[None, :] - torch.arange(offset, offset + query_length)[:, None]
    index = (relative.clamp(-k, k) + k).expand(2, 3, query_length, key_length)
    expected = torch.gather(table, -1, index)
    assert torch.equal(dense, expected)
    upstream = torch.randn_like(dense)
    (grad,) = torch.autograd.grad((dense * upstream).sum(), table)
    (expected_grad,) = torch.autograd.grad((expected * upstream).sum(), table)
    assert (grad - expected_grad).abs().max().item() < TOLERANCE


@pytest.mark.parametrize("length", [5, QUERY_BLOCK, QUERY_BLOCK + 1, 2 * QUERY_BLOCK + 7])
def test_xl_dense_bias_of_query_blocks_matches_the_equation_with_gradients(length):
    """The encoder's dense (b)+(d) bias is computed QUERY_BLOCK queries at a time, each block against only the
    distances it meets: equal to (q_i + v) . W_kR R_(i-j) / sqrt(d) from the sinusoids by loop, and so are the
    gradients of the queries, W_kR and v (float64, 1e-12), also across block edges."""
    attention, scheme = make_attention("xl", False, "eager", clamp_len=None)
    q, k, _ = inputs(length, length)
    q.requires_grad_(True)
    context = scheme.prepare(PositionContext(length, length, 0, None, q.device, q.dtype))
    dense = scheme.terms(1, q, k, context).score_bias.dense()
    weight, v_biases = scheme.position_projections[1].weight, scheme.position_bias
    relative = torch.stack([(weight @ sinusoid_by_loop(d, scheme.config.d_model)).view(HEADS, HEAD_DIM)
                            for d in range(length - 1, -length, -1)])   # distance length - 1 - p
    distance_index = (length - 1 - torch.arange(length)[:, None] + torch.arange(length)[None, :])
    expected = torch.einsum("bhid,ijhd->bhij", q + v_biases[1][:, None, :], relative[distance_index]) / math.sqrt(HEAD_DIM)
    assert dense.shape == (BATCH, HEADS, length, length)
    assert (dense - expected).abs().max().item() < TOLERANCE
    upstream = torch.randn_like(dense)
    fast = torch.autograd.grad((dense * upstream).sum(), (q, weight, v_biases))
    slow = torch.autograd.grad((expected * upstream).sum(), (q, weight, v_biases))
    for fast_grad, slow_grad in zip(fast, slow, strict=True):
        assert (fast_grad - slow_grad).abs().max().item() < TOLERANCE * max(1.0, slow_grad.abs().max().item())


@pytest.mark.parametrize("kernel", KERNELS)
def test_attention_weights_are_returned_on_request_and_rows_sum_to_one(kernel):
    """The weights need the probabilities: every hf_relpos kernel computes them explicitly when asked."""
    attention, scheme = make_attention("shaw", False, kernel)
    _, output, weights = fast_attention(attention, scheme, 5, 5, False, padded=True, output_attentions=True)
    assert weights.shape == (BATCH, HEADS, 5, 5)
    assert (weights.sum(-1) - 1).abs().max().item() < TOLERANCE
    assert torch.all(weights[1, :, :, -2:] == 0)
    attention_without, _ = make_attention("shaw", False, kernel)
    _, expected, _ = fast_attention(attention_without, scheme, 5, 5, False, padded=True)
    assert (output - expected).abs().max().item() < TOLERANCE


WHOLE_MODEL_CASES = [
    ("absolute", naive_absolute, {}),
    ("absolute", naive_absolute, {"layer_norm_position": "pre", "tie_word_embeddings": False}),
    ("shaw", naive_shaw, {"max_relative_position": 2, "layer_norm_position": "pre"}),
    ("xl", naive_xl, {"scale_embedding": False, "clamp_len": 3}),
    ("t5", naive_t5, {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 5}),
    ("rope", naive_rope, {"tie_word_embeddings": False, "rotary_dim": 4}),
    ("alibi", naive_alibi, {"layer_norm_position": "pre"}),
    ("directional", naive_directional, {"directional_heads": ["forward", "both", "backward"]}),
]


def logits_by_hand(model, reference, source: torch.Tensor, source_mask: torch.Tensor, target: torch.Tensor):
    """The encoder-decoder written out in float64 around a scheme's oracle (Vaswani et al. 2017): token embeddings
    times sqrt(d) (`scale_embedding`) plus the sinusoids (`absolute`, at positions 0, 1, ...); each sublayer f Post-LN
    LN(x + f(x)) or Pre-LN x + f(LN(x)), then a final LayerNorm per stack; self-attention by `reference`, bidirectional
    over the real source tokens in the encoder and causal in the decoder; cross-attention without positions; a ReLU
    feed-forward; logits = h W^T + final_logits_bias, W the shared embeddings (tied) or the output layer."""
    config = model.config
    pre = config.layer_norm_position == "pre"

    def norm(x, module):
        return torch.nn.functional.layer_norm(x, (x.size(-1),), module.weight, module.bias, 1e-5)

    def sublayer(x, module, f, *args):
        return x + f(norm(x, module), *args) if pre else norm(x + f(x, *args), module)

    def embedded(stack, ids):
        x = stack.embed_tokens.weight[ids] * (math.sqrt(config.d_model) if config.scale_embedding else 1.0)
        if config.position_scheme == "absolute":
            x = x + torch.stack([sinusoid_by_loop(t, config.d_model) for t in range(ids.size(1))])
        return x

    def attention(x, module, oracle, scheme, layer, keys_from, allowed):
        heads = lambda states, linear: linear(states).view(BATCH, -1, HEADS, HEAD_DIM).transpose(1, 2)  # noqa: E731
        keys_from = x if keys_from is None else keys_from   # self-attention
        q, k, v = heads(x, module.q_proj), heads(keys_from, module.k_proj), heads(keys_from, module.v_proj)
        at = list(range(keys_from.size(1)))
        out = oracle(scheme, layer, q, k, v, allowed, at[-x.size(1):], at)
        return module.out_proj(out.transpose(1, 2).reshape(BATCH, -1, HEADS * HEAD_DIM))

    def feed_forward(x, module):
        return module.fc2(torch.relu(module.fc1(x)))

    def stack_output(stack, x, self_allowed, memory=None, cross_allowed=None):
        for layer_idx, layer in enumerate(stack.layers):
            x = sublayer(x, layer.self_attn_layer_norm, attention, layer.self_attn, reference, stack.positions,
                         layer_idx, None, self_allowed)
            if memory is not None:
                x = sublayer(x, layer.encoder_attn_layer_norm, attention, layer.encoder_attn, naive_absolute, None,
                             layer_idx, memory, cross_allowed)
            x = sublayer(x, layer.final_layer_norm, feed_forward, layer.feed_forward)
        return norm(x, stack.layer_norm) if pre else x

    n, m = target.size(1), source.size(1)
    real = source_mask.bool()[:, None, None, :]
    encoded = stack_output(model.model.encoder, embedded(model.model.encoder, source),
                           real.expand(BATCH, HEADS, m, m))
    causal = torch.ones(n, n, dtype=torch.bool).tril().expand(BATCH, HEADS, n, n)
    decoded = stack_output(model.model.decoder, embedded(model.model.decoder, target), causal, encoded,
                           real.expand(BATCH, HEADS, n, m))
    output_layer = model.model.shared.weight if config.tie_word_embeddings else model.lm_head.weight   # untied: no `shared`
    return decoded @ output_layer.t() + model.final_logits_bias


@pytest.mark.parametrize("position_scheme, reference, overrides", WHOLE_MODEL_CASES,
                         ids=[f"{case[0]}-{index}" for index, case in enumerate(WHOLE_MODEL_CASES)])
def test_the_whole_model_is_its_blocks_written_out_around_each_schemes_oracle(position_scheme, reference, overrides):
    """The model's logits, from one forward and from cached decoding a token at a time, on every kernel, equal
    `logits_by_hand` at float64 precision: what the attention-level oracles leave out (the embedding scale, the
    sinusoids, Post-LN or Pre-LN placement and the final LayerNorms, cross-attention, tied or untied output layer,
    final_logits_bias) is checked with the scheme in place."""
    config = tiny_config(position_scheme, d_model=HEADS * HEAD_DIM, encoder_attention_heads=HEADS,
                         decoder_attention_heads=HEADS, **overrides)
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(1.0 if "layer_norm" in name and name.endswith("weight") else 0.0, 0.3)
        model.final_logits_bias.normal_(0.0, 1.0)
    assert (model.model.shared is not None and model.lm_head.weight is model.model.shared.weight) == config.tie_word_embeddings
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(3, config.vocab_size, (BATCH, 6), generator=generator)
    source_mask = torch.ones(BATCH, 6, dtype=torch.long)
    source_mask[1, -2:] = 0
    target = torch.randint(3, config.vocab_size, (BATCH, 5), generator=generator)
    with torch.no_grad():
        expected = logits_by_hand(model, reference, source, source_mask, target)
        for kernel in KERNELS:
            model.set_attn_implementation(kernel)
            forward = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target).logits
            encoded = model.get_encoder()(input_ids=source, attention_mask=source_mask)
            steps, cache = [], None
            for t in range(target.size(1)):
                step = model(encoder_outputs=encoded, attention_mask=source_mask, decoder_input_ids=target[:, t : t + 1],
                             cache=cache, use_cache=True)
                steps.append(step.logits)
                cache = step.cache
            for name, logits in (("forward", forward), ("cached steps", torch.cat(steps, dim=1))):
                difference = (logits - expected).abs().max().item()
                assert difference < TOLERANCE, f"{kernel} {name}: {difference:.2e}"
