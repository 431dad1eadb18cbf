"""Which data-parallel replica serves a request (`resin serve --data-parallel N`): the policy.

A pure function over what the front knows of each replica when a request arrives:

1. a replica the client named (`routed_dp_rank` in the body, `resin-routed-dp-rank` header),
   when it is alive;
2. else the live replica whose prefix cache holds the longest prefix of the prompt, when that
   prefix is at least `min_share` of the prompt (a repeated prompt, a conversation's next
   turn), among the replicas not more than `load_slack` requests busier than the least loaded
   one (so one hot prompt cannot pile every request onto one replica);
3. else the least loaded live replica (requests submitted and not finished), ties broken
   round-robin from `turn`. A short shared prefix (a system prompt every request starts with)
   thus does not decide: sequential fresh prompts alternate, and every replica caches it.

`choose` returns None when no replica is alive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LOAD_SLACK = 8
"""How many more requests than the least loaded replica a cache hit may outweigh."""
MIN_SHARE = 0.5
"""The share of the prompt a replica's cache must hold for the cache to decide."""


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica as the router sees it when a request arrives."""

    alive: bool
    load: int
    """Requests submitted to it and not finished (running, waiting, or still in its intake)."""
    cached: int = 0
    """Prompt tokens its prefix cache holds for this request (0 without a prefix cache)."""


def choose(
    replicas: Sequence[ReplicaState],
    prompt_tokens: int,
    *,
    requested: int | None = None,
    turn: int = 0,
    load_slack: int = LOAD_SLACK,
    min_share: float = MIN_SHARE,
) -> int | None:
    """The index of the replica for a prompt of `prompt_tokens` tokens (see the module
    docstring), or None when no replica is alive."""
    live = [i for i, r in enumerate(replicas) if r.alive]
    if not live:
        return None
    if requested is not None and requested in live:
        return requested
    least = min(replicas[i].load for i in live)
    near = [i for i in live if replicas[i].load <= least + load_slack]
    best = max(replicas[i].cached for i in near)
    if best > 0 and best >= min_share * prompt_tokens:
        live = [i for i in near if replicas[i].cached == best]
    lightest = min(replicas[i].load for i in live)
    tied = [i for i in live if replicas[i].load == lightest]
    n = len(replicas)
    return min(tied, key=lambda i: (i - turn) % n)
