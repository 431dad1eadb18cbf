#!/usr/bin/env bash
# GPU (one H200): the hybrid linear-attention models on the fast runner (issue 37), random
# bf16 weights, each step its own process under `timeout` so a failure costs only its row.
# Writes under $OUT (or ./bench), each step's log beside its JSONL:
#   qwen3_5.jsonl      `resin bench runner`, Qwen3.5-35B-A3B at full depth (40 layers, ~70 GB):
#                      decode batch 1 and 64 at 1k context with each batch's kernel table
#                      (KERNELS=0: none), prefill 4k and 16 tokens (a short step in its
#                      fixed-shape graph, what a prefix hit's suffix costs; step qwen3_5),
#                      the 16 tokens again on the varlen kernels (`--variants varlen`, rows
#                      named +varlen; step qwen3_5_varlen, VARLEN=0: not run), then
#                      prefill 32k (step qwen3_5_32k)
#   glm5.jsonl         GLM-5.3-Flash at reduced depth (glm-5.3-flash-8l: 8 layers, ~78 GB;
#                      on an 80 GB card glm-5.3-flash-6l, 6 layers, 48.7 GB):
#                      decode batch 1 and 64 at 1k, prefill 4k (the fast runner's first
#                      GLM-5.3: expect it below the ceiling)
#   glm5_mla*.jsonl    (GLM_MLA="1 0", opt-in, in place of glm5.jsonl) the same GLM step once
#                      per `IndexedMla.sparse_kernel` setting: 1 the sparse attention kernel
#                      (the default), 0 the torch path it replaced, docs/benchmarks.md
#   prefix_ttft.jsonl  `resin serve --load-format dummy` of Qwen3.5-35B-A3B at full depth
#                      (random weights drawn on the GPU from a folder of config and
#                      tokenizer: the 70 GB of weights would not fit the machine's 64 GB
#                      disk; on an 80 GB card qwen3.5-35b-a3b-8l; SERVE_LOAD=auto writes and
#                      loads a random 8-layer folder, 15.5 GB, as before): a
#                      ~4k-token shared prefix (1,350 random words); after two warm-up
#                      requests on prefixes of their own (kernels compile), the first request
#                      cold, then warm ones that share it, then a second cold prefix; each
#                      request's TTFT (streamed, first chunk) and the prompt / cached tokens
#                      the server counted; the last line has the lower cold / median-warm
#                      ratio (target >= 5)
#   prefix_ttft_varlen.jsonl
#                      the same with the suffix's prefill on the varlen kernels
#                      (`--graph-prefill-tokens 0`; SERVE_VARLEN=0: not run)
#   glm5_kda_chunk*.jsonl
#                      (KDA_CHUNKS="16 32 0", opt-in) GLM's prefill at each KDA chunk size
#                      (0: the recurrent kernel), docs/benchmarks.md
#   tests.log          (TESTS=1, the default) the hybrid models' fast-runner tests compiled on
#                      the GPU: GLM-5.3's and Qwen3.5's against the reference runner (their
#                      decode in CUDA graphs), the kernel tests (GLM's sparse MLA in bf16 too)
# Usage: OUT=/path scripts/gpu_hybrid_bench.sh   (PY; QWEN, QWEN_32K, GLM, SERVE_PRESET presets;
# CKPT, PORT, PREFIX_WORDS, WARM, TESTS, KDA_CHUNKS, GLM_MLA, KERNELS; TOKENIZER, the folder the serve
# step's checkpoint copies its tokenizer from (default: the default model's, from its GGUF); the
# *_S per-step timeouts; a preset "skip" skips its step).
# CPU smoke run of the plumbing (the interpreter needs the longer timeouts):
#   TRITON_INTERPRET=1 OUT=/tmp/h DEVICE=cpu QWEN=tiny-qwen3_5_moe QWEN_32K=skip GLM=tiny-glm5_next \
#   SERVE_PRESET=tiny-qwen3_5_moe CONTEXTS=64 DECODE_CTX=32 BATCHES=1,2 PREFIX_WORDS=40 \
#   MAX_LEN=512 QWEN_S=900 GLM_S=900 TESTS=0 scripts/gpu_hybrid_bench.sh
set -uo pipefail
out="${OUT:-bench}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
PY="${PY:-python}"
DEVICE="${DEVICE:-cuda}"
QWEN="${QWEN:-qwen3.5-35b-a3b}"
# The full-depth Qwen3.5 (~70 GB of weights) does not fit with its KV beside it on an 80 GB
# card: there (an H200 call may land on an H100) the 8-layer preset runs instead, said so.
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if [ "$QWEN" = qwen3.5-35b-a3b ] && [ -n "$mib" ] && [ "$mib" -lt 100000 ]; then
    echo "gpu_hybrid_bench.sh: ${mib} MiB on the card: qwen3.5-35b-a3b-8l in place of full depth"
    QWEN=qwen3.5-35b-a3b-8l
