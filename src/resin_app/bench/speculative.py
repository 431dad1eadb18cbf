"""Speculative decoding through the Engine, plain vs speculative side by side:
`resin bench speculative --speculative ngram|draft|mtp ...`.

For each batch size, the same requests run twice through a fresh Engine on the same runner:
plain decode, then with speculation. Reported per run: decode tokens/s (first token to last),
engine steps, mean decode-step time, drafts proposed/accepted, and the speculative/plain
ratios, with a check that greedy outputs are identical (skipped with --accepted-drafts).

`--accepted-drafts K` (bench only) makes the runner accept the first K drafts of every row
whatever the model says (`TorchRunner.accept_first`; a runner without that knob is refused) and
pads proposals to K tokens, so each verify step commits K + 1 tokens: the cost of verifying K
drafts, independent of draft quality. Its text is not the model's.

`--speculative mtp` drafts with the checkpoint's (or preset's) MTP layer: on the cuda runner
`RunnerOptions.mtp` (one draft per step, run on the device after each step; the plain runs
switch it off, `mtp_enabled`), on the torch runner the reference `MtpRunner`.

    resin bench speculative --speculative ngram --checkpoint DIR --prompt-text "Repeat: ..." \
        --batch-sizes 1
    resin bench speculative --speculative ngram --model-config llama-1b --random-weights \
        --runner cuda --accepted-drafts 4 --batch-sizes 1,64 --output bench/spec.jsonl
    resin bench speculative --speculative mtp --model-config deepseek-v3-4l --random-weights \
        --runner cuda --device cuda --num-draft-tokens 1 --accepted-drafts 1 --batch-sizes 1
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

import numpy as np

from resin.engine import Engine
from resin.engine.proposers import DraftModelProposer, MtpProposer, NgramProposer
from resin.engine.request import Request
from resin.engine.speculative import Proposer, Speculation
from resin.params import SamplingParams


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resin bench speculative", description=__doc__.split("\n")[0])
    p.add_argument("--speculative", choices=["ngram", "draft", "mtp"], required=True)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="model folder (or a default-model name)")
    src.add_argument("--random-weights", action="store_true", help="cuda runner: a preset")
    p.add_argument("--model-config", default="llama-1b",
                   help="preset for --random-weights; cuda runner: NAME:FORMAT quantizes its "
                        "weights on the device (fp8-block, fp8-channel, mxfp4)")  # fmt: skip
    p.add_argument("--runner", choices=["torch", "cuda"], default="torch",
                   help="torch: the reference runner; cuda: resin_models_cuda")  # fmt: skip
    p.add_argument("--device", default="cpu")
    p.add_argument("--draft-model", help="draft model folder/name (--speculative draft)")
    p.add_argument("--num-draft-tokens", type=int, default=4)
    p.add_argument("--accepted-drafts", type=int, default=None,
                   help="bench only: force-accept the first K drafts of every row")  # fmt: skip
    p.add_argument("--batch-sizes", type=_ints, default=[1])
    p.add_argument("--input-len", type=int, default=256, help="random prompt length")
    p.add_argument("--prompt-text", default=None, help="a real prompt (needs a tokenizer)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--output", type=Path, help="append JSONL records here")
    return p.parse_args(argv)


class PaddedProposer:
    """Bench only: the proposer's drafts padded to the limit (with the last token), so a
    forced-acceptance run verifies exactly K drafts every step."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        out = self.inner.propose(requests, limits)
        padded = []
        for r, k, drafts in zip(requests, limits, out, strict=True):
            last = drafts[-1] if drafts else int(r.token_array(r.num_tokens)[r.num_tokens - 1])
            padded.append([*drafts[:k], *[last] * (k - len(drafts[:k]))])
        return padded


DRAFT = "(draft)"  # `_runner`'s name for the draft model


def _runner(args: argparse.Namespace, name: str | None, folder: Any) -> Any:
    mtp = args.speculative == "mtp" and name != DRAFT
    name = None if name == DRAFT else name
    if args.runner == "torch":
        from resin_model.presets import preset_hf
        from resin_models_torch.registry import load_runner as load_torch
        from resin_models_torch.registry import random_runner as random_torch

        if folder is None:
            runner = random_torch(preset_hf(name or args.model_config), device=args.device)
        else:
            runner = load_torch(folder, device=args.device)
        if not mtp:
            return runner
        from resin_models_torch.mtp import MtpRunner

        return MtpRunner(runner.model, num_drafts=args.num_draft_tokens, overlap=False)  # type: ignore[arg-type]
    from resin_model.presets import preset
    from resin_model.quant_checkpoint import check_format
    from resin_models_cuda.runner import RunnerOptions, load_runner, random_runner

    base, _, fmt = (name or args.model_config).partition(":")
    options = RunnerOptions(max_batch=max(args.batch_sizes),
                            max_context=args.input_len + args.output_len + 64,
                            mtp=mtp, max_draft_tokens=max(args.num_draft_tokens, 1))  # fmt: skip
    if folder is None:
        config = preset(base)
        quantize = check_format(fmt, config.model_type) if fmt else None
        return random_runner(config, options, args.device, quantize=quantize)
    return load_runner(str(folder), options, args.device)


def _folder(name: str | None) -> Any:
    if name is None:
        return None
    from resin_model.default_model import resolve_checkpoint

    return resolve_checkpoint(name)


