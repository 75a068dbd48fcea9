"""Triton kernels of `triton_relative.py`: FlashAttention-2-style forward and backward of relative self-attention
whose score bias and value term depend on the clipped distance r(i, j) = clip(j - i - query_offset, k) + k.

Per batch entry b and head h, queries i < n, keys j in [key_start_b, key_end_b) (and j <= i + query_offset when
causal), scale c, per-row bias table T [n, >= 2k+1] (Shaw's q_i . a^K_r c; columns beyond 2k not read), Philox keep
mask kappa_ij, drop rate p (drawn as 16-bit integers: p = round(2^16 p_asked) / 2^16, `triton_relative.dropout_rate`):

    s_ij = c q_i . k_j + T[i, r(i, j)]               lse_i = log sum_j exp(s_ij)
    P_ij = exp(s_ij - lse_i)                          D_ij = P_ij kappa_ij / (1 - p)
    o_i = sum_j D_ij v_j                              M[i, r] = sum_{j: r(i, j) = r} D_ij

(the value term o_i + sum_r M[i, r] a^V_r is one small matmul outside). The kernels keep scores in base 2,
s_ij log2(e), so that each exponential is one exp2, and store lse_i log2(e). Backward, given dO and dM:

    dD_ij = dO_i . v_j + dM[i, r(i, j)]               dP_ij = dD_ij kappa_ij / (1 - p)
    Delta_i = dO_i . o_i + sum_r dM[i, r] M[i, r]     dS_ij = P_ij (dP_ij - Delta_i)
    dq_i = c sum_j dS_ij k_j    dk_j = c sum_i dS_ij q_i    dv_j = sum_i D_ij dO_i    dT[i, r] = sum_{r(i,j)=r} dS_ij

The dq/dT kernel runs first, over key blocks per query block, and stores its rows' Delta (dO and o are read there
once per row anyway); then the dk/dv kernel loops over query blocks per key block, reading Delta: every program
writes only its own rows (no atomics; the backward is deterministic). Each loop runs in three parts (the
softmax and the gradient sums do not depend on the order): the tiles whose keys are all at distance <= -k from their
queries (bucket 0), those at >= k (bucket 2k), and those that meet the band. On the edge tiles T and dM are one column
per row and the sums by distance (M, dT) one row sum per edge, so the interior buckets' [BLOCK_M, 2k-1] sums are live,
and buckets gathered, only over the band tiles. Every tensor is addressed by its strides (the model's token-major heads
need no copy). Imported only when attn_implementation "relpos_triton" runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers.utils.import_utils import is_triton_available

if is_triton_available():  # (transformers' remote-code import check skips imports under this test)
    import triton
    import triton.language as tl
else:
    raise ImportError("attn_implementation 'relpos_triton' needs triton: pip install triton (or hf_relpos[triton])")

# tl.dot takes float64 operands from triton 3.5 on (before, "Unsupported lhs dtype fp64" when a kernel compiles)
FLOAT64_DOT_TRITON = (3, 5)
FLOAT64_DOT = tuple(int(part) for part in triton.__version__.split(".")[:2]) >= FLOAT64_DOT_TRITON

# The autotuner's candidates (BLOCK_M, BLOCK_N, num_warps, num_stages): they fit an H100's and an H200's shared memory
# (228 KB per SM); on an H200 the fastest of them beat FlashAttention-2's Hopper tiles for every kernel and flag set
# (docs/results/gpu_check/2026-11-28_h200_1f3e7bf).
PHILOX_ROUNDS = tl.constexpr(7)   # Philox-4x32-7, as FlashAttention-2 draws its dropout mask
BLOCK_CONFIGS = ((64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 4, 2), (32, 64, 4, 2))
# Lengths, offsets and seeds change from call to call: not specialised on (one compile per flag set, not per shape).
# `length_bucket` (the longer side rounded up to a power of two, `triton_relative.length_bucket`) is read only by the
# autotuner: blocks are tuned per flag set and length bucket.
RUNTIME_INTS = ["seed", "dropout_threshold", "heads", "query_length", "key_length", "query_offset", "max_distance",
                "length_bucket", "batch_heads", "table_columns"]


@triton.jit
def matmul(a, b, ACC: tl.constexpr, PRECISION: tl.constexpr):
    """a @ b in the accumulation dtype. PRECISION "float32" (half-precision inputs under Triton's interpreter, whose
    tl.dot is wrong for bf16/fp16 in triton 3.9) multiplies the operands as float32: what a GPU's tensor cores compute
    for them, products exact and sums in float32."""
    if PRECISION == "float32":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee").to(ACC)
    else:
        return tl.dot(a, b, input_precision=PRECISION).to(ACC)


@triton.jit
def clipped_bucket(rows, cols, query_offset, max_distance):
    """r(i, j) = clip(j - i - query_offset, k) + k for a tile [BLOCK_M, BLOCK_N]."""
    delta = cols[None, :] - rows[:, None] - query_offset
    return tl.minimum(tl.maximum(delta, -max_distance), max_distance) + max_distance


@triton.jit
def dropout_keep(seed, dropout_threshold, bh, rows, first_col, query_length, key_length, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """kappa_ij of a tile whose first key `first_col` is a multiple of 8: a 16-bit Philox draw >= the threshold
    round(2^16 p), the same in forward and backward. One Philox-4x32-7 call (FlashAttention-2's round count) gives
    four 32-bit words, eight 16-bit draws: the counter ((b H + h) n + i) ceil(m / 8) + j // 8 gives keys
    8 (j // 8) .. 8 (j // 8) + 7 of row i, key 8 (j // 8) + 2 t + c drawing bits [16 c, 16 c + 16) of word t."""
    tl.static_assert(BLOCK_N % 8 == 0, "dropout_keep: BLOCK_N must be a multiple of 8")
    groups = first_col // 8 + tl.arange(0, BLOCK_N // 8)
    offsets = (bh.to(tl.int64) * query_length + rows[:, None]) * ((key_length + 7) // 8) + groups[None, :]
    w0, w1, w2, w3 = tl.randint4x(seed, offsets, PHILOX_ROUNDS)
    # join stacks on a new last axis: [.., g, a, b] = w_{2 a + b}, flattened to word 4 g + 2 a + b ...
    words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [BLOCK_M, BLOCK_N // 2])
    # ... and each word's low and high halves to keys 2 (4 g + t) and 2 (4 g + t) + 1
    draws = tl.reshape(tl.join(words & 0xFFFF, words >> 16), [BLOCK_M, BLOCK_N])
    return draws >= dropout_threshold.to(tl.uint32)


@triton.jit
def first_tile_from(threshold, first, end, BLOCK: tl.constexpr):
    """The first tile start first + BLOCK t >= threshold, at most `end`. `first` is a multiple of BLOCK, >= 0: the
    threshold is raised to it before rounding up (Triton's integer // may truncate negative numbers toward zero)."""
    return tl.minimum((tl.maximum(threshold, first) + BLOCK - 1) // BLOCK * BLOCK, end)


@triton.jit
def band_key_tiles(first_row, first, last, query_offset, max_distance, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """[band_start, band_end): the key tiles of [first, last) that meet the band of the query block at first_row.
    The tiles before it have all keys at distance <= -k (bucket 0: j + BLOCK_N - 1 - first_row - offset <= -k),
    those after it all at >= k (bucket 2k: j - (first_row + BLOCK_M - 1) - offset >= k)."""
    return (first_tile_from(first_row + query_offset - max_distance - BLOCK_N + 2, first, last, BLOCK_N),
            first_tile_from(first_row + BLOCK_M - 1 + query_offset + max_distance, first, last, BLOCK_N))


@triton.jit
def band_query_tiles(first_col, first, end, query_offset, max_distance, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """[band_start, band_end): the query blocks of [first, end) whose tile with the key block at first_col meets the
    band. The blocks before it see all its keys at distance >= k (bucket 2k: first_col - (i + BLOCK_M - 1) - offset
    >= k), those after it at <= -k (bucket 0: first_col + BLOCK_N - 1 - i - offset <= -k)."""
    return (first_tile_from(first_col - BLOCK_M + 2 - query_offset - max_distance, first, end, BLOCK_M),
            first_tile_from(first_col + BLOCK_N - 1 - query_offset + max_distance, first, end, BLOCK_M))


@triton.jit
def add_band_sums(left, inner, right, x, rows, first_col, query_offset, max_distance, BLOCK_N: tl.constexpr,
                  BLOCK_I: tl.constexpr):
    """The sums by distance of a band tile's x_ij added to `left` [BLOCK_M, 1] (bucket 0), `inner` [BLOCK_M, BLOCK_I]
    (column r - 1 for the 2k - 1 buckets 0 < r < 2k: the one entry per row on the diagonal j = i' + r - k, gathered,
    O(tile) work, not O(k tile)) and `right` [BLOCK_M, 1] (bucket 2k; k = 0: everything is bucket 0, in `left`).
    Only band tiles carry `inner`; a tile beyond -k or +k adds its row sums to `left` or `right` alone."""
    bucket = clipped_bucket(rows, first_col + tl.arange(0, BLOCK_N), query_offset, max_distance)
    left += tl.sum(tl.where(bucket == 0, x, 0.0), 1, keep_dims=True)
    right += tl.sum(tl.where((bucket == 2 * max_distance) & (bucket > 0), x, 0.0), 1, keep_dims=True)
    interior = tl.arange(0, BLOCK_I)[None, :]   # bucket interior + 1
    column = rows[:, None] + (query_offset - max_distance + 1 - first_col) + interior
    inside = (interior < 2 * max_distance - 1) & (column >= 0) & (column < BLOCK_N)
    inner += tl.where(inside, tl.gather(x, tl.where(inside, column, 0), axis=1), 0.0)
    return left, inner, right


@triton.jit
def store_by_distance(X, base, stride, rows, row_ok, left, inner, right, max_distance, BLOCK_I: tl.constexpr):
    """The first 2k+1 columns of rows of a tensor (row stride `stride`, unit last stride) from the sums by distance
    `left`, `inner` and `right` (as in `add_band_sums`; k = 0: left + right in the one bucket)."""
    row_offsets = base + rows[:, None] * stride
    dtype = X.dtype.element_ty
    two_buckets = (rows[:, None] * 0 + max_distance) > 0   # [BLOCK_M, 1]: k > 0
    tl.store(X + row_offsets, tl.where(two_buckets, left, left + right).to(dtype), mask=row_ok[:, None])
    interior = tl.arange(0, BLOCK_I)[None, :]
    tl.store(X + row_offsets + 1 + interior, inner.to(dtype), mask=row_ok[:, None] & (interior < 2 * max_distance - 1))
    tl.store(X + row_offsets + 2 * max_distance, right.to(dtype), mask=row_ok[:, None] & two_buckets)


@triton.jit
def store_zero_columns(X, base, stride, rows, row_ok, first, width, BLOCK_M: tl.constexpr):
    """Columns [first, width) of the rows `rows` of a [.., width] tensor (row stride `stride`, unit last stride) set
    to zero, eight at a time: the padding beyond 2k+1 of the masses (`RelativeValues.mass_columns`) and of the bias
    table's gradient (as wide as Shaw's aligned table), written here rather than by a fill."""
    for start in range(first, width, 8):
        columns = start + tl.arange(0, 8)[None, :]
        tl.store(X + base + rows[:, None] * stride + columns, tl.zeros([BLOCK_M, 8], X.dtype.element_ty),
                 mask=row_ok[:, None] & (columns < width))


@triton.jit
def by_distance(TABLE, t_base, t_stride, rows, cols, query_length, query_offset, max_distance):
    """TABLE[i, r(i, j)] for a band tile, gathered (TABLE's rows at t_base + i t_stride; zero beyond the query
    length)."""
    bucket = clipped_bucket(rows, cols, query_offset, max_distance)
    return tl.load(TABLE + t_base + rows[:, None] * t_stride + bucket, mask=(rows < query_length)[:, None], other=0.0)


@triton.jit
def edge_column(TABLE, t_base, t_stride, rows, query_length, max_distance, SIDE: tl.constexpr):
    """TABLE[i, (SIDE + 1) k] per row: the one bucket of every key of a tile beyond -k (SIDE -1) or +k (SIDE 1)."""
    return tl.load(TABLE + t_base + rows * t_stride + (SIDE + 1) * max_distance, mask=rows < query_length, other=0.0)


@triton.jit
def key_range(KEY_START, KEY_END, b, first_row, query_offset, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """The key tiles a query block meets: [key_start rounded down to BLOCK_N, key_end or the causal limit)."""
    key_start = tl.load(KEY_START + b)
    key_end = tl.load(KEY_END + b)
    last = key_end
    if CAUSAL:
        last = tl.minimum(last, first_row + BLOCK_M + query_offset)
    return key_start, key_end, (key_start // BLOCK_N) * BLOCK_N, last


@triton.jit
def head_base(b, h, stride_b, stride_h):
    """The offset of head h of batch entry b, in int64 (a tensor of 2^31 elements or more stays addressable)."""
    return b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def load_rows(X, base, stride, rows, first, end, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows [BLOCK, BLOCK_D] of a [.., d] tensor, zero outside [first, end) and beyond the head size."""
    dims = tl.arange(0, BLOCK_D)
    return tl.load(X + base + rows[:, None] * stride + dims[None, :],
                   mask=((rows >= first) & (rows < end))[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def store_rows(X, base, stride, rows, end, value, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows `rows` < `end` of a [.., d] tensor (row stride `stride`, unit last stride) from `value` [BLOCK, BLOCK_D]."""
    dims = tl.arange(0, BLOCK_D)
    tl.store(X + base + rows[:, None] * stride + dims[None, :], value.to(X.dtype.element_ty),
             mask=(rows < end)[:, None] & (dims[None, :] < HEAD_DIM))


@triton.jit
def tile_scores(q, k, T, t_base, t_stride, rows, cols, key_start, key_end, query_length, query_offset, max_distance,
                score_scale, log2e, HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
                PRECISION: tl.constexpr, SIDE: tl.constexpr):
    """A tile's scores in base 2, (c q_i . k_j + T[i, r(i, j)]) log2(e), as (s, scale, offset) with scores
    s_ij scale + offset_i (one fused multiply-add where they are used; `score_scale` = c log2(e)): a band tile
    (SIDE 0) gathers T by distance into s (scale 1, offset 0); a tile beyond -k (SIDE -1) or +k (SIDE 1) keeps
    s = q_i . k_j, scale c log2(e), and its one column of T as the offset. s is -inf at keys outside
    [key_start, key_end) and, causal, beyond i + query_offset (checked on band tiles and those beyond +k: beyond -k
    every key is at j - i' <= -k <= 0). Rows beyond the query length are not masked: their q, T, dO, dM, lse and
    Delta load as zeros, so their scores are finite, they add exactly zero to dk and dv, and nothing of theirs is
    stored."""
    s = matmul(q, tl.trans(k), ACC, PRECISION)
    offset = tl.zeros_like(rows).to(ACC)
    if SIDE == 0:
        scale = 1.0
        s = s * score_scale
        if HAS_BIAS:
            s += by_distance(T, t_base, t_stride, rows, cols, query_length, query_offset, max_distance).to(ACC) * log2e
    else:
        scale = score_scale
        if HAS_BIAS:
            offset = edge_column(T, t_base, t_stride, rows, query_length, max_distance, SIDE).to(ACC) * log2e
    allowed = ((cols >= key_start) & (cols < key_end))[None, :]
    if CAUSAL and SIDE != -1:
        allowed = allowed & (cols[None, :] <= rows[:, None] + query_offset)
    return tl.where(allowed, s, float("-inf")), scale, offset


@triton.jit
def program_batch_head():
    """This program's b H + h = program_id(1) + program_id(2) num_programs(1): batch x heads split over the grid's
    dimensions 1 and 2 (`triton_relative.program_grid`); a program at B H or beyond (the last slice's rest) returns."""
    return tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)


@triton.jit
def program_block(heads, SCALES, BLOCK: tl.constexpr):
    """This program's first row (or key) index, b H + h (`program_batch_head`), b, h, c, 1 / (1 - p) and log2(e)
    (the scales in the accumulation dtype: a float argument would reach the kernel as float32)."""
    bh = program_batch_head()
    return (tl.program_id(0) * BLOCK, bh, bh // heads, bh % heads, tl.load(SCALES), tl.load(SCALES + 1),
            tl.load(SCALES + 2))


@triton.jit
def load_row_gradients(DO, do_base, stride_don, LSE, DELTA, row_base, rows, query_length, HEAD_DIM: tl.constexpr,
                       BLOCK_D: tl.constexpr):
    """dO [BLOCK, BLOCK_D] (rows at `do_base` + i `stride_don`), lse log2(e) and Delta (contiguous [B, H, n]) of the
    rows `rows`."""
    row_ok = rows < query_length
    return (load_rows(DO, do_base, stride_don, rows, 0, query_length, HEAD_DIM, BLOCK_D),
            tl.load(LSE + row_base + rows, mask=row_ok, other=0.0),
            tl.load(DELTA + row_base + rows, mask=row_ok, other=0.0))


@triton.jit
def shift_of(row_max):
    """What the exponentials subtract, the row max (or log-sum-exp): 0 for a row without a key (all -inf)."""
    return tl.where(row_max == float("-inf"), 0.0, row_max)


@triton.jit
def forward_tile(row_max, row_sum, acc, left, inner, right, first_col, q, K, V, T, k_base, v_base, stride_kn,
                 stride_vn, t_base, t_stride, rows, key_start, key_end, bh, seed, dropout_threshold, score_scale, log2e,
                 keep_scale, query_length, key_length, query_offset, max_distance, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_VALUES: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                 ACC: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 SIDE: tl.constexpr):
    """One key tile of the online softmax for lse_i and o_i: the row max, the row sum, o's accumulator and the
    dropped masses M by distance (`left`, `inner`, `right`, as in `add_band_sums`; a tile beyond -k (SIDE -1)
    updates `left` alone, one beyond +k (SIDE 1) `right` alone) rescaled to the new row max and updated. Under
    dropout the accumulator and the masses sum the kept probabilities; the caller scales them by 1 / (1 - p) once."""
    cols = first_col + tl.arange(0, BLOCK_N)
    k = load_rows(K, k_base, stride_kn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
    s, scale, offset = tile_scores(q, k, T, t_base, t_stride, rows, cols, key_start, key_end, query_length,
                                   query_offset, max_distance, score_scale, log2e, HAS_BIAS, CAUSAL, ACC, PRECISION,
                                   SIDE)
    new_max = tl.maximum(row_max, tl.max(s, 1) * scale + offset)
    shift = shift_of(new_max)
    p = tl.exp2(s * scale + (offset - shift)[:, None])
    rescale = tl.exp2(row_max - shift)
    row_sum = row_sum * rescale + tl.sum(p, 1)
    if DROPOUT:
        keep = dropout_keep(seed, dropout_threshold, bh, rows, first_col, query_length, key_length, BLOCK_M, BLOCK_N)
        p = tl.where(keep, p, 0.0)
    v = load_rows(V, v_base, stride_vn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
    acc = acc * rescale[:, None] + matmul(p.to(v.dtype), v, ACC, PRECISION)
    if HAS_VALUES:
        if SIDE == -1:
            left = left * rescale[:, None] + tl.sum(p, 1, keep_dims=True)
        elif SIDE == 1:
            right = right * rescale[:, None] + tl.sum(p, 1, keep_dims=True)
        else:
            left, inner, right = add_band_sums(left * rescale[:, None], inner * rescale[:, None],
                                               right * rescale[:, None], p, rows, first_col, query_offset,
                                               max_distance, BLOCK_N, BLOCK_I)
    return new_max, row_sum, acc, left, inner, right


@triton.jit(do_not_specialize=RUNTIME_INTS)
def relative_forward_kernel(
    Q, K, V, T, OUT, M, LSE, KEY_START, KEY_END, SCALES, seed, dropout_threshold,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_tb, stride_th, stride_tn, stride_ob, stride_oh, stride_on, stride_mb, stride_mh, stride_mn,
    heads, query_length, key_length, query_offset, max_distance, length_bucket, batch_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr, MASS_COLUMNS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_VALUES: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One query block of one (b, h): the online softmax over its key tiles beyond -k, beyond +k, then those that
    meet the band, with the masses M by distance kept as two edge row sums until the band tiles; M's columns from
    2k+1 to its width `MASS_COLUMNS` stored as zeros."""
    first_row, bh, b, h, scaling, keep_scale, log2e = program_block(heads, SCALES, BLOCK_M)
    if bh >= batch_heads:
        return
    rows = first_row + tl.arange(0, BLOCK_M)
    row_ok = rows < query_length
    q = load_rows(Q, head_base(b, h, stride_qb, stride_qh), stride_qn, rows, 0, query_length, HEAD_DIM, BLOCK_D)
    key_start, key_end, first, last = key_range(KEY_START, KEY_END, b, first_row, query_offset, CAUSAL, BLOCK_M,
                                                BLOCK_N)
    band_start, band_end = band_key_tiles(first_row, first, last, query_offset, max_distance, BLOCK_M, BLOCK_N)
    # the tile helpers' loop-invariant runtime arguments (a tuple assigned would turn constexprs into tensors)
    tile = (q, K, V, T, head_base(b, h, stride_kb, stride_kh), head_base(b, h, stride_vb, stride_vh), stride_kn,
            stride_vn, head_base(b, h, stride_tb, stride_th), stride_tn, rows, key_start, key_end, bh, seed,
            dropout_threshold, scaling * log2e, log2e, keep_scale, query_length, key_length, query_offset, max_distance)
    row_max = tl.full([BLOCK_M], float("-inf"), ACC)   # in base 2, as the scores
    row_sum = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    left = tl.zeros([BLOCK_M, 1], ACC)
    right = tl.zeros([BLOCK_M, 1], ACC)
    inner = tl.zeros([BLOCK_M, BLOCK_I], ACC)
    for first_col in range(first, band_start, BLOCK_N):
        row_max, row_sum, acc, left, _, _ = forward_tile(row_max, row_sum, acc, left, inner, right, first_col, *tile,
                                                         HEAD_DIM, BLOCK_D, BLOCK_I, HAS_BIAS, HAS_VALUES, CAUSAL,
                                                         DROPOUT, ACC, PRECISION, BLOCK_M, BLOCK_N, SIDE=-1)
    left_max = row_max  # `left` is relative to the row max so far
    for first_col in range(band_end, last, BLOCK_N):
        row_max, row_sum, acc, _, _, right = forward_tile(row_max, row_sum, acc, left, inner, right, first_col, *tile,
                                                          HEAD_DIM, BLOCK_D, BLOCK_I, HAS_BIAS, HAS_VALUES, CAUSAL,
                                                          DROPOUT, ACC, PRECISION, BLOCK_M, BLOCK_N, SIDE=1)
    left = left * tl.exp2(left_max - shift_of(row_max))[:, None]
    for first_col in range(band_start, band_end, BLOCK_N):
        row_max, row_sum, acc, left, inner, right = forward_tile(
            row_max, row_sum, acc, left, inner, right, first_col, *tile, HEAD_DIM, BLOCK_D, BLOCK_I, HAS_BIAS,
            HAS_VALUES, CAUSAL, DROPOUT, ACC, PRECISION, BLOCK_M, BLOCK_N, SIDE=0)
    has_key = row_sum > 0
    normalizer = tl.where(has_key, row_sum, 1.0)
    out_base = bh.to(tl.int64) * query_length
    scale = (keep_scale / normalizer)[:, None]   # the kept probabilities' sums to D's: / (1 - p) / sum_j exp
    store_rows(OUT, head_base(b, h, stride_ob, stride_oh), stride_on, rows, query_length, acc * scale, HEAD_DIM,
               BLOCK_D)
    tl.store(LSE + out_base + rows, tl.where(has_key, row_max + tl.log2(normalizer), float("-inf")), mask=row_ok)
    if HAS_VALUES:
        masses_base = head_base(b, h, stride_mb, stride_mh)
        store_by_distance(M, masses_base, stride_mn, rows, row_ok, left * scale, inner * scale, right * scale,
                          max_distance, BLOCK_I)
        store_zero_columns(M, masses_base, stride_mn, rows, row_ok, 2 * max_distance + 1, MASS_COLUMNS, BLOCK_M)


@triton.jit
def tile_gradients(q, do, k, v, T, t_base, t_stride, lse, delta, DM, m_base, m_stride, rows, cols, first_col,
                   key_start, key_end, bh, seed, dropout_threshold, score_scale, log2e, keep_scale, query_length,
                   key_length, query_offset, max_distance, HAS_BIAS: tl.constexpr, HAS_VALUES: tl.constexpr,
                   CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SIDE: tl.constexpr):
    """The kept P (D (1 - p); P without dropout) and dS = P (dP - Delta) of one tile, recomputed from its scores
    (`tile_scores`) and the row lse in base 2 (dM's rows at m_base + i m_stride; on a tile beyond -k or +k dM is one
    column, added per row with Delta)."""
    s, scale, offset = tile_scores(q, k, T, t_base, t_stride, rows, cols, key_start, key_end, query_length,
                                   query_offset, max_distance, score_scale, log2e, HAS_BIAS, CAUSAL, ACC, PRECISION,
                                   SIDE)
    p = tl.exp2(s * scale + (offset - shift_of(lse))[:, None])  # masked scores are -inf: P = 0 (rows without keys too)
    d_dropped = matmul(do, tl.trans(v), ACC, PRECISION)   # dO_i . v_j, + dM[i, r(i, j)] below
    row_term = tl.zeros_like(delta)
    if HAS_VALUES:
        if SIDE == 0:
            d_dropped += by_distance(DM, m_base, m_stride, rows, cols, query_length, query_offset, max_distance)
        else:
            row_term = edge_column(DM, m_base, m_stride, rows, query_length, max_distance, SIDE).to(delta.dtype)
    dropped = p
    if DROPOUT:   # dP - Delta = kappa (dD / (1 - p)) - Delta
        keep = dropout_keep(seed, dropout_threshold, bh, rows, first_col, query_length, key_length, BLOCK_M, BLOCK_N)
        dropped = tl.where(keep, p, 0.0)
        d_p = tl.where(keep, d_dropped * keep_scale + (row_term * keep_scale - delta)[:, None], -delta[:, None])
    else:
        d_p = d_dropped + (row_term - delta)[:, None]
    return dropped, p * d_p


@triton.jit
def backward_keys_tile(dk, dv, first_row, k, v, Q, DO, LSE, DELTA, T, DM, q_base, stride_qn, do_base, stride_don,
                       t_base, t_stride, row_base, m_base, first_col, key_start, key_end, bh, seed, dropout_threshold,
                       score_scale, log2e, keep_scale, query_length, key_length, query_offset, max_distance, m_stride,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                       HAS_BIAS: tl.constexpr, HAS_VALUES: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                       ACC: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       SIDE: tl.constexpr):
    """One query block's terms of dk_j / c = sum_i dS_ij q_i and dv_j (1 - p) = sum_i (D_ij (1 - p)) dO_i."""
    rows = first_row + tl.arange(0, BLOCK_M)
    cols = first_col + tl.arange(0, BLOCK_N)
    q = load_rows(Q, q_base, stride_qn, rows, 0, query_length, HEAD_DIM, BLOCK_D)
    do, lse, delta = load_row_gradients(DO, do_base, stride_don, LSE, DELTA, row_base, rows, query_length, HEAD_DIM,
                                        BLOCK_D)
    dropped, ds = tile_gradients(q, do, k, v, T, t_base, t_stride, lse, delta, DM, m_base, m_stride, rows, cols,
                                 first_col, key_start, key_end, bh, seed, dropout_threshold, score_scale, log2e,
                                 keep_scale, query_length, key_length, query_offset, max_distance, HAS_BIAS,
                                 HAS_VALUES, CAUSAL, DROPOUT, ACC, PRECISION, BLOCK_M, BLOCK_N, SIDE)
    dv += matmul(tl.trans(dropped.to(do.dtype)), do, ACC, PRECISION)
    dk += matmul(tl.trans(ds.to(q.dtype)), q, ACC, PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=RUNTIME_INTS)
def relative_backward_keys_kernel(
    Q, K, V, T, DO, DM, LSE, DELTA, DK, DV, KEY_START, KEY_END, SCALES, seed, dropout_threshold,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_tb, stride_th, stride_tn, stride_dob, stride_doh, stride_don, stride_dmb, stride_dmh, stride_dmn,
    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
    heads, query_length, key_length, query_offset, max_distance, length_bucket, batch_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_VALUES: tl.constexpr,
    CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dk, dv of one key block of one (b, h), over the query blocks that may attend to it: those that see its keys
    beyond +k (the first ones), beyond -k (the last ones), then those whose tile meets the band."""
    first_col, bh, b, h, scaling, keep_scale, log2e = program_block(heads, SCALES, BLOCK_N)
    if bh >= batch_heads:
        return
    cols = first_col + tl.arange(0, BLOCK_N)
    key_start = tl.load(KEY_START + b)
    key_end = tl.load(KEY_END + b)
    k = load_rows(K, head_base(b, h, stride_kb, stride_kh), stride_kn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
    v = load_rows(V, head_base(b, h, stride_vb, stride_vh), stride_vn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
    row_base = bh.to(tl.int64) * query_length
    first = 0
    if CAUSAL:
        first = tl.maximum(first_col - query_offset, 0) // BLOCK_M * BLOCK_M
    padding_only = (first_col >= key_end) | (first_col + BLOCK_N <= key_start)
    end = tl.where(padding_only, 0, query_length)  # padding only: zero gradients
    band_start, band_end = band_query_tiles(first_col, first, end, query_offset, max_distance, BLOCK_M, BLOCK_N)
    # the tile helpers' loop-invariant runtime arguments (a tuple assigned would turn constexprs into tensors)
    tile = (k, v, Q, DO, LSE, DELTA, T, DM, head_base(b, h, stride_qb, stride_qh), stride_qn,
            head_base(b, h, stride_dob, stride_doh), stride_don,
            head_base(b, h, stride_tb, stride_th), stride_tn, row_base,
            head_base(b, h, stride_dmb, stride_dmh),
            first_col, key_start, key_end, bh, seed, dropout_threshold, scaling * log2e, log2e, keep_scale,
            query_length, key_length, query_offset, max_distance, stride_dmn)
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    for first_row in range(first, band_start, BLOCK_M):
        dk, dv = backward_keys_tile(dk, dv, first_row, *tile, HEAD_DIM, BLOCK_D, HAS_BIAS, HAS_VALUES, CAUSAL,
                                    DROPOUT, ACC, PRECISION, BLOCK_M, BLOCK_N, SIDE=1)
    for first_row in range(band_end, end, BLOCK_M):
        dk, dv = backward_keys_tile(dk, dv, first_row, *tile, HEAD_DIM, BLOCK_D, HAS_BIAS, HAS_VALUES, CAUSAL,
                                    DROPOUT, ACC, PRECISION, BLOCK_M, BLOCK_N, SIDE=-1)
    for first_row in range(band_start, band_end, BLOCK_M):
        dk, dv = backward_keys_tile(dk, dv, first_row, *tile, HEAD_DIM, BLOCK_D, HAS_BIAS, HAS_VALUES, CAUSAL,
                                    DROPOUT, ACC, PRECISION, BLOCK_M, BLOCK_N, SIDE=0)
    store_rows(DK, head_base(b, h, stride_dkb, stride_dkh), stride_dkn, cols, key_length,
               dk * scaling, HEAD_DIM, BLOCK_D)
    store_rows(DV, head_base(b, h, stride_dvb, stride_dvh), stride_dvn, cols, key_length, dv * keep_scale,
               HEAD_DIM, BLOCK_D)


@triton.jit
def row_delta(do, OUT, o_base, stride_on, DM, dm_base, stride_dmn, M, m_base, stride_mn, rows, query_length,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASS_COLUMNS: tl.constexpr, HAS_VALUES: tl.constexpr,
              ACC: tl.constexpr):
    """Delta_i = dO_i . o_i + sum_r dM[i, r] M[i, r] of the rows `rows` (dO's rows loaded: `do`; zero beyond the
    query length), in the accumulation dtype."""
    output = load_rows(OUT, o_base, stride_on, rows, 0, query_length, HEAD_DIM, BLOCK_D)
    delta = tl.sum(do.to(ACC) * output.to(ACC), 1)
    if HAS_VALUES:
        for first in tl.static_range(0, MASS_COLUMNS, 16):   # 16 columns at a time: fewer live registers
            grad_masses = load_rows(DM + first, dm_base, stride_dmn, rows, 0, query_length, MASS_COLUMNS - first, 16)
            masses = load_rows(M + first, m_base, stride_mn, rows, 0, query_length, MASS_COLUMNS - first, 16)
            delta += tl.sum(grad_masses.to(ACC) * masses.to(ACC), 1)
    return delta


@triton.jit
def backward_queries_tile(dq, left, inner, right, first_col, q, do, lse, delta, K, V, T, DM, k_base, v_base, stride_kn,
                          stride_vn, t_base, t_stride, m_base, rows, key_start, key_end, bh, seed, dropout_threshold,
                          score_scale, log2e, keep_scale, query_length, key_length, query_offset, max_distance,
                          m_stride, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr,
                          HAS_BIAS: tl.constexpr, HAS_VALUES: tl.constexpr, CAUSAL: tl.constexpr,
                          DROPOUT: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, SIDE: tl.constexpr):
    """One key tile's terms of dq_i / c = sum_j dS_ij k_j and of dT's sums of dS by distance (`left`, `inner`,
    `right`, as in `add_band_sums`; SIDE -1 and 1 update `left` and `right` alone)."""
    cols = first_col + tl.arange(0, BLOCK_N)
    k = load_rows(K, k_base, stride_kn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
    v = load_rows(V, v_base, stride_vn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
    _, ds = tile_gradients(q, do, k, v, T, t_base, t_stride, lse, delta, DM, m_base, m_stride, rows, cols, first_col,
                           key_start, key_end, bh, seed, dropout_threshold, score_scale, log2e, keep_scale,
                           query_length, key_length, query_offset, max_distance, HAS_BIAS, HAS_VALUES, CAUSAL, DROPOUT,
                           ACC, PRECISION, BLOCK_M, BLOCK_N, SIDE)
    dq += matmul(ds.to(k.dtype), k, ACC, PRECISION)
    if HAS_BIAS:
        if SIDE == -1:
            left += tl.sum(ds, 1, keep_dims=True)
        elif SIDE == 1:
            right += tl.sum(ds, 1, keep_dims=True)
        else:
            left, inner, right = add_band_sums(left, inner, right, ds, rows, first_col, query_offset, max_distance,
                                               BLOCK_N, BLOCK_I)
    return dq, left, inner, right


@triton.jit(do_not_specialize=RUNTIME_INTS)
def relative_backward_queries_kernel(
    Q, K, V, T, DO, DM, OUT, M, LSE, DELTA, DQ, DT, KEY_START, KEY_END, SCALES, seed, dropout_threshold,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_tb, stride_th, stride_tn, stride_dob, stride_doh, stride_don, stride_dmb, stride_dmh, stride_dmn,
    stride_dqb, stride_dqh, stride_dqn, stride_dtb, stride_dth, stride_dtn, stride_ob, stride_oh, stride_on,
    stride_mb, stride_mh, stride_mn,
    heads, query_length, key_length, query_offset, max_distance, length_bucket, batch_heads, table_columns,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr, MASS_COLUMNS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_VALUES: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dq and the bias table's gradient dT (per-row, per-distance sums of dS) of one query block of one (b, h), over
    its key tiles beyond -k, beyond +k, then those that meet the band (dT kept as two edge row sums until then);
    first its rows' Delta (`row_delta`, from o and the masses M of width `MASS_COLUMNS`), stored into DELTA
    (contiguous [B, H, n]) for the dk/dv kernel that runs after it. dT is as wide as T (`table_columns`), zero
    beyond 2k+1."""
    first_row, bh, b, h, scaling, keep_scale, log2e = program_block(heads, SCALES, BLOCK_M)
    if bh >= batch_heads:
        return
    rows = first_row + tl.arange(0, BLOCK_M)
    row_ok = rows < query_length
    row_base = bh.to(tl.int64) * query_length
    do = load_rows(DO, head_base(b, h, stride_dob, stride_doh), stride_don, rows, 0, query_length, HEAD_DIM, BLOCK_D)
    delta = row_delta(do, OUT, head_base(b, h, stride_ob, stride_oh), stride_on, DM,
                      head_base(b, h, stride_dmb, stride_dmh), stride_dmn, M, head_base(b, h, stride_mb, stride_mh),
                      stride_mn, rows, query_length, HEAD_DIM, BLOCK_D, MASS_COLUMNS, HAS_VALUES, ACC)
    tl.store(DELTA + row_base + rows, delta, mask=row_ok)
    q = load_rows(Q, head_base(b, h, stride_qb, stride_qh), stride_qn, rows, 0, query_length, HEAD_DIM, BLOCK_D)
    lse = tl.load(LSE + row_base + rows, mask=row_ok, other=0.0)
    key_start, key_end, first, last = key_range(KEY_START, KEY_END, b, first_row, query_offset, CAUSAL, BLOCK_M,
                                                BLOCK_N)
    band_start, band_end = band_key_tiles(first_row, first, last, query_offset, max_distance, BLOCK_M, BLOCK_N)
    # the tile helpers' loop-invariant runtime arguments (a tuple assigned would turn constexprs into tensors)
    tile = (q, do, lse, delta, K, V, T, DM, head_base(b, h, stride_kb, stride_kh),
            head_base(b, h, stride_vb, stride_vh), stride_kn, stride_vn, head_base(b, h, stride_tb, stride_th),
            stride_tn,
            head_base(b, h, stride_dmb, stride_dmh), rows, key_start, key_end, bh, seed, dropout_threshold,
            scaling * log2e, log2e, keep_scale, query_length, key_length, query_offset, max_distance, stride_dmn)
    dq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    left = tl.zeros([BLOCK_M, 1], ACC)
    right = tl.zeros([BLOCK_M, 1], ACC)
    inner = tl.zeros([BLOCK_M, BLOCK_I], ACC)
    for first_col in range(first, band_start, BLOCK_N):
        dq, left, _, _ = backward_queries_tile(dq, left, inner, right, first_col, *tile, HEAD_DIM, BLOCK_D, BLOCK_I,
                                               HAS_BIAS, HAS_VALUES, CAUSAL, DROPOUT, ACC, PRECISION, BLOCK_M, BLOCK_N,
                                               SIDE=-1)
    for first_col in range(band_end, last, BLOCK_N):
        dq, _, _, right = backward_queries_tile(dq, left, inner, right, first_col, *tile, HEAD_DIM, BLOCK_D, BLOCK_I,
                                                HAS_BIAS, HAS_VALUES, CAUSAL, DROPOUT, ACC, PRECISION, BLOCK_M,
                                                BLOCK_N, SIDE=1)
    for first_col in range(band_start, band_end, BLOCK_N):
        dq, left, inner, right = backward_queries_tile(dq, left, inner, right, first_col, *tile, HEAD_DIM, BLOCK_D,
                                                       BLOCK_I, HAS_BIAS, HAS_VALUES, CAUSAL, DROPOUT, ACC, PRECISION,
                                                       BLOCK_M, BLOCK_N, SIDE=0)
    store_rows(DQ, head_base(b, h, stride_dqb, stride_dqh), stride_dqn, rows, query_length,
               dq * scaling, HEAD_DIM, BLOCK_D)
    if HAS_BIAS:
        table_base = head_base(b, h, stride_dtb, stride_dth)
        store_by_distance(DT, table_base, stride_dtn, rows, row_ok, left, inner, right, max_distance, BLOCK_I)
        store_zero_columns(DT, table_base, stride_dtn, rows, row_ok, 2 * max_distance + 1, table_columns, BLOCK_M)


@triton.jit(do_not_specialize=["seed", "dropout_threshold"])   # a threshold of 1 would become a constant
def dropout_keep_kernel(KEEP, seed, dropout_threshold, query_length, key_length, batch_heads, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    """KEEP[bh, i, j] = kappa_ij, the mask the attention kernels apply (for tests and debugging): one tile per
    program, tiles numbered in dimension 0 with the row blocks fastest."""
    bh = program_batch_head()
    if bh >= batch_heads:
        return
    row_blocks = tl.cdiv(query_length, BLOCK_M)
    rows = tl.program_id(0) % row_blocks * BLOCK_M + tl.arange(0, BLOCK_M)
    first_col = tl.program_id(0) // row_blocks * BLOCK_N
    cols = first_col + tl.arange(0, BLOCK_N)
    keep = dropout_keep(seed, dropout_threshold, bh, rows, first_col, query_length, key_length, BLOCK_M, BLOCK_N)
    tl.store(KEEP + (bh.to(tl.int64) * query_length + rows[:, None]) * key_length + cols[None, :], keep.to(tl.int8),
             mask=(rows < query_length)[:, None] & (cols < key_length)[None, :])


def block_configs(candidates: Sequence[tuple[int, int, int, int]] = BLOCK_CONFIGS) -> list[triton.Config]:
    """triton.Config of each (BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    return [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages)
            for block_m, block_n, warps, stages in candidates]


def autotuned(kernel: triton.JITFunction, key: list[str]) -> triton.runtime.Autotuner:
    """`kernel` autotuned over `BLOCK_CONFIGS`, keyed on the compile-time flags and the length bucket: lengths are
    runtime ints, so a new shape never recompiles, and retunes (benchmarks the compiled blocks again) only in a new
    power-of-two length bucket."""
    return triton.autotune(block_configs(), key=key)(kernel)


TUNING_KEY = ["HEAD_DIM", "HAS_BIAS", "HAS_VALUES", "CAUSAL", "DROPOUT", "ACC", "length_bucket"]
tuned_forward = autotuned(relative_forward_kernel, TUNING_KEY + ["BLOCK_I"])
tuned_backward_keys = autotuned(relative_backward_keys_kernel, TUNING_KEY)
tuned_backward_queries = autotuned(relative_backward_queries_kernel, TUNING_KEY + ["BLOCK_I"])
