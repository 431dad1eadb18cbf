#!/usr/bin/env bash
# The one-GPU proof of the fast runner's sharded math (docs/distributed.md, "The one-GPU proof"):
# two ranks share cuda:0, their model group on Gloo with CUDA tensors (NCCL refuses two ranks on
# one device), and TP=2 / EP=2 must give TP=1's greedy tokens (fp32 logits close: TF32 dots) under
# the real Engine: dense Llama, Qwen3-MoE with TP+EP, EP over replicated attention and split
# experts, DeepSeek MLA split by heads with spread experts; then a worker killed mid-run must
# make the engine report the runner dead; and every cut layer (dense, FP8, MXFP4) sums to the
# uncut one with the compiled kernels. Run on a one-H200 device from the repository root:
#     bash scripts/tp_one_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
"$PY" -m pytest -q -rA --timeout 600 tests/cuda/test_parallel.py tests/cuda/test_parallel_layers.py
