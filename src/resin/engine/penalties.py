"""The plan's penalty arrays: per-row penalties, token-count slots and count resets.

The runner keeps the token counts (`SamplingArrays`, "Penalties"); the engine only tells it
which slot a row counts in and, with every sampled prefill row, the request's sequence so far
to start that slot over from. A prefill row is where a request (re)enters the runner: first
admission, a recompute after retraction, a retried step. Sending the whole sequence there
makes every case the same rebuild, and decode steps cost nothing beyond the per-row columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from resin.engine.request import Request
from resin.params import SamplingParams
from resin.plan import SamplingArrays

I32 = npt.NDArray[np.int32]
F32 = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]

OFF = (0.0, 0.0, 1.0)
"""(presence, frequency, repetition) of a request without penalties."""


class CountResets(NamedTuple):
    """Rows' count resets in CSR form (`SamplingArrays.count_reset_*`)."""

    indptr: I32
    ids: I32
    prompt: I32


def penalty_values(params: SamplingParams) -> tuple[float, float, float]:
    return (params.presence_penalty, params.frequency_penalty, params.repetition_penalty)


def count_resets(requests: Sequence[Request], sample_rows: BoolArray) -> CountResets | None:
    """The resets of a prefill plan: every sampled row of a penalized request starts over from
    its whole sequence (prompt, then the tokens generated before a recompute); None if none."""
    rows = [i for i, r in enumerate(requests) if sample_rows[i] and r.sampling_params.penalized]
    if not rows:
        return None
    b = len(requests)
    lens = np.zeros(b, dtype=np.int32)
    prompt = np.zeros(b, dtype=np.int32)
    parts = []
    for i in rows:
        r = requests[i]
        parts.append(r.token_array(r.num_tokens))
        lens[i], prompt[i] = r.num_tokens, r.num_prompt_tokens
    indptr = np.zeros(b + 1, dtype=np.int32)
    np.cumsum(lens, out=indptr[1:])
    return CountResets(indptr, np.concatenate(parts).astype(np.int32, copy=False), prompt)


def with_penalties(
    arrays: SamplingArrays,
    values: F32,
    slots: I32,
    penalized: BoolArray,
    resets: CountResets | None,
) -> SamplingArrays:
    """`arrays` for rows in `slots` with their penalty columns (unchanged when no row is
    penalized): `values` [B, 3] (presence, frequency, repetition), `penalized` [B]."""
    if not penalized.any():
        return arrays
    arrays = replace(
        arrays,
        presence_penalty=np.ascontiguousarray(values[:, 0]),
        frequency_penalty=np.ascontiguousarray(values[:, 1]),
        repetition_penalty=np.ascontiguousarray(values[:, 2]),
        count_slot=np.where(penalized, slots, -1).astype(np.int32),
    )
    if resets is None:
        return arrays
    return replace(
        arrays,
        count_reset_indptr=resets.indptr,
        count_reset_ids=resets.ids,
        count_reset_prompt=resets.prompt,
    )
