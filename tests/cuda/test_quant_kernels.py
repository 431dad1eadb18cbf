"""Quantized-weight kernels against plain PyTorch: dequantize with `resin_model.quant`, then
matmul in float32. FP8 (block, per-channel, per-tensor scales; weight-only, pre-quantized and
fused-quantized activations), the `torch._scaled_mm` path, and the FP8 and MXFP4 MoE kernels
(grouped GEMM, expert GEMV) over odd shapes, biases, routing weights and tile shapes.

On the CPU these run through the Triton interpreter in float32 and float16 (MXFP4: float32
dequantizes in registers, 16-bit activations go through `tl.dot_scaled`); bf16 runs on the GPU
only (the interpreter's `tl.dot` on bf16 operands returns garbage in Triton 3.9, and its
float32 -> e4m3 cast mis-rounds, which `quant_tiles.to_fp8` works around there)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from resin_model.quant import (
    dequantize_fp8,
    dequantize_mxfp4,
    quantize_fp8,
    quantize_fp8_activations,
    quantize_mxfp4,
)

TOL = {torch.float32: (2e-4, 2e-4), torch.float16: (2e-2, 5e-3), torch.bfloat16: (5e-2, 2e-2)}


def _dtypes(device: str) -> list[torch.dtype]:
    return [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """Within the dtype's tolerance relative to the result's scale, every element written."""
    atol, rtol = TOL[dtype]
    got = got.float().cpu()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=atol * want.abs().max().item(), rtol=rtol)


# ---------------------------------------------------------------------------------------------
# FP8 dense


@pytest.mark.parametrize("group", [None, 128, 48])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_quantize_rows_equals_the_torch_quantizer(device: str, group: int | None, dtype) -> None:  # type: ignore[no-untyped-def]
    from resin_models_cuda.kernels.fp8_quant import quantize_fp8_rows

    torch.manual_seed(3)
    x = (torch.randn(7, 300) * torch.rand(7, 1) * 40).to(dtype)
    x[2] = 0.0  # a zero row keeps zeros
    q, s = quantize_fp8_rows(x.to(device), group)
    q_ref, s_ref = quantize_fp8_activations(x, group)
    torch.testing.assert_close(s.cpu(), s_ref, rtol=1e-6, atol=0)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))


SCHEMES = {"block": (128, 128), "block_small": (16, 64), "channel": None, "tensor": None}


def _weight_block(scheme: str, n: int, k: int) -> tuple[int, int]:
    if scheme == "channel":
        return (1, k)
    if scheme == "tensor":
        return (n, k)
    return SCHEMES[scheme]  # type: ignore[return-value]


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("mode", ["weight_only", "per_token", "per_group", "fused"])
@pytest.mark.parametrize("m", [1, 37])
def test_fp8_gemm_matches_dequantized_matmul(device: str, scheme: str, mode: str, m: int) -> None:
    from resin_models_cuda.kernels.fp8_gemm import GemmTiles, fp8_gemm

    torch.manual_seed(m + len(scheme) + len(mode))
    n, k = 70, 320
    block = _weight_block(scheme, n, k)
    w_q, w_s = quantize_fp8(torch.randn(n, k) * 0.3, block)
    w = dequantize_fp8(w_q, w_s, block)
    bias = torch.randn(n)
    tiles = GemmTiles(16, 32, 64, 4, 4, 1)
    d = device
    for dtype in _dtypes(device) if mode == "weight_only" else [torch.float32]:
        x = torch.randn(m, k).to(dtype)
        kw: dict = dict(bias=bias.to(d).to(dtype), tiles=tiles, out_dtype=torch.float32)
        if mode == "weight_only":
            got = fp8_gemm(x.to(d), w_q.to(d), w_s.to(d), block, **kw)
            x_ref = x.float()
        elif mode == "fused":
            got = fp8_gemm(x.to(d), w_q.to(d), w_s.to(d), block, quantize_group=64, **kw)
            x_ref = dequantize_fp8(*quantize_fp8_activations(x, 64), (1, 64))
        else:
            group = None if mode == "per_token" else 64
            x_q, x_s = quantize_fp8_activations(x, group)
            got = fp8_gemm(x_q.to(d), w_q.to(d), w_s.to(d), block, x_scale=x_s.to(d),
                           x_group=group, **kw)  # fmt: skip
            x_ref = dequantize_fp8(x_q, x_s, (1, group or k))
        _close(got, x_ref @ w.T + bias.to(dtype).float(), dtype)


@pytest.mark.parametrize(
    ("scheme", "block_k"),
    [("tensor", 128), ("channel", 256), ("block", 256), ("block", 64), ("fine", 128)],
)
def test_fp8_gemv_matches_dequantized_matmul(device: str, scheme: str, block_k: int) -> None:
    """The decode GEMV over odd shapes: 1-3 rows, a partial column tile and K tile, scale
    blocks inside a tile (block: 128 wide under a 256 tile; fine: 32 wide) or spanning it;
    float32 and float16 activations, a bias."""
    from resin_models_cuda.kernels.fp8_gemm import fp8_gemv
    from resin_models_cuda.kernels.tiles import GemvTiles

    torch.manual_seed(block_k + len(scheme))
    n, k = 70, 416
    block = {"fine": (32, 32), "block": (128, 128)}.get(scheme) or _weight_block(scheme, n, k)
    w_q, w_s = quantize_fp8(torch.randn(n, k) * 0.3, block)
    w = dequantize_fp8(w_q, w_s, block)
    bias = torch.randn(n)
    d = device
    for dtype, m in zip(_dtypes(device), (1, 3, 2), strict=False):
        x = torch.randn(m, k).to(dtype)
        got = fp8_gemv(x.to(d), w_q.to(d), w_s.to(d), block, bias=bias.to(dtype).to(d),
                       tiles=GemvTiles(16, block_k, 4))  # fmt: skip
        assert got.dtype == dtype
        _close(got, x.float() @ w.T + bias.to(dtype).float(), dtype)


@pytest.mark.parametrize(
    ("scheme", "block_n", "block_k", "split_k"),
    [("tensor", 16, 128, 1), ("channel", 32, 256, 2), ("block", 16, 256, 1),
     ("block", 32, 128, 3), ("fine", 16, 64, 1)],
)  # fmt: skip
def test_fp8_gemv_tensor_core_matches_dequantized_matmul(
    device: str, scheme: str, block_n: int, block_k: int, split_k: int
) -> None:
    """The tensor-core GEMV (all rows in one program, padded to 16) over odd shapes: 1, 5 and
    16 rows, a partial column tile and K tile, scale blocks narrower than the K tile (block:
    128 under 256; fine: 32 under 64) or spanning K, K split over programs; every activation
    dtype (bf16: the bit-move upcast, on the GPU), a bias."""
    from resin_models_cuda.kernels.fp8_gemm import fp8_gemv
    from resin_models_cuda.kernels.tiles import GemvTiles

    torch.manual_seed(block_k + block_n + split_k)
    n, k = 70, 416
    block = {"fine": (32, 32), "block": (128, 128)}.get(scheme) or _weight_block(scheme, n, k)
    w_q, w_s = quantize_fp8(torch.randn(n, k) * 0.3, block)
    w = dequantize_fp8(w_q, w_s, block)
    bias = torch.randn(n)
    tiles = GemvTiles(block_n, block_k, 4, 2, split_k, tensor_core=1)
    d = device
    for dtype in _dtypes(device):
        for m in (1, 5, 16):
            x = torch.randn(m, k).to(dtype)
            got = fp8_gemv(x.to(d), w_q.to(d), w_s.to(d), block, bias=bias.to(dtype).to(d),
                           tiles=tiles)  # fmt: skip
            assert got.dtype == dtype and got.shape == (m, n)
            _close(got, x.float() @ w.T + bias.to(dtype).float(), dtype)


def test_fp8_gemv_tensor_core_refuses_what_it_cannot_tile(device: str) -> None:
    """More than 16 rows, or scale blocks that do not divide the K tile, are errors that say
    so (`fp8_linear` routes those shapes elsewhere)."""
    from resin_models_cuda.kernels.fp8_gemm import fp8_gemv, tc_sub_k
    from resin_models_cuda.kernels.tiles import GemvTiles

    w_q, w_s = quantize_fp8(torch.randn(32, 256), (128, 128))
    tiles = GemvTiles(16, 128, 4, tensor_core=1)
    with pytest.raises(AssertionError, match="up to 16 rows"):
        fp8_gemv(torch.randn(17, 256).to(device), w_q.to(device), w_s.to(device), (128, 128),
                 tiles=tiles)  # fmt: skip
    assert tc_sub_k(128, 4096, 512) == 128 and tc_sub_k(4096, 4096, 512) == 512
    assert tc_sub_k(96, 4096, 512) == 0 and tc_sub_k(8, 4096, 512) == 0
    w_q, w_s = quantize_fp8(torch.randn(32, 256), (32, 96))
    with pytest.raises(AssertionError, match="do not tile"):
        fp8_gemv(torch.randn(2, 256).to(device), w_q.to(device), w_s.to(device), (32, 96),
                 tiles=tiles)  # fmt: skip


def test_fp8_linear_takes_the_tensor_core_gemv_where_the_tile_file_says(device: str) -> None:
    """A one-row tile entry with `tensor_core` sends 1-16 rows of that shape to the
    tensor-core GEMV (its cost does not depend on the rows); 17 rows take the GEMM path; all
    match the dequantized matmul."""
    from resin_models_cuda.kernels import tiles
    from resin_models_cuda.layers.quantized import Fp8Weight, fp8_linear

    torch.manual_seed(6)
    w_q, w_s = quantize_fp8(torch.randn(48, 256) * 0.3, (128, 128))
    w = dequantize_fp8(w_q, w_s, (128, 128))
    weight = Fp8Weight(w_q.to(device), w_s.to(device), (128, 128))
    key = tiles.TileKey("fp8_gemv", "fp8-block", 48, 256, 1)
    tiles.add_tiles({key: tiles.GemvTiles(16, 256, 4, 2, 1, tensor_core=1)})
    try:
        for m in (1, 9, 16, 17):
            x = torch.randn(m, 256)
            _close(fp8_linear(x.to(device), weight, None), x @ w.T, torch.float32)
    finally:
        tiles._added.clear()


def test_fp8_linear_takes_the_gemv_for_few_rows(device: str) -> None:
    """`fp8_linear` up to `GEMV_ROWS` rows (the GEMV) and above (the tile GEMM) agree with the
    dequantized matmul."""
    from resin_models_cuda.layers.quantized import GEMV_ROWS, Fp8Weight, fp8_linear

    torch.manual_seed(5)
    w_q, w_s = quantize_fp8(torch.randn(48, 256) * 0.3, (128, 128))
    w = dequantize_fp8(w_q, w_s, (128, 128))
    weight = Fp8Weight(w_q.to(device), w_s.to(device), (128, 128))
    for m in (GEMV_ROWS, GEMV_ROWS + 1):
        x = torch.randn(m, 256)
        _close(fp8_linear(x.to(device), weight, None), x @ w.T, torch.float32)


def test_fp8_gemm_tile_shapes_agree(device: str) -> None:
    """Tile sizes, row grouping, warps, stages and K splits (with a bias added once) compute
    the same result; the output dtype follows `x` unless named."""
    from resin_models_cuda.kernels.fp8_gemm import GemmTiles, fp8_gemm

    torch.manual_seed(5)
    x, (w_q, w_s) = torch.randn(45, 256), quantize_fp8(torch.randn(50, 256), (128, 128))
    bias = torch.randn(50)
    want = x @ dequantize_fp8(w_q, w_s, (128, 128)).T + bias
    sweep = [GemmTiles(16, 16, 128, 1, 4, 1), GemmTiles(32, 64, 64, 2, 4, 2),
             GemmTiles(64, 32, 128, 8, 8, 3), GemmTiles(16, 32, 64, 1, 4, 1, 3)]  # fmt: skip
    for tiles in sweep:
        got = fp8_gemm(x.to(device), w_q.to(device), w_s.to(device), (128, 128),
                       bias=bias.to(device), tiles=tiles)  # fmt: skip
        assert got.dtype == torch.float32
        _close(got, want, torch.float32)


def test_fp8_gemm_refuses_what_it_cannot_run(device: str) -> None:
    from resin_models_cuda.kernels.fp8_gemm import GemmTiles, fp8_gemm

    x = torch.randn(4, 256).to(device)
    w_q, w_s = (t.to(device) for t in quantize_fp8(torch.randn(32, 256), (128, 128)))
    with pytest.raises(AssertionError):  # a K tile straddling two scale blocks
        fp8_gemm(x, w_q, w_s, (128, 128), tiles=GemmTiles(16, 32, 256))
    with pytest.raises(AssertionError):  # scales of another block shape
        fp8_gemm(x, w_q, w_s, (128, 64), tiles=GemmTiles(16, 32, 64))
    with pytest.raises(AssertionError):  # bf16 weights are not this kernel's
        fp8_gemm(x, w_q.float(), w_s, (128, 128), tiles=GemmTiles(16, 32, 64))
    with pytest.raises(AssertionError):  # fused groups must be the K tile
        fp8_gemm(x, w_q, w_s, (128, 128), quantize_group=128, tiles=GemmTiles(16, 32, 64))


@pytest.mark.parametrize("scheme", ["channel", "tensor"])
def test_scaled_mm_path_matches_reference(device: str, scheme: str) -> None:
    """cuBLASLt (`torch._scaled_mm`, row-wise scales; PyTorch's CPU kernel off the GPU) on
    per-token activations: the same function as the Triton pre-quantized path."""
    from resin_models_cuda.kernels.fp8_gemm import scaled_mm_fp8

    torch.manual_seed(7)
    n, k = 48, 96
    block = _weight_block(scheme, n, k)
    w_q, w_s = quantize_fp8(torch.randn(n, k), block)
    x = torch.randn(21, k)
    x_ref = dequantize_fp8(*quantize_fp8_activations(x), (1, k))
    want = x_ref @ dequantize_fp8(w_q, w_s, block).T
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    got = scaled_mm_fp8(x.to(device).to(dtype), w_q.to(device), w_s.to(device))
    assert got.dtype == dtype
    _close(got, want, torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# MoE


def _experts(fmt: str, e: int, n: int, k: int, block=(16, 64)):  # type: ignore[no-untyped-def]
    """(kernel weights, dequantized float32 [e, n, k])."""
    from resin_models_cuda.kernels.moe_fp8 import Fp8Experts
    from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts

    w = torch.randn(e, n, k) * 0.3
    if fmt == "fp8":
        q, s = quantize_fp8(w, block)
        return Fp8Experts(q, s, block), dequantize_fp8(q, s, block)
    b, s = quantize_mxfp4(w)
    return Mxfp4Experts(b, s), dequantize_mxfp4(b, s)


def _to(w, device: str):  # type: ignore[no-untyped-def]
    return type(w)(*(t.to(device) if isinstance(t, torch.Tensor) else t for t in w))


def _kernels(fmt: str):  # type: ignore[no-untyped-def]
    from resin_models_cuda.kernels import moe_fp8, moe_mxfp4

    if fmt == "fp8":
        return moe_fp8.fp8_expert_gate_up, moe_fp8.fp8_expert_down, moe_fp8.fp8_grouped_gemm
    return (moe_mxfp4.mxfp4_expert_gate_up, moe_mxfp4.mxfp4_expert_down,
            moe_mxfp4.mxfp4_grouped_gemm)  # fmt: skip


def _gated(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if act == "swiglu_clamp":
        gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
        return (up + 1) * gate * torch.sigmoid(gate * 1.702)
    return F.silu(gate) * up


@pytest.mark.parametrize(("fmt", "tensor_core"), [("fp8", 0), ("mxfp4", 0), ("mxfp4", 1)])
@pytest.mark.parametrize(("tokens", "act"), [(1, "silu"), (3, "swiglu_clamp")])
def test_expert_gemv_matches_dequantized(
    device: str, fmt: str, tensor_core: int, tokens: int, act: str
) -> None:
    """gate_up (activation fused, biases) and down (routing weights, biases) per pair, a
    token's experts summed; float32 and float16 activations (and bf16 on the GPU); MXFP4 also
    through the tensor-core row-dot (64-row tiles: the 96 down rows end in a partial one)."""
    from resin_models_cuda.kernels.moe_gemv import GemvTiles

    gate_up, down, _ = _kernels(fmt)
    torch.manual_seed(tokens)
    e, h, inner, k = 5, 96, 40 if fmt == "fp8" else 64, 2
    w_up, up_ref = _experts(fmt, e, 2 * inner, h)
    w_dn, dn_ref = _experts(fmt, e, h, inner)
    b_up, b_dn = torch.randn(e, 2 * inner), torch.randn(e, h)
    ids = torch.randint(0, e, (tokens * k,), dtype=torch.int32)
    scale = torch.rand(tokens * k)
    tiles = GemvTiles(32, 64 if fmt == "mxfp4" else 32, 4)
    if tensor_core:
        tiles = GemvTiles(64, 64, 4, tensor_core=1)
    d = device
    for dtype in _dtypes(device) if tokens == 1 or device == "cuda" else [torch.float32]:
        x = torch.randn(tokens, h).to(dtype)
        pre = torch.einsum("ph,pnh->pn", x.float().repeat_interleave(k, 0), up_ref[ids.long()])
        act_ref = _gated(pre + b_up[ids.long()].to(dtype).float(), act)
        got = gate_up(x.to(d), _to(w_up, d), ids.to(d), act=act, bias=b_up.to(dtype).to(d),
                      row_div=k, tiles=tiles)  # fmt: skip
        _close(got, act_ref, dtype)
        a = act_ref.to(dtype)
        y = torch.einsum("pi,phi->ph", a.float(), dn_ref[ids.long()]) + b_dn[ids.long()].to(dtype)
        want = (y * scale[:, None]).view(tokens, k, h).sum(1)
        got = down(a.to(d), _to(w_dn, d), ids.to(d), scale.to(d), k, bias=b_dn.to(dtype).to(d),
                   tiles=tiles)  # fmt: skip
        _close(got, want, dtype)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("tokens", [1, 7])
def test_grouped_gemm_matches_dequantized(device: str, fmt: str, tokens: int) -> None:
    """Both projections' shapes (rows read per token, then per pair) with bias and routing
    weights; the output starts as NaN so an unwritten row fails."""
    from resin_models_cuda.kernels.moe_grouped import align_pairs

    _, _, grouped = _kernels(fmt)
    torch.manual_seed(tokens + 11)
    e, h, n, k = 6, 160, 72, 2
    w, w_ref = _experts(fmt, e, n, h, block=(32, 32))
    bias, route = torch.randn(e, n), torch.rand(tokens * k)
    ids = torch.randint(0, e, (tokens * k,))
    d = device
    aligned = align_pairs(ids.to(d), e, 16)
    for dtype in _dtypes(device):
        x = torch.randn(tokens, h).to(dtype)
        rows = x.float().repeat_interleave(k, 0)
        want = torch.einsum("ph,pnh->pn", rows, w_ref[ids]) + bias[ids].to(dtype).float()
        want = want * route[:, None]
        out = torch.full((tokens * k, n), float("nan"), dtype=dtype, device=d)
        grouped(x.to(d), _to(w, d), aligned, num_pairs=tokens * k, row_div=k, out=out,
                bias=bias.to(dtype).to(d), scale=route.to(d), block_n=32, block_k=32,
                num_stages=1)  # fmt: skip
        _close(out, want, dtype)


GROUPED_FORMATS = {  # format: K
    "dense": 97, "fp8_block": 200, "fp8_channel": 97, "fp8_quantize_x": 200, "mxfp4": 96,
    "mxfp4_dot_scaled": 96,
}  # fmt: skip


def _grouped_format(fmt: str, x: torch.Tensor, w: torch.Tensor, aligned, **kw):  # type: ignore[no-untyped-def]
    """One launch of the grouped kernel in `fmt` on `w` (float32 [E, N, K]), quantized here;
    returns it and the dequantized weights it multiplied by."""
    from resin_models_cuda.kernels.moe_fp8 import Fp8Experts, fp8_grouped_gemm
    from resin_models_cuda.kernels.moe_grouped import grouped_gemm
    from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts, mxfp4_grouped_gemm

    d = x.device
    if fmt == "dense":
        w = w.to(x.dtype)
        return grouped_gemm(x, w.to(d), aligned, block_k=32, **kw), w.float()
    if fmt.startswith("fp8"):
        block = (1, w.shape[2]) if fmt == "fp8_channel" else (32, 64)
        q, s = quantize_fp8(w, block)
        group = 64 if fmt == "fp8_quantize_x" else None
        fp8 = Fp8Experts(q.to(d), s.to(d), block)
        out = fp8_grouped_gemm(x, fp8, aligned, block_k=64, quantize_group=group, **kw)
        return out, dequantize_fp8(q, s, block)
    b, s = quantize_mxfp4(w)
    mx, dot_scaled = Mxfp4Experts(b.to(d), s.to(d)), fmt == "mxfp4_dot_scaled"
    out = mxfp4_grouped_gemm(x, mx, aligned, block_k=64, dot_scaled=dot_scaled, **kw)
    return out, dequantize_mxfp4(b, s)


@pytest.mark.parametrize("fmt", sorted(GROUPED_FORMATS))
def test_grouped_kernel_every_format_equals_unfused_torch(device: str, fmt: str) -> None:
    """The one grouped kernel in each weight format against its unfused reference (the
    dequantized expert of each pair gathered, a float32 matmul, bias, routing weight): 70
    output columns (a partial 32-wide tile), K ending in a partial tile (FP8: in a partial
    scale block), experts no pair chose (blocks of expert -1), rows read per token and per
    pair, each activation dtype; the output starts as NaN so an unwritten row fails, and no
    pairs write nothing."""
    from resin_models_cuda.kernels.moe_grouped import align_pairs

    torch.manual_seed(len(fmt))
    e, n, tokens, k = 7, 70, 5, 2
    kk, dtypes = GROUPED_FORMATS[fmt], _dtypes(device)
    if fmt == "fp8_quantize_x":
        dtypes = [torch.float32]
    if fmt == "mxfp4_dot_scaled":  # tl.dot_scaled takes 16-bit activations
        dtypes = dtypes[1:]
    w = torch.randn(e, n, kk) * 0.3
    bias, route = torch.randn(e, n), torch.rand(tokens * k)
    ids = torch.tensor([0, 5, 2, 5, 0, 0, 2, 5, 5, 2])  # experts 1, 3, 4 and 6 get no pair
    d = device
    aligned = align_pairs(ids.to(d), e, 16)
    for dtype in dtypes:
        for row_div in (k, 1):
            x = torch.randn(tokens * k // row_div, kk).to(dtype)
            x_ref = x.float()
            if fmt == "fp8_quantize_x":
                x_ref = dequantize_fp8(*quantize_fp8_activations(x, 64), (1, 64))
            out = torch.full((tokens * k, n), float("nan"), dtype=dtype, device=d)
            _, w_ref = _grouped_format(fmt, x.to(d), w, aligned, num_pairs=tokens * k,
                                       row_div=row_div, out=out, bias=bias.to(dtype).to(d),
                                       scale=route.to(d), block_n=32, num_stages=1)  # fmt: skip
            rows = x_ref.repeat_interleave(row_div, 0)
            want = torch.einsum("pk,pnk->pn", rows, w_ref[ids]) + bias[ids].to(dtype).float()
            _close(out, want * route[:, None], dtype)
    none = torch.zeros(0, dtype=torch.int64, device=d)
    empty = torch.empty((0, n), device=d)
    got, _ = _grouped_format(fmt, torch.randn(0, kk, device=d), w, align_pairs(none, e, 16),
                             num_pairs=0, row_div=1, out=empty)  # fmt: skip
    assert got is empty


def test_mxfp4_register_decode_reads_every_byte(device: str) -> None:
    """The GEMV's register decode (`quant_tiles.e2m1_bits`: sign and magnitude bits placed
    into a float32, subnormal e2m1 codes included) over all 256 byte values, each row's
    16 bytes one group under its own scale; both register row-dots."""
    from resin_models_cuda.kernels.moe_gemv import GemvWeights, expert_down
    from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts, mxfp4_expert_down
    from resin_models_cuda.kernels.quant_tiles import MXFP4_PAIRS
    from resin_models_cuda.kernels.tiles import GemvTiles

    blocks = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 1, 16)
    scales = torch.arange(120, 136, dtype=torch.uint8).reshape(1, 16, 1)
    want_w = dequantize_mxfp4(blocks, scales)[0]  # [16, 32]
    x = torch.randn(1, 32)
    w = Mxfp4Experts(blocks.to(device), scales.to(device))
    one = torch.zeros(1, dtype=torch.int32, device=device)
    unit = torch.ones(1, device=device)
    got = mxfp4_expert_down(x.to(device), w, one, unit, 1, tiles=GemvTiles(16, 32, 4))
    _close(got, x @ want_w.T, torch.float32)
    # The paired-nibble row-dot (contiguous activation loads) reads them the same.
    paired = GemvWeights(w.blocks, w.scales, MXFP4_PAIRS)
    got = expert_down(x.to(device), paired, one, unit, 1, tiles=GemvTiles(8, 64, 4))
    _close(got, x @ want_w.T, torch.float32)
    # The tensor-core row-dot: float decode here, the bit-move bf16 decode for bf16 on the
    # GPU (bf16 x and exact bf16 weights: float32 sums, so only the bf16 output's rounding,
    # half a unit in the last place, separates it from the exact result).
    tc = GemvTiles(32, 32, 4, tensor_core=1)  # 16 rows in a 32-row tile
    got = mxfp4_expert_down(x.to(device), w, one, unit, 1, tiles=tc)
    _close(got, x @ want_w.T, torch.float32)
    if device == "cuda":
        xb = x.to(torch.bfloat16)
        got = mxfp4_expert_down(xb.to(device), w, one, unit, 1, tiles=tc).float().cpu()
        want = xb.float() @ want_w.T
        torch.testing.assert_close(got, want, rtol=2.0**-8, atol=1e-6 * want.abs().max().item())


def test_mxfp4_register_and_dot_scaled_paths_agree(device: str) -> None:
    """The GEMV decodes in registers unless asked for `tl.dot_scaled`, the grouped GEMM takes
    `tl.dot_scaled` for 16-bit activations unless asked not to; all match the dequantized
    weights."""
    from resin_models_cuda.kernels.moe_gemv import GemvTiles
    from resin_models_cuda.kernels.moe_grouped import align_pairs
    from resin_models_cuda.kernels.moe_mxfp4 import mxfp4_expert_down, mxfp4_grouped_gemm

    torch.manual_seed(4)
    e, n, kk, t = 3, 40, 128, 5
    w, w_ref = _experts("mxfp4", e, n, kk)
    ids, unit = torch.randint(0, e, (t,)), torch.ones(t)
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    x = torch.randn(t, kk).to(dtype)
    want = torch.einsum("pk,pnk->pn", x.float(), w_ref[ids])
    d, wd = device, _to(w, device)
    aligned = align_pairs(ids.to(d), e, 16)
    for dot_scaled in (True, False):
        got = mxfp4_expert_down(x.to(d), wd, ids.int().to(d), unit.to(d), 1,
                                tiles=GemvTiles(16, 64, 4), dot_scaled=dot_scaled)  # fmt: skip
        _close(got, want, dtype)
        out = torch.full((t, n), float("nan"), dtype=dtype, device=d)
        mxfp4_grouped_gemm(x.to(d), wd, aligned, num_pairs=t, row_div=1, out=out, block_n=32,
                           block_k=64, num_stages=1, dot_scaled=dot_scaled)  # fmt: skip
        _close(out, want, dtype)


@pytest.mark.parametrize("tokens", [2, 9])
def test_fp8_grouped_gemm_fused_activation_quantization(device: str, tokens: int) -> None:
    """Block FP8's prefill path: activations quantized per row and 128 columns inside the
    e4m3 grouped GEMM, as `quantize_fp8_activations(x, 128)` quantizes them."""
    from resin_models_cuda.kernels.moe_fp8 import fp8_grouped_gemm
    from resin_models_cuda.kernels.moe_grouped import align_pairs

    torch.manual_seed(tokens)
    e, h, n, k = 4, 300, 40, 3
    w, w_ref = _experts("fp8", e, n, h, block=(128, 128))
    x = torch.randn(tokens * k, h)
    ids = torch.randint(0, e, (tokens * k,))
    x_ref = dequantize_fp8(*quantize_fp8_activations(x, 128), (1, 128))
    want = torch.einsum("ph,pnh->pn", x_ref, w_ref[ids])
    d = device
    out = torch.full((tokens * k, n), float("nan"), device=d)
    fp8_grouped_gemm(x.to(d), _to(w, d), align_pairs(ids.to(d), e, 16), num_pairs=tokens * k,
                     row_div=1, out=out, quantize_group=128, block_n=32, block_k=128,
                     num_stages=1)  # fmt: skip
    _close(out, want, torch.float32)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_gemv_tile_shapes_agree_and_dense_is_one_expert(device: str, fmt: str) -> None:
    """Every launch shape computes the same; one expert of weight 1 is a dense GEMV (batch-1
    projections)."""
    from resin_models_cuda.kernels.moe_gemv import GemvTiles

    _, down, _ = _kernels(fmt)
    torch.manual_seed(2)
    n, kk = 50, 256
    w, w_ref = _experts(fmt, 1, n, kk, block=(1, kk))  # FP8 per-channel scales
    x = torch.randn(2, kk)
    one, unit = torch.zeros(2, dtype=torch.int32), torch.ones(2)
    want = x @ w_ref[0].T
    for tiles in [GemvTiles(4, 128, 4), GemvTiles(8, 64, 4, 2), GemvTiles(32, 256, 8)]:
        got = down(x.to(device), _to(w, device), one.to(device), unit.to(device), 1, tiles=tiles)
        _close(got, want, torch.float32)


def test_quantized_experts_refuse_bad_layouts(device: str) -> None:
    from resin_models_cuda.kernels.moe_fp8 import Fp8Experts
    from resin_models_cuda.kernels.moe_gemv import GemvTiles
    from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts

    fp8, _ = _experts("fp8", 2, 32, 256, block=(128, 128))
    mx, _ = _experts("mxfp4", 2, 32, 128)
    with pytest.raises(AssertionError):  # K tile of 256 over 128-column scale blocks
        fp8.check(256)
    with pytest.raises(AssertionError):
        Fp8Experts(fp8.w, fp8.scale[:, :, :0], fp8.block).check(128)
    with pytest.raises(AssertionError):  # K tile not whole 32-value groups
        mx.check(48)
    with pytest.raises(AssertionError):  # scales of another shape
        Mxfp4Experts(mx.blocks, mx.scales[:, :16]).check(64)
    _, down, _ = _kernels("mxfp4")
    with pytest.raises(AssertionError):
        down(torch.randn(2, 100), mx, torch.zeros(2, dtype=torch.int32), torch.ones(2), 1,
             tiles=GemvTiles(8, 64, 4))  # fmt: skip
