"""GLM-5.3's tiny transformers models, shared by the reference runner's tests
(`tests/models/test_glm5_next.py`) and the fast runner's (`tests/cuda/test_glm5_next.py`)."""

from __future__ import annotations

from typing import Any

import torch


def perturbed(model: Any) -> Any:
    """Non-trivial norms, mHC biases, indexer pools and decays (the class init leaves the
    pool gate at 1, the ape at 0 and A_log at 0)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(("compress_ape", "hc.base", "hc.scale")):
                param.add_(torch.randn_like(param) * 0.1)
            if name.endswith("compress_gate"):
                param.normal_(0.0, 0.1)
            if name.endswith("A_log"):
                param.normal_(0.0, 0.5)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.add_(torch.randn_like(buffer) * 0.1)
    return model.eval()
