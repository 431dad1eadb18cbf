"""Per-request generation policy: limits, stop tokens, sampling and logprob options.

`SamplingParams` is frozen and validated on construction, so a bad value fails at
`Engine.submit` (or earlier) with a clear `ValueError` and nothing is queued.
Stop *strings* are a serving-layer concern (the server sees text); the engine
only knows stop token ids. The engine has no default EOS token: pass the model's
stop tokens explicitly (a recipe's `stop_token_ids` does this for chat).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, TypeVar, cast, get_type_hints

MAX_LOGPROBS = 20
"""Upper bound on `logprobs` / `prompt_logprobs` alternatives (OpenAI's own cap)."""

INT32_MAX = 2**31 - 1
"""Counts and token ids travel to runners in int32 plan arrays; larger values are refused."""


ConstraintKind = Literal["json_object", "json_schema", "regex", "grammar", "structural_tag"]

MAX_LOGIT_BIAS = 100.0
"""`logit_bias` values lie in [-100, 100] (OpenAI's range)."""

GREEDY_TEMPERATURE = 1e-5
"""A temperature below this samples greedily: dividing logits by a tinier one overflows float32
(1e-38 would turn every logit into +-inf and the draw into noise). Runners apply the same rule
to the plan's `temperature` column."""

MAX_PRESENCE_PENALTY = 2.0
"""`presence_penalty` and `frequency_penalty` lie in [-2, 2] (OpenAI's range)."""

MAX_REPETITION_PENALTY = 100.0
"""`repetition_penalty` lies in (0, 100] (1 = off; vLLM's meaning, bounded so logits stay
finite)."""


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the generated text must match (constrained decoding, `docs/constraints.md`).

    - `json_object`: any JSON object (`spec` ignored);
    - `json_schema`: `spec` is the schema as JSON text; `strict` refuses keywords the grammar
      engine cannot enforce (instead of ignoring them);
    - `regex`: `spec` is a regular expression the whole output matches;
    - `grammar`: `spec` is a Lark grammar (llguidance's dialect) or a GBNF/EBNF grammar;
    - `structural_tag`: `spec` is JSON `{"triggers": [...], "structures": [{"begin", "schema",
      "end"}]}`: free text in which each trigger starts a structure whose body follows the
      schema (tool calls); `"at_start": true` makes the output exactly one structure,
      `"anchored": true` allows one only at the start (`resin.engine.structural_tag`);
      `strict=False` ignores schema keywords the engine cannot enforce.

    A constraint is hashable and compares by value: the engine's compile cache is keyed by it.
    Whether the grammar engine accepts it is checked at `Engine.submit` (a `ValueError` naming
    the problem), not here.
    """

    kind: ConstraintKind
    spec: str = ""
    strict: bool = True

    def __post_init__(self) -> None:
        kinds = ("json_object", "json_schema", "regex", "grammar", "structural_tag")
        _check(self.kind in kinds, f"constraint kind must be one of {', '.join(kinds)}")
        _check(isinstance(self.spec, str), "constraint spec must be a string")
        if self.kind in ("json_schema", "structural_tag"):
            try:
                value = json.loads(self.spec)
            except ValueError as exc:
                raise ValueError(f"{self.kind} is not valid JSON: {exc}") from None
            _check(
                isinstance(value, dict) or value is True,
                f"{self.kind} must be a JSON object",
            )
        elif self.kind in ("regex", "grammar"):
            _check(bool(self.spec), f"{self.kind} must not be empty")

    @classmethod
    def json_schema(cls, schema: object, strict: bool = True) -> Constraint:
        """From a schema given as a dict (or JSON text)."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return cls("json_schema", text, strict)


T = TypeVar("T")


def _same(value: Any) -> Any:
    return value


def _none_is_minus_one(value: int | None) -> int:
    return -1 if value is None else value


def _greedy_is_zero(temperature: float) -> float:
    return 0.0 if temperature < GREEDY_TEMPERATURE else temperature


@dataclass(frozen=True, slots=True)
class Column:
    """A field's column in the engine's per-slot table (`resin.engine.slots.SlotStore`), sent to
    runners as the `SamplingArrays` field of the same name: `encode(value)` as `dtype`.
    `penalty`: sent only in plans where some row is penalized (`SamplingArrays`, "Penalties")."""

    dtype: str
    encode: Callable[[Any], float | int] = _same
    penalty: bool = False


@dataclass(frozen=True, slots=True)
class Knob:
    """Where one `SamplingParams` field appears beyond the engine's API; everything else that
    names sampling fields iterates `KNOBS` instead of listing them:

    - `core`: every runner honours it (else it is an optional runner feature,
      `resin.protocols.OPTIONAL_FEATURES`, used when it differs from its default);
    - `public`: its name in request bodies and in `/v1/models`' defaults (None: the field's);
    - `http`: the pydantic bounds of the field in OpenAI bodies (`SamplingFields`, where it is
      optional: None takes the default); None: not one of those shared fields (the routes map
      it themselves: logprobs, stops, bias, constraints);
    - `config` / `gguf`: the checkpoint's key for its default (`generation_config.json`, GGUF
      metadata; `resin.generation_config`);
    - `column`: its per-slot column (None: the engine's stop rule or a per-plan array uses it).
    """

    name: str = ""
    core: bool = False
    public: str | None = None
    http: Mapping[str, float] | None = None
    config: str | None = None
    gguf: str | None = None
    column: Column | None = None

    @property
    def public_name(self) -> str:
        return self.public or self.name


def knob(default: T, **how: Any) -> T:
    """A `SamplingParams` field with its `Knob` (`how`); typed as its default for mypy."""
    return cast("T", field(default=default, metadata={"knob": Knob(**how)}))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request generates.

    Invariants (checked in `__post_init__`):
    - `max_output_tokens >= 1`, `0 <= min_output_tokens <= max_output_tokens`;
    - `temperature >= 0` (0, or anything below `GREEDY_TEMPERATURE`, means greedy),
      `0 < top_p <= 1`, `top_k >= 0` (0 = off), `0 <= min_p <= 1`;
    - `seed` is None or a non-negative int below 2**63;
    - `logprobs` / `prompt_logprobs` are None or in [0, MAX_LOGPROBS]; 0 asks for the
      chosen token's logprob only, k > 0 adds the top-k alternatives;
    - `logit_bias` is a tuple of (token id, bias) pairs sorted by id, ids unique and >= 0,
      biases finite in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS] (a dict is accepted and converted);
      ids beyond the runner's vocabulary are refused at `Engine.submit`;
    - `constraint` (None = free text) is checked against the grammar engine at submit;
    - `presence_penalty`, `frequency_penalty` in [-2, 2] (OpenAI: over the generated tokens,
      subtract `presence` once from the logit of every token generated so far and `frequency`
      times its count); `repetition_penalty` in (0, 100] (vLLM / Hugging Face: over prompt and
      generated tokens, divide a positive logit by it and multiply a negative one); refused at
      `Engine.submit` by a runner whose `RunnerConfig.features` leave them out.
    Bias and constraint mask change the logits first, then the penalties, then temperature and
    filtering; the reported logprobs are those of the biased, masked, penalized distribution
    (`docs/constraints.md`, `docs/engine.md`).
    """

    max_output_tokens: int = knob(16, core=True, public="max_tokens", config="max_new_tokens")
    stop_token_ids: tuple[int, ...] = knob((), core=True)
    temperature: float = knob(
        1.0,
        core=True,
        http={"ge": 0, "le": 2},
        config="temperature",
        gguf="general.sampling.temp",
        column=Column("float32", _greedy_is_zero),
    )
    top_p: float = knob(
        1.0,
        http={"gt": 0, "le": 1},
        config="top_p",
        gguf="general.sampling.top_p",
        column=Column("float32"),
    )
    top_k: int = knob(
        0, http={"ge": -1}, config="top_k", gguf="general.sampling.top_k", column=Column("int32")
    )
    """-1 in a body is vLLM's "off" (0 here; the server maps both, and values >= vocabulary)."""
    min_p: float = knob(
        0.0,
        http={"ge": 0, "le": 1},
        config="min_p",
        gguf="general.sampling.min_p",
        column=Column("float32"),
    )
    seed: int | None = knob(
        None, http={"ge": 0, "lt": 2**63}, column=Column("int64", _none_is_minus_one)
    )
    logprobs: int | None = knob(None, column=Column("int32", _none_is_minus_one))
    prompt_logprobs: int | None = knob(None)
    min_output_tokens: int = knob(0, core=True, public="min_tokens", http={"ge": 0})
    """Stop tokens are ignored until this many tokens were generated."""
    ignore_stop_tokens: bool = knob(False, core=True, public="ignore_eos", http={})
    """Generate exactly `max_output_tokens` (benchmarks; `ignore_eos` in vLLM)."""
    logit_bias: tuple[tuple[int, float], ...] = knob(())
    constraint: Constraint | None = knob(None)  # noqa: RUF009 (a frozen field with its Knob)
    presence_penalty: float = knob(
        0.0, http={"ge": -2, "le": 2}, column=Column("float32", penalty=True)
    )
    frequency_penalty: float = knob(
        0.0, http={"ge": -2, "le": 2}, column=Column("float32", penalty=True)
    )
    repetition_penalty: float = knob(
        1.0,
        http={"gt": 0, "le": 100},
        config="repetition_penalty",
        column=Column("float32", penalty=True),
    )
    """vLLM's (over prompt and output); the other two are OpenAI's (over the output)."""

    def __post_init__(self) -> None:
        # Accept any iterable of ints for convenience, store a tuple (hashable, frozen).
        stops = tuple(int(t) for t in self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", stops)
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        _check(
            self.constraint is None or isinstance(self.constraint, Constraint),
            "constraint must be None or a Constraint",
        )
        _check(_is_int(self.max_output_tokens), "max_output_tokens must be an int")
        _check(
            1 <= self.max_output_tokens <= INT32_MAX,
            f"max_output_tokens must be in [1, {INT32_MAX}]",
        )
        _check(_is_int(self.min_output_tokens), "min_output_tokens must be an int")
        _check(
            0 <= self.min_output_tokens <= self.max_output_tokens,
            "min_output_tokens must be in [0, max_output_tokens]",
        )
        _check(all(0 <= t <= INT32_MAX for t in stops), "stop_token_ids must be in [0, 2**31)")
        _check(_finite(self.temperature) and self.temperature >= 0, "temperature must be >= 0")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]")
        _check(
            _is_int(self.top_k) and 0 <= self.top_k <= INT32_MAX,
            f"top_k must be an int in [0, {INT32_MAX}] (0 = off)",
        )
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p must be in [0, 1]")
        if self.seed is not None:
            _check(_is_int(self.seed) and 0 <= self.seed < 2**63, "seed must be in [0, 2**63)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(
                _finite(value) and abs(value) <= MAX_PRESENCE_PENALTY,
                f"{name} must be in [-{MAX_PRESENCE_PENALTY:g}, {MAX_PRESENCE_PENALTY:g}]",
            )
        rep = self.repetition_penalty
        _check(
            _finite(rep) and 0 < rep <= MAX_REPETITION_PENALTY,
            f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}] (1 = off)",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check(
                    _is_int(value) and 0 <= value <= MAX_LOGPROBS,
                    f"{name} must be None or an int in [0, {MAX_LOGPROBS}]",
                )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether any penalty is on (the runner then keeps the request's token counts)."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )


KNOBS: Mapping[str, Knob] = {
    f.name: replace(f.metadata["knob"], name=f.name) for f in fields(SamplingParams)
}
"""Every `SamplingParams` field's `Knob`, by field name, in declaration order."""

FIELD_TYPES: Mapping[str, Any] = get_type_hints(SamplingParams)
"""Each field's type (the HTTP schema's sampling fields are these, made optional)."""

PUBLIC: Mapping[str, Knob] = {k.public_name: k for k in KNOBS.values()}
"""`KNOBS` by public name (request bodies, generation defaults)."""


def from_public(values: Mapping[str, Any]) -> dict[str, Any]:
    """`SamplingParams` keyword arguments from values by public name; None values are left
    out (the field keeps its default)."""
    unknown = sorted(set(values) - set(PUBLIC))
    if unknown:
        raise KeyError(f"not sampling fields: {unknown}")
    return {PUBLIC[k].name: v for k, v in values.items() if v is not None}


def _bias_pairs(value: object) -> tuple[tuple[int, float], ...]:
    items: Any = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise ValueError("logit_bias must map token ids to numbers") from None
    out: dict[int, float] = {}
    for key, bias in pairs:
        tid = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        _check(_is_int(tid) and 0 <= tid <= INT32_MAX, f"logit_bias token id {key!r} is invalid")
        _check(
            _finite(bias) and abs(bias) <= MAX_LOGIT_BIAS,
            f"logit_bias[{key}] must be a number in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
        )
        _check(tid not in out, f"logit_bias token id {tid} appears twice")
        out[int(tid)] = float(bias)
    return tuple(sorted(out.items()))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
