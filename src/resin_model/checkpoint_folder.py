"""A checkpoint is a closed folder: every file a loader opens is checked here first.

Checkpoints come from strangers (a hub download is data an attacker controls: its index, its
symlinks, its config), so before anything is read or allocated:
- every file a loader opens (`config.json`, the shards the index names or the `*.safetensors`
  glob finds, `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`,
  `generation_config.json`, a `.gguf`) resolves inside the folder: a name may not be absolute
  or hold `..`, a symlink may not leave the folder, and it must be a regular file (checked with
  `stat`, so a FIFO or a device is refused without being opened);
- the folder of a Hugging Face hub snapshot (`<repo>/snapshots/<rev>/`, whose files are
  symlinks to `<repo>/blobs/<hash>`) is closed at its repository folder `<repo>`: its symlinks
  may point anywhere inside `<repo>`, nowhere else;
- every shard's safetensors header is read and checked (size, JSON, dtypes, shapes, offsets
  within the file) without reading a weight, and the index must agree with the headers;
- `config.json` is translated (`hf_config.parse_config`) and the shapes it declares are
  compared with the shapes the shards hold (`check_shapes`).

Every malformed input raises `CheckpointError` (`checkpoint_error.py`, a `ValueError`), one
line naming the entry; the application prints it and exits 2.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from resin_model.checkpoint_error import CheckpointError

if TYPE_CHECKING:
    from resin_model.config import ModelConfig

INDEX = "model.safetensors.index.json"

OPTIONAL_FILES = (
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
    "preprocessor_config.json",
)
"""Files a loader opens when present: each must be a regular file inside the folder."""

MAX_HEADER_BYTES = 100 << 20
"""A safetensors header above this is refused (safetensors' own limit)."""

MAX_JSON_BYTES = 64 << 20
"""config.json, the index, the tokenizer config: read whole, so bounded."""

DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
"""Safetensors dtypes and their sizes (F4 packs are stored as U8)."""

FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
"""What an unquantized checkpoint's weights may be."""


SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale", "input_scale", "_scales")
"""Quantization scales stored beside weights (not parameters of the dequantized model)."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor as a shard's header declares it (nothing of it is read)."""

    dtype: str
    shape: tuple[int, ...]
    shard: str
    """The shard's file name (relative to the folder)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def closure_root(folder: str | Path) -> Path:
    """The folder symlinks may point into: the folder itself (resolved), or a hub snapshot's
    repository folder (`<repo>/snapshots/<rev>` -> `<repo>`, which holds `blobs/`)."""
    real = Path(folder).resolve()
    if real.parent.name == "snapshots" and (real.parent.parent / "blobs").is_dir():
        return real.parent.parent
    return real


def checked_file(folder: str | Path, name: str, required: bool = True) -> Path | None:
    """`folder/name` after checking that `name` stays inside the folder (relative, no `..`,
    no symlink out of `closure_root`) and is a regular file; None when it is absent and not
    `required`. Nothing is opened."""
    where = f"{name!r} in {folder}"
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        raise CheckpointError(f"checkpoint entry {name!r} in {folder} is not a file name")
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts:
        raise CheckpointError(f"checkpoint entry {where} names a file outside the folder")
    path = Path(folder) / name
    if not os.path.lexists(path):
        if required:
            raise CheckpointError(f"checkpoint file {where} is missing")
        return None
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        raise CheckpointError(f"checkpoint file {where} is a symlink loop") from None
    if not real.is_relative_to(closure_root(folder)):
        raise CheckpointError(f"checkpoint file {where} is a link to {real}, outside the folder")
    try:
        mode = os.stat(real).st_mode
    except OSError as exc:  # a dangling link, or no permission
        raise CheckpointError(f"checkpoint file {where} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"checkpoint file {where} is not a regular file")
    return path


def read_regular(path: Path, limit: int) -> bytes:
    """A checked regular file's bytes, at most `limit` of them (opened non-blocking and
    checked again on the open descriptor: a file swapped for a FIFO never blocks)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"checkpoint file {path} is not a regular file")
        if info.st_size > limit:
            raise CheckpointError(f"{path} is {info.st_size} bytes, more than {limit}")
        chunks = []
        while data := os.read(fd, 1 << 20):
            chunks.append(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(folder: str | Path, name: str, required: bool = True) -> Any:
    """The JSON value of a checked file of the folder (None when absent and not required)."""
    path = checked_file(folder, name, required)
    if path is None:
        return None
    try:
        return json.loads(read_regular(path, MAX_JSON_BYTES))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{name} in {folder} is not valid JSON: {exc}") from None


def read_config(folder: str | Path) -> dict[str, Any]:
    """`config.json` as a dict (a `CheckpointError` when it is missing or not an object)."""
    raw = read_json(folder, "config.json")
    if not isinstance(raw, dict):
        raise CheckpointError(f"config.json in {folder} is not a JSON object")
    return raw


def shard_names(folder: str | Path) -> dict[str, str | None]:
    """Shard file name -> None, or tensor name -> shard name from the index: the index's
    `weight_map` when there is one (every name checked), else every `*.safetensors` file."""
    index = read_json(folder, INDEX, required=False)
    if index is None:
        names = sorted(p.name for p in Path(folder).glob("*.safetensors"))
        if not names:
            raise CheckpointError(f"no *.safetensors files in {folder}")
        return dict.fromkeys(names)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{INDEX} in {folder} has no weight_map object")
    bad = next((k for k, v in weight_map.items() if not isinstance(v, str)), None)
    if bad is not None:
        raise CheckpointError(f"{INDEX} in {folder} maps {bad!r} to {weight_map[bad]!r}")
    return dict(weight_map)


def checkpoint_files(folder: str | Path) -> list[Path]:
    """The safetensors shards of a checkpoint folder (through its index when present), each
    checked to be a regular file inside the folder."""
    names = shard_names(folder)
    indexed = {v for v in names.values() if v is not None}
    shards = sorted(indexed or names)
    return [p for p in (checked_file(folder, str(s)) for s in shards) if p is not None]


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor name -> `TensorInfo` from a shard's header, every entry checked against the
    file's size (no tensor data is read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"checkpoint file {path} is not a regular file")
        size = info.st_size
        prefix = os.pread(fd, 8, 0)
        if len(prefix) < 8:
            raise CheckpointError(f"{path.name}: not a safetensors file ({size} bytes)")
        length = int.from_bytes(prefix, "little")
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{path.name}: safetensors header of {length} bytes is invalid")
        text = os.pread(fd, length, 8)
    finally:
        os.close(fd)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path.name}: safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    data = size - 8 - length
    return {name: _tensor_info(path.name, name, entry, data) for name, entry in header.items()}


