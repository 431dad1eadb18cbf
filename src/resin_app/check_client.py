"""The pieces every `resin check` case shares: the HTTP client, the verdict type and the
model's declared capabilities."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

Status = Literal["PASS", "FAIL", "SKIP"]


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"


def verdict(name: str, passed: bool, detail: str, data: dict[str, Any] | None = None) -> Check:
    return Check(name, "PASS" if passed else "FAIL", detail, data or {})


@dataclass(frozen=True)
class Capabilities:
    """What the served model's recipe can do; None = unknown (the server did not say)."""

    tools: bool | None = None
    reasoning: bool | None = None


class Client:
    def __init__(self, url: str, api_key: str | None, model: str | None, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self.url = url.rstrip("/")
        self.headers = headers
        self.timeout = timeout
        self.model = model or "default"
        self.capabilities = Capabilities()

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
