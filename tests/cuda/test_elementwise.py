"""KV append, RMSNorm (alone and fused with the residual add), RoPE and SiLU-and-mul vs
plain PyTorch over odd shapes and (dtype, atol, rtol) pairs."""

from __future__ import annotations

import pytest
import torch

from resin_model.config import RopeConfig

DTYPES = [(torch.float32, 1e-5, 1e-5), (torch.float16, 2e-3, 2e-3)]
GPU_DTYPES = [(torch.bfloat16, 2e-2, 2e-2), (torch.float16, 2e-3, 2e-3)]


def _dtypes(device: str) -> list[tuple[torch.dtype, float, float]]:
    return GPU_DTYPES if device == "cuda" else DTYPES


def _ref_norm(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    vf = v.float()
    return w * (vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(v.dtype)


@pytest.mark.parametrize("shape", [(1, 8), (7, 100), (33, 4096)])
def test_rmsnorm_and_fused_add(device: str, shape: tuple[int, int]) -> None:
    from resin_models_cuda.kernels import fused_add_rmsnorm, rmsnorm

    for dtype, atol, rtol in _dtypes(device):
        x = torch.randn(shape).to(dtype).to(device)
        res = torch.randn(shape).to(dtype).to(device)
        w = torch.randn(shape[1]).to(dtype).to(device)

        torch.testing.assert_close(rmsnorm(x, w, 1e-6), _ref_norm(x, w), atol=atol, rtol=rtol)
        summed = x + res
        expect = _ref_norm(summed, w)
        fused_add_rmsnorm(x, res, w, 1e-6)
        torch.testing.assert_close(res, summed, atol=atol, rtol=rtol)
        torch.testing.assert_close(x, expect, atol=atol, rtol=rtol)


@pytest.mark.parametrize(("tokens", "inter"), [(1, 5), (9, 1500), (3, 14336)])
def test_silu_and_mul(device: str, tokens: int, inter: int) -> None:
    from resin_models_cuda.kernels import silu_and_mul

    for dtype, atol, rtol in _dtypes(device):
        x = torch.randn((tokens, 2 * inter)).to(dtype).to(device)
        gate, up = x.chunk(2, dim=-1)
        expect = torch.nn.functional.silu(gate) * up
        torch.testing.assert_close(silu_and_mul(x), expect, atol=atol, rtol=rtol)


def test_silu_clamp_activation(device: str) -> None:
    """GLM-5.3 / DeepSeek-V4's clamped SwiGLU: silu(min(gate, l)) * clamp(up, -l, l)."""
    from resin_models_cuda.kernels.activation import gated_activation

    x = (torch.randn((7, 2 * 300)) * 8).to(device)
    gate, up = x.chunk(2, dim=-1)
    expect = torch.nn.functional.silu(gate.clamp(max=5.0)) * up.clamp(-5.0, 5.0)
    assert (gate > 5).any() and (up.abs() > 5).any()
    got = gated_activation(x, "silu_clamp", limit=5.0)
    torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-5)


def _ref_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


@pytest.mark.parametrize(
    "rope",
    [
        RopeConfig(10000.0),
        RopeConfig(10000.0, "llama3", 8.0, 1.0, 4.0, 64),
        RopeConfig(10000.0, "yarn", 4.0, original_max_position=64, attention_factor=1.2),
    ],
)
@pytest.mark.parametrize(("tokens", "heads", "head_dim"), [(1, (1, 1), 8), (13, (6, 2), 64)])
def test_rope_in_place(
    device: str, rope: RopeConfig, tokens: int, heads: tuple[int, int], head_dim: int
) -> None:
    from resin_models_cuda.kernels import apply_rope, rope_cache

    cos, sin = rope_cache(rope, head_dim, 512, device)
    for dtype, atol, rtol in _dtypes(device):
        # q and k as views of one fused qkv projection, like the runner's.
        qkv = torch.randn((tokens, (heads[0] + 2 * heads[1]) * head_dim)).to(dtype).to(device)
        q = qkv[:, : heads[0] * head_dim].view(tokens, heads[0], head_dim)
        k = qkv[:, heads[0] * head_dim : (heads[0] + heads[1]) * head_dim]
        k = k.view(tokens, heads[1], head_dim)
        pos = torch.randint(0, 512, (tokens,), dtype=torch.int32).to(device)
        expect_q = _ref_rope(q, cos[pos.long()], sin[pos.long()]).to(dtype)
        expect_k = _ref_rope(k, cos[pos.long()], sin[pos.long()]).to(dtype)
        apply_rope(q, k, pos, cos, sin)
        torch.testing.assert_close(q, expect_q, atol=atol, rtol=rtol)
        torch.testing.assert_close(k, expect_k, atol=atol, rtol=rtol)


@pytest.mark.parametrize("kind", ["llama3", "yarn"])
def test_rope_scaling_matches_transformers(kind: str) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from resin_model.hf_config import parse_config
    from resin_models_cuda.kernels import rope_cache

    params = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    if kind == "yarn":  # gpt-oss's
        params = {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        }
    raw = dict(
        model_type="llama",
        vocab_size=8,
        head_dim=64,
        hidden_size=256,
        num_attention_heads=4,
        num_hidden_layers=1,
        max_position_embeddings=131072,
        rope_parameters=params,
    )
    inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](transformers.LlamaConfig(**raw), "cpu")
    rope = parse_config(raw).rope
    cos, _ = rope_cache(rope, 64, 4)
    torch.testing.assert_close(rope.attention_factor, float(factor))
    expect = torch.cos(3 * inv_freq.float()) * factor
    torch.testing.assert_close(cos[3], expect, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("tokens", "kv_heads", "head_dim", "page"), [(5, 1, 8, 4), (40, 3, 32, 16)]
)
def test_kv_append_writes_exact_slots(
    device: str, tokens: int, kv_heads: int, head_dim: int, page: int
) -> None:
    from resin_models_cuda.kernels import kv_append

    pages = tokens // page + 4
    arena = torch.zeros((pages, 2, 2, page, kv_heads, head_dim), device=device)
    k_cache, v_cache = arena[:, 1, 0], arena[:, 1, 1]
    slots = torch.randperm(pages * page)[:tokens].to(device)
    slots[0] = -1  # a padding row writes nothing
    k = torch.randn((tokens, kv_heads, head_dim), device=device)
    v = torch.randn((tokens, kv_heads, head_dim), device=device)
    kv_append(k, v, k_cache, v_cache, slots)
    flat_k = k_cache.reshape(pages * page, kv_heads, head_dim)
    flat_v = v_cache.reshape(pages * page, kv_heads, head_dim)
    torch.testing.assert_close(flat_k[slots[1:]], k[1:])
    torch.testing.assert_close(flat_v[slots[1:]], v[1:])
    written = torch.zeros(pages * page, dtype=torch.bool, device=device)
    written[slots[1:]] = True
    assert torch.all(flat_k[~written] == 0) and torch.all(arena[:, 0] == 0)


