"""Speculative decoding through the Engine, plain vs speculative side by side:
`python scripts/bench_speculative.py --speculative ngram --checkpoint DIR ...` (the same as
`resin bench --speculative ...`; see resin_app/bench/speculative.py)."""

from resin_app.bench.speculative import main

if __name__ == "__main__":
    raise SystemExit(main())
