"""Fast model files, one per architecture family, each a short straight-line composition of
`resin_models_cuda.layers`; `build_model` picks the class from the shared registry
(`resin_models_cuda.architectures`)."""

from __future__ import annotations

from resin_model.config import ModelConfig
from resin_models_cuda.architectures import fast_model
from resin_models_cuda.layers import WeightSource
from resin_models_cuda.models.base import BuildOptions, FastModel


def build_model(
    config: ModelConfig, weights: WeightSource, options: BuildOptions | None = None
) -> FastModel:
    """The fast model of `config.model_type`, its weights taken from `weights`."""
    model: FastModel = fast_model(config.model_type)(config, weights, options or BuildOptions())
    return model


__all__ = ["BuildOptions", "FastModel", "build_model"]
