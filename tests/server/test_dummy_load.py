"""`resin serve --load-format dummy` (vLLM's name): random weights of a folder's config, its
tokenizer and template real, so a serving benchmark needs no weights on the disk;
`resin bench checkpoint --no-weights` writes such a folder. A real HTTP client against the
loaded server; the same folder without the flag is refused as before."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from resin.server.launch import running
from resin_app.bench.checkpoint import main as checkpoint_main
from resin_app.cli import _build_parser, _options
from resin_app.loading import LoadOptions, load
from resin_model.checkpoint_error import CheckpointError
from resin_model.default_model import default_model_dir
from tests.server.conftest import serve_loaded


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dummy") / "tiny"
    argv = ["--preset", "tiny", "--output", str(out), "--no-weights",
            "--tokenizer", str(default_model_dir())]  # fmt: skip
    assert checkpoint_main(argv) == 0
    return out


def test_no_weights_writes_the_config_and_tokenizer_only(folder: Path) -> None:
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "tokenizer.json"} <= names
    assert not [n for n in names if n.endswith(".safetensors") or n.endswith(".index.json")]


def test_dummy_load_serves_the_folders_tokenizer_over_http(folder: Path) -> None:
    args = _build_parser().parse_args(
        ["serve", "--checkpoint", str(folder), "--load-format", "dummy"]
    )
    options = _options(args)
    assert options.load_format == "dummy"
    loaded = load(options, progress=False)
    body = {"model": loaded.name, "prompt": "The capital of France is", "max_tokens": 6,
            "temperature": 0}  # fmt: skip
    with running(serve_loaded(loaded)) as url:
        first = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        again = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    for engine in loaded.engines:
        engine.close()
    usage = first["usage"]
    # the prompt counted by the folder's (SmolLM2's) tokenizer; random weights, greedy
    assert usage["prompt_tokens"] == len(loaded.tokenizer.encode("The capital of France is"))
    assert usage["completion_tokens"] == 6
    assert first["choices"][0]["text"] == again["choices"][0]["text"]


def test_without_the_flag_the_missing_weights_are_refused(folder: Path) -> None:
    with pytest.raises(CheckpointError, match="safetensors"):
        load(LoadOptions(checkpoint=str(folder)), progress=False)


def test_dummy_refuses_tensor_parallel(folder: Path) -> None:
    options = LoadOptions(checkpoint=str(folder), load_format="dummy", tensor_parallel=2)
    with pytest.raises(ValueError, match="--load-format dummy runs one rank"):
        load(options, progress=False)


def test_resin_serve_split_takes_the_flag_to_its_frontends_too(folder: Path) -> None:
    """The default `resin serve` (an engine process behind frontend processes): the frontends
    check the folder as the engine does, config and tokenizer only."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from resin.server.launch import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    src = Path(__file__).resolve().parents[2] / "src"
    cmd = [sys.executable, "-m", "resin_app", "serve", "--checkpoint", str(folder),
           "--load-format", "dummy", "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(src)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.poll()
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        body = {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}
        answer = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_zero_cost_runner_takes_a_folder_without_weights_with_the_flag(folder: Path) -> None:
    """`--fake-runner` reads only the folder's tokenizer and template: with `--load-format
    dummy` a folder of config and tokenizer serves it too."""
    loaded = load(LoadOptions(checkpoint=str(folder), fake=True, load_format="dummy"),
                  progress=False)  # fmt: skip
    assert loaded.name == "fake"
    for engine in loaded.engines:
        engine.close()
    with pytest.raises(CheckpointError, match="safetensors"):
        load(LoadOptions(checkpoint=str(folder), fake=True), progress=False)
