"""The HTTP edge under hostile timing, against `resin serve --fake-runner` as a subprocess: a
body trickled a byte at a time is cut off (408) and frees its connection; a request whose
client already left never reaches the engine (the fake runner's prompt-token counter stays
put); `/health` says 503 `stalled` while the engine process is stopped (SIGSTOP); SIGTERM
with a stopped engine ends open streams with the shutdown event within a bound."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.server.test_hostile_clients import Served, serve
from tests.server.test_split_serve import _alive, _listens, gauge, stream_lines

CHAT = "/v1/chat/completions"


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _trickle(url: str, stop: threading.Event, answers: list[bytes]) -> None:
    """Headers at once, then the promised 100-byte body one byte every 0.1 s."""
    with socket.create_connection(_address(url), timeout=10) as sock:
        head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall((head + "Content-Length: 100\r\n\r\n").encode())
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                sock.sendall(b" ")
                if data := sock.recv(4096):
                    sock.settimeout(5)
                    while more := sock.recv(4096):  # to the close the 408 announced
                        data += more
                    answers.append(data)
                    return
            except TimeoutError:
                continue
            except OSError:
                answers.append(b"closed")
                return


def test_a_trickled_body_is_cut_off_and_frees_its_connection(tmp_path: Path) -> None:
    options = ("--fake-runner", "--max-connections", "4", "--timeout-body", "1")
    with serve(tmp_path / "serve.log", *options) as served:
        stop = threading.Event()
        answers: list[bytes] = []
        tricklers = [
            threading.Thread(target=_trickle, args=(served.url, stop, answers), daemon=True)
            for _ in range(4)
        ]
        for t in tricklers:
            t.start()
        try:
            time.sleep(0.3)  # every connection slot is a trickler's now
            started = time.monotonic()
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            status = 0
            while status != 200 and time.monotonic() - started < 10:
                try:
                    status = httpx.post(served.url + CHAT, json=body, timeout=5).status_code
                except httpx.HTTPError:
                    status = -1
                if status != 200:
                    time.sleep(0.1)
            assert status == 200
            assert time.monotonic() - started < 5
            for t in tricklers:
                t.join(5)
            assert len(answers) == 4
            # each got the 408, or its next byte met the closed connection
            cut = [(b" 408 " in a and b"within 1 s" in a) or a == b"closed" for a in answers]
            assert all(cut), answers
            assert any(b" 408 " in a for a in answers), answers
        finally:
            stop.set()


def _closed_stream(url: str, words: int) -> None:
    """A streamed request whose client hangs up as soon as it is sent."""
    content = " ".join(["word"] * words)
    body = json.dumps({"messages": [{"role": "user", "content": content}], "stream": True})
    head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with socket.create_connection(_address(url), timeout=10) as sock:
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())


def _requests_logged(served: Served) -> int:
    return sum(f"POST {CHAT} " in line for line in served.log.read_text().splitlines())


@pytest.mark.parametrize("processes", ["0", "1"], ids=["one-process", "split"])
def test_a_burst_of_closed_streams_is_never_prefilled(tmp_path: Path, processes: str) -> None:
    options = ("--fake-runner", "--max-active", "1", "--context-length", "1000000")
    options += ("--api-server-count", processes)
    with serve(tmp_path / "serve.log", *options) as served:
        busy: list[str] = []
        long = {**_long(), "max_tokens": 900_000}
        reader = stream_lines(served.url, busy, long)  # holds the engine's one active slot
        before = gauge(served.url, "prompt_tokens")
        burst = 20
        for _ in range(burst):
            _closed_stream(served.url, 300)
        deadline = time.monotonic() + 15
        while _requests_logged(served) < burst and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _requests_logged(served) >= burst
        assert gauge(served.url, "prompt_tokens") == before
        assert reader.is_alive()  # the busy stream still runs: nothing waited for it


def _long() -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "x"}], "stream": True, "ignore_eos": True}


def _engine(served: Served) -> psutil.Process:
    root = psutil.Process(served.proc.pid)
    port = _address(served.url)[1]
    children = root.children(recursive=True)
    engines = [
        p
        for p in children
        if not _listens(p, port) and "resource_tracker" not in " ".join(p.cmdline())
    ]
    assert len(engines) == 1, engines
    return engines[0]


def test_a_stopped_engine_is_stalled_and_shutdown_is_bounded(tmp_path: Path) -> None:
    options = ("--fake-runner", "--api-server-count", "1", "--stall-timeout", "1")
    with serve(tmp_path / "serve.log", *options) as served:
        family = [psutil.Process(served.proc.pid), *psutil.Process(served.proc.pid).children(True)]
        engine = _engine(served)
        lines: list[str] = []
        reader = stream_lines(served.url, lines, {**_long(), "max_tokens": 100_000})
        assert httpx.get(served.url + "/health", timeout=5).status_code == 200
        engine.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            health = httpx.get(served.url + "/health", timeout=5)
            while health.status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.1)
                health = httpx.get(served.url + "/health", timeout=5)
            assert health.status_code == 503, health.text
            assert health.json()["status"] == "stalled"
            assert "--stall-timeout" in health.json()["error"]
            started = time.monotonic()
            served.proc.send_signal(signal.SIGTERM)
            reader.join(20)
            assert not reader.is_alive()
            data = [ln for ln in lines if ln.startswith("data: ")]
            assert "shutting down" in data[-1] and '"error"' in data[-1], data[-1]
            served.proc.wait(30)
            assert time.monotonic() - started < 15
            # helpers of the children (multiprocessing's resource tracker) exit once their
            # pipes close: the same grace as the split server's other no-orphan checks
            psutil.wait_procs(family, timeout=10)
            assert not [p for p in family if _alive(p)]
        finally:
            for p in family:
                if _alive(p):
                    p.kill()


def test_a_step_that_never_returns_is_stalled_and_shutdown_ends_its_stream() -> None:
    """In one process: the engine thread stuck inside a step (the fake engine's step sleeps
    an hour) makes `/health` say `stalled`, and a shutdown still ends the open stream with
    the shutdown event within the grace, without the engine."""
    from resin.server.app import STOP_GRACE_S
    from resin.server.launch import running
    from resin.server.service import Limits
    from tests.server.conftest import make_server
    from tests.server.doubles import FakeEngine

    engine = FakeEngine(step_delay=0.01)
    server = make_server(engine, limits=Limits(stall_timeout_s=0.5))
    with running(server) as url:
        lines: list[str] = []
        body = {"messages": [{"role": "user", "content": "x" * 2000}], "stream": True}
        reader = stream_lines(url, lines, body)
        engine.step_delay = 3600.0  # the next step never returns
        deadline = time.monotonic() + 10
        health = httpx.get(url + "/health", timeout=5)
        while health.status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
            health = httpx.get(url + "/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "stalled"
        started = time.monotonic()
        server.shutdown()
        reader.join(STOP_GRACE_S + 10)
        assert not reader.is_alive()
        assert time.monotonic() - started < STOP_GRACE_S + 5
        data = [ln for ln in lines if ln.startswith("data: ")]
        assert "shutting down" in data[-1] and '"error"' in data[-1], data[-1]
