"""Check a running OpenAI-compatible server and write a Markdown report
(`resin check URL`, scripts/check_server.py).

Checks: health and models; stream == non-stream at temperature 0; prefix-cache reuse visible
in `usage.prompt_tokens_details.cached_tokens`; TTFT against context size; a reasoning case
and a tool-call case (reported, pass when the answer is well formed); a stress burst (no 5xx);
optional accuracy on a local MMLU-style CSV/JSONL (`--eval-file`).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

LETTERS = "ABCD"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


class Client:
    def __init__(self, url: str, api_key: str | None, model: str | None, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self.url = url.rstrip("/")
        self.headers = headers
        self.timeout = timeout
        self.model = model or "default"

    def chat(self, messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
        r = self.http.post(
            "/v1/chat/completions", json={"model": self.model, "messages": messages, **kw}
        )
        r.raise_for_status()
        return dict(r.json())

    def stream_chat(
        self, messages: list[dict[str, Any]], **kw: Any
    ) -> tuple[str, float, dict[str, Any]]:
        body = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **kw,
        }
        start = time.perf_counter()
        ttft = -1.0
        parts: list[str] = []
        usage: dict[str, Any] = {}
        with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for c in chunk.get("choices", []):
                    piece = (c.get("delta") or {}).get("content") or ""
                    if piece and ttft < 0:
                        ttft = time.perf_counter() - start
                    parts.append(piece)
        return "".join(parts), ttft, usage


def check_basics(c: Client) -> Check:
    health = c.http.get("/health")
    models = c.http.get("/v1/models").json()
    ids = [m["id"] for m in models.get("data", [])]
    if ids and c.model == "default":
        c.model = ids[0]
    return Check(
        "health and models",
        health.status_code == 200 and bool(ids),
        f"/health {health.status_code}, models {ids}",
    )


def check_stream_equality(c: Client) -> Check:
    msgs = [{"role": "user", "content": "Name three primary colors."}]
    full = c.chat(msgs, temperature=0, max_tokens=48)["choices"][0]["message"]["content"] or ""
    streamed, _, _ = c.stream_chat(msgs, temperature=0, max_tokens=48)
    return Check(
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
    return Check(
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
    ok = any("ttft_ms" in r for r in rows)
    detail = "; ".join(
        f"{r.get('prompt_tokens', '?')} tok -> {r.get('ttft_ms', r.get('status'))} ms" for r in rows
    )
    return Check("TTFT vs context size", ok, detail, {"rows": rows})


def check_reasoning(c: Client) -> Check:
    msg = c.chat(
        [{"role": "user", "content": "Think step by step: what is 17 + 25?"}],
        max_tokens=128,
        temperature=0,
        chat_template_kwargs={"enable_thinking": True},
    )["choices"][0]["message"]
    reasoning = msg.get("reasoning_content") or ""
    return Check(
        "reasoning case",
        True,
        f"reasoning_content: {len(reasoning)} chars; "
        f"content: {len(msg.get('content') or '')} chars "
        "(a model without reasoning answers in content only)",
    )


def check_tools(c: Client) -> Check:
    tool = {
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
    r = c.chat(
        [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
        tools=[tool],
        max_tokens=96,
        temperature=0,
    )
    choice = r["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    valid = all(_is_json(tc["function"]["arguments"]) for tc in calls)
    names = [tc["function"]["name"] for tc in calls]
    return Check(
        "tool-call case",
        valid,
        f"finish_reason {choice['finish_reason']}, calls {names} (well-formed: {valid})",
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


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
    return Check(
        f"stress burst ({n} requests)",
        ok and health == 200,
        f"statuses {dict(sorted(counts.items()))}; /health after: {health}",
    )


def load_eval(path: Path) -> list[tuple[str, list[str], int]]:
    """MMLU-style rows: question, four choices, the answer (letter or 0-based index).
    CSV: question,A,B,C,D,answer (header optional); JSONL: {question, choices|A..D, answer}."""
    rows: list[tuple[str, list[str], int]] = []
    if path.suffix.lower() == ".jsonl":
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                obj = json.loads(line)
                choices = obj.get("choices") or [obj[k] for k in LETTERS]
                rows.append((obj["question"], [str(x) for x in choices], _answer(obj["answer"])))
        return rows
    with path.open(encoding="utf-8", newline="") as f:
        for rec in csv.reader(f):
            if len(rec) < 6 or rec[0].lower() == "question":
                continue
            rows.append((rec[0], rec[1:5], _answer(rec[5])))
    return rows


def _answer(value: Any) -> int:
    text = str(value).strip().upper()
    return LETTERS.index(text) if text in LETTERS else int(text)


def eval_prompt(question: str, choices: list[str]) -> str:
    lines = [question, *(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))]
    return "\n".join(lines) + "\nAnswer with the letter of the correct choice only."


async def _eval(c: Client, rows: list[tuple[str, list[str], int]], concurrency: int) -> list[bool]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=c.url, headers=c.headers, timeout=c.timeout) as ac:

        async def one(q: str, choices: list[str], gold: int) -> bool:
            body = {
                "model": c.model,
                "temperature": 0,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": eval_prompt(q, choices)}],
            }
            async with sem:
                r = await ac.post("/v1/chat/completions", json=body)
            text = (
                (r.json()["choices"][0]["message"]["content"] or "") if r.status_code == 200 else ""
            )
            m = re.search(r"\b([ABCD])\b", text.upper())
            return m is not None and LETTERS.index(m.group(1)) == gold

        return list(await asyncio.gather(*(one(*row) for row in rows)))


def check_eval(c: Client, path: Path, limit: int, concurrency: int) -> Check:
    rows = load_eval(path)[:limit]
    start = time.perf_counter()
    results = asyncio.run(_eval(c, rows, concurrency))
    acc = sum(results) / max(1, len(results))
    return Check(
        f"accuracy on {path.name}",
        bool(rows),
        f"{sum(results)}/{len(results)} = {acc:.1%} in {time.perf_counter() - start:.1f}s "
        f"(chance 25%)",
        {"accuracy": acc, "n": len(results)},
    )


def write_report(path: Path, url: str, checks: list[Check]) -> None:
    lines = [
        f"# Server check: {url}",
        "",
        f"{sum(c.ok for c in checks)}/{len(checks)} passed",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    lines += [f"| {c.name} | {'PASS' if c.ok else 'FAIL'} | {c.detail} |" for c in checks]
    lines += ["", "```json", json.dumps([c.__dict__ for c in checks], indent=1), "```", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="check_server", description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--output", default="server_check.md")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--ttft-sizes", default="16,128,512,1024", help="prompt sizes in words")
    p.add_argument("--burst", type=int, default=500)
    p.add_argument("--eval-file", default=None)
    p.add_argument("--eval-limit", type=int, default=100)
    p.add_argument("--eval-concurrency", type=int, default=32)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    c = Client(args.url, args.api_key, args.model, args.timeout)
    steps: list[Callable[[], Check]] = [
        lambda: check_basics(c),
        lambda: check_stream_equality(c),
        lambda: check_prefix_cache(c),
        lambda: check_ttft(c, [int(x) for x in args.ttft_sizes.split(",") if x]),
        lambda: check_reasoning(c),
        lambda: check_tools(c),
        lambda: check_burst(c, args.burst),
    ]
    if args.eval_file:
        steps.append(
            lambda: check_eval(c, Path(args.eval_file), args.eval_limit, args.eval_concurrency)
        )
    checks: list[Check] = []
    for step in steps:
        try:
            result = step()
        except Exception as exc:  # a failed check is reported, the others still run
            result = Check(
                getattr(step, "__name__", "check"), False, f"{type(exc).__name__}: {exc}"
            )
        checks.append(result)
        print(f"[{'PASS' if result.ok else 'FAIL'}] {result.name}: {result.detail}", flush=True)
    write_report(Path(args.output), args.url, checks)
    print(f"report: {args.output}")
    return 0 if all(c.ok for c in checks) else 1
