"""`resin bench runner --kernels`, its pure parts: the attribution of device kernels to
recorded launches, the table, and the byte count of tensors (the runs on a tiny model through
Triton's interpreter: tests/cuda/test_bench_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from resin_app.bench.kernel_census import Census, tensor_bytes
from resin_app.bench.kernel_table import (
    OTHER,
    UNATTRIBUTED,
    KernelEvent,
    Launch,
    attribute,
    format_table,
    top_rows,
)


def test_a_launch_splits_its_bytes_over_its_kernels_by_time_per_step() -> None:
    launches = [Launch(0, "aten::mm", 3000, "aten"), Launch(1, "_rmsnorm_kernel", 100, "args")]
    events = [
        KernelEvent("gemm", 30.0, 0), KernelEvent("splitk_reduce", 10.0, 0),
        KernelEvent("_rmsnorm_kernel", 5.0, 1), KernelEvent("Memcpy HtoD", 2.0, None),
        KernelEvent("gemm", 30.0, 0), KernelEvent("splitk_reduce", 10.0, 0),
    ]  # fmt: skip
    rows = {r.name: r for r in attribute(launches, events, steps=2)}
    assert rows["gemm"].us == 30.0 and rows["gemm"].launches == 1.0
    # Launch 0 ran 80 us of kernels in all: gemm's 60 us carry 3/4 of its 3000 bytes.
    assert rows["gemm"].bytes == pytest.approx(3000 * 60 / 80 / 2)
    assert rows["splitk_reduce"].bytes == pytest.approx(3000 * 20 / 80 / 2)
    assert rows["_rmsnorm_kernel"].bytes == pytest.approx(50)
    assert rows[UNATTRIBUTED].us == 1.0 and rows[UNATTRIBUTED].bytes == 0
    assert rows[UNATTRIBUTED].basis == "none" and rows["gemm"].basis == "aten"
    assert next(r.name for r in attribute(launches, events, 2)) == "gemm"  # longest first
    assert rows["gemm"].tb_s() == pytest.approx(1125 / 30 / 1e6)


def test_kernels_of_unknown_launches_are_unattributed() -> None:
    """A census whose two passes disagreed passes no launches: every kernel keeps its time."""
    rows = attribute([], [KernelEvent("k", 4.0, 0), KernelEvent("j", 2.0, 1)], steps=1)
    assert [(r.name, r.us, r.bytes) for r in rows] == [(UNATTRIBUTED, 6.0, 0.0)]


def test_top_rows_sum_the_rest_and_keep_unattributed_apart() -> None:
    launches = [Launch(i, f"k{i}", 10 * (i + 1), "meta") for i in range(5)]
    events = [KernelEvent(f"k{i}", float(i + 1), i) for i in range(5)]
    events.append(KernelEvent("lost", 0.5, None))
    rows = top_rows(attribute(launches, events, steps=1), 2)
    assert [r.name for r in rows] == ["k4", "k3", OTHER, UNATTRIBUTED]
    assert rows[2].us == 6.0 and rows[2].bytes == 60 and rows[2].launches == 3
    assert sum(r.us for r in rows) == 15.5  # nothing lost
    table = format_table(rows, ceiling_bandwidth=4e12, title="m", replay_us=20.0)
    assert "estimate, not DRAM counters" in table.splitlines()[0]
    assert table.splitlines()[-1].endswith("gaps and launch overhead 4.5 us")
    assert len(table.splitlines()) == 2 + len(rows) + 1
    assert "replay" not in format_table(rows, 4e12, "m", None).splitlines()[-1]


def test_tensor_bytes_counts_each_storage_once_over_the_extents_touched() -> None:
    x = torch.zeros(16, 8)  # 512 bytes
    assert tensor_bytes([x, x.t(), x[2:4]]) == 512
    assert tensor_bytes([x[0:2], x[1:3]]) == 3 * 8 * 4  # union of rows 0-2
    assert tensor_bytes([x[0:2], x[10:12]]) == 4 * 8 * 4
    assert tensor_bytes({"a": x[:, 0], "b": (torch.zeros(3, dtype=torch.int64),)}) == (
        (15 * 8 + 1) * 4 + 24
    )  # a strided column spans its rows


def test_the_aten_census_counts_inputs_outputs_and_gathered_rows_only() -> None:
    w, table = torch.randn(32, 16), torch.randn(1000, 16)
    x, ids = torch.randn(2, 16), torch.tensor([3, 7])
    census = Census(measure=True, ranges=False)
    with census.active():
        y = x @ w.t()  # a view, then one mm
        e = torch.nn.functional.embedding(ids, table)
    assert y.shape == (2, 32) and e.shape == (2, 16)
    mm, emb = census.launches
    assert (mm.name, mm.bytes, mm.basis) == ("aten::mm", (32 * 16 + 2 * 16 + 2 * 32) * 4, "aten")
    assert (emb.name, emb.bytes) == ("aten::embedding", 2 * 2 * 16 * 4 + 2 * 8)  # not the table


def test_the_census_restores_the_triton_launch_path() -> None:
    pytest.importorskip("triton")
    from triton.runtime.jit import JITFunction

    before = JITFunction.__dict__["run"]
    with Census(measure=True, ranges=True).active():
        assert JITFunction.__dict__["run"] is not before
    assert JITFunction.__dict__["run"] is before


def test_device_kernels_find_the_launch_range_above_the_op_that_launched_them() -> None:
    """The CUDA side on torch's own profiler events: a kernel linked to an aten op inside a
    launch range belongs to that launch, one linked to an op outside any range to none, and
    device time linked to no op becomes one unlinked event."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from resin_app.bench.kernel_census import RANGE, UNLINKED, kernel_events

    launch = FunctionEvent(1, f"{RANGE}7", 0, 0, 100)
    mm = FunctionEvent(2, "aten::mm", 0, 10, 90)
    mm.set_cpu_parent(launch)
    mm.append_kernel("gemm", 0, 30.0)
    stray = FunctionEvent(3, "aten::fill_", 0, 200, 210)
    stray.append_kernel("fill", 0, 2.0)
    device = [
        FunctionEvent(4, "gemm", 1, 120, 150, device_type=DeviceType.CUDA),
        FunctionEvent(5, "fill", 1, 220, 222, device_type=DeviceType.CUDA),
        FunctionEvent(6, "Memset", 1, 230, 235, device_type=DeviceType.CUDA),
    ]
    found = kernel_events([launch, mm, stray, *device], on_device=True)
    assert found == [
        KernelEvent("gemm", 30.0, 7), KernelEvent("fill", 2.0, None),
        KernelEvent(UNLINKED, 5.0, None),
    ]  # fmt: skip


