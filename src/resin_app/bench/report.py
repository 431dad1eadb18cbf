"""Benchmark output: a printed table, JSONL lines and PNG charts (matplotlib, lazily)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from resin_app.bench.runner_bench import BenchRecord

_HEAD = (
    "model",
    "kind",
    "backend",
    "ctx",
    "batch",
    "median ms",
    "tok/s",
    "tok/s/user",
    "TB/s",
    "%BW",
    "MFU",
)


def format_row(r: BenchRecord) -> str:
    cells = (
        r.model,
        r.kind,
        r.backend,
        str(r.context),
        str(r.batch),
        f"{r.median_ms:.2f}",
        f"{r.tok_s:,.0f}",
        f"{r.per_user_tok_s:,.1f}",
        f"{r.bandwidth_tb_s:.2f}",
        f"{100 * r.bandwidth_frac:.0f}%",
        f"{100 * r.mfu:.1f}%",
    )
    return " | ".join(f"{c:>13}" if i == 0 else f"{c:>10}" for i, c in enumerate(cells))


def print_table(records: Iterable[BenchRecord]) -> None:
    print(" | ".join(f"{h:>13}" if i == 0 else f"{h:>10}" for i, h in enumerate(_HEAD)))
    for r in records:
        print(format_row(r))


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def plot(records: list[BenchRecord], out_dir: Path, title: str) -> list[Path]:
    """Two charts: prefill latency vs input tok/s/GPU; decode tok/s/user vs output tok/s/GPU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, x_of, y_of, xlabel, ylabel, label_of in (
        (
            "prefill",
            lambda r: r.median_ms,
            lambda r: r.tok_s,
            "prefill latency (ms)",
            "input tok/s per GPU",
            lambda r: f"{r.context}",
        ),
        (
            "decode",
            lambda r: r.per_user_tok_s,
            lambda r: r.tok_s,
            "output tok/s per user",
            "output tok/s per GPU",
            lambda r: f"B={r.batch}",
        ),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for backend, style in (("resin", "o-"), ("hf", "s--")):
            for ctx in sorted({r.context for r in records if r.kind == kind}) or [0]:
                pts = [
                    r
                    for r in records
                    if r.kind == kind
                    and r.backend == backend
                    and (kind == "prefill" or r.context == ctx)
                ]
                if not pts:
                    continue
                pts.sort(key=lambda r: (r.batch, r.context))
                name = backend if kind == "prefill" else f"{backend} ctx {ctx}"
                ax.plot([x_of(r) for r in pts], [y_of(r) for r in pts], style, label=name)  # type: ignore[no-untyped-call]
                for r in pts:
                    ax.annotate(label_of(r), (x_of(r), y_of(r)), fontsize=7)  # type: ignore[no-untyped-call]
                if kind == "prefill":
                    break
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {kind}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = out_dir / f"bench_{kind}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
