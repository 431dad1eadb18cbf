#!/usr/bin/env bash
# The zero-cost runner at $STREAMS streams (default 1,024) from $CLIENTS client processes, once
# per `resin serve` flag set in $CONFIGS (";"-separated; "" = default flags), the same load as
# scripts/gpu_replay_bench.sh's step 4 (200-word chat prompts, 256 tokens out, 2 rounds):
#   OUT=/tmp/out CONFIGS='; --max-active 512; --max-active 1024' scripts/gpu_fake_streams.sh
# Prints each flag set's summed output tok/s and where the CPU went: each process's CPU
# microseconds per output token (the engine process, each frontend, the clients together),
# so the stage that saturates first shows. First (ENGINE_PROCESS=0 skips it) the engine
# process alone over zmq at the same streams (`resin bench engine-process`): the ceiling it
# puts on the served figure. JSONL per flag set under $OUT. $CKPT (optional): a checkpoint
# folder whose tokenizer and template the zero-cost runner serves (`--checkpoint`; no weights
# load), so the machine needs no default-model GGUF.
set -uo pipefail
OUT="${OUT:?set OUT to a folder}"
PY="${PY:-python}"
PORT="${PORT:-8792}"
STREAMS="${STREAMS:-1024}"
CLIENTS="${CLIENTS:-8}"
WORDS="${WORDS:-200}"
TOKENS="${TOKENS:-256}"
mkdir -p "$OUT"
scratch=$(mktemp -d)
if [ "${ENGINE_PROCESS:-1}" = 1 ]; then
  timeout 300 "$PY" -m resin_app bench engine-process --streams "$STREAMS" \
    --output-tokens "$TOKENS" --output "$OUT/engine_process.jsonl" 2>&1 | head -1
fi
# utime + stime of each pid, in clock ticks
ticks() { for p in "$@"; do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0; done; }
# the user + sys seconds of this shell's waited children (the second line of `times`; run in
# this shell, not in a $(...) subshell, whose own children are none)
children_s() { times > "$scratch/times"; tail -1 "$scratch/times" | awk '{gsub(/s/, "");
  split($1, u, "m"); split($2, s, "m"); print u[1] * 60 + u[2] + s[1] * 60 + s[2]}'; }
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
  # the engine and frontend processes: `resin serve`'s children (spawned Python processes)
  top=$(pgrep -P "$server" -f resin_app | head -1)
  roles=$(pgrep -P "${top:-$server}" -f spawn_main | tr '\n' ' ')
  # shellcheck disable=SC2086
  before=$(ticks $roles | tr '\n' ' '); children_s > "$scratch/c0"
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
  # shellcheck disable=SC2086
  after=$(ticks $roles | tr '\n' ' '); children_s > "$scratch/c1"
  kill -TERM "$server"; timeout 60 tail --pid="$server" -f /dev/null; kill -KILL "$server" 2>/dev/null
  "$PY" - "$OUT/fake_$i.jsonl" "$flags" "$before" "$after" \
    "$(cat "$scratch/c0")" "$(cat "$scratch/c1")" \
    "$((CLIENTS * per * 2 * TOKENS))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
tok = sum(r["output_tok_s"] for r in runs)
failed = sum(r["failed"] for r in runs)
print(f"flags [{sys.argv[2].strip() or 'default'}]: {tok:,.0f} output tok/s from {len(runs)} "
      f"clients, failed {failed}")
before, after = ([int(x) for x in a.split()] for a in sys.argv[3:5])
tokens, hz = int(sys.argv[7]), int(sys.argv[8])
# spawn order: the engine process(es) first, then the frontends
cpu = [f"{1e6 * (b - a) / hz / tokens:.1f}" for a, b in zip(before, after)]
clients = 1e6 * (float(sys.argv[6]) - float(sys.argv[5])) / tokens
print(f"  CPU us per output token: processes (engines, then frontends) {' / '.join(cpu)}; "
      f"clients together {clients:.1f}")
PY
done
