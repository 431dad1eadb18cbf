"""Decode throughput of the reference TorchRunner vs `transformers.generate` on the same
random-weight model (SmolLM2-135M shape by default), batch 1 and batch 8, greedy.

Drives the runner with the real Engine when it is available, else with the test planner.
Prints a table and appends JSONL rows to --out.

    PYTHONPATH=src python scripts/bench_torch_runner.py --threads 2 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import transformers

from resin import Engine, SamplingParams
from resin_models_torch.registry import load_runner

SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    tie_word_embeddings=True,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=8192,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def bench_resin(folder: Path, prompts: list[list[int]], new_tokens: int) -> float:
    runner = load_runner(folder, page_size=16, cache_bytes=64 << 20)
    params = SamplingParams(max_output_tokens=new_tokens, temperature=0.0, ignore_stop_tokens=True)
    with Engine(runner, context_length=4096) as engine:
        start = time.perf_counter()
        requests = [engine.submit(p, params) for p in prompts]
        while engine.has_work():
            engine.step()
        elapsed = time.perf_counter() - start
    assert all(len(r.take_result()) == new_tokens for r in requests)
    return len(prompts) * new_tokens / elapsed


def bench_hf(model: transformers.PreTrainedModel, prompts: list[list[int]], new_tokens: int) -> float:
    ids = torch.tensor(prompts)
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return len(prompts) * new_tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("bench_torch_runner.jsonl"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOLLM2_135M)).eval()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        for batch in (1, 8):
            prompts = torch.randint(0, 49152, (batch, args.prompt_tokens)).tolist()
            bench_resin(Path(tmp), prompts, 4)  # warm-up
            resin_tps = bench_resin(Path(tmp), prompts, args.new_tokens)
            hf_tps = bench_hf(model, prompts, args.new_tokens)
            rows.append(
                {
                    "model": "smollm2-135m-shape (random, fp32)",
                    "batch": batch,
                    "new_tokens": args.new_tokens,
                    "threads": args.threads,
                    "resin_tok_s": round(resin_tps, 1),
                    "hf_generate_tok_s": round(hf_tps, 1),
                }
            )
    print(f"{'batch':>5} {'resin tok/s':>12} {'hf tok/s':>10}")
    for row in rows:
        print(f"{row['batch']:>5} {row['resin_tok_s']:>12} {row['hf_generate_tok_s']:>10}")
    with args.out.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