def _tensor_info(shard: str, name: str, entry: Any, data_bytes: int) -> TensorInfo:
    where = f"{shard}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where} has no description")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise CheckpointError(f"{where} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise CheckpointError(f"{where} has invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise CheckpointError(f"{where} has data offsets {offsets!r} outside the file")
    tensor = TensorInfo(str(dtype), tuple(shape), shard)
    if offsets[1] - offsets[0] != tensor.nbytes:
        raise CheckpointError(
            f"{where}: {offsets[1] - offsets[0]} bytes stored, its {dtype} shape "
            f"{tuple(shape)} needs {tensor.nbytes}"
        )
    return tensor


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_manifest(folder: str | Path) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint's shards (name -> `TensorInfo`); a tensor in two shards,
    or one the index places in a shard that lacks it, is an error."""
    names = shard_names(folder)
    manifest: dict[str, TensorInfo] = {}
    for shard in checkpoint_files(folder):
        for name, info in read_header(shard).items():
            if name in manifest:
                raise CheckpointError(
                    f"tensor {name!r} is in both {manifest[name].shard} and {shard.name}"
                )
            manifest[name] = info
    for name, listed in names.items():
        if listed is not None and (name not in manifest or manifest[name].shard != listed):
            raise CheckpointError(f"{INDEX} puts {name!r} in {listed}, which does not hold it")
    return manifest


@dataclass(frozen=True)
class CheckedCheckpoint:
    """What `check_checkpoint` read: the typed config and the shards' tensors."""

    config: ModelConfig
    tensors: dict[str, TensorInfo]

    @property
    def weight_bytes(self) -> int:
        """The bytes of every stored tensor (what loading reads)."""
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def parameter_count(self) -> int:
        """The model's parameters once dequantized: every stored value, two per MXFP4 byte,
        scale tensors left out."""
        count = 0
        for name, t in self.tensors.items():
            if name.endswith(SCALE_SUFFIXES):
                continue
            count += t.numel * (2 if name.endswith("_blocks") else 1)
        return count


def check_checkpoint(folder: str | Path, tokenizer: bool = True) -> CheckedCheckpoint:
    """Check a checkpoint folder before anything is loaded from it (module docstring): the
    files are inside and regular, the headers valid, the config translatable and its shapes
    the shards'. `tokenizer`: `tokenizer.json` is required too."""
    config = check_checkpoint_config(folder, tokenizer)
    tensors = read_manifest(folder)
    check_shapes(config, tensors)
    return CheckedCheckpoint(config, tensors)


def check_checkpoint_config(folder: str | Path, tokenizer: bool = True) -> ModelConfig:
    """`check_checkpoint` without the weights (`resin serve --load-format dummy` draws them):
    the folder's config translated, its tokenizer and other small files inside and regular."""
    from resin_model.hf_config import parse_config

    if not Path(folder).is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist")
    raw = read_config(folder)
    if tokenizer:
        checked_file(folder, "tokenizer.json")
    for name in OPTIONAL_FILES:  # JSON ones parsed too (a loader reads them whole)
        if name.endswith(".json"):
            read_json(folder, name, required=False)
        else:
            checked_file(folder, name, required=False)
    try:
        return parse_config(raw)
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, ZeroDivisionError, OverflowError) as exc:
        reason = _one_line(exc).removeprefix("config.json ")
        raise CheckpointError(f"config.json in {folder}: {reason}") from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    if isinstance(exc, KeyError):
        return f"lacks the key {exc.args[0]!r}" if exc.args else "a key is missing"
    return text[0] if text else type(exc).__name__


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_VISION = re.compile(r"vision|visual|mm_projector|multi_modal")


