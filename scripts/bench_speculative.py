"""Speculative decoding through the Engine, plain vs speculative side by side:
`python scripts/bench_speculative.py --speculative ngram --checkpoint DIR ...` (the same as
`resin bench --speculative ...`; see resin/tools/bench_spec.py)."""

from resin.tools.bench_spec import main

if __name__ == "__main__":
    raise SystemExit(main())
