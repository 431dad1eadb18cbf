"""`submit` rejects bad input with a clear ValueError and queues nothing."""

from __future__ import annotations

import numpy as np
import pytest

from resin import Constraint, Engine, EngineDeadError, SamplingParams
from resin.plan import MediaItem
from resin.protocols import OPTIONAL_FEATURES, RunnerConfig, requested_features
from tests.engine.fakes import CacheSimRunner, ZeroRunner


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "empty"),
        ([1] * 16, "context length"),
        ([1] * 20, "context length"),
        ([-1, 2], ">= 0"),
        ([1, 1000], "vocabulary"),
        ([1.5, 2], "ints"),
        ([[1, 2]], "flat"),
        ("hello", "not text"),
        ([True, False], "ints"),
    ],
)
def test_bad_prompts_raise_and_queue_nothing(prompt: object, message: str) -> None:
    engine = Engine(CacheSimRunner(), context_length=16)
    with pytest.raises(ValueError, match=message):
        engine.submit(prompt)  # type: ignore[arg-type]
    assert engine.num_waiting == 0 and not engine.has_work()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_output_tokens": 0},
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"min_p": 2.0},
        {"logprobs": 21},
        {"seed": -1},
        {"temperature": float("nan")},
        {"top_k": 26134419042},  # found by the server's fuzz run: overflowed the int32 plan
        {"max_output_tokens": 2**40},
        {"stop_token_ids": [2**32]},
    ],
)
def test_bad_sampling_params_raise(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_prompt_that_cannot_fit_the_cache_is_rejected() -> None:
    engine = Engine(CacheSimRunner(page_size=4, num_pages=2), context_length=64)
    with pytest.raises(ValueError, match="cache pages"):
        engine.submit(list(range(12)))
    assert not engine.has_work()


def test_duplicate_request_id_and_closed_engine() -> None:
    engine = Engine(ZeroRunner())
    engine.submit([1, 2], request_id=7)
    with pytest.raises(ValueError, match="in use"):
        engine.submit([1, 2], request_id=7)
    assert engine.num_waiting == 1
    engine.close()
    with pytest.raises(EngineDeadError):
        engine.submit([1, 2])
    assert [type(e).__name__ for e in engine.step()] == ["FinishedEvent"]


def test_no_vocab_declared_accepts_any_non_negative_id() -> None:
    engine = Engine(ZeroRunner())
    request = engine.submit([10**6], SamplingParams(max_output_tokens=2))
    while engine.has_work():
        engine.step()
    assert request.take_result() == [0, 0]
    assert engine.runner_config.vocab_size is None and engine.context_length == 32768


def test_a_runner_without_forward_or_submit_collect_is_refused() -> None:
    with pytest.raises(TypeError, match="forward"):
        Engine(object())  # type: ignore[arg-type]


class _Lacking(ZeroRunner):
    """A one-method runner that declares only some optional features."""

    def __init__(self, features: frozenset[str]) -> None:
        self.runner_config = RunnerConfig(features=features)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"logprobs": 0}, "logprobs"),
        ({"prompt_logprobs": 2}, "prompt_logprobs"),
        ({"logit_bias": {3: 1.0}}, "logit_bias"),
        ({"constraint": Constraint("regex", "a+")}, "constraint"),
        ({"seed": 7}, "seed"),
        ({"top_k": 5}, "top_k"),
        ({"top_p": 0.9}, "top_p"),
        ({"min_p": 0.1}, "min_p"),
    ],
)
def test_a_feature_the_runner_lacks_is_refused_by_name(
    kwargs: dict[str, object], field: str
) -> None:
    params = SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert requested_features(params) == {field}
    engine = Engine(_Lacking(OPTIONAL_FEATURES - {field}))
    with pytest.raises(ValueError, match=f"does not support {field}"):
        engine.submit([1, 2], params)
    assert engine.num_waiting == 0 and not engine.has_work()
    engine.submit([1, 2], SamplingParams(max_output_tokens=1))  # plain requests still run
    RunnerConfig(features=frozenset({field})).check_request(params)  # declared: accepted


def test_feature_refusals_list_every_missing_field_and_images() -> None:
    engine = Engine(_Lacking(frozenset({"seed"})))
    params = SamplingParams(seed=1, top_k=3, logit_bias=((1, 2.0),), temperature=0.0)
    with pytest.raises(ValueError, match=r"does not support logit_bias, top_k$"):
        engine.submit([1, 2], params)
    image = MediaItem(0, 1, 2, "x", np.zeros((3, 4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"media \(images\)"):
        engine.submit([1, 2, 3, 4], media=[image])
    assert requested_features(SamplingParams()) == frozenset()
    assert requested_features(SamplingParams(), has_media=True) == {"media"}
    with pytest.raises(ValueError, match="unknown runner features"):
        RunnerConfig(features=frozenset({"logit_bais"}))
