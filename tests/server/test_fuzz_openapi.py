"""Schemathesis walks every route of the app's OpenAPI schema: no input may cause a 5xx.

(Driven through hypothesis directly: schemathesis' pytest plugin does not load with this
pytest version.)"""

from __future__ import annotations

import time

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings

from resin.server.launch import running
from tests.server.conftest import make_server

ENGINE_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages")


def test_no_server_errors_on_any_route() -> None:
    # The real engine (zero-cost runner): its validation is what clients meet. A 512-token
    # context: a request that names no max_tokens runs to the context's end, and at 4,096 those
    # answers were 4/5 of the test's time (136 s of 170) for the same status classes per route.
    from tests.server.test_lifecycle import real_engine

    engine = real_engine(context_length=512)
    with running(make_server(engine)) as base:  # type: ignore[arg-type]
        schema = schemathesis.openapi.from_url(base + "/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 7
        statuses: dict[str, set[int]] = {}
        for op in operations:

            @settings(
                # The engine routes take more examples: their bodies have many optional
                # fields, each a chance of a 400, and some must still get through (below).
                max_examples=40 if op.path in ENGINE_ROUTES else 20,
                derandomize=True,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=op.as_strategy())
            def check(case: schemathesis.Case) -> None:
                response = case.call(timeout=30)
                assert response.status_code < 500, (case.path, case.body, response.text[:300])
                statuses.setdefault(case.path, set()).add(response.status_code)

            check()
        # Valid requests got through to the engine too, not only validation errors.
        for path in ENGINE_ROUTES:
            assert 200 in statuses.get(path, set()), (path, statuses.get(path))
        # Every error class above released its intake slots.
        deadline = time.monotonic() + 5
        while httpx.get(base + "/health").json()["queued"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(base + "/health").json()["queued"] == 0
