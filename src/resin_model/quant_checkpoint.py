"""Quantized checkpoint tensors, as published, in both runner families' terms: which stored
tensors make one weight (`weight` + its scales, `<name>_blocks` + `<name>_scales`) and the
exact dequantization the reference runner loads (`dequantized`).

Stored layouts (`quant_config.QuantConfig` says which one a checkpoint uses):
- FP8 (`fp8_block`, `fp8_channel`, `fp8_tensor`): `<module>.weight` float8_e4m3fn [N, K] with
  `<module>.<scale_name>` (`weight_scale_inv` or `weight_scale`) of the format's scale blocks;
  a module without the scale tensor (routers, norms, embeddings) is stored unquantized.
  `<module>.input_scale` (static activation scales) is not a weight: the reference runner
  multiplies unquantized activations, the fast runner quantizes them dynamically.
- MXFP4 (gpt-oss experts): `<name>_blocks` uint8 [E, N, K / 32, 16] + `<name>_scales` uint8
  [E, N, K / 32] hold `W[e, n, k]`; the dequantized tensor is gpt-oss's in-memory `<name>`
  [E, K, N] (transformers transposes the last two dimensions the same way).

`quantize_tensor` and `quantization_config` write those layouts (the quantizer,
`resin_app/quantize.py`; the fast runner's quantized random weights).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

import torch

from resin_model.quant import (
    FP8_DTYPE,
    dequantize_fp8,
    dequantize_mxfp4,
    quantize_fp8,
    quantize_mxfp4,
)
from resin_model.quant_config import QuantConfig

MXFP4_BLOCKS, MXFP4_SCALES = "_blocks", "_scales"
INPUT_SCALE = ".input_scale"


def scale_name(weight_name: str, quant: QuantConfig) -> str | None:
    """The scale tensor beside an FP8 `<module>.weight` (None: not an FP8 weight name)."""
    if quant.scheme == "mxfp4" or not weight_name.endswith(".weight"):
        return None
    return f"{weight_name[: -len('weight')]}{quant.scale_name}"


def fp8_weight_float(weight: torch.Tensor, scale: torch.Tensor, quant: QuantConfig) -> torch.Tensor:
    """float32 `W` of an FP8 weight [..., N, K] and its stored scales (any stored shape of the
    right number of values: [] / [1] per tensor, [N, 1] per channel, blocks)."""
    if weight.dtype != FP8_DTYPE:
        raise ValueError(f"an FP8 weight is float8_e4m3fn, got {weight.dtype}")
    n, k = weight.shape[-2:]
    return dequantize_fp8(weight, scale.float(), quant.weight_block(n, k))


def mxfp4_weight_float(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 gpt-oss layout [..., K, N] of MXFP4 `blocks` [..., N, K / 32, 16]."""
    return dequantize_mxfp4(blocks, scales).transpose(-1, -2).contiguous()


def _partner(name: str, quant: QuantConfig) -> tuple[str, str] | None:
    """(result name, the other tensor's name) when `name` is half of a quantized weight."""
    if quant.scheme == "mxfp4":
        for mine, other in ((MXFP4_BLOCKS, MXFP4_SCALES), (MXFP4_SCALES, MXFP4_BLOCKS)):
            if name.endswith(mine):
                base = name[: -len(mine)]
                return base, base + other
        return None
    suffix = "." + quant.scale_name
    if name.endswith(suffix):
        return name[: -len(suffix)] + ".weight", name[: -len(suffix)] + ".weight"
    return None


