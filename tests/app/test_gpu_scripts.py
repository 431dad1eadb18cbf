"""The GPU machine's serving script, run here in its CPU smoke mode, so a device call (scarce:
a start can be refused for the rest of a session) never fails on the script's own plumbing:
`scripts/gpu_replay_bench.sh` with `SMOKE=1` (tiny preset, reference runner, a few requests)
and `TOKENIZER=` (the tokenizer folder carried in place of the default model's GGUF), which
the checkpoint and the zero-cost runner (`--fake-runner --checkpoint`) both take, and
`ROUNDS=2` (each concurrency's workload twice, every round replayed, a median a concurrency)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resin.server.launch import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("curl") is None, reason="the script polls /health with curl")
def test_replay_script_runs_from_a_tokenizer_folder(tmp_path: Path) -> None:
    from resin_model.default_model import default_model_dir

    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(default_model_dir() / name, tokenizer / name)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "SMOKE": "1", "ROUNDS": "2",
           "OUT": str(tmp_path / "out"), "CKPT": str(tmp_path / "ckpt"),
           "TOKENIZER": str(tokenizer), "PY": sys.executable,
           "PORT": str(free_port())}  # fmt: skip
    done = subprocess.run(["bash", str(ROOT / "scripts/gpu_replay_bench.sh")], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ratios = re.findall(r"HTTP [\d,]+ / Engine [\d,]+ output tok/s = [\d.]+%", done.stdout)
    assert len(ratios) == 6, done.stdout  # 3 concurrencies x 2 rounds, each replayed
    medians = re.findall(r"c= +(\d+): median of 2 = [\d.]+% \(each [\d.]+%, [\d.]+%;", done.stdout)
    assert medians == ["1", "4", "8"], done.stdout
    assert (tmp_path / "out" / "http_c256_r2.jsonl").is_file()
    fake = re.search(r"zero-cost runner, default flags, 64 streams .*failed (\d+)", done.stdout)
    assert fake is not None and fake.group(1) == "0", done.stdout
    assert "serving fake" in (tmp_path / "out" / "serve_fake.log").read_text()
    assert (tmp_path / "ckpt" / "tokenizer.json").read_bytes() == (
        tokenizer / "tokenizer.json"
    ).read_bytes()
