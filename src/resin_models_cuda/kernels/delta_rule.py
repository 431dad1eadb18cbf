# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""The gated delta rule of Gated DeltaNet layers (Qwen3.5), recurrent form, one launch for a
whole step: prefill chunks and decode rows alike.

Per value head h, with the float32 state S [K, V] (for every token t of a row, in order):
    q, k = l2norm(q_t) * K^-0.5, l2norm(k_t)      (key head h // (HV / HK), as transformers'
                                                   repeat_interleave shares it)
    g = -exp(A_log[h]) * softplus(a_t[h] + dt_bias[h]);  beta = sigmoid(b_t[h])
    S <- S * exp(g);  S <- S + k (beta (v_t - S^T k))^T;  o_t = S^T q

The row starts from its input checkpoint (`state_in[row]`, a page of the State region; -1:
zeros) and the state after its last token goes to `state_out[row]` (-1: nowhere, CUDA-graph
padding); the states after the row's first `ckpt_len[c]` tokens go to `ckpt_page[c]` for the
row's checkpoints `ckpt_indptr[row] .. ckpt_indptr[row + 1]` (prefix caching). A program owns
one (row, head, value block) tile of the state from the first read to the last write, so a
checkpoint read and written in place (`state_in == state_out`) is safe.

`chunk` > 0 (16, 32 or 64) picks the chunked form: the same result `chunk` tokens at a time
through a unit-triangular system per chunk, all of it matrix products, in two launches.
`_chunk_prep_kernel` (one program a chunk and head, every chunk of the step at once) solves
each chunk's system (its inverse: 16 x 16 diagonal blocks by forward substitution, 15 serial
products, then a short series; `_unit_lower_inverse`) and writes what does not depend on the
state entering the chunk, the decayed q and k included; `_chunk_scan_kernel` (one program a
row, head and value block) carries the state through the row's chunks with loads and four
products a chunk, its serial path. Products at `chunk_precision` (TF32 for 16-bit inputs,
float32 for float32).

`kda_delta_rule` is KDA's (GLM-5.3) form on the same kernels (`PER_CHANNEL`): q and k heads
are the value heads, the log decay `g` [T, HV, K] comes precomputed in float32 (one per key
channel: `S <- S * exp(g)[:, None]`) and beta is sigmoid(b). Its chunked form keeps every
per-channel decay factor relative, exp(G_i - G_j) with j <= i, so none overflows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter
from resin_models_cuda.step import StateRows


# A scalar condition enters a mask as a bound (`x < where(cond, n, 0)`): the interpreter
# cannot AND a scalar into a block mask.
@triton.jit
def _load_state(state_ptr, page, stride_p, head, kk, vv, K: tl.constexpr, V: tl.constexpr):
    base = state_ptr + tl.maximum(page, 0).to(tl.int64) * stride_p + head * K * V
    mask = (kk[:, None] < K) & (vv[None, :] < tl.where(page >= 0, V, 0))
    return tl.load(base + kk[:, None] * V + vv[None, :], mask=mask, other=0.0)


@triton.jit
def _store_state(state_ptr, page, stride_p, head, kk, vv, s, K: tl.constexpr, V: tl.constexpr):
    base = state_ptr + tl.maximum(page, 0).to(tl.int64) * stride_p + head * K * V
    mask = (kk[:, None] < K) & (vv[None, :] < tl.where(page >= 0, V, 0))
    tl.store(base + kk[:, None] * V + vv[None, :], s, mask=mask)


@triton.jit
def _next_len(ckpt_len_ptr, ck, ck_end, last_ckpt):
    """Tokens covered by checkpoint `ck` of the row, or -1 past the row's last."""
    length = tl.load(ckpt_len_ptr + tl.minimum(ck, last_ckpt))
    return tl.where(ck < ck_end, length, -1)


