"""The Responses store is bounded in bytes as well as in entries."""

from __future__ import annotations

import pytest

from resin.server.errors import ApiError
from resin.server.response_store import ResponseStore


def response(rid: str, text: str) -> dict[str, object]:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text",
            "text": text}]}  # fmt: skip
    return {"id": rid, "object": "response", "output": [item], "metadata": {"k": "v"}}


def _has(store: ResponseStore, rid: str) -> bool:
    try:
        store.get(rid)
    except ApiError:
        return False
    return True


def test_the_store_keeps_at_most_max_bytes_of_json() -> None:
    store = ResponseStore(capacity=1024, max_bytes=3_000_000)
    big = "x" * 400_000  # each entry: its input and output, ~0.8 MB with the conversation
    for i in range(20):
        store.put(response(f"r{i}", big), [{"type": "message", "role": "user", "content": big}])
        assert store.nbytes <= store.max_bytes
    kept = [i for i in range(20) if _has(store, f"r{i}")]
    assert kept and kept == list(range(kept[0], 20)) and len(kept) < 20  # the newest
    latest = store.get("r19")
    assert latest.response["output"][0]["content"][0]["text"] == big
    assert [i["role"] for i in latest.conversation] == ["user", "assistant"]
    with pytest.raises(ApiError) as info:
        store.get("r0")
    assert info.value.status == 404


def test_an_entry_larger_than_the_store_is_not_kept_and_evicts_nothing() -> None:
    store = ResponseStore(max_bytes=10_000)
    store.put(response("small", "hi"), [])
    store.put(response("huge", "x" * 20_000), [])
    assert store.get("small").response["id"] == "small"
    with pytest.raises(ApiError):
        store.get("huge")


def test_count_bound_and_delete_keep_the_byte_count_exact() -> None:
    store = ResponseStore(capacity=2)
    for i in range(5):
        store.put(response(f"r{i}", "t" * i), [])
    assert [i for i in range(5) if _has(store, f"r{i}")] == [3, 4]
    expected = store.get("r3").nbytes + store.get("r4").nbytes
    assert store.nbytes == expected
    store.delete("r3")
    assert store.nbytes == store.get("r4").nbytes
