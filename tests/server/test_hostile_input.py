"""Hostile input on the constrained-decoding, bias, Responses-store and message-count
surfaces, against a real `resin serve --fake-runner` subprocess (the real engine, the
default model's tokenizer, recipe and grammar backend) through the official SDKs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from resin.server.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
ASK = [{"role": "user", "content": "pick"}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "resin_app", "serve", "--fake-runner", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline().decode()
        if "serving" not in banner:
            pytest.skip(f"resin serve --fake-runner did not start: {banner}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_the_fake_runner_serves_constrained_decoding(oai: openai.OpenAI) -> None:
    choices = ["yes", "no", "maybe later"]
    out = oai.chat.completions.create(
        model="fake",
        messages=ASK,
        max_tokens=8,
        extra_body={"guided_choice": choices},  # type: ignore[arg-type]
    )
    assert out.choices[0].message.content in choices
    assert out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"guided_json": {"$ref": "#"}}, "guided_json"),
        ({"guided_grammar": "root ::= root"}, "guided_grammar"),
        ({"guided_regex": "[^\\s\\S]"}, "guided_regex"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
          "schema": {"$ref": "#"}}}}, "response_format"),
    ],
)  # fmt: skip
def test_unsatisfiable_constraints_are_400_at_submit(
    oai: openai.OpenAI, extra: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="fake", messages=ASK, max_tokens=8, extra_body=extra)  # type: ignore[arg-type]
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param, body
    assert "unsatisfiable" in body["message"] and body["type"] == "invalid_request_error"


def test_anthropic_route_refuses_an_unsatisfiable_format_as_invalid_request(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="fake",
            max_tokens=8,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"output_format": {"type": "json_schema", "schema": {"$ref": "#"}}},
        )
    body = info.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error", body


def test_oversize_guided_choice_is_400_naming_the_limit(url: str) -> None:
    # Under the 4 MiB body cap as UTF-8, over the 4 MiB spec limit once escaped into the
    # grammar (a CJK character is 3 bytes in the body, 6 in the grammar).
    choices = ["\u6f22" * 100] * 12_000
    body = json.dumps({"messages": ASK, "max_tokens": 4, "guided_choice": choices},
                      ensure_ascii=False).encode()  # fmt: skip
    assert len(body) < 4 << 20
    r = httpx.post(url + "/v1/chat/completions", content=body, timeout=60,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "guided_choice" and "max_spec_bytes" in error["message"], error


def test_logit_bias_is_capped_at_300_entries(oai: openai.OpenAI) -> None:
    ok = {str(t): -1 for t in range(300)}
    out = oai.chat.completions.create(model="fake", messages=ASK, max_tokens=4, logit_bias=ok)
    assert out.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(
            model="fake", messages=ASK, max_tokens=4, logit_bias={**ok, "300": 1}
        )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "logit_bias"
    assert "at most 300 items" in body["message"], body
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="fake", prompt="x", max_tokens=4, logit_bias={**ok, "300": 1})


@pytest.mark.parametrize(
    "metadata, needle",
    [
        ({f"k{i}": "v" for i in range(17)}, "at most 16 items"),
        ({"k" * 65: "v"}, "at most 64 characters"),
        ({"k": "v" * 513}, "at most 512 characters"),
        ({"k": 3}, "valid string"),
    ],
)
def test_responses_metadata_follows_openai_limits(
    oai: openai.OpenAI, metadata: dict[str, str], needle: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model="fake", input="hi", max_output_tokens=4, metadata=metadata)
    assert needle in str(info.value.body)
    fine = {f"k{i}": "v" * 512 for i in range(16)}
    out = oai.responses.create(model="fake", input="hi", max_output_tokens=4, metadata=fine)
    assert out.metadata == fine


def test_a_flood_of_tiny_messages_is_refused_before_any_work(url: str) -> None:
    """110,000 one-character messages (3.9 MB, under the body cap) are refused by their count;
    /health keeps answering while three such requests arrive at once."""
    body = json.dumps({"messages": [{"role": "user", "content": "x"}] * 110_000,
                       "max_tokens": 4}).encode()  # fmt: skip
    health: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                t0 = time.perf_counter()
                client.get(url + "/health").raise_for_status()
                health.append(time.perf_counter() - t0)
                time.sleep(0.02)

    def send(_: int) -> tuple[int, float, dict[str, object]]:
        t0 = time.perf_counter()
        r = httpx.post(url + "/v1/chat/completions", content=body, timeout=60,
                       headers={"content-type": "application/json"})  # fmt: skip
        return r.status_code, time.perf_counter() - t0, r.json()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(send, range(3)))
    finally:
        stop.set()
        poller.join()
    for status, seconds, answer in results:
        assert status == 400 and answer["error"]["param"] == "messages", answer  # type: ignore[index]
        assert seconds < 3.0, seconds  # rendering them took 5-13 s before the count check
    assert health and max(health) < 1.0, max(health)


def test_the_rendered_size_is_estimated_before_rendering(oai: openai.OpenAI) -> None:
    # 2,048 messages of 100 characters: within the character bound of a 4,096-token context,
    # but at least one token a message plus the text is more than the context holds.
    messages = [{"role": "user", "content": "y" * 100}] * 2048
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="fake", messages=messages, max_tokens=4)  # type: ignore[arg-type]
    assert "in 2048 messages cannot fit the context of 4096 tokens" in str(info.value.body)
    with pytest.raises(openai.BadRequestError) as too_many:
        oai.chat.completions.create(model="fake", messages=[ASK[0]] * 2049, max_tokens=4)  # type: ignore[arg-type]
    assert "at most 2048" in str(too_many.value.body)
