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

from collections.abc import Callable
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
from resin.backend.topology import DEFAULT_TIMEOUT, ProcessGroups, init_process_groups
from resin.protocols import Runner


def start_tensor_parallel(
    build: Callable[[ProcessGroups], Runner],
    *,
    tensor_parallel: int | None = None,
    device: torch.device | str | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    capacity: int = DEFAULT_CAPACITY,
) -> DistributedRunner | None:
    """Join the job (torchrun environment), build this rank's runner with `build(groups)`;
    return the `DistributedRunner` on a leader, or follow the leader until it closes."""
    groups = init_process_groups(tensor_parallel, device=device, timeout=timeout)
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