def check_shapes(config: ModelConfig, tensors: dict[str, TensorInfo]) -> None:
    """The shapes `config` declares are the ones the shards hold: every decoder layer has
    tensors, the embedding is vocabulary x hidden, attention projections match the heads,
    and an unquantized checkpoint stores float weights."""
    text = {n: t for n, t in tensors.items() if not _VISION.search(n)}
    present = {int(m.group(1)) for n in text if (m := _LAYER.search(n))}
    missing = [i for i in range(config.num_layers) if i not in present]
    if missing:
        raise CheckpointError(
            f"config.json declares {config.num_layers} layers; the shards lack layer "
            f"{missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    for name, t in text.items():
        if name.endswith("embed_tokens.weight") and t.shape != (
            config.vocab_size,
            config.hidden_size,
        ):
            raise CheckpointError(
                f"{name} is {t.shape}; config.json declares vocab_size {config.vocab_size} x "
                f"hidden_size {config.hidden_size}"
            )
    if config.mla is None:
        _check_attention(config, text)
    _check_dtypes(config, tensors)


INTEGER_TABLES = (".tid2eid",)
"""Tensors stored as integers by design: DeepSeek-V4's token -> expert hash-routing table."""
INTEGER_DTYPES = frozenset({"I32", "I64"})


def _check_dtypes(config: ModelConfig, tensors: dict[str, TensorInfo]) -> None:
    """Weights are floats, except what the declared quantization stores (FP8 weights, MXFP4
    blocks and scales as bytes); a quantization label the shards do not carry is refused."""
    scheme = config.quant.scheme if config.quant is not None else None
    allowed = set(FLOAT_DTYPES)
    if scheme is not None and scheme.startswith("fp8"):
        allowed |= {"F8_E4M3", "F8_E8M0"}  # e8m0: UE8M0 scales (DeepSeek-V4)
        if config.quant is not None and config.quant.fp4_experts:
            allowed |= {"I8"}  # DeepSeek-V4's packed FP4 experts
        if not any(t.dtype == "F8_E4M3" for t in tensors.values()):
            raise CheckpointError(f"config.json declares {scheme}, but no tensor is stored as FP8")
    if scheme == "mxfp4":
        allowed |= {"U8"}
        if not any(n.endswith("_blocks") and t.dtype == "U8" for n, t in tensors.items()):
            raise CheckpointError("config.json declares mxfp4, but no tensor holds MXFP4 blocks")
    odd = next(
        (
            n
            for n, t in tensors.items()
            if t.dtype not in allowed
            and not (n.endswith(INTEGER_TABLES) and t.dtype in INTEGER_DTYPES)
        ),
        None,
    )
    if odd is not None:
        declared = f"declares {scheme}" if scheme else "declares no quantization"
        raise CheckpointError(
            f"{odd} is stored as {tensors[odd].dtype}; config.json {declared} "
            f"(allowed: {', '.join(sorted(allowed))})"
        )


_LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")


def _check_attention(config: ModelConfig, tensors: dict[str, TensorInfo]) -> None:
    """q/k/v rows against the attention heads, on the layers of an attention kind (a linear
    layer's projections have their own heads: GLM-5.3's KDA). Qwen3.5's q_proj also emits
    each head's output gate (twice the rows)."""
    gated = 2 if config.model_type.startswith("qwen3_5") else 1
    rows = {
        "q_proj": gated * config.num_heads * config.head_dim,
        "k_proj": config.num_kv_heads * config.head_dim,
        "v_proj": config.num_kv_heads * config.head_dim,
    }
    kinds = config.layer_types
    for name, t in tensors.items():
        part = name.rsplit(".", 2)
        layer = _LAYER_INDEX.search(name)
        if layer and int(layer.group(1)) < len(kinds) and kinds[int(layer.group(1))] == "linear":
            continue
        if len(part) == 3 and part[2] == "weight" and part[1] in rows and len(t.shape) == 2:
            want = rows[part[1]]
            if t.shape[0] != want and t.dtype in FLOAT_DTYPES | {"F8_E4M3"}:
                raise CheckpointError(
                    f"{name} has {t.shape[0]} rows; config.json's heads x head_dim give {want}"
                )
