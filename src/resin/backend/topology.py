"""Process groups for tensor / expert / data parallelism, in `torchrun` conventions.

The world (`WORLD_SIZE` ranks, `RANK`, `LOCAL_RANK` from the environment, as `torchrun` sets
them) is cut into `data_parallel = world // tensor_parallel` replicas of consecutive ranks.
Each replica's first rank (its leader) owns an Engine; the replica's ranks share two groups:

- `model`: the device backend (NCCL on CUDA, Gloo on CPU); the runner's TP/EP collectives.
- `control`: always Gloo (CPU tensors, so a plan never takes a trip through the device); the
  leader broadcasts each step's plan on it.

With `shared_leader` (what `launch.spawn_local` starts: a data-parallel front that leads every
replica from one process) rank 0 leads every replica and the others are its workers: the world
is `1 + data_parallel * (tensor_parallel - 1)` ranks and replica i is rank 0 plus ranks
`1 + i*(tp-1) .. (i+1)*(tp-1)`. With one replica both layouts are the same.

Every group is created with a timeout: a collective that waits longer raises instead of
hanging (Gloo enforces it per operation; NCCL's watchdog aborts the communicator).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT = timedelta(seconds=120)


@dataclass(frozen=True, slots=True)
class Topology:
    """Where this process sits: its global rank and its replica of `tensor_parallel` ranks."""

    rank: int
    world_size: int
    local_rank: int
    tensor_parallel: int
    shared_leader: bool = False
    """Rank 0 leads every replica (see the module docstring)."""

    def __post_init__(self) -> None:
        tp, world = self.tensor_parallel, self.world_size
        if self.shared_leader and tp > 1 and (world - 1) % (tp - 1):
            raise ValueError(f"world size {world} is not 1 + a multiple of {tp - 1}")
        if self.shared_leader and tp == 1 and world != 1:
            raise ValueError("a shared leader with tensor_parallel 1 has no workers")
        if tp < 1 or (not self.shared_leader and world % tp):
            raise ValueError(f"world size {world} is not a multiple of tensor_parallel {tp}")
        if not 0 <= self.rank < world:
            raise ValueError(f"rank {self.rank} outside world size {world}")

    @classmethod
    def from_env(cls, tensor_parallel: int | None = None, shared_leader: bool = False) -> Topology:
        """Read `torchrun`'s variables; `tensor_parallel` defaults to the whole world."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=world,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            tensor_parallel=tensor_parallel or world,
            shared_leader=shared_leader,
        )

    @property
    def data_parallel(self) -> int:
        if self.shared_leader:
            return (
                1 if self.world_size == 1 else (self.world_size - 1) // (self.tensor_parallel - 1)
            )
        return self.world_size // self.tensor_parallel

    @property
    def replica(self) -> int:
        """This rank's replica (a shared leader: replica 0, though it leads them all)."""
        if self.shared_leader:
            return 0 if self.rank == 0 else (self.rank - 1) // (self.tensor_parallel - 1)
        return self.rank // self.tensor_parallel

    @property
    def leader(self) -> int:
        """Global rank of this replica's rank 0 (the one that owns the Engine)."""
        return 0 if self.shared_leader else self.replica * self.tensor_parallel

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    def replica_ranks(self, replica: int) -> list[int]:
        if self.shared_leader:
            size = self.tensor_parallel - 1
            return [0, *range(1 + replica * size, 1 + (replica + 1) * size)]
        start = replica * self.tensor_parallel
        return list(range(start, start + self.tensor_parallel))


@dataclass(frozen=True, slots=True)
class ProcessGroups:
    """This rank's groups (see the module docstring) and the device its runner uses."""

    topology: Topology
    device: torch.device
    model: dist.ProcessGroup
    control: dist.ProcessGroup
    timeout: timedelta


def default_device(topology: Topology) -> torch.device:
    """`cuda:LOCAL_RANK` when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", topology.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_process_groups(
    tensor_parallel: int | None = None,
    *,
    device: torch.device | str | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    topology: Topology | None = None,
    init_method: str | None = None,
    backend: str | None = None,
) -> ProcessGroups:
    """Join the world and build this rank's groups.

    The world comes from torchrun's environment unless `topology` and `init_method` (e.g.
    "tcp://127.0.0.1:PORT") say otherwise. Every rank must call this (groups are created
    collectively, in the same order everywhere). `backend`: the model group's (default NCCL
    on CUDA, Gloo on the CPU); "gloo" on CUDA lets two ranks share one GPU, which NCCL
    refuses (a test of the sharded math, not a fast path).
    """
    topology = topology or Topology.from_env(tensor_parallel)
    device = torch.device(device) if device is not None else default_device(topology)
    groups = _join(topology, device, timeout, init_method, backend)
    model, control = groups[topology.replica]
    return ProcessGroups(topology, device, model, control, timeout)


def init_shared_leader(
    topology: Topology,
    devices: list[torch.device],
    *,
    timeout: timedelta = DEFAULT_TIMEOUT,
    init_method: str | None = None,
) -> list[ProcessGroups]:
    """Rank 0 of a `shared_leader` topology joins the world: its groups in every replica,
    replica i's shard on `devices[i]`."""
    if not (topology.shared_leader and topology.rank == 0):
        raise ValueError("init_shared_leader is for rank 0 of a shared-leader topology")
    groups = _join(topology, devices[0], timeout, init_method)
    return [
        ProcessGroups(topology, d, m, c, timeout) for d, (m, c) in zip(devices, groups, strict=True)
    ]


def _join(
    topology: Topology,
    device: torch.device,
    timeout: timedelta,
    init_method: str | None,
    backend: str | None = None,
) -> list[tuple[dist.ProcessGroup, dist.ProcessGroup]]:
    """Init the world and create every replica's (model, control) groups, in the same order
    on every rank (groups are created collectively)."""
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            rank=topology.rank,
            world_size=topology.world_size,
            timeout=timeout,
            init_method=init_method,
        )
    groups = []
    for replica in range(topology.data_parallel):
        ranks = topology.replica_ranks(replica)
        group = dist.new_group(ranks, timeout=timeout, backend=backend)
        cpu_group = dist.new_group(ranks, timeout=timeout, backend="gloo")
        groups.append((group, cpu_group))
    return groups


def shutdown() -> None:
    """Leave the world (idempotent)."""
    if dist.is_initialized():
        dist.destroy_process_group()
