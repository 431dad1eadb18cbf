"""Qwen3.5 MoE (`qwen3_5_moe`): the reference runner against `transformers` on tiny random
models built with transformers' own classes and saved as folders (the text-only
`Qwen3_5MoeForCausalLM` layout and the multimodal `Qwen3_5MoeForConditionalGeneration` one).

- the delta rule's chunked form equals its recurrent form and both equal transformers';
- the Engine driving the runner: every computed position's logits and the prompt logprobs
  within 2e-4 of transformers (fp32), greedy continuations equal, under 16-token prefill
  chunks, with a prefix hit and with retraction forced by a small page pool;
- the recurrent-only runner equals the chunked one; bf16 within transformers-bf16's own error;
- 64 requests sharing a 1,024-token prefix hit the cache as often as on a pure-attention model.
"""

from __future__ import annotations

import functools
import shutil
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
from safetensors.torch import load_file, save_file
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf_qwen

from resin_model.hf_config import load_config, parse_config
from resin_model.presets import param_counts, preset, preset_hf
from resin_models_torch.delta_rule import chunked_delta_rule, recurrent_delta_rule
from resin_models_torch.qwen3_5_moe import GatedDeltaNet
from resin_models_torch.registry import load_model, load_runner, random_runner

_ROOT = Path(tempfile.mkdtemp(prefix="resin-qwen3_5-"))

_TEXT: dict[str, Any] = dict(
    vocab_size=300,
    hidden_size=64,
    num_hidden_layers=4,  # three linear-attention layers, then full attention
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    num_experts=6,
    num_experts_per_tok=2,
    initializer_range=0.1,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
)


