"""Constraints -> grammar matchers (llguidance), compiled once per spec and tokenizer.

`GrammarBackend` owns one llguidance tokenizer and a cache of compiled constraints
(`CompiledGrammar`); each constrained request gets its own `GrammarState` (a copy of the
compiled matcher). The engine advances a state with the tokens it commits (`sync`) and can
take tokens back (`rollback`, for rejected speculative drafts); `fill_masks` writes the
states' allowed-token bitmasks into rows of a plan's `token_bitmask`.

Compiling (`grammar_compile.py`) is bounded by `GrammarLimits` and computes the first mask.
`prepare` compiles on the backend's own threads and returns a future (a server waits for it
in its intake, `compile_timeout_s`, so the engine thread never compiles); `compile` / `state`
compile on the calling thread (a library caller's `Engine.submit`). Successes and failures are
cached in one LRU bounded by estimated bytes (`cache_bytes`). Every method is thread-safe.

Why llguidance (measured in `docs/constraints.md`): no dependencies (the engine process keeps
torch out), one abi3 wheel for every CPython, ~1 ms to compile a JSON schema, native rollback,
Lark / regex / GBNF grammars and lazy "trigger" lexemes for tool calls.
llguidance is imported lazily: an engine without constraints never loads it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from resin.engine.grammar_compile import (
    BASE_BYTES,
    BYTES_PER_GRAMMAR_BYTE,
    GrammarCompiler,
    GrammarLimits,
    first_line,
)
from resin.errors import GrammarBusy
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
    Once `error` is set (a token the grammar forbids was committed, or the grammar hit a
    per-step limit) the state stays failed. `constraint` is what it was compiled from.
    """

    __slots__ = ("constraint", "consumed", "error", "matcher")

    def __init__(self, matcher: llguidance.LLMatcher, constraint: Constraint | None = None) -> None:
        self.matcher = matcher
        self.constraint = constraint
        self.consumed = 0
        self.error: str | None = None

    @property
    def stopped(self) -> bool:
        """The grammar is complete and allows nothing more (the request should finish)."""
        return bool(self.matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())

    @property
    def mask_failure(self) -> str | None:
        """Why the last mask could not be computed (a per-step limit hit): its row was all
        zeros, so the token sampled from it, a stop token included, means nothing. None while
        the grammar is sound, or once `error` already says why it failed."""
        if self.error is not None or not self.matcher.is_error():
            return None
        problem = first_line(self.matcher.get_error())
        return f"constraint failed after {self.consumed} output tokens: {problem}"

    def sync(self, tokens: Sequence[int]) -> bool:
        """Advance (or roll back) so that exactly `tokens` are consumed; False on a token the
        grammar forbids (the state is then failed and `error` says why)."""
        if self.error is not None:
            return False
        if (failure := self.mask_failure) is not None:
            self.error = failure
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


class CompiledGrammar:
    """A compiled constraint, shared by every request that uses it (read-only after the
    backend published it: each request's state is a copy)."""

    __slots__ = ("_matcher", "constraint", "nbytes", "seconds")

    def __init__(
        self, constraint: Constraint, matcher: llguidance.LLMatcher, nbytes: int, seconds: float
    ) -> None:
        self.constraint = constraint
        self._matcher = matcher
        self.nbytes = nbytes
        """Estimated memory (`BASE_BYTES` + `BYTES_PER_GRAMMAR_BYTE` per grammar byte)."""
        self.seconds = seconds
        """How long it took to compile."""

    def state(self) -> GrammarState:
        """A fresh state at the start of the grammar (a copy of the compiled matcher)."""
        return GrammarState(self._matcher.deep_copy(), self.constraint)


@dataclass(frozen=True, slots=True)
class _Failed:
    message: str
    nbytes: int


FILL_THREADS: int | None = 1
"""Threads for a batch's mask fill. One: on the H200 host (16 cores, CUDA and torch threads
busy) 64 rows took 0.78 ms on one thread against 3.1 ms on llguidance's default pool of 12,
and json_schema decode at batch 64 went from 0.87x to 0.96x of plain (docs/benchmarks.md)."""

