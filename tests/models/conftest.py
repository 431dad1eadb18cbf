"""Shared fixtures: one tiny random Hugging Face checkpoint per architecture per session."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from hf_models import save_tiny  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`checkpoints(arch) -> (folder, hf_model)`, built once per session."""
    cache: dict[str, tuple[Path, Any]] = {}

    def get(arch: str) -> tuple[Path, Any]:
        if arch not in cache:
            folder = tmp_path_factory.mktemp(arch)
            cache[arch] = (folder, save_tiny(arch, folder))
        return cache[arch]

    return get