def dequantized(
    tensors: Iterable[tuple[str, torch.Tensor]], quant: QuantConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's `(name, tensor)` stream with every quantized weight replaced by its exact
    float32 value under the unquantized name (pairs may sit in different shards). Raises,
    naming them, on a scale without its weight or an FP8 weight without its scale."""
    pending: dict[str, torch.Tensor] = {}  # stored name -> tensor, waiting for its partner
    fp8_names: set[str] = set()
    for name, tensor in tensors:
        if name.endswith(INPUT_SCALE) and quant.scheme != "mxfp4":
            continue
        pair = _partner(name, quant)
        if pair is None and tensor.dtype == FP8_DTYPE:
            pair = (name, scale_name(name, quant) or name)
            fp8_names.add(name)
        if pair is None:
            yield name, tensor
            continue
        result, other = pair
        if other not in pending:
            pending[name] = tensor
            continue
        first = pending.pop(other)
        yield result, _combine(name, tensor, other, first, quant)
    if pending:
        pairs = "_blocks + _scales" if quant.scheme == "mxfp4" else f"weight + {quant.scale_name}"
        raise ValueError(
            f"quantized checkpoint tensors without their partner ({quant.scheme}: {pairs}): "
            f"{sorted(pending)[:8]}"
        )


def _combine(
    name: str, tensor: torch.Tensor, other: str, first: torch.Tensor, quant: QuantConfig
) -> torch.Tensor:
    pair = {name: tensor, other: first}
    if quant.scheme == "mxfp4":
        base = name.removesuffix(MXFP4_BLOCKS).removesuffix(MXFP4_SCALES)
        return mxfp4_weight_float(pair[base + MXFP4_BLOCKS], pair[base + MXFP4_SCALES])
    weight_name = name if name.endswith(".weight") else other
    scale = pair[other if weight_name == name else name]
    return fp8_weight_float(pair[weight_name], scale, quant)


# ---------------------------------------------------------------------------------------------
# Writing: a bf16 / fp32 checkpoint's tensors in a published quantized layout

QuantFormat = Literal["fp8-block", "fp8-channel", "mxfp4"]
QUANT_FORMATS: tuple[QuantFormat, ...] = ("fp8-block", "fp8-channel", "mxfp4")
FP8_BLOCK = (128, 128)
_ROUTERS = (".mlp.gate.weight", ".mlp.router.weight")  # stay unquantized, as published
_MXFP4_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def quantization_config(fmt: QuantFormat) -> dict[str, Any]:
    """`config.json`'s `quantization_config` of a format, as the published checkpoints write
    it (Qwen3-*-FP8 / DeepSeek-V3; compressed-tensors FP8-Dynamic; gpt-oss)."""
    if fmt == "fp8-block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(FP8_BLOCK)}  # fmt: skip
    if fmt == "fp8-channel":
        float8 = {"num_bits": 8, "type": "float", "symmetric": True}
        return {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head", "re:.*mlp\\.gate$"],
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {**float8, "strategy": "channel", "dynamic": False},
                "input_activations": {**float8, "strategy": "token", "dynamic": True},
            }},
        }  # fmt: skip
    if fmt == "mxfp4":
        return {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"]}  # fmt: skip
    raise ValueError(f"unknown quantized format {fmt!r} (known: {', '.join(QUANT_FORMATS)})")


def check_format(fmt: str, model_type: str) -> QuantFormat:
    """`fmt` as a `QuantFormat`, refused with a reason where no published layout exists."""
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantized format {fmt!r} (known: {', '.join(QUANT_FORMATS)})")
    if fmt == "mxfp4" and model_type != "gpt_oss":
        raise ValueError(f"mxfp4 is gpt-oss's expert format; {model_type!r} has no MXFP4 layout")
    return fmt  # type: ignore[return-value]


def quantize_tensor(
    name: str, tensor: torch.Tensor, fmt: QuantFormat
) -> list[tuple[str, torch.Tensor]]:
    """The stored tensors of one checkpoint tensor in format `fmt`: FP8 formats quantize every
    2-D `model.layers.*.weight` of a linear module except the routers (and keep embeddings,
    heads and norms); MXFP4 quantizes gpt-oss's experts. Anything else is returned as is."""
    if fmt == "mxfp4":
        if not name.endswith(_MXFP4_EXPERTS) or tensor.dim() != 3:
            return [(name, tensor)]
        blocks, scales = quantize_mxfp4(tensor.float().transpose(-1, -2).contiguous())
        return [(name + MXFP4_BLOCKS, blocks), (name + MXFP4_SCALES, scales)]
    linear = name.startswith("model.layers.") and name.endswith(".weight") and tensor.dim() == 2
    if not linear or name.endswith(_ROUTERS) or "norm" in name.rsplit(".", 2)[-2]:
        return [(name, tensor)]
    block = FP8_BLOCK if fmt == "fp8-block" else (1, tensor.shape[1])
    q, scale = quantize_fp8(tensor, block)
    scale_suffix = "weight_scale_inv" if fmt == "fp8-block" else "weight_scale"
    return [(name, q), (name[: -len("weight")] + scale_suffix, scale)]
