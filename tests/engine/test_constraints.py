"""Constrained decoding in the engine, with the real SmolLM2 tokenizer and llguidance.

The fake runner samples *uniformly among the tokens the plan's bitmask allows* (any token
when the row has no mask), so every output that parses proves the engine built, carried and
advanced the mask correctly; a runner that ignores the mask shows what happens without it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jsonschema
import numpy as np
import pytest

from resin import (
    BatchPlan,
    Constraint,
    Engine,
    FinishedEvent,
    FinishReason,
    ForwardOutput,
    GrammarBackend,
    RunnerConfig,
    SamplingParams,
)
from resin.engine.grammar import GrammarState
from resin.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "color": {"enum": ["red", "green", "blue"]},
        "tag": {"type": "string", "maxLength": 4},
        "xs": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
               "maxItems": 3},
    },
    "required": ["ok", "n", "color", "tag", "xs"],
    "additionalProperties": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    from resin_model.default_model import default_model_dir

    try:
        return Tokenizer.from_dir(default_model_dir())
    except FileNotFoundError as exc:
        pytest.skip(f"default model unavailable: {exc}")


@pytest.fixture(scope="module")
def backend(tokenizer: Tokenizer) -> GrammarBackend:
    return GrammarBackend.from_tokenizer(tokenizer)


def allowed(mask_row: np.ndarray, vocab: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask_row.view(np.uint8), bitorder="little")[:vocab])


class UniformAllowedRunner:
    """Samples uniformly among the allowed tokens of each sampling row; records the plans."""

    def __init__(
        self,
        vocab: int,
        num_pages: int = 2048,
        seed: int = 0,
        obey: bool = True,
        waits: bool = False,
    ) -> None:
        self.runner_config = RunnerConfig(
            vocab_size=vocab, page_size=16, num_pages=num_pages, waits_for_masks=waits
        )
        self.vocab = vocab
        self.rng = np.random.default_rng(seed)
        self.obey = obey
        self.plans: list[BatchPlan] = []

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        self.plans.append(plan)
        if self.runner_config.waits_for_masks:
            mask = plan.sampling.bitmask()  # the engine may still be filling it
        else:
            assert plan.sampling.mask_pending is None
            mask = plan.sampling.token_bitmask
        out = []
        for i in np.flatnonzero(plan.sample_rows):
            if mask is None or not self.obey:
                out.append(int(self.rng.integers(0, self.vocab)))
            else:
                out.append(int(self.rng.choice(allowed(mask[i], self.vocab))))
        indptr = np.zeros(plan.num_sequences + 1, dtype=np.uint32)
        indptr[1:] = np.cumsum(plan.sample_rows)
        return ForwardOutput(np.asarray(out, dtype=np.uint32), indptr)


def run(engine: Engine) -> None:
    while engine.has_work():
        engine.step()
        engine.check_invariants()


def params(tokenizer: Tokenizer, constraint: Constraint | None, **kw: object) -> SamplingParams:
    return SamplingParams(
        max_output_tokens=kw.pop("max_output_tokens", 80),  # type: ignore[arg-type]
        stop_token_ids=tokenizer.eos_token_ids,
        constraint=constraint,
        **kw,  # type: ignore[arg-type]
    )


# -- GrammarState / GrammarBackend --------------------------------------------------------------
def test_state_mask_advance_rollback(tokenizer: Tokenizer, backend: GrammarBackend) -> None:
    state = backend.state(Constraint("regex", "(yes|no)!"))
    mask = np.zeros((1, backend.mask_words), dtype=np.int32)
    state.fill_mask(mask[0])
    first = {tokenizer.decode([int(t)]) for t in allowed(mask[0], backend.vocab_size)}
    assert first and all("yes!".startswith(s) or "no!".startswith(s) for s in first)
    yes = tokenizer.encode("yes")
    assert state.sync(yes) and state.consumed == len(yes) and not state.stopped
    state.fill_mask(mask[0])
    assert [tokenizer.decode([int(t)]) for t in allowed(mask[0], backend.vocab_size)] == ["!"]
    state.rollback(len(yes))
    assert state.consumed == 0
    no_bang = tokenizer.encode("no!")
    assert state.sync(no_bang) and state.stopped and state.accepting
    assert state.sync(no_bang[:-1]) and not state.stopped  # a shorter list rolls back
    with pytest.raises(ValueError, match="cannot roll back"):
        state.rollback(99)


def test_state_rejects_forbidden_token(tokenizer: Tokenizer, backend: GrammarBackend) -> None:
    state = backend.state(Constraint("regex", "yes"))
    assert not state.sync(tokenizer.encode("no"))
    assert state.error is not None and "violates the constraint" in state.error
    assert not state.sync([])  # failed for good


def test_compile_cache_is_keyed_by_spec(backend: GrammarBackend) -> None:
    a = backend.state(Constraint.json_schema(SCHEMA))
    b = backend.state(Constraint.json_schema(SCHEMA))
    assert isinstance(a, GrammarState) and a.matcher is not b.matcher  # one matcher each
    assert Constraint.json_schema(SCHEMA) in backend._cache
    assert len([c for c in backend._cache if c.kind == "json_schema" and "ok" in c.spec]) == 1


@pytest.mark.parametrize(
    ("constraint", "needle"),
    [
        (Constraint.json_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
        (Constraint.json_schema({"type": "string", "pattern": "a(?=b)"}), "look-around"),
        (Constraint.json_schema({"type": "wat"}), "Invalid type"),
        (Constraint("regex", "a("), "unclosed group"),
        (Constraint("grammar", "start: foo"), "unknown name"),
        (Constraint("structural_tag", '{"structures": []}'), "non-empty list"),
    ],
)
def test_unenforceable_specs_are_refused_at_submit(
    tokenizer: Tokenizer, backend: GrammarBackend, constraint: Constraint, needle: str
) -> None:
    with Engine(UniformAllowedRunner(tokenizer.vocab_size), grammar=backend) as engine:
        with pytest.raises(ValueError, match=needle) as info:
            engine.submit([1, 2, 3], params(tokenizer, constraint))
        assert str(info.value).startswith(f"constraint {constraint.kind}")
        assert engine.num_waiting == 0


def test_malformed_constraints_fail_in_params() -> None:
    with pytest.raises(ValueError, match="json_schema is not valid JSON"):
        Constraint("json_schema", "{nope")
    with pytest.raises(ValueError, match="kind must be one of"):
        Constraint("yaml", "")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="regex must not be empty"):
        Constraint("regex", "")


def test_constraint_without_backend_and_bias_range(tokenizer: Tokenizer) -> None:
    with Engine(UniformAllowedRunner(1000)) as engine:
        with pytest.raises(ValueError, match="needs an engine with a grammar backend"):
            engine.submit([1], SamplingParams(constraint=Constraint("json_object")))
        with pytest.raises(ValueError, match="logit_bias token id 1000 is outside"):
            engine.submit([1], SamplingParams(logit_bias={1000: 1.0}))
    with pytest.raises(ValueError, match=r"logit_bias\[3\] must be a number in \[-100, 100\]"):
        SamplingParams(logit_bias={3: 101})
    with pytest.raises(ValueError, match="appears twice"):
        SamplingParams(logit_bias=[(3, 1.0), (3, 2.0)])
    assert SamplingParams(logit_bias={"7": 1, 2: -1}).logit_bias == ((2, -1.0), (7, 1.0))


# -- the engine ---------------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [False, True])
def test_uniform_sampler_within_the_mask_always_validates(
    tokenizer: Tokenizer, backend: GrammarBackend, overlap: bool
) -> None:
    runner = UniformAllowedRunner(tokenizer.vocab_size, waits=overlap)
    with Engine(runner, grammar=backend) as engine:
        reqs = [
            engine.submit([1, 2, 3 + i], params(tokenizer, Constraint.json_schema(SCHEMA)))
            for i in range(24)
        ]
        run(engine)
    for r in reqs:
        assert r.finish_reason is FinishReason.STOP, tokenizer.decode(r.output_token_ids)
        jsonschema.validate(json.loads(tokenizer.decode(r.output_token_ids)), SCHEMA)
    assert engine._constraints.active == 0
    # with a runner that waits, masks of >= 4 constrained rows were filled in the background
    background = [p for p in runner.plans if p.sampling.mask_pending is not None]
    assert bool(background) == overlap


def test_json_object_regex_grammar_and_choice(
    tokenizer: Tokenizer, backend: GrammarBackend
) -> None:
    runner = UniformAllowedRunner(tokenizer.vocab_size, seed=3)
    lark = 'start: "ab" digit+\ndigit: /[0-9]/'
    cases = [
        (Constraint("regex", "[a-c]{2}-[0-9]{3}"), r"^[a-c]{2}-[0-9]{3}$"),
        (Constraint("grammar", lark), r"^ab[0-9]+$"),
        (Constraint("grammar", 'root ::= "yes" | "no"'), r"^(yes|no)$"),
    ]
    with Engine(runner, grammar=backend) as engine:
        reqs = [(engine.submit([5, 6], params(tokenizer, c)), rx) for c, rx in cases * 4]
        obj = [
            engine.submit([7], params(tokenizer, Constraint("json_object"), max_output_tokens=300))
            for _ in range(3)
        ]
        run(engine)
    import re

    for r, rx in reqs:
        text = tokenizer.decode(r.output_token_ids, skip_special_tokens=True)
        assert re.match(rx, text), text
    for r in obj:
        if r.finish_reason is FinishReason.STOP:
            assert isinstance(json.loads(tokenizer.decode(r.output_token_ids, True)), dict)


def test_mask_only_on_constrained_sampling_rows(
    tokenizer: Tokenizer, backend: GrammarBackend
) -> None:
    runner = UniformAllowedRunner(tokenizer.vocab_size)
    with Engine(runner, grammar=backend, prefill_chunk_tokens=16) as engine:
        free = engine.submit([9] * 20, params(tokenizer, None, max_output_tokens=3))
        run(engine)
        assert all(p.sampling.token_bitmask is None for p in runner.plans)  # zero overhead
        runner.plans.clear()
        engine.submit([4] * 40, params(tokenizer, Constraint("regex", "[0-9]{5}")))
        engine.submit([8] * 3, params(tokenizer, None, max_output_tokens=4))
        run(engine)
    assert free.finish_reason is FinishReason.LENGTH
    masked = [p for p in runner.plans if p.sampling.token_bitmask is not None]
    assert masked
    for p in masked:
        m = p.sampling.token_bitmask
        assert m is not None and m.shape == (p.num_sequences, -(-tokenizer.vocab_size // 32))
        assert not m.flags.writeable
        for i in range(p.num_sequences):
            full = bool((m[i] == -1).all())
            # the constrained row (sequence 1) is masked only where it samples
            assert full == (p.sequence_ids[i] != 1 or not p.sample_rows[i])


@pytest.mark.parametrize("overlap", [False, True])
def test_retraction_keeps_grammar_in_step(
    tokenizer: Tokenizer, backend: GrammarBackend, overlap: bool
) -> None:
    # A cache of 24 pages for 8 requests that grow: the youngest are retracted and recomputed
    # mid-output, and every output must still validate.
    runner = UniformAllowedRunner(tokenizer.vocab_size, num_pages=24, seed=7, waits=overlap)
    with Engine(runner, grammar=backend, max_batch_tokens=256) as engine:
        schema = Constraint.json_schema(SCHEMA)
        reqs = [
            engine.submit(list(range(10 + i, 40 + i)), params(tokenizer, schema)) for i in range(8)
        ]
        run(engine)
        preempted = engine._scheduler.num_preemptions
    assert preempted > 0
    for r in reqs:
        assert r.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(tokenizer.decode(r.output_token_ids)), SCHEMA)


def test_runner_that_ignores_the_mask_errors_only_that_request(
    tokenizer: Tokenizer, backend: GrammarBackend
) -> None:
    runner = UniformAllowedRunner(tokenizer.vocab_size, obey=False)
    with Engine(runner, grammar=backend) as engine:
        # one constrained request (inline advance) and five (the parallel advance)
        for n in (1, 5):
            bad = [engine.submit([1, i], params(tokenizer, Constraint("regex", "a{30}")))
                   for i in range(n)]  # fmt: skip
            ok = engine.submit([3, 4], params(tokenizer, None, max_output_tokens=5))
            events = []
            while engine.has_work():
                events += engine.step()
            for r in bad:
                assert r.finish_reason is FinishReason.ERROR
                assert "violates the constraint" in str(r.error)
                finished = [
                    e for e in events if isinstance(e, FinishedEvent) and e.request_id == r.id
                ]
                assert len(finished) == 1
            assert ok.finish_reason is FinishReason.LENGTH


def test_biases_reach_the_plan_in_csr(tokenizer: Tokenizer, backend: GrammarBackend) -> None:
    runner = UniformAllowedRunner(tokenizer.vocab_size)
    with Engine(runner, grammar=backend) as engine:
        engine.submit([1], SamplingParams(max_output_tokens=2, logit_bias={5: 2.5, 3: -1.0}))
        engine.submit([2], SamplingParams(max_output_tokens=2))
        engine.submit([3], SamplingParams(max_output_tokens=2, logit_bias={7: 100}))
        run(engine)
    s = runner.plans[-1].sampling
    rows: Sequence[int] = runner.plans[-1].sequence_ids.tolist()
    got = {}
    for i, row in enumerate(rows):
        part = slice(s.bias_indptr[i], s.bias_indptr[i + 1])
        got[row] = list(zip(s.bias_ids[part].tolist(), s.bias_values[part].tolist(), strict=True))
    assert got == {0: [(3, -1.0), (5, 2.5)], 1: [], 2: [(7, 100.0)]}
    assert s.token_bitmask is None and engine._constraints.active == 0


def test_runner_failure_while_the_mask_fills_in_the_background(
    tokenizer: Tokenizer, backend: GrammarBackend
) -> None:
    class FailsOnce(UniformAllowedRunner):
        def forward(self, plan: BatchPlan) -> ForwardOutput:
            if len(self.plans) == 2:  # the second decode step fails without reading the mask
                self.plans.append(plan)
                raise RuntimeError("device fault")
            return super().forward(plan)

    runner = FailsOnce(tokenizer.vocab_size, waits=True)
    with Engine(runner, grammar=backend) as engine:
        first = [engine.submit([1, i], params(tokenizer, Constraint.json_schema(SCHEMA)))
                 for i in range(6)]  # fmt: skip
        run(engine)
        assert all(r.finish_reason is FinishReason.ERROR for r in first)
        assert runner.plans[2].sampling.mask_pending is not None
        later = [engine.submit([2, i], params(tokenizer, Constraint.json_schema(SCHEMA)))
                 for i in range(6)]  # fmt: skip
        run(engine)
    for r in later:
        jsonschema.validate(json.loads(tokenizer.decode(r.output_token_ids)), SCHEMA)
    assert engine._constraints._worker is None  # close() stopped the mask thread


# -- tool calls inside free text (tool_choice auto) --------------------------------------------
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
           "required": ["city"], "additionalProperties": False}  # fmt: skip
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}  # fmt: skip
CALLS = [
    {"begin": f'<tool_call>\n{{"name": "{name}", "arguments": ', "schema": schema,
     "end": "}\n</tool_call>"}
    for name, schema in (("get_weather", WEATHER), ("get_time", TIME))
]  # fmt: skip
AUTO_TOOLS = Constraint(
    "structural_tag", json.dumps({"triggers": ["<tool_call>"], "structures": CALLS}), strict=False
)


class ScriptedRunner(UniformAllowedRunner):
    """A model that writes `script` token by token while the mask allows it (one request at
    a time), then draws uniformly among the allowed tokens."""

    def __init__(self, vocab: int, script: Sequence[int], seed: int = 0) -> None:
        super().__init__(vocab, seed=seed)
        self.script = list(script)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        out = super().forward(plan)
        if not plan.sample_rows.any():
            return out
        mask = plan.sampling.token_bitmask
        if self.script and (mask is None or self.script[0] in allowed(mask[0], self.vocab)):
            out.token_ids[0] = self.script.pop(0)
        else:
            self.script = []  # off the script for good
        return out


def test_auto_tool_calls_free_text_then_only_offered_tools(
    tokenizer: Tokenizer, backend: GrammarBackend
) -> None:
    """A lazily triggered structural tag: text (with braces, markup, a special token) passes
    untouched; after the trigger the model that wanted to call "Paris" must call an offered
    tool with valid arguments, and free text follows again."""
    state = backend.state(AUTO_TOOLS)
    mask = np.zeros((1, backend.mask_words), dtype=np.int32)
    state.fill_mask(mask[0])
    assert len(allowed(mask[0], backend.vocab_size)) > 0.99 * backend.vocab_size
    text = 'Sure! {"a": [1]} <b>x</b>\n<tool_call'  # no trigger yet
    assert state.sync([*tokenizer.encode(text), 1])  # 1: <|im_start|>, another special token
    state = backend.state(AUTO_TOOLS)
    assert state.sync(tokenizer.encode('Hi <tool_call>\n{"name": "get_'))
    state.fill_mask(mask[0])
    firsts = {tokenizer.decode([int(t)]) for t in allowed(mask[0], backend.vocab_size)}
    assert firsts and all("weather".startswith(f) or "time".startswith(f) for f in firsts)
    assert not backend.state(AUTO_TOOLS).sync(tokenizer.encode('<tool_call>\n{"name": "Paris"'))

    eos = tokenizer.eos_token_ids[0]
    wants = 'Let me check. <tool_call>\n{"name": "Paris", "arguments": {"city": "Oslo"}}'
    free = "No tool needed: {braces} and <tags> stay."
    outputs = []
    for script in (wants, free):
        runner = ScriptedRunner(tokenizer.vocab_size, [*tokenizer.encode(script), eos], seed=5)
        with Engine(runner, grammar=backend) as engine:
            outputs.append(engine.submit([1, 2, 3], params(tokenizer, AUTO_TOOLS)))
            run(engine)
            assert engine._constraints.active == 0
    called, plain = (tokenizer.decode(r.output_token_ids, True) for r in outputs)
    assert plain == free and outputs[1].finish_reason is FinishReason.STOP
    head, _, rest = called.partition("<tool_call>\n")
    assert head == "Let me check. "
    body, end, _ = rest.partition("\n</tool_call>")
    assert end, called
    call = json.loads(body)
    schema = {"get_weather": WEATHER, "get_time": TIME}[call["name"]]
    jsonschema.validate(call["arguments"], schema)
