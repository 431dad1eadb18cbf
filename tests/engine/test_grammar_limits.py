"""What one constraint may cost: compile limits, the compile cache, masks that fill off the
engine thread, logit biases built once. Real SmolLM2 tokenizer, real llguidance."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
import pytest

from resin import Constraint, Engine, GrammarBackend, SamplingParams
from resin.engine.grammar import GrammarLimits
from resin.tokenizer import Tokenizer
from resin_app.loading import ZeroCostRunner
from tests.engine.test_constraints import UniformAllowedRunner, params, run

AMBIGUOUS = 'start: e\ne: e "+" e | e e | "a" | "aa" | "b"'
"""An ambiguous grammar: every step's mask walks many Earley items (milliseconds a row)."""


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    from resin_model.default_model import default_model_dir

    try:
        return Tokenizer.from_dir(default_model_dir())
    except FileNotFoundError as exc:
        pytest.skip(f"default model unavailable: {exc}")


def backend_of(tokenizer: Tokenizer, **limits: Any) -> GrammarBackend:
    return GrammarBackend.from_tokenizer(tokenizer, GrammarLimits(**limits))


@pytest.mark.parametrize(
    "constraint",
    [
        Constraint("json_schema", '{"$ref": "#"}'),
        Constraint("grammar", "root ::= root"),
        Constraint("regex", "[^\\s\\S]"),
    ],
    ids=["self-ref schema", "root ::= root", "empty class"],
)
def test_unsatisfiable_constraints_are_refused_at_compile(
    tokenizer: Tokenizer, constraint: Constraint
) -> None:
    backend = backend_of(tokenizer)
    with pytest.raises(ValueError, match="unsatisfiable"):
        backend.compile(constraint)
    engine = Engine(UniformAllowedRunner(tokenizer.vocab_size), grammar=backend)
    with pytest.raises(ValueError, match="unsatisfiable"):
        engine.submit([1, 2, 3], params(tokenizer, constraint))
    assert not engine.has_work()


def test_a_grammar_beyond_the_limits_at_its_first_token_is_refused_at_compile(
    tokenizer: Tokenizer,
) -> None:
    # llguidance builds this matcher fine and only hits its per-step item limit when it
    # computes the first mask, i.e. at the first decode step: the compile computes it.
    schema = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(50)}}
    backend = backend_of(tokenizer, step_max_items=100)
    with pytest.raises(ValueError, match="cannot be enforced: parser error: Too many items"):
        backend.compile(Constraint.json_schema(schema))
    backend_of(tokenizer).compile(Constraint.json_schema(schema))  # the default limits allow it


def test_spec_size_limit_names_the_limit(tokenizer: Tokenizer) -> None:
    backend = backend_of(tokenizer, max_spec_bytes=1000)
    big = Constraint("regex", "a" * 1001)
    with pytest.raises(ValueError, match="1001 bytes, the limit is 1000 \\(max_spec_bytes\\)"):
        backend.compile(big)


