"""What a new user meets first on `resin serve`: every flag explains itself and shows its
default, and a checkpoint that does not exist is one line and exit 2 (no traceback)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resin_app.cli import _build_parser

ROOT = Path(__file__).resolve().parents[2]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = _build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub.choices[name] for name in ("serve", "chat")}


def test_every_serve_and_chat_flag_has_help_showing_its_default() -> None:
    for name, parser in _subcommands().items():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = f"resin {name} {action.option_strings[0]}"
            assert action.help, f"{flag} has no help"
            text = formatter._expand_help(action)
            if action.default is True:
                assert "default: on" in text, f"{flag}: {text}"
            elif action.default not in (None, False):
                assert str(action.default) in text, f"{flag} hides its default: {text}"
    serve = _subcommands()["serve"].format_help()
    assert "default-model resolver" not in serve  # names the models instead
    assert "SmolLM2-135M-Instruct" in serve


def test_a_missing_checkpoint_is_one_line_and_exit_2() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for servers in ([], ["--api-server-count", "0"]):  # the default (engine processes), one
        cmd = [sys.executable, "-m", "resin_app", "serve", "--checkpoint", "/nonexistent",
               "--port", "0", *servers]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "/nonexistent" in lines[0] and "no such file or folder" in lines[0]


def test_the_cpu_kv_arena_holds_the_context_it_serves() -> None:
    """The reference runner's arena grows past its 256 MiB default to one full context, so
    the context a server reports (`/v1/models` `max_model_len`) is one the cache holds."""
    pytest.importorskip("torch")
    from resin_app.runners import build_runner
    from resin_model.family import BuildRequest
    from resin_model.hf_config import parse_config
    from resin_model.presets import TINY

    # 4 layers x 8 KV heads x 128 wide in float32: 32 KiB a token, 8,192 tokens in 256 MiB.
    wide = {**TINY["llama"], "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 8, "head_dim": 128}  # fmt: skip
    context = 12_000
    runner = build_runner(parse_config(wide), "torch", BuildRequest(context_length=context))
    rc = runner.runner_config  # only its sizing: no arena is allocated here
    pages = rc.cache_bytes // rc.page_bytes
    assert pages * rc.page_size >= context + 1
    # An explicit size is taken as given (and checked at startup, below).
    small = build_runner(
        parse_config(wide), "torch", BuildRequest(context_length=context, kv_cache_bytes=1 << 20)
    )
    assert small.runner_config.cache_bytes == 1 << 20


def test_a_kv_cache_too_small_for_the_context_is_refused_naming_the_knob(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.server.test_parallel_serve import tiny_checkpoint

    folder = tiny_checkpoint(tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "resin_app", "serve", "--checkpoint", str(folder),
           "--port", "0", "--kv-cache-memory", "256KiB"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr, done.stderr
    assert "--kv-cache-memory" in last and "--max-model-len 2048" in last, last
    bad = subprocess.run([*cmd[:-1], "lots"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "is not a size" in bad.stderr
