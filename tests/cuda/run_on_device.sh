#!/usr/bin/env bash
# All of tests/cuda on a GPU machine without a package index, in one command (docs/gpu.md):
#   WHEELS=/path/to/wheels RESIN_DEFAULT_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf \
#     bash tests/cuda/run_on_device.sh [pytest arguments]
# WHEELS holds what the machine lacks (gguf; llguidance for the grammar tests; fla-core and
# einops for test_bench_delta_rule.py, which skips without them). The checkout is
# installed into a scratch folder too, for its runner families' entry points (`resin.runners`);
# the source tree stays first on the path.
set -euo pipefail
cd "$(dirname "$0")/../.."
site=${SITE:-/tmp/resin-site}
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" .
export PYTHONPATH="$PWD/src:$PWD:$site" RESIN_CACHE_DIR=${RESIN_CACHE_DIR:-/tmp/resin-cache}
exec python3 -m pytest tests/cuda -q -n "${WORKERS:-12}" -p no:cacheprovider --timeout 300 "$@"
