"""A request field the model runner cannot honour is a 400 naming it, never a 500 or a silent
ignore: the reference runner (tiny random Llama, CPU) declaring fewer optional features
(`RunnerConfig.features`) behind the real server and a real HTTP client. The refused request
queues nothing; the engine goes on serving."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from resin import Engine
from resin.protocols import OPTIONAL_FEATURES, RunnerConfig
from resin.server import HttpServer
from resin.server.launch import free_port, running
from tests.server.doubles import ByteTokenizer, ChatMLFormat
from tests.server.test_overlap_server import LLAMA

torch = pytest.importorskip("torch")


def _server(lacking: frozenset[str]) -> tuple[HttpServer, Engine]:
    from resin_models_torch.registry import random_runner
    from resin_models_torch.runner import TorchRunner

    class LackingRunner(TorchRunner):
        @property
        def runner_config(self) -> RunnerConfig:
            return replace(super().runner_config, features=OPTIONAL_FEATURES - lacking)

    model = random_runner(LLAMA, seed=5).model
    engine = Engine(LackingRunner(model, page_size=4, num_pages=128), context_length=256)
    tok = ByteTokenizer()
    server = HttpServer(engine, ChatMLFormat(tok), tokenizer=tok, model="tiny", port=free_port())
    return server, engine


@pytest.mark.parametrize(
    ("path", "extra", "field"),
    [
        ("/v1/completions", {"logit_bias": {"65": 5}}, "logit_bias"),
        ("/v1/completions", {"echo": True, "logprobs": 2, "max_tokens": 1}, "prompt_logprobs"),
        ("/v1/completions", {"seed": 3, "temperature": 0.8}, "seed"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ("/v1/chat/completions", {"top_p": 0.5}, "top_p"),
    ],
)
def test_an_unsupported_field_is_a_400_naming_it(
    path: str, extra: dict[str, Any], field: str
) -> None:
    server, engine = _server(frozenset({field}))
    chat = path.endswith("chat/completions")
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "temperature": 0}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hello"}
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client:
        r = client.post(path, json=body | extra)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert f"does not support {field}" in error["message"]
        ok = client.post(path, json=body)  # the same request without the field is served
        assert ok.status_code == 200, ok.text
    assert not engine.has_work()
    engine.close()
