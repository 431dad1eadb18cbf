"""A bad checkpoint stops `resin serve` (one process or split) and `resin quantize` with one
error line and exit code 2 before anything is allocated; the split leaves no socket folder and
no leaked semaphore; `resin quantize` writes only files it creates inside DST."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resin_app.bench.checkpoint import INDEX, write_checkpoint
from resin_app.quantize import main as quantize_main
from resin_model.presets import TINY


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    write_checkpoint(TINY["llama"], folder, shard_bytes=1 << 20)
    return folder


def resin(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    return subprocess.run(
        [sys.executable, "-m", "resin_app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


@pytest.mark.parametrize("split", [False, True])
def test_serve_refuses_a_checkpoint_reading_outside_its_folder(
    tiny: Path, tmp_path: Path, split: bool
) -> None:
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny, folder)
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"]["lm_head.weight"] = (
        f"../{tiny.name}/{index['weight_map']['lm_head.weight']}"
    )
    (folder / INDEX).write_text(json.dumps(index))
    before = set(glob.glob("/tmp/resin-ipc-*"))
    extra = [] if split else ["--api-server-count", "0"]  # engine processes: the default
    done = resin("serve", "--checkpoint", str(folder), "--port", "0", *extra)
    assert done.returncode == 2, done.stderr
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and "outside the folder" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "leaked semaphore" not in done.stderr
    assert set(glob.glob("/tmp/resin-ipc-*")) <= before


def test_serve_missing_config_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").symlink_to("/etc/hostname")
    done = resin("serve", "--checkpoint", str(tmp_path), "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(error_lines(done.stderr)) == 1, done.stderr


def test_quantize_never_writes_through_a_symlink_in_dst(tiny: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "config.json").symlink_to(victim)
    (dst / "tokenizer.json").symlink_to(victim)
    assert quantize_main([str(tiny), str(dst), "--format", "fp8-block"]) == 0
    assert victim.read_text() == "keep me"
    for path in dst.iterdir():
        assert path.is_file() and not path.is_symlink(), path
    assert json.loads((dst / "config.json").read_text())["quantization_config"]


def test_quantize_refuses_dst_inside_src(tiny: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(tiny, src)
    assert quantize_main([str(src), str(src / "q"), "--format", "fp8-block"]) == 2
    assert quantize_main([str(src), str(src), "--format", "fp8-block"]) == 2
    assert not (src / "q").exists()


def test_quantize_refuses_a_source_shard_outside_src(tiny: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(tiny, src)
    shard = sorted(src.glob("*.safetensors"))[0]
    shard.unlink()
    shard.symlink_to(tiny / shard.name)
    assert quantize_main([str(src), str(tmp_path / "dst"), "--format", "fp8-block"]) == 2


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({**TINY["llama"], "hidden_size": 64.5}, "hidden_size=64.5 is not an integer"),
        ([1], "a config must be a JSON object"),
    ],
)
def test_bench_checkpoint_refuses_a_bad_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: object, words: str
) -> None:
    from resin_app.bench.checkpoint import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["--config", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("resin bench checkpoint: error:") and words in err[-1]


@pytest.mark.parametrize("body", [b"GGUF", b"GGUF\x03\x00\x00\x00" + b"\xff" * 64])
def test_a_malformed_gguf_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: bytes
) -> None:
    from resin_model.checkpoint_folder import CheckpointError
    from resin_model.default_model import resolve_checkpoint

    monkeypatch.setenv("RESIN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "model.gguf").write_bytes(body)
    with pytest.raises(CheckpointError) as info:
        resolve_checkpoint(tmp_path, on_convert=None)
    assert "\n" not in str(info.value) and "model.gguf" in str(info.value)


def test_serve_refuses_an_unreadable_tokenizer_in_one_line(tiny: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny, folder)
    (folder / "tokenizer.json").write_text('{"model": 1}')
    done = resin("serve", "--checkpoint", str(folder), "--port", "0")
    assert done.returncode == 2, done.stderr
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and "tokenizer" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
