#!/usr/bin/env bash
# Issue 39's tensor-core GEMVs on a GPU machine, in one command: their tests compiled; the
# tile sweep (`resin bench tune-gemv --tensor-core`: the tile file's FMA tiles against the
# tensor-core ones and cuBLAS bf16, the winners written into this tree's tile file, so the
# runs after it use them); then batch-1 / batch-64 decode of Llama-3.1-8B FP8 (per-channel,
# 128 x 128 blocks) and gpt-oss-20b MXFP4, each group in its own process under `timeout`.
# JSONL, logs and the tile file to $OUT (or ./bench). KERNELS=1 adds `resin bench runner
# --kernels` to the decode runs: each batch's per-kernel table (time, bytes, fraction of the
# in-run copy bandwidth) in the log and the JSONL.
set -uo pipefail
out="${OUT:-bench}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
python="${PYTHON:-python3}"
tiles=src/resin_models_cuda/kernels/tuned/h200.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
rc=0
if [ "${TESTS:-1}" = 1 ]; then
    timeout "${TEST_S:-100}" "$python" -m pytest -q -x -p no:cacheprovider -n "${WORKERS:-8}" \
        tests/cuda/test_quant_kernels.py tests/cuda/test_tiles.py \
        -k "tensor_core or expert_gemv or register_decode or fp8_gemv or fp8_linear or tiles" \
        > "$out/tests.log" 2>&1 || rc=$?
fi
echo "== tests rc=$rc (TESTS=0: not run here)"
[ -f "$out/tests.log" ] && tail -15 "$out/tests.log"
if [ "$rc" -eq 0 ]; then  # only kernels that passed their tests may win the sweep
    timeout "${TUNE_S:-130}" "$python" -m resin_app bench tune-gemv --tensor-core \
        --only mxfp4,dense --models llama-8b --budget-s "${TUNE_BUDGET:-100}" \
        --output "$out/tune_tc_gemv_h200.jsonl" \
        --tiles-json "$tiles" --merge "$tiles" > "$out/tune.log" 2>&1
    echo "== tune rc=$?"
    grep -v '^{"kernel"' "$out/tune.log" | tail -12
    cp "$tiles" "$out/h200.json"
fi
bench() {  # models, tag, seconds
    timeout "$3" "$python" -m resin_app bench runner --random-weights --context-lengths 1024 \
        --batch-sizes "${BATCH_SIZES:-1,64}" --decode-contexts 1024 --warmup 2 --iters 6 \
        --model-config "$1" ${KERNELS:+--kernels} \
        --output "$out/$2.jsonl" > "$out/$2.log" 2>&1
    echo "== $2 rc=$?"
    grep -E "weights .* on the device|\| +decode +\||Error" "$out/$2.log" | tail -8
    [ -n "${KERNELS:-}" ] && grep -E "^== .*device kernels|^kernel time per step" "$out/$2.log"
}
bench llama-8b:fp8-channel,llama-8b:fp8-block runner_fp8 "${FP8_S:-150}"
bench gpt-oss-20b:mxfp4 runner_gpt_oss_20b "${OSS_S:-100}"
