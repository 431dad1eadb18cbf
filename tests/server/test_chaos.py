"""Bounded chaos: ~30 s of a seeded random mix of valid, malformed, n > 1, oversize, hang-up,
slow-reader and cancelled requests, constrained ones (schemas, choices, regexes, a large
choice list, unsatisfiable specs), biased ones (up to and past the 300-entry cap), tool
calls (auto and forced, three APIs) and sampling penalties, against a real `resin serve
--fake-runner` subprocess on loopback (its zero-cost runner follows the grammar masks).
Afterwards: no 5xx, /health answered within 1 s throughout, intake/running/waiting back to 0
and no KV pages held by requests."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from resin.server.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
DURATION = 30.0
WORKERS = 12
SEED = 20261201


def _gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if f.type == "gauge"
    }


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "n": {"type": "integer"}}, "required": ["name", "n"]}  # fmt: skip
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 16, **extra}


class Chaos:
    def __init__(self, url: str) -> None:
        self.url = url
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.statuses: Counter[int] = Counter()
        self.kinds: Counter[str] = Counter()
        self.errors: list[str] = []

    async def post(self, s: aiohttp.ClientSession, path: str, **kw: Any) -> None:
        async with s.post(self.url + path, **kw) as r:
            await r.read()
            self.statuses[r.status] += 1
            if r.status >= 500:
                self.errors.append(f"{path} {r.status} {(await r.text())[:200]}")

    async def raw_stream(self, rng: random.Random, mode: str) -> None:
        """A streamed chat request on a bare socket: hang up early or read slowly."""
        body = json.dumps(_chat("raw " * rng.randint(1, 50), max_tokens=3000, stream=True))
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(head.encode() + body.encode())
            await writer.drain()
            status = await reader.readline()
            code = int(status.split()[1]) if status.startswith(b"HTTP/1.1") else 0
            self.statuses[code] += 1
            if code >= 500:
                self.errors.append(f"raw {mode} {status!r}")
            if mode == "hangup":
                await reader.read(rng.randint(1, 2000))
            else:  # slow reader
                for _ in range(rng.randint(5, 20)):
                    await reader.read(64)
                    await asyncio.sleep(0.05)
        finally:
            writer.close()

    async def one(self, s: aiohttp.ClientSession, rng: random.Random) -> None:
        kind = rng.choice(
            ["valid", "valid", "valid", "stream", "complete", "anthropic", "responses",
             "malformed", "n", "oversize", "hangup", "slow", "cancel", "constrained",
             "constrained", "biased", "tools", "tools", "penalties"]
        )  # fmt: skip
        self.kinds[kind] += 1
        text = "hello " * rng.randint(1, 40)
        if kind == "valid":
            await self.post(s, "/v1/chat/completions", json=_chat(text))
        elif kind == "stream":
            await self.post(s, "/v1/chat/completions", json=_chat(text, stream=True))
        elif kind == "complete":
            prompts: Any = [text, text + "!"] if rng.random() < 0.5 else text
            await self.post(s, "/v1/completions", json={"prompt": prompts, "max_tokens": 8})
        elif kind == "anthropic":
            msg = {"model": "fake", **_chat(text, stream=rng.random() < 0.5)}
            await self.post(s, "/v1/messages", json=msg)
        elif kind == "responses":
            body = {"input": text, "stream": rng.random() < 0.5, "max_output_tokens": 8}
            await self.post(s, "/v1/responses", json=body)
        elif kind == "malformed":
            bad = rng.choice(
                [
                    b"{not json",
                    bytes(rng.getrandbits(8) for _ in range(64)),
                    b'{"messages": "x"}',
                    b'{"prompt": "\\ud800x"}',
                    b'{"messages": [{"role": "wizard", "content": "x"}]}',
                    b'{"messages": [{"role": "user", "content": "x"}], "n": 3, "seed": '
                    + str(2**63 - 2).encode()
                    + b"}",
                    b'{"prompt": [[1, 2], [99999999]], "n": 2}',
                ]
            )
            path = rng.choice(["/v1/chat/completions", "/v1/completions", "/v1/messages"])
            await self.post(s, path, data=bad, headers={"content-type": "application/json"})
        elif kind == "n":
            body = _chat(text, n=rng.randint(2, 8), stream=rng.random() < 0.5, seed=7)
            await self.post(s, "/v1/chat/completions", json=body)
        elif kind == "oversize":
            if rng.random() < 0.5:
                await self.post(s, "/v1/completions", json={"prompt": "z" * 1_000_000})
            else:
                junk = b"x" * (5 * 1024 * 1024)
                await self.post(s, "/v1/chat/completions", data=junk)
        elif kind == "constrained":
            await self.constrained(s, rng, text)
        elif kind == "biased":
            size = rng.choice([1, 50, 300, 301])  # 301: a 400
            bias = {str(rng.randrange(49152)): rng.uniform(-100, 100) for _ in range(size)}
            body = _chat(text, logit_bias=bias, stream=rng.random() < 0.5)
            await self.post(s, "/v1/chat/completions", json=body)
        elif kind == "tools":
            await self.tools(s, rng, text)
        elif kind == "penalties":  # implemented, or a 400: never a 5xx, never ignored
            body = _chat(text, presence_penalty=rng.uniform(-2, 2),
                         frequency_penalty=rng.uniform(-2, 2),
                         repetition_penalty=rng.uniform(0.5, 2))  # fmt: skip
            await self.post(s, "/v1/chat/completions", json=body)
        elif kind in ("hangup", "slow"):
            await self.raw_stream(rng, "hangup" if kind == "hangup" else "slow")
        else:  # cancelled mid-flight
            body = _chat(text, max_tokens=2000, ignore_eos=True, stream=rng.random() < 0.5)
            task = asyncio.ensure_future(self.post(s, "/v1/chat/completions", json=body))
            await asyncio.sleep(rng.uniform(0.0, 0.2))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def constrained(self, s: aiohttp.ClientSession, rng: random.Random, text: str) -> None:
        spec: dict[str, Any] = rng.choice(
            [
                {"guided_choice": ["yes", "no", "maybe"]},
                {"guided_choice": [f"option {rng.random()} {i}" for i in range(20_000)]},
                {"response_format": {"type": "json_object"}},
                {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                 "schema": SCHEMA}}},
                {"guided_regex": "[a-z]{1,8}@[a-z]{2,5}\\.com"},
                {"guided_json": {"$ref": "#"}},  # unsatisfiable: a 400
                {"guided_grammar": "root ::= root"},  # unsatisfiable: a 400
            ]
        )  # fmt: skip
        body = _chat(text, stream=rng.random() < 0.5, logprobs=rng.random() < 0.3, **spec)
        if rng.random() < 0.3:
            body["prompt"] = body.pop("messages")[0]["content"]
            body.pop("logprobs")
            await self.post(s, "/v1/completions", json=body)
        else:
            await self.post(s, "/v1/chat/completions", json=body)

    async def tools(self, s: aiohttp.ClientSession, rng: random.Random, text: str) -> None:
        stream = rng.random() < 0.5
        api = rng.choice(["chat", "anthropic", "responses"])
        if api == "chat":
            choice = rng.choice(["auto", "required", {"type": "function",
                                 "function": {"name": "get_weather"}}])  # fmt: skip
            body = _chat(text, tools=[TOOL], tool_choice=choice, stream=stream)
            await self.post(s, "/v1/chat/completions", json=body)
        elif api == "anthropic":
            tool = {"name": "get_weather", "input_schema": WEATHER}
            choice = rng.choice([{"type": "auto"}, {"type": "any"}])
            body = {"model": "fake", **_chat(text, stream=stream), "tools": [tool],
                    "tool_choice": choice}  # fmt: skip
            await self.post(s, "/v1/messages", json=body)
        else:
            tool = {"type": "function", "name": "get_weather", "parameters": WEATHER}
            body = {"input": text, "stream": stream, "max_output_tokens": 16, "tools": [tool],
                    "tool_choice": rng.choice(["auto", "required"])}  # fmt: skip
            await self.post(s, "/v1/responses", json=body)

    async def worker(self, i: int, until: float) -> None:
        rng = random.Random(SEED + i)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            while time.monotonic() < until:
                try:
                    await self.one(s, rng)
                except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
                    self.errors.append(f"transport: {type(exc).__name__}: {exc}")

    async def run(self) -> None:
        until = time.monotonic() + DURATION
        await asyncio.gather(*(self.worker(i, until) for i in range(WORKERS)))


@pytest.mark.serial
def test_chaos_against_resin_serve() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [
        sys.executable,
        "-m",
        "resin_app",
        "serve",
        "--fake-runner",
        "--port",
        str(port),
        "--disable-log-requests",  # a line per request would fill the unread pipe
    ]  # the default: an engine process behind `auto` frontend processes
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    health: list[tuple[int, float]] = []
    stop = threading.Event()

    def poll_health() -> None:
        with httpx.Client(timeout=5) as client:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    code = client.get(url + "/health").status_code
                except httpx.HTTPError:
                    code = 0
                health.append((code, time.perf_counter() - t0))
                time.sleep(0.1)

    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline().decode()
        assert url in banner, banner
        poller = threading.Thread(target=poll_health)
        poller.start()
        chaos = Chaos(url)
        try:
            asyncio.run(chaos.run())
        finally:
            stop.set()
            poller.join(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            g = _gauges(url)
            queued = httpx.get(url + "/health").json()["queued"]
            names = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
            busy = [g[f"resin:{n}"] for n in names]
            if queued == 0 and not any(busy):
                break
            time.sleep(0.2)
        assert queued == 0 and not any(busy), (queued, busy)
        print(
            "chaos:",
            dict(chaos.kinds),
            dict(chaos.statuses),
            "health max",
            max(t for _, t in health),
        )
        assert not chaos.errors, chaos.errors[:10]
        assert not [c for c in chaos.statuses if c >= 500], chaos.statuses
        assert set(chaos.kinds) >= {"valid", "malformed", "n", "oversize", "hangup", "slow",
                                    "constrained", "biased", "tools", "penalties"}  # fmt: skip
        assert sum(chaos.statuses.values()) > 100, chaos.statuses
        assert len(health) > 100
        slow = [(c, round(t, 2)) for c, t in health if c != 200 or t >= 1.0]
        assert not slow, slow[:10]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
