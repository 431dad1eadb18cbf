#!/usr/bin/env bash
# Source on a GPU machine without a package index, from the checkout's root:
#   source scripts/gpu_site.sh
# installs the carried wheels (.whl/, docs/gpu.md says how to download them) and this checkout
# (its entry points: `resin`, the runner families) into $SITE (default /tmp/site) and puts
# them on PYTHONPATH / PATH, the checkout's src first. $RESIN_CACHE_DIR defaults to
# /tmp/resin-cache. The scripts that need only a tokenizer (gpu_replay_bench.sh `TOKENIZER=`,
# gpu_fake_streams.sh `CKPT=`, gpu_hybrid_bench.sh `TOKENIZER=`) then run in one call without
# the default model's 98 MB GGUF: carry a folder of its tokenizer files instead (~3.5 MB).
SITE="${SITE:-/tmp/site}"
mkdir -p "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl \
    || echo "gpu_site.sh: the wheels in .whl/ did not install" >&2
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" . 2>&1 \
    | tail -2
export PYTHONPATH="$PWD/src:$PWD:$SITE" PATH="$SITE/bin:$PATH"
export RESIN_CACHE_DIR="${RESIN_CACHE_DIR:-/tmp/resin-cache}"
