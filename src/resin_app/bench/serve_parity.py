"""`resin serve` on each runner against transformers, same dtype, real default model.

Five chat prompts (those of tests/cuda/test_bf16_real.py), greedy, 10 new tokens: transformers
in the device's serving dtype (bfloat16 on CUDA, float32 on the CPU) gives the reference
tokens; `resin serve --device D --runner R` (R: torch, cuda where the device has it) answers
the same token ids through `/v1/completions`. Prints one JSON line per prompt and runner and a
summary; writes them to `--output` (JSONL). Exit 1 when any answer differs.

    resin bench serve-parity --device cuda --runners torch cuda --output out.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import torch

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water?",
    "Give me one tip for staying healthy.",
    "What is 12 times 12?",
]
NEW_TOKENS = 10
"""On the 11th token of "Who wrote Romeo and Juliet?" the top two candidates lie 0.07 nats apart
in float32 ("is attributed" / "is a classic"): a tie that bfloat16 rounding breaks either way
(H200: transformers and the fast runner one way, the reference runner the other). The first
10 tokens of the five prompts have no such tie."""


def chat_prompts(tok: object) -> list[list[int]]:
    """The five questions as SmolLM2 chat prompts (system, user, the assistant's turn)."""
    return [
        tok.encode(  # type: ignore[attr-defined]
            f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        for q in QUESTIONS
    ]


def transformers_greedy(
    folder: Path, prompts: list[list[int]], device: str, eos: int
) -> list[list[int]]:
    """`transformers.generate` greedy, NEW_TOKENS at most, in the device's serving dtype
    (bfloat16 on CUDA, float32 on the CPU)."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = model.to(device).eval()  # type: ignore[arg-type]
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt], device=device)
        with torch.inference_mode():
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos)  # fmt: skip
        out.append([int(t) for t in gen[0, len(prompt) :]])
    return out


def _served(runner: str, device: str, prompts: list[list[int]], port: int) -> list[str]:
    cmd = [sys.executable, "-m", "resin_app", "serve", "--device", device, "--runner", runner,
           "--port", str(port), "--api-server-count", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"resin serve --runner {runner} exited: {err}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        texts = []
        for prompt in prompts:
            body = {"model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
            answer = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
            texts.append(answer["choices"][0]["text"])
        return texts
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: Sequence[str] | None = None) -> int:
    from resin.tokenizer import Tokenizer
    from resin_model.default_model import default_model_dir

    p = argparse.ArgumentParser(
        prog="resin bench serve-parity", description=__doc__.splitlines()[0]
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--runners", nargs="+", default=["torch", "cuda"])
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    folder = default_model_dir()
    tok = Tokenizer.from_dir(folder)
    eos = tok.token_to_id("<|im_end|>")
    assert eos is not None
    prompts = chat_prompts(tok)
    expected = [tok.decode([t for t in ids if t != eos]) for ids in
                transformers_greedy(folder, prompts, args.device, eos)]  # fmt: skip
    rows, same = [], 0
    for runner in args.runners:
        texts = _served(runner, args.device, prompts, args.port)
        for question, want, got in zip(QUESTIONS, expected, texts, strict=True):
            row = {"runner": runner, "device": args.device, "prompt": question,
                   "transformers": want, "served": got, "equal": want == got}  # fmt: skip
            same += row["equal"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {"equal": same, "of": len(rows)}
    print(json.dumps(summary))
    if args.output is not None:
        args.output.write_text("".join(json.dumps(r) + "\n" for r in [*rows, summary]))
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
