"""One call every rank of a job makes: build this rank's shard, then lead or follow.

```python
runner = start_tensor_parallel(lambda groups: reference_runner(groups, checkpoint=folder))
if runner is not None:          # this replica's leader: drive an Engine with it
    with Engine(runner) as engine: ...
```
On the other ranks `start_tensor_parallel` runs the worker loop and returns None once the
leader closes the runner (or raises when the leader is gone).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from resin.backend.distributed import (
    DEFAULT_CAPACITY,
    DistributedRunner,
    PlanChannel,
    heartbeat_for,
    run_worker,
)
from resin.backend.topology import DEFAULT_TIMEOUT, ProcessGroups, Topology, init_process_groups
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
) -> DistributedRunner | None:
    """Join the job (torchrun environment unless `topology` + `init_method` are given), build
    this rank's runner with `build(groups)`; return the `DistributedRunner` on a leader, or
    follow the leader until it closes."""
    groups = init_process_groups(
        tensor_parallel, device=device, timeout=timeout, topology=topology, init_method=init_method
    )
    local = build(groups)
    channel = PlanChannel(groups.control, groups.topology.leader, capacity)
    if groups.topology.is_leader:
        return DistributedRunner(local, channel, heartbeat=heartbeat_for(timeout))
    run_worker(local, channel)
    return None


def reference_runner(
    groups: ProcessGroups,
    *,
    checkpoint: str | Path | None = None,
    config: dict[str, Any] | None = None,
    expert_parallel: bool = False,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    **runner_kwargs: Any,
) -> Runner:
    """This rank's `TorchRunner` over its shard of a checkpoint (or of random weights from a
    Hugging Face style `config` dict, the same on every rank for the same `seed`).

    `expert_parallel`: MoE experts are split across the ranks (attention stays tensor
    parallel); otherwise every expert is split like a dense MLP.
    """
    from resin_models_torch.parallel import ParallelStyle, shard_model
    from resin_models_torch.registry import load_model, random_runner
    from resin_models_torch.runner import TorchRunner

    if (checkpoint is None) == (config is None):
        raise ValueError("give exactly one of checkpoint or config")
    if checkpoint is not None:
        model = load_model(checkpoint, groups.device, dtype)
    else:
        assert config is not None
        model = random_runner(config, seed, groups.device, dtype or torch.float32).model
    style = ParallelStyle(experts="expert" if expert_parallel else "tensor")
    return TorchRunner(shard_model(model, groups.model, style), **runner_kwargs)


@dataclass
class LocalJob:
    """A leader in this process and its workers as child processes (`spawn_local`)."""

    runner: DistributedRunner
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def wait(self, timeout: float = 30.0) -> list[int]:
        """After `runner.close()`: reap the workers (killing any that outlive `timeout`)."""
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
    worker_args: Sequence[str],
    *,
    tensor_parallel: int,
    device: torch.device | str | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    capacity: int = DEFAULT_CAPACITY,
) -> LocalJob:
    """Start ranks 1..N-1 of a one-host job as `resin worker` processes (`worker_args` tell
    them what to build; rank r uses device r), then join as the leader with `build`.

    This is what `--tensor-parallel N` needs without torchrun: the caller keeps one process
    and gets the `DistributedRunner` to give its Engine.
    """
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env["WORLD_SIZE"] = str(tensor_parallel)
    command = [sys.executable, "-m", "resin.cli", "worker", *worker_args]
    command += [
        "--tensor-parallel",
        str(tensor_parallel),
        "--timeout",
        str(timeout.total_seconds()),
    ]
    workers = [
        subprocess.Popen(command, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(1, tensor_parallel)
    ]
    try:
        runner = start_tensor_parallel(
            build,
            device=device,
            timeout=timeout,
            capacity=capacity,
            topology=Topology(0, tensor_parallel, 0, tensor_parallel),
            init_method=f"tcp://127.0.0.1:{port}",
        )
    except BaseException:
        for proc in workers:
            proc.kill()
        raise
    assert runner is not None  # rank 0 leads
    return LocalJob(runner, workers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
