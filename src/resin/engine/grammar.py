"""Constraints -> grammar matchers (llguidance), compiled once per spec and tokenizer.

`GrammarBackend` owns one llguidance tokenizer and a small LRU of compiled constraints; each
constrained request gets its own `GrammarState` (a copy of the compiled matcher) at submit.
The engine advances a state with the tokens it commits (`sync`) and can take tokens back
(`rollback`, for rejected speculative drafts); `fill_mask` writes the state's allowed-token
bitmask into one row of a plan's `token_bitmask`.

Why llguidance (measured in `docs/constraints.md`): no dependencies (the engine process keeps
torch out), one abi3 wheel for every CPython, ~1 ms to compile a JSON schema, native rollback,
Lark / regex / GBNF grammars and lazy "trigger" lexemes for tool calls.
llguidance is imported lazily: an engine without constraints never loads it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from resin.engine.structural_tag import JSON_DEFAULTS, structural_tag_grammar
from resin.params import Constraint

if TYPE_CHECKING:
    import llguidance


class TokenizerSource(Protocol):
    """What the backend needs from a tokenizer (`resin.tokenizer.Tokenizer` has both)."""

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    def to_json(self) -> str: ...


class GrammarState:
    """One request's position in its grammar.

    Invariant: the matcher has consumed exactly the first `consumed` generated tokens.
    Once `error` is set (a token the grammar forbids was committed) the state stays failed.
    """

    __slots__ = ("consumed", "error", "matcher")

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.consumed = 0
        self.error: str | None = None

    @property
    def stopped(self) -> bool:
        """The grammar is complete and allows nothing more (the request should finish)."""
        return bool(self.matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())

    def sync(self, tokens: Sequence[int]) -> bool:
        """Advance (or roll back) so that exactly `tokens` are consumed; False on a token the
        grammar forbids (the state is then failed and `error` says why)."""
        if self.error is not None:
            return False
        n = len(tokens)
        if n < self.consumed:
            self.rollback(self.consumed - n)
        for tok in tokens[self.consumed :]:
            if not self.matcher.consume_token(tok):
                first = self.matcher.get_error().strip().splitlines()
                self.error = f"token {tok} violates the constraint: {first[0] if first else ''}"
                return False
            self.consumed += 1
        return True

    def rollback(self, k: int) -> None:
        """Take back the last `k` consumed tokens (rejected drafts, retracted output)."""
        if k < 0 or k > self.consumed:
            raise ValueError(f"cannot roll back {k} of {self.consumed} tokens")
        if k and not self.matcher.rollback(k):
            raise RuntimeError(f"grammar rollback of {k} tokens failed")
        self.consumed -= k

    def fill_mask(self, row: npt.NDArray[np.int32]) -> None:
        """Write the allowed-token bitmask into `row` (C-contiguous int32, tokenizer width)."""
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)


FILL_THREADS: int | None = 1
"""Threads for a batch's mask fill. One: on the H200 host (16 cores, CUDA and torch threads
busy) 64 rows took 0.78 ms on one thread against 3.1 ms on llguidance's default pool of 12,
and json_schema decode at batch 64 went from 0.87x to 0.96x of plain (docs/benchmarks.md)."""


class GrammarBackend:
    """Compiles `Constraint`s for one tokenizer; the engine asks it for per-request states.

    `eos_token_ids` are the tokens a complete grammar allows (the recipe's stop tokens).
    The compile cache holds up to `cache_size` specs (LRU); a hit costs one matcher copy.
    `fill_threads`: the threads that fill a batch's masks (`FILL_THREADS`; None = llguidance's
    default pool, 80% of the cores).
    """

    def __init__(
        self,
        tokenizer_json: str,
        eos_token_ids: Sequence[int],
        cache_size: int = 256,
        fill_threads: int | None = FILL_THREADS,
    ) -> None:
        import llguidance

        self._llg = llguidance
        eos = [int(t) for t in eos_token_ids]
        if not eos:
            raise ValueError("a grammar backend needs at least one EOS / stop token id")
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, eos_token=eos)
        self.eos_token_ids = frozenset(eos)
        # Added tokens llguidance treats as special: a grammar literal cannot produce them,
        # so structural tags refer to them by id (`<[id]>`).
        added = json.loads(tokenizer_json).get("added_tokens") or []
        self.special_tokens = {
            str(t["content"]): int(t["id"])
            for t in added
            if self.tokenizer.is_special_token(int(t["id"]))
        }
        self.vocab_size: int = int(self.tokenizer.vocab_size)
        self.mask_words = (self.vocab_size + 31) // 32
        self._cache: OrderedDict[Constraint, llguidance.LLMatcher] = OrderedDict()
        self._cache_size = cache_size
        self.fill_threads = fill_threads
        self._executor: llguidance.LLExecutor | None = None

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: TokenizerSource,
        cache_size: int = 256,
        fill_threads: int | None = FILL_THREADS,
    ) -> GrammarBackend:
        return cls(tokenizer.to_json(), tokenizer.eos_token_ids, cache_size, fill_threads)

    def state(self, constraint: Constraint) -> GrammarState:
        """A fresh state for `constraint`; `ValueError` naming the problem when the grammar
        engine cannot compile or enforce it."""
        compiled = self._cache.get(constraint)
        if compiled is None:
            compiled = self._compile(constraint)
            self._cache[constraint] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(constraint)
        return GrammarState(compiled.deep_copy())

    def fill_masks(self, states: Sequence[GrammarState], mask: npt.NDArray[np.int32]) -> None:
        """Row i of `mask` gets states[i]'s bitmask (the first `mask_words` words of a row;
        words beyond the tokenizer's vocabulary stay as they are: 0 = disallowed).

        One row is filled directly; several go in one call to llguidance's executor, which
        releases the GIL once for the whole batch (one matcher call per row would hand the GIL
        over 64 times a step, and a busy server thread can hold it for milliseconds each time)."""
        if len(states) == 1:
            states[0].fill_mask(mask[0, : self.mask_words])
            return
        target = mask
        if mask.shape[1] != self.mask_words or not mask.flags.c_contiguous:
            target = np.zeros((len(states), self.mask_words), dtype=np.int32)
        if self._executor is None:
            self._executor = self._llg.LLExecutor(self.fill_threads)
        pairs = [(s.matcher, i) for i, s in enumerate(states)]
        nbytes = self.mask_words * 4
        self._executor.unsafe_compute_mask_ptr(pairs, target.ctypes.data, nbytes, len(states))
        if target is not mask:
            mask[:, : self.mask_words] = target

    # -- compilation ------------------------------------------------------------------------
    def _compile(self, c: Constraint) -> llguidance.LLMatcher:
        """Errors start with "constraint <kind>" (the server maps them to the request field)."""
        try:
            grammar = self._grammar_text(c)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"constraint {c.kind} is invalid: {_first_line(str(exc))}") from None
        matcher = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            problem = _first_line(matcher.get_error())
            raise ValueError(f"constraint {c.kind} cannot be enforced: {problem}")
        return matcher

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


def _first_line(message: str) -> str:
    """The gist of an llguidance error: its first line plus any `error:` line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "invalid"
    extra = [line for line in lines[1:] if line.startswith("error:")]
    return " ".join([lines[0], *extra])[:400]
