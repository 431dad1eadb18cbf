"""Logprobs under grammar masks are finite numbers in strictly valid JSON, streamed or not,
from chat and completions: the default model (SmolLM2-135M-Instruct, reference runner), whose
masked alternatives are -inf in the runner, behind the server; raw HTTP parsed strictly (as
JavaScript, Go and Rust parsers do) and the official SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from resin.frontend.generation import LOGPROB_FLOOR
from resin_app.bench.structured import default_server

pytestmark = pytest.mark.slow
CHOICES = ["yes", "no"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    pytest.importorskip("torch")
    try:
        with default_server() as (base, _):
            yield base
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"default model unavailable: {exc}")


def strict(text: str) -> Any:
    """json.loads that refuses NaN and +-Infinity (Python accepts them by default)."""

    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in numbers(v)]
    return [value] if isinstance(value, float) else []


def events(r: httpx.Response) -> list[Any]:
    lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    return [strict(data) for data in lines if data != "[DONE]"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_and_completions_logprobs_under_a_mask_are_finite(url: str, stream: bool) -> None:
    chat = {"messages": [{"role": "user", "content": "Answer yes or no: is water wet?"}],
            "max_tokens": 4, "logprobs": True, "top_logprobs": 20, "guided_choice": CHOICES,
            "stream": stream}  # fmt: skip
    complete = {"prompt": "Is water wet? Answer:", "max_tokens": 4, "logprobs": 20,
                "guided_choice": CHOICES, "stream": stream}  # fmt: skip
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", complete)):
        r = httpx.post(url + path, json=body, timeout=300)
        assert r.status_code == 200, r.text
        answers = events(r) if stream else [strict(r.text)]
        found = [x for a in answers for x in numbers(a)]
        assert found and all(LOGPROB_FLOOR <= x <= 0.0 for x in found), (path, found)
        # Only prefixes of "yes" and "no" are possible: most of the 20 alternatives are floored.
        assert LOGPROB_FLOOR in found, (path, found)


def test_the_sdk_reads_masked_logprobs(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    out = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "yes or no?"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=20,
        extra_body={"guided_choice": CHOICES},
    )
    content = out.choices[0].logprobs
    assert content is not None and content.content
    for item in content.content:
        assert LOGPROB_FLOOR <= item.logprob <= 0.0
        assert len(item.top_logprobs) == 20  # impossible alternatives are kept, floored
        assert all(LOGPROB_FLOOR <= t.logprob <= 0.0 for t in item.top_logprobs)
        assert item.top_logprobs[-1].logprob == LOGPROB_FLOOR
