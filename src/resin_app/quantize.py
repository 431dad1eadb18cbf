"""`resin quantize SRC DST --format fp8-block|fp8-channel|mxfp4` (also
`python -m resin_app.quantize`): write a checkpoint folder in a published quantized layout
from a bf16 / fp16 / fp32 one, so accuracy and speed runs need no hub download.

- `fp8-block`: e4m3 weights in 128 x 128 blocks, `weight_scale_inv` (Qwen3-*-FP8, DeepSeek-V3);
- `fp8-channel`: compressed-tensors `float-quantized`, one `weight_scale` per output channel
  and dynamic per-token activations (the Llama-3.1-8B-Instruct-FP8 kind);
- `mxfp4`: gpt-oss's experts as `*_blocks` + `*_scales` (the rest stays as it is).

Every linear weight of the decoder layers is quantized except the routers; embeddings, the LM
head and norms stay in the source dtype (`resin_model/quant_checkpoint.py` has the rule).
Shards are written one source shard at a time (memory stays one shard); other files
(tokenizer, generation config) are copied. docs/checkpoints.md describes the layouts.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from resin_model.quant_checkpoint import QUANT_FORMATS, check_format, quantization_config


def quantize_folder(src: str | Path, dst: str | Path, fmt: str) -> Path:
    """Write `dst` (created; must not hold a checkpoint) from the checkpoint folder `src`."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from resin_model.quant_checkpoint import quantize_tensor
    from resin_models_torch.loader import checkpoint_files

    src, dst = Path(src), Path(dst)
    raw = json.loads((src / "config.json").read_text())
    if raw.get("quantization_config"):
        raise ValueError(f"{src} is already quantized ({raw['quantization_config']})")
    checked = check_format(fmt, str(raw.get("model_type")))
    dst.mkdir(parents=True, exist_ok=True)
    if any(dst.glob("*.safetensors")):
        raise FileExistsError(f"{dst} already holds a checkpoint")
    weight_map: dict[str, str] = {}
    for shard in checkpoint_files(src):
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                for stored, tensor in quantize_tensor(name, f.get_tensor(name), checked):
                    out[stored] = tensor.contiguous()
        save_file(out, str(dst / shard.name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(out, shard.name))
    if len(set(weight_map.values())) > 1:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for extra in src.iterdir():
        if extra.is_file() and extra.suffix != ".safetensors" and extra.name not in (
            "config.json", "model.safetensors.index.json"):  # fmt: skip
            shutil.copy2(extra, dst / extra.name)
    raw["quantization_config"] = quantization_config(checked)
    (dst / "config.json").write_text(json.dumps(raw, indent=2))
    return dst


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
