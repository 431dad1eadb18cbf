"""DeepSeek-V4's sparse attention kernel (`kernels/sparse_attention.py`) against a plain torch
softmax with a sink over the same keys, float32 in the Triton interpreter on CPU: the sliding
window read through shuffled window pages (some rows past their first pages), plus the HCA
case (every visible entry) and the CSA case (selected entries, -1 gaps), in one split and in
several (the flash-decoding merge), with entry pages wider than the K=V vector (the indexer
key after it, never read)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from resin_models_cuda.kernels.indexer import indexer_topk_torch
from resin_models_cuda.kernels.sparse_attention import PagedKeys, sparse_attention

torch.set_num_threads(1)

PAGE, WINDOW, RATIO, PER_PAGE, DIM, HEADS = 4, 6, 4, 2, 32, 20


def _case(device: str) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    lengths = [23, 9, 3]  # tokens each row holds after the step
    queries = [[16, 19, 20, 22], [8], [0, 1, 2]]  # positions of each row's query tokens
    n_pages = sum(-(-n // PAGE) for n in lengths) + 3
    window_pages = torch.randn(n_pages, PAGE, DIM + 5, generator=gen)  # wider than D
    order = torch.randperm(n_pages, generator=gen).tolist()
    ids, indptr, start, logical = [], [0], [], []
    for b, n in enumerate(lengths):
        first = max(0, queries[b][0] - WINDOW + 1) // PAGE  # pages before it were dropped
        pages = [order.pop() for _ in range(first, -(-n // PAGE))]
        ids += pages
        indptr.append(len(ids))
        start.append(first)
        logical.append(dict(zip(range(first, -(-n // PAGE)), pages, strict=True)))
    counts = [n // RATIO for n in lengths]
    e_pages = sum(-(-c // PER_PAGE) for c in counts) + 2
    entry_pages = torch.randn(e_pages, PER_PAGE, DIM + 7, generator=gen)
    e_order = torch.randperm(e_pages, generator=gen).tolist()
    e_ids, e_indptr = [], [0]
    for c in counts:
        e_ids += [e_order.pop() for _ in range(-(-c // PER_PAGE))]
        e_indptr.append(len(e_ids))
    rows = [b for b, ps in enumerate(queries) for _ in ps]
    positions = [p for ps in queries for p in ps]
    t = len(rows)
    q = torch.randn(t, HEADS, DIM, generator=gen)
    sinks = torch.randn(HEADS, generator=gen)
    # CSA picks: up to 3 visible entries a token, -1 where it sees fewer
    selected = torch.full((t, 3), -1, dtype=torch.int32)
    for i, (b, p) in enumerate(zip(rows, positions, strict=True)):
        visible = min(counts[b], (p + 1) // RATIO)
        pick = torch.randperm(visible, generator=gen)[:3]
        selected[i, : len(pick)] = pick.int()
    return dict(lengths=lengths, logical=logical, window_pages=window_pages, ids=ids,
                indptr=indptr, start=start, counts=counts, entry_pages=entry_pages, e_ids=e_ids,
                e_indptr=e_indptr, rows=rows, positions=positions, q=q, sinks=sinks,
                selected=selected)  # fmt: skip


def _reference(c: dict, selected: bool | None) -> torch.Tensor:
    outs = []
    for i, (b, p) in enumerate(zip(c["rows"], c["positions"], strict=True)):
        keys = []
        for pos in range(max(0, p - WINDOW + 1), p + 1):
            keys.append(c["window_pages"][c["logical"][b][pos // PAGE], pos % PAGE, :DIM])
        if selected is not None:
            ws = range(min(c["counts"][b], (p + 1) // RATIO))
            if selected:
                ws = [int(w) for w in c["selected"][i] if w >= 0]
            base = c["e_indptr"][b]
            for w in ws:
                page = c["e_ids"][base + w // PER_PAGE]
                keys.append(c["entry_pages"][page, w % PER_PAGE, :DIM])
        k = torch.stack(keys)
        logits = c["q"][i] @ k.T * DIM**-0.5  # [H, N]
        combined = torch.cat((logits, c["sinks"][:, None]), dim=1).softmax(dim=1)
        outs.append(combined[:, :-1] @ k)
    return torch.stack(outs)


def test_sparse_attention_equals_a_plain_softmax_with_sinks(device: str) -> None:
    c = _case(device)

    def dev(x: object) -> torch.Tensor:
        return torch.as_tensor(x, device=device)

    window = PagedKeys(dev(c["window_pages"]), dev(c["indptr"]).int(), dev(c["ids"]).int(),
                       dev(c["start"]).int())  # fmt: skip
    entries = PagedKeys(dev(c["entry_pages"]), dev(c["e_indptr"]).int(), dev(c["e_ids"]).int())
    common = dict(sinks=dev(c["sinks"]), token_row=dev(c["rows"]).int(),
                  positions=dev(c["positions"]).int(), window_keys=window,
                  window=WINDOW)  # fmt: skip
    for splits in (1, 3):
        for mode in (None, False, True):  # window only, HCA (all visible), CSA (selected)
            extra: dict[str, object] = {}
            if mode is not None:
                extra = dict(entries=entries, counts=dev(c["counts"]).int(), ratio=RATIO)
            if mode:
                extra["selected"] = dev(c["selected"])
            got = sparse_attention(dev(c["q"]), **common, **extra, splits=splits, block_n=16)  # type: ignore[arg-type]
            torch.testing.assert_close(got.cpu(), _reference(c, mode), rtol=1e-5, atol=1e-5)


def test_indexer_topk_torch_marks_invisible_picks() -> None:
    inf = float("-inf")
    scores = torch.tensor([[0.5, inf, 2.0, 1.0], [inf, inf, inf, inf], [3.0, 1.0, inf, inf]])
    got = indexer_topk_torch(scores, 3)
    assert got.dtype == torch.int32
    assert got.tolist() == [[2, 3, 0], [-1, -1, -1], [0, 1, -1]]
    assert indexer_topk_torch(scores, 8).shape == (3, 4)


def test_bench_sparse_attention_runs_tiny_shapes(tmp_path: Path) -> None:
    """`resin bench sparse-attention` on the tiny preset's shapes (on CPU through the
    interpreter): a dense, CSA, HCA row and the indexer's, old path and new, per (context,
    batch), keys as the kinds read them, JSONL written."""
    from resin_app.cli import main

    out = tmp_path / "sparse.jsonl"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    argv = ["bench", "sparse-attention", "--preset", "tiny-deepseek_v4", "--contexts", "64",
            "--batch-sizes", "1,2", "--page-size", "16", "--device", device, "--dtype", "fp32",
            "--reps", "2", "--rounds", "1", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cpu = [r for r in rows if r["kind"] != "sdpa"]
    indexer = ("idx-old", "idx-new", "sc-old", "sc-new", "topk-old", "topk-new")
    assert [(r["batch"], r["kind"]) for r in cpu] == [
        (b, k) for b in (1, 2) for k in ("dense", "csa", *indexer, "hca")
    ]
    keys = {r["kind"]: r["keys"] for r in cpu}
    # window 16; CSA: top-4 of 64 / 4 entries; HCA: 64 / 16 entries; dense: the context
    assert keys == {"dense": 64, "csa": 16 + 4, "hca": 16 + 4} | dict.fromkeys(indexer, 16)
    assert all(r["us"] > 0 and math.isfinite(r["us"]) for r in cpu)
    # float32: the paged kernel and the radix top-k pick what the gathered path picks
    assert [r["agree"] for r in cpu if r["kind"] == "idx-new"] == [1.0, 1.0]
