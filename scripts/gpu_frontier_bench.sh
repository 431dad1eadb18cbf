#!/usr/bin/env bash
# Decode at batch 1 and 64 (1k context, CUDA graphs, random weights of the published shapes)
# for the formats frontier checkpoints ship, this tree beside another (BEFORE: a directory
# holding an older tree, e.g. `git archive main`), one process per group so that a model that
# does not fit or build costs only its own row. JSONL and logs to $OUT (or ./bench).
# Usage on a GPU machine: BEFORE=../main_tree scripts/gpu_frontier_bench.sh
set -uo pipefail
out="${OUT:-bench}"
mkdir -p "$out"
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
args=(--random-weights --context-lengths 1024 --batch-sizes 1,64 --decode-contexts 1024
      --warmup "${WARMUP:-2}" --iters "${ITERS:-8}")
after="${AFTER_MODELS:-llama-8b,llama-8b:fp8-channel,llama-8b:fp8-block,qwen3-30b-a3b,qwen3-30b-a3b:fp8-block,gpt-oss-20b:mxfp4}"
before="llama-8b:fp8-channel,llama-8b:fp8-block,qwen3-30b-a3b,qwen3-30b-a3b:fp8-block,gpt-oss-20b:mxfp4"
bench() {  # tree, models, tag, seconds
    (cd "$1" && PYTHONPATH="$PWD/src:$PWD" timeout "$4" "$python" -m resin_app bench runner \
        "${args[@]}" --model-config "$2" --output "$out/$3.jsonl") > "$out/$3.log" 2>&1
    echo "== $3 rc=$?"; grep -E "weights .* on the device|\| +(decode|prefill) +\||Error|error" "$out/$3.log" | tail -30
}
out="$(cd "$out" && pwd)"
bench . "$after" after "${AFTER_S:-200}"
bench . gpt-oss-120b:mxfp4 after_gpt_oss_120b "${BIG_S:-100}"
bench . glm-4.5-air:fp8-block after_glm_air "${BIG_S:-100}"
if [ -n "${BEFORE:-}" ]; then
    bench "$BEFORE" "$before" before "${BEFORE_S:-150}"
fi
