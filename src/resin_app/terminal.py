"""`resin chat`: a terminal chat against a server's streaming chat completions.

Ctrl-C while a reply streams stops that reply (the stream is closed, so the server aborts the
request; what arrived stays in the conversation); Ctrl-C at the prompt quits."""

from __future__ import annotations

import json
import time

import httpx


def chat_loop(
    url: str,
    api_key: str | None,
    max_tokens: int,
    system: str | None,
    temperature: float | None = None,
) -> int:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    sampling = {} if temperature is None else {"temperature": temperature}
    print(
        f"resin chat ({url}); empty line, Ctrl-D or Ctrl-C to quit, Ctrl-C in a reply stops "
        "it, /reset to start over"
    )
    while True:
        try:
            line = input("\nyou> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line:
            return 0
        if line == "/reset":
            messages = messages[:1] if system else []
            continue
        messages.append({"role": "user", "content": line})
        parts: list[str] = []
        try:
            _stream_reply(url, headers, messages, max_tokens, sampling, parts)
        except KeyboardInterrupt:  # leaving the `with` closed the stream: the server aborts
            print("\n  [stopped]")
        messages.append({"role": "assistant", "content": "".join(parts)})


def _stream_reply(
    url: str,
    headers: dict[str, str],
    messages: list[dict[str, str]],
    max_tokens: int,
    sampling: dict[str, float],
    parts: list[str],
) -> None:
    """Print the reply as it streams, its pieces appended to `parts` as they arrive."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling,
    }
    usage: dict[str, int] = {}
    start = time.perf_counter()
    first: float | None = None
    print("bot> ", end="", flush=True)
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=None
    ) as r:
        if r.status_code != 200:
            r.read()
            print(f"[error {r.status_code}] {r.text}")
            return
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content") or ""
                if text and first is None:
                    first = time.perf_counter()
                parts.append(text)
                print(text, end="", flush=True)
    end = time.perf_counter()
    elapsed = end - start
    out = usage.get("completion_tokens", 0)
    rate = out / (end - first) if first is not None and end > first else 0.0
    print(
        f"\n  [{usage.get('prompt_tokens', 0)} prompt, {out} generated, {elapsed:.2f}s, "
        f"{rate:.1f} tok/s]"
    )