def _raw(name: str, start: int, end: int, corr: int = 0, device: bool = False,
         annotation: bool = False) -> object:  # fmt: skip
    """A raw (Kineto) profiler event with the accessors `correlated_kernel_events` reads."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    kind = DeviceType.CUDA if device else DeviceType.CPU
    return SimpleNamespace(
        name=lambda: name, start_ns=lambda: start, end_ns=lambda: end,
        duration_ns=lambda: end - start, correlation_id=lambda: corr,
        device_type=lambda: kind, is_user_annotation=lambda: annotation,
    )  # fmt: skip


def test_device_kernels_go_to_the_range_their_launch_call_ran_in() -> None:
    """The raw-event path (Triton launches through the driver, linked to no op): a kernel
    goes to the launch range holding the host call with its correlation id; a call outside
    every range, or no call, gives none; the ranges' device-side copies are no kernels."""
    from types import SimpleNamespace

    from resin_app.bench.kernel_census import RANGE, correlated_kernel_events

    raw = [
        _raw(f"{RANGE}3", 0, 100), _raw(f"{RANGE}4", 100, 200),
        _raw("cuLaunchKernelEx", 120, 130, corr=11),  # inside range 4
        _raw("cudaLaunchKernel", 10, 20, corr=12),  # inside range 3
        _raw("cudaMemsetAsync", 300, 310, corr=13),  # outside every range
        _raw("_rmsnorm_kernel", 1000, 4000, corr=11, device=True),
        _raw("gemm", 500, 1500, corr=12, device=True),
        _raw("Memset", 2000, 2500, corr=13, device=True),
        _raw("orphan", 3000, 3100, corr=99, device=True),
        _raw(f"{RANGE}4", 900, 4100, corr=14, device=True, annotation=True),
    ]  # fmt: skip
    prof = SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(
        events=lambda: raw)))  # fmt: skip
    assert correlated_kernel_events(prof) == [
        KernelEvent("_rmsnorm_kernel", 3.0, 4), KernelEvent("gemm", 1.0, 3),
        KernelEvent("Memset", 0.5, None), KernelEvent("orphan", 0.1, None),
    ]  # fmt: skip
    assert correlated_kernel_events(SimpleNamespace()) is None  # no raw events: the op path
