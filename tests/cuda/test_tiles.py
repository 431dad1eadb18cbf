"""Tuned launch shapes as data (`kernels/tiles.py`): the H200 file's entries are found by
(kernel, format, N, K, rows), a shape the file lacks gets the heuristic, a sweep's results
take precedence, and a malformed file is refused with the entry named."""

from __future__ import annotations

import json

import pytest


def test_tuned_file_entries_and_heuristic_fallback() -> None:
    from resin_models_cuda.kernels import tiles
    from resin_models_cuda.kernels.tiles import GemvTiles, gemv_tiles, heuristic

    data = json.loads((tiles.TUNED_DIR / "h200.json").read_text())
    table = tiles.parse_table(data)
    assert table, "the H200 file has entries"
    key, want = next(iter(table.items()))
    assert gemv_tiles(*key, gpu="NVIDIA H200") == want
    # Another GPU, or a shape the file lacks: the heuristic.
    assert gemv_tiles(*key, gpu="NVIDIA B200") == heuristic(*key)
    assert gemv_tiles("gate_up", "mxfp4", 7, 64, 3, gpu="NVIDIA H200") == tiles.GATE_UP_DEFAULT
    # The dense GEMV narrows its row tile until the grid has two programs per multiprocessor.
    assert heuristic("fp8_gemv", "fp8-channel", 28672, 4096, 1) == tiles.FP8_GEMV_DEFAULT
    narrow = heuristic("fp8_gemv", "fp8-block", 1024, 4096, 1)
    assert narrow.block_n == 4 and narrow.block_k == tiles.FP8_GEMV_DEFAULT.block_k
    assert tiles.gpu_key("NVIDIA H200") == "h200" and tiles.gpu_key("NVIDIA H100 80GB HBM3") == (
        "h100-80gb-hbm3"
    )
    # A sweep's result wins over the file.
    swept = GemvTiles(4, 256, 2, 3)
    tiles.add_tiles({tiles.TileKey(*key): swept})
    try:
        assert gemv_tiles(*key, gpu="NVIDIA H200") == swept
    finally:
        tiles._added.clear()


def test_malformed_tile_files_are_refused() -> None:
    from resin_models_cuda.kernels.tiles import parse_table

    good = {"kernel": "down", "format": "fp8-block", "n": 64, "k": 128, "rows": 1,
            "block_n": 16, "block_k": 128, "num_warps": 4, "num_stages": 1}  # fmt: skip
    assert len(parse_table({"tiles": [good]})) == 1
    # The dense FP8 GEMV's optional fields default (files written before them still load).
    (tiles,) = parse_table({"tiles": [good]}).values()
    assert (tiles.split_k, tiles.tensor_core) == (1, 0)
    tc = {**good, "kernel": "fp8_gemv", "split_k": 2, "tensor_core": 1}
    (tiles,) = parse_table({"tiles": [tc]}).values()
    assert (tiles.split_k, tiles.tensor_core) == (2, 1)
    with pytest.raises(ValueError, match="entry 1"):
        parse_table({"tiles": [good, {**good, "block_k": None}]})
    with pytest.raises(ValueError, match="unknown kernel or format"):
        parse_table({"tiles": [{**good, "format": "int4"}]})
    with pytest.raises(ValueError, match="entry 0"):
        parse_table({"tiles": [{k: v for k, v in good.items() if k != "rows"}]})
