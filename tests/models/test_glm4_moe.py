"""GLM-4.5 specifics beyond the shared parity suites (which run the tiny `glm4_moe` and
`glm4_moe_air` configs of `ref_hf.ARCHS` through `test_torch_logits.py` and
`test_torch_engine.py`): the published configs translate, MTP layers in the checkpoint are
skipped at load with one note, and the router stays in float32 in a bfloat16 model."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from ref_hf import checkpoint
from safetensors.torch import load_file, save_file

from resin_model.hf_config import parse_config
from resin_models_torch.registry import load_model

# GLM-4.5-Air's published config.json (transformers 4.x spelling: top-level
# partial_rotary_factor, rope_theta, rope_scaling null).
AIR: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5,
    "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": True,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0", "use_cache": True, "use_qk_norm": False,
    "vocab_size": 151552,
}  # fmt: skip


def test_published_config_translates() -> None:
    config = parse_config(AIR)
    assert (config.head_dim, config.rotary_dim, config.rope.theta) == (128, 64, 1e6)
    assert config.qkv_bias and not config.o_bias and not config.qk_norm
    assert config.moe is not None and config.moe.sparse_layers == (False,) + (True,) * 45
    assert (config.moe.scoring, config.moe.score_bias, config.moe.top_k) == ("sigmoid", True, 8)
    assert config.moe.shared_intermediate_size == 1408 and config.num_mtp_layers == 1
    assert config.eos_token_ids == (151329, 151336, 151338)
    # transformers 5 writes the factor inside rope_parameters; both spellings agree.
    nested = dict(AIR, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                        "partial_rotary_factor": 0.5})  # fmt: skip
    del nested["partial_rotary_factor"], nested["rope_theta"], nested["rope_scaling"]
    assert parse_config(nested) == config
    assert parse_config(dict(AIR, use_qk_norm=True, n_group=4, topk_group=2)).qk_norm


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"partial_rotary_factor": 0.0}, "partial_rotary_factor"),
        ({"n_group": 3}, "n_group"),
        ({"head_dim": 6, "partial_rotary_factor": 0.5}, "even"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
        ({"some_new_knob": 1}, "some_new_knob"),
    ],
)
def test_unsupported_configs_fail_clearly(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_config({**AIR, **change})


def _with_mtp_layer(tmp_path: Path) -> Path:
    """The tiny checkpoint plus an MTP layer at `model.layers.2.*`, in a second shard, the
    way GLM-4.5 ships it (its own embedding and head copies included)."""
    folder, _ = checkpoint("glm4_moe")
    target = tmp_path / "glm"
    shutil.copytree(folder, target)
    tensors = load_file(str(folder / "model.safetensors"))
    mtp = {
        name.replace("model.layers.1.", "model.layers.2."): t.clone()
        for name, t in tensors.items()
        if name.startswith("model.layers.1.")
    }
    for name in ("enorm", "hnorm", "shared_head.norm"):
        mtp[f"model.layers.2.{name}.weight"] = torch.ones(64)
    mtp["model.layers.2.eh_proj.weight"] = torch.zeros(64, 128)
    mtp["model.layers.2.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    mtp["model.layers.2.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(mtp, str(target / "model-mtp.safetensors"))
    return target


def test_mtp_layers_are_skipped_with_one_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _with_mtp_layer(tmp_path)
    with caplog.at_level(logging.INFO, logger="resin_models_torch.glm4_moe"):
        model = load_model(folder)
    notes = [r.getMessage() for r in caplog.records if "MTP" in r.getMessage()]
    assert notes == ["glm4_moe: 1 MTP layer(s) at model.layers.2.* not loaded"]
    assert len(model.model.layers) == 2
    # Without the count in config.json the same tensors are unexpected: the skip is the
    # config's, not a blanket filter.
    config = json.loads((folder / "config.json").read_text())
    config["num_nextn_predict_layers"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unexpected \['model\.layers\.2\."):
        load_model(folder)


def test_router_stays_float32_in_a_bfloat16_model() -> None:
    folder, hf = checkpoint("glm4_moe")
    model = load_model(folder, dtype=torch.bfloat16)
    gate = model.model.layers[1].mlp.gate
    assert gate.weight.dtype == torch.float32
    assert gate.e_score_correction_bias is not None
    assert gate.e_score_correction_bias.dtype == torch.float32
    expected = hf.model.layers[1].mlp.gate
    assert torch.equal(gate.weight, expected.weight)
    assert torch.equal(gate.e_score_correction_bias, expected.e_score_correction_bias)
    assert model.model.layers[1].mlp.experts[0].gate_proj.weight.dtype == torch.bfloat16
