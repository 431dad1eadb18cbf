"""Suite-wide settings. With RESIN_STRICT_SKIPS=1 (set by .ci/run) a skipped test fails unless
it skipped for want of a GPU: CI installs everything else the tests need (Chromium, Triton,
the packaged models), so a skip there would hide a missing install step."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from collections.abc import Iterator

import pytest

ALLOWED_SKIPS = re.compile(r"CUDA|GPU", re.IGNORECASE)


def _worker_threads() -> int | None:
    """Under pytest-xdist, each worker's share of the cores (None outside xdist). Two workers
    with torch's default of one OpenMP thread per core oversubscribe the machine: a thread
    spinning at a barrier waits for one that is descheduled, and a tiny model's step (hundreds
    of small parallel regions) ran 10-40x slower (tests/models/test_glm5_next.py's chunk16 case:
    2.3 s with one thread, 87 s with two beside another busy worker, on 2 cores)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None:
        return None
    return max(1, (os.cpu_count() or 1) // int(workers))


WORKER_THREADS = _worker_threads()
if WORKER_THREADS is not None:
    # Read by OpenMP/MKL when they load here (torch is not imported yet) and by the servers
    # and engine ranks the tests spawn; a value already in the environment stands.
    os.environ.setdefault("OMP_NUM_THREADS", str(WORKER_THREADS))


def cores_per_test() -> int:
    """Torch threads for a test of a real model (the tiny ones run on one): every core when
    the test runs alone, its worker's share under xdist (a test that took every core beside
    another busy worker was the oversubscription above)."""
    return WORKER_THREADS or os.cpu_count() or 1


@pytest.fixture(autouse=True)
def _torch_threads_per_worker() -> Iterator[None]:
    """A test that raised torch's thread count does not leave it raised for the rest of its
    worker (under xdist only; torch is never imported here for a test that did not)."""
    yield
    torch = sys.modules.get("torch")
    if (
        WORKER_THREADS is not None
        and torch is not None
        and torch.get_num_threads() != WORKER_THREADS
    ):
        torch.set_num_threads(WORKER_THREADS)


@pytest.fixture(autouse=True)
def _signals_left_as_found() -> Iterator[None]:
    """A test that leaves SIGINT or SIGTERM ignored, handled or blocked in the worker's main
    thread fails (and they are restored): the processes later tests spawn inherit an ignored
    or blocked signal, and their Ctrl-C tests would then fail far from the cause."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watched = (signal.SIGINT, signal.SIGTERM)
    handlers = {sig: signal.getsignal(sig) for sig in watched}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    changed = [sig.name for sig in watched if signal.getsignal(sig) != handlers[sig]]
    for sig in watched:
        signal.signal(sig, handlers[sig])
    blocked = signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    changed += [f"{sig.name} blocked" for sig in blocked - mask if sig in watched]
    if changed:
        pytest.fail(f"the test left signal handling changed: {', '.join(changed)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("RESIN_STRICT_SKIPS") != "1" or not report.skipped:
        return
    reason = (
        str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    )
    if not ALLOWED_SKIPS.search(reason):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (RESIN_STRICT_SKIPS=1): {reason}"
