"""GLM-5.3-Flash (`glm5_next`, text path): the reference runner against `transformers` on a tiny
random `Glm5NextForConditionalGeneration` (a one-block vision tower, not loaded) saved as a
folder in the published layout.

- KDA's chunked delta rule (decay per key channel) equals its recurrent form and both equal
  transformers';
- the indexer's choice in the sparse regime equals transformers' modulo exact ties (its ReLU
  scores are often exactly 0, where `topk`'s order is implementation-defined);
- the Engine driving the runner, in the dense regime (`index_topk` above every prompt's pool
  count, so attention is causal and ties cannot matter): logits at every computed position
  and the prompt logprobs within 2e-4 of transformers (fp32), greedy continuations equal, under
  16-token prefill chunks, with a prefix hit and with retraction; bf16 within transformers-bf16's
  own error; 64 requests sharing a 1,024-token prefix hit as often as on a pure-attention model.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ref_compare import (
    assert_bfloat16_within_hf_error,
    assert_engine_matches_hf,
    assert_hits_like_attention,
    assert_prompt_logprobs_match_hf,
    run_staggered,
)
from ref_hf import checkpoint as ref_checkpoint
from transformers.models.glm5_next import modeling_glm5_next as hf_glm

from resin_model.hf_config import load_config, parse_config
from resin_model.presets import param_counts, preset
from resin_models_torch.delta_rule import chunked_delta_rule, recurrent_delta_rule
from resin_models_torch.glm5_next import Indexer, KimiDeltaAttention
from resin_models_torch.registry import load_model, load_runner, random_runner
from tests.models.glm5_tiny import perturbed

_ROOT = Path(tempfile.mkdtemp(prefix="resin-glm5-"))

_TEXT: dict[str, Any] = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=5,  # KDA x3, indexed MLA, KDA
    num_attention_heads=2,
    num_key_value_heads=2,
    n_routed_experts=6,
    num_experts_per_tok=2,
    kv_lora_rank=32,
    q_lora_rank=24,
    qk_nope_head_dim=16,
    v_head_dim=16,
    index_topk=2048,  # the dense regime: every visible pool is chosen
    index_head_dim=16,
    index_n_heads=2,
    linear_head_dim=16,
    linear_num_heads=2,
    mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
    pad_token_id=None,
    initializer_range=0.1,
)
_VISION: dict[str, Any] = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=64,
    projection_intermediate_size=32,
    image_size=28,
)


@functools.cache
def tiny() -> tuple[Path, Any]:
    torch.manual_seed(0)
    config = transformers.Glm5NextConfig(text_config=_TEXT, vision_config=_VISION)
    model = perturbed(transformers.Glm5NextForConditionalGeneration(config))
    folder = _ROOT / "glm5"
    model.save_pretrained(folder)
    return folder, model


def _prompts(seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, 300, (40,), generator=gen).tolist()
    return [
        shared + torch.randint(0, 300, (9,), generator=gen).tolist(),
        torch.randint(0, 300, (23,), generator=gen).tolist(),
        shared + torch.randint(0, 300, (30,), generator=gen).tolist(),
        [*shared[:20], 7],
    ]


@pytest.mark.parametrize("length", [1, 37, 150])
def test_per_channel_chunked_delta_rule_equals_recurrent_and_transformers(length: int) -> None:
    gen = torch.Generator().manual_seed(length)
    q = hf_glm.l2norm(torch.randn(length, 3, 16, generator=gen)) * 16**-0.5
    k = hf_glm.l2norm(torch.randn(length, 3, 16, generator=gen))
    v = torch.randn(length, 3, 8, generator=gen)
    g = -torch.rand(length, 3, 16, generator=gen) * 0.5
    beta = torch.rand(length, 3, generator=gen)
    state = torch.randn(3, 16, 8, generator=gen) * 0.1
    rec_out, rec_state = recurrent_delta_rule(q, k, v, g, beta, state)
    for chunk in (8, 64):
        out, final = chunked_delta_rule(q, k, v, g, beta, state, chunk=chunk)
        torch.testing.assert_close(out, rec_out, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(final, rec_state, atol=2e-5, rtol=1e-4)
    args = (q[None] * 16**0.5, k[None], v[None], g[None], beta[None])
    for kernel in (hf_glm.chunk_kimi_delta_attention, hf_glm.recurrent_kimi_delta_attention):
        hf_out, hf_state = kernel(*args, initial_state=state[None], output_final_state=True)
        torch.testing.assert_close(hf_out[0], rec_out, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(hf_state[0], rec_state, atol=2e-5, rtol=1e-4)


def test_config_reads_the_published_layout_and_refuses_shared_indexers() -> None:
    config = load_config(tiny()[0])
    assert config.layer_types == ("linear", "linear", "linear", "full", "linear")
    assert config.moe is not None and config.moe.sparse_layers == (False,) + (True,) * 4
    assert config.glm5_next is not None and config.glm5_next.gate_lower_bound == -5.0
    # transformers 5.17 and older name the DSA layers `deepseek_sparse_attention`
    older = ["linear_attention"] * 3 + ["deepseek_sparse_attention", "linear_attention"]
    text = {**_TEXT, "model_type": "glm5_next_text", "layer_types": older}
    assert parse_config(text).layer_types == config.layer_types
    flat = {**_TEXT, "model_type": "glm5_next", "index_topk_pattern": "FFFSF"}
    with pytest.raises(ValueError, match="shared"):
        parse_config(flat)
    with pytest.raises(ValueError, match="NoPE"):
        parse_config({**_TEXT, "model_type": "glm5_next_text", "qk_rope_head_dim": 8})


def test_indexer_choice_equals_transformers_modulo_ties() -> None:
    """Sparse regime (2 of up to 6 pools of 16, plus the tail), one 100-token sequence."""
    raw = {**_TEXT, "model_type": "glm5_next_text", "index_topk": 32}
    config = parse_config(raw)
    assert config.glm5_next is not None
    mine = Indexer(config, config.glm5_next)
    hf_config = transformers.Glm5NextTextConfig(**{**_TEXT, "index_topk": 32})
    theirs = hf_glm.Glm5NextTextIndexer(hf_config, layer_idx=3)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in mine.parameters():
            param.normal_(0.0, 0.3)
    theirs.load_state_dict(mine.state_dict())
    length = 100
    x, q_resid = torch.randn(length, 64), torch.randn(length, 24)
    with torch.no_grad():
        indices = theirs(x[None], q_resid[None], torch.ones(1, length, dtype=torch.bool), None)[0]
        positions = torch.arange(length)
        entries = mine.entry(x)
        picked = mine.choose(x, q_resid, entries, positions)
        scores = mine.pool_scores(x, q_resid, entries)
    theirs_picked = torch.zeros_like(picked)
    for p in range(length):
        chosen = indices[p][indices[p] >= 0].long()
        theirs_picked[p, chosen] = True
    for p in range(length):
        tail = (p + 1) - (p + 1) % 16
        assert torch.equal(picked[p, tail:], theirs_picked[p, tail:])
        mine_pools = picked[p, :tail].view(-1, 16).all(dim=1)
        their_pools = theirs_picked[p, :tail].view(-1, 16).all(dim=1)
        assert int(mine_pools.sum()) == int(their_pools.sum()) == min(2, tail // 16)
        # The same scores were chosen (pool identities may differ only between equal scores).
        a = scores[p, : tail // 16][mine_pools].sort().values
        b = scores[p, : tail // 16][their_pools].sort().values
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert int((picked.sum(dim=1) < positions + 1).sum()) > length // 2  # really sparse


SCENARIOS = {  # (prefill chunk, prefix cache, pages)
    "chunk16": (16, False, None),
    "chunk16-prefix": (16, True, None),
    "chunk16-prefix-retract": (16, True, 16),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_engine_driven_runner_matches_transformers(scenario: str) -> None:
    chunk, prefix, pages = SCENARIOS[scenario]
    folder, hf = tiny()
    runner = load_runner(folder, page_size=8, num_pages=pages, overlap=False)  # see ref_compare
    assert_engine_matches_hf(runner, hf, _prompts(1), chunk=chunk, prefix=prefix,
                             retract=pages is not None, new_tokens=10)  # fmt: skip


def test_prompt_logprobs_match_transformers() -> None:
    folder, hf = tiny()
    prompt = _prompts(2)[2]
    assert_prompt_logprobs_match_hf(load_runner(folder, page_size=8), hf, prompt, 2)


def test_bfloat16_within_transformers_own_bfloat16_error() -> None:
    folder, hf = tiny()
    prompt = _prompts(4)[2]
    runner = load_runner(folder, page_size=8, dtype=torch.bfloat16)
    assert_bfloat16_within_hf_error(runner, hf, folder, prompt)


def test_shared_prefix_hits_as_often_as_on_pure_attention() -> None:
    """Held out: KDA State checkpoints plus the latent/indexer History let 63 of 64 requests
    resume after the 1,024-token prefix, as a History-only model (tiny Qwen3) does."""
    hybrid = load_runner(tiny()[0], page_size=16)
    assert_hits_like_attention(hybrid, load_runner(ref_checkpoint("qwen3")[0], page_size=16))


def test_presets_count_the_published_sizes_and_run() -> None:
    full, reduced = preset("glm-5.3-flash"), preset("glm-5.3-flash-8l")
    embedding = full.vocab_size * full.hidden_size
    active, total = param_counts(full)
    assert 313.2 < (total + embedding) / 1e9 < 313.4  # 313.3B text parameters (mHC left out)
    assert 16.6 < active / 1e9 < 16.8  # 16.7B a token without the embedding
    assert 78 < 2 * (param_counts(reduced)[1] + embedding) / 1e9 < 79  # bf16 GB, one H200
    six = preset("glm-5.3-flash-6l")  # for an 80 GB card: both layer kinds, three MoE layers
    assert six.num_layers == 6 and [six.is_sparse(i) for i in range(6)] == [False] * 3 + [True] * 3
    assert 48 < 2 * (param_counts(six)[1] + embedding) / 1e9 < 50
    runner = random_runner(preset("tiny-glm5_next"), page_size=8)
    prompts = [[t % 256 for t in p] for p in _prompts(5)[:2]]  # the preset has 256 tokens
    requests, _ = run_staggered(runner, prompts, 16, True, 3)
    assert all(len(r.take_result()) == 3 for r in requests)


@pytest.mark.parametrize("lower", [-5.0, None])
def test_forget_gate_equals_transformers(lower: float | None) -> None:
    raw = {**_TEXT, "model_type": "glm5_next_text", "linear_lower_bound": lower}
    config = parse_config(raw)
    assert config.glm5_next is not None and config.glm5_next.gate_lower_bound == lower
    theirs = hf_glm.Glm5NextTextForgetGate(
        transformers.Glm5NextTextConfig(**{**_TEXT, "linear_lower_bound": lower})
    )
    layer = load_model(tiny()[0]).model.layers[0].self_attn
    assert isinstance(layer, KimiDeltaAttention)
    layer.glm = config.glm5_next
    with torch.no_grad():
        for name in ("f_a_proj", "f_b_proj"):
            getattr(theirs, name).weight.copy_(getattr(layer, name).weight)
        theirs.dt_bias.copy_(layer.decay.dt_bias)
        theirs.A_log.copy_(layer.decay.A_log)
        x = torch.randn(7, 64) * 3
        torch.testing.assert_close(layer.forget_gate(x), theirs(x[None])[0])


def test_recurrent_only_runner_equals_chunked() -> None:
    folder, _ = tiny()
    outputs = []
    for chunk in (64, None):
        runner = load_runner(folder, page_size=8)
        for module in runner.model.modules():
            if isinstance(module, KimiDeltaAttention):
                module.chunk = chunk
        runner.record_logits = True
        requests, _ = run_staggered(runner, [_prompts(3)[2]], 2048, False, 3)
        outputs.append(([r.take_result() for r in requests], runner.recorded))
    assert outputs[0][0] == outputs[1][0]
    for a, b in zip(outputs[0][1], outputs[1][1], strict=True):
        assert a.logits is not None and b.logits is not None
        torch.testing.assert_close(a.logits, b.logits, atol=2e-5, rtol=1e-4)
