"""`resin bench router` end to end on the CPU (Triton's interpreter, eager, wall clock): its
JSONL rows (an unfused row and the fused ones per token count, swept launch shapes
included), every fused row choosing the unfused path's experts."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from resin_app.bench import router


def test_bench_router_writes_its_rows(tmp_path: Path, device: str) -> None:
    out = tmp_path / "router.jsonl"
    argv = ["--device", device, "--presets", "tiny", "--tokens", "1,3", "--reps", "1",
            "--sweep", "--block-e", "2", "--block-k", "16", "--sub-t", "2", "--warps", "1",
            "--output", str(out)]  # fmt: skip
    assert router.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["tokens"], r["path"]) for r in rows] == [
        (t, p) for t in (1, 3) for p in ("unfused", "fused", "fused")
    ]
    fused = [r for r in rows if r["path"] == "fused"]
    assert all(r["agree"] == 1.0 and r["us"] > 0 for r in fused)
    assert [r["default"] for r in fused] == [True, False, True, False]
    assert fused[1]["tiles"] == {"block_e": 2, "block_k": 16, "sub_t": 2, "num_warps": 1}


def test_bench_router_shapes_are_the_presets() -> None:
    """The model shapes the GPU run times: experts, hidden size, top-k and rule as the
    presets say, float32 routers where those models route in float32."""
    qwen, oss = router.shape_of("qwen3-30b-a3b"), router.shape_of("gpt-oss-20b")
    v4, glm = router.shape_of("deepseek-v4-flash"), router.shape_of("glm-5.3-flash")
    assert (qwen.moe.num_experts, qwen.hidden, qwen.moe.top_k) == (128, 2048, 8)
    assert (oss.moe.num_experts, oss.hidden, oss.moe.top_k, oss.moe.router_bias) == (
        32, 2880, 4, True)  # fmt: skip
    assert (v4.moe.num_experts, v4.hidden, v4.moe.top_k, v4.moe.scoring) == (
        256, 4096, 6, "sqrtsoftplus")  # fmt: skip
    assert (glm.moe.num_experts, glm.moe.scoring, glm.shared) == (288, "sigmoid", 1)
    assert v4.router_dtype == glm.router_dtype == torch.float32
    assert qwen.router_dtype == oss.router_dtype == torch.bfloat16
