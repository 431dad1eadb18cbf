"""Compiling one `Constraint` into an llguidance matcher for one tokenizer, within limits.

`GrammarLimits` says what a constraint may cost; `GrammarCompiler.matcher` checks the spec's
size, writes the grammar (JSON schema, regex, Lark/GBNF, structural tag), checks its size,
builds the matcher and computes its first mask, so a grammar no output satisfies, or one
beyond llguidance's per-step limits at its first token, fails here ("constraint <kind> ...",
a `ValueError`) instead of at the first decode step. `GrammarBackend` (`grammar.py`) caches
what it returns. llguidance is imported lazily, as in `grammar.py`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from resin.engine.structural_tag import JSON_DEFAULTS, structural_tag_grammar
from resin.params import Constraint

if TYPE_CHECKING:
    import llguidance


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    """What one constraint may cost (`docs/constraints.md`, "Limits"). The llguidance
    limits (None: llguidance's default) bound the work of one row's mask at one step."""

    max_spec_bytes: int = 4 << 20
    """A constraint's spec, and the grammar text made from it, at most this many bytes."""
    compile_timeout_s: float = 10.0
    """From submit to a compiled grammar, waiting for a compile thread included (the server's
    intake enforces it; a compile still running then finishes into the cache)."""
    compile_threads: int = 2
    max_queued_compiles: int = 64
    """Compiles queued or running at once; more is a `GrammarBusy` (HTTP 429)."""
    cache_bytes: int = 256 << 20
    """The compile cache's bound, in estimated bytes (`CompiledGrammar.nbytes`)."""
    max_grammar_size: int | None = None
    """llguidance: symbols in the grammar's productions (default 500,000)."""
    max_items_in_row: int | None = None
    """llguidance: Earley items in one row (default 2,000)."""
    step_max_items: int | None = None
    """llguidance: Earley items per mask (default 50,000, ~2.5 ms)."""
    step_lexer_fuel: int | None = None
    """llguidance: lexer work per mask (default 200,000)."""
    initial_lexer_fuel: int | None = None
    """llguidance: lexer work to build the first lexer state (default 1,000,000)."""
    max_lexer_states: int | None = None
    """llguidance: lexer states one grammar may build (default 250,000)."""

    def parser_limits(self) -> Any:
        import llguidance

        given = {
            "max_grammar_size": self.max_grammar_size,
            "max_items_in_row": self.max_items_in_row,
            "step_max_items": self.step_max_items,
            "step_lexer_fuel": self.step_lexer_fuel,
            "initial_lexer_fuel": self.initial_lexer_fuel,
            "max_lexer_states": self.max_lexer_states,
        }
        chosen: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        return llguidance.LLParserLimits(**chosen, verbose_errors=False)


BASE_BYTES = 64 << 10
BYTES_PER_GRAMMAR_BYTE = 32
"""A compiled grammar's size estimate: llguidance reports none; 100,000 choices (2.7 MB of
grammar text) grew the process by 68 MB on SmolLM2's tokenizer, ~25 bytes per byte."""


class GrammarCompiler:
    """Constraint -> llguidance matcher for one llguidance tokenizer (safe from any thread)."""

    def __init__(
        self,
        tokenizer: llguidance.LLTokenizer,
        special_tokens: Mapping[str, int],
        eos_token_ids: Collection[int],
        limits: GrammarLimits,
    ) -> None:
        self.tokenizer = tokenizer
        self.special_tokens = special_tokens
        self.eos_token_ids = eos_token_ids
        self.limits = limits
        self.mask_words = (int(tokenizer.vocab_size) + 31) // 32
        self._limits = limits.parser_limits()
        import llguidance

        self._llg = llguidance

    def matcher(self, c: Constraint) -> tuple[llguidance.LLMatcher, int]:
        """The matcher and its grammar's size. Errors start with "constraint <kind>" (the
        server maps them to the request field)."""
        self._check_size(c, len(c.spec), "spec")
        try:
            grammar = self._grammar_text(c)
        except (ValueError, TypeError, RecursionError) as exc:
            raise ValueError(f"constraint {c.kind} is invalid: {first_line(str(exc))}") from None
        self._check_size(c, len(grammar), "grammar")
        matcher = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self._limits)
        if not matcher.is_error():
            # The first mask: a grammar no output satisfies, or one beyond the per-step
            # limits from its first token, fails here instead of at the first decode step.
            probe = np.zeros(self.mask_words, dtype=np.int32)
            matcher.unsafe_compute_mask_ptr(probe.ctypes.data, probe.nbytes)
        if matcher.is_error():
            problem = first_line(matcher.get_error())
            if problem.startswith("NoExtensionBias"):
                raise ValueError(f"constraint {c.kind} is unsatisfiable: no output matches it")
            raise ValueError(f"constraint {c.kind} cannot be enforced: {problem}")
        if matcher.is_stopped():
            raise ValueError(f"constraint {c.kind} allows no output at all")
        return matcher, len(grammar)

    def _check_size(self, c: Constraint, size: int, what: str) -> None:
        limit = self.limits.max_spec_bytes
        if size > limit:
            raise ValueError(
                f"constraint {c.kind} is too large: its {what} has {size} bytes, "
                f"the limit is {limit} (max_spec_bytes)"
            )

    def _grammar_text(self, c: Constraint) -> str:
        m = self._llg.LLMatcher
        if c.kind == "json_object":
            return m.grammar_from_json_schema('{"type": "object"}', defaults=JSON_DEFAULTS)
        if c.kind == "json_schema":
            schema = json.loads(c.spec)
            options: Any = {"lenient": not c.strict}
            return m.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS, overrides=options)
        if c.kind == "regex":
            return m.grammar_from_regex(c.spec)
        if c.kind == "grammar":
            return self._llg.grammar_from("grammar", c.spec)
        spec = json.loads(c.spec)
        return structural_tag_grammar(spec, self.special_tokens, self.eos_token_ids, not c.strict)


def first_line(message: str) -> str:
    """The gist of an llguidance error: its first line plus any `error:` line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "invalid"
    extra = [line for line in lines[1:] if line.startswith("error:")]
    return " ".join([lines[0], *extra])[:400]
