"""`resin serve --tensor-parallel 2` on the CPU: the server's engine process starts its own
worker (Gloo), a
chat request through the openai SDK gets the same greedy answer as the unsharded model, and a
worker killed mid-run makes the server answer 503 and stop, never hang.

The model is a tiny random-weight Llama (2 KV heads, so it splits in two) with SmolLM2's real
tokenizer and chat template, saved as a checkpoint folder and loaded as `resin serve` does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from resin.server.launch import free_port, running
from tests.server.conftest import serve_loaded

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "Name three colours."}]


def tiny_checkpoint(folder: Path) -> Path:
    """A random-weight Llama small enough for 2 CPU cores, with the default model's tokenizer."""
    import torch
    import transformers

    from resin_model.default_model import default_model_dir

    source = default_model_dir()
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        initializer_range=0.2,  # varied greedy tokens, top-2 logit gaps far above 1e-5
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"default model unavailable: {exc}")


def greedy_chat(url: str, replica: int | None = None) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    headers = {} if replica is None else {"resin-routed-dp-rank": str(replica)}
    answer = client.chat.completions.create(
        model="default",
        messages=QUESTION,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=8,
        extra_headers=headers,
    )
    text = answer.choices[0].message.content or ""
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    assert len(set(text.split())) > 1  # not one token repeated: the weights matter
    return text


@pytest.fixture(scope="module")
def unsharded_answer(checkpoint: Path) -> str:
    from resin_app.loading import LoadOptions, load

    loaded = load(LoadOptions(checkpoint=str(checkpoint), context_length=512), progress=False)
    with running(serve_loaded(loaded)) as url:
        answer = greedy_chat(url)
    loaded.close()
    return answer


class Served:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc, self.url = proc, url

    def worker_of(self, replica: int) -> int:
        """The pid of replica `replica`'s one worker (rank 1 of that replica's group): each
        replica is an engine process leading its own group (the default, engine processes)."""
        engines = sorted(self.engines(), key=lambda p: p.create_time())  # spawned in order
        (worker,) = [w for w in engines[replica].children() if _is_worker(w)]
        return worker.pid

    def engines(self) -> list[psutil.Process]:
        return [p for p in psutil.Process(self.proc.pid).children() if not _is_helper(p)
                and any(_is_worker(c) for c in p.children())]  # fmt: skip

    def workers(self) -> list[int]:
        """Pids of the server's `resin worker` processes (its engine processes' children)."""
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        return [p.pid for p in family if _is_worker(p)]


def _is_worker(p: psutil.Process) -> bool:
    try:
        return "resin_app.worker" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _is_helper(p: psutil.Process) -> bool:
    try:
        return "resource_tracker" in " ".join(p.cmdline())
    except psutil.Error:
        return True


@contextlib.contextmanager
def served(checkpoint: Path, *options: str) -> Iterator[Served]:
    """`resin serve --checkpoint CHECKPOINT *options` as a subprocess, once it is ready."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "resin_app.cli", "serve", "--checkpoint", str(checkpoint)]
    cmd += [*options, "--context-length", "512", "--port", str(port)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the loading bar, then the banner
            if f"http://127.0.0.1:{port}" in line:
                break
        else:
            pytest.fail(f"resin serve exited early: {proc.wait()}")
        yield Served(proc, f"http://127.0.0.1:{port}")
    finally:  # SIGTERM (a no-op once it exited), then SIGKILL if it does not leave
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        proc.kill()


@pytest.fixture
def serve_cli(checkpoint: Path) -> Iterator[Served]:
    with served(checkpoint, "--tensor-parallel", "2") as server:
        yield server


def test_tensor_parallel_serve_equals_the_unsharded_answer(
    serve_cli: Served, unsharded_answer: str
) -> None:
    (worker,) = serve_cli.workers()  # the engine process started its own worker
    family = [
        psutil.Process(serve_cli.proc.pid),
        *psutil.Process(serve_cli.proc.pid).children(True),
    ]
    assert greedy_chat(serve_cli.url) == unsharded_answer
    serve_cli.proc.send_signal(signal.SIGTERM)
    assert serve_cli.proc.wait(30) in (0, -signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=15)  # the worker left with its leader
    assert not alive and worker in [p.pid for p in family], alive


def test_a_killed_worker_makes_the_server_answer_503_and_stop(serve_cli: Served) -> None:
    greedy_chat(serve_cli.url)
    (worker,) = serve_cli.workers()
    os.kill(worker, signal.SIGKILL)
    start = time.monotonic()
    body = {"model": "default", "messages": QUESTION, "max_tokens": 8}
    try:
        status = httpx.post(
            serve_cli.url + "/v1/chat/completions", json=body, timeout=60
        ).status_code
    except httpx.TransportError:
        status = None  # the listener already stopped
    assert status in (503, None)
    assert serve_cli.proc.wait(60) is not None  # the server stops listening and exits
    assert time.monotonic() - start < 60


def test_two_tensor_parallel_replicas_behind_one_front(
    checkpoint: Path, unsharded_answer: str
) -> None:
    """`--tensor-parallel 2 --data-parallel 2`: two engine processes, each leading its TP=2
    group (two workers). Each replica gives the unsharded answer; when replica 1's worker
    dies, replica 1's requests get 503 and /health says degraded, while replica 0 keeps
    answering."""
    with served(checkpoint, "--tensor-parallel", "2", "--data-parallel", "2") as server:
        assert len(server.workers()) == 2
        assert [greedy_chat(server.url, replica=i) for i in (0, 1)] == [unsharded_answer] * 2
        os.kill(server.worker_of(1), signal.SIGKILL)  # replica 1's worker
        with pytest.raises(openai.InternalServerError):
            greedy_chat(server.url, replica=1)
        # Replica 1's engine process ends once its runner failed; the frontend sees its
        # socket close a moment later.
        deadline = time.monotonic() + 15
        while (health := httpx.get(server.url + "/health")).status_code == 200:
            assert time.monotonic() < deadline, health.text
            time.sleep(0.1)
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert [r["alive"] for r in health.json()["replicas"]] == [True, False]
        assert greedy_chat(server.url) == unsharded_answer  # routed to replica 0
        assert greedy_chat(server.url, replica=1) == unsharded_answer  # named, but it is dead
