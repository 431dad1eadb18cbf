"""Check a running OpenAI-compatible server and write a Markdown report
(`resin check URL`, resin check).

Checks: health and models; stream == non-stream at temperature 0; prefix-cache reuse visible
in `usage.prompt_tokens_details.cached_tokens`; TTFT against context size; a reasoning case
and a tool-call case; a stress burst (no 5xx); optional accuracy on a local MMLU-style
CSV/JSONL (`--eval-file`).

Every check can fail. The reasoning and tool cases hold the model to what its recipe claims:
`/v1/models` reports `capabilities` (Resin's servers do; `--expect-tools` /
`--expect-reasoning` say it for other servers). A model that can call tools must call the
offered tool, with arguments that fit its schema, when the request forces it; a reasoning
recipe must produce reasoning. A case the model cannot do is SKIPPED with the reason, never
passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from resin_app.check_client import Capabilities, Check, Client, verdict
from resin_app.check_eval import check_eval


def check_basics(c: Client) -> Check:
    health = c.http.get("/health")
    models = c.http.get("/v1/models").json()
    cards = list(models.get("data", []))
    ids = [m["id"] for m in cards]
    if ids and c.model == "default":
        c.model = ids[0]
    card: dict[str, Any] = next((m for m in cards if m["id"] == c.model), {})
    caps = card.get("capabilities") or {}
    c.capabilities = Capabilities(caps.get("tools"), caps.get("reasoning"))
    return verdict(
        "health and models",
        health.status_code == 200 and bool(ids),
        f"/health {health.status_code}, models {ids}",
    )


def check_stream_equality(c: Client) -> Check:
    msgs = [{"role": "user", "content": "Name three primary colors."}]
    full = c.chat(msgs, temperature=0, max_tokens=48)["choices"][0]["message"]["content"] or ""
    streamed, _, _ = c.stream_chat(msgs, temperature=0, max_tokens=48)
    return verdict(
        "stream == non-stream (temperature 0)",
        full == streamed,
        f"{len(full)} chars; equal: {full == streamed}",
        {"text": full[:200]},
    )


def check_prefix_cache(c: Client) -> Check:
    long = "Here is a long shared document. " * 60
    msgs = [{"role": "user", "content": long + "Summarize it in one word."}]
    first = c.chat(msgs, max_tokens=2, temperature=0)["usage"]
    second = c.chat(msgs, max_tokens=2, temperature=0)["usage"]
    cached = (second.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return verdict(
        "prefix cache reuse (cached_tokens)",
        cached > 0,
        f"prompt {second['prompt_tokens']} tokens, cached on repeat: {cached} "
        f"(first: {(first.get('prompt_tokens_details') or {}).get('cached_tokens', 0)})",
        {"cached_tokens": cached},
    )


def check_ttft(c: Client, sizes: Sequence[int]) -> Check:
    rows: list[dict[str, Any]] = []
    for words in sizes:
        text = " ".join(f"w{i % 97}" for i in range(words))
        msgs = [{"role": "user", "content": f"{text}\nReply with OK."}]
        try:
            _, ttft, usage = c.stream_chat(msgs, max_tokens=1, temperature=0)
        except httpx.HTTPStatusError as exc:
            rows.append({"words": words, "status": exc.response.status_code})
            continue
        rows.append(
            {
                "words": words,
                "prompt_tokens": usage.get("prompt_tokens"),
                "ttft_ms": round(ttft * 1000, 1),
            }
        )
    # Every size must answer; only a 400 (the prompt is longer than the context) is a fair
    # refusal. One answered size among 5xx's is a fail, not a pass.
    refused = [r for r in rows if "ttft_ms" not in r and r.get("status") != 400]
    ok = any("ttft_ms" in r for r in rows) and not refused
    detail = "; ".join(
        f"{r.get('prompt_tokens', '?')} tok -> {r['ttft_ms']} ms"
        if "ttft_ms" in r
        else f"{r['words']} words -> HTTP {r['status']}"
        for r in rows
    )
    return verdict("TTFT vs context size", ok, detail, {"rows": rows})


def check_reasoning(c: Client) -> Check:
    name = "reasoning case"
    if not c.capabilities.reasoning:
        why = "unknown" if c.capabilities.reasoning is None else "no"
        return Check(name, "SKIP", f"the model's reasoning capability: {why}")
    r = c.chat(
        [{"role": "user", "content": "Please think step by step: what is 17 + 25?"}],
        max_tokens=256,
        temperature=0,
        chat_template_kwargs={"enable_thinking": True},
    )
    choice = r["choices"][0]
    reasoning = choice["message"].get("reasoning_content") or ""
    content = choice["message"].get("content") or ""
    return verdict(
        name,
        bool(reasoning.strip()),
        f"reasoning_content {len(reasoning)} chars, content {len(content)} chars, "
        f"finish_reason {choice['finish_reason']} (a reasoning recipe must reason)",
    )


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def check_tools(c: Client) -> Check:
    name = "tool-call case (forced)"
    if not c.capabilities.tools:
        why = "unknown" if c.capabilities.tools is None else "no"
        return Check(name, "SKIP", f"the model's tool-calling capability: {why}")
    forced = {"type": "function", "function": {"name": "get_weather"}}
    try:
        r = c.chat(
            [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
            tools=[WEATHER_TOOL],
            tool_choice=forced,
            max_tokens=96,
            temperature=0,
        )
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 400:
            return Check(name, "SKIP", f"the server cannot force a call: {exc.response.text}")
        raise
    choice = r["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    problems = [p for tc in calls for p in _call_problems(tc)]
    if not calls:
        problems.append("no tool call")
    if choice["finish_reason"] != "tool_calls":
        problems.append(f"finish_reason {choice['finish_reason']!r}, not 'tool_calls'")
    names = [tc["function"]["name"] for tc in calls]
    return verdict(
        name, not problems, f"calls {names}; " + ("; ".join(problems) or "arguments fit")
    )


def _call_problems(call: dict[str, Any]) -> list[str]:
    """What is wrong with one returned call against WEATHER_TOOL (empty: nothing)."""
    fn = call.get("function") or {}
    if fn.get("name") != "get_weather":
        return [f"called {fn.get('name')!r}, which was not offered"]
    try:
        args = json.loads(fn.get("arguments") or "")
    except ValueError:
        return [f"arguments are not JSON: {fn.get('arguments')!r}"]
    if not isinstance(args, dict) or not isinstance(args.get("city"), str):
        return [f"arguments miss the required string 'city': {args!r}"]
    return []


async def _burst(c: Client, n: int) -> dict[int, int]:
    limits = httpx.Limits(max_connections=min(n, 256))
    async with httpx.AsyncClient(
        base_url=c.url, headers=c.headers, timeout=c.timeout, limits=limits
    ) as ac:
        body = {"model": c.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

        async def one() -> int:
            try:
                return (await ac.post("/v1/chat/completions", json=body)).status_code
            except httpx.HTTPError:
                return -1

        codes = await asyncio.gather(*(one() for _ in range(n)))
    counts: dict[int, int] = {}
    for code in codes:
        counts[code] = counts.get(code, 0) + 1
    return counts


def check_burst(c: Client, n: int) -> Check:
    counts = asyncio.run(_burst(c, n))
    ok = all(code in (200, 429) for code in counts) and counts.get(200, 0) > 0
    health = c.http.get("/health").status_code
    return verdict(
        f"stress burst ({n} requests)",
        ok and health == 200,
        f"statuses {dict(sorted(counts.items()))}; /health after: {health}",
    )


def write_report(path: Path, url: str, checks: list[Check]) -> None:
    count = {k: sum(c.status == k for c in checks) for k in ("PASS", "FAIL", "SKIP")}
    lines = [
        f"# Server check: {url}",
        "",
        f"{count['PASS']} passed, {count['FAIL']} failed, {count['SKIP']} skipped",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    lines += [f"| {c.name} | {c.status} | {c.detail} |" for c in checks]
    lines += ["", "```json", json.dumps([c.__dict__ for c in checks], indent=1), "```", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(
            f"expected a server URL (http:// or https://), got {text!r}"
        )
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="resin check",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
    )
    p.add_argument("url", type=_url, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--output", default="server_check.md", help="the Markdown report (server_check.md)"
    )
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None, help="default: the first model the server lists")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (300)")
    p.add_argument(
        "--ttft-sizes", default="16,128,512,1024", help="prompt sizes in words (16,128,512,1024)"
    )
    p.add_argument("--burst", type=int, default=500, help="requests in the stress burst (500)")
    p.add_argument("--eval-file", default=None, help="MMLU-style CSV or JSONL for accuracy")
    p.add_argument("--eval-limit", type=int, default=100, help="questions at most (100)")
    p.add_argument("--eval-concurrency", type=int, default=32, help="requests at once (32)")
    for what in ("tools", "reasoning"):
        p.add_argument(
            f"--expect-{what}",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"hold the model to {what} (default: what /v1/models reports)",
        )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    c = Client(args.url, args.api_key, args.model, args.timeout)
    sizes = [int(x) for x in args.ttft_sizes.split(",") if x]

    def basics() -> Check:
        result = check_basics(c)
        tools, reasoning = args.expect_tools, args.expect_reasoning
        c.capabilities = Capabilities(
            c.capabilities.tools if tools is None else tools,
            c.capabilities.reasoning if reasoning is None else reasoning,
        )
        return result

    steps: list[tuple[str, Callable[[], Check]]] = [
        ("health and models", basics),
        ("stream == non-stream", lambda: check_stream_equality(c)),
        ("prefix cache reuse", lambda: check_prefix_cache(c)),
        ("TTFT vs context size", lambda: check_ttft(c, sizes)),
        ("reasoning case", lambda: check_reasoning(c)),
        ("tool-call case", lambda: check_tools(c)),
        ("stress burst", lambda: check_burst(c, args.burst)),
    ]
    if args.eval_file:
        path = Path(args.eval_file)
        steps.append(
            (path.name, lambda: check_eval(c, path, args.eval_limit, args.eval_concurrency))
        )
    checks: list[Check] = []
    for name, step in steps:
        try:
            result = step()
        except Exception as exc:  # a failed check is reported, the others still run
            result = Check(name, "FAIL", f"{type(exc).__name__}: {exc}")
        checks.append(result)
        print(f"[{result.status}] {result.name}: {result.detail}", flush=True)
    write_report(Path(args.output), args.url, checks)
    print(f"report: {args.output}")
    return 0 if all(c.ok for c in checks) else 1
