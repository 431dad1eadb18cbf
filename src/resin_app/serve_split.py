"""`resin serve` as processes: an engine process per replica, N frontend processes.

The `resin serve` process supervises and serves no request itself:
0. the caller bound the port already (`startup.Listener`: a port in use fails before anything
   starts); while the processes start, the supervisor answers 503 `loading` on it with the
   stage the engines report (`/health`: `{"status": "loading", "stage": ...}`);
1. it starts one engine process per data-parallel replica (`engine_main`): each builds its
   engine and runner through `resin_app.loading.load` (one replica, its own device), reporting
   each loading stage, and runs `resin.ipc.EngineService`; it reports ready once loaded;
2. then `--api-server-count` frontend processes (`frontend_main`): each loads the tokenizer,
   recipe and generation defaults (no weights), drives every engine through a
   `resin.ipc.EngineClient` under the ordinary `HttpServer` and accepts on the same listening
   socket (handed to it at spawn; the kernel gives each connection to one of them);
3. when every frontend is built, it stops answering `loading` and tells them to serve
   (connections that arrive in between wait in the listen backlog, never refused, and no
   client sees 200 and then 503); once all serve it prints the URL, then waits.

Ends: SIGTERM or SIGINT stops the frontends first (their open streams end with the usual
"server is shutting down" error), then the engines; a frontend that dies has its requests
aborted by the engines and the others go on; an engine that dies fails its own requests
(503s, error events; `/health` says so) and when none is left the frontends stop and so does
`resin serve` (exit code 1). Every child asks the kernel to SIGTERM it when `resin serve`
itself dies (`PR_SET_PDEATHSIG`), so no process outlives it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from resin_app.loading import LoadOptions
from resin_app.startup import Listener, settle_heap

if TYPE_CHECKING:
    from resin_app.shared_store import Address

log = logging.getLogger("resin.serve")

STOP_TIMEOUT_S = 20.0
"""How long a child may take to drain after SIGTERM before it is killed."""


def default_api_server_count(engine_processes: int, cores: int | None = None) -> int:
    """Frontends for `--api-server-count auto` (the default): a third of the cores the engine
    processes (every rank of every replica) leave, between 1 and 4; one frontend streams
    about 14k tokens/s, 4 carry a 16-core H200 host's 1,024 zero-cost streams at ~200k. On a
    2-core machine: 1 (the split still, so the default is what CI tests)."""
    cores = cores or usable_cores()
    return max(1, min(4, (cores - engine_processes) // 3))


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or `taskset`'s
    limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Plan:
    """Who talks to whom: `addresses[i][j]` joins engine i and frontend j."""

    engines: tuple[LoadOptions, ...]
    addresses: tuple[tuple[str, ...], ...]
    frontends: int
    cpu_threads: int | None = None
    """Torch threads per CPU engine rank (`OMP_NUM_THREADS` at its spawn), None: torch's own."""


