"""Runner contracts: the one required method, the optional parts, and cache-group specs.

A runner needs only `forward(plan) -> ForwardOutput`. Optionally it exposes `runner_config`
(vocabulary size, page size, cache groups, bytes available for the cache), `bind(layout)`
(called exactly once, after the engine sized the one physical page arena and before the first
`forward`), and `close()`. An asynchronous runner offers `submit(plan)` + `collect()` instead
of (or beside) `forward`, so the engine can do CPU work for the next step while the device runs.

Cache groups share **one** arena in two regions (`CacheLayout`). The token region has
`num_pages` pages of `page_bytes` bytes, the largest `bytes_per_page` of the History, Window and
Compressed groups; each such group views the first `bytes_per_page` bytes of every token page
with its own shape. A History/Window page holds `page_size` tokens of that group's layers, a
Compressed page `Compressed.entries_per_page(page_size)` entries. The state region follows it:
`state_pages` pages of `state_page_bytes` bytes (the largest State `bytes_per_page`), each one
recurrent-state checkpoint, so a hybrid model's token pages are not sized by its state.
State page ids (`CacheGroupPlan.state_in`, ...) count from 0 inside the state region.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import ClassVar, Protocol, runtime_checkable

from resin.params import KNOBS, SamplingParams
from resin.plan import BatchPlan, ForwardOutput


@dataclass(frozen=True, slots=True)
class History:
    """Full-attention KV: grows on demand, page by page, for the whole context."""

    bytes_per_page: int = 0

    state_region: ClassVar[bool] = False
    """Whether the group's pages live in the state region (State) or the token region."""

    def rewinds(self, tokens: int) -> bool:
        """Whether a step may keep up to `tokens` fewer positions than it computed
        (speculative drafts rejected)."""
        return True

    def check_page_size(self, page_size: int) -> None:
        """A `ValueError` when the group cannot use pages of `page_size` tokens."""


@dataclass(frozen=True, slots=True)
class Window:
    """Sliding-window KV: query at position p attends to positions (p - size, p].

    A row lists only the pages still inside the window (chronological, `page_start` gives the
    first one's logical index); older pages are released (or kept by the prefix cache).
    """

    size: int
    bytes_per_page: int = 0

    state_region: ClassVar[bool] = False

    def rewinds(self, tokens: int) -> bool:
        """Whether a step may keep up to `tokens` fewer positions than it computed."""
        return True

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("Window size must be >= 1")

    def check_page_size(self, page_size: int) -> None:
        """A `ValueError` when the group cannot use pages of `page_size` tokens."""


@dataclass(frozen=True, slots=True)
class State:
    """Fixed-size recurrent / conv state per sequence, with a two-checkpoint ring.

    `bytes_per_page`: bytes of one checkpoint; its pages live in the arena's state region.
    `rewind`: how many of a step's last tokens the state it writes can still drop. A
    recurrent state (0) holds only the step's end; a state of raw per-token inputs
    (DeepSeek-V4's compressor projections) can keep enough of them to serve any length from
    `total - rewind` to `total`, which is what speculative decoding with up to `rewind`
    drafts needs (the next step reads it as of the length the engine kept).
    """

    bytes_per_page: int = 0
    rewind: int = 0

    state_region: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.rewind < 0:
            raise ValueError("State rewind must be >= 0")

    def rewinds(self, tokens: int) -> bool:
        """Whether a step may keep up to `tokens` fewer positions than it computed."""
        return tokens <= self.rewind

    def check_page_size(self, page_size: int) -> None:
        """A `ValueError` when the group cannot use pages of `page_size` tokens."""