def _prompts(args: argparse.Namespace, folder: Any, vocab: int, n: int) -> list[list[int]]:
    if args.prompt_text is not None:
        from resin.tokenizer import Tokenizer

        if folder is None:
            raise SystemExit("--prompt-text needs --checkpoint (its tokenizer)")
        ids = Tokenizer.from_dir(folder).encode(args.prompt_text)
        return [list(ids)] * n
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, size=args.input_len).tolist() for _ in range(n)]


def run_once(engine: Engine, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """One batch; decode timing from the step after the last prefill."""
    params = SamplingParams(max_output_tokens=output_len, temperature=0.0, ignore_stop_tokens=True)
    before = engine.metrics
    assert before is not None
    handles = [engine.submit(p, params) for p in prompts]
    while engine.num_waiting or not all(h.output_token_ids for h in handles):  # prefill, untimed
        engine.step()
    first = sum(len(h.output_token_ids) for h in handles)
    steps: list[float] = []
    t0 = time.perf_counter()
    while engine.has_work():
        s = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    after = engine.metrics
    assert after is not None
    tokens = sum(len(h.output_token_ids) for h in handles) - first
    return {
        "decode_tok_s": tokens / wall if wall > 0 else 0.0,
        "decode_tokens": tokens,
        "steps": len(steps),
        "step_ms_median": statistics.median(steps) * 1e3 if steps else 0.0,
        "draft_tokens": after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens,
        "accepted_tokens": (
            after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
        ),
        "outputs": [h.take_result() for h in handles],
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    folder = _folder(args.checkpoint)
    runner = _runner(args, args.model_config if args.random_weights else None, folder)
    if args.accepted_drafts is not None and not hasattr(runner, "accept_first"):
        print(
            "resin bench speculative: this runner has no bench-only forced acceptance",
            file=sys.stderr,
        )
        return 2
    proposer: Proposer = NgramProposer()
    if args.speculative == "draft":
        if args.draft_model is None:
            print(
                "resin bench speculative: --speculative draft needs --draft-model", file=sys.stderr
            )
            return 2
        draft_folder = _folder(args.draft_model)
        draft = _runner(args, DRAFT, draft_folder)
        proposer = DraftModelProposer(draft, context_length=args.input_len + args.output_len + 64)
    if args.speculative == "mtp":
        if not hasattr(runner, "drafts"):
            print("resin bench speculative: --speculative mtp needs a model with MTP layers",
                  file=sys.stderr)  # fmt: skip
            return 2
        proposer = MtpProposer()
    if args.accepted_drafts is not None:
        proposer = PaddedProposer(proposer)
    k = args.num_draft_tokens if args.accepted_drafts is None else args.accepted_drafts
    vocab = int(runner.runner_config.vocab_size or 32000)
    # One engine (a runner is bound once): its speculator is switched off for the plain runs.
    context = args.input_len + args.output_len + 64
    if args.prompt_text is not None:
        context += len(_prompts(args, folder, vocab, 1)[0])
    engine = Engine(runner, context_length=context, max_sequences=max(args.batch_sizes),
                    speculation=Speculation(proposer, k))  # fmt: skip
    speculation = engine.speculation
    records = []
    for b in args.batch_sizes:
        prompts = _prompts(args, folder, vocab, b)
        engine.speculation = None
        drafting = getattr(runner, "mtp_enabled", None)
        if drafting is not None:
            runner.mtp_enabled = False  # plain decode pays no MTP layer
        plain = run_once(engine, prompts, args.output_len)
        if drafting is not None:
            runner.mtp_enabled = drafting
        engine.speculation = speculation
        if args.accepted_drafts is not None:
            runner.accept_first = args.accepted_drafts
        try:
            spec = run_once(engine, prompts, args.output_len)
        finally:
            if args.accepted_drafts is not None:
                runner.accept_first = None
        record = _record(args, b, k, plain, spec)
        records.append(record)
        print(_line(record))
    engine.close()
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    return 0


def _record(
    args: argparse.Namespace, b: int, k: int, plain: dict[str, Any], spec: dict[str, Any]
) -> dict[str, Any]:
    forced = args.accepted_drafts is not None
    return {
        "bench": "speculative", "time": time.time(), "proposer": args.speculative,
        "runner": args.runner, "model": args.checkpoint or args.model_config, "batch": b,
        "num_draft_tokens": k, "accepted_drafts": args.accepted_drafts,
        "plain_tok_s": plain["decode_tok_s"], "spec_tok_s": spec["decode_tok_s"],
        "speedup": spec["decode_tok_s"] / max(plain["decode_tok_s"], 1e-9),
        "plain_steps": plain["steps"], "spec_steps": spec["steps"],
        "plain_step_ms": plain["step_ms_median"], "spec_step_ms": spec["step_ms_median"],
        "verify_step_cost": spec["step_ms_median"] / max(plain["step_ms_median"], 1e-9),
        "draft_tokens": spec["draft_tokens"], "accepted_tokens": spec["accepted_tokens"],
        "identical": None if forced else spec["outputs"] == plain["outputs"],
    }  # fmt: skip


def _line(r: dict[str, Any]) -> str:
    return (
        f"B={r['batch']:<4} k={r['num_draft_tokens']} plain {r['plain_tok_s']:8.1f} tok/s "
        f"({r['plain_steps']} steps, {r['plain_step_ms']:.2f} ms)  spec {r['spec_tok_s']:8.1f} "
        f"tok/s ({r['spec_steps']} steps, {r['spec_step_ms']:.2f} ms)  x{r['speedup']:.2f}  "
        f"verify/plain step x{r['verify_step_cost']:.2f}  accepted {r['accepted_tokens']}/"
        f"{r['draft_tokens']}  identical={r['identical']}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
