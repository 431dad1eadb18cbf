"""`resin quantize SRC DST --format fp8-block|fp8-channel|mxfp4` (also
`python -m resin_app.quantize`): write a checkpoint folder in a published quantized layout
from a bf16 / fp16 / fp32 one, so accuracy and speed runs need no hub download.

- `fp8-block`: e4m3 weights in 128 x 128 blocks, `weight_scale_inv` (Qwen3-*-FP8, DeepSeek-V3);
- `fp8-channel`: compressed-tensors `float-quantized`, one `weight_scale` per output channel
  and dynamic per-token activations (the Llama-3.1-8B-Instruct-FP8 kind);
- `mxfp4`: gpt-oss's experts as `*_blocks` + `*_scales` (the rest stays as it is).
DeepSeek-V4 folders (published names) get that model's published layout instead: `fp8-block`
with UE8M0 scales named `<module>.scale`; `mxfp4` the same with the routed experts in packed
FP4 (e2m1 + e8m0 per 32, `expert_dtype: fp4`), as deepseek-ai/DeepSeek-V4-Flash ships.

Every linear weight of the decoder layers is quantized except the routers; embeddings, the LM
head and norms stay in the source dtype (`resin_model/quant_checkpoint.py` has the rule).
Shards are written one source shard at a time (memory stays one shard); the tokenizer and
generation config are copied. The source is checked as `resin serve` checks it (a closed
folder, valid headers); the destination gets only regular files this command creates, and may
not be the source or inside it. docs/checkpoints.md describes the layouts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from resin_model.quant_checkpoint import QUANT_FORMATS, check_format, quantization_config


def quantize_folder(src: str | Path, dst: str | Path, fmt: str) -> Path:
    """Write `dst` (created; must not hold a checkpoint, be `src` or lie inside it) from the
    checkpoint folder `src` (checked first: `resin_model.checkpoint_folder`). Every file is
    written under a fresh name in `dst` and renamed into place, so a symlink already in `dst`
    is replaced, never written through."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from resin_model.checkpoint_folder import (
        OPTIONAL_FILES,
        CheckpointError,
        checked_file,
        checkpoint_files,
        read_config,
        read_manifest,
    )
    from resin_model.quant_checkpoint import (
        deepseek_v4_quantization,
        quantize_tensor,
        quantize_v4_tensor,
    )

    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise CheckpointError(f"checkpoint folder {src} does not exist")
    if dst.resolve().is_relative_to(src.resolve()):
        raise ValueError(f"the destination {dst} is inside the source {src}")
    raw = read_config(src)
    if raw.get("quantization_config"):
        raise ValueError(f"{src} is already quantized ({raw['quantization_config']})")
    checked = check_format(fmt, str(raw.get("model_type")))
    v4 = raw.get("model_type") == "deepseek_v4"
    quantize = quantize_v4_tensor if v4 else quantize_tensor
    read_manifest(src)  # every shard inside the folder, every header valid
    dst.mkdir(parents=True, exist_ok=True)
    if any(dst.glob("*.safetensors")):
        raise FileExistsError(f"{dst} already holds a checkpoint")
    weight_map: dict[str, str] = {}
    for shard in checkpoint_files(src):
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                for stored, tensor in quantize(name, f.get_tensor(name), checked):
                    out[stored] = tensor.contiguous()
        write_new(dst, shard.name, partial(save_file, out, metadata={"format": "pt"}))
        weight_map.update(dict.fromkeys(out, shard.name))
    if len(set(weight_map.values())) > 1:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        write_new(dst, "model.safetensors.index.json", _text(json.dumps(index, indent=2)))
    for name in (*TOKENIZER_FILES, *OPTIONAL_FILES):
        extra = checked_file(src, name, required=False)
        if extra is not None:
            write_new(dst, name, partial(shutil.copyfile, extra))
    if v4:
        raw["quantization_config"] = deepseek_v4_quantization()
        if checked == "mxfp4":
            raw["expert_dtype"] = "fp4"
    else:
        raw["quantization_config"] = quantization_config(checked)
    write_new(dst, "config.json", _text(json.dumps(raw, indent=2)))
    return dst


TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model")
"""Copied beside the weights with `checkpoint_folder.OPTIONAL_FILES` (only these: a folder's
other files are not the checkpoint's)."""


def write_new(folder: Path, name: str, write: Callable[[str], object]) -> None:
    """`folder/name` := what `write(path)` writes to a file this call created (`O_EXCL |
    O_NOFOLLOW`: never an existing file or a symlink's target), then renamed over `name`."""
    scratch = folder / f".{name}.{os.getpid()}.tmp"
    os.close(os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    try:
        write(str(scratch))
        os.replace(scratch, folder / name)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def _text(text: str) -> Callable[[str], object]:
    return lambda path: Path(path).write_text(text, encoding="utf-8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resin quantize", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("src", help="a bf16 / fp16 / fp32 checkpoint folder")
    parser.add_argument("dst", help="the folder to write")
    parser.add_argument("--format", required=True, choices=QUANT_FORMATS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = quantize_folder(args.src, args.dst, args.format)
    except (ValueError, OSError) as exc:
        print(f"resin quantize: error: {exc}")
        return 2
    print(f"wrote {args.format} checkpoint {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
