#!/usr/bin/env bash
# GPU: `resin serve --device cuda` (the fast runner) beside the Engine alone, Llama-3.1-8B
# shape, random bf16 weights, SmolLM2's tokenizer. Writes JSONL under $OUT:
#   ready.jsonl   seconds from `resin serve` to /health 200, and the startup log's ready line
#   serve.jsonl   `resin bench serve` at concurrency 1 and 64 (200-word prompts, 256 tokens out)
#   engine.jsonl  `resin bench engine --overlap --runner cuda` at batch 1 and 64 (same shapes,
#                 random weights of the same preset: the runner's speed does not depend on them)
# Usage: OUT=/path scripts/gpu_serve_bench.sh   (PY, CKPT, PORT, TOKENIZER (a folder to copy
# instead of SmolLM2's), PROMPTS_1 / PROMPTS_64 override the defaults; a CPU
# smoke run of the plumbing: PRESET=tiny DEVICE=cpu ENGINE_RUNNER=torch)
set -euo pipefail
OUT="${OUT:?set OUT to a folder}"
PY="${PY:-python}"
PRESET="${PRESET:-llama-8b}"
DEVICE="${DEVICE:-cuda}"
ENGINE_RUNNER="${ENGINE_RUNNER:-cuda}"
CKPT="${CKPT:-/tmp/resin-${PRESET}-random}"
PORT="${PORT:-8123}"
URL="http://127.0.0.1:${PORT}"
mkdir -p "$OUT"

# (a) the checkpoint folder (once: shards drawn on the GPU, ~16 GB written)
if [ ! -f "$CKPT/model.safetensors.index.json" ]; then
  "$PY" -m resin_app bench checkpoint --preset "$PRESET" --output "$CKPT" --device "$DEVICE" \
    ${TOKENIZER:+--tokenizer "$TOKENIZER"}
fi

# (b) the server, timed to /health 200
start=$(date +%s.%N)
set -m  # the server gets its own process group: the trap stops exactly it, by id
"$PY" -m resin_app serve --device "$DEVICE" --checkpoint "$CKPT" --port "$PORT" \
  --max-model-len 4096 --max-num-seqs 256 --disable-log-requests >"$OUT/serve.log" 2>&1 &
server=$!
trap 'kill -- -"${server}" 2>/dev/null || true' EXIT
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]; do
  if ! kill -0 "$server" 2>/dev/null; then cat "$OUT/serve.log"; exit 1; fi
  sleep 0.1
done
ready=$("$PY" -c "import time; print(round(time.time() - $start, 2))")
line=$(grep -o 'resin: ready in .*' "$OUT/serve.log" | tail -1 | sed 's/"/\\"/g')
echo "{\"what\": \"resin serve --device cuda to /health 200\", \"seconds\": $ready, \"log\": \"$line\"}" \
  >>"$OUT/ready.jsonl"
echo "ready after ${ready} s: $line"

# (c) through HTTP at concurrency 1 and 64
"$PY" -m resin_app bench serve --url "$URL" --max-concurrency 1 --num-prompts "${PROMPTS_1:-16}" \
  --input-len 200 --output-len 256 --ignore-eos --output "$OUT/serve.jsonl"
"$PY" -m resin_app bench serve --url "$URL" --max-concurrency 64 --num-prompts "${PROMPTS_64:-256}" \
  --input-len 200 --output-len 256 --ignore-eos --output "$OUT/serve.jsonl"
kill -- -"${server}"
wait "$server" 2>/dev/null || true
trap - EXIT

# ... and the Engine alone on the same shapes (after the server freed the GPU)
"$PY" -m resin_app bench engine --overlap --runner "$ENGINE_RUNNER" --model-config "$PRESET" \
  --device "$DEVICE" \
  --sequences 1 64 --context 1024 --output "$OUT/engine.jsonl"
