"""The data-parallel routing policy (`resin.frontend.replica_routing.choose`), on its own."""

from __future__ import annotations

from resin.frontend.replica_routing import ReplicaState, choose


def _states(
    *loads: int, cached: tuple[int, ...] = (), alive: tuple[bool, ...] = ()
) -> list[ReplicaState]:
    cached = cached or (0,) * len(loads)
    alive = alive or (True,) * len(loads)
    return [ReplicaState(a, n, c) for n, c, a in zip(loads, cached, alive, strict=True)]


def test_the_longest_cached_prefix_wins() -> None:
    assert choose(_states(0, 0, 0, cached=(0, 64, 48)), 80) == 1
    assert choose(_states(3, 0, cached=(128, 0)), 130) == 0  # it outweighs a small load gap


def test_without_a_hit_the_least_loaded_wins() -> None:
    assert choose(_states(4, 1, 2), 50) == 1
    assert choose(_states(5, 5, 2), 50) == 2


def test_a_short_shared_prefix_does_not_decide() -> None:
    # Replica 0 holds the system prompt (32 of 100 tokens): below half the prompt, so load and
    # the turn decide, and the other replicas get fresh prompts (and cache the prefix too).
    assert choose(_states(0, 0, cached=(32, 0)), 100, turn=1) == 1
    assert choose(_states(1, 0, cached=(32, 0)), 100) == 1
    assert choose(_states(0, 0, cached=(32, 0)), 100, min_share=0.3) == 0


def test_equal_hits_go_to_the_least_loaded_of_them() -> None:
    assert choose(_states(3, 1, 0, cached=(48, 48, 16)), 60) == 1


def test_ties_rotate_with_the_turn() -> None:
    picks = [choose(_states(0, 0, 0), 10, turn=t) for t in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]
    assert choose(_states(1, 0, 0), 10, turn=0) == 1  # the turn only breaks ties
    assert choose(_states(0, 0, 0, cached=(0, 32, 32)), 40, turn=0) == 1
    assert choose(_states(0, 0, 0, cached=(0, 32, 32)), 40, turn=2) == 2


def test_a_hot_prompt_does_not_pile_up_on_one_replica() -> None:
    # Replica 0 holds the whole prompt; once it is more than `load_slack` requests ahead, the
    # least loaded one takes the request (and caches the prompt too).
    assert choose(_states(8, 0, cached=(64, 0)), 70, load_slack=8) == 0
    assert choose(_states(9, 0, cached=(64, 0)), 70, load_slack=8) == 1
    assert choose(_states(9, 0, cached=(64, 0)), 70, load_slack=0) == 1


def test_dead_replicas_are_skipped() -> None:
    assert choose(_states(0, 5, cached=(99, 0), alive=(False, True)), 100) == 1
    assert choose(_states(0, 0, alive=(False, False)), 10) is None


def test_a_named_replica_wins_while_it_is_alive() -> None:
    assert choose(_states(9, 0, cached=(0, 64)), 70, requested=0) == 0
    assert choose(_states(0, 9, alive=(True, False)), 10, requested=1) == 0  # dead: as usual
    assert choose(_states(0, 3), 10, requested=7) == 0  # no such replica: routed as usual
