"""Data-parallel serving (`HttpServer` over several engines, as `resin serve --data-parallel 2`
builds it): two replicas of the real default model behind one front, driven over HTTP by the
openai SDK. A repeated long prompt goes back to the replica that cached it (its usage reports
the cache hit, its replica's metrics count it); fresh prompts alternate; `n` choices share
one replica; a client can name the replica; `/metrics` and `/health` show each replica. With
scripted engines: a replica that dies fails only its own requests while the other serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from resin.server.launch import running
from resin_app.bench import serve
from tests.server.conftest import MODEL, assert_stops_listening, make_server, serve_loaded
from tests.server.doubles import FakeEngine

LONG = (
    "Here is a long note about rivers, stones, clouds and maple trees that the user pastes "
    "before asking a question, so that the prompt spans many cache pages. " * 6
)
FRESH = [
    f"Question {i}: please describe {topic} in a few words, as plainly as you can, for a "
    f"reader who has never heard of it before and wants a short and simple answer."
    for i, topic in enumerate(
        ["copper", "lanterns", "harbors", "orbits", "meadows", "canyons", "quartz", "willows"]
    )
]  # each test its own: a prompt sent before is a cache hit on the replica that served it


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    pytest.importorskip("torch")
    from resin_app.loading import LoadOptions, load

    try:
        loaded = load(LoadOptions(context_length=1024, data_parallel=2), progress=False)
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"default model unavailable: {exc}")
    assert len(loaded.engines) == 2
    with running(serve_loaded(loaded)) as base:
        yield base
    loaded.close()


@pytest.fixture(scope="module")
def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


def per_replica(url: str, name: str) -> dict[str, float]:
    """A counter's value per replica (summed over its other labels)."""
    text = httpx.get(url + "/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == name:
            for s in family.samples:
                if s.name == name + "_total":
                    out[s.labels["replica"]] = out.get(s.labels["replica"], 0.0) + s.value
    return out


def served_by(url: str, call: object) -> tuple[object, dict[str, float]]:
    """Run `call()`; return its result and the finished requests per replica it added."""
    before = per_replica(url, "resin:request_success")
    result = call()  # type: ignore[operator]
    after = per_replica(url, "resin:request_success")
    return result, {r: after[r] - before.get(r, 0.0) for r in after}


def chat(oai: openai.OpenAI, text: str, **kwargs: object) -> object:
    options = {"temperature": 0, "max_tokens": 2, **kwargs}
    return oai.chat.completions.create(  # type: ignore[call-overload]
        model="default", messages=[{"role": "user", "content": text}], **options
    )


def test_health_and_metrics_show_each_replica(url: str, oai: openai.OpenAI) -> None:
    chat(oai, FRESH[0])
    health = httpx.get(url + "/health")
    assert health.status_code == 200
    assert [r["alive"] for r in health.json()["replicas"]] == [True, True]
    text = httpx.get(url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    running_ = families["resin:num_requests_running"].samples
    assert sorted(s.labels["replica"] for s in running_) == ["0", "1"]
    assert text.count("# TYPE resin:prompt_tokens_total counter") == 1


def test_a_repeated_long_prompt_returns_to_the_replica_that_cached_it(
    url: str, oai: openai.OpenAI
) -> None:
    first, where = served_by(url, lambda: chat(oai, LONG))
    (home,) = [r for r, n in where.items() if n == 1]
    hits_before = per_replica(url, "resin:prefix_cache_hits")
    for text in (FRESH[0], LONG, FRESH[1], LONG):  # fresh prompts move the round-robin turn
        answer, where = served_by(url, lambda t=text: chat(oai, t))  # type: ignore[misc]
        if text is LONG:
            assert where[home] == 1 and sum(where.values()) == 1
            usage = answer.usage  # type: ignore[attr-defined]
            cached = usage.prompt_tokens_details.cached_tokens
            assert cached >= usage.prompt_tokens - 16, usage  # all but the last partial page
            assert answer.choices[0].message.content == first.choices[0].message.content  # type: ignore[attr-defined]
    hits = per_replica(url, "resin:prefix_cache_hits")
    assert hits[home] - hits_before[home] >= 2 * 100  # both repeats hit on the home replica


def test_fresh_prompts_alternate_between_replicas(url: str, oai: openai.OpenAI) -> None:
    _, where = served_by(url, lambda: [chat(oai, t) for t in FRESH[2:6]])
    assert where == {"0": 2.0, "1": 2.0}


def test_n_choices_share_one_replica(url: str, oai: openai.OpenAI) -> None:
    answer, where = served_by(url, lambda: chat(oai, FRESH[6], n=3, temperature=0.8, seed=1))
    assert len(answer.choices) == 3  # type: ignore[attr-defined]
    assert sorted(where.values()) == [0.0, 3.0]


def test_a_client_can_name_the_replica(url: str, oai: openai.OpenAI) -> None:
    for replica in ("1", "0", "1"):
        headers = {"resin-routed-dp-rank": replica}
        _, where = served_by(url, lambda h=headers: chat(oai, FRESH[7], extra_headers=h))  # type: ignore[misc]
        assert where[replica] == 1 and sum(where.values()) == 1
    _, where = served_by(url, lambda: chat(oai, FRESH[7], extra_body={"routed_dp_rank": 1}))
    assert where["1"] == 1 and sum(where.values()) == 1
    with pytest.raises(openai.BadRequestError, match="routed_dp_rank"):
        chat(oai, FRESH[7], extra_body={"routed_dp_rank": 2})


def test_bench_serve_reports_the_split_over_replicas(tmp_path: object) -> None:
    from resin_app.loading import LoadOptions, load

    loaded = load(LoadOptions(fake=True, data_parallel=2), progress=False)
    with running(serve_loaded(loaded)) as base:
        argv = ["--url", base, "--num-prompts", "16", "--max-concurrency", "8"]
        args = serve.parser().parse_args([*argv, "--output-len", "8"])
        result = asyncio.run(serve.run(args))
    loaded.close()
    assert result["failed"] == 0
    split = result["replica_output_tokens"]
    assert sorted(split) == ["0", "1"] and all(v > 0 for v in split.values())
    assert sum(split.values()) == 16 * 8


def test_a_dead_replica_fails_its_own_requests_while_the_other_serves() -> None:
    engines = [FakeEngine(fail_at_step=3), FakeEngine()]
    server = make_server(engines)  # type: ignore[arg-type]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 20}], "max_tokens": 8}
    with running(server) as base:
        dead = httpx.post(
            base + "/v1/chat/completions", json=body, headers={"resin-routed-dp-rank": "0"}
        )
        assert dead.status_code == 503
        health = httpx.get(base + "/health")
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert [r["alive"] for r in health.json()["replicas"]] == [False, True]
        for named in ({}, {"resin-routed-dp-rank": "0"}, {}):  # routed around the dead one
            ok = httpx.post(base + "/v1/chat/completions", json=body, headers=named, timeout=30)
            assert ok.status_code == 200, ok.text


def test_the_front_stops_when_the_last_replica_died() -> None:
    server = make_server([FakeEngine(fail_at_step=2), FakeEngine(fail_at_step=2)])  # type: ignore[arg-type]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8}
    with running(server) as base:
        for replica in ("0", "1"):
            headers = {"resin-routed-dp-rank": replica}
            r = httpx.post(base + "/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 503
        health = httpx.get(base + "/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert_stops_listening(base)


def test_tools_with_auto_choice_are_served_by_replicas(oai: openai.OpenAI) -> None:
    """Auto tool calls carry a grammar: the front asks every replica whether it has one."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    answer = oai.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice="auto",
        max_tokens=24,
        temperature=0,
    )
    calls = answer.choices[0].message.tool_calls or []
    assert all(c.function.name == "get_weather" for c in calls)  # type: ignore[union-attr]
