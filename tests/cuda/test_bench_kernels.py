"""`resin bench runner --kernels` on tiny real models through Triton's interpreter (the CPU:
each launch's range is its "kernel"), and the MoE kernels' `launch_metadata` against a hand
count of the routed experts' bytes. The device-side linkage of kernels to launch ranges needs
CUDA (the pure attribution: tests/app/test_bench_kernels.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from resin_app.bench import runner
from resin_app.bench.kernel_census import Census, run_census
from resin_app.bench.kernel_table import UNATTRIBUTED, attribute
from resin_model.presets import preset

# CPU tensors through Triton's interpreter: on a CUDA machine the kernels compile and refuse
# them, and the GPU has its own test (the last one).
INTERPRETER = pytest.mark.skipif(
    torch.cuda.is_available(), reason="interpreter test (CPU tensors); the GPU runs the gpu one"
)


def _kernels(tmp_path: Path, model: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    out = tmp_path / "k.jsonl"
    argv = ["--random-weights", "--model-config", model, "--device", "cpu", "--context-lengths",
            "8", "--batch-sizes", "1", "--decode-contexts", "8", "--warmup", "0", "--iters", "1",
            "--kernels", "--kernel-steps", "1", "--kernel-rows", "100",
            "--output", str(out)]  # fmt: skip
    assert runner.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return [r for r in rows if r["kind"] == "kernel"], [r for r in rows if r["kind"] == "env"]


@INTERPRETER
def test_a_dense_decode_step_reads_its_weights_and_the_totals_add_up(tmp_path: Path) -> None:
    rows, (env,) = _kernels(tmp_path, "tiny")
    config = preset("tiny")
    assert rows and all(r["model"] == "tiny" and r["batch"] == 1 for r in rows)
    names = {r["name"]: r for r in rows}
    assert {"aten::mm", "_rmsnorm_kernel", "_decode_partial_kernel"} <= names.keys()
    assert names["aten::mm"]["basis"] == "aten" and names["_rmsnorm_kernel"]["basis"] == "args"
    # Every weight but the gathered embedding table is read once by some launch.
    embed = config.vocab_size * config.hidden_size * 4
    lm_head = 0 if config.tie_embeddings else embed
    assert sum(r["bytes"] for r in rows) >= env["weight_bytes"] - embed - lm_head
    mm = names["aten::mm"]
    assert mm["tb_s"] * 1e6 * mm["us"] == pytest.approx(mm["bytes"])
    step = json.loads((tmp_path / "k.jsonl").read_text().splitlines()[-1])
    assert step["kind"] == "kernel_step" and step["timed_us"] > 0
    assert step["kernel_us"] == pytest.approx(sum(r["us"] for r in rows))


def test_a_failed_census_keeps_the_timed_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The census runs after the timed rows and is extra: if it fails (a profiler that
    cannot link kernels on some machine), it says so and the JSONL keeps the prefill and
    decode rows (a GPU call's figures are not lost to it)."""

    def broken(*args: Any) -> None:
        raise RuntimeError("no kernels linked")

    from resin_app.bench.runner_bench import RunnerBench

    monkeypatch.setattr(RunnerBench, "kernel_census", broken)
    rows, (env,) = _kernels(tmp_path, "tiny")
    assert rows == [] and env["model"] == "tiny"
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "k.jsonl").read_text().splitlines()]
    assert kinds.count("prefill") == 1 and kinds.count("decode") == 1
    assert "batch 1: the kernel census failed: RuntimeError: no kernels linked" in (
        capsys.readouterr().err
    )


@INTERPRETER
def test_the_moe_step_reports_the_routed_experts_bytes(tmp_path: Path) -> None:
    rows, _ = _kernels(tmp_path, "tiny-qwen3_moe")
    moe = preset("tiny-qwen3_moe").moe
    assert moe is not None
    hidden, inner = preset("tiny-qwen3_moe").hidden_size, moe.intermediate_size
    gate_up = {r["name"]: r for r in rows}["_gate_up_kernel"]
    # Batch 1: top-k distinct experts of a [E, 2I, H] float32 stack, plus x, ids and output.
    routed = moe.top_k * 2 * inner * hidden * 4
    assert gate_up["basis"] == "meta" and gate_up["launches"] == 1
    assert routed < gate_up["bytes"] < routed + 1024
    assert gate_up["bytes"] < moe.num_experts * 2 * inner * hidden * 4  # not the whole stack


@INTERPRETER
def test_the_expert_kernels_launch_metadata_counts_distinct_experts() -> None:
    from resin_models_cuda.kernels.moe_gemv import expert_down, expert_gate_up

    e, inner, h = 6, 8, 16
    x = torch.randn(1, h)
    w_gu, w_d = torch.randn(e, 2 * inner, h), torch.randn(e, h, inner)
    experts = torch.tensor([4, 1, 4])  # two distinct experts, three pairs
    census = Census(measure=True, ranges=False)
    with census.active():
        act = expert_gate_up(x, w_gu, experts, row_div=3)
        expert_down(act, w_d, experts, torch.ones(3), topk=3)
    gu = next(x for x in census.launches if x.name == "_gate_up_kernel")
    down = next(x for x in census.launches if x.name == "_down_kernel")
    assert gu.basis == down.basis == "meta"
    assert gu.bytes == 2 * 2 * inner * h * 4 + h * 4 + 3 * 8 + 3 * inner * 4
    # down: two experts' [H, I], act, ids, routing weights, the float32 sum [1, H]
    assert down.bytes == 2 * h * inner * 4 + 3 * inner * 4 + 3 * 8 + 3 * 4 + h * 4


