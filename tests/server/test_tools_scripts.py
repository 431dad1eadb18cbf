"""scripts/check_server.py and scripts/bench_serve.py against a live fake server."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from resin.server.launch import running
from resin.tools import bench, check, check_eval
from tests.server.conftest import make_server
from tests.server.doubles import ByteTokenizer, FakeEngine, demo_responder, echo_responder

DATA = Path(__file__).parent / "data"


def oracle_engine() -> FakeEngine:
    """Answers eval questions with the right letter (so the scoring path is checked), and
    otherwise behaves like the demo responder."""
    tok = ByteTokenizer()
    demo = demo_responder(tok)
    rows = check_eval.load_eval(DATA / "mini_mmlu.jsonl") + check_eval.load_eval(
        DATA / "mini_mmlu.csv"
    )

    def respond(prompt: Sequence[int]) -> list[int]:
        text = tok.decode(prompt)
        for question, _, gold in rows:
            if question in text and "Answer with the letter" in text:
                return [*tok.encode(f"{check_eval.LETTERS[gold]}."), 257]
        return demo(prompt)

    return FakeEngine(respond)


def test_check_server_report(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    with running(make_server(oracle_engine())) as url:
        rc = check.main(
            [
                url,
                "--output",
                str(report),
                "--burst",
                "60",
                "--ttft-sizes",
                "8,64,256",
                "--eval-file",
                str(DATA / "mini_mmlu.jsonl"),
                "--eval-concurrency",
                "4",
            ]
        )
        csv_rc = check.main(
            [
                url,
                "--output",
                str(tmp_path / "csv.md"),
                "--burst",
                "10",
                "--eval-file",
                str(DATA / "mini_mmlu.csv"),
            ]
        )
    text = report.read_text()
    assert rc == 0, text
    # The fake chat format claims reasoning (and produces it) but cannot force a tool call.
    assert "7 passed, 0 failed, 1 skipped" in text and "6/6 = 100.0%" in text
    assert "| reasoning case | PASS |" in text
    assert "| tool-call case (forced) | SKIP | the server cannot force a call" in text
    assert csv_rc == 0 and "2/2 = 100.0%" in (tmp_path / "csv.md").read_text()


def test_check_fails_a_model_that_does_not_do_what_its_recipe_claims(tmp_path: Path) -> None:
    """The echo engine never reasons although its chat format says it can: that is a FAIL
    (and exit 1), not a pass; told not to expect reasoning, the case is skipped instead."""
    tok = ByteTokenizer()
    argv = ["--burst", "4", "--ttft-sizes", "8"]
    with running(make_server(FakeEngine(echo_responder(tok)))) as url:
        failed = check.main([url, "--output", str(tmp_path / "a.md"), *argv])
        skipped = check.main(
            [url, "--output", str(tmp_path / "b.md"), "--no-expect-reasoning", *argv]
        )
    assert failed == 1
    assert "| reasoning case | FAIL | reasoning_content 0 chars" in (tmp_path / "a.md").read_text()
    assert skipped == 0
    assert "| reasoning case | SKIP |" in (tmp_path / "b.md").read_text()


def test_bench_serve_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "bench.jsonl"
    with running(make_server(FakeEngine(step_delay=0.001))) as url:
        for conc in ("1", "16"):
            argv = [
                "--url",
                url,
                "--num-prompts",
                "32",
                "--max-concurrency",
                conc,
                "--output-len",
                "16",
                "--output",
                str(out),
            ]
            assert bench.main(argv) == 0
        assert (
            bench.main(
                [
                    "--url",
                    url,
                    "--num-prompts",
                    "10",
                    "--request-rate",
                    "200",
                    "--endpoint",
                    "completions",
                    "--output-len",
                    "8",
                    "--output",
                    str(out),
                ]
            )
            == 0
        )
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(runs) == 3
    for r in runs:
        assert r["failed"] == 0 and r["output_tok_s"] > 0
        assert 0 < r["ttft_ms"]["p50"] <= r["e2e_ms"]["p99"]
    assert runs[0]["completed"] == 32 and runs[1]["config"]["max_concurrency"] == 16
    assert runs[2]["config"]["endpoint"] == "completions"
