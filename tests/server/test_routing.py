"""The data-parallel routing policy (`resin.server.routing.choose`), on its own."""

from __future__ import annotations

from resin.server.routing import ReplicaState, choose


def _states(
    *loads: int, cached: tuple[int, ...] = (), alive: tuple[bool, ...] = ()
) -> list[ReplicaState]:
    cached = cached or (0,) * len(loads)
    alive = alive or (True,) * len(loads)
    return [ReplicaState(a, n, c) for n, c, a in zip(loads, cached, alive, strict=True)]


def test_longest_cached_prefix_wins() -> None:
    assert choose(_states(0, 0, 0, cached=(0, 64, 32))) == 1
    assert choose(_states(3, 0, cached=(128, 0))) == 0  # a cache hit outweighs a small load gap


def test_without_a_hit_the_least_loaded_wins() -> None:
    assert choose(_states(4, 1, 2)) == 1
    assert choose(_states(5, 5, 2, cached=(0, 0, 0))) == 2


def test_equal_hits_go_to_the_least_loaded_of_them() -> None:
    assert choose(_states(3, 1, 0, cached=(48, 48, 16))) == 1


def test_ties_rotate_with_the_turn() -> None:
    picks = [choose(_states(0, 0, 0), turn=t) for t in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]
    assert choose(_states(1, 0, 0), turn=0) == 1  # the turn only breaks ties
    assert choose(_states(0, 0, 0, cached=(0, 32, 32)), turn=0) == 1
    assert choose(_states(0, 0, 0, cached=(0, 32, 32)), turn=2) == 2


def test_a_hot_prefix_does_not_pile_up_on_one_replica() -> None:
    # Replica 0 saw the shared prefix first; once it is more than `load_slack` ahead, the
    # least loaded one takes the request (and caches the prefix too).
    assert choose(_states(8, 0, cached=(64, 0)), load_slack=8) == 0
    assert choose(_states(9, 0, cached=(64, 0)), load_slack=8) == 1
    assert choose(_states(9, 0, cached=(64, 0)), load_slack=0) == 1


def test_dead_replicas_are_skipped() -> None:
    assert choose(_states(0, 5, cached=(99, 0), alive=(False, True))) == 1
    assert choose(_states(0, 0, alive=(False, False))) is None


def test_a_named_replica_wins_while_it_is_alive() -> None:
    assert choose(_states(9, 0, cached=(0, 64)), requested=0) == 0
    assert choose(_states(0, 9, alive=(True, False)), requested=1) == 0  # dead: routed as usual
    assert choose(_states(0, 3), requested=7) == 0  # no such replica: routed as usual
