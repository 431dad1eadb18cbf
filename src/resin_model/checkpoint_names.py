"""Checkpoint tensor names -> the names models ask for, shared by both runner families (the
reference loader and the fast runner's `SafetensorsWeights`)."""

from __future__ import annotations

from collections.abc import Callable

# Multimodal checkpoints nest the text model; their parts map onto the reference model's
# `model.*` (text), `vision_tower.*` / `visual.*` and `multi_modal_projector.*` attributes.
_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.vision_tower.vision_model.", "vision_tower."),
    ("vision_tower.vision_model.", "vision_tower."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("model.visual.", "visual."),
)


def default_names(name: str) -> str | None:
    """Skip non-parameter buffers and unused heads; unnest multimodal layouts."""
    if name.endswith(("rotary_emb.inv_freq", ".embed_scale")):
        return None
    for old, new in _PREFIXES:
        if name.startswith(old):
            name = new + name[len(old) :]
            break
    if name.startswith("vision_tower.head."):  # SigLIP's pooling head: Gemma 3 does not use it
        return None
    return name


def names_for(model_type: str) -> Callable[[str], str | None]:
    """The checkpoint-name map of an architecture (both runner families read checkpoints
    through it): DeepSeek-V4's published layout maps onto transformers' module names,
    GLM-5.3's published mHC and KDA decay names onto the runners' (`hf_glm5_next`)."""
    if model_type == "deepseek_v4":
        from resin_model.hf_deepseek_v4 import checkpoint_name

        return checkpoint_name
    if model_type in ("glm5_next", "glm5_next_text"):
        return _glm5_names
    return default_names


def _glm5_names(name: str) -> str | None:
    """`default_names`, then GLM-5.3's published names as the runners' modules name them."""
    from resin_model.hf_glm5_next import rename_published

    mapped = default_names(name)
    return None if mapped is None else rename_published(mapped)