@triton.jit(do_not_specialize=["last_ckpt"])
def _delta_rule_kernel(
    mixed_ptr,  # [T, 2 * HK * K + HV * V]: q | k | v per token (conv output), row stride_m
    a_ptr,  # [T, HV], row stride stride_a: decay input (PER_CHANNEL: float32 [T, HV, K])
    b_ptr,  # [T, HV], row stride stride_b: beta input
    a_log_ptr,  # [HV]
    dt_bias_ptr,  # [HV]
    out_ptr,  # [T, HV, V] contiguous, the model dtype
    state_ptr,  # float32 [pages, HV, K, V], page stride stride_p (this layer's view)
    query_indptr_ptr,  # int32 [B + 1]
    state_in_ptr,  # int32 [B]
    state_out_ptr,  # int32 [B]
    ckpt_indptr_ptr,  # int32 [B + 1]
    ckpt_len_ptr,  # int32 [C]
    ckpt_page_ptr,  # int32 [C]
    stride_m,
    stride_a,
    stride_b,
    stride_p,
    last_ckpt,  # C - 1
    scale,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PDL: tl.constexpr,
    PER_CHANNEL: tl.constexpr = False,
):
    pdl_enter(PDL)
    row = tl.program_id(0)
    head = tl.program_id(1)
    kh = head // (HV // HK)
    kk = tl.arange(0, K)
    vv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = vv < V
    start = tl.load(query_indptr_ptr + row)
    end = tl.load(query_indptr_ptr + row + 1)
    s = _load_state(state_ptr, tl.load(state_in_ptr + row), stride_p, head, kk, vv, K, V)
    neg_a = -tl.exp(tl.load(a_log_ptr + head).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + head).to(tl.float32)
    ck = tl.load(ckpt_indptr_ptr + row)
    ck_end = tl.load(ckpt_indptr_ptr + row + 1)
    next_len = _next_len(ckpt_len_ptr, ck, ck_end, last_ckpt)
    for t in range(start, end):
        token = mixed_ptr + t * stride_m
        q = tl.load(token + kh * K + kk).to(tl.float32)
        k = tl.load(token + HK * K + kh * K + kk).to(tl.float32)
        v = tl.load(token + 2 * HK * K + head * V + vv, mask=vmask, other=0.0).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * scale
        k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
        beta = tl.sigmoid(tl.load(b_ptr + t * stride_b + head).to(tl.float32))
        if PER_CHANNEL:
            g = tl.load(a_ptr + t * stride_a + head * K + kk)
            s = s * tl.exp(g)[:, None]
        else:
            a = tl.load(a_ptr + t * stride_a + head).to(tl.float32) + dt_bias
            softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(a)))
            s = s * tl.exp(neg_a * softplus)
        correction = (v - tl.sum(k[:, None] * s, 0)) * beta
        s = s + k[:, None] * correction[None, :]
        o = tl.sum(q[:, None] * s, 0)
        dst = out_ptr + (t * HV + head) * V + vv
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=vmask)
        if t - start + 1 == next_len:
            page = tl.load(ckpt_page_ptr + ck)
            _store_state(state_ptr, page, stride_p, head, kk, vv, s, K, V)
            ck += 1
            next_len = _next_len(ckpt_len_ptr, ck, ck_end, last_ckpt)
    _store_state(state_ptr, tl.load(state_out_ptr + row), stride_p, head, kk, vv, s, K, V)


def gated_delta_rule(
    mixed: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    rows: StateRows,
    num_k_heads: int,
    out: torch.Tensor | None = None,
    chunk: int = 0,
    precision: str | None = None,
    block_v: int = 0,
) -> torch.Tensor:
    """o [T, HV, V] (mixed's dtype) of the rows `rows` describes; `mixed` [T, 2*HK*K + HV*V]
    (q | k | v, rows contiguous), `a` / `b` [T, HV] (rows may be strided), `a_log` /
    `dt_bias` [HV], `state` float32 [pages, HV, K, V] (this layer's view of the State
    region; page stride free). Reads each row's input checkpoint and writes its output and
    checkpoint pages in place (module docstring). `chunk` > 0 (16, 32 or 64): the chunked
    form, `chunk` tokens a step (prefill), its products at `precision` (None:
    `chunk_precision`), its scan `block_v` value columns a program (0: 32)."""
    _, heads, k_dim, v_dim = state.shape
    t = mixed.shape[0]
    assert state.dtype == torch.float32 and state.stride()[1:] == (k_dim * v_dim, v_dim, 1)
    assert k_dim == next_pow2(k_dim), "the key head dim must be a power of two"
    assert mixed.stride(1) == 1 and mixed.shape[1] == 2 * num_k_heads * k_dim + heads * v_dim
    assert heads % num_k_heads == 0
    for x in (a, b):
        assert x.shape == (t, heads) and x.stride(1) == 1
    assert a_log.shape == (heads,) and dt_bias.shape == (heads,)
    rows.check()
    if out is None:
        out = torch.empty((t, heads, v_dim), dtype=mixed.dtype, device=mixed.device)
    assert out.shape == (t, heads, v_dim) and out.is_contiguous()
    assert max(t * mixed.stride(0), out.numel()) < 2**31, "token offsets are int32"
    batch = rows.state_in.shape[0]
    if batch and chunk:
        assert chunk in (16, 32, 64) and k_dim >= 16
        _chunked(mixed, a, b, a_log, dt_bias, out, state, rows, num_k_heads, chunk,
                 per_channel=False, block_v=block_v, precision=precision)  # fmt: skip
    elif batch:
        block_v = min(next_pow2(v_dim), 32)
        grid = (batch, heads, triton.cdiv(v_dim, block_v))
        _delta_rule_kernel[grid](
            mixed, a, b, a_log, dt_bias, out, state, rows.query_indptr, rows.state_in,
            rows.state_out, rows.ckpt_indptr, rows.ckpt_len, rows.ckpt_page,
            mixed.stride(0), a.stride(0), b.stride(0), state.stride(0), rows.ckpt_len.shape[0] - 1,
            k_dim**-0.5, HK=num_k_heads, HV=heads, K=k_dim, V=v_dim, BLOCK_V=block_v,
            num_warps=4, **pdl_args(),
        )  # fmt: skip
    return out


