"""Suite-wide settings. With RESIN_STRICT_SKIPS=1 (set by .ci/run) a skipped test fails unless
it skipped for want of a GPU: CI installs everything else the tests need (Chromium, Triton,
the packaged models), so a skip there would hide a missing install step."""

from __future__ import annotations

import os
import re

import pytest

ALLOWED_SKIPS = re.compile(r"CUDA|GPU", re.IGNORECASE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("RESIN_STRICT_SKIPS") != "1" or not report.skipped:
        return
    reason = (
        str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    )
    if not ALLOWED_SKIPS.search(reason):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (RESIN_STRICT_SKIPS=1): {reason}"
