"""Quantized weights on the device: the seam model files use so that FP8 and MXFP4 checkpoints
run without per-model branches.

- `linear(w, names, shapes)` -> `Linear`: the fused projection of `names` (`[q; k; v]`,
  `[gate; up]`), kept FP8 when the source stores every part in FP8, else dense. Its call picks
  the kernel by format and rows (`fp8_linear`; docs/checkpoints.md has the table).
- `stacked_experts(w, rows)` -> dense [E, N, K] or `Fp8Experts`, `mxfp4_experts(w, name)` ->
  `Mxfp4Experts` (gpt-oss's gate/up rows de-interleaved, blocks and scales together): what
  `layers/moe.py` takes.
- `float32_tensor(w, name, shape)`: a tensor read without rounding to the model dtype
  (DeepSeek-style routers and their correction bias, as transformers keeps them).

Sources (`WeightSource`s with `fp8` / `mxfp4` / `float32`): `StoredWeights`, a checkpoint
folder read as stored (quantized weights stay quantized; any other request for a quantized
tensor gets it dequantized, so layers that are not on the seam still load, at bf16 size), and
`QuantizingWeights`, any source quantized on the device as it is read (random weights of real
shapes for benchmarks). FP8 scales are float32 [cdiv(N, qn), cdiv(K, qk)] (`resin_model.quant`);
parts whose rows (or columns) do not start on a scale block are re-expressed in finer blocks
(each scale repeated), which is exact.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F

from resin_model.checkpoint_names import default_names
from resin_model.config import ModelConfig
from resin_model.quant import FP8_DTYPE, quantize_fp8, quantize_mxfp4
from resin_model.quant_checkpoint import (
    MXFP4_BLOCKS,
    MXFP4_SCALES,
    QuantFormat,
    fp4_as_mxfp4,
    fp8_weight_float,
    mxfp4_weight_float,
    scale_float,
)
from resin_model.quant_config import QuantConfig
from resin_models_cuda.kernels.fp8_gemm import (
    TC_MAX_ROWS,
    GemmTiles,
    fp8_gemm,
    fp8_gemv,
    fp8_tile_fits,
    scaled_mm_fp8,
    tc_sub_k,
)
from resin_models_cuda.kernels.fp8_quant import quantize_fp8_rows
from resin_models_cuda.kernels.moe_fp8 import Fp8Experts
from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts
from resin_models_cuda.kernels.tiles import gemv_tiles
from resin_models_cuda.layers.weights import Init, RandomWeights, WeightSource

FUSED_EXPERTS = (".experts.gate_up_proj", ".experts.down_proj")  # transformers 5's in-memory names
GEMV_ROWS = 4  # up to this many rows an FP8 matmul is the FMA GEMV (`fp8_gemv`)
DECODE_ROWS = 16  # up to this many rows an FP8 matmul reads weights only (decode)
DECODE_TILES = GemmTiles(16, 32, 128)  # the H200's best for batch-1 Llama-3.1-8B projections


class Fp8Weight(NamedTuple):
    """e4m3 `w` [N, K] with float32 `scale` [cdiv(N, qn), cdiv(K, qk)] in blocks `block`."""

    w: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]

    def refined(self, block: tuple[int, int]) -> Fp8Weight:
        """The same values in a finer scale block (dividing this one's sizes or spanning
        the matrix): every scale repeated over the smaller blocks it covers."""
        (n, k), (qn, qk), (rn, rk) = self.w.shape, self.block, block
        if block == self.block:
            return self
        rn, rk = min(rn, n), min(rk, k)
        assert (qn % rn == 0 or qn >= n) and (qk % rk == 0 or qk >= k), (self.block, block)
        rows = self.scale.repeat_interleave(min(qn, n) // rn, 0)[: math.ceil(n / rn)]
        scale = rows.repeat_interleave(min(qk, k) // rk, 1)[:, : math.ceil(k / rk)]
        return Fp8Weight(self.w, scale.contiguous(), (rn, rk))


def _common_block(parts: list[Fp8Weight], axis: int) -> tuple[int, int]:
    """The coarsest block in which every part's offset along `axis` starts a block."""
    block = list(parts[0].block)
    for part in parts:
        for i in (0, 1):
            block[i] = math.gcd(block[i], min(part.block[i], part.w.shape[i]))
    for part in parts[:-1]:
        block[axis] = math.gcd(block[axis], part.w.shape[axis])
    return block[0], block[1]