def plan(options: LoadOptions, frontends: int, folder: str, cores: int | None = None) -> Plan:
    """One engine per replica (`data_parallel` 1 each; on CUDA replica i's device follows
    the one before it by `tensor_parallel` devices), every engine joined to every frontend.

    On the CPU each engine rank computes on its share of the cores the frontends leave (at
    least one): torch's default, a thread per core, oversubscribes them, and its threads'
    barriers then wait on descheduled peers (on 2 cores, a 135M model decoded 10x slower
    beside one frontend). `OMP_NUM_THREADS`, when set, is left as it is."""
    replicas = options.data_parallel
    engines = tuple(
        replace(options, data_parallel=1, device=_device(options, i)) for i in range(replicas)
    )
    addresses = tuple(
        tuple(f"ipc://{folder}/engine{i}-front{j}" for j in range(frontends))
        for i in range(replicas)
    )
    threads = None
    if options.device.startswith("cpu") and "OMP_NUM_THREADS" not in os.environ:
        ranks = replicas * options.tensor_parallel
        threads = max(1, ((cores or usable_cores()) - frontends) // ranks)
    return Plan(engines, addresses, frontends, threads)


def _device(options: LoadOptions, replica: int) -> str:
    device = options.device
    if not device.startswith("cuda") or replica == 0:
        return device
    first = int(device.partition(":")[2] or 0)
    return f"cuda:{first + replica * options.tensor_parallel}"


# ---- the supervisor -------------------------------------------------------------------------
def serve(args: argparse.Namespace, options: LoadOptions, listener: Listener) -> int:
    """`resin serve` with engine processes on `listener`'s port: returns the exit code (the
    listener is closed then)."""
    count = args.api_server_count
    if count == "auto":
        count = default_api_server_count(options.data_parallel * options.tensor_parallel)
    try:
        with tempfile.TemporaryDirectory(prefix="resin-ipc-") as folder:
            layout = plan(options, count, folder)
            supervisor = Supervisor(layout, args, listener)
            return supervisor.run()
    finally:
        listener.close()


class Supervisor:
    def __init__(self, layout: Plan, args: argparse.Namespace, listener: Listener) -> None:
        self.layout = layout
        self.args = args
        self.listener = listener
        self.context = mp.get_context("spawn")
        self.engines: list[BaseProcess] = []
        self.frontends: list[BaseProcess] = []
        self.signal: int | None = None
        self.served: list[str] = []  # the model name each frontend serves
        # Stored Responses answers, found through any frontend: kept here when there are two
        # or more (`shared_store.py`); one frontend keeps its own.
        self.responses = _host_responses() if layout.frontends > 1 else None
        self.refused = False  # a child reported that it could not start (bad checkpoint)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.listener.answer_loading()
            if not self._start():  # a child that could not load is a startup error: 2
                if self.signal is not None:
                    return 130 if self.signal == signal.SIGINT else 0
                return 2 if self.refused else 1
            self.listener.stop_loading()  # the frontends accept on the socket from now on
            banner = _banner(self.args, self.served[-1], len(self.engines), len(self.frontends))
            print(banner, flush=True)
            code = self._watch()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code

    def _on_signal(self, sig: int, frame: Any) -> None:
        self.signal = sig

    def _start(self) -> bool:
        engine_ends = [self._spawn_engine(i, opts) for i, opts in enumerate(self.layout.engines)]
        if not self._await(engine_ends, self.engines, "engine"):
            return False
        self.listener.readiness.set("start frontends")
        front_ends = [self._spawn_frontend(j) for j in range(self.layout.frontends)]
        if not self._await(front_ends, self.frontends, "frontend", until="built"):
            return False
        # The handover, as in one process: the loading answer stops before any frontend
        # accepts, so a client never sees 200 then 503; connections in between wait in the
        # listen backlog.
        self.listener.stop_loading()
        for end in front_ends:
            end.send(("go",))
        return self._await(front_ends, self.frontends, "frontend")

    def _spawn_engine(self, index: int, options: LoadOptions) -> Connection:
        mine, theirs = self.context.Pipe(duplex=False)
        target_args = (options, self.layout.addresses[index], theirs, _policy(self.args))
        proc = self.context.Process(
            target=engine_main, args=target_args, name=f"resin-engine-{index}"
        )
        with _environment("OMP_NUM_THREADS", self.layout.cpu_threads):  # its workers' too
            proc.start()
        theirs.close()
        self.engines.append(proc)
        return mine

    def _spawn_frontend(self, index: int) -> Connection:
        mine, theirs = self.context.Pipe()  # ready reports up, the go to serve down
        addresses = [row[index] for row in self.layout.addresses]
        proc = self.context.Process(
            target=frontend_main,
            args=(
                self.args,
                self.layout.engines[0],
                index,
                addresses,
                theirs,
                self.listener.socket,
                self.responses,
            ),
            name=f"resin-frontend-{index}",
        )
        proc.start()
        theirs.close()
        self.frontends.append(proc)
        return mine

    def _await(
        self, ends: list[Connection], procs: list[BaseProcess], what: str, until: str = "ready"
    ) -> bool:
        """Every child of `procs` reported `until` (False: one failed, or a signal came)."""
        waiting = dict(zip(ends, procs, strict=True))
        while waiting and self.signal is None:
            for end in wait([*waiting, *(p.sentinel for p in waiting.values())], 0.2):
                if isinstance(end, Connection) and end in waiting:
                    message = end.recv() if end.poll() else ("error", "exited")
                    if message[0] == "stage":  # what the port's `loading` answer says
                        self.listener.readiness.set(str(message[1]))
                        continue
                    if message[0] != until:
                        print(f"resin serve: error: {what}: {message[1]}", file=sys.stderr)
                        self.refused = message[1] != "exited"
                        return False
                    del waiting[end]
                    if until == "ready":
                        self.served.append(str(message[1]))
            if any(not p.is_alive() for p in waiting.values()):
                dead = next(p for p in waiting.values() if not p.is_alive())
                print(f"resin serve: {dead.name} exited ({dead.exitcode})", file=sys.stderr)
                return False
        return not waiting

    def _watch(self) -> int:
        """Until a signal, or until no frontend is left (the engines all died, or the
        frontends were killed)."""
        seen: set[str] = set()
        while self.signal is None:
            wait([p.sentinel for p in self.engines + self.frontends if p.is_alive()], 0.2)
            for proc in self.engines + self.frontends:
                if not proc.is_alive() and proc.name not in seen:
                    seen.add(proc.name)
                    print(f"resin serve: {proc.name} exited ({proc.exitcode})", file=sys.stderr)
            if not any(p.is_alive() for p in self.frontends):
                return 1
            if not any(p.is_alive() for p in self.engines):
                self._wait_for(self.frontends, 5.0)  # they stop on their own: no engine
        return 130 if self.signal == signal.SIGINT else 0

    def _stop_all(self) -> None:
        for group in (self.frontends, self.engines):
            for proc in group:
                if proc.is_alive() and proc.pid is not None:
                    os.kill(proc.pid, signal.SIGTERM)
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped child could not drain
            self._wait_for(group, STOP_TIMEOUT_S)
            for proc in group:
                if proc.is_alive():
                    proc.kill()
                proc.join(5)

    @staticmethod
    def _wait_for(procs: Sequence[BaseProcess], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def _environment(name: str, value: int | None) -> Iterator[None]:
    """`name=value` in this process's environment while a child is spawned (None: as is)."""
    if value is None:
        yield
        return
    os.environ[name] = str(value)
    try:
        yield
    finally:
        del os.environ[name]


def _host_responses() -> Address:
    from resin_app.shared_store import host

    return host()


def _connect_responses(where: Address) -> object:
    from resin_app.shared_store import connect

    return connect(where)


def _banner(args: argparse.Namespace, name: str, engines: int, frontends: int) -> str:
    url = f"http://{args.host}:{args.port}"
    processes = f"{_count(engines, 'engine process')}, {_count(frontends, 'frontend process')}"
    return f"resin: serving {name} at {url}  (chat page: {url}/ , API: {url}/v1; {processes})"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}es"


def _policy(args: argparse.Namespace) -> Any:
    from resin.ipc import ServicePolicy

    return ServicePolicy(max_active=args.max_active, queue_capacity=args.queue_capacity)


# ---- children -------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """SIGTERM this process when its parent (`resin serve`) dies, even by SIGKILL."""
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def engine_main(
    options: LoadOptions, addresses: Sequence[str], ready: Connection, policy: Any
) -> None:
    """An engine process: load one replica, serve it until SIGTERM or its runner dies."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the
    # frontends drain first, then `resin serve` sends SIGTERM here.
    import tqdm

    from resin.ipc import EngineService
    from resin_app.loading import load

    # tqdm's default lock is a multiprocessing semaphore no exit path of a spawned child
    # releases (the resource tracker then warns of a leak): a thread lock does here.
    tqdm.tqdm.set_lock(threading.RLock())
    try:
        try:
            loaded = load(options, progress=False, on_stage=lambda s: ready.send(("stage", s)))
        except Exception as exc:  # a bad checkpoint or option: `resin serve` reports it
            ready.send(("error", _one_line(exc)))
            sys.exit(2)
        service = EngineService(loaded.engine, addresses, policy)
        signal.signal(signal.SIGTERM, lambda *_: service.request_stop())
        ready.send(("ready", "engine"))
        ready.close()
        settle_heap()
        try:
            service.run()
        finally:
            service.close()
            loaded.close()
        sys.exit(1 if service.dead else 0)
    finally:
        _remove_sockets(addresses)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _remove_sockets(addresses: Sequence[str]) -> None:
    """Remove this engine's socket files, and their folder once empty: the supervisor's
    `TemporaryDirectory` is gone too when the supervisor was killed (its children get
    SIGTERM, `_die_with_parent`, and end here)."""
    folders = set()
    for address in addresses:
        path = address.removeprefix("ipc://")
        folders.add(os.path.dirname(path))
        with contextlib.suppress(OSError):
            os.unlink(path)
    for folder in folders:
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # fails while another process's sockets are still there


def frontend_main(
    args: argparse.Namespace,
    options: LoadOptions,
    index: int,
    addresses: Sequence[str],
    ready: Connection,
    listener: socket.socket,
    responses: Address | None = None,
) -> None:
    """A frontend process: HTTP over every engine, accepting on the shared `listener`."""
    _die_with_parent()
    from resin.ipc import EngineClient
    from resin_app.serving import build_server, log_to_stderr

    try:
        text = load_text(options)
        store = None if responses is None else _connect_responses(responses)
        clients = [EngineClient(address, index) for address in addresses]
    except Exception as exc:
        ready.send(("error", _one_line(exc)))
        sys.exit(2)
    tokenizer, recipe, name, defaults = text
    server = build_server(
        args, clients, recipe, tokenizer, name, clients[0].context_length, defaults,
        forward_only=True, response_store=store,
    )  # fmt: skip
    log_to_stderr()
    uv = server.make_uvicorn()
    settle_heap()
    ready.send(("built", name))
    try:
        ready.recv()  # the go: the supervisor stopped answering `loading` on the socket
    except (EOFError, KeyboardInterrupt):  # the supervisor is gone or stopping
        for client in clients:
            client.close()
        return
    served = (uv, ready, args.served_model_name or name)
    threading.Thread(target=_report_ready, args=served, daemon=True).start()
    try:
        uv.run(sockets=[listener])
    except KeyboardInterrupt:
        pass
    finally:
        for client in clients:
            client.close()


def _report_ready(uv: Any, ready: Connection, name: str) -> None:
    while not getattr(uv, "started", False):
        if getattr(uv, "should_exit", False):
            return
        time.sleep(0.02)
    ready.send(("ready", name))
    ready.close()


def load_text(options: LoadOptions) -> tuple[Any, Any, str, Any]:
    """What a frontend needs without weights: tokenizer, recipe, served name, generation
    defaults (the engine process converted a GGUF checkpoint already)."""
    from resin.generation_config import NO_DEFAULTS
    from resin.generation_config import resolve as resolve_defaults
    from resin_app.loading import (
        check_folder,
        checkpoint_tokenizer,
        recipe_for,
        served_folder,
        with_template_limits,
        with_vision,
    )
    from resin_model.default_model import DEFAULT_MODEL_NAME

    folder = served_folder(options)
    check_folder(folder, options)  # the files a frontend opens are the checkpoint's own
    tokenizer = checkpoint_tokenizer(folder)
    if options.fake:
        recipe = with_template_limits(recipe_for(tokenizer, options.recipe), options)
        return tokenizer, recipe, "fake", NO_DEFAULTS
    recipe = with_vision(recipe_for(tokenizer, options.recipe), tokenizer, folder)
    with_template_limits(recipe, options)
    checkpoint = options.checkpoint.rstrip("/").rsplit("/", 1)[-1] if options.checkpoint else None
    name = options.model or checkpoint or DEFAULT_MODEL_NAME
    return tokenizer, recipe, name, resolve_defaults(options.generation_config, folder)
