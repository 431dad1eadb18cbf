#!/usr/bin/env bash
# Decode (batch 1 and 64 at 1k context) and prefill (4k) of a random-weight Llama-3.1-8B in
# bf16 beside the same shapes with FP8 per-channel and FP8 128x128-block weights (quantized on
# the device as built), one process, one set of in-run ceilings. JSONL to $OUT (or ./bench).
# Usage on a GPU machine: scripts/gpu_quant_bench.sh  (about 2 minutes on an H200; needs the
# repository's venv: PYTHON defaults to .venv/bin/python, else python3).
set -euo pipefail
out="${OUT:-bench}"
mkdir -p "$out"
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
"$python" -m resin_app bench runner --random-weights \
    --model-config llama-8b,llama-8b:fp8-channel,llama-8b:fp8-block \
    --context-lengths 4096 --batch-sizes 1,64 --decode-contexts 1024 \
    --warmup 3 --iters 10 --output "$out/quant_llama8b_h200.jsonl"
echo "wrote $out/quant_llama8b_h200.jsonl"