fi
QWEN_32K="${QWEN_32K:-$QWEN}"
GLM="${GLM:-glm-5.3-flash-8l}"
# GLM-5.3 at 8 layers (78 GB) does not fit an 80 GB card either: 6 layers (48.7 GB) there
if [ "$GLM" = glm-5.3-flash-8l ] && [ -n "$mib" ] && [ "$mib" -lt 100000 ]; then
    echo "gpu_hybrid_bench.sh: ${mib} MiB on the card: glm-5.3-flash-6l in place of 8 layers"
    GLM=glm-5.3-flash-6l
fi
# The prefix-hit step serves random weights drawn on the GPU (`--load-format dummy`, a folder of
# config and tokenizer only: no 70 GB on the disk), so it runs the full depth where it fits.
SERVE_LOAD="${SERVE_LOAD:-dummy}"
serve_default=qwen3.5-35b-a3b
if [ "$SERVE_LOAD" != dummy ] || { [ -n "$mib" ] && [ "$mib" -lt 100000 ]; }; then
    serve_default=qwen3.5-35b-a3b-8l
fi
SERVE_PRESET="${SERVE_PRESET:-$serve_default}"
CKPT="${CKPT:-/tmp/resin-${SERVE_PRESET}-${SERVE_LOAD}}"
PORT="${PORT:-8124}"
URL="http://127.0.0.1:${PORT}"
common=(--random-weights --device "$DEVICE" --warmup "${WARMUP:-2}" --iters "${ITERS:-5}")

runner() {  # tag, jsonl, seconds, args...
    local tag=$1 jsonl=$2 seconds=$3
    shift 3
    timeout "$seconds" "$PY" -m resin_app bench runner "${common[@]}" "$@" \
        --output "$out/$jsonl" >"$out/$tag.log" 2>&1
    echo "== $tag rc=$?"
    grep -E "weights .* on the device|\| +(decode|prefill) +\||Error|error" "$out/$tag.log" | tail -20
}

