"""`resin serve`'s start, with a real HTTP client: the port answers 503 `loading` (with the
step under way) while a slow loader runs, then 200 from the real server on the same socket;
a failed start (an out-of-memory from a runner's bind, an arena too small) is an error naming
the knobs, and the port is free again; the warm-up runs a prefill and a decode step.

With engine processes (the default, `--api-server-count auto`) it starts the same way: the
port is bound first and answers 503 `loading` with its stage while the engine process loads,
then 200 with no refused connection in between; a port in use fails before any process starts
(exit 2, one line); Ctrl-C exits 130 without a traceback and frees the port, while loading and
once serving. One process (`--api-server-count 0`) keeps its own tests here."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from resin.plan import Phase
from resin.protocols import History, RunnerConfig
from resin.server import HttpServer
from resin.server.launch import free_port
from resin_app.loading import (
    Loaded,
    LoadOptions,
    ZeroCostRunner,
    check_arena,
    load_fake,
    start_engines,
    startup_errors,
    warm_up,
)
from resin_app.startup import Listener, serve_after_loading

SRC = Path(__file__).resolve().parents[2] / "src"


def _port_is_free(port: int) -> bool:
    """Whether a new `resin serve` could bind the port: it binds with SO_REUSEADDR (as the
    Listener does), so a connection the server closed last (TIME_WAIT) does not count, while a
    listening socket left open still does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _health(url: str) -> httpx.Response:
    return httpx.get(url + "/health", timeout=5)


def test_health_says_loading_until_the_model_is_warm_then_ok() -> None:
    release = threading.Event()
    servers: list[HttpServer] = []
    codes: list[int] = []

    def slow_load(readiness: Any) -> Loaded:
        readiness.set("load weights")
        assert release.wait(60)
        loaded = load_fake(LoadOptions(fake=True))
        warm_up(loaded)
        return loaded

    def make_server(loaded: Loaded) -> HttpServer:
        servers.append(HttpServer(list(loaded.engines), loaded.recipe, tokenizer=loaded.tokenizer))
        return servers[0]

    listener = Listener("127.0.0.1", 0)
    port = listener.port
    url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(
        target=lambda: codes.append(serve_after_loading(listener, slow_load, make_server))
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while (r := _health(url)).json().get("stage") != "load weights":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert r.status_code == 503 and r.json() == {"status": "loading", "stage": "load weights"}
        api = httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=5)
        assert api.status_code == 503 and api.headers["retry-after"] == "1"
        assert api.json()["error"]["code"] == "service_unavailable"
        assert "loading (load weights)" in api.json()["error"]["message"]
        release.set()
        seen = set()
        while (r := _health(url)).status_code != 200:  # never a refused connection between
            seen.add(r.status_code)
            assert time.monotonic() < deadline + 60
            time.sleep(0.02)
        assert seen <= {503} and r.json()["status"] == "ok"
        answer = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
    finally:
        release.set()
        while not servers and thread.is_alive():
            time.sleep(0.05)
        for server in servers:
            server.shutdown()
        thread.join(30)
    assert codes == [0] and _port_is_free(port)


def _ask_health(connection: socket.socket) -> bytes:
    connection.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    answer = b""
    while chunk := connection.recv(4096):
        answer += chunk
    return answer


def test_the_loading_answer_stops_without_dropping_a_connection_it_accepted() -> None:
    """The handover's race, made to happen: clients connect, the stop begins before they
    send their requests; each still gets its 503 (uvicorn as the loading answer closed such
    connections unanswered, and CI saw "server disconnected" while polling through a start).
    A request that is not HTTP still gets the 503; a connection made after the stop waits in the
    backlog for the next server."""
    listener = Listener("127.0.0.1", 0)
    try:
        listener.readiness.set("load weights")
        listener.answer_loading()
        early = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(4)]
        deadline = time.monotonic() + 10
        while listener.accepted < 4:  # the loading answer is reading their requests
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stopping = threading.Thread(target=listener.stop_loading)
        stopping.start()
        time.sleep(0.2)
        assert stopping.is_alive()  # it waits for what it accepted
        for connection in early:
            with connection:
                connection.settimeout(10)
                answer = _ask_health(connection)
            assert answer.startswith(b"HTTP/1.1 503 ")
            assert answer.endswith(b'{"status": "loading", "stage": "load weights"}')
        stopping.join(10)
        assert not stopping.is_alive()
        listener.answer_loading()
        for garbage in (b"\r\n\r\n", b"NONSENSE\r\n\r\n", b"\xff\xfe / \x00\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", listener.port)) as client:
                client.settimeout(10)
                client.sendall(garbage)
                answer = b""
                while chunk := client.recv(4096):
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 503 ") and b"service_unavailable" in answer
        listener.stop_loading()
        with socket.create_connection(("127.0.0.1", listener.port)) as late:
            late.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            late.settimeout(0.3)
            with pytest.raises(TimeoutError):
                late.recv(4096)  # in the backlog: nobody accepts it now
            listener.answer_loading()  # the next server takes it over
            late.settimeout(10)
            assert late.recv(4096).startswith(b"HTTP/1.1 503 ")
    finally:
        listener.close()


