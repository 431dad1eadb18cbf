"""DeepSeek-V4's kernels (`kernels/mhc.py`, `kernels/indexer.py`, `kernels/compressor.py`)
against the reference runner's modules (`resin_models_torch.mhc`, `deepseek_v4`), float32,
in the Triton interpreter on CPU: mHC's Sinkhorn weights and the final collapse's, the
gathered indexer's scores and top-k selection (`indexer_topk_torch`; compared where the
selection is unique: the test checks the gap at the k-th candidate; the paged form and its
radix top-k: `test_indexer.py`), and the compressor's gated pooling of HCA and CSA entries."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resin_model.config import RopeConfig
from resin_models_cuda.kernels.compressor import gated_pool
from resin_models_cuda.kernels.indexer import indexer_scores, indexer_topk_torch
from resin_models_cuda.kernels.mhc import hc_head_weights, hc_weights
from resin_models_torch.deepseek_v4 import Compressor, V4Rotary, rope_tail
from resin_models_torch.mhc import HyperConnection, HyperHead, hc_mix, unweighted_rms_norm

torch.set_num_threads(1)


def _randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    return module


def test_hc_weights_equal_the_reference(device: str) -> None:
    for mult, hidden in ((4, 32), (2, 16), (3, 8)):
        hc = _randomized(HyperConnection(hidden, mult, 20, 1e-6, 1e-6), mult).to(device)
        assert isinstance(hc, HyperConnection)
        streams = torch.randn(7, mult, hidden, device=device)
        post, comb, collapsed = hc(streams)
        flat = unweighted_rms_norm(streams.flatten(1).float(), 1e-6)
        mixes = F.linear(flat, hc.fn.float()).contiguous()
        pre, post_k, comb_k = hc_weights(mixes, hc.scale, hc.base, 20, 1e-6)
        torch.testing.assert_close(post_k, post, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(comb_k, comb, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close((pre[..., None] * streams).sum(1), collapsed)
        out = torch.randn(7, hidden, device=device)
        torch.testing.assert_close(hc_mix(streams, post_k, comb_k, out),
                                   hc_mix(streams, post, comb, out))  # fmt: skip
    empty = torch.zeros(0, hc.fn.shape[0], device=device)
    assert hc_weights(empty, hc.scale, hc.base, 20, 1e-6)[0].shape == (0, 3)


def test_hc_head_weights_equal_the_reference(device: str) -> None:
    head = _randomized(HyperHead(16, 4, 1e-6, 1e-6), 2).to(device)
    assert isinstance(head, HyperHead)
    streams = torch.randn(5, 4, 16, device=device)
    flat = unweighted_rms_norm(streams.flatten(1).float(), 1e-6)
    mixes = F.linear(flat, head.hc_fn.float()).contiguous()
    pre = hc_head_weights(mixes, head.hc_scale, head.hc_base, 1e-6)
    torch.testing.assert_close((pre[..., None] * streams).sum(1), head(streams))


def _reference_pool(kv: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    weights = (gate + bias).softmax(dim=1, dtype=torch.float32).to(kv.dtype)
    return (kv * weights).sum(dim=1)


def test_gated_pool_equals_the_reference_compressor(device: str) -> None:
    rope = RopeConfig(theta=10000.0)
    rotary = V4Rotary(rope, 4).to(device)
    for overlap, ratio in ((False, 8), (True, 4)):
        comp = _randomized(Compressor(16, 12, ratio, overlap, 1e-6), ratio).to(device)
        assert isinstance(comp, Compressor)
        tokens = torch.randn(5 * ratio, 16, device=device)
        projected = comp.project(tokens)
        want = comp.entries(projected, 0, 0, 5, rotary)
        # the same slots, gathered as the fast model does, pooled by the kernel
        kv_all, gate_all = projected.view(5, ratio, -1).chunk(2, dim=-1)
        bias = comp.position_bias.float()
        if overlap:  # slots: the previous block's first half, then the block's second half
            w = comp.width
            prev_kv = torch.cat((torch.zeros_like(kv_all[:1]), kv_all[:-1]))[..., :w]
            prev_gate = torch.cat((torch.full_like(gate_all[:1], float("-inf")), gate_all[:-1]))
            kv = torch.cat((prev_kv, kv_all[..., w:]), dim=1)
            gate = torch.cat((prev_gate[..., :w], gate_all[..., w:]), dim=1)
            bias = torch.cat((bias[:, :w], bias[:, w:]))
        else:
            kv, gate = kv_all, gate_all
        pooled = gated_pool(kv, gate, bias)
        torch.testing.assert_close(pooled, _reference_pool(kv, gate, bias))
        got = rope_tail(
            comp.kv_norm(pooled), *rotary.cos_sin(torch.arange(5, device=device) * ratio)
        )
        torch.testing.assert_close(got, want)


def test_indexer_scores_and_selection_equal_the_reference(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    heads, dim, ratio, topk = 8, 16, 4, 3
    counts = [9, 2, 0]  # entries per row (a row with none)
    positions = [[36, 37, 38, 39], [8], [2, 3]]  # queries of each row
    keys = torch.randn(3, 9, dim, generator=gen)
    rows = [b for b, ps in enumerate(positions) for _ in ps]
    flat_pos = [p for ps in positions for p in ps]
    q = torch.randn(len(rows), heads, dim, generator=gen)
    w = torch.randn(len(rows), heads, generator=gen) * heads**-0.5
    dev = [torch.tensor(a, dtype=torch.int32, device=device) for a in (rows, flat_pos, counts)]
    scores = indexer_scores(q.to(device), keys.to(device), w.to(device), *dev, ratio).cpu()
    for t, (b, p) in enumerate(zip(rows, flat_pos, strict=True)):
        visible = min(counts[b], (p + 1) // ratio)
        want = torch.einsum("hd,ed->he", q[t], keys[b, :visible]).relu() * dim**-0.5
        want = (want * w[t, :, None]).sum(0)
        torch.testing.assert_close(scores[t, :visible], want)
        assert bool((scores[t, visible:] == float("-inf")).all())
        # selection: unique here (checked), so the top-k set is the reference's
        ranked = want.sort(descending=True).values
        if visible > topk:
            assert float(ranked[topk - 1] - ranked[topk]) > 1e-6
        expected = set(want.topk(min(topk, visible)).indices.tolist())
        picks = indexer_topk_torch(scores, topk)[t].tolist()
        assert {w for w in picks if w >= 0} == expected
        assert picks.count(-1) == topk - len(expected)
