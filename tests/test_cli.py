"""The command line: `resin bench TOOL` runs one benchmark by name (no guessing from its
options), `resin check` and `resin serve` refuse bad options with argparse's exit status."""

from __future__ import annotations

import pytest

from resin_app.cli import main


def _help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_bench_runner_is_the_runner_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help_of(["bench", "runner", "--random-weights", "--help"], capsys)
    assert "--model-config" in out and "--batch-sizes" in out and "--moe-gemv-max-pairs" in out


def test_bench_serve_is_the_server_load_generator(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help_of(["bench", "serve", "--help"], capsys)
    assert "--max-concurrency" in out and "--request-rate" in out


def test_every_bench_tool_answers_help_under_its_own_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from resin_app.bench import TOOLS

    assert main(["bench", "--help"]) == 0
    listing = capsys.readouterr().out
    for name in TOOLS:
        assert f"  {name} " in listing
        assert f"usage: resin bench {name} " in _help_of(["bench", name, "--help"], capsys), name


def test_bench_refuses_a_missing_or_unknown_tool(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench"]) == 2
    assert main(["bench", "--url", "http://127.0.0.1:1"]) == 2  # options never pick a tool
    err = capsys.readouterr().err
    assert "unknown tool '--url'" in err and "speculative-copy" in err


def test_check_help_shows_the_checkers_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["check", "--help"], ["check", "--", "--help"]):
        out = _help_of(argv, capsys)
        assert "--expect-tools" in out and "--burst" in out and "url" in out, argv


def test_check_refuses_an_argument_that_is_no_url(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "--", "--", "--help"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "expected a server URL" in err and "'--help'" in err


def test_serve_refuses_an_unknown_recipe_listing_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--recipe qwen-three-typo` used to serve silently with a plain template."""
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--recipe", "qwen-three-typo", "--port", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown recipe 'qwen-three-typo'" in err
    assert "qwen3" in err and "chatml" in err and "jinja" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--speculative", "draft"], "--speculative draft needs --draft-model"),
        (["--draft-model", "x"], "--draft-model needs --speculative draft"),
        (["--fake-runner", "--speculative", "ngram"], "max_draft_tokens is 0"),
        (["--fake-runner", "--tensor-parallel", "2"], "--fake-runner has none"),
        (["--data-parallel", "0"], "must be >= 1"),
        (["--graph-prefill-tokens", "-1"], "expected a count >= 0, got -1"),
    ],
)
def test_serve_refuses_options_it_cannot_do(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", *argv, "--api-server-count", "0", "--port", "1"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_tp_is_the_tensor_parallel_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help_of(["bench", "tp", "--tensor-parallel", "2", "--help"], capsys)
    assert "--preset" in out and "--expert-parallel" in out and "--skip-single" in out
    assert "--replicated-attention" in out


def test_bench_tp_quantizes_only_the_fast_runner(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tp", "--tensor-parallel", "2", "--quantize", "mxfp4"]) == 2
    assert "--quantize needs --runner cuda" in capsys.readouterr().err
    assert main(["bench", "tp", "--tensor-parallel", "2", "--replicated-attention"]) == 2
    assert "--replicated-attention needs --runner cuda" in capsys.readouterr().err


def test_serve_admits_at_least_a_full_batch_by_default() -> None:
    """`--max-active` below the engine's row cap made admission, not the scheduler, set the
    batch: 128 inside held the zero-cost runner to 78k output tok/s at 1,024 streams on the
    H200. The default admits every runner's default batch, and the replay bench admits as
    `resin serve` does."""
    from resin_app.bench.replay import parser as replay_parser
    from resin_app.cli import _build_parser
    from resin_app.loading import ENGINE_MAX_SEQUENCES, ZERO_COST_MAX_SEQUENCES

    serve = _build_parser().parse_args(["serve"])
    assert serve.max_active >= max(ENGINE_MAX_SEQUENCES, ZERO_COST_MAX_SEQUENCES)
    replay = replay_parser().parse_args(["--workload", "w.jsonl", "--fake-runner"])
    assert replay.max_active == serve.max_active
