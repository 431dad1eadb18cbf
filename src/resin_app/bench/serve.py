"""Load generator for an OpenAI-compatible server (`resin bench serve --url URL`).

Random word prompts, Poisson arrivals (`--request-rate`) or a fixed number of streams
(`--max-concurrency`), streaming chat or completions. Reports TTFT, TPOT = (e2e - ttft) /
(output_tokens - 1), ITL (gaps between streamed chunks), e2e latency percentiles, request and
token throughput, and goodput against optional SLOs; appends one JSON line per run. Against a
data-parallel server (`resin serve --data-parallel N`) it also reports how the output tokens
split over the replicas (from `/metrics`, `replica` label).

The JSON line also records the workload the server was given (`workload`: per completed
request, in arrival order, its arrival time in seconds from the start, prompt, output and
prefix-cached tokens as the server counted them), which `resin bench replay` runs through the
Engine alone to state HTTP / Engine on the same request mix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "river",
    "stone",
    "cloud",
    "maple",
    "ember",
    "lattice",
    "quartz",
    "harbor",
    "violet",
    "signal",
    "meadow",
    "copper",
    "lantern",
    "orbit",
    "willow",
    "canyon",
]


@dataclass
class Outcome:
    ok: bool
    status: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    arrival_s: float = 0.0
    """When the request arrived (was due to be sent), from the run's start."""
    cached_tokens: int = 0


def make_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def one_request(
    session: Any, url: str, body: dict[str, Any], headers: dict[str, str]
) -> Outcome:
    start = time.perf_counter()
    last = start
    out = Outcome(ok=False)
    chunks = 0
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            out.status = resp.status
            if resp.status != 200:
                out.error = (await resp.text())[:200]
                return out
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if usage := chunk.get("usage"):
                    out.output_tokens = usage["completion_tokens"]
                    out.prompt_tokens = usage["prompt_tokens"]
                    details = usage.get("prompt_tokens_details") or {}
                    out.cached_tokens = int(details.get("cached_tokens") or 0)
                if not chunk.get("choices"):
                    continue
                c = chunk["choices"][0]
                piece = c.get("text") or (c.get("delta") or {}).get("content") or ""
                if not piece:
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    out.ttft = now - start
                else:
                    out.itl.append(now - last)
                last = now
                chunks += 1
    except Exception as exc:  # a load generator reports failures, it does not stop
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.e2e = time.perf_counter() - start
    out.output_tokens = out.output_tokens or chunks
    out.ok = chunks > 0
    return out


