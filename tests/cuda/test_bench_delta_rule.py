"""`resin bench delta-rule`: our delta-rule kernels and flash-linear-attention's (`fla-core`)
agree on the same inputs as the bench maps them (Gated DeltaNet with the gate and beta's
sigmoid in fla's kernel, KDA with precomputed log decays; l2-normed q / k, scale K^-0.5,
varlen rows by `cu_seqlens`, the K-first state), and the command writes its JSONL rows end to
end. Tiny shapes: in the interpreter fla's recurrent kernels run; its chunked ones do not
(skipped here with the reason, compared on a GPU)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fla", reason="fla-core (the dev extra) is not installed")

from resin_app.bench import delta_rule
from resin_app.bench.delta_rule import Row, Shape, agreement, fla_call, make_inputs, ours

# fla's chunked path cannot run in Triton 3.9's interpreter: every multi-config autotuned
# kernel asks the (absent) GPU driver for a benchmarker, and past that GDN's
# `chunk_delta_h` calls `.to` on a Python loop index and KDA's intra-chunk kernel calls
# fla's `gather` outside a JIT context.
NO_FLA_CHUNKED = "fla's chunked kernels do not run in Triton's interpreter (a GPU compares them)"

# GDN at an odd value width (masked value blocks on both sides; fla's GDN: blocks of 8). fla's
# chunked KDA (`chunk_gla_fwd_kernel_o`) stopped with "misaligned address" at K = 16, V = 24,
# at K = V = 32 and at K = V = 64 on an H100 (2026-12-07), which poisons the process's CUDA
# context for every later test; at GLM-5.3's K = V = 128 it runs (the bench's own shapes). So
# on a GPU the tiny KDA shapes are compared in the recurrent form only.
FLA_KDA_SMALL = "fla's chunk_kda: CUDA 'misaligned address' at small heads (poisons the context)"
SHAPES = [
    Shape("tiny-gdn", "gdn", 2, 4, 16, 24, None, 16),
    Shape("tiny-kda", "kda", 3, 3, 64, 64, -5.0, 16),
    Shape("tiny-kda-softplus", "kda", 2, 2, 64, 64, None, 16),
]
# Relative to the largest |value| of ours. The recurrent kernels are float32 sums on both
# sides; fla's chunked ones multiply float32 inputs as TF32 on a GPU (ours: `ieee`) and round
# the normed q / k and its intermediates to bf16 inputs' dtype.
TOL = {
    ("recurrent", torch.float32): 1e-5,
    ("recurrent", torch.bfloat16): 2e-2,
    ("chunked", torch.float32): 1e-2,
    ("chunked", torch.bfloat16): 3e-2,
}


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=[s.preset for s in SHAPES])
def test_our_kernels_agree_with_fla(
    device: str, shape: Shape, dtype: torch.dtype, mode: delta_rule.Mode
) -> None:
    if mode == "chunked" and device == "cpu":
        pytest.skip(NO_FLA_CHUNKED)
    if mode == "chunked" and shape.kernel == "kda":
        pytest.skip(FLA_KDA_SMALL)
    # Rows of 21 tokens: past one chunk of ours (16) on the chunked path, a long recurrence on
    # the recurrent one; three rows, each from its own state.
    x = make_inputs(shape, 3, 21, torch.device(device), dtype)
    _, theirs = fla_call(shape, mode, 32 if shape.kernel == "kda" else 16)
    diff = agreement(ours(shape, x, mode, shape.our_chunk)(), theirs(x))
    assert diff.out_scale > 0.01 and diff.state_scale > 0.01
    assert diff.within(TOL[mode, dtype]), diff


def test_the_bench_writes_one_jsonl_row_a_case(device: str, tmp_path: Path) -> None:
    out = tmp_path / "delta_rule.jsonl"
    # on a GPU without the tiny KDA preset's chunked case (FLA_KDA_SMALL)
    modes = "recurrent" if device == "cuda" else "chunked,recurrent"
    argv = ["--device", device, "--presets", "tiny-qwen3_5_moe,tiny-glm5_next", "--modes", modes,
            "--prefill-batches", "2", "--prefill-lengths", "20", "--decode-batches", "1,3",
            "--reps", "1", "--inner", "1", "--kernels", "--output", str(out)]  # fmt: skip
    assert delta_rule.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cases = [(r["kernel"], r["mode"], r["batch"], r["length"]) for r in rows]
    assert cases == [
        (kernel, mode, batch, length)
        for kernel in ("gdn", "kda")
        for mode, batch, length in [("chunked", 2, 20), ("recurrent", 1, 1), ("recurrent", 3, 1)]
        if mode in modes
    ]
    for r in rows:
        assert r["ours_us"] > 0 and r["fla_version"] == "0.6.0"
        if device == "cuda" and r["error"] is None:  # --kernels: ours' device time by kernel
            chunked = {"_chunk_prep_kernel", "_chunk_scan_kernel"}
            ours = chunked if r["mode"] == "chunked" else {"_delta_rule_kernel"}
            assert ours <= set(r["kernels_us"])
            assert all(us > 0 for us in r["kernels_us"].values())
        else:
            assert r["kernels_us"] is None
        assert r["our_chunk"] == (
            0 if r["mode"] == "recurrent" else {"gdn": 64, "kda": 16}[r["kernel"]]
        )
        if r["mode"] == "chunked" and device == "cpu":  # the interpreter: fla's side failed
            assert r["fla_us"] is None and r["error"] and r["ratio"] is None
            continue
        assert r["error"] is None and r["agree"], r
        assert r["ratio"] == pytest.approx(r["ours_us"] / r["fla_us"])
        assert r["decision"] == ("ours" if r["ratio"] <= 1.10 else "fla")
    # the heads and dims come from the presets
    assert {(r["kernel"], r["qk_heads"], r["v_heads"], r["k_dim"]) for r in rows} == {
        ("gdn", 2, 4, 16),
        ("kda", 2, 2, 16),
    }


def test_a_run_beside_an_earlier_one(device: str, tmp_path: Path, capsys: Any) -> None:
    """`--before`: each case beside the same case of an earlier run's JSONL; a case it lacks
    is left out, and a file that is not JSONL is a usage error."""
    first, second = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    argv = ["--device", device, "--presets", "tiny-qwen3_5_moe", "--modes", "recurrent",
            "--reps", "1", "--inner", "1"]  # fmt: skip
    assert delta_rule.main([*argv, "--decode-batches", "1", "--output", str(first)]) == 0
    capsys.readouterr()
    assert delta_rule.main([*argv, "--decode-batches", "1,2", "--output", str(second),
                            "--before", str(first)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    (old,), (new, _) = (
        [json.loads(x) for x in f.read_text().splitlines()] for f in (first, second)
    )
    (case,) = [x for x in text.splitlines() if x.startswith("gdn recurrent 1x1 ")]
    assert case.split()[-5:-2] == [f"{old['ours_us']:.1f}", f"{new['ours_us']:.1f}",
                                   f"{new['ours_us'] / old['ours_us']:.2f}"]  # fmt: skip
    assert "gdn recurrent 2x1" not in text  # not in the earlier run
    mean = f"after / before geometric mean {new['ours_us'] / old['ours_us']:.2f} over 1 cases"
    assert f"gdn recurrent: {mean}" in text
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(SystemExit):
        delta_rule.main([*argv, "--before", str(tmp_path / "bad.jsonl")])
    assert "--before" in capsys.readouterr().err


def test_against_pairs_cases_and_means_per_path() -> None:
    rows = [_row("gdn", "chunked", 200.0, 100.0, True), _row("gdn", "recurrent", 50.0, 40.0, True)]
    before = [json.loads(json.dumps(asdict(replace(rows[0], ours_us=400.0, fla_us=101.0))))]
    lines = delta_rule.against(rows, before)
    assert lines[2].split()[-5:] == ["400.0", "200.0", "0.50", "101.0", "100.0"]
    assert lines[3:] == ["gdn chunked: after / before geometric mean 0.50 over 1 cases"]
    assert delta_rule.against(rows, []) == lines[:2]  # nothing to pair


def _row(kernel: str, mode: str, ours_us: float, fla_us: float | None, agree: bool) -> Row:
    return Row(kernel, mode, "p", 1, 1, 1, 1, 16, 16, "bf16", 0, "tf32", 0, "f", 0.0, 0.0, 1.0,
               1.0, agree, ours_us, fla_us, "graph", None)  # fmt: skip


def test_the_decision_is_per_path_and_needs_fla_to_agree() -> None:
    rows = [
        _row("gdn", "chunked", 300.0, 100.0, True),  # ours 3x and 1.5x slower: fla
        _row("gdn", "chunked", 150.0, 100.0, True),
        _row("gdn", "recurrent", 110.0, 100.0, True),  # 1.10: keep ours
        _row("kda", "chunked", 300.0, 100.0, False),  # faster but disagrees: keep ours
        _row("kda", "recurrent", 100.0, None, True),  # fla failed: keep ours
    ]
    assert [r.decision for r in rows] == ["fla", "fla", "ours", "ours", None]
    verdicts = delta_rule.decide(rows)
    assert verdicts["gdn", "chunked"].startswith("fla (ours/fla: geometric mean 2.12, max 3.00")
    assert verdicts["gdn", "recurrent"].startswith("ours (ours/fla: geometric mean 1.10")
    assert verdicts["kda", "chunked"].startswith("ours (fla failed or disagreed")
    assert verdicts["kda", "recurrent"].startswith("ours (fla failed or disagreed")
