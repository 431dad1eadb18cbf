"""Draft proposers for speculative decoding (the `Proposer` protocol is in `speculative.py`).

- `NgramProposer`: prompt lookup, model-free, in the engine process. The longest suffix of the
  sequence (prompt + output so far, `max_ngram` down to `min_ngram` tokens) that occurred
  earlier is looked up, and the tokens that followed its most recent earlier occurrence are
  the drafts. It pays off when the answer copies from the prompt (quoting, code edits).
- `DraftModelProposer`: any second runner over the same tokenizer (a small model). It owns a
  second `Engine` with prefix caching on and asks it for k greedy tokens of each request's
  current sequence; the cached prefix means only the tokens added since the last proposal are
  recomputed.
- `MtpProposer`: drafts the target runner computed itself in its last step with the
  checkpoint's multi-token-prediction layer (the reference `MtpRunner`, or a `CudaRunner`
  with `RunnerOptions.mtp`), returned in its `ForwardOutput.draft_ids` and kept with the
  request at commit (`Request.drafts`: the drafts that follow a sequence of `num_tokens`
  tokens); a sequence that moved on since gets none.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from resin.engine.engine import Engine
from resin.engine.request import Request
from resin.events import FinishReason
from resin.params import SamplingParams
from resin.protocols import Runner


class NgramProposer:
    """Prompt-lookup drafts (see module docstring)."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("n-gram sizes need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        return [
            self.lookup(r.token_array(r.num_tokens)[: r.num_tokens], k)
            for r, k in zip(requests, limits, strict=True)
        ]

    def lookup(self, seq: np.ndarray, k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of `seq`'s suffix.

        Candidates are the earlier positions holding the last token (one vectorized compare);
        each longer suffix only filters those, so a miss costs O(len(seq))."""
        ends = np.flatnonzero(seq[:-1] == seq[-1])  # an occurrence ending there, then a token
        for n in range(min(self.max_ngram, seq.size - 1), self.min_ngram - 1, -1):
            hits = ends[ends >= n - 1]
            for j in range(1, n):
                hits = hits[seq[hits - j] == seq[-1 - j]]
            if hits.size:
                start = int(hits[-1]) + 1
                return [int(t) for t in seq[start : start + k]]
        return []


class DraftModelProposer:
    """Greedy drafts from a second model (see module docstring). Not thread-safe: the target
    engine's thread drives it."""

    def __init__(
        self,
        runner: Runner,
        *,
        context_length: int = 32768,
        max_sequences: int = 256,
        max_batch_tokens: int = 8192,
    ) -> None:
        self.engine = Engine(
            runner,
            context_length=context_length,
            prefix_cache=True,
            max_sequences=max_sequences,
            max_batch_tokens=max_batch_tokens,
            enable_metrics=False,
        )

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        handles: list[Request | None] = []
        for r, k in zip(requests, limits, strict=True):
            params = SamplingParams(max_output_tokens=int(k), temperature=0.0)
            try:
                handles.append(
                    self.engine.submit(r.token_array(r.num_tokens)[: r.num_tokens].tolist(), params)
                )
            except ValueError:  # too long for the draft model's context, or off its vocabulary
                handles.append(None)
        while self.engine.has_work():
            self.engine.step()
        return [
            h.output_token_ids
            if h is not None and h.finish_reason is not FinishReason.ERROR
            else []
            for h in handles
        ]

    def close(self) -> None:
        self.engine.close()


class MtpProposer:
    """Drafts the runner proposed at each request's last step (see module docstring)."""

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        out: list[list[int]] = []
        for request, limit in zip(requests, limits, strict=True):
            num_tokens, drafts = request.drafts
            fresh = num_tokens == request.num_tokens
            out.append(list(drafts[:limit]) if fresh else [])
        return out
