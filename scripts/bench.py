"""Benchmark a GPU runner: `python scripts/bench.py --random-weights --model-config llama-8b ...`
(the same as `resin bench --random-weights ...`; see resin_models_cuda/bench_cli.py)."""

from resin_models_cuda.bench_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
