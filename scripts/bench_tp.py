"""Tensor / expert parallel benchmark of the reference runner, TP=N beside TP=1 in one run:
`resin_app.bench.tp` (`resin bench --tensor-parallel N`), here for torchrun.

    torchrun --nproc-per-node 2 scripts/bench_tp.py --preset llama-8b --batch 1 64
    python scripts/bench_tp.py --tensor-parallel 2 --preset tiny --device cpu --dtype float32
"""

import sys

from resin_app.bench.tp import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