def cat_fp8(parts: list[Fp8Weight], axis: int = 0) -> Fp8Weight:
    """Parts concatenated along rows (`axis` 0) or columns (1), scales with them."""
    if len(parts) == 1:
        return parts[0]
    block = _common_block(parts, axis)
    fine = [p.refined(block) for p in parts]
    w = torch.cat([p.w for p in fine], dim=axis).contiguous()
    return Fp8Weight(w, torch.cat([p.scale for p in fine], dim=axis).contiguous(), block)


def _format_name(w: Fp8Weight) -> str:
    """The tile files' name of a matrix's format."""
    return "fp8-channel" if w.block[1] >= w.w.shape[1] else "fp8-block"


def fp8_linear(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """`x @ W^T (+ bias)` by rows and format: up to 16 rows the tensor-core GEMV where the
    tile file's one-row entry for the shape is one (`tensor_core`: its cost does not depend on
    the rows), else up to `GEMV_ROWS` rows the FMA GEMV (`fp8_gemv`, tiles from
    `tiles.gemv_tiles`); float32 `x` and decode rows read e4m3 weights
    only (the bytes are the weights; exact against the dequantized matmul); more bf16 / fp16
    rows quantize activations per token (per-tensor / per-channel weights: cuBLASLt's
    `_scaled_mm`) or per token and 128 columns (block weights: the Triton e4m3 GEMM)."""
    (n, k), (qn, qk) = w.w.shape, w.block
    rows = x.shape[0]
    if 0 < rows <= TC_MAX_ROWS:  # the tensor-core GEMV where the GPU's tile file chose it
        tc = gemv_tiles("fp8_gemv", _format_name(w), n, k, 1)
        if tc.tensor_core and tc_sub_k(qk, k, tc.block_k):
            return fp8_gemv(x, w.w, w.scale, w.block, bias=bias, tiles=tc)
    if rows <= GEMV_ROWS:  # (scale blocks of odd widths take the tile GEMM below)
        gemv = gemv_tiles("fp8_gemv", _format_name(w), n, k, rows)
        if fp8_tile_fits(qk, k, gemv.block_k, spans=True):
            return fp8_gemv(x, w.w, w.scale, w.block, bias=bias, tiles=gemv)
    if x.dtype == torch.float32 or rows <= DECODE_ROWS:
        tiles = DECODE_TILES if x.shape[0] <= DECODE_ROWS else GemmTiles()
        if qk < k and qk % tiles.block_k:
            tiles = tiles._replace(block_k=qk)
        return fp8_gemm(x, w.w, w.scale, w.block, bias=bias, tiles=tiles)
    per_row = qn == 1 or qn >= n
    if per_row and qk >= k and x.is_cuda and n % 16 == 0 and k % 16 == 0:
        scale = w.scale if qn == 1 else w.scale.reshape(1, 1)
        out = scaled_mm_fp8(x, w.w, scale)
        return out if bias is None else out + bias
    group = qk if qk < k else None
    if group is not None and group % 128:
        return fp8_gemm(x, w.w, w.scale, w.block, bias=bias, tiles=GemmTiles(block_k=group))
    xq, xs = quantize_fp8_rows(x, group)
    return fp8_gemm(xq, w.w, w.scale, w.block, x_scale=xs, x_group=group, bias=bias,
                    out_dtype=x.dtype)  # fmt: skip


class Linear:
    """`y = x W^T + b` with `W` dense (cuBLAS) or FP8 (`fp8_linear`)."""

    def __init__(self, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None) -> None:
        if isinstance(weight, Fp8Weight):
            (n, k), (qn, qk) = weight.w.shape, weight.block
            if qk >= k and 1 < qn < n:  # fused per-tensor parts: one scale per row (cuBLASLt)
                weight = weight.refined((1, k))
        self.weight, self.bias = weight, bias

    @property
    def out_features(self) -> int:
        w = self.weight
        return int(w.w.shape[0] if isinstance(w, Fp8Weight) else w.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, Fp8Weight):
            return fp8_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class QuantizedWeights:
    """A `WeightSource` that can also hand out weights as stored: `fp8(name, shape)` (None:
    not FP8 there), `mxfp4(name, shape)` (`name` without `_blocks`; `shape` the stored
    [E, N, K]), and `float32(name, shape)`."""

    device: torch.device
    dtype: torch.dtype

    def fp8(self, name: str, shape: tuple[int, int], init: Init = "normal") -> Fp8Weight | None:
        raise NotImplementedError

    def mxfp4(self, name: str, shape: tuple[int, int, int], init: Init = "normal") -> (
        Mxfp4Experts | None
    ):  # fmt: skip
        raise NotImplementedError

    def float32(self, name: str, shape: tuple[int, ...], init: Init = "normal") -> torch.Tensor:
        raise NotImplementedError


class StoredWeights(QuantizedWeights):
    """A checkpoint folder's `*.safetensors`, read as stored (names through
    `checkpoint_names.default_names`); `quant` None: an unquantized checkpoint whose float32
    tensors are still read exactly through `float32`."""

    def __init__(
        self,
        folder: str,
        quant: QuantConfig | None,
        device: torch.device | str,
        dtype: torch.dtype,
        names: Callable[[str], str | None] = default_names,
    ) -> None:
        from safetensors import safe_open

        self.quant, self.device, self.dtype = quant, torch.device(device), dtype
        self._index: dict[str, tuple[str, str]] = {}  # name -> (shard, checkpoint name)
        for shard in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
            with safe_open(shard, framework="pt") as f:
                for raw in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    name = names(raw)
                    if name is not None:
                        self._index[name] = (shard, raw)
        if not self._index:
            raise FileNotFoundError(f"no *.safetensors in {folder}")
        shards = {shard for shard, _ in self._index.values()}
        self.stored_bytes = sum(os.path.getsize(shard) for shard in shards)

    def _read(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self._index:
            raise KeyError(f"checkpoint has no tensor {name!r}")
        shard, raw = self._index[name]
        with safe_open(shard, framework="pt") as f:
            tensor: torch.Tensor = f.get_tensor(raw)
        return tensor

    def _scale_name(self, name: str) -> str | None:
        if self.quant is None or self.quant.scheme == "mxfp4" or not name.endswith(".weight"):
            return None
        scale = f"{name[: -len('weight')]}{self.quant.scale_name}"
        return scale if scale in self._index else None

    def _is_mxfp4(self, name: str) -> bool:
        return self.quant is not None and name + MXFP4_BLOCKS in self._index

    def has(self, name: str) -> bool:
        return name in self._index or self._is_mxfp4(name)

    def float32(self, name: str, shape: tuple[int, ...], init: Init = "normal") -> torch.Tensor:
        """The tensor in float32, quantized ones dequantized exactly."""
        scale = self._scale_name(name)
        if scale is not None:
            assert self.quant is not None
            tensor = fp8_weight_float(self._read(name), self._read(scale), self.quant)
        elif self._is_mxfp4(name):
            blocks, scales = self._read(name + MXFP4_BLOCKS), self._read(name + MXFP4_SCALES)
            tensor = mxfp4_weight_float(blocks, scales)
        else:
            tensor = self._read(name).float()
        return _checked(name, tensor, shape).to(self.device)

    def get(
        self,
        name: str,
        shape: tuple[int, ...],
        init: Init = "normal",
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        if dtype == torch.float32:
            return self.float32(name, shape)
        dtype = dtype or self.dtype
        if self._scale_name(name) is None and not self._is_mxfp4(name):
            return _checked(name, self._read(name), shape).to(device=self.device, dtype=dtype)
        return self.float32(name, shape).to(dtype)

    def fp8(self, name: str, shape: tuple[int, int], init: Init = "normal") -> Fp8Weight | None:
        scale_name = self._scale_name(name)
        if scale_name is None:
            return None
        assert self.quant is not None
        w = _checked(name, self._read(name), shape)
        if w.dtype != FP8_DTYPE:
            raise ValueError(f"{name}: an FP8 checkpoint weight is float8_e4m3fn, got {w.dtype}")
        block = self.quant.weight_block(*shape)
        grid = (math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))
        scale = scale_float(self._read(scale_name)).reshape(grid)
        return Fp8Weight(w.to(self.device), scale.to(self.device).contiguous(), block)

    def packed_fp4(
        self, name: str, shape: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A DeepSeek-V4 packed FP4 weight [N, K] as MXFP4 (blocks uint8 [N, K / 32, 16],
        scales uint8 [N, K / 32]) on the device (None: not stored so)."""
        scale_name = self._scale_name(name)
        if scale_name is None or self.quant is None or not self.quant.fp4_experts:
            return None
        w = self._read(name)
        if w.dtype != torch.int8:
            return None
        n, k = shape
        w = _checked(name, w, (n, k // 2))
        blocks, scales = fp4_as_mxfp4(w, self._read(scale_name))
        return blocks.to(self.device), scales.to(self.device)

    def mxfp4(self, name: str, shape: tuple[int, int, int], init: Init = "normal") -> (
        Mxfp4Experts | None
    ):  # fmt: skip
        if not self._is_mxfp4(name):
            return None
        e, n, k = shape
        blocks = _checked(name, self._read(name + MXFP4_BLOCKS), (e, n, k // 32, 16))
        scales = _checked(name, self._read(name + MXFP4_SCALES), (e, n, k // 32))
        return Mxfp4Experts(
            blocks.to(self.device).contiguous(), scales.to(self.device).contiguous()
        )


class QuantizingWeights(QuantizedWeights):
    """`inner`'s tensors, the seam's weights quantized on the device in format `fmt` as they
    are read (the quantizer's rules: `resin_model.quant_checkpoint.quantize_tensor`)."""

    def __init__(self, inner: WeightSource, fmt: QuantFormat) -> None:
        self.inner, self.fmt = inner, fmt
        self.device, self.dtype = inner.device, inner.dtype

    def has(self, name: str) -> bool:
        """As `inner`, except that FP8 formats have no fused expert stacks: published FP8 MoE
        checkpoints store their experts one by one, so a model asking whether the fused
        `experts.gate_up_proj` exists reads the per-expert (FP8) tensors instead."""
        if self.fmt != "mxfp4" and name.endswith(FUSED_EXPERTS):
            return False
        return self.inner.has(name)

    def get(
        self,
        name: str,
        shape: tuple[int, ...],
        init: Init = "normal",
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        return self.inner.get(name, shape, init, dtype)

    def float32(self, name: str, shape: tuple[int, ...], init: Init = "normal") -> torch.Tensor:
        return float32_tensor(self.inner, name, shape, init)

    def fp8(self, name: str, shape: tuple[int, int], init: Init = "normal") -> Fp8Weight | None:
        if self.fmt == "mxfp4" or name.endswith((".mlp.gate.weight", ".mlp.router.weight")):
            return None
        block = (128, 128) if self.fmt == "fp8-block" else (1, shape[1])
        q, scale = quantize_fp8(self.inner.get(name, shape, init), block)
        return Fp8Weight(q, scale, block)

    def packed_fp4(
        self, name: str, shape: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """With `mxfp4`, one expert's part (DeepSeek-V4's FP4 experts) as MXFP4 blocks and
        scales [N, K / 32, 16] / [N, K / 32]."""
        if self.fmt != "mxfp4":
            return None
        return quantize_mxfp4(self.inner.get(name, shape))

    def mxfp4(self, name: str, shape: tuple[int, int, int], init: Init = "normal") -> (
        Mxfp4Experts | None
    ):  # fmt: skip
        if self.fmt != "mxfp4":
            return None
        e, n, k = shape
        device = self.device
        blocks = torch.empty((e, n, k // 32, 16), dtype=torch.uint8, device=device)
        scales = torch.empty((e, n, k // 32), dtype=torch.uint8, device=device)
        for j, dense in enumerate(self._experts(name, (e, k, n), init)):
            blocks[j], scales[j] = quantize_mxfp4(dense.transpose(0, 1).contiguous())
        return Mxfp4Experts(blocks, scales)

    def _experts(self, name: str, shape: tuple[int, int, int], init: Init) -> (
        Iterator[torch.Tensor]
    ):  # fmt: skip
        """Expert j's [K, N] slice of `name` [E, K, N], one at a time: random weights draw
        each expert alone (so no stack of the layer's experts exists in the model dtype, let
        alone float32: gpt-oss-120b's would be 17 GB a layer); any other source is read whole
        (small test models)."""
        if isinstance(self.inner, RandomWeights):
            for _ in range(shape[0]):
                yield self.inner.get(name, shape[1:], init)
        else:
            yield from self.inner.get(name, shape, init).unbind(0)


def _checked(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    return tensor


# ---------------------------------------------------------------------------------------------
# The seam


def float32_tensor(
    w: WeightSource, name: str, shape: tuple[int, ...], init: Init = "normal"
) -> torch.Tensor:
    """`name` in float32, read without rounding to `w.dtype` (quantized ones dequantized)."""
    return w.get(name, shape, init, dtype=torch.float32)


def fp8_parts(
    w: WeightSource, names: list[str], shapes: list[tuple[int, int]], init: Init = "normal"
) -> list[Fp8Weight] | None:
    """Every part as stored FP8, or None when the source keeps any of them unquantized."""
    if not isinstance(w, QuantizedWeights):
        return None
    parts = [w.fp8(n, s, init) for n, s in zip(names, shapes, strict=True)]
    return None if any(p is None for p in parts) else [p for p in parts if p is not None]


def linear(
    w: WeightSource,
    names: list[str],
    shapes: list[tuple[int, int]],
    init: Init = "normal",
    bias: torch.Tensor | None = None,
) -> Linear:
    """The projection of `names` stacked by rows (one matmul), FP8 where stored so."""
    parts = fp8_parts(w, names, shapes, init)
    if parts is not None:
        return Linear(cat_fp8(parts), bias)
    return Linear(torch.cat([w.get(n, s, init) for n, s in zip(names, shapes, strict=True)]), bias)


def stacked_experts(
    w: WeightSource, rows: list[list[str]], shapes: list[tuple[int, int]], init: Init = "normal"
) -> torch.Tensor | Fp8Experts:
    """Experts [E, N, K]: expert j stacks the parts `rows[j]` (of `shapes`) by rows."""
    per_expert = [fp8_parts(w, names, shapes, init) for names in rows]
    if all(p is not None for p in per_expert):
        return stack_fp8([cat_fp8(p) for p in per_expert if p is not None])
    return torch.stack(
        [torch.cat([w.get(n, s, init) for n, s in zip(names, shapes, strict=True)])
         for names in rows]
    )  # fmt: skip


def stacked_fp4_experts(
    w: WeightSource, rows: list[list[str]], shapes: list[tuple[int, int]]
) -> Mxfp4Experts | None:
    """Experts [E, N, K] as MXFP4 when every part is stored as DeepSeek-V4's packed FP4 (or
    random weights are quantized to `mxfp4`; expert j stacks the parts `rows[j]` by rows),
    else None."""
    if not isinstance(w, StoredWeights | QuantizingWeights):
        return None
    parts = [[w.packed_fp4(n, s) for n, s in zip(names, shapes, strict=True)] for names in rows]
    if not all(p is not None for expert in parts for p in expert):
        return None
    blocks = torch.stack([torch.cat([p[0] for p in expert if p is not None]) for expert in parts])
    scales = torch.stack([torch.cat([p[1] for p in expert if p is not None]) for expert in parts])
    return Mxfp4Experts(blocks.contiguous(), scales.contiguous())


def mxfp4_experts(
    w: WeightSource, name: str, shape: tuple[int, int, int], interleaved: bool = False
) -> Mxfp4Experts | None:
    """gpt-oss experts `name` [E, N, K] as stored MXFP4 (None: not stored so); `interleaved`
    gate/up rows (2j gate, 2j + 1 up) become [gate rows; up rows], blocks and scales alike."""
    experts = w.mxfp4(name, shape) if isinstance(w, QuantizedWeights) else None
    if experts is None or not interleaved:
        return experts
    order = torch.cat([torch.arange(0, shape[1], 2), torch.arange(1, shape[1], 2)])
    order = order.to(experts.blocks.device)
    blocks = experts.blocks.index_select(1, order).contiguous()
    return Mxfp4Experts(blocks, experts.scales.index_select(1, order).contiguous())


def slice_fp8(w: Fp8Weight, axis: int, start: int, size: int) -> Fp8Weight:
    """Rows (`axis` 0) or columns `[start, start + size)`, in blocks that divide the cut."""
    block = list(w.block)
    block[axis] = math.gcd(math.gcd(min(block[axis], w.w.shape[axis]), start or block[axis]), size)
    fine = w.refined((block[0], block[1]))
    q = fine.w.narrow(axis, start, size).contiguous()
    step = block[axis]
    scale = fine.scale.narrow(axis, start // step, math.ceil(size / step)).contiguous()
    return Fp8Weight(q, scale, fine.block)


def stack_fp8(parts: list[Fp8Weight]) -> Fp8Experts:
    """Equal-shaped FP8 matrices stacked as experts [E, N, K] in one common scale block."""
    block = parts[0].block
    for part in parts:
        block = (math.gcd(block[0], part.block[0]), math.gcd(block[1], part.block[1]))
    fine = [p.refined(block) for p in parts]
    stacked = torch.stack([f.w for f in fine])
    return Fp8Experts(stacked, torch.stack([f.scale for f in fine]).contiguous(), block)


def unstack_fp8(experts: Fp8Experts) -> list[Fp8Weight]:
    return [Fp8Weight(w, s, experts.block) for w, s in zip(experts.w, experts.scale, strict=True)]


def needs_stored_weights(config: ModelConfig) -> bool:
    """Whether a checkpoint of `config` loads through `StoredWeights`: quantized weights, or
    a float32 router / correction bias (DeepSeek-style MoE) read without rounding."""
    moe = config.moe
    return config.quant is not None or config.mla is not None or bool(moe and moe.score_bias)
