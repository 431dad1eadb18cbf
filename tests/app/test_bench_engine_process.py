"""`resin bench engine-process` drives a real engine process over zmq to the end of its
requests and reports what it carried."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resin_app.bench.engine_process import main


def test_it_runs_every_request_and_writes_a_line(tmp_path: Path) -> None:
    out = tmp_path / "ep.jsonl"
    argv = ["--streams", "8", "--requests", "12", "--prompt-tokens", "20", "--output-tokens", "5"]
    assert main([*argv, "--output", str(out)]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["bench"] == "engine-process" and row["requests"] == 12
    assert row["steps"] >= 5 and row["output_tok_s"] > 0
    assert row["tokens"] == 12 * 5  # every request, every token
    assert row["tokens_per_step"] == pytest.approx(60 / row["steps"])
