"""Triton kernels of `triton_relative.py`: FlashAttention-2-style forward and backward of relative self-attention
whose score bias and value term depend on the clipped distance r(i, j) = clip(j - i - query_offset, k) + k.

Per batch entry b and head h, queries i < n, keys j in [key_start_b, key_end_b) (and j <= i + query_offset when
causal), scale c, per-row bias table T [n, 2k+1] (Shaw's q_i . a^K_r c), Philox keep mask kappa_ij, drop rate p:

    s_ij = c q_i . k_j + T[i, r(i, j)]               lse_i = log sum_j exp(s_ij)
    P_ij = exp(s_ij - lse_i)                          D_ij = P_ij kappa_ij / (1 - p)
    o_i = sum_j D_ij v_j                              M[i, r] = sum_{j: r(i, j) = r} D_ij

(the value term o_i + sum_r M[i, r] a^V_r is one small matmul outside). Backward, given dO and dM:

    dD_ij = dO_i . v_j + dM[i, r(i, j)]               dP_ij = dD_ij kappa_ij / (1 - p)
    Delta_i = dO_i . o_i + sum_r dM[i, r] M[i, r]     dS_ij = P_ij (dP_ij - Delta_i)
    dq_i = c sum_j dS_ij k_j    dk_j = c sum_i dS_ij q_i    dv_j = sum_i D_ij dO_i    dT[i, r] = sum_{r(i,j)=r} dS_ij

The dk/dv kernel loops over query blocks per key block, the dq/dT kernel over key blocks per query block: every
program writes only its own rows (no atomics; the backward is deterministic). Key tiles entirely beyond +-k put a
row sum into an edge bucket; only the tiles that meet the band sum per distance. Imported only when
attn_implementation "relpos_triton" runs.
"""

from __future__ import annotations

from transformers.utils.import_utils import is_triton_available

if is_triton_available():  # (transformers' remote-code import check skips imports under this test)
    import triton
    import triton.language as tl
else:
    raise ImportError("attn_implementation 'relpos_triton' needs triton: pip install triton (or hf_relpos[triton])")

