"""A census of the kernels a function launches: what each launch moves and how long each
device kernel takes (`resin bench runner --kernels`; the table: `kernel_table.py`).

Two passes over the same work, which must launch the same sequence each time (eager decode
steps of one shape do):

1. `record`: every launch is seen and its bytes estimated. aten ops through a
   `TorchDispatchMode` (the touched extents of their input and output storages, each storage
   once per op; gathers count the rows they gather; views are no launch); Triton kernels by
   wrapping the launch path (`JITFunction.run`, the interpreter's `InterpretedFunction.run`)
   and asking the kernel's `launch_metadata` hook for "bytes" (the convention Triton's proton
   profiler reads), else counting its tensor arguments. Launches do not nest: inside one,
   nothing more is recorded.
2. `profile`: the same launches, each inside `record_function("resin_launch#i")`, under the
   torch profiler; each device kernel goes to the range its launch call ran in: the host-side
   launch event that shares the kernel's correlation id (a runtime call for aten and cuBLAS, a
   driver call, `cuLaunchKernelEx`, for Triton, which the profiler links to no op) lies inside
   exactly one range, as launches do not nest. Where the profiler gives no raw events, a
   kernel goes to the range above the op it is linked to (Triton kernels: to none). On the
   CPU the ranges themselves are the "kernels" (an interpreter smoke test).

Bytes are computed in a pass of their own because a `launch_metadata` may read the device
(the MoE kernels count the distinct routed experts), which would add kernels and syncs to the
profile.
"""

from __future__ import annotations

import bisect
import inspect
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, NamedTuple

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from resin_app.bench.kernel_table import Basis, KernelEvent, Launch

RANGE = "resin_launch#"
UNLINKED = "(device time linked to no op)"

# Ops that read only the rows they gather from a large source (an embedding table): count the
# output twice (read and written) and the indices, not the whole source.
_GATHERS = {"embedding", "index_select", "index", "gather", "take"}


def tensor_bytes(values: Any) -> int:
    """The bytes of the tensors among `values` (nested in lists, tuples, dicts), each storage
    counted once over the union of the extents its views span."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for t in tree_leaves(values):
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.is_meta:
            continue
        try:
            base = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
            continue
        extent = 1 + sum((int(n) - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
        start = int(t.storage_offset()) * t.element_size()
        spans.setdefault(base, []).append((start, start + extent * t.element_size()))
    return sum(_union(intervals) for intervals in spans.values())


def _union(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


class Census:
    """Records launches while active (`with census.active():`). `ranges` wraps each launch in
    a profiler range named `RANGE + index`; `measure` estimates its bytes."""

    def __init__(self, *, measure: bool, ranges: bool) -> None:
        self.measure, self.ranges = measure, ranges
        self.launches: list[Launch] = []
        self._depth = 0

    @contextmanager
    def launch(self, name: str, moved: Callable[[], tuple[int, Basis]]) -> Iterator[None]:
        """One launch of `name`, its bytes from `moved` after it ran (an op's output exists
        then; only when measuring). Nothing inside a launch is recorded: not what the launch
        runs, not what `moved` runs on the device."""
        if self._depth:
            yield
            return
        index = len(self.launches)
        self.launches.append(Launch(index, name, 0, "none"))
        self._depth += 1
        try:
            if self.ranges:
                with record_function(f"{RANGE}{index}"):
                    yield
            else:
                yield
            if self.measure:
                self.launches[index] = Launch(index, name, *moved())
        finally:
            self._depth -= 1

    @contextmanager
    def active(self) -> Iterator[Census]:
        with ExitStack() as stack:
            stack.enter_context(_TritonLaunches(self))
            stack.enter_context(_AtenLaunches(self))
            yield self


class _AtenLaunches(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self, census: Census) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.census = census

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func.is_view:  # aliases its input: no kernel, no bytes
            return func(*args, **kwargs)
        op = func.overloadpacket.__name__
        out: Any = None

        def moved() -> tuple[int, Basis]:
            if op in _GATHERS:
                indices = [t for t in tree_leaves((args, kwargs)) if _is_index(t)]
                return 2 * tensor_bytes(out) + tensor_bytes(indices), "aten"
            return tensor_bytes((args, kwargs, out)), "aten"

        with self.census.launch(f"aten::{op}", moved):
            out = func(*args, **kwargs)
        return out


def _is_index(t: object) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point()


class _TritonLaunches:
    """Wraps the Triton launch path (`run(*args, grid, warmup, **kwargs)`, the same for compiled
    and interpreted kernels) for as long as it is entered; restores it on exit."""

    def __init__(self, census: Census) -> None:
        self.census = census
        self._saved: list[tuple[type, Any]] = []

    def __enter__(self) -> _TritonLaunches:
        for cls in _kernel_classes():
            own = cls.__dict__.get("run")  # None: inherited, removed again on exit
            self._saved.append((cls, own))
            setattr(cls, "run", self._wrap(own or getattr(cls, "run")))  # noqa: B009, B010
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, own in reversed(self._saved):
            if own is None:
                delattr(cls, "run")
            else:
                setattr(cls, "run", own)  # noqa: B010
        self._saved.clear()

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        census = self.census

        def run(kernel: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if warmup:
                return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            fn = kernel.fn
            with census.launch(fn.__name__, lambda: kernel_bytes(kernel, grid, args, kwargs)):
                return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)

        return run


def _kernel_classes() -> list[type]:
    """The Triton classes whose `run` launches (none without Triton: aten ops only)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    return [JITFunction, InterpretedFunction]


