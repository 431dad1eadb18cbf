#!/usr/bin/env bash
# The quantized GEMV kernels on the GPU: their CPU tests compiled (tests/cuda quant, MoE, tile
# and quantized-model files), then `resin bench tune-gemv` (tiles per shape timed in CUDA
# graphs) writing a tile file merged over the repository's. Logs, JSONL and the tile file to
# $OUT (or ./bench). About 5 minutes on an H200.
set -uo pipefail
out="${OUT:-bench}"
mkdir -p "$out"
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
timeout "${TEST_S:-200}" "$python" -m pytest -q -x -p no:cacheprovider \
    tests/cuda/test_quant_kernels.py tests/cuda/test_moe.py tests/cuda/test_tiles.py \
    tests/cuda/test_quantized_models.py > "$out/tests.log" 2>&1
echo "tests rc=$?"; tail -25 "$out/tests.log"
timeout "${TUNE_S:-200}" "$python" -m resin_app bench tune-gemv --budget-s "${BUDGET_S:-140}" \
    --output "$out/tune_gemv_h200.jsonl" --tiles-json "$out/h200.json" \
    --merge src/resin_models_cuda/kernels/tuned/h200.json > "$out/tune.log" 2>&1
echo "tune rc=$?"; grep -v '^failed' "$out/tune.log" | tail -40; grep -c '^failed' "$out/tune.log"
