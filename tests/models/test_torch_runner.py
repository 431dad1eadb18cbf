"""TorchRunner contract: honest cache groups and arena, page copies first, State checkpoints
that resume a prefix, prompt logprobs, and clear errors for bad use."""

from __future__ import annotations

import math

import pytest
import torch
from ref_compare import hf_logits, max_logit_error
from ref_hf import checkpoint
from ref_planner import Seq, TinyPlanner

from resin.plan import Phase
from resin.protocols import CacheLayout, History, State, Window
from resin_models_torch.registry import load_runner


def test_runner_config_declares_honest_groups() -> None:
    gemma = load_runner(checkpoint("gemma3")[0], page_size=8).runner_config
    # 2 sliding + 1 global layer, 2 KV heads x 16 dims, K and V, 8 tokens, fp32.
    assert gemma.cache_groups == (
        History(1 * 2 * 8 * 2 * 16 * 4),
        Window(6, 2 * 2 * 8 * 2 * 16 * 4),
    )
    lfm = load_runner(checkpoint("lfm2")[0], page_size=8).runner_config
    # 2 conv layers keep K-1 = 2 inputs of 64 channels per checkpoint.
    assert lfm.cache_groups == (History(1 * 2 * 8 * 2 * 16 * 4), State(2 * 64 * 2 * 4))
    assert lfm.vocab_size == 300 and lfm.page_bytes == 2 * 8 * 2 * 16 * 4


def test_bind_allocates_one_arena_and_rejects_mismatches() -> None:
    runner = load_runner(checkpoint("lfm2")[0])
    cfg = runner.runner_config
    plan = TinyPlanner(load_runner(checkpoint("lfm2")[0]))._plan(
        [(Seq(sid=1, tokens=[1, 2], prompt_len=2), 2)], Phase.PREFILL
    )
    with pytest.raises(RuntimeError, match="bind"):
        runner.forward(plan)  # not bound yet
    with pytest.raises(ValueError, match="does not match"):
        runner.bind(CacheLayout(4, cfg.page_size + 1, cfg.page_bytes, cfg.cache_groups))
    with pytest.raises(ValueError, match="smaller"):  # no state region for the conv state
        runner.bind(CacheLayout(10, cfg.page_size, cfg.page_bytes, cfg.cache_groups))
    layout = CacheLayout(
        10, cfg.page_size, cfg.page_bytes + 64, cfg.cache_groups, 3, cfg.state_page_bytes
    )
    runner.bind(layout)
    assert runner._arena is not None and runner._arena.numel() == 10 * (cfg.page_bytes + 64)
    assert runner._arena.untyped_storage().nbytes() == layout.arena_bytes
    assert runner._views[1].shape[0] == 3  # the conv state lives in the state region
    for view in runner._views:  # every group view aliases the one arena
        assert view.untyped_storage().data_ptr() == runner._arena.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    ("arch", "prefix"), [("llama3", 10), ("gemma3", 10), ("gemma3", 8), ("lfm2", 8), ("lfm2", 11)]
)
def test_forked_prefix_resumes_exactly(arch: str, prefix: int) -> None:
    """A request that starts from another's cached pages (shared full pages, a copied partial
    page, a conv-state checkpoint) continues exactly like `transformers` on the full text."""
    folder, hf = checkpoint(arch)
    runner = load_runner(folder, page_size=4)
    runner.record_logits = True
    planner = TinyPlanner(runner)
    source = Seq(sid=1, tokens=list(range(40, 53)), prompt_len=13, checkpoint_at={prefix})
    planner.finish([source], max_new=1, chunk=5)
    fork = planner.fork(source, prefix, [7, 8, 9], sid=2)
    planner.finish([source, fork], max_new=12)
    worst, count = max_logit_error(runner.recorded, 2, hf, fork.tokens[:-1])
    assert count == len(fork.tokens) - 1 - prefix
    assert worst < 1e-4
    worst_src, _ = max_logit_error(runner.recorded, 1, hf, source.tokens[:-1])
    assert worst_src < 1e-4  # the source is unaffected by the fork's writes


def test_prompt_logprobs_and_sampled_logprobs() -> None:
    folder, hf = checkpoint("qwen3")
    prompt = [5, 17, 33, 2, 250, 9, 41]
    params: dict[str, float | int] = {"prompt_logprobs": 1, "logprobs": 3}
    seq = TinyPlanner(load_runner(folder)).run([prompt], max_new=4, chunk=3, params=[params])[0]
    ref = torch.log_softmax(hf_logits(hf, seq.tokens), dim=-1)
    expected = {p: float(ref[p, prompt[p + 1]]) for p in range(len(prompt) - 1)}
    assert seq.prompt_logprobs.keys() == expected.keys()
    for p, value in expected.items():
        assert math.isclose(seq.prompt_logprobs[p], value, abs_tol=1e-4)
    for i, lp in enumerate(seq.logprobs):
        pos = len(prompt) - 1 + i
        assert math.isclose(lp, float(ref[pos, seq.generated[i]]), abs_tol=1e-4)
        assert math.isclose(lp, float(ref[pos].max()), abs_tol=1e-6)  # greedy picks the max


def test_bad_plans_fail_clearly() -> None:
    runner = load_runner(checkpoint("llama3")[0])
    planner = TinyPlanner(runner)
    seq = Seq(sid=1, tokens=[1, 2, 300], prompt_len=3)
    with pytest.raises(ValueError, match="vocabulary"):
        planner.finish([seq], max_new=1)
    ok = planner.run([[1, 2, 3]], max_new=2)[0]
    assert len(ok.generated) == 2 and all(0 <= t < 300 for t in ok.generated)