def test_a_silent_or_trickling_client_does_not_hold_the_handover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loading answer gives a connection READ_TIMEOUT_S in all for its request head: a
    client that sends nothing, or a byte at a time, is closed then and the stop goes on."""
    from resin_app import startup

    monkeypatch.setattr(startup, "READ_TIMEOUT_S", 0.5)
    listener = Listener("127.0.0.1", 0)
    try:
        listener.answer_loading()
        silent = socket.create_connection(("127.0.0.1", listener.port))
        trickle = socket.create_connection(("127.0.0.1", listener.port))
        started = time.monotonic()
        with pytest.raises(OSError):  # closed under it (a broken pipe or a reset)
            for byte in b"GET /health HTTP/1.1" * 10:
                trickle.sendall(bytes([byte]))
                time.sleep(0.05)
        assert time.monotonic() - started < 4  # cut at ~0.5 s (a loaded box: later)
        listener.stop_loading()
        assert time.monotonic() - started < 6
        with silent:
            silent.settimeout(5)
            assert silent.recv(4096) == b""  # closed unanswered: it never asked
        trickle.close()
    finally:
        listener.close()


def test_polling_through_many_handovers_never_loses_a_request() -> None:
    listener = Listener("127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.port}/health"
    failures: list[str] = []
    answered = [0]
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=10) as client:
            while not done.is_set():
                try:
                    assert client.get(url).status_code == 503
                    answered[0] += 1
                except httpx.TransportError as error:
                    failures.append(repr(error))

    listener.answer_loading()
    pollers = [threading.Thread(target=poll) for _ in range(4)]
    for poller in pollers:
        poller.start()
    try:
        for _ in range(60):
            time.sleep(0.02)
            listener.stop_loading()
            listener.answer_loading()
    finally:
        done.set()
        for poller in pollers:
            poller.join(30)
        listener.close()
    assert answered[0] >= 8 and not failures, failures  # a loaded CI box answers fewer


class _OutOfMemoryRunner(ZeroCostRunner):
    """Binds like a fast runner whose arena does not fit."""

    def bind(self, layout: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 70.00 GiB")


def test_an_out_of_memory_at_start_names_the_knobs_and_frees_the_port() -> None:
    options = LoadOptions(fake=True)
    tokenizer = load_fake(options).tokenizer

    def load(readiness: Any) -> Loaded:
        readiness.set("start engine")
        start_engines([_OutOfMemoryRunner(tokenizer.vocab_size, 5)], options, tokenizer, 64)
        raise AssertionError("unreachable")

    listener = Listener("127.0.0.1", 0)
    port = listener.port
    with pytest.raises(ValueError) as info:
        serve_after_loading(listener, load, lambda loaded: None)
    message = str(info.value)
    assert "out of device memory while starting (CUDA out of memory. Tried to allocate" in message
    assert "--gpu-memory-utilization" in message and "--max-model-len" in message
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)
    assert _port_is_free(port)
    with pytest.raises(httpx.ConnectError):
        _health(f"http://127.0.0.1:{port}")


def test_other_errors_pass_through_unchanged() -> None:
    with pytest.raises(KeyError, match="no tensor"), startup_errors():
        raise KeyError("no tensor")


def test_an_arena_that_cannot_hold_one_context_names_the_knobs() -> None:
    rc = RunnerConfig(vocab_size=8, page_size=16, num_pages=512, cache_groups=(History(4096),))
    check_arena(rc, 8190)  # 512 pages hold 8192 tokens: one 8190-token sequence + 1 fits
    with pytest.raises(ValueError) as info:
        check_arena(rc, 8192)
    message = str(info.value)
    assert "holds 512 pages (8192 tokens), not one sequence of --max-model-len 8192" in message
    assert "--gpu-memory-utilization" in message and "--max-num-seqs" in message
    by_bytes = RunnerConfig(vocab_size=8, page_size=16, cache_bytes=100 * 4096,
                            cache_groups=(History(4096),))  # fmt: skip
    check_arena(by_bytes, 1599)
    with pytest.raises(ValueError, match="holds 100 pages"):
        check_arena(by_bytes, 1600)


class _Recording(ZeroCostRunner):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.phases: list[Phase] = []

    def forward(self, plan: Any) -> Any:
        self.phases.append(plan.phase)
        return super().forward(plan)


def test_the_warm_up_runs_one_prompt_through_prefill_and_decode() -> None:
    options = LoadOptions(fake=True)
    base = load_fake(options)
    runner = _Recording(base.tokenizer.vocab_size, 7)
    engines = start_engines([runner], options, base.tokenizer, 64)
    loaded = Loaded(engines, base.recipe, base.tokenizer, "x", 64)
    warm_up(loaded)
    assert runner.phases == [Phase.PREFILL, Phase.DECODE]
    assert not loaded.engine.has_work() and loaded.engine.num_running == 0
    loaded.close()


@pytest.mark.parametrize("servers", [(), ("--api-server-count", "0")], ids=["default", "one"])
def test_serve_on_a_port_in_use_fails_before_loading(
    servers: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """With engine processes (the default) and in one process alike: exit 2 and one line,
    before any weights load or process starts."""
    from resin_app.cli import main

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--fake-runner", *servers, "--port", str(port)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Address already in use" in err and len(err.strip().splitlines()) == 1


def _serve(port: int, *options: str) -> subprocess.Popen[str]:
    """`resin serve --port PORT *options` as a subprocess, stdout and stderr together."""
    cmd = [sys.executable, "-m", "resin_app", "serve", "--port", str(port), *options]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _interrupt(proc: subprocess.Popen[str], port: int) -> None:
    """Ctrl-C: exit 130, no traceback, the port free again."""
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    assert proc.stdout is not None and "Traceback" not in proc.stdout.read()
    assert _port_is_free(port)


@pytest.mark.parametrize("servers", [(), ("--api-server-count", "0")], ids=["default", "one"])
def test_ctrl_c_while_loading_exits_130_without_a_traceback_and_frees_the_port(
    servers: tuple[str, ...],
) -> None:
    port = free_port()
    proc = _serve(port, *servers)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                if _health(f"http://127.0.0.1:{port}").json().get("status") == "loading":
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        _interrupt(proc, port)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_answers_loading_then_serves_and_ctrl_c_frees_the_port() -> None:
    """The default: engine processes behind `auto` frontends (1 on a 2-core machine)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(port, "--fake-runner")
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
        _interrupt(proc, port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_server_count_is_a_count_or_auto(capsys: pytest.CaptureFixture[str]) -> None:
    from resin_app.cli import main

    for bad in ("-1", "many"):
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--api-server-count", bad])
        assert exit_info.value.code == 2
        assert "--api-server-count" in capsys.readouterr().err


def test_auto_is_a_split_with_frontends_from_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto`: a third of the cores the engine ranks leave, 1 to 4 (a 2-core CI box: 1, still
    the split); a CPU engine rank computes on its share of what the frontends leave."""
    from resin_app.cli import _build_parser
    from resin_app.serve_split import default_api_server_count, plan

    assert _build_parser().parse_args(["serve"]).api_server_count == "auto"
    assert [default_api_server_count(1, cores) for cores in (1, 2, 7, 16, 64)] == [1, 1, 2, 4, 4]
    assert default_api_server_count(8, 16) == 2  # --tensor-parallel 8: 8 engine ranks
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert plan(LoadOptions(device="cpu"), 1, "/x", cores=2).cpu_threads == 1
    two = plan(LoadOptions(device="cpu", data_parallel=2), 4, "/x", cores=16)
    assert two.cpu_threads == 6 and len(two.engines) == 2
    assert plan(LoadOptions(device="cuda"), 4, "/x", cores=16).cpu_threads is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice stands
    assert plan(LoadOptions(device="cpu"), 1, "/x", cores=2).cpu_threads is None


def test_settle_heap_freezes_the_startup_heap_until_exit() -> None:
    code = (
        "import atexit, gc\n"
        "from resin_app.startup import GC_GEN0_THRESHOLD, settle_heap\n"
        "atexit.register(lambda: print('frozen at exit', gc.get_freeze_count()))\n"
        "settle_heap()\n"
        "assert gc.get_freeze_count() > 0, 'nothing frozen'\n"
        "assert gc.get_threshold()[0] == GC_GEN0_THRESHOLD\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # atexit runs last-in first-out: settle_heap's unfreeze ran before this line printed
    assert done.stdout.strip() == "frozen at exit 0"
