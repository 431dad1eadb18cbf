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
- DeepSeek-V4 (deepseek-ai/DeepSeek-V4-Flash; `hf_deepseek_v4.deepseek_v4_quant`): FP8 block
  weights whose 128 x 128 scales are UE8M0 (float8_e8m0fnu, powers of two) named
  `<module>.scale`; with `fp4_experts` the routed experts' `<module>.weight` is packed e2m1,
  int8 [N, K / 2] (the low nibble the even column, as transformers' FP8 dequantizer reads it)
  with `<module>.scale` e8m0 [N, K / 32]: MXFP4's bits in one row of bytes per output row.

`quantize_tensor` and `quantization_config` write those layouts (the quantizer,
`resin_app/quantize.py`; the fast runner's quantized random weights).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

import torch

from resin_model.quant import (
    E8M0_BIAS,
    FP8_DTYPE,
    FP8_MAX,
    MXFP4_GROUP,
    dequantize_fp8,
    dequantize_mxfp4,
    e8m0_to_float,
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


E8M0_DTYPE = torch.float8_e8m0fnu


def scale_float(scale: torch.Tensor) -> torch.Tensor:
    """Stored scales in float32: e8m0 ones (float8_e8m0fnu, or raw uint8 codes) as
    `2 ** (code - 127)`, others as they are."""
    if scale.dtype in (E8M0_DTYPE, torch.uint8):
        return e8m0_to_float(scale.view(torch.uint8))
    return scale.float()


def fp8_weight_float(weight: torch.Tensor, scale: torch.Tensor, quant: QuantConfig) -> torch.Tensor:
    """float32 `W` of an FP8 weight [..., N, K] and its stored scales (any stored shape of the
    right number of values: [] / [1] per tensor, [N, 1] per channel, blocks); with
    `quant.fp4_experts` an int8 weight is DeepSeek-V4's packed FP4 (`fp4_weight_float`)."""
    if weight.dtype == torch.int8 and quant.fp4_experts:
        return fp4_weight_float(weight, scale)
    if weight.dtype != FP8_DTYPE:
        raise ValueError(f"an FP8 weight is float8_e4m3fn, got {weight.dtype}")
    n, k = weight.shape[-2:]
    return dequantize_fp8(weight, scale_float(scale), quant.weight_block(n, k))


def fp4_as_mxfp4(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4's packed FP4 weight (int8 [..., N, K / 2]) and e8m0 scales ([..., N,
    K / 32]) as MXFP4 `blocks` uint8 [..., N, K / 32, 16] and `scales` uint8 [..., N, K / 32]
    (the same bits)."""
    *lead, n, half = weight.shape
    groups = 2 * half // MXFP4_GROUP
    if (
        weight.dtype != torch.int8
        or 2 * half % MXFP4_GROUP
        or tuple(scale.shape) != (*lead, n, groups)
    ):
        raise ValueError(
            f"a packed FP4 weight is int8 [..., N, K / 2] with e8m0 scales [..., N, K / 32]; got "
            f"{weight.dtype} {tuple(weight.shape)} and {tuple(scale.shape)}"
        )
    blocks = weight.view(torch.uint8).reshape(*lead, n, groups, MXFP4_GROUP // 2)
    return blocks, scale.view(torch.uint8)


def fp4_weight_float(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 [..., N, K] of a DeepSeek-V4 packed FP4 weight and its e8m0 scales."""
    return dequantize_mxfp4(*fp4_as_mxfp4(weight, scale))


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
        packed_fp4 = quant.fp4_experts and tensor.dtype == torch.int8
        if pair is None and (tensor.dtype == FP8_DTYPE or packed_fp4):
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
    """`fmt` as a `QuantFormat`, refused with a reason where no published layout exists
    (DeepSeek-V4's: `fp8-block` with its UE8M0 scales, `mxfp4` its FP4 experts beside FP8)."""
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantized format {fmt!r} (known: {', '.join(QUANT_FORMATS)})")
    if fmt == "mxfp4" and model_type not in ("gpt_oss", "deepseek_v4"):
        raise ValueError(
            f"mxfp4 is gpt-oss's and DeepSeek-V4's expert format; {model_type!r} has no MXFP4 "
            "layout"
        )
    if model_type == "deepseek_v4" and fmt == "fp8-channel":
        raise ValueError("deepseek_v4 is published in fp8-block (UE8M0 scales) and mxfp4 experts")
    return fmt  # type: ignore[return-value]


def deepseek_v4_quantization() -> dict[str, Any]:
    """DeepSeek-V4-Flash's `quantization_config` (`expert_dtype` "fp4" for `mxfp4`, which the
    published config.json carries at its top level: the caller puts it there)."""
    return {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
            "activation_scheme": "dynamic", "weight_block_size": list(FP8_BLOCK)}  # fmt: skip


# published names of DeepSeek-V4 weights kept unquantized although linear: the router, and
# the compressors' and indexers' kv / gate / weights projections (bf16 in the published FP8
# checkpoint: transformers' keep-list)
_V4_UNQUANTIZED = (".ffn.gate.weight", "weights_proj.weight")


def quantize_v4_tensor(
    name: str, tensor: torch.Tensor, fmt: QuantFormat
) -> list[tuple[str, torch.Tensor]]:
    """A DeepSeek-V4 checkpoint tensor (published names) in its published layout: the decoder
    and MTP layers' linear weights FP8 with UE8M0 scales (`<module>.scale`, float8_e8m0fnu),
    except `_V4_UNQUANTIZED`, the compressors' and the norms; with `mxfp4` the routed experts
    packed FP4 with e8m0 scales per 32 values (`fp4_as_mxfp4`'s layout)."""
    bare = name.removeprefix("model.")
    module = bare.rsplit(".", 2)[-2] if bare.count(".") >= 2 else ""
    linear = bare.startswith(("layers.", "mtp.")) and name.endswith(".weight")
    if (
        not linear
        or tensor.dim() != 2
        or name.endswith(_V4_UNQUANTIZED)
        or ".compressor." in name
        or "norm" in module
    ):
        return [(name, tensor)]
    scale_name = name[: -len("weight")] + "scale"
    if fmt == "mxfp4" and ".ffn.experts." in name:
        blocks, scales = quantize_mxfp4(tensor)
        packed = blocks.reshape(*blocks.shape[:-2], -1).view(torch.int8)
        return [(name, packed), (scale_name, scales.view(E8M0_DTYPE))]
    return list(zip((name, scale_name), quantize_fp8_ue8m0(tensor), strict=True))


def quantize_fp8_ue8m0(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (e4m3 [N, K], float8_e8m0fnu scales [ceil(N / 128), ceil(K / 128)]): per
    128 x 128 block the least power of two that keeps the block within e4m3's range."""
    n, k = w.shape
    bn, bk = FP8_BLOCK
    padded = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk, dtype=torch.float32)
    padded[:n, :k] = w.float()
    blocks = padded.view(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
    amax = blocks.abs().amax(dim=(1, 3))
    exp = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-E8M0_BIAS, E8M0_BIAS)
    exp = torch.where(amax > 0, exp, 0.0).to(torch.int32)
    scale = torch.ldexp(torch.ones_like(amax), exp)
    full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]
    q = (w.float() / full).to(FP8_DTYPE)
    return q, (exp + E8M0_BIAS).to(torch.uint8).view(E8M0_DTYPE)


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
