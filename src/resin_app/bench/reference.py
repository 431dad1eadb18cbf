"""Decode throughput of the reference TorchRunner (through the Engine) vs `transformers.generate`
on the same random-weight model of SmolLM2-135M's shape, on CPU or a GPU, any dtype.

No checkpoint package is needed, so it runs on a bare GPU machine too (resin bench cpu
measures the real SmolLM2 on CPU). Each cell: batch x 64-token prompts, 64 greedy tokens, stop
tokens ignored, one warm-up then one timed run; tok/s = batch * new tokens / wall time.

    resin bench reference --device cpu --threads 16
    resin bench reference --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import transformers

from resin import Engine, SamplingParams
from resin_models_torch.registry import load_runner

SMOLLM2_135M_SHAPE = transformers.LlamaConfig(  # type: ignore[call-arg]
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    tie_word_embeddings=True,
    rope_theta=1e5,
    rms_norm_eps=1e-5,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_resin(
    folder: str, device: str, dtype: torch.dtype, prompts: list[list[int]], new: int
) -> float:
    runner = load_runner(folder, device=device, dtype=dtype, cache_bytes=256 << 20)
    params = SamplingParams(max_output_tokens=new, temperature=0.0, ignore_stop_tokens=True)
    elapsed = 0.0
    with Engine(runner) as engine:
        for _ in range(2):  # warm-up, then timed
            start = time.perf_counter()
            for prompt in prompts:
                engine.submit(prompt, params)
            while engine.has_work():
                engine.step()
            _sync(device)
            elapsed = time.perf_counter() - start
    return len(prompts) * new / elapsed


def bench_hf(model: torch.nn.Module, device: str, prompts: list[list[int]], new: int) -> float:
    ids = torch.tensor(prompts, device=device)
    elapsed = 0.0
    for _ in range(2):
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(  # type: ignore[operator]
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        _sync(device)
        elapsed = time.perf_counter() - start
    return len(prompts) * new / elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resin bench reference",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output", type=Path, default=None, help="append JSONL rows here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(SMOLLM2_135M_SHAPE).eval()  # type: ignore[no-untyped-call]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        model = model.to(args.device, dtype)
        for batch in args.batch_sizes:
            prompts = torch.randint(0, 49152, (batch, args.prompt_tokens)).tolist()
            rows.append(
                {
                    "bench": "reference_runner",
                    "device": args.device,
                    "dtype": args.dtype,
                    "threads": torch.get_num_threads(),
                    "batch": batch,
                    "new_tokens": args.new_tokens,
                    "resin_tok_s": round(
                        bench_resin(folder, args.device, dtype, prompts, args.new_tokens), 1
                    ),
                    "hf_generate_tok_s": round(
                        bench_hf(model, args.device, prompts, args.new_tokens), 1
                    ),
                }
            )
            row = rows[-1]
            print(
                f"{args.device} {args.dtype} batch {batch:>3}: resin {row['resin_tok_s']:>8} tok/s"
                f"   transformers.generate {row['hf_generate_tok_s']:>8} tok/s",
                flush=True,
            )
    if args.output is not None:
        with args.output.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
