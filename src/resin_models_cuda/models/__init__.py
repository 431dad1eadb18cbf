"""Fast model files, one per architecture family, each a short straight-line composition of
`resin_models_cuda.layers`; `resin_models_cuda.architectures.build_model` picks the class of a
config's `model_type`."""

from __future__ import annotations

from resin_models_cuda.models.base import BuildOptions, FastModel

__all__ = ["BuildOptions", "FastModel"]
