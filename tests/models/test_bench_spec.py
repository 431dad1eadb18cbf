"""`resin bench speculative` on a tiny model (reference runner, CPU): plain and speculative runs
side by side, identical greedy outputs, and the bench-only forced acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ref_hf import checkpoint

from resin_app.cli import main


def _bench(extra: list[str], tmp_path: Path) -> list[dict[str, object]]:
    folder, _ = checkpoint("smollm2")
    out = tmp_path / "spec.jsonl"
    argv = ["bench", "speculative", "--speculative", "ngram", "--checkpoint", str(folder),
            "--batch-sizes", "1,3", "--input-len", "24", "--output-len", "17",
            "--output", str(out), *extra]  # fmt: skip
    assert main(argv) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_bench_speculative_reports_plain_and_speculative_side_by_side(tmp_path: Path) -> None:
    rows = _bench(["--num-draft-tokens", "3"], tmp_path)
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        # 16 decode tokens: 16 steps, plus one to fill and one to drain the pipeline when the
        # plain run overlaps (the reference runner overlaps by default; drafts never do).
        assert r["identical"] is True and r["plain_steps"] in (16, 18)
        assert r["spec_steps"] <= r["plain_steps"]


def test_forced_acceptance_commits_k_plus_one_tokens_per_step(tmp_path: Path) -> None:
    rows = _bench(["--accepted-drafts", "3"], tmp_path)
    for r in rows:
        assert r["identical"] is None and r["accepted_tokens"] == r["draft_tokens"] > 0
        assert r["spec_steps"] == 4  # 16 decode tokens, 4 per verify step


def test_forced_acceptance_needs_a_runner_that_supports_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from resin_app.bench import speculative
    from tests.engine.fakes import CacheSimRunner

    monkeypatch.setattr(speculative, "_folder", lambda name: None)
    monkeypatch.setattr(speculative, "_runner", lambda args, name, folder: CacheSimRunner())
    argv = ["--speculative", "ngram", "--checkpoint", "x", "--accepted-drafts", "2"]
    assert speculative.main(argv) == 2
    assert "no bench-only forced acceptance" in capsys.readouterr().err