@triton.jit
def _unit_lower_inverse(system, ii, jj, CHUNK: tl.constexpr, DOT: tl.constexpr):
    """(I + A)^-1 of a strictly lower A [CHUNK, CHUNK] (CHUNK <= 64). With D = I + A's 16 x 16
    diagonal blocks and E the rest: D^-1 by forward substitution, row r of every block at
    once (15 serial steps, each a product); then (I + A)^-1 = (I + N)^-1 D^-1 with
    N = D^-1 E strictly block-lower, so N^4 = 0 and (I + N)^-1 = (I - N)(I + N^2)."""
    eye = tl.where(ii == jj, 1.0, 0.0)
    within = (ii // 16) == (jj // 16)
    blocks = tl.where(within, system, 0.0)
    inverse = eye
    for r in range(1, 16):
        rows = (ii % 16) == r
        above = tl.dot(tl.where(rows, blocks, 0.0), inverse, input_precision=DOT)
        inverse = tl.where(rows, eye - above, inverse)
    if CHUNK > 16:
        n = tl.dot(inverse, tl.where(within, 0.0, system), input_precision=DOT)
        series = tl.dot(eye - n, eye + tl.dot(n, n, input_precision=DOT), input_precision=DOT)
        inverse = tl.dot(series, inverse, input_precision=DOT)
    return inverse


@triton.jit
def _chunk_qk(mixed_ptr, t, valid, kk, qk_head, scale, stride_m, HQK: tl.constexpr,
              K: tl.constexpr):  # fmt: skip
    """A chunk's l2-normed q (times `scale`) and k [CHUNK, K] in float32; rows past the
    chunk's end are 0."""
    q = _chunk_unit(mixed_ptr, t, valid, kk, qk_head * K, stride_m, K)
    k = _chunk_unit(mixed_ptr, t, valid, kk, (HQK + qk_head) * K, stride_m, K)
    return q * scale, k


@triton.jit
def _chunk_unit(mixed_ptr, t, valid, kk, column, stride_m, K: tl.constexpr):
    """A chunk's rows of `mixed` columns `column .. column + K`, l2-normed, in float32
    [CHUNK, K]; rows past the chunk's end are 0."""
    mk = valid[:, None] & (kk[None, :] < K)
    x = tl.load(mixed_ptr + t[:, None] * stride_m + column + kk[None, :], mask=mk, other=0.0)
    x = x.to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]


@triton.jit
def _chunk_log_decay(a_ptr, t, valid, kk, head, stride_a, neg_a, dt_bias, K: tl.constexpr,
                     PER_CHANNEL: tl.constexpr):  # fmt: skip
    """The chunk's log decays, 0 past its end: Gated DeltaNet's -exp(A_log) softplus(a +
    dt_bias) [CHUNK]; KDA's (PER_CHANNEL) precomputed float32 ones [CHUNK, K]."""
    if PER_CHANNEL:
        mk = valid[:, None] & (kk[None, :] < K)
        g = tl.load(a_ptr + t[:, None] * stride_a + head * K + kk[None, :], mask=mk, other=0.0)
    else:
        a = tl.load(a_ptr + t * stride_a + head, mask=valid, other=0.0).to(tl.float32) + dt_bias
        softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(a)))
        g = tl.where(valid, neg_a * softplus, 0.0)
    return g


