"""DeepSeek-V4's sparse attention kernel (`resin_models_cuda/kernels/sparse_attention.py`)
against a dense attention over the same context, decode (one query token a row), shapes of a
preset (`deepseek-v4-flash`: 64 query heads over one shared 512-wide K=V head, a 128-token
window, CSA one entry per 4 tokens with the indexer's top 512, HCA one per 128 tokens, all
read). Every row holds `context` tokens in shuffled pages and queries at position context - 1:

* `dense`: the same kernel over all `context` tokens (the window set to the context), i.e.
  what one 512-wide MQA layer without compression costs;
* `csa`: the window plus 512 selected entries (random distinct picks) of context / 4;
* `hca`: the window plus every one of context / 128 entries;
* CSA's selection itself (the indexer's scores over context / 4 keys, 64 heads x 128, then
  the top 512), which a CSA layer pays on top of `csa`, old path against new:
  `idx-old` the keys gathered out of the entry pages, scored in IEEE float32
  (`indexer_scores`), `torch.topk` (`indexer_topk_torch`); `idx-new` the keys read in place
  in the model's dtype (`paged_indexer_scores`), the radix top-k (`indexer_topk`); and their
  parts: `sc-old` / `sc-new` the scores alone (`sc-old` over keys gathered beforehand),
  `topk-old` / `topk-new` the top-k alone over the same scores; `idx-new`'s `agree` is the
  share of the old path's picks the new one also picks (random keys: near ties are rare);
* `sdpa`: torch's `scaled_dot_product_attention` over the context's keys laid out contiguous
  (no sink, no pages; for scale only, where it runs).

On CUDA each call is captured `--reps` times in one CUDA graph and replayed; microseconds a
call are the median of `--rounds` rounds (compile and capture excluded). `bytes` is the keys a
call must read (tokens x D x dtype bytes a query row, once for all heads); `frac` is TB/s over
`--copy-tbs`. Splits (flash-decoding) as the model picks them (`default_splits`). Prints a
table (speedup = dense / kind) and appends every row to `--output` as JSONL (`us` null where
the call failed, e.g. SDPA's math fallback out of memory at batch 64).

    resin bench sparse-attention --output docs/bench/gpu/sparse_attention_dsv4.jsonl

On CPU (`--device cpu`, Triton's interpreter, `TRITON_INTERPRET=1`) it runs tiny presets for
a smoke test: `--preset tiny-deepseek_v4 --contexts 64 --batch-sizes 1,2`.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from resin_model.presets import preset
from resin_models_cuda.kernels.indexer import (
    indexer_scores,
    indexer_topk,
    indexer_topk_torch,
    paged_indexer_scores,
    visible_entries,
)
from resin_models_cuda.kernels.sparse_attention import (
    PagedKeys,
    default_splits,
    sparse_attention,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Row:
    kind: str
    context: int
    batch: int
    keys: int  # keys a query reads
    splits: int
    us: float
    bytes: float
    agree: float | None = None  # idx-new: the share of idx-old's picks it also picks

    @property
    def tbs(self) -> float:
        return self.bytes / (self.us * 1e-6) / 1e12 if self.us > 0 else 0.0


def time_call(fn: Callable[[], Any], device: torch.device, reps: int, rounds: int) -> float:
    """Microseconds a call (module docstring); inf when it fails on this device."""
    try:
        fn()
        if device.type != "cuda":
            started = time.perf_counter()
            fn()
            return (time.perf_counter() - started) * 1e6
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        graph.replay()
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        times = []
        for _ in range(rounds):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / reps)
        return float(sorted(times)[len(times) // 2])
    except Exception as exc:  # out of memory, or a shape the backend refuses
        print("  failed:", type(exc).__name__, str(exc).splitlines()[0][:160], flush=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return math.inf


def _gather(keys: PagedKeys, entries: int) -> torch.Tensor:
    """[B, entries, D]: every row's keys out of its pages (what the old path did each step)."""
    per_page = keys.pages.shape[1]
    w = torch.arange(entries, device=keys.pages.device)
    page = keys.ids[(keys.indptr[:-1, None] + w[None, :] // per_page).long()]
    return keys.pages[page.long(), w % per_page]


@dataclass(frozen=True)
class _Indexer:
    """One CSA layer's selection inputs at a bench shape: queries in float32 (`q32`, the old
    path's) and in the model's dtype, head weights, the indexer keys on the entry pages (the
    channels after the K=V vector) and gathered beforehand, token rows, positions, counts."""

    q32: torch.Tensor
    q: torch.Tensor
    weights: torch.Tensor
    pages: PagedKeys
    gathered: torch.Tensor
    rows: torch.Tensor
    positions: torch.Tensor
    counts: torch.Tensor
    ratio: int
    topk: int

    def old(self) -> torch.Tensor:
        keys = _gather(self.pages, self.gathered.shape[1])
        scores = indexer_scores(self.q32, keys, self.weights, self.rows, self.positions,
                                self.counts, self.ratio)  # fmt: skip
        return indexer_topk_torch(scores, self.topk)

    def scores_old(self) -> torch.Tensor:
        return indexer_scores(self.q32, self.gathered, self.weights, self.rows, self.positions,
                              self.counts, self.ratio)  # fmt: skip

    def scores_new(self) -> torch.Tensor:
        return paged_indexer_scores(self.q, self.pages, self.weights, self.rows, self.positions,
                                    self.counts, self.ratio, self.gathered.shape[1])  # fmt: skip

    def new(self) -> torch.Tensor:
        visible = visible_entries(self.rows, self.positions, self.counts, self.ratio)
        return indexer_topk(self.scores_new(), self.topk, visible)


def _agreement(old: torch.Tensor, new: torch.Tensor) -> float:
    """The share of `old`'s picks [T, k] (-1: none) that `new` [T, k'] also holds: below 1
    where bf16 accumulation reorders near ties, or an exact tie at the k-th place is broken
    otherwise (torch.topk's choice is unspecified; the new rule takes the lowest entries)."""
    picked = old >= 0
    found = (old[:, :, None] == new[:, None, :]).any(-1) & picked
    return float(found.sum()) / max(1, int(picked.sum()))


def _indexer_rows(
    ix: _Indexer, add: Callable[[str, int, Callable[[], Any], float], None], size: int
) -> None:
    """The selection's rows, old path against new (module docstring)."""
    entries, dim = ix.gathered.shape[1:]
    read = ix.q.shape[0] * entries * dim * size
    add("idx-old", entries, ix.old, read)
    add("idx-new", entries, ix.new, read)
    add("sc-old", entries, ix.scores_old, read)
    add("sc-new", entries, ix.scores_new, read)
    scores = ix.scores_new()
    visible = visible_entries(ix.rows, ix.positions, ix.counts, ix.ratio)
    add("topk-old", entries, partial(indexer_topk_torch, scores, ix.topk), scores.nbytes)
    add("topk-new", entries, partial(indexer_topk, scores, ix.topk, visible), scores.nbytes)


def bench_case(
    model: str, context: int, batch: int, device: torch.device, dtype: torch.dtype,
    page_size: int, reps: int, rounds: int,
) -> list[Row]:  # fmt: skip
    c = preset(model)
    v4 = c.deepseek_v4
    assert v4 is not None and c.sliding_window is not None
    heads, dim, window, size = c.num_heads, c.head_dim, c.sliding_window, dtype.itemsize
    num_sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 0
    )
    splits = default_splits(batch, -(-heads // 16), num_sms) if num_sms else 1
    pages_per_row = -(-context // page_size)
    # the window group's pages (every page of the context, shuffled: dense reads them all)
    order = torch.randperm(batch * pages_per_row, device=device).int()
    win = PagedKeys(
        torch.randn(batch * pages_per_row, page_size, dim, device=device, dtype=dtype),
        torch.arange(batch + 1, device=device, dtype=torch.int32) * pages_per_row,
        order,
        torch.zeros(batch, dtype=torch.int32, device=device),
    )
    q = torch.randn(batch, heads, dim, device=device, dtype=dtype)
    sinks = torch.randn(heads, device=device)
    rows = torch.arange(batch, device=device, dtype=torch.int32)
    positions = torch.full((batch,), context - 1, device=device, dtype=torch.int32)
    lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    out: list[Row] = []

    def add(kind: str, keys: int, fn: Callable[[], Any], bytes_: float) -> None:
        us = time_call(fn, device, reps, rounds)
        out.append(Row(kind, context, batch, keys, splits, us, bytes_))

    attend = partial(sparse_attention, q, sinks, rows, positions, win, splits=splits)
    add("dense", context, partial(attend, window=context), batch * context * dim * size)
    for kind, ratio in (("csa", v4.csa_ratio), ("hca", v4.hca_ratio)):
        entries = context // ratio
        width = dim + (v4.index_head_dim if kind == "csa" else 0)  # as the model's pages
        per_page = max(1, page_size // ratio)
        e_pages = -(-entries // per_page)
        ent = PagedKeys(
            torch.randn(batch * e_pages, per_page, width, device=device, dtype=dtype),
            torch.arange(batch + 1, device=device, dtype=torch.int32) * e_pages,
            torch.randperm(batch * e_pages, device=device).int(),
        )
        selected = None
        read = entries
        if kind == "csa":
            read = min(v4.index_topk, entries)
            selected = torch.rand(batch, entries, device=device).topk(read).indices.int()
        keys = min(window, context) + read
        call = partial(attend, window=window, entries=ent, counts=lens // ratio, ratio=ratio,
                       selected=selected)  # fmt: skip
        add(kind, keys, call, batch * keys * dim * size)
        if kind == "csa":
            ih, idim = v4.index_heads, v4.index_head_dim
            q32 = torch.randn(batch, ih, idim, device=device).to(dtype).float()
            paged = ent._replace(pages=ent.pages[:, :, dim:])
            ix = _Indexer(q32, q32.to(dtype), torch.randn(batch, ih, device=device) * ih**-0.5,
                          paged, _gather(paged, entries), rows, positions, lens // ratio, ratio,
                          v4.index_topk)  # fmt: skip
            _indexer_rows(ix, add, size)
            new = next(i for i, r in enumerate(out) if r.kind == "idx-new")
            out[new] = replace(out[new], agree=_agreement(ix.old(), ix.new()))
    if device.type == "cuda":
        flat = torch.randn(batch, 1, context, dim, device=device, dtype=dtype)
        sdpa = partial(F.scaled_dot_product_attention, q[:, :, None, :], flat, flat,
                       enable_gqa=True)  # fmt: skip
        add("sdpa", context, sdpa, batch * context * dim * size)
    return out


def report(rows: list[Row], copy_tbs: float) -> None:
    dense = {(r.context, r.batch): r.us for r in rows if r.kind == "dense"}
    print(f"{'context':>8}{'batch':>6} {'kind':<8}{'keys':>7}{'splits':>7}{'us':>10}"
          f"{'TB/s':>7}{'frac':>6}{'speedup':>9}")  # fmt: skip
    for r in rows:
        base = dense.get((r.context, r.batch), math.inf)
        speed = base / r.us if r.us > 0 and math.isfinite(r.us) else 0.0
        agree = "" if r.agree is None else f"  picks agree {r.agree:.4f}"
        print(f"{r.context:>8}{r.batch:>6} {r.kind:<8}{r.keys:>7}{r.splits:>7}{r.us:>10.1f}"
              f"{r.tbs:>7.2f}{r.tbs / copy_tbs:>6.2f}{speed:>8.1f}x{agree}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="resin bench sparse-attention",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--preset", default="deepseek-v4-flash", help="a deepseek_v4 preset")
    add_sweep_args(p, contexts="8192,16384,32768,65536", batch_sizes="1,64", page_size=64,
                   reps=10)  # fmt: skip
    args = p.parse_args(argv)
    if preset(args.preset).deepseek_v4 is None:
        p.error(f"--preset {args.preset!r} is not a deepseek_v4 preset")
    rows, device = sweep(p, args, lambda context, batch, device: bench_case(
        args.preset, context, batch, device, DTYPES[args.dtype], args.page_size, args.reps,
        args.rounds))  # fmt: skip
    report(rows, args.copy_tbs)
    if args.output:
        append_rows(args.output, rows, device, preset=args.preset, dtype=args.dtype)
    return 0


def add_sweep_args(
    p: argparse.ArgumentParser, *, contexts: str, batch_sizes: str, page_size: int, reps: int
) -> None:
    """The options every attention bench shares: the (context, batch) sweep, the device and
    dtype, the page size, `time_call`'s reps and rounds, the copy ceiling, the JSONL file."""
    p.add_argument("--contexts", default=contexts)
    p.add_argument("--batch-sizes", default=batch_sizes)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--page-size", type=int, default=page_size)
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--copy-tbs", type=float, default=4.2, help="the device's copy bandwidth")
    p.add_argument("--output", type=Path, help="JSONL file (appended)")


def sweep(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    case: Callable[[int, int, torch.device], list[Any]],
) -> tuple[list[Any], torch.device]:
    """`case(context, batch, device)`'s rows for every context and batch size of `args`
    (`add_sweep_args`), the device's cache emptied between cases; a CUDA device that is not
    there is the parser's error."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device (pass --device cpu with TRITON_INTERPRET=1 for a smoke run)")
    torch.manual_seed(0)
    rows: list[Any] = []
    for context in (int(x) for x in args.contexts.split(",")):
        for batch in (int(x) for x in args.batch_sizes.split(",")):
            rows += case(context, batch, device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows, device


def append_rows(path: Path, rows: Sequence[Any], device: torch.device, **fields: Any) -> None:
    """Each timed row (a dataclass with `us` and `tbs`) as a JSON line appended to `path`, with
    `fields` and the device's name; `us` null where the call failed (out of memory, refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    with path.open("a") as f:
        for r in rows:
            row = {**asdict(r), "tb_s": r.tbs, **fields, "device": name}
            if not math.isfinite(r.us):
                row["us"] = None
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
