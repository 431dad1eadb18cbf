"""What a new user trips on first, each against a real server: the README's library
`HttpServer` samples with the checkpoint's defaults and cap and logs like `resin serve`; the
request log line carries token counts and the true status of an aborted stream; the
Responses API echoes the sampling it used; a malformed body gets a clear message.

The library server runs the real `Engine` with the zero-cost runner (`resin serve
--fake-runner`'s: it answers "a" forever, so only a cap ends a request) and the default
model's real tokenizer, from a folder that carries a `generation_config.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.test_hostile_clients import Served, serve

ROOT = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"
GENERATION = {"temperature": 0.3, "top_p": 0.8, "max_new_tokens": 7}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's tokenizer files and a generation config that caps at 7 tokens."""
    from resin_model.default_model import default_model_dir

    source = default_model_dir()
    out = tmp_path_factory.mktemp("checkpoint")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)
    (out / "generation_config.json").write_text(json.dumps(GENERATION))
    return out


LIBRARY = """
import sys
from resin import Engine
from resin.recipe import load_recipe
from resin.server import HttpServer
from resin.tokenizer import Tokenizer
from resin_app.loading import ZeroCostRunner

tokenizer = Tokenizer.from_dir(sys.argv[1])
runner = ZeroCostRunner(tokenizer.vocab_size, tokenizer.encode("a")[0])
engine = Engine(runner, context_length=4096)
recipe = load_recipe(tokenizer)
HttpServer(engine, recipe, tokenizer=tokenizer, model="m", port=int(sys.argv[2])).serve()
"""


@pytest.fixture(scope="module")
def library(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The README's `HttpServer(...).serve()` as a program of its own."""
    from resin.server.launch import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("library") / "serve.log"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    cmd = [sys.executable, "-c", LIBRARY, str(folder), str(port)]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "serving" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield Served(f"http://127.0.0.1:{port}", log, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_library_server_applies_the_checkpoints_defaults_and_logs(library: Served) -> None:
    card = httpx.get(library.url + "/v1/models", timeout=10).json()["data"][0]
    assert card["generation_defaults"] == {"temperature": 0.3, "top_p": 0.8, "max_tokens": 7}
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
    answer = httpx.post(library.url + CHAT, json=body, timeout=30)  # no max_tokens: capped
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert usage["completion_tokens"] == 7
    assert answer.json()["choices"][0]["finish_reason"] == "length"
    line = _log_line(library, CHAT)
    assert f"prompt_tokens={usage['prompt_tokens']} completion_tokens=7" in line, line
    # The Responses API echoes the sampling that applied, not nulls.
    echo = httpx.post(library.url + "/v1/responses", json={"input": "Hi"}, timeout=30).json()
    assert (echo["temperature"], echo["top_p"], echo["max_output_tokens"]) == (0.3, 0.8, 7)
    explicit = {"input": "Hi", "temperature": 0.9, "max_output_tokens": 3}
    echo = httpx.post(library.url + "/v1/responses", json=explicit, timeout=30).json()
    assert (echo["temperature"], echo["top_p"], echo["max_output_tokens"]) == (0.9, 0.8, 3)


def _log_line(served: Served, path: str, status: str = "", timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [ln for ln in served.log.read_text().splitlines() if f"POST {path} {status}" in ln]
        if lines:
            return lines[-1]
        time.sleep(0.05)
    raise AssertionError(served.log.read_text())


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tmp_path_factory.mktemp("fake") / "serve.log", "--fake-runner") as served:
        yield served


def test_an_aborted_stream_is_logged_as_499_with_its_tokens(fake: Served) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 3000}
    with httpx.stream("POST", fake.url + CHAT, json=body, timeout=30) as r:
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 5:
                break  # the client leaves mid-answer
    line = _log_line(fake, CHAT, "499")
    completion = int(line.rsplit("completion_tokens=", 1)[1])
    assert 0 < completion < 3000 and "prompt_tokens=" in line


def _raw(url: str, head: str, body: bytes) -> tuple[int, dict[str, object]]:
    host, port = url.removeprefix("http://").split(":")
    request = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Length: {len(body)}\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request.encode() + b"Connection: close\r\n\r\n" + body)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    status = int(out.split(b" ", 2)[1])
    return status, json.loads(out.split(b"\r\n\r\n", 1)[1])


def test_bad_bodies_get_clear_messages(fake: Served) -> None:
    good = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    status, error = _raw(fake.url, "Content-Type: application/json\r\n", b'{"messages": [}')
    assert status == 400
    assert error["error"] == {  # type: ignore[comparison-overlap]
        "message": "the request body is not valid JSON (Expecting value at character 14)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    for head, got in (("", "no Content-Type header"), ("Content-Type: text/plain\r\n", "'text")):
        status, error = _raw(fake.url, head, good)
        message = error["error"]["message"]  # type: ignore[index]
        assert status == 400 and "Content-Type: application/json" in message, message
        assert got in message
    status, error = _raw(fake.url, "Content-Type: application/json\r\n", b"[1, 2]")
    assert error["error"]["message"] == "the request body must be a JSON object"  # type: ignore[index]


def test_the_context_served_is_one_the_kv_cache_holds(folder: Path) -> None:
    """A library server over an engine whose arena is smaller than its context reports and
    enforces what the arena holds, and its refusal names the knob."""
    pytest.importorskip("torch")
    from resin import Engine
    from resin.recipe import load_recipe
    from resin.server import HttpServer
    from resin.server.launch import free_port, running
    from resin.tokenizer import Tokenizer
    from resin_model.presets import TINY
    from resin_models_torch.registry import random_runner

    tokenizer = Tokenizer.from_dir(folder)
    config = {**TINY["llama"], "vocab_size": tokenizer.vocab_size}
    runner = random_runner(config, page_size=4, num_pages=64)  # 64 pages of 4: 255 tokens
    engine = Engine(runner, context_length=4096)
    server = HttpServer(
        engine, load_recipe(tokenizer), tokenizer=tokenizer, model="m", port=free_port()
    )
    with running(server) as url:
        card = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
        assert card["max_model_len"] == 255
        long = {"messages": [{"role": "user", "content": "word " * 400}], "max_tokens": 1}
        refused = httpx.post(url + CHAT, json=long, timeout=30)
        assert refused.status_code == 400
        assert "--kv-cache-memory" in refused.json()["error"]["message"]


def test_fake_runner_serves_the_checkpoints_tokenizer_and_template(tmp_path: Path) -> None:
    """`--fake-runner --checkpoint DIR`: a load test with DIR's tokenizer and chat template
    (its weights never load), in the default process layout; the prompt token count is the
    one DIR's template gives, not the default model's."""
    from resin.tokenizer import Tokenizer
    from resin_app.bench.checkpoint import write_checkpoint
    from resin_model.presets import TINY

    folder = tmp_path / "tiny"
    write_checkpoint(TINY["llama"], folder, shard_bytes=1 << 20)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    expected = len(Tokenizer.from_dir(folder).encode("<<hello there>>"))
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}
    with serve(tmp_path / "serve.log", "--fake-runner", "--checkpoint", str(folder)) as served:
        answer = httpx.post(served.url + CHAT, json=body, timeout=60).json()
    usage = answer["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (expected, 2)
    assert answer["choices"][0]["message"]["content"] == "aa"
