"""`resin bench runner --variants`: one model run per launch variant in one process, the rows
named by variant, each against base at the end, the class-wide switches set only inside their
run; on the CPU through Triton's interpreter (the pdl variant needs sm_90: a clear exit)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from resin_app.bench import runner
from resin_models_cuda.layers.moe import MoE


def _argv(tmp_path: Path, variants: str, device: str = "cpu") -> list[str]:
    return ["--random-weights", "--model-config", "tiny-qwen3_moe", "--device", device,
            "--context-lengths", "8", "--batch-sizes", "1", "--decode-contexts", "8",
            "--warmup", "0", "--iters", "1", "--variants", variants,
            "--output", str(tmp_path / "v.jsonl")]  # fmt: skip


def test_each_variant_runs_under_its_own_switches(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    device: str,
) -> None:
    seen = []
    bench_model = runner._bench_model

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(MoE.fused_router)
        return bench_model(*args, **kwargs)

    monkeypatch.setattr(runner, "_bench_model", spy)
    assert runner.main(_argv(tmp_path, "base,router", device)) == 0
    assert seen == [False, True]
    assert MoE.fused_router is False  # restored
    rows = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in rows if r["kind"] == "env"] == ["base", "router"]
    models = {r["model"] for r in rows if r["kind"] == "decode"}
    assert models == {"tiny-qwen3_moe", "tiny-qwen3_moe+router"}
    out = capsys.readouterr().out
    assert "variant / base (tok/s ratio):" in out
    assert "tiny-qwen3_moe+router decode batch 1 context 8" in out


def test_a_bad_variant_and_pdl_without_sm90_are_refused(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="base or a"):
        runner._variants("base,pdl+merge")
    assert runner._variants("router+pdl,base") == [("pdl", "router"), ()]
    with pytest.raises(SystemExit, match="sm_90"):  # the CPU: no PDL (on any device here)
        runner.main(_argv(tmp_path, "pdl"))
