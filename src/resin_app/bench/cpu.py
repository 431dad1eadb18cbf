"""CPU tokens/s: Resin's reference runner (through the Engine) vs `transformers.generate`.

    resin bench cpu --output bench/cpu.jsonl
    resin bench cpu --batch-sizes 1 8 --prompt-tokens 64 \
        --new-tokens 64 --runs 3 --threads 2

Both sides run the same converted checkpoint (SmolLM2-135M-Instruct by default), float32, greedy,
exactly `--new-tokens` tokens per sequence (stop tokens ignored), the same prompts (distinct,
equal length, so transformers needs no padding). One warm-up run each, then `--runs` timed runs
alternating between the two (fair under a changing machine load); the table shows medians.
Throughput = batch * new tokens / wall time of the whole generation (prefill included); the
table also shows the time to the first token of the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from resin import Engine, SamplingParams, TokensEvent
from resin.tokenizer import Tokenizer
from resin_model.default_model import DEFAULT_MODEL_NAME, resolve_checkpoint

TEXT = (
    "The history of the printing press begins in the fifteenth century, when movable type "
    "changed how books were made, sold and read across Europe. Paris, Venice and Mainz became "
    "centres of a trade that spread literacy, science and new ideas about religion and politics. "
)


@dataclass(frozen=True)
class Result:
    impl: str
    batch: int
    prompt_tokens: int
    new_tokens: int
    runs: int
    threads: int
    median_s: float
    median_first_token_s: float
    tokens_per_s: float
    load_average: float
    """1-minute load average when the result was taken: on a shared machine, read it first."""


def make_prompts(tokenizer: Tokenizer, batch: int, length: int) -> list[list[int]]:
    """`batch` distinct prompts of exactly `length` ids (windows of a repeated text)."""
    ids = tokenizer.encode(TEXT * (1 + (length + batch) // 20))
    if len(ids) < length + batch:
        raise ValueError("prompt text too short for the requested prompt length")
    return [ids[i : i + length] for i in range(batch)]


def time_resin(engine: Engine, prompts: list[list[int]], new: int) -> tuple[float, float]:
    params = SamplingParams(max_output_tokens=new, temperature=0.0, ignore_stop_tokens=True)
    started = time.perf_counter()
    first = 0.0
    requests = [engine.submit(p, params) for p in prompts]
    while engine.has_work():
        events = engine.step()
        if not first and any(isinstance(e, TokensEvent) for e in events):
            first = time.perf_counter() - started
    elapsed = time.perf_counter() - started
    if any(len(r.take_result()) != new for r in requests):
        raise RuntimeError("resin generated the wrong number of tokens")
    return elapsed, first


def time_transformers(model: object, prompts: list[list[int]], new: int) -> tuple[float, float]:
    from transformers import StoppingCriteria, StoppingCriteriaList

    class FirstToken(StoppingCriteria):
        def __init__(self) -> None:
            self.at = 0.0

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: object) -> bool:
            if not self.at:
                self.at = time.perf_counter()
            return False

    ids = torch.tensor(prompts)
    mark = FirstToken()
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(  # type: ignore[attr-defined]
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            stopping_criteria=StoppingCriteriaList([mark]),
            pad_token_id=0,
        )
    elapsed = time.perf_counter() - started
    if out.shape[1] - ids.shape[1] != new:
        raise RuntimeError("transformers generated the wrong number of tokens")
    return elapsed, mark.at - started


def measure(
    runs: dict[str, Callable[[], tuple[float, float]]], args: argparse.Namespace, batch: int
) -> list[Result]:
    """Warm every implementation up, then alternate them run by run, so a load change on a
    shared machine hits both sides alike."""
    for run in runs.values():
        run()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(args.runs):
        for name, run in runs.items():
            times[name].append(run())
    return [_result(name, t, args, batch) for name, t in times.items()]


def _result(
    impl: str, times: list[tuple[float, float]], args: argparse.Namespace, batch: int
) -> Result:
    median = statistics.median(t for t, _ in times)
    return Result(
        impl=impl,
        batch=batch,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        runs=args.runs,
        threads=torch.get_num_threads(),
        median_s=round(median, 4),
        median_first_token_s=round(statistics.median(f for _, f in times), 4),
        tokens_per_s=round(batch * args.new_tokens / median, 2),
        load_average=round(os.getloadavg()[0], 2),
    )


def print_table(results: list[Result]) -> None:
    header = f"{'impl':<14}{'batch':>6}{'prompt':>8}{'new':>6}{'median s':>11}{'ttft s':>9}"
    print(header + f"{'tok/s':>10}")
    for r in results:
        print(
            f"{r.impl:<14}{r.batch:>6}{r.prompt_tokens:>8}{r.new_tokens:>6}"
            f"{r.median_s:>11.3f}{r.median_first_token_s:>9.3f}{r.tokens_per_s:>10.1f}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="resin bench cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME, help="name, folder or .gguf")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", type=Path, default=None, help="append JSONL results here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from resin_models_torch.registry import load_runner

    folder = resolve_checkpoint(args.model)
    tokenizer = Tokenizer.from_dir(folder)
    runner = load_runner(folder, device="cpu", dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()  # type: ignore[no-untyped-call]
    context = args.prompt_tokens + args.new_tokens + 16
    results: list[Result] = []
    with Engine(runner, context_length=context, prefix_cache=False) as engine:
        for batch in args.batch_sizes:
            prompts = make_prompts(tokenizer, batch, args.prompt_tokens)
            runs: dict[str, Callable[[], tuple[float, float]]] = {
                "resin": partial(time_resin, engine, prompts, args.new_tokens),
                "transformers": partial(time_transformers, reference, prompts, args.new_tokens),
            }
            results.extend(measure(runs, args, batch))
    print(f"model {folder.name}, float32, CPU, {torch.get_num_threads()} threads, ", end="")
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    print_table(results)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("a", encoding="utf-8") as out:
            for r in results:
                out.write(json.dumps({"model": folder.name, **asdict(r)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
