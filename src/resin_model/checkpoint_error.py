"""`CheckpointError`: the one error a checkpoint that cannot be loaded as it is raises (its
readers, `checkpoint_folder`, `hf_config`, `quant_config`, `gguf`, raise it or a kind of it)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is: one line naming the file or entry and why
    (a `ValueError`, so callers that catch those keep working)."""