@dataclass(frozen=True, slots=True)
class Compressed:
    """Compressed history: one entry per `ratio` tokens, for the whole context.

    Entry `w` stands for the block of tokens `[w * ratio, (w + 1) * ratio)`. The runner writes
    it in the step whose query tokens include the block's last token (position
    `(w + 1) * ratio - 1`), at the arena slot the plan names (`CacheGroupPlan.entry_slots`);
    a query at position `p` sees entries `w < (p + 1) // ratio` only, so an entry is visible
    from the token that completes it on. The tokens of the incomplete block (the pending
    tail) and anything else an entry needs beyond its own block (DeepSeek-V4's CSA overlap)
    are the runner's to keep, in a `State` group it declares beside this one.

    A page holds `E = entries_per_page(page_size) = max(1, page_size // ratio)` entries, so it
    covers `max(page_size, ratio)` tokens; `ratio` must divide `page_size` or be a multiple of
    it. Entry `w` of a row lives in page `page_ids[page_indptr[i] + w // E]` at offset `w % E`
    (arena slot `page * E + w % E`). Pages are append-only and immutable once full, and a
    prefix hit of `h` tokens (a multiple of `page_size`) shares the pages of entries
    `[0, h // ratio)` like History pages: those pages are always complete.
    `bytes_per_page`: bytes of one page (E entries of the group's layers).
    """

    ratio: int
    bytes_per_page: int = 0

    state_region: ClassVar[bool] = False

    def rewinds(self, tokens: int) -> bool:
        """Whether a step may keep up to `tokens` fewer positions than it computed."""
        return True

    def __post_init__(self) -> None:
        if self.ratio < 1:
            raise ValueError("Compressed ratio must be >= 1")

    def check_page_size(self, page_size: int) -> None:
        """A `ValueError` when the group cannot use pages of `page_size` tokens."""
        if page_size % self.ratio and self.ratio % page_size:
            raise ValueError(
                f"a Compressed ratio must divide page_size or be a multiple of it, got "
                f"ratio {self.ratio} with page_size {page_size}"
            )

    def entries_per_page(self, page_size: int) -> int:
        """Entries one page holds."""
        return max(1, page_size // self.ratio)

    def page_tokens(self, page_size: int) -> int:
        """Tokens one full page covers."""
        return max(page_size, self.ratio)


CacheGroupSpec = History | Window | State | Compressed

CORE_FIELDS = frozenset(name for name, knob in KNOBS.items() if knob.core)
"""`SamplingParams` fields every runner honours (limits and stops are the engine's; temperature
is sampling itself)."""

OPTIONAL_FEATURES: frozenset[str] = frozenset(
    {name for name, knob in KNOBS.items() if not knob.core} | {"media"}
)
"""What a runner may lack: every other `SamplingParams` field (a request uses one when its value
differs from the field's default), and `media` (images; `Engine.submit(media=...)`)."""

PENALTY_FEATURES: frozenset[str] = frozenset(
    name for name, knob in KNOBS.items() if knob.column is not None and knob.column.penalty
)
"""The penalty fields: a runner implements all three (token counts on its side) or none."""

_FEATURE_NAMES = {
    "prompt_logprobs": "prompt_logprobs (echo with logprobs)",
    "constraint": "constraint (response_format, a grammar or a forced tool call)",
    "media": "media (images)",
}


def requested_features(params: SamplingParams, has_media: bool = False) -> frozenset[str]:
    """The optional features a request uses (`OPTIONAL_FEATURES`)."""
    used = {"media"} if has_media else set()
    for f in fields(SamplingParams):
        if f.name in CORE_FIELDS:
            continue
        default = f.default if f.default_factory is MISSING else f.default_factory()
        if getattr(params, f.name) != default:
            used.add(f.name)
    return frozenset(used)


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """What a runner tells the engine about itself. All fields optional with safe defaults.

    - `vocab_size`: token ids must be in [0, vocab_size); None = unchecked.
    - `page_size`: tokens per History/Window page (a Compressed page: `Compressed`).
    - `cache_groups`: declared groups, in the order plans list them.
    - `num_pages`: an exact token-region size (tests, tiny pools); else the engine splits
      `cache_bytes` between the token and state regions (`resolve_layout`: enough states for
      the sequences the token pages hold at full context); else it picks a size that fits
      `max_sequences` full contexts (fake runners).
    - `num_state_pages`: an exact state-region size (with `num_pages`); else every admitted
      sequence's two-checkpoint ring per State group plus room for prefix checkpoints.
    - `layer_groups`: optional, per model layer, the indices of the groups that layer reads
      (a DeepSeek-V4 CSA layer: its Window, its Compressed(4) and the indexer's keys); the
      engine only checks it, for runners and reports.
    - `max_logprobs`: the most top-k logprob alternatives the runner can return.
    - `waits_for_masks`: the runner reads `plan.sampling.token_bitmask` only after
      `plan.sampling.wait_for_mask()` (or through `bitmask()`), so the engine may fill the
      mask on a worker thread while the runner runs the model (`docs/constraints.md`).
    - `max_draft_tokens`: the most speculative drafts per row the runner verifies (0 = none; the
      engine proposes no drafts to such a runner).
    - `overlap`: the runner resolves `BatchPlan.prev_token_rows` on the device, so the engine
      may submit step n+1 before step n's tokens reach the host (AsyncRunner only).
    - `features`: the `OPTIONAL_FEATURES` the runner implements; `Engine.submit` refuses a
      request that uses any other with a `ValueError` naming the field (HTTP 400), so nothing
      is silently ignored. The default (all) suits runners that implement every one or ignore
      the sampling policy by design (test doubles); a runner that lacks one must leave it out.
      Penalties (`PENALTY_FEATURES`) mean the runner keeps token counts and applies presence,
      frequency and repetition penalties from `SamplingArrays`.
    """

    vocab_size: int | None = None
    page_size: int = 16
    cache_groups: tuple[CacheGroupSpec, ...] = (History(),)
    num_pages: int | None = None
    cache_bytes: int | None = None
    num_state_pages: int | None = None
    layer_groups: tuple[tuple[int, ...], ...] | None = None
    max_logprobs: int = 20
    waits_for_masks: bool = False
    max_draft_tokens: int = 0
    overlap: bool = False
    features: frozenset[str] = OPTIONAL_FEATURES

    def __post_init__(self) -> None:
        unknown = sorted(set(self.features) - OPTIONAL_FEATURES)
        if unknown:
            raise ValueError(
                f"unknown runner features {unknown}; known: {sorted(OPTIONAL_FEATURES)}"
            )
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if not self.cache_groups:
            raise ValueError("a runner needs at least one cache group")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError("vocab_size must be >= 1")
        for g in self.cache_groups:
            g.check_page_size(self.page_size)
        for layer in self.layer_groups or ():
            bad = [gi for gi in layer if not 0 <= gi < len(self.cache_groups)]
            if bad:
                raise ValueError(f"layer_groups names groups {bad} that are not declared")

    @property
    def page_bytes(self) -> int:
        """Bytes of one token-region page: the largest History/Window/Compressed page."""
        return max((g.bytes_per_page for g in self.cache_groups if not g.state_region), default=0)

    @property
    def state_page_bytes(self) -> int:
        """Bytes of one state-region page: the largest State checkpoint."""
        return max((g.bytes_per_page for g in self.cache_groups if g.state_region), default=0)

    def check_request(self, params: SamplingParams, has_media: bool = False) -> None:
        """`ValueError` naming each optional feature the request uses that the runner lacks."""
        missing = sorted(requested_features(params, has_media) - self.features)
        if missing:
            names = ", ".join(_FEATURE_NAMES.get(name, name) for name in missing)
            raise ValueError(f"this model runner does not support {names}")


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """The arena the engine sized, handed to `Runner.bind` once: `num_pages` token pages of
    `page_bytes` bytes, then `state_pages` state pages of `state_page_bytes` bytes (module
    docstring); `arena_bytes` in all."""

    num_pages: int
    page_size: int
    page_bytes: int
    groups: tuple[CacheGroupSpec, ...]
    state_pages: int = 0
    state_page_bytes: int = 0

    @property
    def arena_bytes(self) -> int:
        return self.num_pages * self.page_bytes + self.state_pages * self.state_page_bytes


@runtime_checkable
class Runner(Protocol):
    """A synchronous model runner: one method."""

    def forward(self, plan: BatchPlan) -> ForwardOutput: ...


@runtime_checkable
class BindableRunner(Protocol):
    def bind(self, layout: CacheLayout) -> None: ...


@runtime_checkable
class ClosableRunner(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class AsyncRunner(Protocol):
    """Submit a plan and collect its output later.

    `submit` returning means the runner accepted the plan (a later failure is post-accept);
    raising `RetryableRunnerError` from `submit` means it did not. A runner whose
    `RunnerConfig.overlap` is True accepts a second plan while one is uncollected (at most two
    in flight); `collect()` returns outputs in submission order, and it resolves
    `BatchPlan.prev_token_rows` against the previous plan it accepted. Others hold one at a
    time. A failure reported by `collect` is post-accept: the engine quarantines that plan's
    requests (and drops their rows in the plan behind it, docs/engine.md "Overlap").
    """

    def submit(self, plan: BatchPlan) -> None: ...

    def collect(self) -> ForwardOutput: ...
