"""`resin serve` as processes (a supervisor, engine processes, frontend processes: its
default), each killed in turn with a real signal: what the clients see, what `/health` says,
and that no process is left behind (psutil)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from resin.server.launch import free_port
from resin_app.serve_split import default_api_server_count

ROOT = Path(__file__).resolve().parents[2]
LONG = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 100_000, "stream": True,
        "ignore_eos": True}  # fmt: skip


@dataclass
class Split:
    proc: subprocess.Popen[str]
    url: str
    port: int
    banner: str = ""
    family: list[psutil.Process] = field(default_factory=list)
    """`resin serve` and every process under it, as they were once it served."""

    def frontends(self) -> list[psutil.Process]:
        return [p for p in self.family[1:] if _listens(p, self.port)]

    def engines(self) -> list[psutil.Process]:
        skip = {p.pid for p in self.frontends()}
        return [p for p in self.family[1:] if p.pid not in skip and "resource_tracker" not in
                " ".join(p.cmdline())]  # fmt: skip

    def left(self, timeout: float = 30.0) -> list[psutil.Process]:
        """The processes of this server still alive after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        alive = [p for p in self.family if _alive(p)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            self.proc.poll()
            alive = [p for p in alive if _alive(p)]
        return alive


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _listens(p: psutil.Process, port: int) -> bool:
    try:
        return any(c.laddr.port == port and c.status == "LISTEN" for c in p.net_connections())
    except psutil.Error:
        return False


@pytest.fixture
def split(request: pytest.FixtureRequest) -> Iterator[Split]:
    options = tuple(getattr(request, "param", ()))  # none: the default, `auto` frontends
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "resin_app", "serve", "--fake-runner", "--port", str(port),
           "--disable-log-requests", *options]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    served = Split(proc, f"http://127.0.0.1:{port}", port)
    try:
        assert proc.stdout is not None
        served.banner = proc.stdout.readline()
        assert served.url in served.banner, served.banner
        root = psutil.Process(proc.pid)
        served.family = [root, *root.children(recursive=True)]
        yield served
    finally:
        for p in served.family:
            if _alive(p):
                p.kill()
        proc.wait(10)


def stream_lines(url: str, lines: list[str], body: dict = LONG) -> threading.Thread:
    def read() -> None:
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
                lines.append(f"status {r.status_code}")
                for line in r.iter_lines():
                    lines.append(line)
        except httpx.HTTPError as exc:
            lines.append(f"error {type(exc).__name__}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 15
    while sum(ln.startswith("data: ") for ln in lines) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    return reader


def gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    values = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(f"resin:{name}")]
    return sum(values)


def test_the_processes_and_sigterm_drains_leaving_nothing(split: Split) -> None:
    fronts = default_api_server_count(1)  # `auto`: 1 on a 2-core machine
    assert len(split.engines()) == 1 and len(split.frontends()) == fronts
    assert f"1 engine process, {fronts} frontend process" in split.banner, split.banner
    lines: list[str] = []
    reader = stream_lines(split.url, lines)
    split.proc.send_signal(signal.SIGTERM)
    reader.join(30)
    assert split.proc.wait(30) == 0
    data = [ln for ln in lines if ln.startswith("data: ")]
    assert "shutting down" in data[-1] and '"error"' in data[-1], data[-1]
    assert not split.left()


def test_a_killed_engine_fails_its_streams_and_serve_exits(split: Split) -> None:
    lines: list[str] = []
    reader = stream_lines(split.url, lines)
    (engine,) = split.engines()
    engine.send_signal(signal.SIGKILL)
    reader.join(15)
    data = [ln for ln in lines if ln.startswith("data: ")]
    assert '"error"' in data[-1] and "[DONE]" not in data[-1], data[-1]
    try:  # answered with 503 for a moment, then the frontend stops listening
        health = httpx.get(split.url + "/health", timeout=5)
        assert health.status_code == 503, health.text
    except httpx.ConnectError:
        pass
    assert split.proc.wait(30) == 1
    assert not split.left()


def settle(url: str, name: str, value: float, timeout: float = 10.0) -> float:
    """The gauge once it reads `value` (or what it reads after `timeout`)."""
    deadline = time.monotonic() + timeout
    while (got := gauge(url, name)) != value and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def streams_of(p: psutil.Process, port: int) -> int:
    return sum(c.laddr.port == port and c.status == "ESTABLISHED" for c in p.net_connections())


@pytest.mark.parametrize("split", [("--api-server-count", "2")], indirect=True)
def test_a_killed_frontend_has_its_requests_aborted_by_the_engine(split: Split) -> None:
    fronts = split.frontends()
    assert len(fronts) == 2 and len(split.engines()) == 1
    body = {"input": "hi", "max_output_tokens": 3}
    stored = httpx.post(split.url + "/v1/responses", json=body, timeout=30).json()["id"]
    for _ in range(6):
        stream_lines(split.url, [])
    assert settle(split.url, "num_requests_running", 6) == 6
    victim, survivor = sorted(fronts, key=lambda p: -streams_of(p, split.port))
    kept = streams_of(survivor, split.port)
    assert streams_of(victim, split.port) > 0
    victim.send_signal(signal.SIGKILL)
    # The engine aborted the victim's requests: only the survivor's still run.
    assert settle(split.url, "num_requests_running", kept) == kept
    ok = httpx.post(split.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    # The frontends share one Responses store (kept by `resin serve`): what either stored,
    # the survivor finds.
    for _ in range(3):
        again = httpx.get(f"{split.url}/v1/responses/{stored}", timeout=10)
        assert again.status_code == 200 and again.json()["id"] == stored, again.text
    split.proc.send_signal(signal.SIGTERM)
    assert split.proc.wait(30) == 0
    assert not split.left()


def test_a_killed_supervisor_takes_every_child_with_it(split: Split) -> None:
    lines: list[str] = []
    stream_lines(split.url, lines)
    split.proc.send_signal(signal.SIGKILL)
    split.proc.wait(10)
    assert not split.left()


@pytest.mark.parametrize("split", [("--data-parallel", "2")], indirect=True)
def test_a_hang_up_reaches_the_engine_and_a_dead_replica_degrades_health(split: Split) -> None:
    assert len(split.engines()) == 2
    with httpx.stream("POST", split.url + "/v1/chat/completions", json=LONG, timeout=30) as r:
        for _ in zip(range(10), r.iter_lines(), strict=False):
            pass
    assert settle(split.url, "num_requests_running", 0, 5) == 0
    split.engines()[0].send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while httpx.get(split.url + "/health").status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    health = httpx.get(split.url + "/health")
    assert health.status_code == 503 and health.json()["status"] == "degraded", health.text
    ok = httpx.post(split.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert ok.status_code == 200
    split.proc.send_signal(signal.SIGTERM)
    assert split.proc.wait(30) == 0
    assert not split.left()
