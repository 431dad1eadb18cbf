"""A `config.json`'s `quantization_config`, parsed once into a typed `QuantConfig`: which
format the weights are stored in (`quant.py` has the formats' math), which tensor holds their
scales, how activations are quantized, and which modules stay unquantized. Supported:
`quant_method` `fp8` (block-scaled, dynamic activations: Qwen3-*-FP8, DeepSeek-V3; with
`scale_fmt: ue8m0` and `expert_dtype: fp4`, DeepSeek-V4-Flash),
`compressed-tensors` with `format: float-quantized` (FP8 per-tensor / per-channel / block
weights; dynamic per-token or per-group, or static per-tensor activations) and `mxfp4`
(gpt-oss). Anything else raises `UnsupportedQuantization` naming the method, variant or key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from resin_model.checkpoint_error import CheckpointError

QuantScheme = Literal["fp8_block", "fp8_channel", "fp8_tensor", "mxfp4"]
ActivationScheme = Literal["dynamic_token", "dynamic_group", "static_tensor", "none"]


@dataclass(frozen=True)
class QuantConfig:
    """How a checkpoint's weights are stored (parsed from `quantization_config`).

    `scheme`: the weight format; `block`: FP8 block rows x columns (`fp8_block` only);
    `activations`: how activations are quantized before an FP8 matmul (`dynamic_group` in
    groups of `activation_group` columns); `scale_name`: the tensor beside `weight` holding
    its scales (`weight_scale_inv`, `weight_scale`; DeepSeek-V4's `scale`), or the suffix
    pair's scales (`scales` beside `blocks`, MXFP4); `skip`: regexes of module names kept
    unquantized (`quantizes`). `fp4_experts` (DeepSeek-V4's `expert_dtype: fp4`): routed
    experts stored as packed e2m1 (int8 [N, K / 2], the low nibble first) with one e8m0 scale
    per 32 values ([N, K / 32]) under the same `scale_name`; the other FP8 weights' scales may
    be e8m0 too (`scale_fmt: ue8m0`: powers of two, the same dequantization)."""

    scheme: QuantScheme
    activations: ActivationScheme
    scale_name: str
    block: tuple[int, int] | None = None
    activation_group: int | None = None
    skip: tuple[str, ...] = ()
    fp4_experts: bool = False

    def quantizes(self, module: str) -> bool:
        """Whether the module of this name (e.g. `model.layers.0.self_attn.q_proj`) is stored
        quantized."""
        return not any(re.match(pattern, module) for pattern in self.skip)

    def weight_block(self, n: int, k: int) -> tuple[int, int]:
        """The FP8 scale block `(qn, qk)` of an [N, K] weight (`quant.py`): the config's block,
        per-channel `(1, K)` or per-tensor `(N, K)`."""
        if self.scheme == "fp8_block":
            assert self.block is not None
            return self.block
        if self.scheme == "fp8_channel":
            return (1, k)
        if self.scheme == "fp8_tensor":
            return (n, k)
        raise ValueError(f"{self.scheme} is not an FP8 scheme")


class UnsupportedQuantization(CheckpointError):
    """A `quantization_config` this library cannot read; the message names what."""


def parse_quant_config(raw: Mapping[str, Any] | None) -> QuantConfig | None:
    """`config.json`'s `quantization_config` (None: not quantized) -> `QuantConfig`.

    Raises `UnsupportedQuantization` naming the unknown `quant_method`, variant or key."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise UnsupportedQuantization(f"quantization_config must be an object, got {raw!r}")
    method = raw.get("quant_method")
    parser = _PARSERS.get(str(method))
    if parser is None:
        raise UnsupportedQuantization(
            f"quant_method {method!r} is not supported (supported: {', '.join(sorted(_PARSERS))})"
        )
    return parser(raw)


def _refuse_unknown(raw: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UnsupportedQuantization(f"{where}: unknown keys {unknown} (they may change the math)")


def _unsupported(where: str, key: str, value: object, supported: str) -> UnsupportedQuantization:
    return UnsupportedQuantization(f"{where}: {key}={value!r} is not supported ({supported})")


def _hf_skip(patterns: object, where: str) -> tuple[str, ...]:
    """transformers' `modules_to_not_convert` rule: a pattern matches a module name from its
    start up to a module boundary (as a regex: `layers.*.mlp.router`), or as a suffix."""
    if patterns is None:
        return ()
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise UnsupportedQuantization(f"{where}: modules_to_not_convert must be a list of names")
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return tuple(rf"(?:{p}){boundary}|.*{re.escape(p)}$" for p in patterns)


_FP8_KEYS = frozenset(("quant_method", "activation_scheme", "fmt", "weight_block_size",
                       "modules_to_not_convert", "dequantize", "scale_fmt",
                       "expert_dtype"))  # fmt: skip


def _parse_fp8(raw: Mapping[str, Any]) -> QuantConfig:
    where = "quantization_config (fp8)"
    _refuse_unknown(raw, _FP8_KEYS, where)
    if raw.get("fmt", "e4m3") != "e4m3":
        raise _unsupported(where, "fmt", raw["fmt"], "e4m3 only")
    if raw.get("activation_scheme", "dynamic") != "dynamic":
        raise _unsupported(where, "activation_scheme", raw["activation_scheme"], "dynamic only")
    if raw.get("dequantize", False):
        raise _unsupported(where, "dequantize", raw["dequantize"], "a stored-quantized checkpoint")
    if raw.get("scale_fmt", "float") not in ("float", "ue8m0"):
        raise _unsupported(where, "scale_fmt", raw["scale_fmt"], "float or ue8m0")
    if raw.get("expert_dtype", "fp8") not in ("fp8", "fp4"):
        raise _unsupported(where, "expert_dtype", raw["expert_dtype"], "fp8 or fp4")
    block = raw.get("weight_block_size")
    if block is None:
        raise UnsupportedQuantization(
            f"{where}: no weight_block_size (per-tensor fp8 under quant_method fp8) is not "
            "supported; block-scaled checkpoints name e.g. [128, 128]"
        )
    rows, cols = _block_shape(block, where, "weight_block_size")
    return QuantConfig(
        "fp8_block", "dynamic_group", "weight_scale_inv", (rows, cols), cols,
        _hf_skip(raw.get("modules_to_not_convert"), where),
        fp4_experts=raw.get("expert_dtype") == "fp4",
    )  # fmt: skip


MAX_BLOCK = 4096
"""The largest FP8 scale block side accepted (published checkpoints use 128)."""


def _block_shape(block: Any, where: str, key: str) -> tuple[int, int]:
    """A scale block `[rows, cols]`: two positive integers up to `MAX_BLOCK`."""
    if not (
        isinstance(block, list)
        and len(block) == 2
        and all(_positive_int(b) and b <= MAX_BLOCK for b in block)
    ):
        raise _unsupported(where, key, block, f"two positive integers up to {MAX_BLOCK}")
    return block[0], block[1]


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _parse_mxfp4(raw: Mapping[str, Any]) -> QuantConfig:
    where = "quantization_config (mxfp4)"
    _refuse_unknown(raw, frozenset(("quant_method", "modules_to_not_convert")), where)
    skip = _hf_skip(raw.get("modules_to_not_convert"), where)
    return QuantConfig("mxfp4", "none", "scales", skip=skip)


_CT_KEYS = frozenset(("quant_method", "config_groups", "format", "ignore", "kv_cache_scheme",
                      "quantization_status", "global_compression_ratio", "sparsity_config",
                      "transform_config", "version"))  # fmt: skip
_CT_GROUP_KEYS = frozenset(("targets", "weights", "input_activations", "output_activations",
                            "format"))  # fmt: skip
_CT_ARGS_KEYS = frozenset(("num_bits", "type", "symmetric", "strategy", "dynamic", "group_size",
                           "block_structure", "actorder", "observer", "observer_kwargs",
                           "scale_dtype", "zp_dtype"))  # fmt: skip


def _parse_compressed(raw: Mapping[str, Any]) -> QuantConfig:
    where = "quantization_config (compressed-tensors)"
    _refuse_unknown(raw, _CT_KEYS, where)
    if raw.get("format") != "float-quantized":
        raise _unsupported(where, "format", raw.get("format"), "float-quantized only")
    if raw.get("quantization_status", "compressed") != "compressed":
        raise _unsupported(where, "quantization_status", raw["quantization_status"], "compressed")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if raw.get(key):
            raise _unsupported(where, key, raw[key], "none")
    groups = raw.get("config_groups")
    if not isinstance(groups, Mapping) or len(groups) != 1:
        raise UnsupportedQuantization(
            f"{where}: exactly one config group is supported, got {groups!r}"
        )
    (name, group), = groups.items()  # fmt: skip
    where = f"{where} group {name!r}"
    _refuse_unknown(group, _CT_GROUP_KEYS, where)
    if group.get("targets") != ["Linear"]:
        raise _unsupported(where, "targets", group.get("targets"), "['Linear']")
    if group.get("output_activations") is not None:
        raise _unsupported(where, "output_activations", group["output_activations"], "none")
    scheme, block = _ct_weights(group.get("weights"), f"{where} weights")
    activations, act_group = _ct_inputs(group.get("input_activations"), f"{where} inputs")
    ignore = raw.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise UnsupportedQuantization(f"{where}: ignore must be a list of names")
    skip = tuple(p[3:] if p.startswith("re:") else re.escape(p) + "$" for p in ignore)
    return QuantConfig(scheme, activations, "weight_scale", block, act_group, skip)


def _ct_float8(args: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(args, Mapping):
        raise UnsupportedQuantization(f"{where}: expected an object, got {args!r}")
    _refuse_unknown(args, _CT_ARGS_KEYS, where)
    if args.get("type") != "float" or args.get("num_bits") != 8:
        got = f"{args.get('type')} {args.get('num_bits')}-bit"
        raise UnsupportedQuantization(f"{where}: {got} is not supported (8-bit float only)")
    if args.get("symmetric", True) is not True:
        raise _unsupported(where, "symmetric", args["symmetric"], "symmetric only")
    return args


def _ct_weights(args: Any, where: str) -> tuple[QuantScheme, tuple[int, int] | None]:
    args = _ct_float8(args, where)
    if args.get("dynamic", False):
        raise _unsupported(where, "dynamic", args["dynamic"], "static weight scales")
    strategy = args.get("strategy")
    if strategy == "tensor":
        return "fp8_tensor", None
    if strategy == "channel":
        return "fp8_channel", None
    if strategy == "block":
        return "fp8_block", _block_shape(args.get("block_structure"), where, "block_structure")
    raise _unsupported(where, "strategy", strategy, "tensor, channel or block")


def _ct_inputs(args: Any, where: str) -> tuple[ActivationScheme, int | None]:
    if args is None:
        return "none", None
    args = _ct_float8(args, where)
    strategy, dynamic = args.get("strategy"), args.get("dynamic")
    if dynamic is True and strategy == "token":
        return "dynamic_token", None
    if dynamic is True and strategy == "group" and _positive_int(args.get("group_size")):
        return "dynamic_group", int(args["group_size"])
    if dynamic is False and strategy == "tensor":
        return "static_tensor", None
    raise UnsupportedQuantization(
        f"{where}: strategy={strategy!r} dynamic={dynamic!r} is not supported (dynamic token, "
        "dynamic group, or static tensor)"
    )


_PARSERS = {"fp8": _parse_fp8, "mxfp4": _parse_mxfp4, "compressed-tensors": _parse_compressed}
