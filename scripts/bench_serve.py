"""Load-test an OpenAI-compatible server: `python scripts/bench_serve.py --url URL ...`.

Same as `resin bench ...`; see `resin.tools.bench` for the options and metrics.
"""

import sys

from resin.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
