"""The Gated DeltaNet kernels (Qwen3.5's linear attention; KDA's per-channel decay, GLM-5.3)
against plain PyTorch, over odd shapes: rows of several lengths (a decode-like one-token row
among them), input checkpoints from pages and from zeros, prefix-cache checkpoints inside
rows, an in-place state page; the delta rule in its recurrent and its chunked form (chunks cut
at the checkpoints)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from resin_models_cuda.kernels.conv1d import causal_conv1d, conv_state_store
from resin_models_cuda.kernels.delta_rule import gated_delta_rule, kda_delta_rule
from resin_models_cuda.kernels.gated_rmsnorm import gated_rmsnorm
from resin_models_cuda.step import StateRows
from resin_models_torch.delta_rule import recurrent_delta_rule

LENS = [20, 1, 3]
STATE_IN = [2, -1, 0]
STATE_OUT = [3, 4, 0]  # row 2 updates its checkpoint in place
# row: [(tokens covered, page)]. Row 0 is cut at 1 and 19: chunks of 1, 16, 2 and 1 tokens
# (chunk 16) or 1, 18 and 1 (chunk 32: across two 16-row blocks of the system's inverse).
CHECKPOINTS = {0: [(1, 6), (19, 7)], 2: [(3, 1)]}


def state_rows(
    device: str,
    region: torch.Tensor,
    lens: list[int],
    state_in: list[int],
    state_out: list[int],
    checkpoints: dict[int, list[tuple[int, int]]],
) -> StateRows:
    """The varlen rows of a State kernel call: `lens` tokens a row, each starting from its
    `state_in` page (-1: zeros) and ending in `state_out`, `checkpoints` a row's (tokens
    covered, page) prefix checkpoints on the way."""

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)
    ck_indptr, ck_len, ck_page = [0], [], []
    for row in range(len(lens)):
        for length, page in checkpoints.get(row, []):
            ck_len.append(length)
            ck_page.append(page)
        ck_indptr.append(len(ck_len))
    token_row = [row for row, n in enumerate(lens) for _ in range(n)]
    return StateRows(region, i32(indptr), i32(token_row), i32(state_in), i32(state_out),
                     i32(ck_indptr), i32(ck_len), i32(ck_page))  # fmt: skip


def _rows(device: str, region: torch.Tensor) -> StateRows:
    return state_rows(device, region, LENS, STATE_IN, STATE_OUT, CHECKPOINTS)


def _expected_pages(pages: torch.Tensor, run: object) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per row, `run(row, start_state, start, end) -> (out, state after each token)`; returns
    the outputs and the pages as the kernels must leave them."""
    want = pages.clone()
    outs = []
    start = 0
    writes = []
    for row, n in enumerate(LENS):
        page = STATE_IN[row]
        initial = pages[page] if page >= 0 else torch.zeros_like(pages[0])
        out, states = run(row, initial, start, start + n)  # type: ignore[operator]
        outs.append(out)
        for length, ck in CHECKPOINTS.get(row, []):
            writes.append((ck, states[length - 1]))
        writes.append((STATE_OUT[row], states[-1]))
        start += n
    for page, value in writes:
        want[page] = value
    return outs, want


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 2e-5), (torch.float16, 2e-2)])
@pytest.mark.parametrize("chunk", [0, 16, 32], ids=["recurrent", "chunk16", "chunk32"])
def test_delta_rule_kernel_equals_recurrent_pytorch(
    device: str, dtype: torch.dtype, atol: float, chunk: int
) -> None:
    gen = torch.Generator().manual_seed(0)
    hk, hv, kd, vd = 2, 4, 16, 12
    t = sum(LENS)
    mixed = torch.randn(t, 2 * hk * kd + hv * vd, generator=gen).to(dtype)
    ab = torch.randn(t, 2 * hv + 3, generator=gen).to(dtype)  # a and b as strided views
    a, b = ab[:, :hv], ab[:, hv + 3 :]
    a_log = torch.rand(hv, generator=gen).log()
    dt_bias = torch.randn(hv, generator=gen)
    pages = torch.randn(8, hv, kd, vd, generator=gen) * 0.3

    def run(row: int, state: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, list]:
        x = mixed[lo:hi].float()
        q = x[:, : hk * kd].view(-1, hk, kd).repeat_interleave(hv // hk, 1)
        k = x[:, hk * kd : 2 * hk * kd].view(-1, hk, kd).repeat_interleave(hv // hk, 1)
        v = x[:, 2 * hk * kd :].view(-1, hv, vd)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * kd**-0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        g = -a_log.exp() * F.softplus(a[lo:hi].float() + dt_bias)
        beta = torch.sigmoid(b[lo:hi].float())
        outs, states = [], []
        for i in range(hi - lo):
            o, state = recurrent_delta_rule(q[i : i + 1], k[i : i + 1], v[i : i + 1],
                                            g[i : i + 1], beta[i : i + 1], state)  # fmt: skip
            outs.append(o)
            states.append(state)
        return torch.cat(outs), states

    outs, want = _expected_pages(pages, run)
    got_pages = pages.clone().to(device)
    rows = _rows(device, got_pages)
    for _layer in range(2):  # a step's second linear layer reuses the first one's chunk index
        got_pages.copy_(pages)
        out = gated_delta_rule(
            mixed.to(device), a.to(device), b.to(device), a_log.to(device), dt_bias.to(device),
            got_pages, rows, hk, chunk=chunk,
        )  # fmt: skip
        torch.testing.assert_close(out.float().cpu(), torch.cat(outs), atol=atol, rtol=1e-3)
        torch.testing.assert_close(got_pages.cpu(), want, atol=atol, rtol=1e-3)
    if chunk:
        firsts = [0] + [sum(-(-n // chunk) for n in LENS[: i + 1]) for i in range(len(LENS))]
        assert rows.chunk_starts[chunk].tolist() == firsts


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 2e-5), (torch.float16, 2e-2)])
@pytest.mark.parametrize("chunk", [0, 16], ids=["recurrent", "chunk16"])
def test_kda_delta_rule_kernel_equals_recurrent_pytorch(
    device: str, dtype: torch.dtype, atol: float, chunk: int
) -> None:
    """KDA: q and k per value head, the log decay per key channel given in float32."""
    gen = torch.Generator().manual_seed(1)
    h, kd, vd = 3, 16, 12
    t = sum(LENS)
    mixed = torch.randn(t, 2 * h * kd + h * vd, generator=gen).to(dtype)
    g = -torch.rand(t, h, kd, generator=gen) * 0.7
    b = torch.randn(t, h + 2, generator=gen).to(dtype)[:, 1 : h + 1]  # a strided view
    pages = torch.randn(8, h, kd, vd, generator=gen) * 0.3

    def run(row: int, state: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, list]:
        x = mixed[lo:hi].float()
        q, k = x[:, : h * kd].view(-1, h, kd), x[:, h * kd : 2 * h * kd].view(-1, h, kd)
        v = x[:, 2 * h * kd :].view(-1, h, vd)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * kd**-0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        beta, decay = torch.sigmoid(b[lo:hi].float()), g[lo:hi]
        outs, states = [], []
        for i in range(hi - lo):
            o, state = recurrent_delta_rule(q[i : i + 1], k[i : i + 1], v[i : i + 1],
                                            decay[i : i + 1], beta[i : i + 1], state)  # fmt: skip
            outs.append(o)
            states.append(state)
        return torch.cat(outs), states

    outs, want = _expected_pages(pages, run)
    got_pages = pages.to(device)
    out = kda_delta_rule(mixed.to(device), g.to(device), b.to(device), got_pages,
                         _rows(device, got_pages), chunk=chunk)  # fmt: skip
    torch.testing.assert_close(out.float().cpu(), torch.cat(outs), atol=atol, rtol=1e-3)
    torch.testing.assert_close(got_pages.cpu(), want, atol=atol, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_conv1d_kernels_equal_pytorch(device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    channels, kw = 37, 4
    t = sum(LENS)
    x = torch.randn(t, channels + 5, generator=gen).to(dtype)[:, 2 : channels + 2]  # strided rows
    weight = torch.randn(channels, kw, generator=gen).to(dtype)
    pages = torch.randn(8, channels, kw - 1, generator=gen).to(dtype)

    def run(row: int, state: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, list]:
        full = torch.cat((state.float(), x[lo:hi].float().T), dim=1)  # [C, W + n]
        conv = F.conv1d(full[None], weight.float()[:, None], groups=channels)[0].T
        out = F.silu(conv.to(dtype).float())
        states = [full[:, i + 1 : i + kw].to(dtype) for i in range(hi - lo)]
        return out, states

    outs, want = _expected_pages(pages, run)
    got_pages = pages.to(device)
    rows = _rows(device, got_pages)
    out = causal_conv1d(x.to(device), weight.to(device), got_pages, rows)
    conv_state_store(x.to(device), got_pages, rows)
    atol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.float().cpu(), torch.cat(outs), atol=atol, rtol=1e-3)
    torch.testing.assert_close(got_pages.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gated_rmsnorm_equals_pytorch(device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    t, heads, dim = 5, 3, 24
    x = torch.randn(t, heads, dim, generator=gen).to(dtype)
    z = torch.randn(t, heads * dim + 7, generator=gen).to(dtype)[:, 7:]
    weight = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    want = ((weight * normed) * F.silu(z.float().view(t, heads, dim))).to(dtype)
    got = gated_rmsnorm(x.to(device), z.to(device), weight.to(device), 1e-6)
    torch.testing.assert_close(got.cpu(), want.reshape(t, -1), atol=1e-5, rtol=1e-3)


def test_the_chunked_kernels_compile_for_sm90() -> None:
    """The chunked form's two phases at the published shapes compile for sm_90 (the
    interpreter above runs them but compiles nothing): Gated DeltaNet's first phase at
    Qwen3.5's heads in 64-token chunks with TF32 products, KDA's scan at GLM-5.3's, KDA's
    first phase in 64-token chunks."""
    from tests.cuda.sm90 import compile_sm90

    module = "resin_models_cuda.kernels.delta_rule"
    i32 = ["query_indptr_ptr", "chunk_indptr_ptr", "state_in_ptr", "state_out_ptr",
           "ckpt_indptr_ptr", "ckpt_len_ptr", "ckpt_page_ptr"]  # fmt: skip
    ints = ["batch", "search_steps", "stride_m", "stride_a", "stride_b", "stride_p", "last_ckpt"]
    sig = {"mixed_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16", "scale": "fp32",
           **{n: "*i32" for n in i32}, **{n: "i32" for n in ints}}  # fmt: skip
    for n in ("a_ptr", "a_log_ptr", "dt_bias_ptr", "w_ptr", "u_ptr", "scores_ptr", "state_ptr",
              "decay_ptr"):  # fmt: skip
        sig.setdefault(n, "*fp32")
    sig.update(qg_ptr="*fp16", kg_ptr="*fp16")  # TF32 products: float16 decayed q and k
    shapes = dict(K=128, V=128, DOT="tf32", PDL=False)
    ptx, _ = compile_sm90(module, "_chunk_prep_kernel", {**sig, "a_ptr": "*bf16"},
                          dict(HK=16, HV=32, BLOCK_V=64, CHUNK=64, PER_CHANNEL=False, **shapes),
                          num_warps=8)  # fmt: skip
    assert ".entry _chunk_prep_kernel" in ptx and "mma" in ptx  # TF32 on the tensor cores
    ptx, _ = compile_sm90(module, "_chunk_scan_kernel", sig,
                          dict(HK=32, HV=32, BLOCK_V=32, CHUNK=16, PER_CHANNEL=True, **shapes),
                          num_warps=4)  # fmt: skip
    assert ".entry _chunk_scan_kernel" in ptx and "mma" in ptx
    # KDA's first phase at 64-token chunks: its cross-block sums as products (`_kda_pairs`)
    ptx, _ = compile_sm90(module, "_chunk_prep_kernel", sig,
                          dict(HK=32, HV=32, BLOCK_V=64, CHUNK=64, PER_CHANNEL=True, **shapes),
                          num_warps=8)  # fmt: skip
    assert ".entry _chunk_prep_kernel" in ptx and "mma" in ptx
