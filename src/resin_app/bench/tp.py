"""`resin bench tp --tensor-parallel N`: the reference runner's TP / EP beside TP=1 in one run.

The leader (rank 0) drives a real Engine over a `DistributedRunner` (random weights of a
preset shape, the same on every rank), measures prefill and decode throughput per batch
size, closes the group, then measures the unsharded model alone on its own device. Prints a
table and appends JSONL rows (one per parallel size and batch) to --output. Without torchrun
the leader starts its own workers (`spawn_local`); under torchrun every rank runs this.

    resin bench tp --tensor-parallel 2 --preset llama-8b --batch 1 64
    resin bench tp --tensor-parallel 2 --preset tiny --device cpu --dtype float32   # smoke test
    torchrun --nproc-per-node 2 -m resin_app.bench.tp --preset qwen3-30b-a3b --expert-parallel

`--runner torch` (the default) measures the plain-PyTorch reference runner (gathered paged
attention, per-expert loops); `--runner cuda` the fast runner's shards
(`resin_models_cuda.parallel`; CUDA graphs over NCCL, random weights made FP8 / MXFP4 with
`--quantize`), with `--preset` also any `resin_model.presets` name:

    resin bench tp --runner cuda --tensor-parallel 2 --preset gpt-oss-120b --quantize mxfp4
    resin bench tp --runner cuda --tensor-parallel 2 --preset qwen3-30b-a3b --expert-parallel
    resin bench tp --runner cuda --tensor-parallel 8 --preset deepseek-v4-flash --expert-parallel \
        --replicated-attention --quantize mxfp4 --skip-single

`--replicated-attention` cuts only the experts (DeepSeek-V4 and GLM-5.3 have no split plan for
their attention): every rank runs every token through whole attention, one all-reduce per MoE
layer.

Both sides of a `--runner cuda` run step one plan at a time (no overlap: a `DistributedRunner`
does not pipeline), so the ratio compares like with like.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from resin import Engine, SamplingParams, TokensEvent
from resin.backend.distributed import DistributedRunner
from resin.backend.launch import spawn_local, start_tensor_parallel
from resin.backend.topology import ProcessGroups, shutdown
from resin.protocols import Runner
from resin_app.worker import fast_runner, worker_command
from resin_model.presets import PRESETS as MODEL_PRESETS
from resin_models_torch.parallel import ParallelStyle, shard_model
from resin_models_torch.registry import random_runner
from resin_models_torch.runner import TorchRunner

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "model_type": "llama",
        "vocab_size": 1000,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
    },
    "tiny-moe": {
        "model_type": "qwen3_moe",
        "vocab_size": 1000,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "moe_intermediate_size": 64,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
    },
    "llama-8b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_ROPE,
    },
    "llama-70b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "num_hidden_layers": 80,
        "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_ROPE,
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 48,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "rope_theta": 1000000.0,
    },
}
PAGE_SIZE = 16


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resin bench tp", description=__doc__.splitlines()[0])
    p.add_argument(
        "--tensor-parallel",
        type=int,
        default=None,
        help="ranks (default: torchrun's world; without torchrun the workers are started here)",
    )
    p.add_argument("--runner", choices=["torch", "cuda"], default="torch")
    p.add_argument(
        "--preset", choices=sorted(PRESETS.keys() | MODEL_PRESETS.keys()), default="tiny"
    )
    p.add_argument(
        "--quantize",
        choices=["fp8-block", "fp8-channel", "mxfp4"],
        default=None,
        help="--runner cuda: random weights made FP8 / MXFP4 on the device as drawn",
    )
    p.add_argument("--layers", type=int, default=None, help="override the layer count")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--context", type=int, default=1024, help="prompt tokens per sequence")
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK if present")
    p.add_argument("--expert-parallel", action="store_true", help="split MoE experts")
    p.add_argument(
        "--replicated-attention",
        action="store_true",
        help="--runner cuda: cut only the experts; attention, dense MLPs and the vocabulary "
        "whole on every rank (DeepSeek-V4, GLM-5.3 need it)",
    )
    p.add_argument("--skip-single", action="store_true", help="no TP=1 run (model too big)")
    p.add_argument("--timeout", type=float, default=600.0, help="collective timeout, seconds")
    p.add_argument("--output", type=Path, default=Path("bench/tp.jsonl"))
    return p.parse_args(argv)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    config = dict(PRESETS.get(args.preset) or MODEL_PRESETS[args.preset])
    if args.layers is not None:
        config["num_hidden_layers"] = args.layers
    return config


def _num_pages(args: argparse.Namespace) -> int:
    per_seq: int = math.ceil((args.context + args.decode_steps + 1) / PAGE_SIZE)
    batch: int = max(args.batch)
    return batch * per_seq + 8


def _build(args: argparse.Namespace, groups: ProcessGroups | None, device: torch.device) -> Runner:
    dtype = getattr(torch, args.dtype)
    if args.runner == "cuda":
        return _fast(args, groups, device, dtype)
    model = random_runner(_config(args), 0, device, dtype).model
    if groups is not None:
        style = ParallelStyle(experts="expert" if args.expert_parallel else "tensor")
        model = shard_model(model, groups.model, style)
    return TorchRunner(model, page_size=PAGE_SIZE, num_pages=_num_pages(args))


def _fast(
    args: argparse.Namespace, groups: ProcessGroups | None, device: torch.device, dtype: Any
) -> Runner:
    """The fast runner: this rank's shard, or (no groups) the whole model, on the same
    random weights (`fast_runner` draws them as `random_runner` does)."""
    from resin_model.hf_config import parse_config
    from resin_models_cuda import RunnerOptions, random_runner

    options = RunnerOptions(
        page_size=PAGE_SIZE,
        num_pages=_num_pages(args),
        max_batch=max(args.batch),
        max_context=args.context + args.decode_steps + 8,
        overlap=False,
    )
    if groups is None:
        config = parse_config(_config(args))
        return random_runner(config, options, str(device), dtype, 0, args.quantize)
    return fast_runner(
        groups,
        config=_config(args),
        expert_parallel=args.expert_parallel,
        tensor=not args.replicated_attention,
        dtype=dtype,
        quantize=args.quantize,
        options=options,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(runner: Runner, args: argparse.Namespace) -> list[dict[str, float]]:
    """Per batch size (one Engine; it closes the runner at the end): prefill `batch` prompts
    of `--context` tokens, then time `--decode-steps` decode steps."""
    vocab = _config(args)["vocab_size"]
    params = SamplingParams(max_output_tokens=args.decode_steps + 1, temperature=0.0)
    chunk = max(args.context, 8192)
    rows = []
    with Engine(
        runner,
        context_length=args.context + args.decode_steps + 8,
        prefix_cache=False,
        max_sequences=max(args.batch),
        max_batch_tokens=chunk,
        prefill_chunk_tokens=chunk,
    ) as engine:
        for batch in args.batch:
            rng = np.random.default_rng(batch)
            for _ in range(batch):
                engine.submit(rng.integers(0, vocab, args.context).tolist(), params)
            start, first_tokens = time.perf_counter(), 0
            while first_tokens < batch:
                first_tokens += sum(isinstance(e, TokensEvent) for e in engine.step())
            prefill_s = time.perf_counter() - start
            start, decoded = time.perf_counter(), 0
            while engine.has_work():
                events = engine.step()
                decoded += sum(len(e.token_ids) for e in events if isinstance(e, TokensEvent))
            decode_s = time.perf_counter() - start
            rows.append(
                {
                    "batch": batch,
                    "prefill_tok_s": batch * args.context / prefill_s,
                    "decode_tok_s": decoded / decode_s,
                    "decode_step_ms": 1000 * decode_s / max(args.decode_steps, 1),
                }
            )
    return rows


def _report(rows: list[dict[str, Any]], output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"{'tp':>3} {'batch':>5} {'prefill tok/s':>14} {'decode tok/s':>13} {'step ms':>8}")
    for r in rows:
        print(
            f"{r['tp']:>3} {r['batch']:>5} {r['prefill_tok_s']:>14.1f} "
            f"{r['decode_tok_s']:>13.1f} {r['decode_step_ms']:>8.2f}"
        )
    for r in rows:
        base = [s for s in rows if s["tp"] == 1 and s["batch"] == r["batch"]]
        if r["tp"] > 1 and base:
            ratio = r["decode_tok_s"] / base[0]["decode_tok_s"]
            print(f"batch {r['batch']}: decode TP={r['tp']} / TP=1 = {ratio:.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(list(sys.argv[1:] if argv is None else argv))
    for flag, given in (("--quantize", args.quantize), ("--replicated-attention",
                        args.replicated_attention)):  # fmt: skip
        if given and args.runner != "cuda":
            print(f"resin bench tp: {flag} needs --runner cuda", file=sys.stderr)
            return 2
    holder: dict[str, torch.device] = {}

    def build(groups: ProcessGroups) -> Runner:
        holder["device"] = groups.device
        return _build(args, groups, groups.device)

    runner = _start(args, build)
    if runner is None:  # a worker: the leader is done
        shutdown()
        return 0
    device, tp = holder["device"], args.tensor_parallel or int(os.environ.get("WORLD_SIZE", "1"))
    common = {"preset": args.preset, "context": args.context, "dtype": args.dtype}
    common |= {"runner": args.runner, "quantize": args.quantize}
    common |= {"expert_parallel": args.expert_parallel, "device": str(device)}
    common |= {"replicated_attention": args.replicated_attention}
    rows = [{"tp": tp, **common, **row} for row in measure(runner, args)]
    shutdown()
    del runner  # the sharded model goes before the whole one is built
    gc.collect()
    if tp > 1 and not args.skip_single:
        _sync(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        single = _build(args, None, device)
        common["expert_parallel"] = common["replicated_attention"] = False
        rows += [{"tp": 1, **common, **row} for row in measure(single, args)]
    _report(rows, args.output)
    return 0


def _start(
    args: argparse.Namespace, build: Callable[[ProcessGroups], Runner]
) -> DistributedRunner | None:
    """Under torchrun: join it. Otherwise: start `--tensor-parallel` - 1 `resin worker`s that
    build the same random weights (a config file, seed 0) and lead them."""
    timeout = timedelta(seconds=args.timeout)
    if "WORLD_SIZE" in os.environ or (args.tensor_parallel or 1) == 1:
        return start_tensor_parallel(
            build, tensor_parallel=args.tensor_parallel, device=args.device, timeout=timeout
        )
    config = Path(tempfile.mkdtemp(prefix="resin-bench-")) / "config.json"
    config.write_text(json.dumps(_config(args)))
    worker_args = ["--config-json", str(config), "--seed", "0", "--dtype", args.dtype]
    worker_args += ["--page-size", str(PAGE_SIZE)] + (["--expert-parallel"] * args.expert_parallel)
    if args.runner == "cuda":
        worker_args += ["--runner", "cuda", "--max-sequences", str(max(args.batch))]
        worker_args += ["--context-length", str(args.context + args.decode_steps + 8)]
        worker_args += ["--quantize", args.quantize] if args.quantize else []
        worker_args += ["--replicated-attention"] * args.replicated_attention
    if args.device is not None and torch.device(args.device).type != "cuda":
        worker_args += ["--device", args.device]
    job = spawn_local(
        build,
        worker_command(*worker_args),
        tensor_parallel=args.tensor_parallel,
        device=args.device,
        timeout=timeout,
    )
    return job.runner


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
