"""CudaRunner parts testable on CPU: plan-to-buffer staging (one and two cache groups), graph
buckets, presets, bad inputs. The model-level checks live in test_vs_reference.py (every
architecture against the reference runner) and test_bf16.py (bf16 error vs transformers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resin.plan import Phase
from resin_model.presets import PRESETS, preset
from resin_models_cuda.graphs import buckets_up_to, pick_bucket


def test_decode_buffers_stage_plan_and_padding() -> None:
    from resin_app.bench.plans import PagedPlanner
    from resin_models_cuda.buffers import DecodeBuffers

    planner = PagedPlanner(num_pages=32, page_size=4)
    seqs = [planner.new_sequence(list(range(n))) for n in (5, 9)]
    for s in seqs:
        s.cached = len(s.tokens) - 1
    plan = planner.plan([(s, 1) for s in seqs], Phase.DECODE)
    buffers = DecodeBuffers(max_rows=4, max_page_ids=16, device="cpu")
    buffers.stage_padding(4)
    buffers.stage(plan, rows=4)
    v = buffers.views(4)
    assert v.input_ids.tolist() == [4, 8, 0, 0]
    assert v.positions.tolist() == [4, 8, 0, 0]
    assert v.seq_lens.tolist() == [5, 9, 0, 0]
    g = plan.cache_groups[0]
    assert v.groups[0].slots.tolist() == [*g.append_slots.tolist(), -1, -1]
    assert v.groups[0].page_indptr.tolist() == [0, 2, 5, 5, 5]
    assert v.groups[0].page_ids[:5].tolist() == g.page_ids.tolist()
    with pytest.raises(ValueError, match="do not fit"):
        buffers.stage(plan, rows=1)


def test_decode_buffers_two_groups_share_one_page_id_region() -> None:
    from resin_app.bench.plans import PagedPlanner
    from resin_models_cuda.buffers import DecodeBuffers

    planner = PagedPlanner(num_pages=32, page_size=4, num_groups=2)
    seqs = [planner.new_sequence(list(range(n))) for n in (5, 9)]
    for s in seqs:
        s.cached = len(s.tokens) - 1
    plan = planner.plan([(s, 1) for s in seqs], Phase.DECODE)
    buffers = DecodeBuffers(max_rows=2, max_page_ids=32, device="cpu", num_groups=2)
    buffers.stage(plan, rows=2)
    v = buffers.views(2)
    for gi, g in enumerate(plan.cache_groups):
        indptr = v.groups[gi].page_indptr.tolist()
        pages = v.groups[gi].page_ids[indptr[0] : indptr[-1]].tolist()
        assert pages == g.page_ids.tolist()  # group 1's rows point past group 0's ids
        assert v.groups[gi].slots.tolist() == g.append_slots.tolist()
    assert plan.cache_groups[1].page_ids.min() >= 16  # the groups use disjoint pages


def test_decode_buffers_stage_entries_and_every_state_group() -> None:
    """A Compressed group's completed entries go to their token's query slot (`entry_at`, -1
    elsewhere and on padding rows); each State group after the token groups has its own
    `state_in` / `state_out` rows."""
    from dataclasses import replace

    from resin.plan import CacheGroupPlan
    from resin_app.bench.plans import PagedPlanner
    from resin_models_cuda.buffers import DecodeBuffers

    planner = PagedPlanner(num_pages=32, page_size=4)
    seqs = [planner.new_sequence(list(range(n))) for n in (5, 8)]
    for s in seqs:
        s.cached = len(s.tokens) - 1
    plan = planner.plan([(s, 1) for s in seqs], Phase.DECODE)
    i32 = np.int32
    window = plan.cache_groups[0]
    compressed = CacheGroupPlan(
        1, np.array([0, 0, 1], i32), np.array([3], i32), np.zeros(2, i32),
        entry_indptr=np.array([0, 0, 1], i32), entry_slots=np.array([13]),
        entry_token=np.array([1], i32),
    )  # fmt: skip
    states = [CacheGroupPlan(2 + k, state_in=np.array([k, 5], i32),
                             state_out=np.array([k + 2, 6], i32)) for k in range(2)]  # fmt: skip
    plan = replace(plan, cache_groups=(window, compressed, *states))
    buffers = DecodeBuffers(max_rows=4, max_page_ids=16, device="cpu", num_groups=2, num_states=2)
    buffers.stage(plan, rows=4)
    v = buffers.views(4)
    assert v.groups[1].entry_at is not None and v.groups[0].entry_at is not None
    assert v.groups[1].entry_at.tolist() == [-1, 13, -1, -1]
    assert v.groups[0].entry_at.tolist() == [-1, -1, -1, -1]
    assert [t.tolist() for t in v.state_in] == [[0, 5, -1, -1], [1, 5, -1, -1]]
    assert [t.tolist() for t in v.state_out] == [[2, 6, -1, -1], [3, 6, -1, -1]]
    buffers.stage_padding(4)
    assert v.groups[1].entry_at.tolist() == [-1] * 4
    assert [t.tolist() for t in v.state_out] == [[-1] * 4] * 2
    one = DecodeBuffers(max_rows=4, max_page_ids=16, device="cpu", num_groups=2)
    with pytest.raises(ValueError, match="State groups"):
        one.stage(plan, rows=4)


def test_decode_buffers_split_state_rows_around_padding_slots() -> None:
    """Rows of several query slots (a short prefill of 2 and 3 tokens in 4 slots, padded to 3
    rows): row b's real tokens are State row 2b with its pages and the checkpoint after its
    first 2 tokens, its padding slots row 2b + 1 (pages -1); the State rows cover the slots
    with no gap. Without the split (DeepSeek-V4's rings) State row b is row b."""
    from dataclasses import replace

    from resin.plan import CacheGroupPlan
    from resin_app.bench.plans import PagedPlanner
    from resin_models_cuda.buffers import DecodeBuffers

    planner = PagedPlanner(num_pages=32, page_size=4)
    seqs = [planner.new_sequence(list(range(n))) for n in (6, 7)]
    seqs[0].cached, seqs[1].cached = 4, 4
    plan = planner.plan([(s, len(s.tokens) - 4) for s in seqs], Phase.PREFILL)
    i32 = np.int32
    state = CacheGroupPlan(
        1, state_in=np.array([7, -1], i32), state_out=np.array([8, 9], i32),
        checkpoint_indptr=np.array([0, 0, 1], i32), checkpoint_token=np.array([3], i32),
        checkpoint_page=np.array([5], i32),
    )  # fmt: skip
    plan = replace(plan, cache_groups=(plan.cache_groups[0], state))
    buffers = DecodeBuffers(max_rows=4, max_page_ids=16, device="cpu", max_query=4, num_states=1)
    buffers.stage(plan, rows=3, query=4)
    v = buffers.views(3, 4)
    assert v.split is not None
    assert v.split.indptr.tolist() == [0, 2, 4, 7, 8, 8, 12]
    assert v.split.token_row.tolist() == [0, 0, 1, 1, 2, 2, 2, 3, 5, 5, 5, 5]
    assert v.state_in[0].tolist() == [7, -1, -1, -1, -1, -1]
    assert v.state_out[0].tolist() == [8, -1, 9, -1, -1, -1]
    assert v.split.ckpt_indptr[0].tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert v.split.ckpt_len[0][:2].tolist() == [2, 0]  # row 1's first two tokens; then the pad
    assert v.split.ckpt_page[0][:2].tolist() == [5, -1]
    assert v.groups[0].slots[:8].tolist()[2:4] == [-1, -1]  # row 0's padding slots
    ringed = DecodeBuffers(max_rows=4, max_page_ids=16, device="cpu", max_query=4,
                           num_states=1, split_states=False)  # fmt: skip
    with pytest.raises(ValueError, match="split State rows"):
        ringed.stage(plan, rows=3, query=4)  # its checkpoints have no place there
    ringed.stage(replace(plan, cache_groups=(plan.cache_groups[0], replace(
        state, checkpoint_indptr=np.zeros(3, i32), checkpoint_token=np.zeros(0, i32),
        checkpoint_page=np.zeros(0, i32)))), rows=3, query=4)  # fmt: skip
    flat = ringed.views(3, 4)
    assert flat.split is None and flat.state_in[0].tolist() == [7, -1, -1]


def test_graph_buckets() -> None:
    assert buckets_up_to(1) == (1,)
    assert buckets_up_to(50) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 50)
    buckets = buckets_up_to(256)
    assert pick_bucket(3, buckets) == 4
    assert pick_bucket(64, buckets) == 64
    assert pick_bucket(65, buckets) == 80
    assert pick_bucket(257, buckets) is None
    with pytest.raises(ValueError):
        buckets_up_to(0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_parse_and_count(name: str) -> None:
    from resin_model.presets import param_counts, weight_bytes_read

    config = preset(name)
    active, total = param_counts(config)
    assert 0 < active <= total
    assert weight_bytes_read(config, 1) <= weight_bytes_read(config, 64) <= 2 * total


def test_preset_parameter_counts_match_the_published_sizes() -> None:
    from resin_model.presets import param_counts

    billions = {name: param_counts(preset(name))[1] / 1e9 for name in
                ("llama-8b", "qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-120b", "gemma3-12b",
                 "glm-4.5-air")}  # fmt: skip
    assert 6.5 < billions["llama-8b"] < 8.1  # 8.0B with the embedding
    assert 29 < billions["qwen3-30b-a3b"] < 31
    assert 19.5 < billions["gpt-oss-20b"] < 21.5
    assert 115 < billions["gpt-oss-120b"] < 118  # 116.8B with the embedding, 5.1B active
    assert 4.5 < param_counts(preset("gpt-oss-120b"))[0] / 1e9 < 5.5
    assert 10.5 < billions["gemma3-12b"] < 12.5
    assert 105 < billions["glm-4.5-air"] < 107.5  # 106B with the embedding, 12B active
    assert 11.5 < param_counts(preset("glm-4.5-air"))[0] / 1e9 < 13
    with pytest.raises(ValueError, match="unknown model config"):
        preset("gpt2")


def test_runner_rejects_context_beyond_its_tables(device: str) -> None:
    from resin.protocols import CacheLayout
    from resin_app.bench.plans import PagedPlanner
    from resin_models_cuda import RunnerOptions, random_runner

    runner = random_runner(preset("tiny"), RunnerOptions(page_size=4, max_batch=2, max_context=16),
                           device, torch.float32)  # fmt: skip
    rc = runner.runner_config
    runner.bind(CacheLayout(16, 4, rc.page_bytes, rc.cache_groups))
    planner = PagedPlanner(16, 4)
    seq = planner.new_sequence(np.arange(20).tolist())
    with pytest.raises(ValueError, match="max_context"):
        runner.forward(planner.plan([(seq, 20)], Phase.PREFILL))
