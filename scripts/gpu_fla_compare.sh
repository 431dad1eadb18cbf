#!/usr/bin/env bash
# GPU: our delta-rule kernels against flash-linear-attention's (`fla-core` 0.6.0; issue 37) at
# Qwen3.5-35B-A3B's (Gated DeltaNet) and GLM-5.3-Flash's (KDA) shapes, chunked (prefill) and
# recurrent (decode); docs/benchmarks.md has what is compared and the decision rule.
# The machine has no package index: the wheels travel in the checkout's .whl/ (ignored by
# git, so carried), made on a machine with one by
#   pip download --no-deps fla-core==0.6.0 einops -d .whl
# and are installed into a scratch folder ($SITE) put first on the path.
# Writes under $OUT (or ./bench):
#   tests.log         tests/cuda/test_bench_delta_rule.py compiled: our kernels and fla's agree
#                     on tiny shapes, chunked too (the interpreter cannot run fla's chunked
#                     kernels), and the command's JSONL rows (TESTS=0 skips it)
#   delta_rule.jsonl  `resin bench delta-rule`, one row a case (ours / fla, the agreement)
#   delta_rule.log    its table and the verdict per path
# Knobs: PREFILL_BATCHES, PREFILL_LENGTHS, DECODE_BATCHES, PRESETS; BENCH_ARGS (more flags,
# e.g. '--modes chunked --kernels --our-chunk 16,32'); TEST_S, BENCH_S timeouts.
# BEFORE=<folder holding another tree> (e.g. `git archive <commit> | tar -x -C .gpuwork/before`,
# carried): that tree's kernels first (delta_rule_before.jsonl / .log), then this tree's with
# `--before` on them: each case after / before, fla's times as the anchor, a geometric mean a
# path. An A/B of two kernel versions in one call, on one machine.
# CPU smoke run of the plumbing (the interpreter; fla's chunked side fails there, said so):
#   OUT=/tmp/f DEVICE=cpu TRITON_INTERPRET=1 TESTS=0 PRESETS=tiny-qwen3_5_moe,tiny-glm5_next \
#   PREFILL_BATCHES=2 PREFILL_LENGTHS=20 DECODE_BATCHES=2 PYTHON=.venv/bin/python \
#   scripts/gpu_fla_compare.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
python="${PYTHON:-python3}"
site="${SITE:-/tmp/resin-fla-site}"
"$python" -m pip install -q --no-deps --no-index --no-compile --target "$site" \
    .whl/fla_core-*.whl .whl/einops-*.whl || { echo "no .whl/fla_core-*.whl, einops-*.whl"; exit 1; }
export PYTHONPATH="$site:$PWD/src:$PWD"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
"$python" -c "import fla, torch, triton; print('fla', fla.__version__, 'torch', torch.__version__,
'triton', triton.__version__)"
if [ "${TESTS:-1}" = 1 ]; then
    timeout "${TEST_S:-300}" "$python" -m pytest -q -p no:cacheprovider \
        tests/cuda/test_bench_delta_rule.py > "$out/tests.log" 2>&1
    echo "== tests rc=$?"
    tail -15 "$out/tests.log"
fi
bench() {  # tree, name, extra arguments
    local tree="$1" name="$2"
    shift 2
    # shellcheck disable=SC2086  # BENCH_ARGS splits into words on purpose
    PYTHONPATH="$site:$tree/src:$tree" timeout "${BENCH_S:-480}" "$python" -m resin_app bench \
        delta-rule --device "${DEVICE:-cuda}" --presets "${PRESETS:-qwen3.5-35b-a3b,glm-5.3-flash}" \
        --prefill-batches "${PREFILL_BATCHES:-1,8}" --prefill-lengths "${PREFILL_LENGTHS:-1024,4096}" \
        --decode-batches "${DECODE_BATCHES:-1,32,256}" ${BENCH_ARGS:-} "$@" \
        --output "$out/$name.jsonl" > "$out/$name.log" 2>&1
    echo "== $name rc=$?"
    grep -v -E "^(qwen|glm|tiny)" "$out/$name.log" | tail -"${TAIL:-30}"
}
if [ -n "${BEFORE:-}" ]; then
    TAIL=8 bench "$(cd "$BEFORE" && pwd)" delta_rule_before
    bench "$PWD" delta_rule --before "$out/delta_rule_before.jsonl"
else
    bench "$PWD" delta_rule
fi
