"""Runner families through their entry points: the two in-tree ones as installed by pip, and a
third-party one plugged in the same way (a real `.dist-info` folder on `sys.path`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from resin import Engine, SamplingParams, TokensEvent
from resin.protocols import Runner
from resin_app.runners import (
    build_runner,
    families_serving,
    family_names,
    installed_families,
    runner_family,
)
from resin_model.config import ModelConfig
from resin_model.family import BuildRequest
from resin_model.hf_config import parse_config
from resin_model.presets import TINY


def _greedy(runner: Runner, prompt: list[int], n: int = 6) -> list[int]:
    params = SamplingParams(max_output_tokens=n, temperature=0.0, ignore_stop_tokens=True)
    with Engine(runner, context_length=64) as engine:
        request = engine.submit(prompt, params)
        out: list[int] = []
        while engine.has_work():
            for event in engine.step():
                if isinstance(event, TokensEvent) and event.request_id == request.id:
                    out += event.token_ids
    return out


def test_the_in_tree_families_are_installed_entry_points() -> None:
    assert {"torch", "cuda"} <= set(family_names())
    installed = installed_families()
    assert installed.broken == {}
    torch_family, cuda_family = installed.families["torch"], installed.families["cuda"]
    assert torch_family.name == "torch" and cuda_family.name == "cuda"
    assert cuda_family.architectures < torch_family.architectures  # every fast one has a reference
    assert [f.name for f in families_serving("llama")] == ["cuda", "torch"]
    assert [f.name for f in families_serving("lfm2")] == ["torch"]
    assert families_serving("no_such_model") == []


def test_every_registered_architecture_resolves_to_a_class() -> None:
    from resin_models_cuda.architectures import ARCHITECTURES as FAST
    from resin_models_cuda.architectures import fast_model
    from resin_models_torch.architectures import ARCHITECTURES as REFERENCE
    from resin_models_torch.architectures import reference_model

    assert all(isinstance(reference_model(t), type) for t in REFERENCE)
    assert all(isinstance(fast_model(t), type) for t in FAST)
    assert runner_family("torch").architectures == frozenset(REFERENCE)
    assert runner_family("cuda").architectures == frozenset(FAST)


def test_the_torch_family_builds_the_reference_runner() -> None:
    from resin_models_torch.registry import random_runner

    config = parse_config(TINY["llama"])
    built = build_runner(config, "torch", BuildRequest(seed=3))
    assert _greedy(built, [1, 2, 3, 4]) == _greedy(random_runner(config, seed=3), [1, 2, 3, 4])


def test_a_family_that_does_not_serve_the_model_is_refused_naming_one_that_does() -> None:
    lfm2 = parse_config(
        {**TINY["llama"], "model_type": "lfm2", "layer_types": ["conv", "full_attention"]}
    )
    with pytest.raises(ValueError, match="'cuda' does not serve model_type 'lfm2'; torch does"):
        build_runner(lfm2, "cuda")
    with pytest.raises(ValueError, match=r"no runner family 'nope'; installed: .*torch"):
        build_runner(lfm2, "nope")


ECHO_FAMILY = '''
import numpy as np
from resin.plan import ForwardOutput
from resin.protocols import RunnerConfig
from resin_model.family import RunnerFamily


class EchoRunner:
    """Answers `token` for every sampling row."""

    def __init__(self, vocab_size, token):
        self.runner_config = RunnerConfig(vocab_size=vocab_size, page_size=16)
        self.token = token

    def forward(self, plan):
        rows = np.asarray(plan.sample_rows, dtype=bool)
        indptr = np.concatenate([[0], np.cumsum(rows)]).astype(np.uint32)
        n = int(indptr[-1])
        return ForwardOutput(np.full(n, self.token, dtype=np.uint32), indptr)


FAMILY = RunnerFamily("echo", frozenset({"llama"}), lambda source, request: EchoRunner(
    source.vocab_size, 7 + request.seed), "third-party test family")
NOT_A_FAMILY = object()
'''


def _install(root: Path, entry_points: str) -> None:
    (root / "echo_runners.py").write_text(ECHO_FAMILY)
    info = root / "echo_runners-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-runners\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_a_third_party_family_plugs_in_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(
        tmp_path,
        """
        [resin.runners]
        echo = echo_runners:FAMILY
        missing = echo_runners_gone:FAMILY
        wrong = echo_runners:NOT_A_FAMILY
        misnamed = echo_runners:FAMILY
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = installed_families()
    assert {"echo", "torch", "cuda"} <= set(installed.families)
    assert set(installed.broken) == {"missing", "wrong", "misnamed"}
    assert "echo_runners_gone" in installed.broken["missing"]
    assert "not a RunnerFamily" in installed.broken["wrong"]
    assert "its entry point 'misnamed'" in installed.broken["misnamed"]
    assert [f.name for f in families_serving("llama")] == ["cuda", "echo", "torch"]
    config: ModelConfig = parse_config(TINY["llama"])
    assert _greedy(build_runner(config, "echo", BuildRequest(seed=2)), [5, 6]) == [9] * 6
    with pytest.raises(ValueError, match=r"'missing' .* does not load"):
        runner_family("missing")