@INTERPRETER
def test_the_grouped_kernels_launch_metadata_counts_the_routed_blocks_experts() -> None:
    from resin_models_cuda.kernels.moe_grouped import align_pairs, grouped_gemm

    e, n, k = 5, 8, 16
    x, w = torch.randn(2, k), torch.randn(e, n, k)
    experts = torch.tensor([3, 0, 3, 3])  # 2 tokens x top 2: experts 0 and 3
    aligned = align_pairs(experts, e, 4)
    out = torch.empty(4, n)
    census = Census(measure=True, ranges=False)
    with census.active():
        grouped_gemm(x, w, aligned, num_pairs=4, row_div=2, out=out, block_n=8, block_k=16)
    (launch,) = [x for x in census.launches if x.name == "_grouped_kernel"]
    index = (aligned.sorted_pairs.numel() + aligned.block_expert.numel()) * 4
    assert launch.basis == "meta"
    assert launch.bytes == 2 * n * k * 4 + x.numel() * 4 + out.numel() * 4 + index


@INTERPRETER
def test_decode_attention_counts_the_attended_tokens_not_the_arena() -> None:
    from resin_models_cuda.kernels import decode_attention
    from tests.cuda.paged_ref import make_paged

    lens, hkv, hq, d = [5, 17, 0], 2, 4, 16
    case = make_paged(lens, hkv, d, 8, torch.float32, "cpu")
    q = torch.randn(len(lens), hq, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    census = Census(measure=True, ranges=False)
    with census.active():
        decode_attention(q, case.kv, seq_lens, scale=0.25, splits=2, block_n=16)
    (partial,) = [x for x in census.launches if x.name == "_decode_partial_kernel"]
    kv = sum(lens) * 2 * hkv * d * 4
    tables = sum(t.numel() * t.element_size()
                 for t in (case.page_indptr, case.page_ids, case.page_start, seq_lens))  # fmt: skip
    o_part, lse = 3 * hq * 2 * d * 4, 3 * hq * 2 * 4
    assert partial.basis == "meta"
    assert partial.bytes == kv + q.numel() * 4 + o_part + lse + tables
    assert partial.bytes < 2 * case.k_cache.numel() * 4  # the arena holds more pages


@INTERPRETER
def test_rope_and_kv_append_count_the_slots_they_write_not_the_arena() -> None:
    from resin_models_cuda.kernels.kv_append import kv_append
    from resin_models_cuda.kernels.rope import apply_rope

    t, hq, hk, d, half, pages, page = 3, 4, 2, 16, 8, 10, 4
    q, k, v = torch.randn(t, hq, d), torch.randn(t, hk, d), torch.randn(t, hk, d)
    cos, sin = torch.randn(64, half), torch.randn(64, half)
    k_cache, v_cache = torch.zeros(pages, page, hk, d), torch.zeros(pages, page, hk, d)
    pos, slots = torch.tensor([5, 9, 2], dtype=torch.int32), torch.tensor([0, 7, 13])
    norms = (torch.ones(d), torch.ones(d))
    census = Census(measure=True, ranges=False)
    with census.active():
        apply_rope(q, k, pos, cos, sin, norms, append=(v, k_cache, v_cache, slots))
        kv_append(k, v, k_cache, v_cache, slots)
    rope = next(x for x in census.launches if x.name == "_rope_kernel")
    append = next(x for x in census.launches if x.name == "_kv_append_kernel")
    tokens_kv = t * hk * d * 4  # one of K or V for the T tokens
    assert rope.basis == append.basis == "meta"
    assert rope.bytes == (
        2 * (t * hq * d + t * hk * d) * 4 + t * 4 + 2 * t * half * 4 + 2 * d * 4
        + tokens_kv + t * 8 + 2 * tokens_kv
    )  # fmt: skip
    assert append.bytes == 2 * tokens_kv + t * 8 + 2 * tokens_kv


@INTERPRETER
def test_the_census_works_through_the_interpreter_and_attributes_every_range() -> None:
    """The CPU form of the GPU test below: the ranges are the kernels."""
    _attribution_case(torch.device("cpu"))


@pytest.mark.gpu
def test_on_cuda_every_kernel_is_linked_to_the_launch_that_ran_it() -> None:
    """The profiler's side, which only a GPU shows: each device kernel of a cuBLAS GEMM, a
    Triton kernel and an elementwise op is linked to its launch's range (no unattributed
    time), and the Triton kernel carries its launch's bytes."""
    _attribution_case(torch.device("cuda"))


def _attribution_case(device: torch.device) -> None:
    from resin_models_cuda.kernels.rmsnorm import rmsnorm

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(8, 256, device=device, dtype=dtype)
    w, norm = torch.randn(256, 256, device=device, dtype=dtype), torch.ones(256, device=device)

    def work() -> None:
        y = rmsnorm(x @ w, norm.to(dtype), 1e-6)
        y.add_(1)

    work()
    found = run_census(work, device)
    assert found.matched and all(e.launch is not None for e in found.events)
    rows = {r.name: r for r in attribute(found.launches, found.events, steps=1)}
    assert UNATTRIBUTED not in rows
    size = dtype.itemsize
    assert rows["_rmsnorm_kernel"].bytes == (2 * 8 * 256 + 256) * size
    assert rows["_rmsnorm_kernel"].launches == 1
    gemm = sum(r.bytes for r in rows.values() if r.basis == "aten")
    assert gemm >= (256 * 256 + 2 * 8 * 256) * size  # w, x and the product at least
