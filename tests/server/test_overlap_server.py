"""The server over an overlapping runner (the reference runner, tiny random Llama, CPU): the
same completions, greedy and seeded, with stop strings that end a request while its next
token is already in flight, as with `--no-overlap`; and the CLI switch."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from resin import Engine
from resin.server import HttpServer
from resin.server.launch import free_port, running
from resin_app.cli import _build_parser
from resin_app.loading import LoadOptions, load
from tests.server.doubles import ByteTokenizer, ChatMLFormat

torch = pytest.importorskip("torch")

LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": ByteTokenizer.vocab_size,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
}


def _complete(overlap: bool, bodies: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    from resin_models_torch.registry import random_runner

    runner = random_runner(LLAMA, seed=5, page_size=4, num_pages=256)
    engine = Engine(runner, context_length=256, prefix_cache=True, overlap=overlap)
    assert engine.overlap is overlap
    tok = ByteTokenizer()
    server = HttpServer(
        engine, ChatMLFormat(tok), tokenizer=tok, model="tiny", port=free_port(), stream_interval=1
    )
    out = []
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client:
        for body in bodies:
            r = client.post("/v1/completions", json={"model": "tiny", **body})
            assert r.status_code == 200, r.text
            out.append([(c["text"], c["finish_reason"]) for c in r.json()["choices"]])
    engine.close()
    return out


def test_completions_with_stop_strings_equal_without_overlap() -> None:
    base = [
        {"prompt": "hello there", "max_tokens": 24, "temperature": 0},
        {"prompt": "abc", "max_tokens": 24, "temperature": 0.9, "seed": 7, "n": 3},
    ]
    free = _complete(False, base)
    texts = [text for choices in free for text, _ in choices if len(text) > 8]
    assert texts, free
    bodies = [*base]
    for text in texts[:3]:  # stops that fire mid-output: the request ends with a token in flight
        for body in base:
            bodies.append({**body, "stop": [text[4:6]]})
    sync = _complete(False, bodies)
    piped = _complete(True, bodies)
    assert piped == sync
    assert any(reason == "stop" for choices in piped for _, reason in choices)


def test_overlap_switch_reaches_the_engine() -> None:
    parser = _build_parser()
    assert parser.parse_args(["serve"]).overlap is None  # auto: on when the runner supports it
    assert parser.parse_args(["serve", "--no-overlap"]).overlap is False
    assert parser.parse_args(["chat", "--overlap"]).overlap is True
    assert not load(LoadOptions(fake=True), progress=False).engine.overlap
    with pytest.raises(ValueError, match="overlap=True"):
        load(LoadOptions(fake=True, overlap=True), progress=False)