SLOW_FILL_S = 0.004
"""A batch fill slower than this moves the next fills to llguidance's full pool (costly
grammars, e.g. ambiguous ones, fill in parallel); one 4x faster moves them back."""


def _llguidance_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llguidance")
    except PackageNotFoundError:  # imported from a folder without its metadata
        return "(version unknown)"


class GrammarBackend:
    """Compiles `Constraint`s for one tokenizer; the engine asks it for per-request states.

    `eos_token_ids` are the tokens a complete grammar allows (the recipe's stop tokens).
    `limits` bounds what a constraint may cost (`GrammarLimits`); `fill_threads`: the threads
    that fill a batch's masks (`FILL_THREADS`; None = llguidance's default pool, 80% of the
    cores); a batch slower than `SLOW_FILL_S` switches to the default pool until fills are
    fast again.
    """

    def __init__(
        self,
        tokenizer_json: str,
        eos_token_ids: Sequence[int],
        limits: GrammarLimits | None = None,
        fill_threads: int | None = FILL_THREADS,
    ) -> None:
        import llguidance

        self._llg = llguidance
        eos = [int(t) for t in eos_token_ids]
        if not eos:
            raise ValueError("a grammar backend needs at least one EOS / stop token id")
        try:
            self.tokenizer = llguidance.LLTokenizer(tokenizer_json, eos_token=eos)
        except TypeError as exc:  # llguidance before 1.9 takes one EOS id, not a list
            raise RuntimeError(
                f"llguidance {_llguidance_version()} cannot take a list of stop tokens; Resin "
                "needs llguidance>=1.9,<2 (pip install 'llguidance>=1.9,<2')"
            ) from exc
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
        self.limits = limits or GrammarLimits()
        self._compiler = GrammarCompiler(
            self.tokenizer, self.special_tokens, self.eos_token_ids, self.limits
        )
        self._lock = threading.Lock()
        self._cache: OrderedDict[Constraint, CompiledGrammar | _Failed] = OrderedDict()
        self._cache_bytes = 0
        self._inflight: dict[Constraint, Future[CompiledGrammar]] = {}
        self._threads: ThreadPoolExecutor | None = None
        self.fill_threads = fill_threads
        self._executors: dict[bool, llguidance.LLExecutor] = {}
        self._wide = False  # the last fills were slow: use the full pool

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: TokenizerSource,
        limits: GrammarLimits | None = None,
        fill_threads: int | None = FILL_THREADS,
    ) -> GrammarBackend:
        return cls(tokenizer.to_json(), tokenizer.eos_token_ids, limits, fill_threads)

    @property
    def compile_timeout_s(self) -> float:
        return self.limits.compile_timeout_s

    @property
    def cached_bytes(self) -> int:
        """Estimated bytes the compile cache holds (at most `limits.cache_bytes`)."""
        return self._cache_bytes

    # -- compiling --------------------------------------------------------------------------
    def state(self, constraint: Constraint) -> GrammarState:
        """A fresh state for `constraint`, compiled on this thread unless cached;
        `ValueError` naming the problem when the grammar engine cannot compile or enforce it."""
        return self.compile(constraint).state()

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """`constraint` compiled (or found in the cache) on this thread; `ValueError` as
        `state`. A compile of the same constraint already running elsewhere is waited for."""
        with self._lock:
            hit = self._lookup(constraint)
            running = self._inflight.get(constraint)
        if hit is not None:
            return _unwrap(hit)
        if running is not None:
            return running.result()
        return _unwrap(self._compile_and_store(constraint))

    def prepare(self, constraint: Constraint) -> Future[CompiledGrammar]:
        """`constraint` compiling on the backend's threads: a future that ends with the
        `CompiledGrammar` or the `ValueError` that `compile` raises (done at once when cached;
        shared by every caller while it runs); `GrammarBusy` when too many are queued."""
        with self._lock:
            hit = self._lookup(constraint)
            if hit is None:
                return self._submit(constraint)
        done: Future[CompiledGrammar] = Future()
        if isinstance(hit, CompiledGrammar):
            done.set_result(hit)
        else:
            done.set_exception(ValueError(hit.message))
        return done

    def _submit(self, constraint: Constraint) -> Future[CompiledGrammar]:
        """The running compile of `constraint`, or a new one (lock held)."""
        running = self._inflight.get(constraint)
        if running is not None:
            return running
        if len(self._inflight) >= self.limits.max_queued_compiles:
            busy: Future[CompiledGrammar] = Future()
            busy.set_exception(
                GrammarBusy(
                    f"{len(self._inflight)} grammars are compiling "
                    f"(at most {self.limits.max_queued_compiles}); retry"
                )
            )
            return busy
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                self.limits.compile_threads, thread_name_prefix="resin-grammar"
            )
        future = self._threads.submit(lambda: _unwrap(self._compile_and_store(constraint)))
        self._inflight[constraint] = future
        future.add_done_callback(lambda _: self._done(constraint))
        return future

    def close(self) -> None:
        """Stop the compile threads (a running compile finishes; queued ones are cancelled)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def _done(self, constraint: Constraint) -> None:
        with self._lock:
            self._inflight.pop(constraint, None)

    def _lookup(self, constraint: Constraint) -> CompiledGrammar | _Failed | None:
        """The cached entry, marked most recently used (lock held)."""
        hit = self._cache.get(constraint)
        if hit is not None:
            self._cache.move_to_end(constraint)
        return hit

    def _compile_and_store(self, c: Constraint) -> CompiledGrammar | _Failed:
        start = time.monotonic()
        entry: CompiledGrammar | _Failed
        try:
            matcher, size = self._compile(c)
            nbytes = BASE_BYTES + BYTES_PER_GRAMMAR_BYTE * size + len(c.spec)
            entry = CompiledGrammar(c, matcher, nbytes, time.monotonic() - start)
        except ValueError as exc:
            entry = _Failed(str(exc), 256 + len(c.spec))
        with self._lock:
            old = self._cache.pop(c, None)
            self._cache_bytes += entry.nbytes - (0 if old is None else old.nbytes)
            self._cache[c] = entry
            while self._cache_bytes > self.limits.cache_bytes and self._cache:
                _, evicted = self._cache.popitem(last=False)  # an entry above the bound too
                self._cache_bytes -= evicted.nbytes
        return entry

    def _compile(self, c: Constraint) -> tuple[llguidance.LLMatcher, int]:
        return self._compiler.matcher(c)

    # -- masks ------------------------------------------------------------------------------
    def fill_masks(self, states: Sequence[GrammarState], mask: npt.NDArray[np.int32]) -> None:
        """Row i of `mask` gets states[i]'s bitmask (the first `mask_words` words of a row;
        words beyond the tokenizer's vocabulary stay as they are: 0 = disallowed).

        One row is filled directly; several go in one call to llguidance's executor, which
        releases the GIL once for the whole batch (one matcher call per row would hand the GIL
        over 64 times a step, and a busy server thread can hold it for milliseconds each time).
        A state whose grammar hits a per-step limit gets an error (`GrammarState.sync` then
        fails its request) and an all-zero row."""
        if len(states) == 1:
            states[0].fill_mask(mask[0, : self.mask_words])
            return
        target = mask
        if mask.shape[1] != self.mask_words or not mask.flags.c_contiguous:
            target = np.zeros((len(states), self.mask_words), dtype=np.int32)
        pairs = [(s.matcher, i) for i, s in enumerate(states)]
        nbytes = self.mask_words * 4
        start = time.perf_counter()
        self._executor().unsafe_compute_mask_ptr(pairs, target.ctypes.data, nbytes, len(states))
        took = time.perf_counter() - start
        self._wide = took > SLOW_FILL_S or (self._wide and took > SLOW_FILL_S / 4)
        if target is not mask:
            mask[:, : self.mask_words] = target

    def _executor(self) -> llguidance.LLExecutor:
        """The executor for the next fill: `fill_threads`, or the full pool after slow fills."""
        wide = self._wide and self.fill_threads is not None
        executor = self._executors.get(wide)
        if executor is None:
            executor = self._llg.LLExecutor(None if wide else self.fill_threads)
            self._executors[wide] = executor
        return executor


def _unwrap(entry: CompiledGrammar | _Failed) -> CompiledGrammar:
    if isinstance(entry, _Failed):
        raise ValueError(entry.message)
    return entry