def test_failed_compiles_are_cached(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = backend_of(tokenizer)
    bad = Constraint("json_schema", '{"$ref": "#"}')
    with pytest.raises(ValueError) as first:
        backend.compile(bad)
    compiled: list[Constraint] = []
    real = backend._compile
    monkeypatch.setattr(backend, "_compile", lambda c: compiled.append(c) or real(c))
    for _ in range(3):
        with pytest.raises(ValueError) as again:
            backend.compile(bad)
        assert str(again.value) == str(first.value)
    with pytest.raises(ValueError):
        backend.prepare(bad).result(1)
    assert compiled == []  # never compiled again


def test_compile_cache_is_bounded_in_bytes(tokenizer: Tokenizer) -> None:
    limit = 4 << 20
    backend = backend_of(tokenizer, cache_bytes=limit)
    for i in range(40):
        choices = " | ".join(json.dumps(f"item {i} {j}") for j in range(2000))
        backend.compile(Constraint("grammar", f"start: CHOICE\nCHOICE: {choices}"))
        assert backend.cached_bytes <= limit
    assert backend.cached_bytes > 0
    hit = Constraint("grammar", 'start: "x"')
    backend.compile(hit)
    assert backend.compile(hit) is backend.compile(hit)  # a hit is the same compiled grammar


def test_prepare_compiles_off_the_calling_thread_and_engine_submit_does_not_compile(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = backend_of(tokenizer)
    threads: list[str] = []
    real = backend._compile
    monkeypatch.setattr(
        backend, "_compile", lambda c: threads.append(threading.current_thread().name) or real(c)
    )
    choice = Constraint("grammar", 'start: "yes" | "no"')
    compiled = backend.prepare(choice).result(30)
    assert threads and all(name.startswith("resin-grammar") for name in threads)
    engine = Engine(UniformAllowedRunner(tokenizer.vocab_size), grammar=backend)
    request = engine.submit([1, 2, 3], params(tokenizer, choice), grammar=compiled.state())
    run(engine)
    assert len(threads) == 1  # the engine used the prepared state
    assert tokenizer.decode(request.take_result(), True) in ("yes", "no")


def test_concurrent_prepares_of_one_constraint_share_one_compile(tokenizer: Tokenizer) -> None:
    backend = backend_of(tokenizer)
    choices = " | ".join(json.dumps(f"option {j}") for j in range(20000))
    c = Constraint("grammar", f"start: CHOICE\nCHOICE: {choices}")
    futures = [backend.prepare(c) for _ in range(5)]
    assert len({id(f) for f in futures}) == 1
    assert futures[0].result(60).state() is not None


def test_logit_bias_arrays_are_built_once_per_request(tokenizer: Tokenizer) -> None:
    """The bias pairs are read at admission only; each step concatenates numpy arrays."""

    class CountingPairs(tuple):  # type: ignore[type-arg]
        reads = 0

        def __iter__(self):  # type: ignore[no-untyped-def]
            CountingPairs.reads += 1
            return super().__iter__()

    runner = UniformAllowedRunner(tokenizer.vocab_size)
    engine = Engine(runner, grammar=backend_of(tokenizer))
    bias = {t: -5.0 for t in range(0, 3000, 10)}
    requests = []
    for i in range(4):
        p = SamplingParams(max_output_tokens=20, logit_bias=bias, ignore_stop_tokens=True)
        object.__setattr__(p, "logit_bias", CountingPairs(p.logit_bias))
        requests.append(engine.submit([1, 2, 3 + i], p))
    reads_at_submit = CountingPairs.reads
    run(engine)
    assert CountingPairs.reads == reads_at_submit  # 20 steps, not one read more
    plan = runner.plans[-1]
    assert plan.sampling.bias_ids.size == 4 * len(bias)
    assert np.all(plan.sampling.bias_values == -5.0)
    assert all(len(r.take_result()) == 20 for r in requests)


def test_slow_masks_do_not_hold_back_unconstrained_rows(tokenizer: Tokenizer) -> None:
    """A runner that cannot wait for masks: the ambiguous grammar's masks fill off the
    engine thread and its request sits out the steps they are not ready for, so a plain
    request runs ahead instead of at the constrained request's pace (they used to advance in
    lockstep, one token each per step)."""
    runner = ZeroCostRunner(tokenizer.vocab_size, tokenizer.encode("a", False)[0])
    engine = Engine(runner, grammar=backend_of(tokenizer), max_sequences=64)
    slow = [
        engine.submit([1, 2, i], params(tokenizer, Constraint("grammar", AMBIGUOUS),
                                        max_output_tokens=400, ignore_stop_tokens=True))
        for i in range(8)
    ]  # fmt: skip
    plain = engine.submit([1, 2, 99], SamplingParams(max_output_tokens=200))
    deadline = time.monotonic() + 120
    while not plain.finished and time.monotonic() < deadline:
        engine.step()
    assert plain.finished and len(plain.output_token_ids) == 200
    behind = max(len(r.output_token_ids) for r in slow)
    assert behind < 150, behind  # the plain request was not paced by the grammar's masks
    for r in slow:
        engine.abort(r)
    run(engine)


def test_an_llguidance_older_than_1_9_is_named_not_a_type_error(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llguidance 1.6 (what an unpinned download for an older platform tag gets) takes one EOS
    # id: its constructor raises this TypeError for our list; the server printed only that.
    import llguidance

    def old_constructor(tokenizer_json: str, eos_token: int) -> None:
        raise TypeError("argument 'eos_token': 'list' object cannot be interpreted as an integer")

    monkeypatch.setattr(llguidance, "LLTokenizer", old_constructor)
    with pytest.raises(RuntimeError, match=r"needs llguidance>=1\.9,<2"):
        backend_of(tokenizer)
