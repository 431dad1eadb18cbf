"""The frozen step contract between the Engine and a Runner.

One `BatchPlan` describes one model step. The engine builds it with numpy (vectorized), makes
every array read-only, and hands it to `Runner.forward`. The runner answers with a
`ForwardOutput`. Neither side mutates what the other owns.

Notation: B = `num_sequences` (rows), T = `num_tokens` (flat query tokens of all rows),
P = page ids in one group's CSR rows, K = alternatives per logprob row.

Token addressing inside a cache group (History or Window): position `p` of row `i` lives in page
`page_ids[page_indptr[i] + p // page_size - page_start[i]]` at offset `p % page_size`.
Rows are chronological: consecutive entries hold consecutive logical pages, so attention can
walk a row from its first page. `append_slots[t] = page * page_size + offset` is the exact
arena slot where the runner writes the K/V of query token `t` (History/Window groups); every
query token has one, and the slot lies inside a page of its row.

A Compressed(ratio) group addresses entries, not tokens: entry `w` (tokens
`[w*ratio, (w+1)*ratio)`) lives in page `page_ids[page_indptr[i] + w // E]` at offset `w % E`,
E = `Compressed.entries_per_page(page_size)`; `entry_slots` name where this step's completed
entries go (`CacheGroupPlan`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U32 = npt.NDArray[np.uint32]
F32 = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]

_A = TypeVar("_A", bound=np.ndarray[Any, Any])

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class Phase(enum.Enum):
    """Batches are phase-homogeneous: every row of a plan is prefill or every row is decode."""

    PREFILL = "prefill"
    DECODE = "decode"


def _empty_i32() -> I32:
    return _EMPTY_I32


def _empty_i64() -> I64:
    return _EMPTY_I64


def _frozen(array: _A) -> _A:
    array.flags.writeable = False
    return array


_EMPTY_I32: I32 = _frozen(np.zeros(0, dtype=np.int32))
_EMPTY_I64: I64 = _frozen(np.zeros(0, dtype=np.int64))
"""Shared read-only empty defaults: a plan's unused fields cost no allocation."""


