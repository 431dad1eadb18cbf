"""Start a 2-rank Gloo job of `scenario.py` the way torchrun would (env:// rendezvous)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SCENARIO = Path(__file__).resolve().parent / "scenario.py"
SRC = Path(__file__).resolve().parents[2] / "src"  # this checkout's code, as pytest uses it


@dataclass(frozen=True)
class Finished:
    returncodes: list[int]
    output: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_single(
    name: str, out: Path, *, collective_timeout: float = 20.0, wall: float = 90.0
) -> Finished:
    """Run scenario `name` as one process that starts its own workers."""
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    args = [sys.executable, str(SCENARIO), name, str(out), str(collective_timeout)]
    done = subprocess.run(args, env=env, capture_output=True, timeout=wall, check=False)
    return Finished([done.returncode], (done.stdout + done.stderr).decode(errors="replace"))


def launch(
    name: str,
    out: Path,
    *,
    collective_timeout: float = 20.0,
    wall: float = 90.0,
    env: dict[str, str] | None = None,
    script: Path = SCENARIO,
) -> Finished:
    """Run scenario `name` of `script` on ranks 0 and 1; the worker starts first so rank 0
    knows its pid.

    Both processes are killed if the job outlives `wall` seconds (the test then fails).
    """
    base = {
        **os.environ,
        **(env or {}),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": "2",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    args = [sys.executable, str(script), name, str(out), str(collective_timeout)]
    logs = [out / "rank0.log", out / "rank1.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in (1, 0):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            if procs:
                env["PEER_PID"] = str(procs[0].pid)
            with logs[rank].open("wb") as log:
                procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = [p.wait(timeout=wall) for p in reversed(procs)]
    except subprocess.TimeoutExpired:
        codes = [-1, -1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    output = "\n".join(f"--- rank {r} ---\n{logs[r].read_text(errors='replace')}" for r in (0, 1))
    return Finished(codes, output)
