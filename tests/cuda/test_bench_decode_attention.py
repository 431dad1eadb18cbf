"""`resin bench decode-attention` (on the CPU through Triton's interpreter): every shape of
every case gets a timed row (JSONL), the first shape is the baseline, and a shape that is not
WARPS/BLOCK_N/STAGES is refused."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from resin_app.bench import decode_attention as bench


def test_every_shape_gets_a_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    out = tmp_path / "a.jsonl"
    argv = ["--device", device, "--preset", "tiny", "--contexts", "40", "--batch-sizes", "1,2",
            "--shapes", "4/16/2,2/32/1", "--dtype", "fp32", "--reps", "1",
            "--rounds", "1", "--output", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [(r["batch"], r["shape"]) for r in rows]
    assert keys == [(b, s) for b in (1, 2) for s in ("4/16/2", "2/32/1")]
    assert all(r["us"] > 0 and r["context"] == 40 for r in rows)
    assert all(r["bytes"] == 2 * r["batch"] * 40 * 2 * 16 * 4 for r in rows)  # tiny: 2 KV x 16
    assert "speedup" in capsys.readouterr().out


def test_a_bad_shape_is_refused() -> None:
    assert bench.parse_shapes("8/64/3") == [bench.Shape(8, 64, 3)]
    with pytest.raises(argparse.ArgumentTypeError, match="WARPS/BLOCK_N/STAGES"):
        bench.parse_shapes("8/64")
