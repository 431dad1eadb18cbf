"""Load-test an OpenAI-compatible server: `python scripts/bench_serve.py --url URL ...`.

Same as `resin bench ...`; see `resin_app.bench.serve` for the options and metrics.
"""

import sys

from resin_app.bench.serve import main

if __name__ == "__main__":
    sys.exit(main())
