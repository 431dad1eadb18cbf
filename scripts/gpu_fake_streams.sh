#!/usr/bin/env bash
# The zero-cost runner at $STREAMS streams (default 1,024) from $CLIENTS client processes, once
# per `resin serve` flag set in $CONFIGS (";"-separated; "" = default flags), the same load as
# scripts/gpu_replay_bench.sh's step 4 (200-word chat prompts, 256 tokens out, 2 rounds):
#   OUT=/tmp/out CONFIGS='; --max-active 512; --max-active 1024' scripts/gpu_fake_streams.sh
# Prints each flag set's summed output tok/s; JSONL per flag set under $OUT. $CKPT (optional):
# a checkpoint folder whose tokenizer and template the zero-cost runner serves (`--checkpoint`;
# no weights load), so the machine needs no default-model GGUF.
set -uo pipefail
OUT="${OUT:?set OUT to a folder}"
PY="${PY:-python}"
PORT="${PORT:-8792}"
STREAMS="${STREAMS:-1024}"
CLIENTS="${CLIENTS:-8}"
WORDS="${WORDS:-200}"
TOKENS="${TOKENS:-256}"
mkdir -p "$OUT"
IFS=';' read -r -a configs <<< "${CONFIGS:-}"
[ "${#configs[@]}" -eq 0 ] && configs=("")
i=0
for flags in "${configs[@]}"; do
  i=$((i + 1))
  # shellcheck disable=SC2086  # the flags split into words on purpose
  timeout 300 "$PY" -m resin_app serve --fake-runner --port "$PORT" --disable-log-requests \
    ${CKPT:+--checkpoint "$CKPT"} $flags > "$OUT/serve_$i.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    sleep 0.2
  done
  per=$((STREAMS / CLIENTS))
  pids=()
  for c in $(seq "$CLIENTS"); do
    timeout 200 "$PY" -m resin_app bench serve --url "http://127.0.0.1:$PORT" --endpoint chat \
      --input-len "$WORDS" --output-len "$TOKENS" --ignore-eos --max-concurrency "$per" \
      --num-prompts $((per * 2)) --seed "$c" --output "$OUT/fake_$i.jsonl" \
      > "$OUT/fake_${i}_client$c.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  kill -TERM "$server"; timeout 60 tail --pid="$server" -f /dev/null; kill -KILL "$server" 2>/dev/null
  "$PY" - "$OUT/fake_$i.jsonl" "$flags" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
tok = sum(r["output_tok_s"] for r in runs)
failed = sum(r["failed"] for r in runs)
print(f"flags [{sys.argv[2].strip() or 'default'}]: {tok:,.0f} output tok/s from {len(runs)} "
      f"clients, failed {failed}")
PY
done
