"""`resin bench runner`: prefill and decode sweeps of the Triton runner, models side by side.

    resin bench runner --random-weights --model-config llama-8b,qwen3-30b-a3b,gpt-oss-20b \
        --context-lengths 1024,4096 --batch-sizes 1,64,256 --output bench/gpu.jsonl
    resin bench runner --random-weights --model-config llama-8b,llama-8b:fp8-channel ...

Models run one after the other in one process (one set of in-run ceilings); prints one table,
appends JSONL (one line per point plus an `env` line per model), writes PNG charts next to the
JSONL with `--plot`, and Chrome/Perfetto traces with `--trace-dir`. `main(argv)` is what
`resin bench runner` calls.

`--kernels` adds, per decode batch size at the first decode context, a table of the device
kernels of one decode step: each kernel's launches, time, bytes moved and fraction of the
in-run copy bandwidth, so every kernel's distance to the limit shows (`kernel_census.py`
records, `kernel_table.py` tabulates; JSONL rows of kind "kernel" and one "kernel_step"). The
steps run eagerly (the captured graphs' bodies: same kernels, launched from the host, since
the profiler links kernels to the ops that launched them); bytes are the tensor bytes each
launch touches, an estimate, not DRAM counters (`ncu`'s dram__bytes would measure them).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from resin_app.bench.runner_bench import BenchRecord, Ceilings, RunnerBench


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resin bench runner", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["local"], default="local",
                   help="local: run the Triton runner in this process")  # fmt: skip
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="Hugging Face checkpoint directory (safetensors)")
    src.add_argument("--random-weights", action="store_true", help="random weights of a preset")
    p.add_argument("--model-config", default="llama-8b",
                   help="comma-separated presets: llama-8b, qwen3-8b, qwen3-30b-a3b, "
                        "gpt-oss-20b, gemma3-12b, olmo2-7b, llama-1b, deepseek-v2-lite, "
                        "qwen3.5-35b-a3b, glm-5.3-flash-8l, deepseek-v4-flash-8l, "
                        "tiny-<arch>; PRESET:FORMAT quantizes the random "
                        "weights on the device (fp8-block, fp8-channel, mxfp4)")  # fmt: skip
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
    p.add_argument("--moe-gemv-max-pairs", type=int, default=64,
                   help="MoE: token-expert pairs up to which the expert GEMV runs")  # fmt: skip
    p.add_argument("--gemv-tiles", type=Path,
                   help="tuned GEMV tiles, JSONL (resin bench tune-moe --graph)")  # fmt: skip
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="weights and KV dtype")  # fmt: skip
    p.add_argument("--output", type=Path, help="append JSONL records here")
    p.add_argument("--plot", action="store_true", help="PNG charts next to --output")
    p.add_argument("--trace-dir", type=Path, help="write torch-profiler Chrome traces here")
    p.add_argument("--trace-batch", type=int, default=64,
                   help="trace the decode batch size nearest this")  # fmt: skip
    p.add_argument("--kernels", action="store_true",
                   help="per decode batch size (first decode context): a table of one decode "
                        "step's device kernels (time, bytes moved, fraction of the in-run copy "
                        "bandwidth), eager steps under the torch profiler; bytes are tensor "
                        "bytes touched (an estimate); JSONL rows of kind kernel")  # fmt: skip
    p.add_argument("--kernel-rows", type=int, default=30,
                   help="--kernels: the longest kernels shown, the rest as other")  # fmt: skip
    p.add_argument("--kernel-steps", type=int, default=3,
                   help="--kernels: eager decode steps profiled (reported per step)")  # fmt: skip
    p.add_argument("--variants", type=_variants, default=[()],
                   help="comma-separated launch variants, each model run once per variant in "
                        "this process: base, or a +-joined set of pdl (programmatic dependent "
                        "launch, sm_90+), router (MoE router linear + top-k in one kernel), "
                        "varlen (short prefills on the varlen kernels, not in the fixed-shape "
                        "graphs); rows "
                        "named MODEL+VARIANT, and each against base as a tok/s ratio at the end "
                        "(e.g. base,pdl,router,pdl+router)")  # fmt: skip
    p.add_argument("--device", default="cuda", help="cuda (cpu: interpreter smoke test only)")
    return p.parse_args(argv)


def _progress(items: list[int], desc: str) -> Iterable[int]:
    try:
        from tqdm import tqdm

        progress: Iterable[int] = tqdm(items, desc=desc, file=sys.stderr)
        return progress
    except ImportError:
        return items


def _trace(path: Path, fn: Callable[[], object]) -> None:
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
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=28, max_name_column_width=70)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from resin_app.bench.report import plot, print_table, write_jsonl
    from resin_app.bench.runner_bench import Ceilings, measure_ceilings

    device = torch.device(args.device)
    if args.gemv_tiles:
        from resin_models_cuda.kernels.moe_gemv import load_tiles

        print(f"loaded {load_tiles(str(args.gemv_tiles))} tuned GEMV tiles")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("resin bench runner: no CUDA device (use --device cpu for an interpreter smoke test)")
        return 2
    dtype = torch.bfloat16 if device.type == "cuda" and args.dtype == "bf16" else torch.float32
    ceilings = measure_ceilings(device) if device.type == "cuda" else Ceilings(1e11, 1e12)
    names = [Path(args.checkpoint).name] if args.checkpoint else args.model_config.split(",")
    records, envs = [], []
    for name, variant in ((n, v) for n in names for v in args.variants):
        with launch_variant(variant):
            model_records, env, kernel_rows = _bench_model(
                args, name, device, dtype, ceilings, variant
            )
        records += model_records
        envs.append(env)
        print(json.dumps(env))
        if args.output:
            write_jsonl(args.output, [env, *(r.to_json() for r in model_records), *kernel_rows])
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table(records)
    if len(args.variants) > 1:
        print(variant_ratios(records))
    if args.output and args.plot:
        for name in names:
            for path in plot([r for r in records if r.model == name], args.output.parent, name):
                print(f"wrote {path}")
    return 0


def _bench_model(
    args: argparse.Namespace,
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    ceilings: Ceilings,
    variant: tuple[str, ...] = (),
) -> tuple[list[BenchRecord], dict[str, Any], list[dict[str, Any]]]:
    """The model's prefill and decode records, its `env` line and its `--kernels` rows; a
    `variant` (`launch_variant`, entered by the caller) names the records `name+variant`."""
    pdl = "pdl" in variant
    import torch

    from resin.protocols import CacheLayout
    from resin_app.bench.plans import PagedPlanner, group_pages
    from resin_app.bench.runner_bench import RunnerBench
    from resin_model.presets import checkpoint_bytes, preset
    from resin_model.quant_checkpoint import check_format
    from resin_models_cuda.runner import RunnerOptions, load_runner, random_runner

    # Tokens a decode row grows by: the timed steps, or a census's warm-up and two passes.
    steps = max(args.warmup + args.iters, 1 + 2 * args.kernel_steps if args.kernels else 0)
    max_ctx = max([*args.context_lengths, *(c + steps + 1 for c in args.decode_contexts)])
    # Plain steps only: no draft room, so `bind` captures no verify graphs (they would only
    # lengthen the capture; `resin bench speculative` measures verification).
    options = RunnerOptions(page_size=args.page_size, max_batch=max(args.batch_sizes),
                            max_context=max_ctx, cuda_graphs=not args.no_cuda_graphs,
                            moe_gemv_max_pairs=args.moe_gemv_max_pairs, pdl=pdl,
                            max_draft_tokens=0)  # fmt: skip
    t0 = time.perf_counter()
    if args.checkpoint:
        runner = load_runner(args.checkpoint, options, str(device), dtype)
    else:
        base, _, fmt = name.partition(":")
        quantize = check_format(fmt, preset(base).model_type) if fmt else None
        runner = random_runner(preset(base), options, str(device), dtype, quantize=quantize)
    load_s = time.perf_counter() - t0
    held, stored = runner.model.nbytes(), checkpoint_bytes(runner.config, dtype.itemsize)
    print(f"{name}: weights {held / 1e9:.2f} GB on the device, {stored / 1e9:.2f} GB as stored "
          f"({held / stored:.3f}x), built in {load_s:.1f} s")  # fmt: skip
    rc = runner.runner_config
    # Each token group: what the largest decode batch and the longest prompt hold in it (a
    # Window group only its window's pages, `group_pages`).
    decode_tokens = max(args.decode_contexts) + steps + 1
    sizes = group_pages(rc.cache_groups, args.page_size, max(args.batch_sizes), decode_tokens,
                        max(args.context_lengths))  # fmt: skip
    num_pages = sum(sizes)
    # Each State group: one checkpoint page per row of the largest batch.
    state_groups = sum(g.state_region for g in rc.cache_groups)
    states = state_groups * max(args.batch_sizes)
    layout = CacheLayout(num_pages, args.page_size, rc.page_bytes, rc.cache_groups, states,
                         rc.state_page_bytes)  # fmt: skip
    t0 = time.perf_counter()
    runner.bind(layout)
    capture_s = time.perf_counter() - t0
    assert runner.kv is not None
    runner.kv.normal_()
    planner = PagedPlanner(num_pages, args.page_size, specs=rc.cache_groups,
                           max_rows=max(args.batch_sizes), group_pages=sizes)  # fmt: skip
    if pdl and not runner.pdl:
        raise SystemExit(f"{name}: the pdl variant needs a CUDA device of sm_90 or later")
    bench = RunnerBench(runner, planner, "+".join([name, *variant]), ceilings)
    records = []
    for ctx in _progress(args.context_lengths, f"{name} prefill"):
        records.append(bench.prefill(ctx, args.warmup, args.iters))
    for ctx in args.decode_contexts:
        for b in _progress(args.batch_sizes, f"{name} decode ctx {ctx}"):
            records.append(bench.decode(b, ctx, args.warmup, args.iters))
    if args.trace_dir:
        ctx = min(args.context_lengths, key=lambda c: abs(c - 4096))
        _trace(args.trace_dir / f"{name}_prefill_{ctx}.json", lambda: bench.prefill(ctx, 0, 1))
        b = min(args.batch_sizes, key=lambda x: abs(x - args.trace_batch))
        _trace(args.trace_dir / f"{name}_decode_b{b}.json",
               lambda: bench.decode(b, args.decode_contexts[0], 0, 3))  # fmt: skip
    kernel_rows = _kernel_tables(args, bench, records, ceilings) if args.kernels else []
    env = {
        "kind": "env", "model": name, "argv": list(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine(),
        "torch": torch.__version__, "triton": _triton_version(), "load_s": load_s,
        "capture_s": capture_s, "ceiling_bandwidth_tb_s": ceilings.bandwidth / 1e12,
        "ceiling_tflops": ceilings.flops / 1e12, "weight_bytes": held,
        "stored_weight_bytes": stored,
        "cuda_graphs": not args.no_cuda_graphs, "moe_gemv_max_pairs": args.moe_gemv_max_pairs,
        "variant": "+".join(variant) or "base",
        "kv_bytes_per_token": rc.page_bytes // args.page_size,
        "llama_kv_bytes_per_token": 2 * runner.config.hidden_size * runner.config.num_layers
                                    * runner.dtype.itemsize,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    runner.close()
    del runner
    return records, env, kernel_rows


VARIANTS = ("pdl", "router", "varlen")


def _variants(text: str) -> list[tuple[str, ...]]:
    out = []
    for spec in text.split(","):
        parts = () if spec == "base" else tuple(spec.split("+"))
        unknown = [p for p in parts if p not in VARIANTS]
        if unknown or len(set(parts)) < len(parts):
            raise argparse.ArgumentTypeError(
                f"{spec!r}: a variant is base or a +-joined set of {', '.join(VARIANTS)}"
            )
        out.append(tuple(sorted(parts, key=VARIANTS.index)))
    return out


@contextmanager
def launch_variant(variant: tuple[str, ...]) -> Iterator[None]:
    """The class-wide switches of a variant on while inside (`pdl` is a runner option,
    `_bench_model` reads it from the variant)."""
    from resin_models_cuda.layers.moe import MoE
    from resin_models_cuda.models import FastModel

    saved = MoE.fused_router, FastModel.graph_prefill
    MoE.fused_router = "router" in variant
    if "varlen" in variant:  # short prefills on the varlen kernels, not in graphs
        FastModel.graph_prefill = False
    try:
        yield
    finally:
        MoE.fused_router, FastModel.graph_prefill = saved


def variant_ratios(records: list[BenchRecord]) -> str:
    """Several `--variants`: each variant's decode and prefill rows against base's."""
    by_key = {(r.model, r.kind, r.batch, r.context): r for r in records}
    lines = ["variant / base (tok/s ratio):"]
    for r in records:
        model, _, variant = r.model.partition("+")
        base = by_key.get((model, r.kind, r.batch, r.context))
        if variant and base is not None:
            lines.append(f"  {r.model} {r.kind} batch {r.batch} context {r.context}: "
                         f"{base.tok_s:,.0f} -> {r.tok_s:,.0f} tok/s "
                         f"({r.tok_s / base.tok_s:.3f}x)")  # fmt: skip
    return "\n".join(lines)


def _kernel_tables(
    args: argparse.Namespace, bench: RunnerBench, records: list[BenchRecord], ceilings: Ceilings
) -> list[dict[str, Any]]:
    """`--kernels`: the census of each decode batch size at the first decode context, printed
    and returned as JSONL rows; a census that fails says so and the timed rows stand."""
    from resin_app.bench.kernel_table import attribute, format_table, top_rows

    ctx, out = args.decode_contexts[0], []
    for b in args.batch_sizes:
        try:
            found = bench.kernel_census(b, ctx, args.kernel_steps)
        except Exception as error:  # the timed rows above are kept: the census is extra
            print(f"batch {b}: the kernel census failed: {type(error).__name__}: {error}",
                  file=sys.stderr)  # fmt: skip
            continue
        if not found.matched:
            print(f"batch {b}: the census's two passes launched different sequences: every "
                  "kernel is unattributed (no bytes)", file=sys.stderr)  # fmt: skip
        rows = top_rows(attribute(found.launches, found.events, args.kernel_steps),
                        args.kernel_rows)  # fmt: skip
        timed = [r for r in records if r.kind == "decode" and r.batch == b and r.context == ctx]
        replay_us = timed[0].median_ms * 1e3 if timed else None
        title = f"{bench.model} decode batch {b}, context {ctx}"
        print(format_table(rows, ceilings.bandwidth, title, replay_us))
        where = {"model": bench.model, "batch": b, "context": ctx}
        out += [{"kind": "kernel", **where, **r.to_json(ceilings.bandwidth)} for r in rows]
        kernel_us = sum(r.us for r in rows)
        per_step = len(found.launches) / args.kernel_steps
        out.append({"kind": "kernel_step", **where, "kernel_us": kernel_us,
                    "timed_us": replay_us, "recorded_launches": per_step})  # fmt: skip
    return out


def _triton_version() -> str:
    import triton

    return str(triton.__version__)


if __name__ == "__main__":
    raise SystemExit(main())
