"""One call every rank of a job makes: build this rank's shard, then lead or follow.

```python
runner = start_tensor_parallel(lambda groups: reference_runner(groups, checkpoint=folder))
if runner is not None:          # this replica's leader: drive an Engine with it
    with Engine(runner) as engine: ...
```
On the other ranks `start_tensor_parallel` runs the worker loop and returns None once the
leader closes the runner (or raises when the leader is gone). `spawn_local` is the leader that
starts its own workers (no torchrun). What a rank builds is the caller's `build`; the
application's `resin worker` builds the reference runner's shards (docs/distributed.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from resin.backend.distributed import (
    DEFAULT_CAPACITY,
    DistributedRunner,
    PlanChannel,
    heartbeat_for,
    run_worker,
)
from resin.backend.topology import (
    DEFAULT_TIMEOUT,
    ProcessGroups,
    Topology,
    init_process_groups,
    init_shared_leader,
)
from resin.protocols import Runner


def start_tensor_parallel(
    build: Callable[[ProcessGroups], Runner],
    *,
    tensor_parallel: int | None = None,
    device: torch.device | str | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    capacity: int = DEFAULT_CAPACITY,
    topology: Topology | None = None,
    init_method: str | None = None,
    backend: str | None = None,
) -> DistributedRunner | None:
    """Join the job (torchrun environment unless `topology` + `init_method` are given), build
    this rank's runner with `build(groups)`; return the `DistributedRunner` on a leader, or
    follow the leader until it closes. `backend`: the model group's (`init_process_groups`)."""
    groups = init_process_groups(
        tensor_parallel,
        device=device,
        timeout=timeout,
        topology=topology,
        init_method=init_method,
        backend=backend,
    )
    local = build(groups)
    channel = PlanChannel(groups.control, groups.topology.leader, capacity)
    if groups.topology.is_leader:
        return DistributedRunner(local, channel, heartbeat=heartbeat_for(timeout))
    run_worker(local, channel)
    return None


def nth_device(device: torch.device, offset: int) -> torch.device:
    """`device` moved `offset` indices on (`cuda:K` -> `cuda:K+offset`)."""
    return torch.device(device.type, (device.index or 0) + offset)


@dataclass
class LocalJob:
    """Leaders in this process (one `DistributedRunner` per replica) and their workers as
    child processes (`spawn_local`)."""

    runners: list[DistributedRunner]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def runner(self) -> DistributedRunner:
        """The first (with one replica: the only) replica's runner."""
        return self.runners[0]

    def wait(self, timeout: float = 30.0) -> list[int]:
        """After every runner's `close()`: reap the workers (killing any that outlive
        `timeout`)."""
        codes = []
        for proc in self.workers:
            try:
                codes.append(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return codes


def spawn_local(
    build: Callable[[ProcessGroups], Runner],
    worker_command: Sequence[str],
    *,
    tensor_parallel: int,
    data_parallel: int = 1,
    device: torch.device | str | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    capacity: int = DEFAULT_CAPACITY,
) -> LocalJob:
    """Start the workers of `data_parallel` replicas of `tensor_parallel` ranks on this host
    as `worker_command` processes (say `resin worker` and what to build; this adds the
    world's flags), then join as the leader of every replica (`Topology.shared_leader`),
    calling `build` once per replica.

    This is what `--tensor-parallel N` (and `--data-parallel M`) need without torchrun: the
    caller keeps one process and gets one `DistributedRunner` per replica for its Engines.
    Devices: replica i's rank r runs on `cuda:(K + i*N + r)` from the leader's `cuda:K`
    (default cuda:0), or on the CPU.
    """
    tp, dp = tensor_parallel, data_parallel
    if tp < 2 or dp < 1:
        raise ValueError("spawn_local starts workers: tensor_parallel >= 2, data_parallel >= 1")
    first = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base = first.index or 0
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env["WORLD_SIZE"] = str(1 + dp * (tp - 1))
    command = [*worker_command, "--shared-leader"]
    command += ["--tensor-parallel", str(tp), "--timeout", str(timeout.total_seconds())]
    workers = []
    for i in range(dp):
        for r in range(1, tp):
            rank, local = 1 + i * (tp - 1) + r - 1, base + i * tp + r
            extra = {"RANK": str(rank), "LOCAL_RANK": str(local if first.type == "cuda" else rank)}
            workers.append(subprocess.Popen(command, env={**env, **extra}))
    devices = [nth_device(first, i * tp) if first.type == "cuda" else first for i in range(dp)]
    topology = Topology(0, 1 + dp * (tp - 1), base, tp, shared_leader=True)
    try:
        groups = init_shared_leader(
            topology, devices, timeout=timeout, init_method=f"tcp://127.0.0.1:{port}"
        )
        runners = []
        for g in groups:  # each replica's heartbeat starts as soon as its shard is built
            channel = PlanChannel(g.control, 0, capacity)
            runners.append(DistributedRunner(build(g), channel, heartbeat=heartbeat_for(timeout)))
    except BaseException:
        for proc in workers:
            proc.kill()
        raise
    return LocalJob(runners, workers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
