"""The plan channel's message codec and the topology arithmetic (single process, no groups)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np
import pytest

from resin import BatchPlan, Engine, ForwardOutput, SamplingParams
from resin.backend.distributed import Kind, Message, decode, encode
from resin.backend.topology import Topology
from resin.plan import Phase
from resin.protocols import CacheLayout, History, State


class _Recorder:
    """Token 7 for every sampling row; keeps every plan it was given."""

    def __init__(self) -> None:
        self.plans: list[BatchPlan] = []

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        self.plans.append(plan)
        indptr = np.zeros(plan.num_sequences + 1, dtype=np.uint32)
        np.cumsum(plan.sample_rows, out=indptr[1:])
        return ForwardOutput(np.full(int(indptr[-1]), 7, dtype=np.uint32), indptr)


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b) and not b.flags.writeable
    elif is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b)
        for f in fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b


def test_engine_plans_survive_the_codec() -> None:
    runner = _Recorder()
    params = SamplingParams(max_output_tokens=3, temperature=0.8, top_p=0.9, seed=5)
    with Engine(runner, prefill_chunk_tokens=5, prefix_cache=True) as engine:
        for n in (1, 7, 12):
            engine.submit(list(range(1, n + 1)), params)
        while engine.has_work():
            engine.step()
    assert {p.phase for p in runner.plans} == {Phase.PREFILL, Phase.DECODE}
    for plan in runner.plans:
        message = decode(encode(Message(Kind.FORWARD, plan)))
        assert message.kind is Kind.FORWARD
        _assert_same(plan, message.payload)


def test_layout_and_empty_messages_survive_the_codec() -> None:
    layout = CacheLayout(12, 16, 4096, (History(4096), State(128)))
    assert decode(encode(Message(Kind.BIND, layout))).payload == layout
    ping = decode(encode(Message(Kind.PING)))
    assert ping.kind is Kind.PING and ping.payload is None


def test_topology_replicas_and_leaders() -> None:
    t = Topology(rank=5, world_size=8, local_rank=5, tensor_parallel=4)
    assert (t.data_parallel, t.replica, t.leader, t.is_leader) == (2, 1, 4, False)
    assert t.replica_ranks(1) == [4, 5, 6, 7]
    assert Topology(4, 8, 4, 4).is_leader
    with pytest.raises(ValueError, match="multiple of tensor_parallel"):
        Topology(0, 6, 0, 4)
    with pytest.raises(ValueError, match="outside world size"):
        Topology(8, 8, 0, 2)


def test_a_shared_leader_leads_every_replica() -> None:
    """`spawn_local`'s layout: rank 0 plus tp-1 workers per replica."""
    lead = Topology(0, 5, 0, 3, shared_leader=True)
    assert (lead.data_parallel, lead.leader, lead.is_leader) == (2, 0, True)
    assert [lead.replica_ranks(i) for i in range(2)] == [[0, 1, 2], [0, 3, 4]]
    worker = Topology(3, 5, 3, 3, shared_leader=True)
    assert (worker.replica, worker.leader, worker.is_leader) == (1, 0, False)
    assert Topology(1, 2, 1, 2, shared_leader=True).replica_ranks(0) == [0, 1]  # = plain TP=2
    with pytest.raises(ValueError, match="1 \\+ a multiple"):
        Topology(0, 4, 0, 3, shared_leader=True)


def test_the_leader_declares_what_a_broadcast_plan_can_carry() -> None:
    """A `DistributedRunner` passes its local runner's config on, except a mask filled while
    the step runs (`mask_pending` is a callable on the leader) and overlapped plans (it steps
    one plan at a time): the Engine then fills masks before the plan is broadcast."""
    from resin.backend.distributed import DistributedRunner, PlanChannel
    from resin.protocols import RunnerConfig

    class Local(_Recorder):
        runner_config = RunnerConfig(
            vocab_size=50, waits_for_masks=True, overlap=True, max_draft_tokens=3
        )

    channel = PlanChannel.__new__(PlanChannel)  # never used: no step is run here
    config = DistributedRunner(Local(), channel).runner_config
    assert (config.waits_for_masks, config.overlap) == (False, False)
    assert (config.vocab_size, config.max_draft_tokens) == (50, 3)