@pytest.mark.parametrize("norm", [False, True])
def test_rope_with_fused_kv_append(device: str, norm: bool) -> None:
    """`apply_rope(..., append=...)` writes what rope then `kv_append` would: the rotated k
    and v at their slots (a padding slot writes nothing), q rotated in place as before."""
    from resin_models_cuda.kernels import apply_rope, kv_append, rope_cache

    tokens, hq, hk, dim, page, pages = 11, 6, 3, 32, 4, 8
    cos, sin = rope_cache(RopeConfig(10000.0), dim, 64, device)
    pos = torch.randint(0, 64, (tokens,), dtype=torch.int32).to(device)
    slots = torch.randperm(pages * page)[:tokens].to(device)
    slots[3] = -1
    qkv = torch.randn((tokens, (hq + 2 * hk) * dim), device=device)
    norms = (torch.randn(dim, device=device), torch.randn(dim, device=device)) if norm else None
    results = []
    for fused in (False, True):
        x = qkv.clone()
        q = x[:, : hq * dim].view(tokens, hq, dim)
        k = x[:, hq * dim : (hq + hk) * dim].view(tokens, hk, dim)
        v = x[:, (hq + hk) * dim :].view(tokens, hk, dim)
        arena = torch.zeros((pages, 1, 2, page, hk, dim), device=device)
        caches = (arena[:, 0, 0], arena[:, 0, 1])
        append = (v, *caches, slots) if fused else None
        apply_rope(q, k, pos, cos, sin, norms, append=append)
        if not fused:
            kv_append(k, v, *caches, slots)
        results.append((x, arena))
    torch.testing.assert_close(results[1][0], results[0][0], atol=0, rtol=0)
    torch.testing.assert_close(results[1][1], results[0][1], atol=0, rtol=0)
    assert torch.count_nonzero(results[1][1]) > 0


def _ref_partial(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weight: torch.Tensor | None
) -> torch.Tensor:
    """Plain PyTorch: RMS norm over the whole head (when `weight`), then rotate-half over the
    leading 2 * cos.shape[-1] dims; the rest of the head passes."""
    x = x.float()
    if weight is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    rotated = 2 * cos.shape[-1]
    return torch.cat([_ref_rope(x[..., :rotated], cos, sin), x[..., rotated:]], dim=-1)


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(16, 4), (64, 32), (32, 8)])
def test_partial_rotary(device: str, norm: bool, head_dim: int, rotary_dim: int) -> None:
    """GLM-4.5's partial rotary: only the leading `rotary_dim` dims of each head turn, the
    per-head norm covers the whole head, and the fused KV append stores all of k and v."""
    from resin_models_cuda.kernels import apply_rope, kv_append, rope_cache

    tokens, hq, hk, page, pages = 7, 6, 2, 4, 4
    cos, sin = rope_cache(RopeConfig(10000.0), rotary_dim, 64, device)
    pos = torch.randint(0, 64, (tokens,), dtype=torch.int32).to(device)
    slots = torch.randperm(pages * page)[:tokens].to(device)
    for dtype, atol, rtol in _dtypes(device):
        qkv = torch.randn((tokens, (hq + 2 * hk) * head_dim)).to(dtype).to(device)
        weights = [torch.randn(head_dim).to(dtype).to(device) for _ in range(2)]
        norms = (weights[0], weights[1]) if norm else None
        q = qkv[:, : hq * head_dim].view(tokens, hq, head_dim)
        k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(tokens, hk, head_dim)
        v = qkv[:, (hq + hk) * head_dim :].view(tokens, hk, head_dim)
        c, s = cos[pos.long()], sin[pos.long()]
        expect_q = _ref_partial(q, c, s, weights[0] if norm else None).to(dtype)
        expect_k = _ref_partial(k, c, s, weights[1] if norm else None).to(dtype)
        arena = torch.zeros((pages, 1, 2, page, hk, head_dim), dtype=dtype, device=device)
        apply_rope(q, k, pos, cos, sin, norms, append=(v, arena[:, 0, 0], arena[:, 0, 1], slots))
        torch.testing.assert_close(q, expect_q, atol=atol, rtol=rtol)
        torch.testing.assert_close(k, expect_k, atol=atol, rtol=rtol)
        unfused = torch.zeros_like(arena)
        kv_append(k, v, unfused[:, 0, 0], unfused[:, 0, 1], slots)
        torch.testing.assert_close(arena, unfused, atol=0, rtol=0)
