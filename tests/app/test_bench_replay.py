"""`resin bench serve --output` records the workload it sent, and `resin bench replay` runs that
same mix through the Engine alone (the zero-cost runner on the CPU): HTTP / Engine is stated
on one workload."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from resin.server.launch import running
from resin_app.bench import replay, serve
from resin_app.loading import LoadOptions, load
from tests.server.conftest import serve_loaded


def test_a_recorded_workload_replays_through_the_engine_alone(tmp_path: Path) -> None:
    recorded = tmp_path / "serve.jsonl"
    loaded = load(LoadOptions(fake=True), progress=False)
    try:
        with running(serve_loaded(loaded)) as base:
            argv = ["--url", base, "--num-prompts", "12", "--max-concurrency", "4"]
            args = serve.parser().parse_args([*argv, "--output-len", "8", "--input-len", "20"])
            result = asyncio.run(serve.run(args))
    finally:
        loaded.close()
    assert result["failed"] == 0
    recorded.write_text(json.dumps(result) + "\n")
    rows = result["workload"]
    assert len(rows) == 12
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)  # arrival order
    assert all(r[1] > 20 and r[2] == 8 and 0 <= r[3] < r[1] for r in rows)

    report = tmp_path / "replay.jsonl"
    argv = ["--workload", str(recorded), "--fake-runner", "--output", str(report)]
    assert replay.main(argv) == 0
    engine = json.loads(report.read_text().splitlines()[-1])
    assert engine["completed"] == 12
    assert engine["output_tokens"] == 12 * 8
    assert engine["prompt_tokens"] == sum(r[1] for r in rows)  # the same mix, token for token
    assert engine["http_output_tok_s"] == result["output_tok_s"]
    assert engine["http_over_engine"] == result["output_tok_s"] / engine["output_tok_s"]

    # Two client processes' lines in one file are one load (`--line all`); two files replay
    # one after the other on the one engine, a report each.
    two = tmp_path / "two_clients.jsonl"
    two.write_text(json.dumps(result) + "\n" + json.dumps(result) + "\n")
    argv = ["--workload", str(two), str(recorded), "--line", "all", "--fake-runner"]
    assert replay.main([*argv, "--output", str(report)]) == 0
    both, one = (json.loads(line) for line in report.read_text().splitlines()[-2:])
    assert (both["completed"], both["output_tokens"]) == (24, 24 * 8)
    assert both["workload"]["clients"] == 2 and both["workload"]["max_concurrency"] == 8
    assert both["http_output_tok_s"] == 2 * result["output_tok_s"]
    assert one["completed"] == 12 and one["workload"]["max_concurrency"] == 4


def test_a_file_without_a_workload_is_refused(tmp_path: Path, capsys: object) -> None:
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"output_tok_s": 1.0}) + "\n")
    assert replay.main(["--workload", str(old), "--fake-runner"]) == 2
