"""Benchmark a GPU runner: `python scripts/bench.py --random-weights --model-config llama-8b ...`
(the same as `resin bench --random-weights ...`; see resin_app/bench/runner.py)."""

from resin_app.bench.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
