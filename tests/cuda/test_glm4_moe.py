"""GLM-4.5 on the fast runner beyond `test_vs_reference.py` (which runs its tiny config
against the reference runner through the Engine, partial rotary and q/k norm included): a
checkpoint folder loads with its MTP layer left unread and one note, and the router weight
and correction bias keep their float32 values in a bfloat16 model."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from resin_model.hf_config import parse_config
from resin_model.presets import TINY


def _checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The tiny GLM config's random reference weights saved as a checkpoint, plus an MTP
    layer at `model.layers.2.*` (the way GLM-4.5 ships it) in a second shard."""
    from resin_models_torch.registry import random_runner

    tensors = {
        k: v.contiguous() for k, v in random_runner(TINY["glm4_moe"]).model.state_dict().items()
    }
    for name in list(tensors):
        if name.endswith("e_score_correction_bias"):
            tensors[name] = torch.randn_like(tensors[name]) * 0.1
    (tmp_path / "config.json").write_text(json.dumps(TINY["glm4_moe"]))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    mtp = {"model.layers.2.eh_proj.weight": torch.zeros(64, 128),
           "model.layers.2.mlp.gate.weight": torch.zeros(8, 64)}  # fmt: skip
    save_file(mtp, str(tmp_path / "model-mtp.safetensors"))
    return tmp_path, tensors


def test_checkpoint_loads_with_float32_router_and_mtp_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from resin_models_cuda import build_model
    from resin_models_cuda.layers import SafetensorsWeights

    folder, tensors = _checkpoint(tmp_path)
    weights = SafetensorsWeights(str(folder), "cpu", torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="resin_models_cuda.models.glm4_moe"):
        model = build_model(parse_config(TINY["glm4_moe"]), weights)
    notes = [r.getMessage() for r in caplog.records if "MTP" in r.getMessage()]
    assert notes == ["glm4_moe: 1 MTP layer(s) at model.layers.2.* not loaded"]
    moe = model.layers[1].mlp
    assert moe.router.dtype == torch.float32 and moe.w.score_bias is not None
    assert torch.equal(moe.router, tensors["model.layers.1.mlp.gate.weight"])
    assert torch.equal(moe.w.score_bias, tensors["model.layers.1.mlp.gate.e_score_correction_bias"])
    assert moe.w.gate_up.dtype == torch.bfloat16
    # The rounding the float32 router avoids is real on these values.
    rounded = tensors["model.layers.1.mlp.gate.weight"].bfloat16().float()
    assert not torch.equal(rounded, moe.router)
