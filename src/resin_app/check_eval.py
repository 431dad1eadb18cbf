"""`resin check --eval-file`: accuracy on a local MMLU-style CSV/JSONL file."""

from __future__ import annotations

import asyncio
import csv
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx

from resin_app.check_client import Check, Client, verdict

LETTERS = "ABCD"


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


async def _eval(
    c: Client, rows: list[tuple[str, list[str], int]], concurrency: int
) -> list[bool | None]:
    """Per question: answered right, wrong, or None when the request failed."""
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=c.url, headers=c.headers, timeout=c.timeout) as ac:

        async def one(q: str, choices: list[str], gold: int) -> bool | None:
            body = {
                "model": c.model,
                "temperature": 0,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": eval_prompt(q, choices)}],
            }
            async with sem:
                r = await ac.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                return None
            text = r.json()["choices"][0]["message"]["content"] or ""
            m = re.search(r"\b([ABCD])\b", text.upper())
            return m is not None and LETTERS.index(m.group(1)) == gold

        return list(await asyncio.gather(*(one(*row) for row in rows)))


def check_eval(c: Client, path: Path, limit: int, concurrency: int) -> Check:
    rows = load_eval(path)[:limit]
    start = time.perf_counter()
    results = asyncio.run(_eval(c, rows, concurrency))
    right = sum(r is True for r in results)
    failed = sum(r is None for r in results)
    acc = right / max(1, len(results))
    # Accuracy is measured, not judged (a small model may score below chance); a question
    # the server did not answer is a failure of the server.
    return verdict(
        f"accuracy on {path.name}",
        bool(rows) and not failed,
        f"{right}/{len(results)} = {acc:.1%} in {time.perf_counter() - start:.1f}s "
        f"(chance 25%)" + (f"; {failed} requests failed" if failed else ""),
        {"accuracy": acc, "n": len(results), "failed": failed},
    )