def freeze_arrays(obj: DataclassInstance) -> None:
    """Make every numpy array field of a dataclass instance read-only (idempotent)."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, np.ndarray):
            value.flags.writeable = False


@dataclass(frozen=True, slots=True, eq=False)
class CacheGroupPlan:
    """What one cache group (declared in `RunnerConfig.cache_groups`) does in this step.

    Each kind fills its own fields and leaves the others empty (length 0):

    History / Window: `page_indptr`, `page_ids`, `page_start` and `append_slots`.
    - `page_indptr`: int32 [B+1]; `page_ids`: int32 [P], chronological per row.
    - `page_start`: int32 [B], logical index of each row's first listed page (0 for History;
      for Window, pages wholly older than the window are dropped from the row).
    - `append_slots`: int64 [T], exact arena slot of every query token.

    Compressed(ratio): `page_indptr`, `page_ids`, `page_start` in entry pages, and the
    `entry_*` fields; `append_slots` is empty (no per-token slot). With E entries per page:
    - row i lists the pages of its complete entries after this step, `[0, total_lens[i] //
      ratio)`: `ceil((total_lens[i] // ratio) / E)` pages, chronological, `page_start` 0 (a
      row with no complete entry lists none). A query at position p reads entries
      `w < (p + 1) // ratio`; everything a row lists is written before or in this step.
    - `entry_indptr`: int32 [B+1]; row i emits the entries completed by its query tokens,
      `w = cached_lens[i] // ratio + j` for `j < entry_indptr[i+1] - entry_indptr[i]`
      (that count is `total_lens[i] // ratio - cached_lens[i] // ratio`), in order.
    - `entry_slots`: int64 [N], the arena slot (`page * E + w % E`) of each emitted entry,
      inside a page of its row; no two entries of a step share a slot.
    - `entry_token`: int32 [N], the flat query-token index that completes each entry (the
      token at position `(w + 1) * ratio - 1`); the runner computes the entry once that
      token's inputs are known and writes it before any later query of the row reads it.
    The pending tail (`[total // ratio * ratio, total)`) is never in the group: the runner
    keeps it in its own State group.

    State: `state_in` / `state_out` (int32 [B], page ids in the state region): the page
    holding the row's input checkpoint (-1: start from the zero state) and the page to write
    the state after the row's last query token. The input page is immutable for this step;
    when `state_in != state_out` the runner reads one and writes the other (no copy needed
    when they are equal, in place). `checkpoint_indptr` [B+1] / `checkpoint_token` [C] (flat
    query-token index) / `checkpoint_page` [C] ask the runner to also store the state *after*
    those query tokens into those pages; the engine asks for them at page-aligned prompt
    positions so prefix caching can resume hybrid models there (best effort: fewer when the
    state region is short).

    `copy_src` / `copy_dst` (int32 [X]): whole-page copies the runner performs before anything
    else in this step, in order. Runners honour them; today's engine never asks for any (hits
    are whole immutable pages and new pages are always fresh, see docs/engine.md).
    """

    group: int
    page_indptr: I32 = field(default_factory=_empty_i32)
    page_ids: I32 = field(default_factory=_empty_i32)
    page_start: I32 = field(default_factory=_empty_i32)
    append_slots: I64 = field(default_factory=_empty_i64)
    state_in: I32 = field(default_factory=_empty_i32)
    state_out: I32 = field(default_factory=_empty_i32)
    checkpoint_indptr: I32 = field(default_factory=_empty_i32)
    checkpoint_token: I32 = field(default_factory=_empty_i32)
    checkpoint_page: I32 = field(default_factory=_empty_i32)
    copy_src: I32 = field(default_factory=_empty_i32)
    copy_dst: I32 = field(default_factory=_empty_i32)
    entry_indptr: I32 = field(default_factory=_empty_i32)
    entry_slots: I64 = field(default_factory=_empty_i64)
    entry_token: I32 = field(default_factory=_empty_i32)

    def __post_init__(self) -> None:
        freeze_arrays(self)


@dataclass(frozen=True, slots=True, eq=False)
class SamplingArrays:
    """Per-row sampling policy, one entry per plan row (B).

    - `temperature` f32 (0 = greedy), `top_p` f32, `top_k` i32 (0 = off), `min_p` f32;
    - `seed` i64 (-1 = unseeded); `output_index` i32: how many tokens the row's request has
      generated before this step. A seeded sampler derives its randomness from
      (seed, output_index) only, so a request samples the same tokens whatever batch it is in;
    - `logprobs` i32: -1 = none, 0 = chosen token only, k = chosen plus top-k alternatives.
    - `prompt_logprobs` i32 (-1 = none, k = top-k alternatives per prompt token) for rows in
      `BatchPlan.prompt_logprob_rows`; empty when no row asks (older runners may ignore it).
    - `token_bitmask` int32 [B, ceil(V/32)] (V = the runner's vocabulary) or None when no row is
      constrained: bit `t % 32` of word `t // 32` of row i is 1 when token t is allowed
      (little-endian bit order, the word read as uint32). Unconstrained rows are all ones.
      A runner sets the logits of disallowed tokens to -inf before anything else.
    - `bias_indptr` int32 [B+1] / `bias_ids` int32 [E] / `bias_values` f32 [E]: additive logit
      biases in CSR form (row i's pairs are `bias_indptr[i]:bias_indptr[i+1]`); all three are
      empty when no row has a bias. Applied together with the mask, before temperature;
      logprobs are those of the masked, biased logits (`docs/constraints.md`).
    - `mask_pending`: None, or a callable that blocks until the engine has finished filling
      `token_bitmask` on its worker thread (only for runners that declare
      `RunnerConfig.waits_for_masks`); read the mask through `bitmask()`, which waits.
    - `temperature` below `resin.params.GREEDY_TEMPERATURE` is greedy, like 0.

    Penalties (only for runners whose `RunnerConfig.features` name them; all seven arrays are
    empty when no row of the plan has one, and runners then skip them):
    - `presence_penalty` / `frequency_penalty` / `repetition_penalty` f32 [B] (0, 0, 1 = off);
    - `count_slot` i32 [B]: the row's token-count slot (-1: the row has no penalty). The
      runner keeps, per slot s, `counts[s, v]` (times token v was generated) and `prompt[s, v]`
      (v occurs in the prompt). A request keeps its slot while it is admitted (the engine's
      scheduler slot, below `max_sequences`), so the runner may size its tables lazily;
    - `count_reset_indptr` i32 [B+1] / `count_reset_ids` i32 [R] / `count_reset_prompt` i32 [B]:
      rows whose range is non-empty start their slot over, before sampling, from those ids:
      the first `count_reset_prompt[i]` are prompt tokens (`prompt` set), the rest generated
      ones (counted). The engine sends the request's whole sequence with every sampled row of
      a prefill plan (first admission, a recompute after retraction, a retried step: the
      counts are rebuilt, never added twice); decode rows never reset. The reset arrays are
      empty in plans with no reset.
    - After sampling, the runner counts each penalized row's sampled token (on its device: no
      host round trip, so overlapped plans stay exact). Penalized rows never carry drafts.
    The penalties change a sampled row's logits after mask and bias, before temperature:
    `x = x / r if x > 0 else x * r` for tokens in `prompt | counts > 0`, then
    `x -= frequency * counts + presence * (counts > 0)`; logprobs are those of the result.
    """

    temperature: F32
    top_p: F32
    top_k: I32
    min_p: F32
    seed: I64
    output_index: I32
    logprobs: I32
    prompt_logprobs: I32 = field(default_factory=_empty_i32)
    token_bitmask: I32 | None = None
    bias_indptr: I32 = field(default_factory=_empty_i32)
    bias_ids: I32 = field(default_factory=_empty_i32)
    bias_values: F32 = field(default_factory=lambda: _frozen(np.zeros(0, dtype=np.float32)))
    mask_pending: Callable[[], object] | None = None
    presence_penalty: F32 = field(default_factory=lambda: _frozen(np.zeros(0, dtype=np.float32)))
    frequency_penalty: F32 = field(default_factory=lambda: _frozen(np.zeros(0, dtype=np.float32)))
    repetition_penalty: F32 = field(default_factory=lambda: _frozen(np.zeros(0, dtype=np.float32)))
    count_slot: I32 = field(default_factory=_empty_i32)
    count_reset_indptr: I32 = field(default_factory=_empty_i32)
    count_reset_ids: I32 = field(default_factory=_empty_i32)
    count_reset_prompt: I32 = field(default_factory=_empty_i32)

    def __post_init__(self) -> None:
        freeze_arrays(self)

    def wait_for_mask(self) -> None:
        """Block until `token_bitmask` is complete (at once when it was filled up front)."""
        if self.mask_pending is not None:
            self.mask_pending()

    def bitmask(self) -> I32 | None:
        """`token_bitmask`, once complete."""
        self.wait_for_mask()
        return self.token_bitmask

    @property
    def constrained(self) -> bool:
        """Whether any row has a token mask or a logit bias (runners skip both when not)."""
        return self.token_bitmask is not None or self.bias_ids.size > 0

    @property
    def penalized(self) -> bool:
        """Whether any row has a penalty (runners skip the token counts when not)."""
        return self.count_slot.size > 0

    @property
    def max_logprobs(self) -> int:
        return int(self.logprobs.max(initial=-1))


@dataclass(frozen=True, slots=True, eq=False)
class MediaItem:
    """One image (or video) of a plan row, in the row's own token stream.

    - `row`: plan row; `position`: sequence position of the item's first placeholder token;
      `length`: how many placeholder tokens it fills. The span may lie partly before this
      step (already in the cache), partly in it, partly after (chunked prefill cut it): the
      query tokens at positions `max(position, cached_lens[row]) .. min(end, total_lens[row])`
      take rows `(p - position)` of the item's encoder output.
    - `content_hash`: hex digest of the image bytes; the runner caches encoder outputs by it,
      so an image is encoded once however many chunks (or rows) consume it.
    - `data`: the preprocessed tensor (float32; layout per family, e.g. Gemma 3 [3, 896, 896],
      Qwen2-VL flat patches [t*h*w, 3*2*14*14]); `grid_thw` (t, h, w) in patches for families
      with dynamic resolution, (1, 1, 1) otherwise.
    - `bidirectional`: the family attends both ways inside the span (Gemma 3); the engine then
      never ends a prefill chunk inside it (cutting would change the math).
    A row lists every item whose span starts before `total_lens[row]`, in position order, even
    ones wholly in the cache: families with multimodal positions (Qwen's M-RoPE) need them to
    place later text.
    """

    row: int
    position: int
    length: int
    content_hash: str
    data: F32
    grid_thw: tuple[int, int, int] = (1, 1, 1)
    bidirectional: bool = False

    def __post_init__(self) -> None:
        freeze_arrays(self)

    @property
    def end(self) -> int:
        return self.position + self.length


@dataclass(frozen=True, slots=True, eq=False)
class BatchPlan:
    """One frozen model step. All arrays are read-only numpy arrays.

    Invariants:
    - rows are phase-homogeneous (`phase`); B >= 1, T >= B;
    - `query_indptr` int32 [B+1], non-decreasing, `query_indptr[-1] == T`;
    - `input_ids` int32 [T], `positions` int32 [T]: row i's query tokens sit at positions
      `cached_lens[i] .. total_lens[i] - 1` in order;
    - `cached_lens` / `total_lens` int32 [B]: context in the cache before / after this step;
    - `sample_rows` bool [B]: rows whose last query token's logits produce a token (a partial
      prefill chunk samples none and must get 0 tokens back);
    - `sequence_ids` int64 [B]: the engine's stable request id of each row;
    - `cache_groups`: one `CacheGroupPlan` per group of `RunnerConfig.cache_groups`, in order;
    - `prompt_logprob_rows` bool [B] and `target_ids` int32 [T]: rows that want the logprob of
      each next prompt token; `target_ids[t]` is the token that follows query token t
      (-1 where it is not yet known);
    - `draft_indptr` int32 [B+1] / `draft_ids` int32 [D]: speculative draft tokens (decode only;
      both empty when not speculating). A row with k drafts has 1 + k query tokens: its ordinary
      input token, then its drafts (`input_ids[q0 + 1 : q0 + 1 + k]` equals the row's slice of
      `draft_ids`), with consecutive positions and an append slot for each. The runner verifies
      them in one forward and returns 1..k+1 tokens for the row (accepted drafts + one);
      `docs/engine.md` gives the acceptance rule. Constrained rows never carry drafts.
    - `prev_token_rows` int32 [B] (empty when unused; only for runners that declare
      `RunnerConfig.overlap`): r >= 0 says the row's first query token is the token row r of the
      *previous plan this runner accepted* sampled (`input_ids` holds -1 there; a `submit` that
      raised does not count, a `forward` does); -1 says `input_ids` is given. Only draft-free
      decode rows use it, and row r always sampled (it is the same request one step earlier).
    - `media`: the rows' images (`MediaItem`), empty for text-only steps; a runner without a
      vision encoder refuses a plan that carries any.
    """

    step_id: int
    phase: Phase
    sequence_ids: I64
    input_ids: I32
    query_indptr: I32
    positions: I32
    cached_lens: I32
    total_lens: I32
    sample_rows: BoolArray
    sampling: SamplingArrays
    cache_groups: tuple[CacheGroupPlan, ...]
    prompt_logprob_rows: BoolArray
    target_ids: I32
    draft_indptr: I32
    draft_ids: I32
    prev_token_rows: I32 = field(default_factory=_empty_i32)
    media: tuple[MediaItem, ...] = ()

    def __post_init__(self) -> None:
        freeze_arrays(self)

    @property
    def num_sequences(self) -> int:
        return int(self.sequence_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def query_lens(self) -> I32:
        return np.diff(self.query_indptr).astype(np.int32)

    @property
    def last_token_index(self) -> I32:
        """Flat index of each row's last query token (where logits are sampled)."""
        return (self.query_indptr[1:] - 1).astype(np.int32)


@dataclass(frozen=True, slots=True, eq=False)
class ForwardOutput:
    """What a runner returns for one plan.

    - `token_ids` uint32 [N] and `token_indptr` uint32 [B+1]: row i's tokens are
      `token_ids[token_indptr[i]:token_indptr[i+1]]`: 0 tokens (a row that does not sample),
      1 (ordinary), or accepted drafts + 1 (speculative).
    - `logprobs` f32 [N]: logprob of each returned token (rows that asked; NaN elsewhere).
    - `top_ids` i32 [N, K] / `top_logprobs` f32 [N, K]: alternatives, K = the plan's largest
      `sampling.logprobs` (rows asking fewer read a prefix).
    - `prompt_logprobs` f32 [T]: logprob of `plan.target_ids[t]` after query token t, for rows in
      `prompt_logprob_rows` (NaN elsewhere); `prompt_top_ids` / `prompt_top_logprobs` [T, K].
    - `observations`: (name, value) pairs the runner wants in the engine's metrics.
    - `draft_ids` i32 [D] / `draft_indptr` i32 [B+1] (both or neither): drafts the runner
      proposes for each row's next step (multi-token prediction): row i's
      `draft_ids[draft_indptr[i]:draft_indptr[i+1]]` follow its sequence once this step's
      tokens are appended; a row that returns no token proposes none. The engine keeps them
      with the request (`Request.drafts`) for a `Proposer` (`MtpProposer`) to offer back.
    The engine validates shapes and ranges; an invalid output quarantines the plan's rows.
    """

    token_ids: U32
    token_indptr: U32
    logprobs: F32 | None = None
    top_ids: I32 | None = None
    top_logprobs: F32 | None = None
    prompt_logprobs: F32 | None = None
    prompt_top_ids: I32 | None = None
    prompt_top_logprobs: F32 | None = None
    observations: tuple[tuple[str, float], ...] = ()
    draft_ids: I32 | None = None
    draft_indptr: I32 | None = None
