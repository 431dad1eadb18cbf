"""`resin bench`: prefill and decode sweeps of the Triton runner, with a transformers baseline.

    python scripts/bench.py --random-weights --model-config llama-8b \
        --context-lengths 1024,4096,8192 --batch-sizes 1,8,32,64,128,256 \
        --compare-hf --output bench/llama8b.jsonl --plot --trace-dir bench/traces

Prints a table, appends JSONL (one line per point plus an `env` line), writes PNG charts next
to the JSONL with `--plot`, and Chrome/Perfetto traces with `--trace-dir`. `main(argv)` is
what `resin bench` calls.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resin bench", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["local"], default="local",
                   help="local: run the Triton runner in this process")  # fmt: skip
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="Hugging Face checkpoint directory (safetensors)")
    src.add_argument("--random-weights", action="store_true", help="random weights of a preset")
    p.add_argument("--model-config", default="llama-8b",
                   help="preset: llama-8b, qwen3-8b, qwen3-30b-a3b, llama-1b, tiny")  # fmt: skip
    p.add_argument("--context-lengths", type=_ints, default=[1024, 4096, 8192],
                   help="prefill sweep: prompt lengths")  # fmt: skip
    p.add_argument("--batch-sizes", type=_ints, default=[1, 8, 32, 64, 128, 256],
                   help="decode sweep: batch sizes")  # fmt: skip
    p.add_argument("--decode-contexts", type=_ints, default=[1024],
                   help="decode sweep: context length of every row")  # fmt: skip
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--compare-hf", action="store_true",
                   help="also time Hugging Face transformers on the same weights")  # fmt: skip
    p.add_argument("--hf-max-batch", type=int, default=64,
                   help="largest decode batch for the transformers baseline")  # fmt: skip
    p.add_argument("--validate", action="store_true",
                   help="first check greedy continuations and logits vs transformers")  # fmt: skip
    p.add_argument("--validate-only", action="store_true", help="stop after --validate")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="weights and KV dtype (fp32: for exact correctness checks)")  # fmt: skip
    p.add_argument("--output", type=Path, help="append JSONL records here")
    p.add_argument("--plot", action="store_true", help="PNG charts next to --output")
    p.add_argument("--trace-dir", type=Path, help="write torch-profiler Chrome traces here")
    p.add_argument("--device", default="cuda", help="cuda (cpu: interpreter smoke test only)")
    return p.parse_args(argv)


def _progress(items: list, desc: str):  # type: ignore[no-untyped-def]
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, file=sys.stderr)
    except ImportError:
        return items


def _trace(path: Path, fn) -> None:  # type: ignore[no-untyped-def]
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    print(f"== {path.name}: top device kernels")
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from resin.protocols import CacheLayout
    from resin_models_cuda.bench_report import plot, print_table, write_jsonl
    from resin_models_cuda.benchmark import Ceilings, HfBench, RunnerBench, measure_ceilings
    from resin_models_cuda.config import ModelConfig, preset
    from resin_models_cuda.plans import PagedPlanner
    from resin_models_cuda.runner import CudaRunner, RunnerOptions
    from resin_models_cuda.weights import load_checkpoint, random_weights

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("resin bench: no CUDA device (use --device cpu for an interpreter smoke test)")
        return 2
    dtype = torch.bfloat16 if device.type == "cuda" and args.dtype == "bf16" else torch.float32
    if args.checkpoint:
        config = ModelConfig.from_hf(
            json.loads((Path(args.checkpoint) / "config.json").read_text())
        )
        name = Path(args.checkpoint).name
    else:
        config, name = preset(args.model_config), args.model_config
    t0 = time.perf_counter()
    if args.checkpoint:
        weights = load_checkpoint(args.checkpoint, config, device, dtype)
    else:
        weights = random_weights(config, device, dtype, seed=0)
    load_s = time.perf_counter() - t0
    ceilings = measure_ceilings(device) if device.type == "cuda" else Ceilings(1e11, 1e12)
    steps = args.warmup + args.iters
    max_ctx = max([*args.context_lengths, *(c + steps + 1 for c in args.decode_contexts)])
    options = RunnerOptions(page_size=args.page_size, max_batch=max(args.batch_sizes),
                            max_context=max_ctx, cuda_graphs=not args.no_cuda_graphs)  # fmt: skip
    if args.validate:
        _validate(args, config, weights, options, name)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.validate_only:
            return 0
    runner = CudaRunner(config, weights, options)
    decode_pages = -(-(max(args.decode_contexts) + steps + 1) // args.page_size)
    prefill_pages = -(-max(args.context_lengths) // args.page_size)
    num_pages = max(args.batch_sizes) * decode_pages + prefill_pages + 8
    rc = runner.runner_config
    t0 = time.perf_counter()
    runner.bind(CacheLayout(num_pages, args.page_size, rc.page_bytes, rc.cache_groups))
    capture_s = time.perf_counter() - t0
    assert runner.kv is not None
    runner.kv.normal_()
    bench = RunnerBench(runner, PagedPlanner(num_pages, args.page_size), name, ceilings)
    records = []
    for ctx in _progress(args.context_lengths, "prefill"):
        records.append(bench.prefill(ctx, args.warmup, args.iters))
    for ctx in args.decode_contexts:
        for b in _progress(args.batch_sizes, f"decode ctx {ctx}"):
            records.append(bench.decode(b, ctx, args.warmup, args.iters))
    if args.trace_dir:
        ctx = min(args.context_lengths, key=lambda c: abs(c - 4096))
        _trace(args.trace_dir / f"prefill_{ctx}.json", lambda: bench.prefill(ctx, 0, 1))
        b = min(args.batch_sizes, key=lambda x: abs(x - 64))
        _trace(args.trace_dir / f"decode_b{b}.json",
               lambda: bench.decode(b, args.decode_contexts[0], 0, 3))  # fmt: skip
    runner.close()
    del runner
    if args.compare_hf:
        from resin_models_cuda.hf_baseline import build_hf_model

        hf = HfBench(build_hf_model(config, weights), config, name, ceilings, weights.nbytes())
        for ctx in _progress(args.context_lengths, "hf prefill"):
            records.append(hf.prefill(ctx, 1, max(3, args.iters // 2)))
        for ctx in args.decode_contexts:
            for b in _progress(
                [b for b in args.batch_sizes if b <= args.hf_max_batch], "hf decode"
            ):
                records.append(hf.decode(b, ctx, 2, max(3, args.iters // 2)))
    print_table(records)
    env = {
        "kind": "env", "model": name, "argv": list(argv if argv is not None else sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine(),
        "torch": torch.__version__, "triton": _triton_version(), "load_s": load_s,
        "capture_s": capture_s, "ceiling_bandwidth_tb_s": ceilings.bandwidth / 1e12,
        "ceiling_tflops": ceilings.flops / 1e12, "weight_bytes": weights.nbytes(),
        "cuda_graphs": not args.no_cuda_graphs,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    print(json.dumps(env))
    if args.output:
        write_jsonl(args.output, [env, *(r.to_json() for r in records)])
        if args.plot:
            for path in plot(records, args.output.parent, name):
                print(f"wrote {path}")
    return 0


def _validate(args, config, weights, options, name: str) -> None:  # type: ignore[no-untyped-def]
    """Twice: on weights initialized like GPT-2 (residual-scaled, a well-conditioned deep
    model where greedy agreement is meaningful), and on the benchmark's plain weights."""
    from dataclasses import replace

    from resin_models_cuda.bench_report import write_jsonl
    from resin_models_cuda.validate import validate
    from resin_models_cuda.weights import random_weights

    device, dtype = weights.embed.device, weights.embed.dtype
    scaled = random_weights(config, device, dtype, seed=1, residual_scale=True, embed_std=50)
    for init, w in (("residual-scaled", scaled), ("plain", weights)):
        for r in validate(config, w, replace(options, max_batch=48), progress=print):
            print(
                f"validate [{init}] {r.name}: {r.agree}/{r.prompts} agree for {r.new_tokens} "
                f"tokens (positions {r.position_agreement:.3f}, transformers same dtype "
                f"{r.baseline_position_agreement:.3f}); logits max|d| "
                f"{r.logit_max_abs_diff:.4f} mean {r.logit_mean_abs_diff:.4f} (transformers "
                f"{r.baseline_logit_max_abs_diff:.4f} / {r.baseline_logit_mean_abs_diff:.4f}; "
                f"ref max {r.logit_ref_max_abs:.2f})"
            )
            if args.output:
                row = {"kind": "validate", "init": init, "model": name, **_asdict(r)}
                write_jsonl(args.output, [row])


def _asdict(obj: object) -> dict[str, object]:
    from dataclasses import asdict, is_dataclass

    assert is_dataclass(obj) and not isinstance(obj, type)
    return asdict(obj)


def _triton_version() -> str:
    import triton

    return str(triton.__version__)


if __name__ == "__main__":
    raise SystemExit(main())
