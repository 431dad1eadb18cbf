"""Real weights: n-gram speculative decoding vs plain decoding at batch 1 on the GPU.

    resin bench speculative-copy --draft-k 4,8 --output docs/bench/gpu/speculative_copy.jsonl

SmolLM2-135M-Instruct from its packaged GGUF (converted by Resin; `--gguf` for another path),
`CudaRunner` through the Engine (overlap on for the plain runs), chat-templated prompts whose
answers copy from them (repeat a paragraph; rename a variable in code). Each configuration
runs every prompt `--repeats` times after one warm-up; decode tok/s = (output tokens - 1) /
time from the first token to the last, median over repeats. The speculative runs must write
the same greedy text as the plain run (checked and reported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from resin import Engine, SamplingParams
from resin.engine.proposers import NgramProposer
from resin.engine.speculative import Speculation
from resin.events import TokensEvent
from resin.recipe import load_recipe
from resin.recipe.types import Message
from resin.tokenizer import Tokenizer
from resin_app.bench.report import write_jsonl
from resin_model.default_model import converted_gguf_dir, default_gguf_path
from resin_models_cuda import CudaRunner, RunnerOptions, load_runner

PARAGRAPH = (
    "The old lighthouse stood at the edge of the northern cliffs for more than two hundred "
    "years. Every night its keeper climbed the one hundred and twelve steps of the spiral "
    "staircase, trimmed the wick, polished the great lens and wound the clockwork that turned "
    "the light. Ships passing through the narrow channel below trusted that steady beam to "
    "guide them past the hidden rocks, and in all that time not a single vessel was lost on "
    "the reef while the light was burning. When the keeper finally retired, the village held "
    "a celebration in the square, and the children sang songs about the light that never "
    "went out."
)
CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    discount = 0
    if subtotal > 100:
        discount = subtotal * 0.05
    taxed = (subtotal - discount) * (1 + tax_rate)
    return round(taxed, 2)
"""
PROMPTS = {
    "repeat": "Repeat the following paragraph exactly, word for word:\n\n" + PARAGRAPH,
    "code_edit": "Rewrite this Python function with the variable `subtotal` renamed to "
    "`base_amount`. Output only the code.\n\n" + CODE,
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def generate(runner: CudaRunner, prompt: list[int], params: SamplingParams,
             spec: Speculation | None) -> tuple[list[int], float, dict[str, Any]]:  # fmt: skip
    """Tokens, decode tok/s and speculation counters of one request alone in an Engine."""
    with Engine(runner, context_length=4096, max_sequences=4, speculation=spec) as engine:
        request = engine.submit(prompt, params)
        first = last = 0.0
        n = 0
        while engine.has_work():
            events = engine.step()
            got = sum(len(e.token_ids) for e in events if isinstance(e, TokensEvent))
            if got:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                now = time.perf_counter()
                first = first or now
                last = now
                n += got
        tokens = list(request.take_result())
        m = engine.metrics
        stats = {}
        if m is not None and spec is not None:
            stats = {"draft_tokens": m.spec_decode_num_draft_tokens,
                     "accepted_tokens": m.spec_decode_num_accepted_tokens,
                     "verify_rows": m.spec_decode_num_drafts}  # fmt: skip
    return tokens, (n - 1) / max(last - first, 1e-9), stats


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resin bench speculative-copy")
    p.add_argument("--gguf", type=Path, help="a GGUF file (default: the packaged SmolLM2)")
    p.add_argument("--draft-k", type=_ints, default=[4, 8])
    p.add_argument("--max-tokens", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--device", default="cuda", help="cuda (cpu: interpreter smoke test only)")
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    folder = converted_gguf_dir(args.gguf or default_gguf_path())
    tokenizer = Tokenizer.from_dir(folder)
    recipe = load_recipe(tokenizer, None)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    options = RunnerOptions(max_batch=4, max_context=4096, max_draft_tokens=max(args.draft_k),
                            verify_graph_batch=4)  # fmt: skip
    base = load_runner(folder, options, device=args.device, dtype=dtype)
    params = SamplingParams(max_output_tokens=args.max_tokens, temperature=0.0,
                            stop_token_ids=recipe.stop_token_ids)  # fmt: skip
    records = []
    for name, text in PROMPTS.items():
        prompt = list(recipe.render([Message("user", text)]).token_ids)
        configs: list[tuple[str, Speculation | None]] = [("plain", None)]
        configs += [(f"ngram_k{k}", Speculation(NgramProposer(), num_draft_tokens=k))
                    for k in args.draft_k]  # fmt: skip
        plain_tokens: list[int] = []
        plain_rate = 0.0
        for label, spec in configs:
            rates = []
            for i in range(args.repeats + 1):
                runner = CudaRunner(base.model, options)
                tokens, rate, stats = generate(runner, prompt, params, spec)
                if i:
                    rates.append(rate)
            rate = statistics.median(rates)
            if spec is None:
                plain_tokens, plain_rate = tokens, rate
            rec = {"kind": "spec_real", "model": "SmolLM2-135M-Instruct", "dtype": args.dtype,
                   "prompt": name, "config": label, "prompt_tokens": len(prompt),
                   "output_tokens": len(tokens), "decode_tok_s": rate,
                   "speedup": rate / plain_rate, "same_text": tokens == plain_tokens,
                   **stats}  # fmt: skip
            records.append(rec)
            print(json.dumps(rec), flush=True)
        print(repr(tokenizer.decode(plain_tokens)[:300]), flush=True)
    if args.output:
        write_jsonl(args.output, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
