"""A plain request's latency alone, then with hostile constrained requests in flight.

Starts `resin serve` in a subprocess (`--fake-runner` by default: every millisecond measured is
server and engine overhead; `--real` serves the default model on the reference runner) or
talks to `--url`. It times `--plain N` sequential plain chat requests (`--max-tokens` tokens,
`ignore_eos`) with nothing else running, then the same while `--clients` clients send, over
and over, chat requests whose `guided_choice` holds `--choices` strings (100,000 by default,
a fresh list each time, so every one misses the compile cache), and `--ambiguous` streams
decode under an ambiguous grammar (a costly mask at every step). `/health` is polled every
100 ms throughout. Prints the medians and the ratio (the acceptance: within 2x), the hostile
requests' outcomes by status, and the slowest `/health` answer.

    resin bench grammar-isolation
    resin bench grammar-isolation --real --max-tokens 100 --plain 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

SRC = Path(__file__).resolve().parents[2]  # src/, for the server subprocess
AMBIGUOUS = 'start: e\ne: e "+" e | e e | "a" | "aa" | "b"'


@contextmanager
def server(real: bool) -> Iterator[str]:
    from resin.server.launch import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "resin_app", "serve", "--port", str(port)]
    cmd += [] if real else ["--fake-runner"]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the banner names the URL once the server listens
            if b"serving" in line:
                break
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def chat(text: str, max_tokens: int, **extra: object) -> dict[str, object]:
    messages = [{"role": "user", "content": text}]
    return {"messages": messages, "max_tokens": max_tokens, "ignore_eos": True, **extra}


async def plain(client: httpx.AsyncClient, url: str, n: int, max_tokens: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        r = await client.post(url + "/v1/chat/completions", json=chat(f"plain {i}", max_tokens))
        r.raise_for_status()
        out.append(time.perf_counter() - t0)
    return out


async def hostile_choices(
    client: httpx.AsyncClient, url: str, size: int, stop: asyncio.Event, seen: Counter[str]
) -> None:
    salt = 0
    while not stop.is_set():
        salt += 1
        choices = [f"option {salt}-{i}" for i in range(size)]
        body = chat("pick one", 8, guided_choice=choices)
        body.pop("ignore_eos")
        r = await client.post(url + "/v1/chat/completions", json=body)
        seen[f"guided_choice {r.status_code}"] += 1
        if r.status_code != 200 and seen[f"guided_choice {r.status_code}"] == 1:
            print(f"guided_choice {r.status_code}: {r.text[:300]}", file=sys.stderr)


async def hostile_ambiguous(
    client: httpx.AsyncClient, url: str, stop: asyncio.Event, seen: Counter[str]
) -> None:
    while not stop.is_set():
        body = chat("write", 64, guided_grammar=AMBIGUOUS)
        r = await client.post(url + "/v1/chat/completions", json=body)
        seen[f"ambiguous {r.status_code}"] += 1
        if r.status_code != 200 and seen[f"ambiguous {r.status_code}"] == 1:
            print(f"ambiguous {r.status_code}: {r.text[:300]}", file=sys.stderr)


async def health(client: httpx.AsyncClient, url: str, stop: asyncio.Event) -> list[float]:
    out = []
    while not stop.is_set():
        t0 = time.perf_counter()
        await client.get(url + "/health")
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.1)
    return out


async def measure(url: str, args: argparse.Namespace) -> dict[str, object]:
    timeout = httpx.Timeout(600.0)
    async with httpx.AsyncClient(timeout=timeout) as c, httpx.AsyncClient(timeout=timeout) as h:
        await plain(c, url, 1, args.max_tokens)  # warm up
        alone = await plain(c, url, args.plain, args.max_tokens)
        stop, seen = asyncio.Event(), Counter[str]()
        polls = asyncio.ensure_future(health(h, url, stop))
        load = [hostile_choices(c, url, args.choices, stop, seen) for _ in range(args.clients)]
        load += [hostile_ambiguous(c, url, stop, seen) for _ in range(args.ambiguous)]
        tasks = [asyncio.ensure_future(x) for x in load]
        await asyncio.sleep(args.settle)  # the hostile requests are in flight
        loaded = await plain(c, url, args.plain, args.max_tokens)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        polled = await polls
    a, b = statistics.median(alone), statistics.median(loaded)
    return {
        "plain_alone_s": round(a, 4),
        "plain_loaded_s": round(b, 4),
        "ratio": round(b / a, 2),
        "hostile": dict(seen),
        "health_max_s": round(max(polled, default=0.0), 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resin bench grammar-isolation", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--url", default=None, help="a running server (else one is started)")
    parser.add_argument("--real", action="store_true", help="serve the default model")
    parser.add_argument("--choices", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=2, help="clients sending guided_choice")
    parser.add_argument("--ambiguous", type=int, default=0, help="ambiguous-grammar streams")
    parser.add_argument("--plain", type=int, default=20, help="plain requests timed per phase")
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of load first")
    args = parser.parse_args(argv)
    if args.url:
        result = asyncio.run(measure(args.url, args))
    else:
        with server(args.real) as url:
            result = asyncio.run(measure(url, args))
    print(json.dumps({"choices": args.choices, "clients": args.clients, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
