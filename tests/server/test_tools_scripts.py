"""`resin check` and `resin bench serve` against a live fake server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from resin.server.launch import running
from resin_app import check, check_eval
from resin_app.bench import serve
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
            assert serve.main(argv) == 0
        assert (
            serve.main(
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


@contextmanager
def foreign_server(
    answer: dict[str, Any], long_status: int = 500, eval_status: int = 200
) -> Iterator[str]:
    """An OpenAI-style server `resin check` knows nothing about (it reports no capabilities):
    every chat request gets `answer` as its one choice, streamed when asked; a prompt of over
    100 words gets HTTP `long_status`, an eval question `eval_status`. Real HTTP on a thread,
    like any server out there."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._json(
                {"data": [{"id": "other", "object": "model"}]} if "models" in self.path else {}
            )

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            said = json.dumps(body["messages"])
            status = long_status if len(said.split()) > 100 else 200
            status = eval_status if "Answer with the letter" in said else status
            if status != 200:
                return self._json({"error": {"message": "boom"}}, status)
            usage = {"prompt_tokens": 9, "completion_tokens": 3}
            choice = {"index": 0, **answer}
            if not body.get("stream"):
                return self._json({"choices": [choice], "usage": usage})
            delta = {**choice, "delta": choice["message"]}
            chunks = [{"choices": [delta]}, {"choices": [], "usage": usage}]
            data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            self._send(data.encode(), "text/event-stream", 200)

        def _json(self, obj: object, status: int = 200) -> None:
            self._send(json.dumps(obj).encode(), "application/json", status)

        def _send(self, data: bytes, kind: str, status: int) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _call(name: str, arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"message": {"role": "assistant", "content": None, "tool_calls": [call]},
            "finish_reason": "tool_calls"}  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        # What the issue found: no call at all, cut at max_tokens, reported as a pass.
        ({"message": {"role": "assistant", "content": "It is sunny."}, "finish_reason": "length"},
         "no tool call; finish_reason 'length', not 'tool_calls'"),
        (_call("Paris", '{"city": "Paris"}'), "called 'Paris', which was not offered"),
        (_call("get_weather", '{"city": "Paris"'), "arguments are not JSON"),
        (_call("get_weather", '{"town": "Paris"}'), "arguments miss the required string 'city'"),
    ],
)  # fmt: skip
def test_forced_tool_case_fails_a_server_that_does_not_call_the_tool(
    answer: dict[str, Any], problem: str, tmp_path: Path
) -> None:
    """`resin check --expect-tools` against a server that ignores the forced choice (or calls a
    tool nobody offered, or breaks the schema): the tool-call case FAILS and says why."""
    report = tmp_path / "r.md"
    argv = ["--output", str(report), "--burst", "2", "--ttft-sizes", "8", "--expect-tools"]
    with foreign_server(answer) as url:
        assert check.main([url, *argv]) == 1
    (row,) = [line for line in report.read_text().splitlines() if line.startswith("| tool-call")]
    assert row.startswith("| tool-call case (forced) | FAIL |") and problem in row, row


def _report_row(path: Path, answer: dict, argv: list[str], prefix: str, **server: int) -> str:
    """Run `resin check` against a foreign server; the report's row that starts with `prefix`."""
    with foreign_server(answer, **server) as url:
        check.main([url, "--output", str(path), *argv])
    (row,) = [x for x in path.read_text().splitlines() if x.startswith(prefix)]
    return row


def test_ttft_case_fails_when_a_size_gets_a_server_error(tmp_path: Path) -> None:
    """One short prompt answered and the long ones a 500 is a FAIL; a 400 for a prompt longer
    than the context is a fair refusal."""
    answer = {"message": {"role": "assistant", "content": "OK"}, "finish_reason": "stop"}
    argv = ["--burst", "2", "--ttft-sizes", "8,200", "--no-expect-tools", "--no-expect-reasoning"]
    rows = {
        status: _report_row(tmp_path / f"{status}.md", answer, argv, "| TTFT", long_status=status)
        for status in (500, 400)
    }
    assert rows[500].startswith("| TTFT vs context size | FAIL |"), rows[500]
    assert "200 words -> HTTP 500" in rows[500]
    assert rows[400].startswith("| TTFT vs context size | PASS |"), rows[400]


def test_eval_case_fails_when_questions_go_unanswered(tmp_path: Path) -> None:
    """Accuracy is measured, never judged (0% wrong answers pass), but a question the server
    answered with a 500 fails the case: it passed whenever the file had rows."""
    answer = {"message": {"role": "assistant", "content": "OK"}, "finish_reason": "stop"}
    argv = ["--burst", "2", "--ttft-sizes", "8", "--eval-file", str(DATA / "mini_mmlu.jsonl")]
    rows = {
        status: _report_row(tmp_path / f"{status}.md", answer, argv, "| acc", eval_status=status)
        for status in (200, 500)
    }
    assert rows[200].startswith("| accuracy on mini_mmlu.jsonl | PASS | 0/"), rows[200]
    assert rows[500].startswith("| accuracy on mini_mmlu.jsonl | FAIL |"), rows[500]
    assert "requests failed" in rows[500]
