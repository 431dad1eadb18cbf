"""Every Python block of the README runs as pasted, each defining what it uses: the engine
with its one-method runner, the runners, the server (a subprocess, asked over HTTP), and the
OpenAI client against `resin serve` (the server `make serve` starts, the model's generation
defaults included). Only the server's port is changed, to a free one."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
KINDS = ("engine", "runners", "server", "client")


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _block(kind: str) -> str:
    marks = {
        "engine": "class Runner",
        "runners": "runner = load_runner(folder)",
        "server": "HttpServer(",
        "client": "from openai import OpenAI",
    }
    (block,) = [b for b in _python_blocks() if marks[kind] in b]
    return block


def test_every_python_block_is_one_of_the_tested_kinds() -> None:
    assert sorted(_block(k) for k in KINDS) == sorted(_python_blocks())


def test_readme_engine_example_runs_as_pasted() -> None:
    namespace: dict[str, object] = {}
    exec(compile(_block("engine"), "README:engine", "exec"), namespace)
    # The README runner always answers token 0; eos=2 never comes, so 8 tokens of 0.
    assert namespace["generated_ids"] == [0] * 8


@pytest.mark.slow
def test_readme_runners_block_loads_the_default_model() -> None:
    namespace: dict[str, object] = {}
    exec(compile(_block("runners"), "README:runners", "exec"), namespace)
    tokenizer = namespace["tokenizer"]
    assert namespace["runner"].runner_config.vocab_size >= tokenizer.vocab_size  # type: ignore[attr-defined]


@contextlib.contextmanager
def _process(args: list[str], log: Path, port: int) -> Iterator[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with log.open("w") as sink:
        proc = subprocess.Popen(args, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_readme_server_block_serves(tmp_path: Path) -> None:
    from resin.server.launch import free_port

    port = free_port()
    code = _block("server").replace("port=8000", f"port={port}")
    with _process([sys.executable, "-c", code], tmp_path / "server.log", port) as url:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.slow
def test_readme_client_block_against_resin_serve(tmp_path: Path) -> None:
    """The bare request (no max_tokens, no temperature) finishes: the default model's
    generation config bounds it."""
    from resin.server.launch import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "resin_app", "serve", "--port", str(port)]
    with _process(cmd, tmp_path / "serve.log", port) as url:
        code = _block("client").replace("http://127.0.0.1:8000", url)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README:client", "exec"), {})
        assert out.getvalue().strip()
        log = (tmp_path / "serve.log").read_text()
    assert "POST /v1/chat/completions 200" in log  # the request's log line