def _perturb(model: Any) -> Any:
    """Non-trivial norms, and decays that keep the state alive over tens of tokens (the class
    init draws A up to 16: every state would be forgotten within a token or two)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
            if name.endswith("A_log"):
                param.copy_(torch.empty_like(param).uniform_(0.02, 0.5).log())
            if name.endswith("dt_bias"):
                param.add_(torch.randn_like(param) * 0.5)
    return model.eval()


@functools.cache
def tiny(kind: str = "text") -> tuple[Path, Any]:
    """`(folder, hf_model)`: the text-only layout, or the multimodal one ("vl")."""
    torch.manual_seed(0)
    if kind == "text":
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**_TEXT))
    else:
        vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2,
                      out_hidden_size=64, num_position_embeddings=16)  # fmt: skip
        config = transformers.Qwen3_5MoeConfig(text_config=_TEXT, vision_config=vision)
        model = transformers.Qwen3_5MoeForConditionalGeneration(config)
    folder = _ROOT / kind
    _perturb(model).save_pretrained(folder)
    return folder, model


def _prompts(seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, 300, (40,), generator=gen).tolist()
    return [
        shared + torch.randint(0, 300, (9,), generator=gen).tolist(),
        torch.randint(0, 300, (23,), generator=gen).tolist(),
        shared + torch.randint(0, 300, (30,), generator=gen).tolist(),
        [*shared[:20], 7],
        shared + torch.randint(0, 300, (9,), generator=gen).tolist(),
    ]


def _delta_inputs(length: int, heads: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = hf_qwen.l2norm(torch.randn(length, heads, 16, generator=gen)) * 16**-0.5
    k = hf_qwen.l2norm(torch.randn(length, heads, 16, generator=gen))
    v = torch.randn(length, heads, 8, generator=gen)
    g = -torch.rand(length, heads, generator=gen) * 0.3
    beta = torch.rand(length, heads, generator=gen)
    state = torch.randn(heads, 16, 8, generator=gen) * 0.1
    return q, k, v, g, beta, state


@pytest.mark.parametrize("length", [1, 37, 150])
def test_chunked_delta_rule_equals_recurrent_and_transformers(length: int) -> None:
    q, k, v, g, beta, state = _delta_inputs(length, 4, length)
    rec_out, rec_state = recurrent_delta_rule(q, k, v, g, beta, state)
    for chunk in (8, 64):
        out, final = chunked_delta_rule(q, k, v, g, beta, state, chunk=chunk)
        torch.testing.assert_close(out, rec_out, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(final, rec_state, atol=2e-5, rtol=1e-4)
    # transformers scales q itself (and l2-norms inside when asked): hand it the raw q.
    args = (q[None] * 16**0.5, k[None], v[None], g[None], beta[None])
    hf_out, hf_state = hf_qwen.torch_chunk_gated_delta_rule(
        *args, initial_state=state[None], output_final_state=True
    )
    torch.testing.assert_close(hf_out[0], rec_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(hf_state[0], rec_state, atol=2e-5, rtol=1e-4)
    hf_out, _ = hf_qwen.torch_recurrent_gated_delta_rule(*args, initial_state=state[None])
    torch.testing.assert_close(hf_out[0], rec_out, atol=2e-5, rtol=1e-4)


def test_config_reads_both_layouts() -> None:
    text, vl = load_config(tiny("text")[0]), load_config(tiny("vl")[0])
    assert text.layer_types == ("linear", "linear", "linear", "full")
    assert text.rotary_dim == 8 and text.linear_attention == vl.linear_attention
    assert (text.model_type, vl.model_type) == ("qwen3_5_moe_text", "qwen3_5_moe")


SCENARIOS = {  # (prefill chunk, prefix cache, pages)
    "chunk16": (16, False, None),
    "chunk16-prefix": (16, True, None),
    "chunk16-prefix-retract": (16, True, 20),  # two retractions, steps landing in order
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_engine_driven_runner_matches_transformers(scenario: str) -> None:
    chunk, prefix, pages = SCENARIOS[scenario]
    folder, hf = tiny("text")
    runner = load_runner(folder, page_size=8, num_pages=pages, overlap=False)  # see ref_compare
    assert_engine_matches_hf(runner, hf, _prompts(1), chunk=chunk, prefix=prefix,
                             retract=pages is not None, new_tokens=12)  # fmt: skip


def test_prompt_logprobs_of_the_multimodal_folder_match_transformers() -> None:
    folder, hf = tiny("vl")
    prompt = _prompts(2)[2]
    assert_prompt_logprobs_match_hf(load_runner(folder, page_size=8), hf, prompt, 4)


def test_recurrent_only_runner_equals_chunked() -> None:
    folder, _ = tiny("text")
    outputs = []
    for chunk in (64, None):
        runner = load_runner(folder, page_size=8)
        for module in runner.model.modules():
            if isinstance(module, GatedDeltaNet):
                module.chunk = chunk
        runner.record_logits = True
        requests, _ = run_staggered(runner, _prompts(3)[:3], 2048, False, 4)
        outputs.append(([r.take_result() for r in requests], runner.recorded))
    assert outputs[0][0] == outputs[1][0]
    for a, b in zip(outputs[0][1], outputs[1][1], strict=True):
        assert a.logits is not None and b.logits is not None
        torch.testing.assert_close(a.logits, b.logits, atol=2e-5, rtol=1e-4)


def test_bfloat16_within_transformers_own_bfloat16_error() -> None:
    folder, hf = tiny("text")
    prompt = _prompts(4)[2]
    runner = load_runner(folder, page_size=8, dtype=torch.bfloat16)
    assert_bfloat16_within_hf_error(runner, hf, folder, prompt)


def test_shared_prefix_hits_as_often_as_on_pure_attention() -> None:
    """Held out: the hybrid's State checkpoints let 63 of 64 requests resume after the
    1,024-token prefix, as a History-only model (tiny Qwen3) does."""
    hybrid = load_runner(tiny("text")[0], page_size=16)
    assert_hits_like_attention(hybrid, load_runner(ref_checkpoint("qwen3")[0], page_size=16))


def test_presets_count_the_published_sizes_and_run() -> None:
    full = preset("qwen3.5-35b-a3b")
    active, total = param_counts(full)
    embedding = full.vocab_size * full.hidden_size
    assert 34.6 < (total + embedding) / 1e9 < 34.7  # 34.66B text parameters
    assert 2.9 < active / 1e9 < 3.0  # "A3B": 2.95B a token without the embedding
    runner = random_runner(preset("tiny-qwen3_5_moe"), page_size=8)
    prompts = [[t % 256 for t in p] for p in _prompts(5)[:2]]  # the preset has 256 tokens
    requests, _ = run_staggered(runner, prompts, 16, True, 3)
    assert all(len(r.take_result()) == 3 for r in requests)


def test_fused_expert_layout_loads_the_same_weights(tmp_path: Path) -> None:
    """The published checkpoints store each layer's experts fused (`experts.gate_up_proj`
    [E, 2I, H], `experts.down_proj` [E, H, I]); rewrite the tiny folder that way."""
    folder, _ = tiny("vl")
    tensors = load_file(folder / "model.safetensors")
    fused: dict[str, torch.Tensor] = {}
    for layer in range(_TEXT["num_hidden_layers"]):
        base = f"model.language_model.layers.{layer}.mlp.experts"
        experts = range(_TEXT["num_experts"])
        gate, up, down = ([tensors.pop(f"{base}.{e}.{part}.weight") for e in experts]
                          for part in ("gate_proj", "up_proj", "down_proj"))  # fmt: skip
        fused[f"{base}.gate_up_proj"] = torch.cat((torch.stack(gate), torch.stack(up)), dim=1)
        fused[f"{base}.down_proj"] = torch.stack(down)
    save_file({**tensors, **fused}, tmp_path / "model.safetensors")
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    want = dict(load_model(folder).named_parameters())
    got = dict(load_model(tmp_path).named_parameters())
    assert want.keys() == got.keys()
    assert all(torch.equal(want[name], got[name]) for name in want)


def test_published_style_config_parses_and_refuses_what_it_cannot_run() -> None:
    text = {**preset_hf("qwen3.5-35b-a3b"), "model_type": "qwen3_5_moe_text",
            "attn_output_gate": True, "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False, "eos_token_id": 248044}  # fmt: skip
    raw = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
           "text_config": text, "vision_config": {"depth": 27}, "image_token_id": 248056,
           "video_token_id": 248057, "vision_start_token_id": 248053,
           "vision_end_token_id": 248054, "tie_word_embeddings": False}  # fmt: skip
    config = parse_config(raw)
    assert config.layer_types.count("full") == 10 and config.layer_types[3] == "full"
    assert config.rope.theta == 1e7 and config.rotary_dim == 64
    assert config.eos_token_ids == (248044,)
    for key, value in (("attn_output_gate", False), ("mamba_ssm_dtype", "bfloat16"),
                       ("mlp_only_layers", [0]), ("unknown_knob", 1)):  # fmt: skip
        with pytest.raises(ValueError):
            parse_config({**raw, "text_config": {**text, key: value}})
