"""`resin bench <tool>`: every benchmark of the project, one module per tool in this package.

Each tool parses its own options (`resin bench <tool> --help`) and is also
`python -m resin_app.bench.<module>` (say under torchrun). Helpers the tools share:
`runner_bench.py` (the runner's sweeps), `report.py` (tables, JSONL, charts), `plans.py` (a
planner without the Engine).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Tool:
    module: str
    summary: str


TOOLS: dict[str, Tool] = {
    "runner": Tool("resin_app.bench.runner", "GPU runner prefill/decode sweeps vs the hardware"),
    "serve": Tool("resin_app.bench.serve", "load-test an OpenAI-compatible server (--url)"),
    "replay": Tool(
        "resin_app.bench.replay", "a `serve --output` workload through the Engine alone"
    ),
    "engine": Tool("resin_app.bench.engine", "engine CPU time per step, zero-cost runner"),
    "engine-process": Tool(
        "resin_app.bench.engine_process", "the zero-cost engine process over zmq, no HTTP"
    ),
    "overlap": Tool("resin_app.bench.overlap", "GPU: engine vs the runner's own decode, overlap"),
    "speculative": Tool("resin_app.bench.speculative", "plain vs speculative through the Engine"),
    "speculative-copy": Tool(
        "resin_app.bench.speculative_copy", "GPU: n-gram drafts on real weights, copy prompts"
    ),
    "tp": Tool("resin_app.bench.tp", "reference runner TP / EP beside TP=1"),
    "cpu": Tool("resin_app.bench.cpu", "CPU tokens/s: reference runner vs transformers"),
    "serve-parity": Tool(
        "resin_app.bench.serve_parity", "resin serve on each runner vs transformers, same dtype"
    ),
    "reference": Tool("resin_app.bench.reference", "reference runner vs transformers, any device"),
    "grammar": Tool("resin_app.bench.grammar", "constrained decoding: token-mask time per step"),
    "grammar-isolation": Tool(
        "resin_app.bench.grammar_isolation", "plain latency beside hostile constrained load"
    ),
    "structured": Tool("resin_app.bench.structured", "constrained decoding acceptance rates"),
    "recipes": Tool("resin_app.bench.recipes", "chat recipe render and parse throughput"),
    "preprocess": Tool("resin_app.bench.preprocess", "image preprocessing vs transformers"),
    "tune-moe": Tool("resin_app.bench.tune_moe", "GPU: MoE kernel tile sweeps"),
    "tune-gemv": Tool("resin_app.bench.tune_gemv", "GPU: quantized GEMV tile sweeps -> tile file"),
    "quant-kernels": Tool("resin_app.bench.quant_kernels", "GPU: FP8 / MXFP4 kernels beside bf16"),
    "router": Tool("resin_app.bench.router", "GPU: MoE router, fused kernel vs linear + top-k"),
    "sparse-attention": Tool(
        "resin_app.bench.sparse_attention", "GPU: DeepSeek-V4 sparse attention vs dense"
    ),
    "decode-attention": Tool(
        "resin_app.bench.decode_attention", "GPU: paged decode attention's launch shapes"
    ),
    "delta-rule": Tool(
        "resin_app.bench.delta_rule", "GPU: our delta-rule kernels vs fla-core's (GDN, KDA)"
    ),
    "checkpoint": Tool(
        "resin_app.bench.checkpoint", "write a random-weights checkpoint folder of real shapes"
    ),
}


def usage() -> str:
    width = max(map(len, TOOLS))
    lines = [f"  {name:<{width}}  {tool.summary}" for name, tool in TOOLS.items()]
    return "usage: resin bench TOOL [options]   (resin bench TOOL --help)\n\ntools:\n" + "\n".join(
        lines
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] not in TOOLS:
        print(f"resin bench: unknown tool {args[0]!r}\n{usage()}", file=sys.stderr)
        return 2
    tool = importlib.import_module(TOOLS[args[0]].module)
    return int(tool.main(args[1:]))
