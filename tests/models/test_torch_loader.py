"""Checkpoint loading (single and sharded safetensors), config translation, clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from ref_hf import checkpoint, save_tiny
from safetensors.torch import load_file, save_file

from resin_model.hf_config import load_config, parse_config
from resin_models_torch.loader import checkpoint_files
from resin_models_torch.registry import load_model, random_runner


def test_sharded_checkpoint_loads_the_same_weights(tmp_path: Path) -> None:
    folder, hf = checkpoint("qwen2")
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(checkpoint_files(sharded)) > 1
    one, many = load_model(folder), load_model(sharded)
    for (name, a), (_, b) in zip(one.named_parameters(), many.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(
        many.model.layers[0].self_attn.q_proj.bias, hf.model.layers[0].self_attn.q_proj.bias
    )


def test_tied_embeddings_share_the_embedding_matrix() -> None:
    folder, _ = checkpoint("smollm2")
    model = load_model(folder)
    assert model.lm_head is None
    hidden = torch.randn(3, 64)
    torch.testing.assert_close(model.logits(hidden), hidden @ model.model.embed_tokens.weight.T)


def test_missing_or_misshaped_tensors_are_named(tmp_path: Path) -> None:
    folder, _ = checkpoint("llama3")
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        load_model(broken)
    tensors["model.norm.weight"] = torch.ones(7)
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.norm\.weight: shape"):
        load_model(broken)


def test_unsupported_configs_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsupported model_type 'bert'"):
        parse_config({"model_type": "bert"})
    base = json.loads(json.dumps(_LLAMA))
    base["rope_scaling"] = {"rope_type": "longrope", "factor": 4.0}
    with pytest.raises(ValueError, match="unsupported rope_type 'longrope'"):
        parse_config(base)
    # A field nobody reads may change the math: it fails loudly instead of being ignored.
    with pytest.raises(ValueError, match=r"does not understand.*'logit_scale'"):
        parse_config({**_LLAMA, "logit_scale": 0.5})
    with pytest.raises(ValueError, match="unsupported pretraining_tp=2"):
        parse_config({**_LLAMA, "pretraining_tp": 2})
    # Metadata and training-only knobs are fine.
    assert parse_config({**_LLAMA, "torch_dtype": "bfloat16", "attention_dropout": 0.1})
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_config(tmp_path)


_LLAMA = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "eos_token_id": [7, 9],
}


def test_older_config_styles_translate() -> None:
    cfg = parse_config(_LLAMA)
    assert (cfg.head_dim, cfg.rope.theta, cfg.eos_token_ids) == (8, 500000.0, (7, 9))
    gemma = parse_config(
        {
            **_LLAMA,
            "model_type": "gemma3_text",
            "head_dim": 16,
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
            "sliding_window": 512,
            "sliding_window_pattern": 2,
            "query_pre_attn_scalar": 64,
        }
    )
    assert gemma.layer_types == ("sliding", "full")
    assert (gemma.rope.theta, gemma.local_rope and gemma.local_rope.theta) == (1e6, 1e4)
    assert gemma.scale == 64**-0.5 and gemma.embed_scale == 32**0.5 and gemma.tie_embeddings
    lfm = parse_config(
        {
            **{k: v for k, v in _LLAMA.items() if k != "rms_norm_eps"},  # LFM2 says norm_eps
            "model_type": "lfm2",
            "block_ff_dim": 96,
            "full_attn_idxs": [1],
            "norm_eps": 1e-5,
        }
    )
    assert lfm.layer_types == ("conv", "full") and lfm.intermediate_size == 256


def test_random_runner_builds_every_architecture(tmp_path: Path) -> None:
    for arch in ("gemma3", "lfm2", "qwen3_moe"):
        save_tiny(arch, tmp_path / arch)
        raw = json.loads((tmp_path / arch / "config.json").read_text())
        runner = random_runner(raw, seed=1)
        assert runner.runner_config.vocab_size == 300
