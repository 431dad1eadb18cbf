"""The Responses store the frontend processes share (`resin_app.shared_store`): what one
process stores another finds, an unknown id is the same 404 (`ApiError` crosses whole), and a
delete is seen by all."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from resin.server.errors import ApiError
from resin_app.shared_store import Address, connect, host

RESPONSE = {"id": "resp_1", "object": "response", "output": [{"type": "message", "id": "m"}]}


def _store_from_another_process(where: Address) -> None:
    connect(where).put(RESPONSE, [{"role": "user", "content": "hi"}])


def test_a_response_stored_by_one_process_is_found_by_another() -> None:
    where = host()
    child = mp.get_context("spawn").Process(target=_store_from_another_process, args=(where,))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    store = connect(where)
    found = store.get("resp_1")
    assert found.response == RESPONSE
    assert found.conversation == ({"role": "user", "content": "hi"}, *RESPONSE["output"])
    with pytest.raises(ApiError) as info:
        store.get("resp_unknown", "previous_response_id")
    assert (info.value.status, info.value.param) == (404, "previous_response_id")
    assert "resp_unknown" in info.value.message
    connect(where).delete("resp_1")  # another connection, as another frontend
    with pytest.raises(ApiError):
        store.get("resp_1")


def test_a_wrong_key_is_refused() -> None:
    where = host()
    with pytest.raises(mp.AuthenticationError):
        connect(Address(where.address, b"not the key"))
