#!/usr/bin/env bash
# GPU: DeepSeek-V4-Flash at 8 layers on the fast runner (issue 36), random weights, each step
# its own process under `timeout` so a failure costs only its rows. The model: $MODEL, by
# default `deepseek-v4-flash-8l` (bf16, 107.5 GB) on a card of 100 GB or more, else
# `deepseek-v4-flash-8l:mxfp4` (the published FP4 experts, attention bf16; fits 80 GB).
# Writes under $OUT (or ./bench), each step's log beside its JSONL:
#   runner.jsonl  `resin bench runner`: prefill 4k and 32k, decode batch 1 and 64 at 1k
#                 with each batch's kernel table (step runner_1k; KERNELS=0: none), then decode batch 1 and 64 at 32k (step runner_32k)
#   spec.jsonl    `resin bench speculative --speculative mtp` with one draft force-accepted,
#                 batch 1, beside plain decode (target: >= 1.5x)
# Knobs: MODEL, PY, DEVICE, CONTEXTS, CTX1K, CTX32, BATCHES, SPEC_LEN, SPEC_OUT, WARMUP, ITERS, KERNELS, RUN_S / RUN32_S / SPEC_S (per-step timeouts, seconds).
# CPU smoke run of the plumbing (the interpreter):
#   TRITON_INTERPRET=1 OUT=/tmp/v DEVICE=cpu MODEL=tiny-deepseek_v4 CONTEXTS=40 CTX1K=40 CTX32=48 \
#   BATCHES=1,2 SPEC_LEN=8 SPEC_OUT=5 PY=.venv/bin/python scripts/gpu_v4_bench.sh   (~3 min)
set -uo pipefail
out="${OUT:-bench}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
PY="${PY:-python3}"
DEVICE="${DEVICE:-cuda}"
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if [ -z "${MODEL:-}" ]; then
    MODEL=deepseek-v4-flash-8l
    if [ -n "$mib" ] && [ "$mib" -lt 100000 ]; then
        echo "gpu_v4_bench.sh: ${mib} MiB on the card: ${MODEL}:mxfp4 in place of bf16"
        MODEL="$MODEL:mxfp4"
    fi
fi
common=(--random-weights --device "$DEVICE" --model-config "$MODEL" --warmup "${WARMUP:-2}"
        --iters "${ITERS:-5}" --output "$out/runner.jsonl")
[ "$DEVICE" = cpu ] && common+=(--dtype fp32)
runner() {  # tag, seconds, args...
    local tag=$1 seconds=$2
    shift 2
    timeout "$seconds" "$PY" -m resin_app bench runner "${common[@]}" "$@" >"$out/$tag.log" 2>&1
    echo "== $tag rc=$?"
    grep -E "weights .* on the device|\| +(decode|prefill) +\||Error|error" "$out/$tag.log" | tail -20
}
# KERNELS=1 (the default): the 1k step also prints each decode batch's device-kernel table
# (`--kernels`, a few eager steps after the timed rows; a census that fails keeps them)
kernels=()
[ "${KERNELS:-1}" = 1 ] && kernels=(--kernels)
runner runner_1k "${RUN_S:-240}" --context-lengths "${CONTEXTS:-4096,32768}" \
    --decode-contexts "${CTX1K:-1024}" --batch-sizes "${BATCHES:-1,64}" "${kernels[@]}"
runner runner_32k "${RUN32_S:-150}" --context-lengths "${CTX_PREFILL:-4096}" \
    --decode-contexts "${CTX32:-32768}" --batch-sizes "${BATCHES:-1,64}"
timeout "${SPEC_S:-150}" "$PY" -m resin_app bench speculative --speculative mtp --random-weights \
    --model-config "$MODEL" --runner cuda --device "$DEVICE" --num-draft-tokens 1 \
    --accepted-drafts 1 --batch-sizes 1 --input-len "${SPEC_LEN:-256}" \
    --output-len "${SPEC_OUT:-128}" --output "$out/spec.jsonl" >"$out/spec.log" 2>&1
echo "== spec rc=$?"
grep -E "^B=|Error|error" "$out/spec.log" | tail -5
