"""The multi-rank coordinator: `DistributedRunner` on a replica's leader, `run_worker` elsewhere.

The Engine stays single-threaded on the leader and unchanged: it drives a `DistributedRunner`,
which sends every message (the `bind` layout once, then each step's frozen `BatchPlan`) to the
other ranks of its replica and then runs its own shard. Every rank runs the same local runner
(for example a `TorchRunner` over `shard_model(...)`) on the same plan; the shards meet in the
runner's own collectives; the leader returns its `ForwardOutput`.

Wire: one Gloo broadcast per message on the replica's control group, of a fixed-capacity uint8
tensor `[8-byte length | message]`; a message larger than the capacity sends its remainder in a
second broadcast. A message is the payload pickled without its numpy arrays, whose raw bytes
follow (`encode` / `decode`). The control channel is trusted (ranks of one job): it unpickles.

Failure semantics: every collective has the groups' timeout. An idle leader sends a heartbeat
every `timeout / 4` so workers never wait forever, and so a dead worker is noticed between
steps. Any failure during a step (a collective that times out or loses a peer, or an exception
in the local runner once the plan went out) leaves the ranks out of lockstep, so the leader
marks the group dead and raises `RunnerDeadError`; the Engine then ends every request with an
error and refuses new ones. A worker exits on any failure; a dead leader makes workers exit
within one timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from resin.errors import RunnerDeadError
from resin.plan import BatchPlan, ForwardOutput
from resin.protocols import (
    BindableRunner,
    CacheLayout,
    ClosableRunner,
    Runner,
    RunnerConfig,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_CAPACITY = 1 << 16
_HEADER = 8


class Kind(IntEnum):
    FORWARD = 1
    BIND = 2
    CLOSE = 3
    PING = 4


@dataclass(frozen=True, slots=True)
class Message:
    kind: Kind
    payload: Any = None


class _Packer(pickle.Pickler):
    """Pickles everything but numpy arrays, which it lists aside (their bytes travel raw)."""

    def __init__(self, file: io.BytesIO, arrays: list[np.ndarray]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays = arrays

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) is np.ndarray:
            self.arrays.append(obj)
            return len(self.arrays) - 1
        return None


class _Unpacker(pickle.Unpickler):
    def __init__(
        self, file: io.BytesIO, table: list[tuple[str, tuple[int, ...], int, int]], blob: memoryview
    ) -> None:
        super().__init__(file)
        self.table, self.blob = table, blob

    def persistent_load(self, pid: Any) -> np.ndarray:
        dtype, shape, offset, count = self.table[pid]
        # A read-only view into the message: received plans stay frozen, nothing is copied.
        return np.frombuffer(self.blob, dtype=dtype, count=count, offset=offset).reshape(shape)


def encode(message: Message) -> bytes:
    """`[4-byte head length | pickled (kind, skeleton, array table) | raw array bytes]`.

    Arrays skip numpy's own pickling (about half the cost for a plan's ~30 small arrays).
    """
    arrays: list[np.ndarray] = []
    skeleton = io.BytesIO()
    _Packer(skeleton, arrays).dump(message.payload)
    table, parts, offset = [], [], 0
    for array in arrays:
        data = np.ascontiguousarray(array).tobytes()
        table.append((array.dtype.str, array.shape, offset, array.size))
        parts.append(data)
        offset += len(data)
    head = pickle.dumps((int(message.kind), skeleton.getvalue(), table), pickle.HIGHEST_PROTOCOL)
    return b"".join([len(head).to_bytes(4, "little"), head, *parts])


def decode(data: bytes) -> Message:
    view = memoryview(data)
    size = int.from_bytes(view[:4], "little")
    kind, skeleton, table = pickle.loads(view[4 : 4 + size])
    payload = _Unpacker(io.BytesIO(skeleton), table, view[4 + size :]).load()
    return Message(Kind(kind), payload)


class PlanChannel:
    """Broadcasts messages from `src` (a global rank) to the other ranks of `group`."""

    def __init__(
        self, group: dist.ProcessGroup, src: int, capacity: int = DEFAULT_CAPACITY
    ) -> None:
        if capacity <= _HEADER:
            raise ValueError(f"capacity must exceed {_HEADER} bytes")
        self.group, self.src, self.capacity = group, src, capacity
        self._buffer = torch.zeros(capacity, dtype=torch.uint8)
        self._view = self._buffer.numpy()  # shares memory with the tensor

    def send(self, message: Message) -> None:
        data = encode(message)
        first = min(len(data), self.capacity - _HEADER)
        self._view[:_HEADER] = np.frombuffer(len(data).to_bytes(_HEADER, "little"), np.uint8)
        self._view[_HEADER : _HEADER + first] = np.frombuffer(data, np.uint8, first)
        dist.broadcast(self._buffer, self.src, group=self.group)
        if len(data) > first:
            rest = torch.frombuffer(bytearray(data[first:]), dtype=torch.uint8)
            dist.broadcast(rest, self.src, group=self.group)

    def receive(self) -> Message:
        dist.broadcast(self._buffer, self.src, group=self.group)
        size = int.from_bytes(self._view[:_HEADER].tobytes(), "little")
        first = min(size, self.capacity - _HEADER)
        data = self._view[_HEADER : _HEADER + first].tobytes()
        if size > first:
            rest = torch.empty(size - first, dtype=torch.uint8)
            dist.broadcast(rest, self.src, group=self.group)
            data += rest.numpy().tobytes()
        return decode(data)


class DistributedRunner:
    """A Runner on a replica's leader: broadcasts each message, then runs the local shard.

    `local` is this rank's runner (its `runner_config`, `bind` and `close` are forwarded).
    `heartbeat` (seconds; None = off) is how long the channel may stay quiet before a PING.
    Not thread-safe beyond its own heartbeat thread (one engine drives it).
    """

    def __init__(
        self, local: Runner, channel: PlanChannel, *, heartbeat: float | None = None
    ) -> None:
        self.local, self.channel = local, channel
        self._lock = threading.Lock()
        self._dead: str | None = None
        self._last_send = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat is not None:
            self._thread = threading.Thread(
                target=self._beat, args=(heartbeat,), name="resin-heartbeat", daemon=True
            )
            self._thread.start()

    @property
    def runner_config(self) -> RunnerConfig:
        """The local runner's, less what a broadcast plan cannot carry: a pending mask is a
        callable on the leader's engine thread (so masks are filled before the plan goes out),
        and steps run one at a time (`forward`, no `submit` / `collect`)."""
        rc = getattr(self.local, "runner_config", None)
        if not isinstance(rc, RunnerConfig):
            return RunnerConfig()
        return dataclasses.replace(rc, waits_for_masks=False, overlap=False)

    @property
    def dead(self) -> str | None:
        """Why the group is dead, or None while it is alive."""
        return self._dead

    def bind(self, layout: CacheLayout) -> None:
        self._send(Message(Kind.BIND, layout))
        local = self.local
        if isinstance(local, BindableRunner):
            self._guarded(lambda: local.bind(layout))

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        self._send(Message(Kind.FORWARD, plan))
        out = self._guarded(lambda: self.local.forward(plan))
        if self._dead is not None:  # the heartbeat lost a peer while this step ran
            raise RunnerDeadError(f"distributed runner is dead: {self._dead}")
        return out

    def close(self) -> None:
        """Tell the workers to stop (best effort), stop the heartbeat, close the local runner."""
        self._stop.set()
        if self._dead is None:
            with contextlib.suppress(RunnerDeadError):
                self._send(Message(Kind.CLOSE))
            self._dead = "closed"
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if isinstance(self.local, ClosableRunner):
            self.local.close()

    def _send(self, message: Message) -> None:
        with self._lock:
            if self._dead is not None:
                raise RunnerDeadError(f"distributed runner is dead: {self._dead}")
            try:
                self.channel.send(message)
            except Exception as exc:
                self._dead = f"broadcast of {message.kind.name} failed: {exc}"
                raise RunnerDeadError(self._dead) from exc
            self._last_send = time.monotonic()

    def _guarded(self, call: Callable[[], _T]) -> _T:
        # Once a message went out, every rank is inside the step: any failure here means the
        # ranks are no longer in lockstep, so the group cannot run another step.
        try:
            return call()
        except Exception as exc:
            self._dead = f"rank {self.channel.src} failed inside a distributed step: {exc!r}"
            raise RunnerDeadError(self._dead) from exc

    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval / 4):
            if time.monotonic() - self._last_send < interval:
                continue
            try:
                self._send(Message(Kind.PING))
            except RunnerDeadError:
                log.error("distributed runner: heartbeat failed: %s", self._dead)
                return


def run_worker(local: Runner, channel: PlanChannel) -> None:
    """Follow the leader: bind, run each plan on the local shard, return on CLOSE.

    Raises whatever a collective or the local runner raises (the caller exits the process).
    """
    while True:
        message = channel.receive()
        if message.kind is Kind.FORWARD:
            local.forward(message.payload)
        elif message.kind is Kind.BIND:
            if isinstance(local, BindableRunner):
                local.bind(message.payload)
        elif message.kind is Kind.CLOSE:
            if isinstance(local, ClosableRunner):
                local.close()
            return


def heartbeat_for(timeout: timedelta) -> float:
    """The quiet time after which the leader pings: well inside the workers' timeout."""
    return max(timeout.total_seconds() / 4, 0.05)
