"""`resin bench` routes to the runner benchmark, or to the server load generator given --url."""

from __future__ import annotations

import pytest

from resin.cli import main


def _help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_bench_without_url_is_the_runner_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help_of(["bench", "--random-weights", "--help"], capsys)
    assert "--model-config" in out and "--batch-sizes" in out and "--moe-gemv-max-pairs" in out


def test_bench_with_url_is_the_server_load_generator(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help_of(["bench", "--url", "http://127.0.0.1:1", "--help"], capsys)
    assert "--max-concurrency" in out and "--request-rate" in out
