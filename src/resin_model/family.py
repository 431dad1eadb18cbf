"""The runner-family contract: how a runner package plugs into `resin serve`.

A runner family turns a checkpoint folder (or a typed config, for random weights) into a
`resin.protocols.Runner`, for the architectures (`config.json` `model_type`s) it serves. A
package publishes one `RunnerFamily` object under the entry-point group `resin.runners`:

```toml
[project.entry-points."resin.runners"]
mine = "my_runners.family:FAMILY"
```

and the application finds it through `importlib.metadata` (`resin_app.runners`), exactly as it
finds the two in-tree families `torch` (`resin_models_torch.family`) and `cuda`
(`resin_models_cuda.family`). Invariants:
- the entry point's name is the family's `name`;
- importing the module that holds the object is cheap enough to list families: `build`
  imports the heavy code (the architectures are names, not classes);
- `build` returns a runner whose `runner_config` is final (the engine binds it next), or raises
  `ValueError` for a model or request it cannot serve.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resin.protocols import Runner
from resin_model.config import ModelConfig

ENTRY_POINT_GROUP = "resin.runners"

ModelSource = Path | ModelConfig
"""A checkpoint folder (Hugging Face layout: config.json + safetensors), or a typed config whose
weights the family draws at random (`BuildRequest.seed`; tests and benchmarks)."""


@dataclass(frozen=True, slots=True)
class BuildRequest:
    """What the application asks of a runner, in words every family understands.

    - `device`: a torch device string ("cpu", "cuda", "cuda:1");
    - `dtype`: "float32", "bfloat16" or "float16"; None: the family's default for the device;
    - `seed`: of random weights (a `ModelConfig` source);
    - `max_sequences`, `context_length`: the engine's row cap and longest sequence, for a
      family that sizes buffers or graphs by them (None: its own default);
    - `memory_fraction`: the share of the device's free memory (measured before the weights
      load) that weights and the KV arena may take together (None: the family's default);
    - `cuda_graphs`: whether a family that captures CUDA graphs does (False: eager steps);
    - `graph_prefill_tokens`: prefill steps of rows up to this many tokens (a prefix hit's
      suffix) replay graphs too, where a family captures them (0: never; None: its default);
    - `kv_cache_bytes`: the KV arena's size (`--kv-cache-memory`); None: the family sizes it
      (the reference runner: at least one `context_length` sequence; the fast runner: what
      `memory_fraction` leaves after the weights);
    - `mtp`: a runner that also drafts with the checkpoint's multi-token-prediction layer
      (its `drafts`, read by `resin.engine.proposers.MtpProposer`); a family or model
      without one refuses.
    """

    device: str = "cpu"
    dtype: str | None = None
    seed: int = 0
    max_sequences: int | None = None
    context_length: int | None = None
    memory_fraction: float | None = None
    cuda_graphs: bool = True
    mtp: bool = False
    kv_cache_bytes: int | None = None
    graph_prefill_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype {self.dtype!r}: float32, bfloat16 or float16")
        if self.memory_fraction is not None and not 0.0 < self.memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction {self.memory_fraction}: in (0, 1]")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes {self.kv_cache_bytes}: must be >= 1")
        if self.graph_prefill_tokens is not None and self.graph_prefill_tokens < 0:
            raise ValueError(f"graph_prefill_tokens {self.graph_prefill_tokens}: must be >= 0")


@dataclass(frozen=True, slots=True)
class RunnerFamily:
    """One runner package's offer: its `name` (the entry point's), the `model_type`s it serves,
    and `build(source, request) -> Runner`."""

    name: str
    architectures: frozenset[str]
    build: Callable[[ModelSource, BuildRequest], Runner]
    summary: str = ""

    def serves(self, model_type: str) -> bool:
        return model_type in self.architectures


def load_object(path: str) -> Any:
    """The object a `module:attribute` path names (imported on this call)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