def percentiles(values: Sequence[float], ps: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in ps}}
    ordered = sorted(values)
    res = {"mean": statistics.fmean(ordered)}
    for p in ps:
        res[f"p{p}"] = ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]
    return res


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    rng = random.Random(args.seed)
    base = args.url.rstrip("/")
    chat = args.endpoint == "chat"
    url = base + ("/v1/chat/completions" if chat else "/v1/completions")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    sem = asyncio.Semaphore(args.max_concurrency or args.num_prompts)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    outcomes: list[Outcome] = []

    async def fire(session: Any, prompt: str, arrival: float) -> None:
        body: dict[str, Any] = {
            "model": args.model,
            "max_tokens": args.output_len,
            "stream": True,
            "ignore_eos": args.ignore_eos,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        }
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        async with sem:
            outcome = await one_request(session, url, body, headers)
        outcome.arrival_s = arrival
        outcomes.append(outcome)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        before = await replica_tokens(session, base, headers)
        start = time.perf_counter()
        tasks = []
        for _ in range(args.num_prompts):
            prompt = make_prompt(rng, args.input_len)
            arrival = time.perf_counter() - start
            tasks.append(asyncio.ensure_future(fire(session, prompt, arrival)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        after = await replica_tokens(session, base, headers)
    result = summarize(args, outcomes, duration)
    result["replica_output_tokens"] = {r: after[r] - before.get(r, 0.0) for r in sorted(after)}
    return result


_REPLICA_TOKENS = re.compile(r'^resin:generation_tokens_total\{[^}]*replica="([^"]+)"[^}]*\} (\S+)')


async def replica_tokens(session: Any, base: str, headers: dict[str, str]) -> dict[str, float]:
    """Generated tokens per data-parallel replica so far (`/metrics`); {} for other servers."""
    try:
        async with session.get(base + "/metrics", headers=headers) as resp:
            text = await resp.text() if resp.status == 200 else ""
    except Exception:  # no metrics: nothing to split
        return {}
    found = (_REPLICA_TOKENS.match(line) for line in text.splitlines())
    return {m.group(1): float(m.group(2)) for m in found if m}


def summarize(args: argparse.Namespace, outcomes: list[Outcome], duration: float) -> dict[str, Any]:
    good = [o for o in outcomes if o.ok]
    out_tokens = sum(o.output_tokens for o in good)
    in_tokens = sum(o.prompt_tokens for o in good)
    tpot = [(o.e2e - o.ttft) / (o.output_tokens - 1) for o in good if o.output_tokens > 1]
    meets = [
        o
        for o in good
        if (args.slo_ttft_ms is None or o.ttft * 1000 <= args.slo_ttft_ms)
        and (
            args.slo_tpot_ms is None
            or o.output_tokens < 2
            or (o.e2e - o.ttft) / (o.output_tokens - 1) * 1000 <= args.slo_tpot_ms
        )
    ]
    cfg = {k: v for k, v in vars(args).items() if k not in ("api_key", "output")}
    cfg["request_rate"] = str(cfg["request_rate"])
    return {
        "config": cfg,
        "completed": len(good),
        "failed": len(outcomes) - len(good),
        "statuses": sorted({o.status for o in outcomes}),
        "duration_s": duration,
        "request_throughput": len(good) / duration,
        "output_tok_s": out_tokens / duration,
        "total_tok_s": (out_tokens + in_tokens) / duration,
        "goodput_req_s": len(meets) / duration,
        "ttft_ms": {k: v * 1000 for k, v in percentiles([o.ttft for o in good]).items()},
        "tpot_ms": {k: v * 1000 for k, v in percentiles(tpot).items()},
        "itl_ms": {k: v * 1000 for k, v in percentiles([x for o in good for x in o.itl]).items()},
        "e2e_ms": {k: v * 1000 for k, v in percentiles([o.e2e for o in good]).items()},
        "errors": [o.error for o in outcomes if not o.ok][:5],
        "workload": workload(good),
    }


def workload(outcomes: Sequence[Outcome]) -> list[list[float]]:
    """[arrival s, prompt tokens, output tokens, cached tokens] per request, by arrival."""
    rows = sorted(outcomes, key=lambda o: o.arrival_s)
    return [
        [round(o.arrival_s, 6), o.prompt_tokens, o.output_tokens, o.cached_tokens] for o in rows
    ]


def print_table(r: dict[str, Any]) -> None:
    c = r["config"]
    print(
        f"\n== {c['endpoint']} | concurrency={c['max_concurrency']} rate={c['request_rate']} "
        f"| {c['num_prompts']} prompts, ~{c['input_len']} words in, {c['output_len']} tokens out"
    )
    print(
        f"completed {r['completed']}  failed {r['failed']}  statuses {r['statuses']}  "
        f"duration {r['duration_s']:.2f}s"
    )
    print(
        f"requests/s {r['request_throughput']:.1f}  output tok/s {r['output_tok_s']:.0f}  "
        f"total tok/s {r['total_tok_s']:.0f}  goodput req/s {r['goodput_req_s']:.1f}"
    )
    if r.get("replica_output_tokens"):
        split = "  ".join(f"{k}: {v:.0f}" for k, v in r["replica_output_tokens"].items())
        print(f"output tokens by replica  {split}")
    print(f"{'metric':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        row = r[key]
        print(f"{key:<10}" + "".join(f"{row[k]:>10.2f}" for k in ("mean", "p50", "p90", "p99")))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="resin bench serve", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="default")
    p.add_argument("--api-key", default=None)
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--input-len", type=int, default=64, help="words per random prompt")
    p.add_argument("--output-len", type=int, default=64, help="max_tokens per request")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson req/s")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--output",
        default=None,
        help="append one JSON line per run here (with the workload, for `resin bench replay`)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = asyncio.run(run(args))
    print_table(result)
    if args.output:
        with open(args.output, "a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
    return 0 if result["failed"] == 0 else 1


__all__ = ["Outcome", "asdict", "main", "percentiles", "run"]
