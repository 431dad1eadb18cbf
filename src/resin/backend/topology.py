"""Process groups for tensor / expert / data parallelism, in `torchrun` conventions.

The world (`WORLD_SIZE` ranks, `RANK`, `LOCAL_RANK` from the environment, as `torchrun` sets
them) is cut into `data_parallel = world // tensor_parallel` replicas of consecutive ranks.
Each replica's first rank (its leader) owns an Engine; the replica's ranks share two groups:

- `model`: the device backend (NCCL on CUDA, Gloo on CPU); the runner's TP/EP collectives.
- `control`: always Gloo (CPU tensors, so a plan never takes a trip through the device); the
  leader broadcasts each step's plan on it.

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

    def __post_init__(self) -> None:
        if self.tensor_parallel < 1 or self.world_size % self.tensor_parallel:
            raise ValueError(
                f"world size {self.world_size} is not a multiple of tensor_parallel "
                f"{self.tensor_parallel}"
            )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")

    @classmethod
    def from_env(cls, tensor_parallel: int | None = None) -> Topology:
        """Read `torchrun`'s variables; `tensor_parallel` defaults to the whole world."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=world,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            tensor_parallel=tensor_parallel or world,
        )

    @property
    def data_parallel(self) -> int:
        return self.world_size // self.tensor_parallel

    @property
    def replica(self) -> int:
        return self.rank // self.tensor_parallel

    @property
    def leader(self) -> int:
        """Global rank of this replica's rank 0 (the one that owns the Engine)."""
        return self.replica * self.tensor_parallel

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    def replica_ranks(self, replica: int) -> list[int]:
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
) -> ProcessGroups:
    """Join the world and build this rank's groups.

    The world comes from torchrun's environment unless `topology` and `init_method` (e.g.
    "tcp://127.0.0.1:PORT") say otherwise. Every rank must call this (groups are created
    collectively, in the same order everywhere).
    """
    topology = topology or Topology.from_env(tensor_parallel)
    device = torch.device(device) if device is not None else default_device(topology)
    backend = "nccl" if device.type == "cuda" else "gloo"
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
    model: dist.ProcessGroup | None = None
    control: dist.ProcessGroup | None = None
    for replica in range(topology.data_parallel):
        ranks = topology.replica_ranks(replica)
        group = dist.new_group(ranks, timeout=timeout, backend=backend)
        cpu_group = dist.new_group(ranks, timeout=timeout, backend="gloo")
        if replica == topology.replica:
            model, control = group, cpu_group
    assert model is not None and control is not None
    return ProcessGroups(topology, device, model, control, timeout)


def shutdown() -> None:
    """Leave the world (idempotent)."""
    if dist.is_initialized():
        dist.destroy_process_group()