set_runner() {  # tag, jsonl, seconds, "module:Class.attribute=value", args...: runner, the
    # class attribute set first (an A/B switch of the fast runner's model code)
    local tag=$1 jsonl=$2 seconds=$3 setting=$4
    shift 4
    local module=${setting%%:*} rest=${setting#*:}
    local name=${rest%%=*} value=${rest#*=}
    timeout "$seconds" "$PY" -c "import sys
import $module as m
setattr(m.${name%%.*}, '${name#*.}', $value)
from resin_app.cli import main
sys.exit(main(sys.argv[1:]))" bench runner "${common[@]}" "$@" --output "$out/$jsonl" \
        >"$out/$tag.log" 2>&1
    echo "== $tag rc=$?"
    grep -E "weights .* on the device|\| +(decode|prefill) +\||Error|error" "$out/$tag.log" | tail -20
}

# KERNELS=1 (the default): the Qwen3.5 and GLM steps also print each decode batch's
# device-kernel table (`--kernels`: a few eager steps after the timed rows, which a census
# that fails keeps): where a step's time goes at full depth
kernels=()
[ "${KERNELS:-1}" = 1 ] && kernels=(--kernels)
if [ "$QWEN" != skip ]; then
    runner qwen3_5 qwen3_5.jsonl "${QWEN_S:-150}" --model-config "$QWEN" \
        --context-lengths "${CONTEXTS:-16,4096}" --batch-sizes "${BATCHES:-1,64}" \
        --decode-contexts "${DECODE_CTX:-1024}" "${kernels[@]}"
fi
# The short prefill on the varlen kernels (`--variants varlen`), to set against the 16-token row
# above (the fixed-shape graph a prefix hit's suffix replays; VARLEN=0: not run)
if [ "$QWEN" != skip ] && [ "${VARLEN:-1}" = 1 ]; then
    runner qwen3_5_varlen qwen3_5.jsonl "${QWEN_S:-150}" --model-config "$QWEN" \
        --context-lengths 16 --batch-sizes 1 --decode-contexts "${DECODE_CTX:-1024}" \
        --variants varlen
fi
if [ "$QWEN_32K" != skip ]; then
    runner qwen3_5_32k qwen3_5.jsonl "${QWEN_32K_S:-75}" --model-config "$QWEN_32K" \
        --context-lengths 32768 --batch-sizes 1 --decode-contexts "${DECODE_CTX:-1024}"
fi
glm5=resin_models_cuda.models.glm5_next
glm_args=(--model-config "$GLM" --context-lengths "${CONTEXTS:-4096}"
          --decode-contexts "${DECODE_CTX:-1024}")
if [ "$GLM" != skip ] && [ -z "${GLM_MLA:-}" ]; then
    runner glm5 glm5.jsonl "${GLM_S:-150}" "${glm_args[@]}" --batch-sizes "${BATCHES:-1,64}" \
        "${kernels[@]}"
fi
# The indexed MLA's attention, the sparse kernel against the torch path (opt-in, e.g.
# GLM_MLA="1 0"): the GLM step with `IndexedMla.sparse_kernel` set, one JSONL a setting.
for m in ${GLM_MLA:-}; do
    case $m in 0) flag=False ;; 1) flag=True ;; *) echo "GLM_MLA: 0 or 1, not $m"; continue ;; esac
    [ "$GLM" = skip ] && break
    set_runner "glm5_mla$m" "glm5_mla$m.jsonl" "${GLM_S:-120}" \
        "$glm5:IndexedMla.sparse_kernel=$flag" "${glm_args[@]}" --batch-sizes "${BATCHES:-1,64}"
done

# KDA prefill, chunked against recurrent (opt-in, e.g. KDA_CHUNKS="16 32 0"; 0 = the recurrent
# kernel): GLM's prefill with `KimiDeltaAttention.prefill_chunk` set, one JSONL a chunk size.
for c in ${KDA_CHUNKS:-}; do
    set_runner "glm5_kda_chunk$c" "glm5_kda_chunk$c.jsonl" "${GLM_S:-120}" \
        "$glm5:KimiDeltaAttention.prefill_chunk=$c" "${glm_args[@]}" --batch-sizes 1
done

# The prefix hit through `resin serve`: the folder, the server (its own process group, stopped
# by id on every path) and the client, each bounded.
serve_ttft() {  # tag, extra serve options...
    local tag=$1
    shift
    if [ ! -f "$CKPT/config.json" ]; then
        timeout "${CKPT_S:-150}" "$PY" -m resin_app bench checkpoint --preset "$SERVE_PRESET" \
            --output "$CKPT" --device "$DEVICE" ${TOKENIZER:+--tokenizer "$TOKENIZER"} \
            $([ "$SERVE_LOAD" = dummy ] && echo --no-weights) || return 1
    fi
    set -m
    "$PY" -m resin_app serve --device "$DEVICE" --checkpoint "$CKPT" --port "$PORT" \
        --load-format "$SERVE_LOAD" \
        --max-model-len "${MAX_LEN:-8192}" --max-num-seqs 8 --disable-log-requests "$@" \
        >"$out/${tag}_serve.log" 2>&1 &
    server=$!
    set +m
    local deadline=$((SECONDS + ${READY_S:-120}))
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]; do
        if ! kill -0 "$server" 2>/dev/null || [ $SECONDS -gt $deadline ]; then
            tail -20 "$out/${tag}_serve.log"; return 1
        fi
        sleep 0.2
    done
    timeout "${CLIENT_S:-120}" \
    "$PY" - "$URL" "${PREFIX_WORDS:-1350}" "${WARM:-5}" "$out/${tag}.jsonl" <<'EOF'
