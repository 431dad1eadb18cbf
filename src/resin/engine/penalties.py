"""The plan's penalty arrays: per-row penalties, token-count slots and count resets.

The runner keeps the token counts (`SamplingArrays`, "Penalties"); the engine only tells it
which slot a row counts in and, with every sampled prefill row, the request's sequence so far
to start that slot over from. A prefill row is where a request (re)enters the runner: first
admission, a recompute after retraction, a retried step. Sending the whole sequence there
makes every case the same rebuild, and decode steps cost nothing beyond the per-row columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from resin.engine.request import Request
from resin.plan import SamplingArrays

I32 = npt.NDArray[np.int32]
BoolArray = npt.NDArray[np.bool_]


class CountResets(NamedTuple):
    """Rows' count resets in CSR form (`SamplingArrays.count_reset_*`)."""

    indptr: I32
    ids: I32
    prompt: I32


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
    columns: Mapping[str, npt.NDArray[np.generic]],
    slots: I32,
    penalized: BoolArray,
    resets: CountResets | None,
) -> SamplingArrays:
    """`arrays` for rows in `slots` with their penalty columns (unchanged when no row is
    penalized): `columns` are the slot table's penalty columns by field name (all slots),
    `penalized` [B]."""
    if not penalized.any():
        return arrays
    gathered: dict[str, Any] = {name: column[slots] for name, column in columns.items()}
    arrays = replace(arrays, **gathered, count_slot=np.where(penalized, slots, -1).astype(np.int32))
    if resets is None:
        return arrays
    return replace(
        arrays,
        count_reset_indptr=resets.indptr,
        count_reset_ids=resets.ids,
        count_reset_prompt=resets.prompt,
    )
