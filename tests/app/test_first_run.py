"""What a new user meets first on `resin serve`: every flag explains itself and shows its
default, and a checkpoint that does not exist is one line and exit 2 (no traceback)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

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
    for split in ("0", "1"):
        cmd = [sys.executable, "-m", "resin_app", "serve", "--checkpoint", "/nonexistent",
               "--port", "0", "--api-server-count", split]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "/nonexistent" in lines[0] and "no such file or folder" in lines[0]
