#!/usr/bin/env bash
# GPU: the tests of the kernels that have not yet run compiled (written in CPU-only sessions,
# checked in Triton's interpreter only), in one call, before any benchmark times them:
# DeepSeek-V4's paged indexer scores and radix top-k (tests/cuda/test_indexer.py), GLM-5.3's
# indexed MLA on the sparse kernel's pooled mode (test_glm5_sparse_mla.py; its bf16 cases run
# only on a GPU) and the models on them (test_glm5_next.py, test_deepseek_v4.py), the fused
# MoE router (its cross-program hand-off: test_fused_router_replays_in_a_cuda_graph_gpu) and
# the fla comparison's agreement (test_bench_delta_rule.py, wheels in .whl/ as for
# scripts/gpu_fla_compare.sh) and programmatic dependent launch (test_pdl.py: the same logits
# with it as without, through CUDA graphs). Carry `.whl`; about 3 minutes with -n 8.
#   OUT=/tmp/out bash scripts/gpu_kernel_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench}"
mkdir -p "$out"
site="${SITE:-/tmp/resin-check-site}"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
    .whl/fla_core-*.whl .whl/einops-*.whl .whl/gguf-*.whl || echo "wheels missing: fla tests fail"
export PYTHONPATH="$PWD/src:$PWD:$site" RESIN_CACHE_DIR="${RESIN_CACHE_DIR:-/tmp/resin-cache}"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout "${TEST_S:-300}" python3 -m pytest -q -p no:cacheprovider -n "${WORKERS:-8}" \
    --timeout 240 -rfE \
    tests/cuda/test_indexer.py tests/cuda/test_glm5_sparse_mla.py \
    tests/cuda/test_sparse_attention.py tests/cuda/test_glm5_next.py \
    tests/cuda/test_deepseek_v4.py tests/cuda/test_bench_delta_rule.py \
    tests/cuda/test_bench_router.py tests/cuda/test_pdl.py tests/cuda/test_attention.py \
    tests/cuda/test_deepseek.py \
    tests/cuda/test_moe.py::test_fused_router_replays_in_a_cuda_graph_gpu \
    tests/cuda/test_moe.py::test_fused_router_equals_linear_and_topk \
    tests/cuda/test_moe.py::test_fused_router_launch_shapes_agree > "$out/kernel_check.log" 2>&1
echo "== rc=$?"
tail -25 "$out/kernel_check.log"