# Lengths, offsets and seeds change from call to call: not specialised on (one compile per flag set, not per shape).
RUNTIME_INTS = ["seed", "heads", "query_length", "key_length", "query_offset", "max_distance"]


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
def dropout_keep(seed, dropout_p, bh, rows, first_col, query_length, key_length, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """kappa_ij of a tile whose first key `first_col` is a multiple of 4: Philox uniform >= p, the same in forward
    and backward. One Philox call gives four uniforms: the counter ((b H + h) n + i) ceil(m / 4) + j // 4 gives keys
    4 (j // 4) .. 4 (j // 4) + 3 of row i, in order."""
    groups = first_col // 4 + tl.arange(0, BLOCK_N // 4)
    offsets = (bh.to(tl.int64) * query_length + rows[:, None]) * ((key_length + 3) // 4) + groups[None, :]
    u0, u1, u2, u3 = tl.rand4x(seed, offsets)
    uniform = tl.reshape(tl.join(tl.join(u0, u1), tl.join(u2, u3)), [BLOCK_M, BLOCK_N])
    return uniform >= dropout_p


@triton.jit
def tile_side(first_row, first_col, query_offset, max_distance, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """-1 for a tile whose keys are all at distance <= -k from its queries (bucket 0), 1 for all >= k (bucket 2k),
    0 for a tile that meets the band."""
    left = first_col + BLOCK_N - 1 - first_row - query_offset <= -max_distance
    right = first_col - (first_row + BLOCK_M - 1) - query_offset >= max_distance
    return tl.where(right, 1, 0) - tl.where(left, 1, 0)


@triton.jit
def add_distance_sums(sums, x, bucket, first_row, first_col, query_offset, max_distance,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    """sums[i, r] + sum_{j in tile: r(i, j) = r} x_ij: one row sum into an edge bucket for a tile beyond +-k; for a
    tile that meets the band, two masked row sums for the edges and, for the 2k - 1 distances inside, the one entry
    per row on each diagonal j = i' + r - k, gathered (O(tile) work, not O(k tile))."""
    distances = tl.arange(0, BLOCK_R)[None, :]
    side = tile_side(first_row, first_col, query_offset, max_distance, BLOCK_M, BLOCK_N)
    if side == -1:
        sums += tl.where(distances == 0, tl.sum(x, 1)[:, None], 0.0)
    elif side == 1:
        sums += tl.where(distances == 2 * max_distance, tl.sum(x, 1)[:, None], 0.0)
    else:
        left = tl.sum(tl.where(bucket == 0, x, 0.0), 1)
        right = tl.sum(tl.where((bucket == 2 * max_distance) & (bucket > 0), x, 0.0), 1)  # k = 0: all in bucket 0
        column = tl.arange(0, BLOCK_M)[:, None] + (first_row + query_offset - max_distance - first_col) + distances
        inside = (distances > 0) & (distances < 2 * max_distance) & (column >= 0) & (column < BLOCK_N)
        diagonal = tl.gather(x, tl.where(inside, column, 0), axis=1)
        sums += (tl.where(inside, diagonal, 0.0) + tl.where(distances == 0, left[:, None], 0.0)
                 + tl.where(distances == 2 * max_distance, right[:, None], 0.0))
    return sums


@triton.jit
def add_by_distance(x, TABLE, t_base, rows, row_ok, bucket, first_row, first_col, query_offset, max_distance, R,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """x_ij + TABLE[i, r(i, j)] for a tile: a tile beyond +-k reads one column of the [n, 2k+1] table per row; only a
    tile that meets the band gathers by distance."""
    side = tile_side(first_row, first_col, query_offset, max_distance, BLOCK_M, BLOCK_N)
    if side == 0:
        x += tl.load(TABLE + t_base + rows[:, None] * R + bucket, mask=row_ok[:, None], other=0.0).to(x.dtype)
    else:
        edge = tl.where(side == 1, 2 * max_distance, 0)
        x += tl.load(TABLE + t_base + rows * R + edge, mask=row_ok, other=0.0).to(x.dtype)[:, None]
    return x


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
def load_rows(X, base, stride, rows, first, end, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows [BLOCK, BLOCK_D] of a [.., d] tensor, zero outside [first, end) and beyond the head size."""
    dims = tl.arange(0, BLOCK_D)
    return tl.load(X + base + rows[:, None] * stride + dims[None, :],
                   mask=((rows >= first) & (rows < end))[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def store_rows(X, base, rows, end, value, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows `rows` < `end` of a contiguous [.., d] tensor from `value` [BLOCK, BLOCK_D]."""
    dims = tl.arange(0, BLOCK_D)
    tl.store(X + base + rows[:, None] * HEAD_DIM + dims[None, :], value.to(X.dtype.element_ty),
             mask=(rows < end)[:, None] & (dims[None, :] < HEAD_DIM))


@triton.jit
def tile_scores(q, k, T, t_base, first_row, first_col, key_start, key_end, query_offset, max_distance, scaling, R,
                query_length, HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The masked scores s of a tile (-inf where not allowed), its buckets and its mask."""
    rows = first_row + tl.arange(0, BLOCK_M)
    cols = first_col + tl.arange(0, BLOCK_N)
    row_ok = rows < query_length
    col_ok = (cols >= key_start) & (cols < key_end)
    s = matmul(q, tl.trans(k), ACC, PRECISION) * scaling
    bucket = clipped_bucket(rows, cols, query_offset, max_distance)
    if HAS_BIAS:
        s = add_by_distance(s, T, t_base, rows, row_ok, bucket, first_row, first_col, query_offset, max_distance, R,
                            BLOCK_M, BLOCK_N)
    allowed = row_ok[:, None] & col_ok[None, :]
    if CAUSAL:
        allowed = allowed & (cols[None, :] <= rows[:, None] + query_offset)
    return tl.where(allowed, s, float("-inf")), bucket, allowed


@triton.jit
def program_block(heads, max_distance, SCALES, BLOCK: tl.constexpr):
    """This program's first row (or key) index, b H + h, b, h, 2k + 1, c and 1 / (1 - p) (the scales in the
    accumulation dtype: a float argument would reach the kernel as float32)."""
    bh = tl.program_id(1)
    return (tl.program_id(0) * BLOCK, bh, bh // heads, bh % heads, 2 * max_distance + 1, tl.load(SCALES),
            tl.load(SCALES + 1))


@triton.jit
def load_row_gradients(DO, LSE, DELTA, row_base, rows, query_length, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """dO [BLOCK, BLOCK_D], lse and Delta of the rows `rows` (contiguous [B, H, n, d] and [B, H, n])."""
    row_ok = rows < query_length
    return (load_rows(DO, row_base * HEAD_DIM, HEAD_DIM, rows, 0, query_length, HEAD_DIM, BLOCK_D),
            tl.load(LSE + row_base + rows, mask=row_ok, other=0.0), tl.load(DELTA + row_base + rows, mask=row_ok, other=0.0))


@triton.jit(do_not_specialize=RUNTIME_INTS)
def relative_forward_kernel(
    Q, K, V, T, OUT, M, LSE, KEY_START, KEY_END, SCALES, seed, dropout_p,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    heads, query_length, key_length, query_offset, max_distance,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_VALUES: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One query block of one (b, h): the online softmax over its key tiles, with the per-distance masses."""
    first_row, bh, b, h, R, scaling, keep_scale = program_block(heads, max_distance, SCALES, BLOCK_M)
    rows = first_row + tl.arange(0, BLOCK_M)
    row_ok = rows < query_length
    q = load_rows(Q, b * stride_qb + h * stride_qh, stride_qn, rows, 0, query_length, HEAD_DIM, BLOCK_D)
    k_base = b * stride_kb + h * stride_kh
    v_base = b * stride_vb + h * stride_vh
    t_base = bh.to(tl.int64) * query_length * R
    key_start, key_end, first, last = key_range(KEY_START, KEY_END, b, first_row, query_offset, CAUSAL, BLOCK_M,
                                                BLOCK_N)
    row_max = tl.full([BLOCK_M], float("-inf"), ACC)
    row_sum = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    masses = tl.zeros([BLOCK_M, BLOCK_R], ACC)
    for first_col in range(first, last, BLOCK_N):
        cols = first_col + tl.arange(0, BLOCK_N)
        k = load_rows(K, k_base, stride_kn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
        s, bucket, allowed = tile_scores(q, k, T, t_base, first_row, first_col, key_start, key_end,
                                         query_offset, max_distance, scaling, R, query_length, HAS_BIAS, CAUSAL, ACC,
                                         PRECISION, BLOCK_M, BLOCK_N)
        new_max = tl.maximum(row_max, tl.max(s, 1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.exp(s - shift[:, None])
        rescale = tl.exp(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(p, 1)
        if DROPOUT:
            keep = dropout_keep(seed, dropout_p, bh, rows, first_col, query_length, key_length, BLOCK_M, BLOCK_N)
            p = tl.where(keep, p * keep_scale, 0.0)
        v = load_rows(V, v_base, stride_vn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
        acc = acc * rescale[:, None] + matmul(p.to(v.dtype), v, ACC, PRECISION)
        if HAS_VALUES:
            masses = add_distance_sums(masses * rescale[:, None], p, bucket, first_row, first_col, query_offset,
                                       max_distance, BLOCK_M, BLOCK_N, BLOCK_R)
        row_max = new_max
    has_key = row_sum > 0
    normalizer = tl.where(has_key, row_sum, 1.0)
    out_base = bh.to(tl.int64) * query_length
    store_rows(OUT, out_base * HEAD_DIM, rows, query_length, acc / normalizer[:, None], HEAD_DIM, BLOCK_D)
    tl.store(LSE + out_base + rows, tl.where(has_key, row_max + tl.log(normalizer), float("-inf")), mask=row_ok)
    if HAS_VALUES:
        distances = tl.arange(0, BLOCK_R)
        tl.store(M + (out_base + rows[:, None]) * R + distances[None, :],
                 (masses / normalizer[:, None]).to(M.dtype.element_ty), mask=row_ok[:, None] & (distances[None, :] < R))


@triton.jit
def tile_gradients(q, do, k, v, s, bucket, allowed, lse, delta, DM, t_base, rows, row_ok, first_row, first_col, bh,
                   seed, dropout_p, keep_scale, query_length, key_length, query_offset, max_distance, R,
                   HAS_VALUES: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """P, the dropped D and dS = P (dP - Delta) of one tile, recomputed from the scores and the row lse."""
    p = tl.where(allowed, tl.exp(s - tl.where(lse == float("-inf"), 0.0, lse)[:, None]), 0.0)  # no key: P = 0
    d_dropped = matmul(do, tl.trans(v), ACC, PRECISION)
    if HAS_VALUES:
        d_dropped = add_by_distance(d_dropped, DM, t_base, rows, row_ok, bucket, first_row, first_col, query_offset,
                                    max_distance, R, BLOCK_M, BLOCK_N)
    dropped = p
    d_p = d_dropped
    if DROPOUT:
        keep = dropout_keep(seed, dropout_p, bh, rows, first_col, query_length, key_length, BLOCK_M, BLOCK_N)
        dropped = tl.where(keep, p * keep_scale, 0.0)
        d_p = tl.where(keep, d_dropped * keep_scale, 0.0)
    return dropped, p * (d_p - delta[:, None])


@triton.jit(do_not_specialize=RUNTIME_INTS)
def relative_backward_keys_kernel(
    Q, K, V, T, DO, DM, LSE, DELTA, DK, DV, KEY_START, KEY_END, SCALES, seed, dropout_p,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    heads, query_length, key_length, query_offset, max_distance,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_VALUES: tl.constexpr,
    CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dk, dv of one key block of one (b, h), over the query blocks that may attend to it."""
    first_col, bh, b, h, R, scaling, keep_scale = program_block(heads, max_distance, SCALES, BLOCK_N)
    cols = first_col + tl.arange(0, BLOCK_N)
    key_start = tl.load(KEY_START + b)
    key_end = tl.load(KEY_END + b)
    k = load_rows(K, b * stride_kb + h * stride_kh, stride_kn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
    v = load_rows(V, b * stride_vb + h * stride_vh, stride_vn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
    t_base = bh.to(tl.int64) * query_length * R
    row_base = bh.to(tl.int64) * query_length
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    first = 0
    if CAUSAL:
        first = tl.maximum(first_col - query_offset, 0) // BLOCK_M * BLOCK_M
    padding_only = (first_col >= key_end) | (first_col + BLOCK_N <= key_start)
    for first_row in range(first, tl.where(padding_only, 0, query_length), BLOCK_M):  # padding only: zero gradients
        rows = first_row + tl.arange(0, BLOCK_M)
        row_ok = rows < query_length
        q = load_rows(Q, b * stride_qb + h * stride_qh, stride_qn, rows, 0, query_length, HEAD_DIM, BLOCK_D)
        do, lse, delta = load_row_gradients(DO, LSE, DELTA, row_base, rows, query_length, HEAD_DIM, BLOCK_D)
        s, bucket, allowed = tile_scores(q, k, T, t_base, first_row, first_col, key_start, key_end,
                                         query_offset, max_distance, scaling, R, query_length, HAS_BIAS, CAUSAL, ACC,
                                         PRECISION, BLOCK_M, BLOCK_N)
        dropped, ds = tile_gradients(q, do, k, v, s, bucket, allowed, lse, delta, DM, t_base, rows, row_ok,
                                     first_row, first_col, bh, seed, dropout_p, keep_scale, query_length, key_length,
                                     query_offset, max_distance, R, HAS_VALUES, DROPOUT, ACC, PRECISION, BLOCK_M,
                                     BLOCK_N)
        dv += matmul(tl.trans(dropped.to(do.dtype)), do, ACC, PRECISION)
        dk += matmul(tl.trans(ds.to(q.dtype)), q, ACC, PRECISION)
    out_base = bh.to(tl.int64) * key_length * HEAD_DIM
    store_rows(DK, out_base, cols, key_length, dk * scaling, HEAD_DIM, BLOCK_D)
    store_rows(DV, out_base, cols, key_length, dv, HEAD_DIM, BLOCK_D)


@triton.jit(do_not_specialize=RUNTIME_INTS)
def relative_backward_queries_kernel(
    Q, K, V, T, DO, DM, LSE, DELTA, DQ, DT, KEY_START, KEY_END, SCALES, seed, dropout_p,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    heads, query_length, key_length, query_offset, max_distance,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_VALUES: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dq and the bias table's gradient dT (per-row, per-distance sums of dS) of one query block of one (b, h)."""
    first_row, bh, b, h, R, scaling, keep_scale = program_block(heads, max_distance, SCALES, BLOCK_M)
    rows = first_row + tl.arange(0, BLOCK_M)
    row_ok = rows < query_length
    row_base = bh.to(tl.int64) * query_length
    q = load_rows(Q, b * stride_qb + h * stride_qh, stride_qn, rows, 0, query_length, HEAD_DIM, BLOCK_D)
    do, lse, delta = load_row_gradients(DO, LSE, DELTA, row_base, rows, query_length, HEAD_DIM, BLOCK_D)
    k_base = b * stride_kb + h * stride_kh
    v_base = b * stride_vb + h * stride_vh
    t_base = row_base * R
    key_start, key_end, first, last = key_range(KEY_START, KEY_END, b, first_row, query_offset, CAUSAL, BLOCK_M,
                                                BLOCK_N)
    dq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    d_table = tl.zeros([BLOCK_M, BLOCK_R], ACC)
    for first_col in range(first, last, BLOCK_N):
        cols = first_col + tl.arange(0, BLOCK_N)
        k = load_rows(K, k_base, stride_kn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
        v = load_rows(V, v_base, stride_vn, cols, key_start, key_end, HEAD_DIM, BLOCK_D)
        s, bucket, allowed = tile_scores(q, k, T, t_base, first_row, first_col, key_start, key_end,
                                         query_offset, max_distance, scaling, R, query_length, HAS_BIAS, CAUSAL, ACC,
                                         PRECISION, BLOCK_M, BLOCK_N)
        _, ds = tile_gradients(q, do, k, v, s, bucket, allowed, lse, delta, DM, t_base, rows, row_ok, first_row,
                               first_col, bh, seed, dropout_p, keep_scale, query_length, key_length, query_offset,
                               max_distance, R, HAS_VALUES, DROPOUT, ACC, PRECISION, BLOCK_M, BLOCK_N)
        dq += matmul(ds.to(k.dtype), k, ACC, PRECISION)
        if HAS_BIAS:
            d_table = add_distance_sums(d_table, ds, bucket, first_row, first_col, query_offset, max_distance,
                                        BLOCK_M, BLOCK_N, BLOCK_R)
    store_rows(DQ, row_base * HEAD_DIM, rows, query_length, dq * scaling, HEAD_DIM, BLOCK_D)
    if HAS_BIAS:
        distances = tl.arange(0, BLOCK_R)
        tl.store(DT + (row_base + rows[:, None]) * R + distances[None, :], d_table.to(DT.dtype.element_ty),
                 mask=row_ok[:, None] & (distances[None, :] < R))


@triton.jit
def dropout_keep_kernel(KEEP, seed, dropout_p, query_length, key_length, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    """KEEP[bh, i, j] = kappa_ij, the mask the attention kernels apply (for tests and debugging)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    first_col = tl.program_id(1) * BLOCK_N
    cols = first_col + tl.arange(0, BLOCK_N)
    bh = tl.program_id(2)
    keep = dropout_keep(seed, dropout_p, bh, rows, first_col, query_length, key_length, BLOCK_M, BLOCK_N)
    tl.store(KEEP + (bh.to(tl.int64) * query_length + rows[:, None]) * key_length + cols[None, :], keep.to(tl.int8),
             mask=(rows < query_length)[:, None] & (cols < key_length)[None, :])


def autotuned(kernel, key: list[str]):
    """`kernel` autotuned over block sizes that fit an H100's and an H200's shared memory (228 KB per SM), keyed on
    the compile-time flags only: lengths are runtime ints, so a new shape neither retunes nor recompiles."""
    configs = [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages)
               for block_m, block_n, warps, stages in ((64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 4, 2),
                                                       (32, 64, 4, 2))]
    return triton.autotune(configs, key=key)(kernel)


TUNING_KEY = ["HEAD_DIM", "HAS_BIAS", "HAS_VALUES", "CAUSAL", "DROPOUT", "ACC"]
tuned_forward = autotuned(relative_forward_kernel, TUNING_KEY + ["BLOCK_R"])
tuned_backward_keys = autotuned(relative_backward_keys_kernel, TUNING_KEY)
tuned_backward_queries = autotuned(relative_backward_queries_kernel, TUNING_KEY + ["BLOCK_R"])
