"""One sampling policy: `SamplingParams` and its `Knob`s are the one definition; the OpenAI
bodies' sampling fields, the checkpoint's generation defaults, the engine's per-slot columns
and the runner features derive from them. Each test iterates the knobs, so a field added to
`SamplingParams` is checked here without editing this file."""

from __future__ import annotations

import io
import json
import tokenize
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import openai

from resin.engine.slots import COLUMNS, SlotStore
from resin.generation_config import DEFAULTABLE, JSON_KEYS, resolve
from resin.params import FIELD_TYPES, KNOBS, Knob, SamplingParams
from resin.plan import SamplingArrays
from resin.protocols import CORE_FIELDS, OPTIONAL_FEATURES
from resin.server.launch import running
from resin.server.schemas_openai import (
    SAMPLING_FIELDS,
    BodyFields,
    ChatCompletionRequest,
    CompletionRequest,
)
from tests.server.conftest import MODEL, make_server
from tests.server.test_generation_defaults import RecordingEngine, write

SRC = Path(__file__).resolve().parents[2] / "src" / "resin"


def some_value(knob: Knob) -> Any:
    """A valid value of the field other than its default."""
    default = getattr(SamplingParams(), knob.name)
    kind = FIELD_TYPES[knob.name]
    candidates: list[Any] = {float: [0.5, 0.25], int: [3, 5], bool: [True]}.get(kind, [7])
    for value in candidates:
        try:
            SamplingParams(**{knob.name: value})
        except ValueError:
            continue
        if value != default:
            return value
    raise AssertionError(f"no test value for {knob.name}")


def test_every_field_has_its_knob() -> None:
    assert list(KNOBS) == [f.name for f in fields(SamplingParams)]
    assert CORE_FIELDS | (OPTIONAL_FEATURES - {"media"}) == set(KNOBS)
    assert not CORE_FIELDS & OPTIONAL_FEATURES


def test_the_http_sampling_fields_are_the_knobs() -> None:
    wanted = {k.public_name for k in KNOBS.values() if k.http is not None}
    assert set(SAMPLING_FIELDS) == wanted
    for model in (ChatCompletionRequest, CompletionRequest):
        assert wanted <= set(model.model_fields)
        assert not wanted & set(BodyFields.model_fields)  # declared once, from the knobs


def test_every_http_field_reaches_the_engine() -> None:
    sent = {k.public_name: some_value(k) for k in KNOBS.values() if k.http is not None}
    engine = RecordingEngine()
    with running(make_server(engine)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body=sent
        )
        client.completions.create(model=MODEL, prompt="hi", extra_body=sent)
    assert len(engine.seen) == 2
    for params in engine.seen:
        got = {k.public_name: getattr(params, k.name) for k in KNOBS.values() if k.http is not None}
        assert got == sent


def test_every_http_bound_is_enforced() -> None:
    for k in KNOBS.values():
        for bound, limit in (k.http or {}).items():
            off = {"ge": -1, "gt": 0, "le": 1, "lt": 0}[bound]
            body = {"messages": [{"role": "user", "content": "x"}], k.public_name: limit + off}
            try:
                ChatCompletionRequest.model_validate(body)
            except ValueError:
                continue
            raise AssertionError(f"{k.public_name}={limit + off} was accepted")


def test_every_checkpoint_default_reaches_the_engine(tmp_path: Path) -> None:
    values = {name: some_value(k) for name, k in DEFAULTABLE.items() if k.config}
    config = {key: values[name] for key, name in JSON_KEYS.items()}
    defaults = resolve("auto", write(tmp_path / "ckpt", config))
    assert defaults.as_dict() == values
    engine = RecordingEngine()
    with running(make_server(engine, generation_defaults=defaults)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    (params,) = engine.seen
    assert {name: getattr(params, k.name) for name, k in DEFAULTABLE.items()} == values
    bad = write(tmp_path / "bad", {key: -5 for key in JSON_KEYS})  # every field refuses -5
    assert resolve("auto", bad).as_dict() == {}
    assert json.loads((bad / "generation_config.json").read_text())  # the file was read


def test_every_column_reaches_the_plan() -> None:
    columns = {name for name, k in KNOBS.items() if k.column is not None}
    assert set(COLUMNS) == columns
    assert columns <= {f.name for f in fields(SamplingArrays)}
    params = SamplingParams(**{name: some_value(KNOBS[name]) for name in columns})
    store = SlotStore(4, 64)
    store.admit(2, 1, params, num_prompt=3, outputs=[], last_token=0, num_computed=3)
    arrays = store.sampling(np.array([2], dtype=np.int32))
    for name, column in COLUMNS.items():
        value = np.asarray(getattr(arrays, name))
        assert value.dtype == np.dtype(column.dtype), name
        assert value.tolist() == [column.encode(getattr(params, name))], name


def _named_in(path: Path, name: str) -> bool:
    """Whether code in `path` names `name` (an identifier or a string equal to it; prose in
    docstrings and comments does not count)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    for tok in tokens:
        if tok.type == tokenize.NAME and tok.string == name:
            return True
        if tok.type == tokenize.STRING and tok.string.strip("\"'") == name:
            return True
    return False


def test_a_runner_applied_parameter_is_named_in_two_engine_modules() -> None:
    """Adding a parameter like `min_p` touches `params.py` (the field and its knob) and
    `plan.py` (the runner's column) in `resin`; the server, defaults and the slot table follow
    (docs/engine.md, "Adding a sampling parameter")."""
    # Anthropic and Responses bodies name top_p / top_k by their own specs; the server derives
    # a seed per choice; logprobs shape the engine's output, not just the sampling.
    special = {"top_p", "top_k", "seed", "logprobs"}
    plain = [n for n, k in KNOBS.items() if k.column and not k.core and n not in special]
    assert "min_p" in plain
    for name in plain:
        modules = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if _named_in(p, name))
        assert modules == ["params.py", "plan.py"], (name, modules)