@triton.jit
def _kda_pairs(q, k, cum, ii, jj, CHUNK: tl.constexpr, K: tl.constexpr, DOT: tl.constexpr):
    """KDA's pairwise sums of a chunk, k_i . (exp(G_i - G_j) k_j) and q_i . (exp(G_i - G_j)
    k_j) [CHUNK, CHUNK] (only j <= i is meaningful; the caller masks the rest). In 16-token
    blocks: within a block a column j at a time (an elementwise [16, K] product and row sum
    per column, every block at once: 16 steps whatever the chunk); across blocks, for the rows
    of block b against the columns before it, matrix products through the block's first token
    r: exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j), both exponents <= 0 (G does not
    increase down the chunk), so no factor overflows."""
    NB: tl.constexpr = CHUNK // 16
    r3 = tl.arange(0, 16)[None, :, None]  # a row's place in its block
    k3 = tl.reshape(k, (NB, 16, K))
    q3 = tl.reshape(q, (NB, 16, K))
    cum3 = tl.reshape(cum, (NB, 16, K))
    first_col = (ii // 16) * 16  # the first column of row i's block
    system = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    scores = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    for j in range(16):
        pick = r3 == j
        k_j = tl.sum(tl.where(pick, k3, 0.0), 1)  # [NB, K]: each block's row j
        cum_j = tl.sum(tl.where(pick, cum3, 0.0), 1)
        # exp(G_i - G_j) k_j for the rows i >= j of each block (the rest masked by the caller)
        rel = tl.exp(tl.where(r3 >= j, cum3 - cum_j[:, None, :], 0.0)) * k_j[:, None, :]
        at_j = jj == first_col + j
        system = tl.where(at_j, tl.reshape(tl.sum(k3 * rel, 2), (CHUNK,))[:, None], system)
        scores = tl.where(at_j, tl.reshape(tl.sum(q3 * rel, 2), (CHUNK,))[:, None], scores)
    if NB > 1:
        ref = tl.sum(tl.where(r3 == 0, cum3, 0.0), 1)  # [NB, K]: G at each block's first row
        ref = tl.reshape(tl.broadcast_to(ref[:, None, :], (NB, 16, K)), (CHUNK, K))
        to_ref = tl.exp(cum - ref)
        k_left = k * to_ref
        q_left = q * to_ref
        for b in tl.static_range(1, NB):
            g_r = tl.sum(tl.where(ii == 16 * b, cum, 0.0), 0)  # [K]: G at block b's first row
            earlier = ii < 16 * b
            right = tl.where(earlier, k * tl.exp(tl.minimum(g_r[None, :] - cum, 0.0)), 0.0)
            right = tl.trans(right)
            block = ((ii // 16) == b) & (jj < 16 * b)
            system = tl.where(block, tl.dot(k_left, right, input_precision=DOT), system)
            scores = tl.where(block, tl.dot(q_left, right, input_precision=DOT), scores)
    return system, scores


@triton.jit(do_not_specialize=["batch", "search_steps"])
def _chunk_prep_kernel(
    mixed_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, w_ptr, u_ptr, scores_ptr, qg_ptr, kg_ptr,
    decay_ptr, query_indptr_ptr, chunk_indptr_ptr, batch, search_steps,
    stride_m, stride_a, stride_b, scale,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, PER_CHANNEL: tl.constexpr,
    DOT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The chunked form's first phase: everything of one (chunk, head) that does not depend
    on the state entering the chunk, every chunk in parallel. Chunk `program_id(0)` of the
    step (`chunk_indptr`: a row's first chunk; a row's chunks start at its first token, CHUNK
    tokens apart) writes, for its tokens i and j (module docstring's algebra, G the chunk's
    cumulative log decay, beta the token's sigmoid(b)):
        w = (I + A)^-1 (beta exp(G) k)   [CHUNK, K]
        u = (I + A)^-1 (beta v)          [CHUNK, V]
        scores[i, j] = q_i . (exp(G_i - G_j) k_j)   (j <= i, else 0)
        qg = exp(G) q,  kg = exp(G_last - G) k   [CHUNK, K]  (the scan's operands)
        decay = exp(G_last)                      [K] a chunk (Gated DeltaNet's K equal)
    with A[i, j] = beta_i k_i . (exp(G_i - G_j) k_j) for j < i. KDA's per-channel decays
    enter A and the scores inside the dot product (`_kda_pairs`); every exponent is
    G_i - G_j <= 0 or G itself, so nothing overflows."""
    pdl_enter(PDL)
    chunk = tl.program_id(0)
    head = tl.program_id(1)
    if chunk < tl.load(chunk_indptr_ptr + batch):
        # the row whose chunks hold this one: chunk_indptr[row] <= chunk < chunk_indptr[row + 1]
        lo = chunk * 0
        hi = lo + batch
        for _ in range(search_steps):
            mid = (lo + hi) // 2
            right = tl.load(chunk_indptr_ptr + mid + 1) <= chunk
            lo = tl.where(right, mid + 1, lo)
            hi = tl.where(right, hi, mid)
        end = tl.load(query_indptr_ptr + lo + 1)
        pos = tl.load(query_indptr_ptr + lo) + (chunk - tl.load(chunk_indptr_ptr + lo)) * CHUNK
        cc = tl.arange(0, CHUNK)
        ii, jj = cc[:, None], cc[None, :]
        kk = tl.arange(0, K)
        t = pos + cc
        valid = t < end
        qk_head = head // (HV // HK)
        q, k = _chunk_qk(mixed_ptr, t, valid, kk, qk_head, scale, stride_m, HK, K)
        neg_a = 0.0
        dt_bias = 0.0
        if not PER_CHANNEL:
            neg_a = -tl.exp(tl.load(a_log_ptr + head).to(tl.float32))
            dt_bias = tl.load(dt_bias_ptr + head).to(tl.float32)
        g = _chunk_log_decay(a_ptr, t, valid, kk, head, stride_a, neg_a, dt_bias, K, PER_CHANNEL)
        cum = tl.cumsum(g, 0)
        last = tl.sum(g, 0)  # G of the chunk's last token (the padding adds 0)
        at = (t[:, None] * HV + head).to(tl.int64)
        mk = valid[:, None] & (kk[None, :] < K)
        if PER_CHANNEL:
            qg = q * tl.exp(cum)
            kg = k * tl.exp(last[None, :] - cum)
            decay = tl.exp(last)
        else:
            qg = q * tl.exp(cum)[:, None]
            kg = k * tl.exp(last - cum)[:, None]
            decay = tl.exp(last) + tl.zeros((K,), dtype=tl.float32)
        tl.store(qg_ptr + at * K + kk[None, :], qg.to(qg_ptr.dtype.element_ty), mask=mk)
        tl.store(kg_ptr + at * K + kk[None, :], kg.to(kg_ptr.dtype.element_ty), mask=mk)
        tl.store(decay_ptr + (chunk * HV + head) * K + kk, decay)
        b = tl.load(b_ptr + t * stride_b + head, mask=valid, other=0.0).to(tl.float32)
        beta = tl.where(valid, tl.sigmoid(b), 0.0)
        if PER_CHANNEL:
            system, scores = _kda_pairs(q, k, cum, ii, jj, CHUNK, K, DOT)
            scaled_k = beta[:, None] * tl.exp(cum) * k
        else:
            lower = ii >= jj
            decay = tl.exp(tl.where(lower, cum[:, None] - cum[None, :], 0.0))
            kt = tl.trans(k)
            system = tl.dot(k, kt, input_precision=DOT) * decay
            scores = tl.dot(q, kt, input_precision=DOT) * decay
            scaled_k = (beta * tl.exp(cum))[:, None] * k
        system = tl.where(ii > jj, beta[:, None] * system, 0.0)
        inverse = _unit_lower_inverse(system, ii, jj, CHUNK, DOT)
        w = tl.dot(inverse, scaled_k, input_precision=DOT)
        tl.store(w_ptr + at * K + kk[None, :], w, mask=mk)
        tl.store(scores_ptr + at * CHUNK + jj, tl.where(ii >= jj, scores, 0.0), mask=valid[:, None])
        for v0 in tl.static_range(0, V, BLOCK_V):
            vv = v0 + tl.arange(0, BLOCK_V)
            mv = valid[:, None] & (vv[None, :] < V)
            v_ptr = mixed_ptr + t[:, None] * stride_m + 2 * HK * K + head * V + vv[None, :]
            v = tl.load(v_ptr, mask=mv, other=0.0).to(tl.float32)
            u = tl.dot(inverse, beta[:, None] * v, input_precision=DOT)
            tl.store(u_ptr + at * V + vv[None, :], u, mask=mv)


@triton.jit(do_not_specialize=["last_ckpt"])
def _chunk_scan_kernel(
    mixed_ptr, a_ptr, a_log_ptr, dt_bias_ptr, w_ptr, u_ptr, scores_ptr, qg_ptr, kg_ptr,
    decay_ptr, out_ptr, state_ptr, query_indptr_ptr, chunk_indptr_ptr, state_in_ptr,
    state_out_ptr, ckpt_indptr_ptr, ckpt_len_ptr, ckpt_page_ptr, stride_m, stride_a, stride_p,
    last_ckpt,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, PER_CHANNEL: tl.constexpr,
    DOT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The chunked form's second phase: one program a (row, head, value block) carries the
    state S [K, BLOCK_V] through the row's chunks in order. A chunk's corrections are
    U = u - w S; its outputs qg S + scores U; the state leaving it decay S + kg^T U (the
    first phase's operands: nothing but loads and products on this serial path). A prefix
    checkpoint inside a chunk (after its first p tokens) is the same sum over the chunk's
    first p tokens with G_p for G_last (the corrections of those tokens depend on no later
    token), from k and G read again, so chunks are never cut. Checkpoints and the row's
    input/output states as `_delta_rule_kernel`'s."""
    pdl_enter(PDL)
    row = tl.program_id(0)
    head = tl.program_id(1)
    qk_head = head // (HV // HK)
    kk = tl.arange(0, K)
    vv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = vv < V
    cc = tl.arange(0, CHUNK)
    jj = cc[None, :]
    start = tl.load(query_indptr_ptr + row)
    end = tl.load(query_indptr_ptr + row + 1)
    first_chunk = tl.load(chunk_indptr_ptr + row)
    s = _load_state(state_ptr, tl.load(state_in_ptr + row), stride_p, head, kk, vv, K, V)
    neg_a = 0.0
    dt_bias = 0.0
    if not PER_CHANNEL:
        neg_a = -tl.exp(tl.load(a_log_ptr + head).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + head).to(tl.float32)
    ck = tl.load(ckpt_indptr_ptr + row)
    ck_end = tl.load(ckpt_indptr_ptr + row + 1)
    next_len = _next_len(ckpt_len_ptr, ck, ck_end, last_ckpt)
    for pos in range(start, end, CHUNK):
        t = pos + cc
        valid = t < end
        n = tl.minimum(end - pos, CHUNK)
        at = (t[:, None] * HV + head).to(tl.int64)
        mk = valid[:, None] & (kk[None, :] < K)
        mv = valid[:, None] & vmask[None, :]
        w = tl.load(w_ptr + at * K + kk[None, :], mask=mk, other=0.0)
        u = tl.load(u_ptr + at * V + vv[None, :], mask=mv, other=0.0)
        corrections = u - tl.dot(w, s, input_precision=DOT)
        qg = tl.load(qg_ptr + at * K + kk[None, :], mask=mk, other=0.0).to(tl.float32)
        scores = tl.load(scores_ptr + at * CHUNK + jj, mask=valid[:, None], other=0.0)
        o = tl.dot(qg, s, input_precision=DOT)
        o += tl.dot(scores, corrections, input_precision=DOT)
        tl.store(out_ptr + (t[:, None] * HV + head) * V + vv[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=mv)  # fmt: skip
        # checkpoints strictly inside the chunk: the state after its first p tokens
        while (next_len > pos - start) & (next_len < pos - start + n):
            p = next_len - (pos - start)
            first = cc[:, None] < p
            k = _chunk_unit(mixed_ptr, t, valid, kk, (HK + qk_head) * K, stride_m, K)
            g = _chunk_log_decay(a_ptr, t, valid, kk, head, stride_a, neg_a, dt_bias, K,
                                 PER_CHANNEL)  # fmt: skip
            cum = tl.cumsum(g, 0)
            if PER_CHANNEL:
                cum_p = tl.sum(tl.where(cc[:, None] == p - 1, cum, 0.0), 0)
                carried = k * tl.exp(tl.where(first, cum_p[None, :] - cum, 0.0))
                s_p = s * tl.exp(cum_p)[:, None]
            else:
                cum_p = tl.sum(tl.where(cc == p - 1, cum, 0.0), 0)
                carried = k * tl.exp(tl.where(cc < p, cum_p - cum, 0.0))[:, None]
                s_p = s * tl.exp(cum_p)
            carried = tl.where(first, carried, 0.0)
            s_p += tl.dot(tl.trans(carried), corrections, input_precision=DOT)
            _store_state(state_ptr, tl.load(ckpt_page_ptr + ck), stride_p, head, kk, vv, s_p, K, V)
            ck += 1
            next_len = _next_len(ckpt_len_ptr, ck, ck_end, last_ckpt)
        decay = tl.load(decay_ptr + ((first_chunk + (pos - start) // CHUNK) * HV + head) * K + kk)
        kg = tl.load(kg_ptr + at * K + kk[None, :], mask=mk, other=0.0).to(tl.float32)
        s = s * decay[:, None]
        s += tl.dot(tl.trans(kg), corrections, input_precision=DOT)
        if next_len == pos - start + n:
            _store_state(state_ptr, tl.load(ckpt_page_ptr + ck), stride_p, head, kk, vv, s, K, V)
            ck += 1
            next_len = _next_len(ckpt_len_ptr, ck, ck_end, last_ckpt)
    _store_state(state_ptr, tl.load(state_out_ptr + row), stride_p, head, kk, vv, s, K, V)


def chunk_precision(dtype: torch.dtype) -> str:
    """The chunked form's matrix products (`tl.dot`'s input precision) for inputs of `dtype`:
    TF32 for 16-bit inputs (its 10-bit mantissa is finer than the inputs' own rounding; on an
    H100 the form runs 3-5x faster than with float32 products, agreeing with fla as closely,
    docs/benchmarks.md), exact float32 products ("ieee") for float32 inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _chunked(
    mixed: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    out: torch.Tensor,
    state: torch.Tensor,
    rows: StateRows,
    num_k_heads: int,
    chunk: int,
    per_channel: bool,
    block_v: int,
    precision: str | None,
) -> None:
    """Both phases of the chunked form (`_chunk_prep_kernel`, then `_chunk_scan_kernel`) over
    float32 scratch of w, u and the scores, `chunk` tokens a chunk; the scan's programs own
    `block_v` value columns each (0: 32), its products at `precision` (None:
    `chunk_precision`)."""
    _, heads, k_dim, v_dim = state.shape
    precision = precision or chunk_precision(mixed.dtype)
    block_v = block_v or max(min(next_pow2(v_dim), 32), 16)
    assert block_v >= 16 and block_v == next_pow2(block_v), "tl.dot's tiles: 16, 32, 64..."
    t = mixed.shape[0]
    batch = rows.state_in.shape[0]
    chunk_indptr = _chunk_indptr(rows, chunk)
    scratch = dict(dtype=torch.float32, device=mixed.device)
    w = torch.empty((t, heads, k_dim), **scratch)  # type: ignore[call-overload]
    u = torch.empty((t, heads, v_dim), **scratch)  # type: ignore[call-overload]
    scores = torch.empty((t, heads, chunk), **scratch)  # type: ignore[call-overload]
    # The decayed q and k in half precision under TF32 products: float16's 10-bit mantissa is
    # TF32's, so the products round them the same (|values| <= 1; under float16's normal
    # range the error is < 1e-7 absolute), at half the bytes of the scan's busiest reads.
    decayed = dict(scratch, dtype=torch.float16 if precision == "tf32" else torch.float32)
    qg = torch.empty((t, heads, k_dim), **decayed)  # type: ignore[call-overload]
    kg = torch.empty((t, heads, k_dim), **decayed)  # type: ignore[call-overload]
    slots = triton.cdiv(t, chunk) + batch  # at least the step's chunks
    decay = torch.empty((slots, heads, k_dim), **scratch)  # type: ignore[call-overload]
    shapes = dict(HK=num_k_heads, HV=heads, K=k_dim, V=v_dim, CHUNK=chunk, PER_CHANNEL=per_channel)
    _chunk_prep_kernel[(slots, heads)](
        mixed, a, b, a_log, dt_bias, w, u, scores, qg, kg, decay, rows.query_indptr,
        chunk_indptr, batch, batch.bit_length(), mixed.stride(0), a.stride(0), b.stride(0),
        k_dim**-0.5, BLOCK_V=max(min(next_pow2(v_dim), 64), 16), DOT=precision, **shapes,
        num_warps=8, **pdl_args(),
    )  # fmt: skip
    _chunk_scan_kernel[(batch, heads, triton.cdiv(v_dim, block_v))](
        mixed, a, a_log, dt_bias, w, u, scores, qg, kg, decay, out, state, rows.query_indptr,
        chunk_indptr, rows.state_in, rows.state_out, rows.ckpt_indptr, rows.ckpt_len,
        rows.ckpt_page, mixed.stride(0), a.stride(0), state.stride(0),
        rows.ckpt_len.shape[0] - 1, BLOCK_V=block_v, DOT=precision, **shapes, num_warps=4,
        **pdl_args(),
    )  # fmt: skip


def _chunk_indptr(rows: StateRows, chunk: int) -> torch.Tensor:
    """Row b's chunks are `[i[b], i[b + 1])` of the step's (int32 [batch + 1]): made by the
    step's first linear layer, kept on `rows` for the others."""
    indptr = rows.chunk_starts.get(chunk)
    if indptr is None:
        lens = rows.query_indptr[1:] - rows.query_indptr[:-1]
        per_row = torch.div(lens + chunk - 1, chunk, rounding_mode="floor")
        indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
        indptr[1:] = torch.cumsum(per_row, 0)
        rows.chunk_starts[chunk] = indptr
    return indptr


def kda_delta_rule(
    mixed: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor,
    rows: StateRows,
    out: torch.Tensor | None = None,
    chunk: int = 0,
    precision: str | None = None,
    block_v: int = 0,
) -> torch.Tensor:
    """KDA's delta rule (module docstring): o [T, H, V] (mixed's dtype) of `mixed`
    [T, 2*H*K + H*V] (q | k | v, rows contiguous), the float32 log decays `g` [T, H, K]
    (contiguous), `b` [T, H] (beta's logits, rows may be strided) and `state` float32
    [pages, H, K, V]; checkpoints, `chunk`, `precision` and `block_v` as
    `gated_delta_rule`'s; 0: the recurrent kernel."""
    _, heads, k_dim, v_dim = state.shape
    t = mixed.shape[0]
    assert state.dtype == torch.float32 and state.stride()[1:] == (k_dim * v_dim, v_dim, 1)
    assert k_dim == next_pow2(k_dim), "the key head dim must be a power of two"
    assert mixed.stride(1) == 1 and mixed.shape[1] == 2 * heads * k_dim + heads * v_dim
    assert g.shape == (t, heads, k_dim) and g.dtype == torch.float32 and g.is_contiguous()
    assert b.shape == (t, heads) and b.stride(1) == 1
    rows.check()
    if out is None:
        out = torch.empty((t, heads, v_dim), dtype=mixed.dtype, device=mixed.device)
    assert out.shape == (t, heads, v_dim) and out.is_contiguous()
    assert max(t * mixed.stride(0), out.numel(), g.numel()) < 2**31, "token offsets are int32"
    batch = rows.state_in.shape[0]
    if batch and chunk:
        assert chunk in (16, 32, 64) and k_dim >= 16
        _chunked(mixed, g, b, g, g, out, state, rows, heads, chunk, per_channel=True,
                 block_v=block_v, precision=precision)  # fmt: skip
    elif batch:
        block_v = min(next_pow2(v_dim), 32)
        _delta_rule_kernel[(batch, heads, triton.cdiv(v_dim, block_v))](
            mixed, g, b, g, g, out, state, rows.query_indptr, rows.state_in, rows.state_out,
            rows.ckpt_indptr, rows.ckpt_len, rows.ckpt_page, mixed.stride(0), g.stride(0),
            b.stride(0), state.stride(0), rows.ckpt_len.shape[0] - 1, k_dim**-0.5,
            HK=heads, HV=heads, K=k_dim, V=v_dim, BLOCK_V=block_v, PER_CHANNEL=True,
            num_warps=4, **pdl_args(),
        )  # fmt: skip
    return out
