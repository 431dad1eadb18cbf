"""`SlotStore`: per-slot sampling policy, progress, limits and the stop rule.

One row per scheduler slot, in preallocated numpy arrays, written when a request is admitted
and at every commit, gathered when a plan is built: a decode plan is a handful of gathers and
the stop rule is vectorized over the step's sampled rows. This is the only place that decides
`stop` / `length`, and the one record of an admitted request's progress (`num_computed`,
`num_output`, in-flight `ahead`, `epoch`); its arrays are written only through its methods.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from resin.engine.penalties import CountResets, with_penalties
from resin.events import FinishReason
from resin.params import KNOBS, Column, SamplingParams
from resin.plan import SamplingArrays

I32 = npt.NDArray[np.int32]

_EMPTY_I32 = np.zeros(0, dtype=np.int32)
_EMPTY_I32.flags.writeable = False
_NEVER = 2**31 - 1

COLUMNS: dict[str, Column] = {
    name: knob.column for name, knob in KNOBS.items() if knob.column is not None
}
"""The per-slot sampling columns: the `SamplingParams` fields whose `Knob` has one."""
PENALTY_COLUMNS = tuple(name for name, column in COLUMNS.items() if column.penalty)


class SlotStore:
    """Per-slot state the planner reads and the commit writes (see module docstring).

    Invariants for an admitted slot: `num_output` counts its generated tokens; `limit` is the
    output count at which it ends with `length` (`max_output_tokens`, or fewer when prompt +
    output would reach `context_length`; at least 1 because `submit` keeps prompts shorter
    than the context); a stop token ends it from `stop_ok_from` outputs on.
    """

    def __init__(self, max_sequences: int, context_length: int) -> None:
        self.context_length = context_length
        self.last_token = np.zeros(max_sequences, dtype=np.int32)
        defaults = SamplingParams()
        self.columns = {
            name: np.full(max_sequences, c.encode(getattr(defaults, name)), dtype=c.dtype)
            for name, c in COLUMNS.items()
        }
        """`COLUMNS` by name: row s holds `encode(value)` of the request in slot s."""
        self._plain = tuple((n, a) for n, a in self.columns.items() if not COLUMNS[n].penalty)
        self._penalty = {n: self.columns[n] for n in PENALTY_COLUMNS}
        self.penalized = np.zeros(max_sequences, dtype=np.bool_)
        self.num_output = np.zeros(max_sequences, dtype=np.int32)
        self.num_computed = np.zeros(max_sequences, dtype=np.int32)
        """Tokens of the slot's sequence that are in the cache (committed steps)."""
        self.ahead = np.zeros(max_sequences, dtype=np.int32)
        """Tokens of the slot in submitted, uncollected plans (overlap, `engine/pipeline.py`):
        the next plan computes position `num_computed + ahead` with output index
        `num_output + ahead`."""
        self.epoch = np.zeros(max_sequences, dtype=np.int64)
        """Bumped whenever the slot is taken or freed: a plan row whose slot's epoch changed
        since it was submitted belongs to a request that left (`engine/pipeline.py`)."""
        self.seq_id = np.zeros(max_sequences, dtype=np.int64)
        self.limit = np.zeros(max_sequences, dtype=np.int32)
        self.stop_ok_from = np.zeros(max_sequences, dtype=np.int32)
        self.has_stops = np.zeros(max_sequences, dtype=np.bool_)
        self.stops: list[frozenset[int]] = [frozenset()] * max_sequences

    def admit(
        self,
        slot: int,
        seq_id: int,
        params: SamplingParams,
        num_prompt: int,
        outputs: list[int],
        last_token: int,
        num_computed: int,
    ) -> None:
        """A request takes `slot`; `outputs` are the tokens it generated before (recompute)."""
        s, p = slot, params
        self.last_token[s] = last_token
        self.seq_id[s] = seq_id
        self.limit[s] = min(p.max_output_tokens, self.context_length - num_prompt)
        self.stop_ok_from[s] = _NEVER if p.ignore_stop_tokens else p.min_output_tokens
        self.stops[s] = frozenset(p.stop_token_ids)
        self.has_stops[s] = bool(p.stop_token_ids)
        for name, c in COLUMNS.items():
            self.columns[name][s] = c.encode(getattr(p, name))
        self.penalized[s] = p.penalized
        self.num_output[s] = len(outputs)
        self.num_computed[s] = num_computed
        self.ahead[s] = 0
        self.epoch[s] += 1

    @property
    def num_slots(self) -> int:
        return self.epoch.size

    def release(self, slot: int) -> None:
        """The slot's request left (finished or retracted)."""
        self.epoch[slot] += 1

    def launched(self, slots: I32) -> None:
        """A plan computing one more token of each slot was submitted (overlap)."""
        self.ahead[slots] += 1

    def landed(self, slots: I32) -> None:
        """A submitted plan of these slots was collected (its tokens commit now, or never)."""
        self.ahead[slots] -= 1

    def position(self, slots: I32) -> I32:
        """The next position each slot computes: committed plus in-flight tokens."""
        return self.num_computed[slots] + self.ahead[slots]

    def sampling(
        self, slots: I32, prompt_k: I32 | None = None, resets: CountResets | None = None
    ) -> SamplingArrays:
        gathered: dict[str, Any] = {
            n: self.columns[n][slots] for n, c in COLUMNS.items() if not c.penalty
        }
        arrays = SamplingArrays(
            **gathered,
            output_index=self.num_output[slots] + self.ahead[slots],
            prompt_logprobs=_EMPTY_I32 if prompt_k is None else prompt_k,
        )
        return with_penalties(arrays, self._penalty, slots, self.penalized[slots], resets)

    def computed(self, slots: I32, totals: I32) -> None:
        """A step committed: positions < `totals` are in the cache."""
        self.num_computed[slots] = totals

    def append(
        self, slots: I32, ids: I32, counts: I32 | None = None
    ) -> tuple[I32 | None, dict[int, FinishReason]]:
        """Record `counts[i]` tokens for slot i (flat `ids`: a prefill row's one sampled token
        or none, a verify row's accepted drafts plus one); return (kept [B], {row: reason})
        for the rows that end. `counts=None` is the one-token-per-row step (decode with no
        drafts: kept is None, every token is kept), done over the batch without a Python loop
        per row except for rows with stop tokens past their minimum.

        A row keeps its tokens up to the first that ends it, exactly where one-token steps
        would have stopped: a stop token (when allowed) wins over `length` at the same token;
        tokens after the end are dropped."""
        if counts is None:
            return None, self._append_one(slots, ids)
        b = slots.size
        first = np.cumsum(counts) - counts
        j = np.arange(ids.size, dtype=np.int32) - np.repeat(first, counts).astype(np.int32)
        row = np.repeat(np.arange(b), counts)
        n_out = self.num_output[slots][row] + j + 1
        length = n_out >= self.limit[slots][row]
        stop = np.zeros(ids.size, dtype=np.bool_)
        for k in np.flatnonzero(self.has_stops[slots][row]).tolist():
            s = int(slots[row[k]])
            stop[k] = n_out[k] >= self.stop_ok_from[s] and int(ids[k]) in self.stops[s]
        hit = length | stop
        end_at = np.full(b, _NEVER, dtype=np.int64)
        np.minimum.at(end_at, row[hit], j[hit])
        ended = end_at < _NEVER
        kept = np.where(ended, end_at + 1, counts).astype(np.int32)
        ends: dict[int, FinishReason] = {}
        for i in np.flatnonzero(ended).tolist():
            k = int(first[i] + end_at[i])
            ends[i] = FinishReason.STOP if stop[k] else FinishReason.LENGTH
        some = kept > 0
        self.last_token[slots[some]] = ids[(first + kept - 1)[some]]
        self.num_output[slots] += kept
        return kept, ends

    def _append_one(self, slots: I32, ids: I32) -> dict[int, FinishReason]:
        self.last_token[slots] = ids
        n_out = self.num_output[slots] + 1
        self.num_output[slots] = n_out
        ends: dict[int, FinishReason] = {}
        length = n_out >= self.limit[slots]
        if length.any():
            ends = dict.fromkeys(np.flatnonzero(length).tolist(), FinishReason.LENGTH)
        stoppable = self.has_stops[slots]
        if stoppable.any():  # most steps: no row has stop tokens, or none is past its minimum
            maybe = np.flatnonzero(stoppable & (n_out >= self.stop_ok_from[slots]))
            for k in maybe.tolist():
                if int(ids[k]) in self.stops[int(slots[k])]:
                    ends[k] = FinishReason.STOP
        return ends
