"""DeepSeek on the fast runner: the MLA kernels against plain PyTorch, and the fast model
against the reference runner on the same weights through the Engine (identical greedy tokens
in float32: chunked prefill, batching, prefix-cache hits). On CPU the kernels run in the
Triton interpreter; on a GPU the same tests run the compiled kernels."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.cuda.paged_ref import make_paged, ref_attention
from tests.cuda.test_vs_reference import _generate, _prompts, reference_and_fast

LATENT, ROPE = 64, 16  # small powers of two keep the interpreter quick


# bfloat16 has no NumPy type for the interpreter: float16 stands in on CPU (as in
# test_attention.py); the GPU runs bfloat16 too.
DTYPES = [(torch.float32, 1e-4), (torch.float16, 2e-2)]
if torch.cuda.is_available():
    DTYPES.append((torch.bfloat16, 3e-2))


@pytest.mark.parametrize(("dtype", "atol"), DTYPES)
@pytest.mark.parametrize(("heads", "splits"), [(20, 1), (16, 4)])
def test_mla_decode_matches_torch(
    device: str, dtype: torch.dtype, atol: float, heads: int, splits: int
) -> None:
    from resin_models_cuda.kernels.mla import mla_decode

    lens = [1, 13, 0, 30]  # a padding row (0) gives zeros
    case = make_paged(lens, 1, LATENT + ROPE, 4, dtype, device)
    q = torch.randn((len(lens), heads, LATENT + ROPE)).to(dtype).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    # The two query parts from separate strided views, the output into a head-major buffer.
    out_heads = torch.empty((heads, len(lens), LATENT), dtype=dtype, device=device)
    out = mla_decode(
        q[..., :LATENT], q[..., LATENT:], case.k_cache, case.page_indptr, case.page_ids,
        case.page_start, seq_lens, scale=0.2, splits=splits, out=out_heads.transpose(0, 1),
    )  # fmt: skip
    assert out.shape == (len(lens), heads, LATENT)
    for b, n in enumerate(lens):
        if n == 0:
            assert not out[b].any()
            continue
        k = case.dense_k[b]
        pos = torch.tensor([n - 1], device=device)
        ref = ref_attention(q[b : b + 1], k, k[..., :LATENT], pos, 0.2, 0)[0]
        torch.testing.assert_close(out[b].float(), ref, atol=atol, rtol=atol)


def test_latent_append_skips_padding_slots(device: str) -> None:
    from resin_models_cuda.kernels.mla import latent_append

    arena = torch.zeros((6, 2, 1, 4, 1, 80), device=device)  # [pages, layers, planes, page, 1, W]
    cache = arena[:, 1, 0]
    x = torch.randn((3, 80), device=device)
    latent_append(x, cache, torch.tensor([5, -1, 22], dtype=torch.int32, device=device))
    assert torch.equal(cache[1, 1, 0], x[0]) and torch.equal(cache[5, 2, 0], x[2])
    assert int((arena != 0).any(-1).sum()) == 2  # nothing else written, layer 0 untouched


def _deepseek(model_type: str, **extra: Any) -> dict[str, Any]:
    return {
        "model_type": model_type, "vocab_size": 256, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 512, "kv_lora_rank": LATENT, "qk_rope_head_dim": ROPE,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 24, "first_k_dense_replace": 1,
        **extra,
    }  # fmt: skip


CONFIGS = {
    # V3: q LoRA, interleaved rope, sigmoid routing with correction bias over 4 groups, YaRN.
    "v3": _deepseek(
        "deepseek_v3",
        q_lora_rank=24,
        n_group=4,
        topk_group=2,
        n_shared_experts=1,
        rope_scaling={
            "type": "yarn",
            "factor": 4.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
            "original_max_position_embeddings": 16,
        },
    ),
    # V2-Lite: no q LoRA, softmax greedy routing, two shared experts.
    "v2-lite": _deepseek("deepseek_v2", q_lora_rank=None, topk_method="greedy"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_same_tokens_as_reference_runner(device: str, name: str) -> None:
    reference, fast = reference_and_fast(CONFIGS[name], device)
    assert fast.runner_config.page_bytes == reference.runner_config.page_bytes  # one latent
    prompts = _prompts(256, full=device == "cuda")
    tokens = 6 if device == "cuda" else 3
    assert _generate(fast, prompts, tokens) == _generate(reference, prompts, tokens)


def test_v2_lite_preset_counts_match_the_published_size() -> None:
    from resin_model.presets import kv_bytes_read, param_counts, preset

    config = preset("deepseek-v2-lite")
    active, total = param_counts(config)
    assert 2.2e9 < active < 2.6e9  # published: 2.4B activated
    assert 15.0e9 < total < 16.0e9  # published: 15.7B with the input embedding
    assert kv_bytes_read(config, 1000) == 27 * 576 * 2 * 1000  # the latent, bf16


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads", [16, 128])  # V2-Lite's and V3's head counts
def test_mla_decode_real_dims_gpu(dtype: torch.dtype, heads: int) -> None:
    from resin_models_cuda.kernels.mla import mla_decode

    lens = [1, 1000, 4097, 0, 333]
    case = make_paged(lens, 1, 512 + 64, 16, dtype, "cuda")
    q = torch.randn((len(lens), heads, 512 + 64)).to(dtype).to("cuda")
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    for splits in (1, 8, 32):
        out = mla_decode(
            q[..., :512], q[..., 512:], case.k_cache, case.page_indptr, case.page_ids,
            case.page_start, seq_lens, scale=192**-0.5, splits=splits,
        )  # fmt: skip
        for b, n in enumerate(lens):
            if n:
                k = case.dense_k[b]
                pos = torch.tensor([n - 1], device="cuda")
                ref = ref_attention(q[b : b + 1], k, k[..., :512], pos, 192**-0.5, 0)[0]
                torch.testing.assert_close(out[b].float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_real_attention_dims_same_tokens_gpu(heads: int) -> None:
    """V2-Lite / V3 attention dims (latent 512 + 64, nope 128, v 128) in float32 with CUDA
    graphs: the fast runner's greedy tokens equal the reference runner's."""
    raw = _deepseek(
        "deepseek_v3", num_attention_heads=heads, hidden_size=512, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=128,
        n_group=4, topk_group=2, n_shared_experts=1,
    )  # fmt: skip
    reference, fast = reference_and_fast(raw, "cuda")
    prompts = _prompts(256, full=True)
    assert _generate(fast, prompts, 8) == _generate(reference, prompts, 8)