def kernel_bytes(
    kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[int, Basis]:
    """A Triton launch's bytes: its `launch_metadata`'s "bytes" when it declares one (called as
    Triton calls it, `(grid, metadata, {argument name: value})`, with no compiled metadata),
    else its tensor arguments' bytes."""
    params = inspect.signature(kernel.fn).parameters
    bound = dict(zip(params, args, strict=False))
    bound.update((k, v) for k, v in kwargs.items() if k in params)
    hook = getattr(kernel, "launch_metadata", None) or getattr(kernel, "kwargs", {}).get(
        "launch_metadata"
    )
    if hook is not None:
        try:
            declared = hook(grid, None, bound)
        except Exception:  # a hook for another caller's arguments: the row says "args"
            declared = None
        if isinstance(declared, dict) and "bytes" in declared:
            return int(declared["bytes"]), "meta"
    return tensor_bytes(list(bound.values())), "args"


class CensusResult(NamedTuple):
    """The launches of the recording pass (none unless `matched`: the profiled pass launched
    the same sequence) and the kernels of the profiled pass."""

    launches: list[Launch]
    events: list[KernelEvent]
    matched: bool


def run_census(fn: Callable[[], object], device: torch.device) -> CensusResult:
    """Run `fn` twice: once recording bytes, once under the profiler. If the two passes
    launched different sequences the bytes are dropped (every kernel unattributed)."""
    measured = Census(measure=True, ranges=False)
    with measured.active():
        fn()
    _sync(device)
    timed = Census(measure=False, ranges=True)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        with timed.active():
            fn()
        _sync(device)
    same = [x.name for x in measured.launches] == [x.name for x in timed.launches]
    events = None
    if device.type == "cuda":
        events = correlated_kernel_events(prof)
    if events is None:
        events = kernel_events(prof.events(), device.type == "cuda")
    if device.type != "cuda":  # the ranges are the kernels: name them by their launches
        names = {x.index: x.name for x in timed.launches}
        events = [KernelEvent(names[e.launch or 0], e.us, e.launch) for e in events]
    return CensusResult(measured.launches if same else [], events, same)


def correlated_kernel_events(prof: Any) -> list[KernelEvent] | None:
    """Device kernels from the profiler's raw (Kineto) events, each with the range its
    host-side launch call ran in (module docstring); None when there are no raw events or
    no device kernel among them."""
    try:
        raw = list(prof.profiler.kineto_results.events())
    except AttributeError:
        return None
    kernels = [  # not the device-side copies of the ranges (GPU user annotations)
        e for e in raw
        if e.device_type() == DeviceType.CUDA and not e.is_user_annotation()
        and not e.name().startswith(RANGE)
    ]  # fmt: skip
    wanted = {e.correlation_id() for e in kernels} - {0}
    if not kernels or not wanted:
        return None
    ranges: list[tuple[int, int, int]] = []  # (start ns, end ns, launch index)
    calls: dict[int, int] = {}  # correlation id -> the launch call's start (ns)
    for e in raw:
        if e.device_type() == DeviceType.CUDA:
            continue
        if e.name().startswith(RANGE):
            ranges.append((e.start_ns(), e.end_ns(), _index(e.name())))
        elif e.correlation_id() in wanted:
            calls[e.correlation_id()] = e.start_ns()
    ranges.sort()
    starts = [r[0] for r in ranges]
    found = []
    for k in kernels:
        launch = None
        at = calls.get(k.correlation_id())
        if at is not None:
            i = bisect.bisect_right(starts, at) - 1
            if i >= 0 and ranges[i][0] <= at <= ranges[i][1]:
                launch = ranges[i][2]
        found.append(KernelEvent(k.name(), k.duration_ns() / 1e3, launch))
    return found


def kernel_events(events: Any, on_device: bool) -> list[KernelEvent]:
    """Device kernels (`on_device`), each with the launch range above the op it is linked to,
    plus one `UNLINKED` event (no launch) for the device time the profiler linked to no op;
    on the CPU, the launch ranges themselves with their CPU time."""
    found, device_us = [], 0.0
    for evt in events:
        if not on_device:
            if evt.name.startswith(RANGE):
                found.append(KernelEvent(evt.name, float(evt.cpu_time_total), _index(evt.name)))
            continue
        if evt.device_type == DeviceType.CUDA:
            device_us += evt.time_range.elapsed_us()
        if not evt.kernels:
            continue
        launch = _launch_above(evt)
        found += [KernelEvent(k.name, float(k.duration), launch) for k in evt.kernels]
    unlinked = device_us - sum(e.us for e in found)
    if on_device and unlinked > 1e-3 * device_us:
        found.append(KernelEvent(UNLINKED, unlinked, None))
    return found


def _launch_above(evt: Any) -> int | None:
    while evt is not None:
        if evt.name.startswith(RANGE):
            return _index(evt.name)
        evt = evt.cpu_parent
    return None


def _index(name: str) -> int:
    return int(name.removeprefix(RANGE))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
