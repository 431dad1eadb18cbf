"""`resin serve` with engine processes (`--api-server-count auto`) starts as the one-process
server does: the port is bound first and answers 503 `loading` with its stage while the
engine process loads, then 200 with no refused connection in between; a port in use fails
before any process starts (exit 2, one line); Ctrl-C exits 130 without a traceback and frees
the port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from resin.server.launch import free_port

SRC = Path(__file__).resolve().parents[2] / "src"


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_split_serve_answers_loading_then_serves_and_ctrl_c_frees_the_port() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "resin_app", "serve", "--fake-runner", "--port", str(port),
         "--api-server-count", "auto"],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        seen: list[tuple[int, str | None]] = []
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, seen
            try:
                r = httpx.get(url + "/health", timeout=5)
            except httpx.ConnectError:
                assert not seen, f"refused after it answered: {seen}"  # bound once, kept
                time.sleep(0.05)
                continue
            except httpx.TransportError:  # a read timeout on this loaded host: ask again
                continue
            seen.append((r.status_code, r.json().get("stage")))
            if r.status_code == 200:
                break
            assert r.status_code == 503 and r.json()["status"] == "loading"
            api = httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=5)
            assert api.status_code in (200, 503)
            time.sleep(0.05)
        assert seen[0][0] == 503 and seen[0][1], seen  # the stage under way
        answer = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        assert proc.stdout is not None and "Traceback" not in proc.stdout.read()
        assert _port_is_free(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_split_serve_on_a_port_in_use_fails_before_starting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from resin_app.cli import main

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--fake-runner", "--api-server-count", "auto", "--port", str(port)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Address already in use" in err and len(err.strip().splitlines()) == 1


def test_the_server_count_is_a_count_or_auto(capsys: pytest.CaptureFixture[str]) -> None:
    from resin_app.cli import main

    for bad in ("-1", "many"):
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--api-server-count", bad])
        assert exit_info.value.code == 2
        assert "--api-server-count" in capsys.readouterr().err
