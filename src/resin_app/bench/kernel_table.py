"""The per-kernel bandwidth table of one decode step (`resin bench runner --kernels`), from a
census's recorded launches and the device kernels the profiler saw under each.

Pure Python (no torch): `kernel_census.py` records the launches and reads the profiler;
`attribute` joins the two, `top_rows` keeps the longest kernels, `format_table` prints them.

Bytes are an estimate: the tensor bytes a launch touches (each storage's touched extent once
per launch; a Triton kernel's own `launch_metadata` "bytes" where it declares one), not DRAM
counters. A launch that ran several kernels splits its bytes over them by their device time.
A kernel under no recorded launch is "unattributed": its time, no bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Basis = Literal["meta", "args", "aten", "none"]
"""Where a launch's bytes come from: the kernel's `launch_metadata` ("meta"), its tensor
arguments' extents ("args": an upper bound where it reads part of an argument, e.g. the pages
of a paged KV arena), an aten op's inputs and outputs ("aten"), or nowhere ("none")."""

UNATTRIBUTED = "unattributed"
OTHER = "other"


@dataclass(frozen=True, slots=True)
class Launch:
    """One recorded launch: its index in the census (the profiler range `resin_launch#index`),
    the op or Triton kernel that launched, and the bytes it moves."""

    index: int
    name: str
    bytes: int
    basis: Basis


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """One device kernel the profiler saw: its name, duration and the launch it ran under
    (None: under no recorded launch)."""

    name: str
    us: float
    launch: int | None


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One kernel name's share of a step: launches, device time (us) and bytes per step."""

    name: str
    launches: float
    us: float
    bytes: float
    basis: str

    def tb_s(self) -> float:
        return self.bytes / self.us / 1e6 if self.us > 0 else 0.0

    def to_json(self, ceiling_bandwidth: float) -> dict[str, Any]:
        tb_s = self.tb_s()
        return {
            "name": self.name, "launches": self.launches, "us": self.us, "bytes": self.bytes,
            "tb_s": tb_s, "frac_of_ceiling": tb_s * 1e12 / ceiling_bandwidth, "basis": self.basis,
        }  # fmt: skip


def attribute(
    launches: Sequence[Launch], events: Iterable[KernelEvent], steps: int
) -> list[KernelRow]:
    """Rows per kernel name, per step (`steps` steps were profiled), longest first. A launch's
    bytes split over its kernels by device time; kernels under no known launch share one
    `UNATTRIBUTED` row (their time, no bytes)."""
    by_index = {launch.index: launch for launch in launches}
    events = list(events)
    launch_us: dict[int, float] = {}
    for e in events:
        if e.launch in by_index:
            launch_us[e.launch] = launch_us.get(e.launch, 0.0) + e.us
    acc: dict[str, list[float]] = {}
    bases: dict[str, set[str]] = {}
    for e in events:
        launch = by_index.get(e.launch) if e.launch is not None else None
        name = e.name if launch is not None else UNATTRIBUTED
        share = e.us / launch_us[launch.index] if launch and launch_us[launch.index] > 0 else 0.0
        moved = launch.bytes * share if launch is not None else 0.0
        row = acc.setdefault(name, [0.0, 0.0, 0.0])
        row[0], row[1], row[2] = row[0] + 1, row[1] + e.us, row[2] + moved
        bases.setdefault(name, set()).add(launch.basis if launch is not None else "none")
    rows = [
        KernelRow(name, n / steps, us / steps, moved / steps, "+".join(sorted(bases[name])))
        for name, (n, us, moved) in acc.items()
    ]
    return sorted(rows, key=lambda r: r.us, reverse=True)


def top_rows(rows: Sequence[KernelRow], n: int) -> list[KernelRow]:
    """The `n` longest rows, then one `OTHER` row summing the rest (none if nothing is left);
    `UNATTRIBUTED` always stays its own row."""
    kept = [r for r in rows if r.name != UNATTRIBUTED]
    unattributed = [r for r in rows if r.name == UNATTRIBUTED]
    head, rest = kept[:n], kept[n:]
    if rest:
        bases = sorted({b for r in rest for b in r.basis.split("+")})
        head.append(KernelRow(OTHER, sum(r.launches for r in rest), sum(r.us for r in rest),
                              sum(r.bytes for r in rest), "+".join(bases)))  # fmt: skip
    return head + unattributed


def format_table(
    rows: Sequence[KernelRow], ceiling_bandwidth: float, title: str, replay_us: float | None
) -> str:
    """The table: a header saying what the bytes are, a line per row, and a footer with the
    summed kernel time per step against the timed step of the same batch (`replay_us`: the
    decode row, a graph replay unless graphs are off; None when not measured)."""
    total_us = sum(r.us for r in rows)
    lines = [
        f"== {title}: device kernels of one eager decode step (per step; bytes: tensor bytes "
        f"touched, an estimate, not DRAM counters; basis args = upper bound)",
        f"{'kernel':<60} {'launches':>8} {'us':>9} {'%time':>6} {'MB':>9} {'TB/s':>6} "
        f"{'of BW':>6} basis",
    ]
    for r in rows:
        tb_s = r.tb_s()
        share = 100 * r.us / total_us if total_us > 0 else 0.0
        lines.append(
            f"{_short(r.name):<60} {r.launches:>8.1f} {r.us:>9.1f} {share:>5.1f}% "
            f"{r.bytes / 1e6:>9.2f} {tb_s:>6.2f} {100 * tb_s * 1e12 / ceiling_bandwidth:>5.0f}% "
            f"{r.basis}"
        )
    footer = f"kernel time per step {total_us:,.1f} us"
    if replay_us is not None:
        footer += (
            f"; timed step of the decode row (a graph replay on CUDA) {replay_us:,.1f} us; "
            f"gaps and launch overhead {replay_us - total_us:,.1f} us"
        )
    lines.append(footer)
    return "\n".join(lines)


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."