import json, random, statistics, sys, time, urllib.request

url, words, warm, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
vocab = ["alpha", "river", "stone", "cloud", "seven", "green", "tower", "quiet", "ember", "maple"]


def text(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(vocab) + str(rng.randrange(100)) for _ in range(words))


prefix = text(0)


def ttft(suffix: str, head: str = prefix) -> dict:
    body = {"prompt": f"{head} {suffix}", "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    start, first, usage = time.perf_counter(), None, {}
    with urllib.request.urlopen(req, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return {"ttft_s": first, "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": details.get("cached_tokens")}


# Two warm-ups on prefixes of their own (kernels compile on the first; the second shows what a
# cold request costs once they have), then the prefix cold, its warm hits, and a second cold
# prefix after them: the ratio takes the lower of the two colds, so no compile inflates it.
rows = [dict(ttft("warm-up", text(1)), request="setup1"),
        dict(ttft("warm-up", text(2)), request="setup2")]
rows += [dict(ttft("cold start"), request="cold")]
rows += [dict(ttft(f"warm question {i}"), request=f"warm{i}") for i in range(warm)]
rows += [dict(ttft("cold start", text(3)), request="cold2")]
with open(path, "a") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")
        print(row)
    median = statistics.median(r["ttft_s"] for r in rows if r["request"].startswith("warm"))
    cold = min(r["ttft_s"] for r in rows if r["request"].startswith("cold"))
    summary = {"what": "prefix hit TTFT, cold (the lower of two prefixes) / median warm",
               "cold_s": cold, "warm_median_s": median, "ratio": cold / median}
    f.write(json.dumps(summary) + "\n")
    print(summary)
EOF
}
server=""
trap '[ -n "$server" ] && kill -- -"$server" 2>/dev/null' EXIT
# The prefix hit with the suffix's prefill in a graph (the default), then on the varlen
# kernels (`--graph-prefill-tokens 0`; SERVE_VARLEN=0: not run)
serve_tags=(prefix_ttft)
[ "${SERVE_VARLEN:-1}" = 1 ] && serve_tags+=(prefix_ttft_varlen)
for tag in "${serve_tags[@]}"; do
    [ "$SERVE_PRESET" = skip ] && break
    extra=()
    [ "$tag" = prefix_ttft_varlen ] && extra=(--graph-prefill-tokens 0)
    serve_ttft "$tag" "${extra[@]}" >"$out/$tag.log" 2>&1
    echo "== $tag rc=$?"
    if [ -n "$server" ]; then
        kill -- -"$server" 2>/dev/null
        wait "$server" 2>/dev/null
    fi
    server=""
    tail -3 "$out/$tag.log"
done

if [ "${TESTS:-1}" = 1 ]; then
    timeout "${TESTS_S:-150}" "$PY" -m pytest -q -x tests/cuda/test_glm5_next.py \
        tests/cuda/test_glm5_sparse_mla.py tests/cuda/test_sparse_attention.py \
        tests/cuda/test_qwen3_5_moe.py tests/cuda/test_qwen3_5_kernels.py \
        tests/cuda/test_kda_chunked.py >"$out/tests.log" 2>&1
    echo "== tests rc=$?"
    tail -3 "$out/tests.log"
fi
