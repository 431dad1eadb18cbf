"""`resin bench checkpoint`: write a random-weights checkpoint folder of real shapes, so
`resin serve --checkpoint DIR` can be measured without the hub.

The folder is what a Hugging Face checkpoint holds: `config.json` (a `resin_model.presets`
shape, or a given config.json), safetensors shards of at most `--shard-gb` with
`model.safetensors.index.json`, and a real tokenizer folder's files (default: the default
model's, SmolLM2's). Tensor names and shapes are the reference model's (built on the `meta`
device, so nothing is allocated for it): normal(0, `--std`) everywhere, RMSNorm weights at
identity, drawn shard by shard on `--device` from a seed per tensor (the same folder for the
same seed). A config whose vocabulary is smaller than the tokenizer's grows to the tokenizer's,
so every token the server encodes is in range.

    resin bench checkpoint --preset llama-8b --output /tmp/llama-8b --device cuda
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
"""What is copied from the tokenizer folder (never its weights or generation defaults)."""

INDEX = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True)
class Written:
    folder: Path
    shards: int
    bytes: int
    seconds: float


def write_checkpoint(
    raw: dict[str, Any],
    folder: str | Path,
    *,
    tokenizer: str | Path | None = None,
    dtype: str = "bfloat16",
    shard_bytes: int = 4 << 30,
    seed: int = 0,
    std: float = 0.02,
    device: str = "cpu",
    weights: bool = True,
) -> Written:
    """Write `raw` (a config.json dict) as a random-weights checkpoint into `folder`;
    `weights=False`: its config and tokenizer only, a folder for `resin serve --load-format
    dummy` (random weights drawn where they are served: no disk for them)."""
    import torch

    from resin_model.checkpoint_folder import checked_file

    if not isinstance(raw, dict):
        raise ValueError(f"a config must be a JSON object, not {type(raw).__name__}")
    start = time.perf_counter()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    source = Path(tokenizer) if tokenizer is not None else _default_tokenizer()
    config = _config_for(raw, source, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in TOKENIZER_FILES:  # regular files inside the tokenizer folder only
        if (path := checked_file(source, name, required=False)) is not None:
            shutil.copyfile(path, out / name)
    if not weights:
        return Written(out, 0, 0, time.perf_counter() - start)
    params = parameter_shapes(config)
    torch_dtype = getattr(torch, dtype)
    total = sum(_numel(shape) for _, shape, _ in params) * torch_dtype.itemsize
    groups = list(_shards(params, shard_bytes // torch_dtype.itemsize))
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        _write_shard(out / file, group, torch_dtype, seed, std, device)
        weight_map |= {name: file for name, _, _ in group}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return Written(out, len(groups), total, time.perf_counter() - start)


Param = tuple[str, tuple[int, ...], str]
"""A tensor's checkpoint name, shape and fill ("normal", "ones", "zeros", or "table:E" for an
integer table [rows, k] of expert ids below E: DeepSeek-V4's hash routing, row t naming
experts t*k .. t*k + k - 1 modulo E, so tokens spread over the experts)."""


def parameter_shapes(raw: dict[str, Any]) -> list[Param]:
    """Every tensor the reference model of `raw` loads, in its order (tied ones once)."""
    from resin_model.hf_config import parse_config
    from resin_model.nn import RMSNorm
    from resin_models_torch.registry import build_model

    config = parse_config(raw)
    model = build_model(config, "meta")
    norms = {
        id(m.weight): "zeros" if m.unit_offset else "ones"
        for m in model.modules()
        if isinstance(m, RMSNorm)
    }
    experts = config.moe.num_experts if config.moe is not None else 1
    norms |= {
        id(p): f"table:{experts}" for p in model.parameters() if not p.dtype.is_floating_point
    }
    return [
        (name, tuple(p.shape), norms.get(id(p), "normal")) for name, p in model.named_parameters()
    ]


def _config_for(raw: dict[str, Any], tokenizer: Path, dtype: str) -> dict[str, Any]:
    """`raw` with the dtype named, the tokenizer folder's special ids, and a vocabulary at
    least the tokenizer's."""
    config = dict(raw) | {"torch_dtype": dtype}
    theirs = tokenizer / "config.json"
    if theirs.is_file():
        known = json.loads(theirs.read_text(encoding="utf-8"))
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if key in known and key not in config:
                config[key] = known[key]
    from resin.tokenizer import Tokenizer

    vocab = Tokenizer.from_dir(tokenizer).vocab_size
    if int(config.get("vocab_size", 0)) < vocab:
        print(f"resin bench checkpoint: vocab_size -> {vocab} (the tokenizer's)", file=sys.stderr)
        config["vocab_size"] = vocab
    return config


def _default_tokenizer() -> Path:
    from resin_model.default_model import default_model_dir

    return default_model_dir()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _shards(params: list[Param], max_elements: int) -> Iterator[list[Param]]:
    """Consecutive tensors in groups of at most `max_elements` (a larger tensor alone)."""
    group: list[Param] = []
    size = 0
    for param in params:
        n = _numel(param[1])
        if group and size + n > max_elements:
            yield group
            group, size = [], 0
        group.append(param)
        size += n
    if group:
        yield group


def _write_shard(
    path: Path, group: list[Param], dtype: torch.dtype, seed: int, std: float, device: str
) -> None:
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, shape, fill in group:
        if fill.startswith("table:"):
            rows, k = shape
            ids = torch.arange(rows)[:, None] * k + torch.arange(k)[None, :]
            tensors[name] = ids % int(fill.removeprefix("table:"))
            continue
        if fill != "normal":
            make = torch.ones if fill == "ones" else torch.zeros
            tensors[name] = make(shape, dtype=dtype)
            continue
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + _name_seed(name))
        values = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        tensors[name] = (values * std).to(dtype).cpu()
    save_file(tensors, str(path), metadata={"format": "pt"})


def _name_seed(name: str) -> int:
    """A stable per-tensor seed (Python's `hash` of a str changes per process)."""
    import zlib

    return zlib.crc32(name.encode())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="resin bench checkpoint",
        description="write a random-weights checkpoint folder (config, shards, tokenizer)",
    )
    shape = p.add_mutually_exclusive_group(required=True)
    shape.add_argument("--preset", help="a resin_model.presets name (llama-8b, tiny, ...)")
    shape.add_argument("--config", help="a config.json to copy the shape from")
    p.add_argument("--output", required=True, help="the folder to write")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: SmolLM2's)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--shard-gb", type=float, default=4.0, help="largest shard (4 GB)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std", type=float, default=0.02)
    p.add_argument("--device", default="cpu", help="where the random numbers are drawn")
    p.add_argument(
        "--no-weights",
        dest="weights",
        action="store_false",
        help="config and tokenizer only, for `resin serve --load-format dummy`",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from resin_model.presets import preset_hf

    args = parser().parse_args(argv)
    try:
        raw = preset_hf(args.preset) if args.preset else json.loads(Path(args.config).read_text())
        written = write_checkpoint(
            raw,
            args.output,
            tokenizer=args.tokenizer,
            dtype=args.dtype,
            shard_bytes=int(args.shard_gb * (1 << 30)),
            seed=args.seed,
            std=args.std,
            device=args.device,
            weights=args.weights,
        )
    except (OSError, ValueError) as exc:
        print(f"resin bench checkpoint: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"resin bench checkpoint: {written.folder}: {written.bytes / 1e9:.2f} GB in "
        f"{written.shards} shard(s), {written.seconds:.1f} s"
    )
    return 0
