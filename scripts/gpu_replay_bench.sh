#!/usr/bin/env bash
# HTTP / Engine on one workload, `resin serve` with its DEFAULT flags (engine process +
# `auto` frontend processes), then the zero-cost runner at 1,024 streams (docs/benchmarks.md
# "HTTP / Engine on one workload"; issue 35's acceptance: >= 0.97 / 0.97 / 0.95 at c=1 / 64 /
# 256, >= 150k output tok/s):
#   1. a random Llama-3.1-8B folder (`resin bench checkpoint --preset llama-8b`; reused when
#      $CKPT holds one already, the same path scripts/gpu_serve_bench.sh uses);
#   2. `resin serve --device cuda --checkpoint $CKPT` (no other flag), `resin bench serve
#      --output` at c=1, 64 and 256 (200-word prompts, 256 tokens out, --ignore-eos; c=256 from
#      $CLIENTS client processes, so the load generator is not the limit), one workload file
#      each;
#   3. `resin bench replay` of the three workloads through the Engine alone (loaded once, the
#      GPU freed by the server first), printing HTTP / Engine per concurrency;
#   4. `resin serve --fake-runner --checkpoint $CKPT` (default flags; the folder gives only
#      its tokenizer and template) at 1,024 streams from 8 client processes.
# $TOKENIZER (optional): the tokenizer folder `bench checkpoint` copies (default: the default
# model's, converted from its GGUF): a folder of the default model's tokenizer files lets a
# GPU machine without the 98 MB GGUF run the whole script in one call.
# $ROUNDS (default 1): each concurrency's HTTP workload that many times (http_c64.jsonl,
# http_c64_r2.jsonl, ...), each replayed through the Engine; the summary prints every round's
# ratio and their median, so a ratio near its target is told from the run-to-run spread.
# Everything under `timeout`; JSONL and logs under $OUT. About 6 minutes on a 16-core H200 host
# (most of it the checkpoint, ~16 GB written, and two model loads).
#   OUT=/tmp/out scripts/gpu_replay_bench.sh
# CPU smoke run of the plumbing (tiny model, reference runner, a few requests):
#   OUT=/tmp/out SMOKE=1 scripts/gpu_replay_bench.sh
set -euo pipefail
OUT="${OUT:?set OUT to a folder}"
PY="${PY:-python}"
PORT="${PORT:-8791}"
URL="http://127.0.0.1:${PORT}"
CLIENTS="${CLIENTS:-4}"
ROUNDS="${ROUNDS:-1}"
if [ -n "${SMOKE:-}" ]; then
  # one torch thread, as `resin serve` gives its engine process beside a frontend on 2 cores
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  PRESET=tiny DEVICE=cpu RUNNER=torch
  N1=2 N64=8 N256=16 C64=4 C256=8 WORDS=20 TOKENS=8 FAKE_STREAMS=64 FAKE_CLIENTS=2
else
  PRESET=llama-8b DEVICE=cuda RUNNER=cuda
  N1=8 N64=128 N256=512 C64=64 C256=256 WORDS=200 TOKENS=256 FAKE_STREAMS=1024 FAKE_CLIENTS=8
fi
CKPT="${CKPT:-/tmp/resin-${PRESET}-random}"
mkdir -p "$OUT"
rm -f "$OUT"/http_c*.jsonl "$OUT"/replay.jsonl "$OUT"/fake_s*.jsonl

server=""
stop_server() {  # SIGTERM to `resin serve` (via `timeout`): it stops its frontends, then its
  # engine processes; whatever of its process group is left after a minute is killed
  if [ -n "$server" ]; then
    kill -TERM "$server" 2>/dev/null || true
    timeout 60 tail --pid="$server" -f /dev/null || true
    kill -KILL -- -"$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=""
  fi
}
trap stop_server EXIT

serve() {  # serve LOG ARGS...: start `resin serve ARGS` in its own group, wait for /health 200
  local log="$1"; shift
  set -m
  timeout 900 "$PY" -m resin_app serve --port "$PORT" --disable-log-requests "$@" >"$log" 2>&1 &
  server=$!
  set +m
  local start=$SECONDS
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]; do
    if ! kill -0 "$server" 2>/dev/null || [ $((SECONDS - start)) -gt 600 ]; then
      cat "$log"; echo "resin serve did not become ready" >&2; exit 1
    fi
    sleep 0.2
  done
  echo "ready after $((SECONDS - start)) s: $(grep -o 'resin: serving.*' "$log" | tail -1)"
}

load() {  # load FILE PROMPTS CONCURRENCY CLIENTS: CLIENTS processes share the load, one FILE
  local per=$(( $3 / $4 )) pids=()
  for c in $(seq "$4"); do
    timeout 300 "$PY" -m resin_app bench serve --url "$URL" --endpoint chat \
      --input-len "$WORDS" --output-len "$TOKENS" --ignore-eos --max-concurrency "$per" \
      --num-prompts $(( $2 / $4 )) --seed "$c" --output "$1" >"${1%.jsonl}_client$c.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
}

# 1. the checkpoint folder (once)
if [ ! -f "$CKPT/model.safetensors.index.json" ]; then
  timeout 600 "$PY" -m resin_app bench checkpoint --preset "$PRESET" --output "$CKPT" \
    --device "$DEVICE" ${TOKENIZER:+--tokenizer "$TOKENIZER"}
fi

# 2. the server with default flags, a workload per concurrency
serve "$OUT/serve.log" --device "$DEVICE" --checkpoint "$CKPT"
workloads=()
for round in $(seq "$ROUNDS"); do
  suffix=""; [ "$round" = 1 ] || suffix="_r$round"
  load "$OUT/http_c1$suffix.jsonl" "$N1" 1 1
  load "$OUT/http_c64$suffix.jsonl" "$N64" "$C64" 1
  load "$OUT/http_c256$suffix.jsonl" "$N256" "$C256" "$CLIENTS"
  workloads+=("$OUT/http_c1$suffix.jsonl" "$OUT/http_c64$suffix.jsonl" "$OUT/http_c256$suffix.jsonl")
done
stop_server

# 3. the same three workloads through the Engine alone
timeout 900 "$PY" -m resin_app bench replay --workload "${workloads[@]}" --line all --checkpoint "$CKPT" --device "$DEVICE" --runner "$RUNNER" \
  --output "$OUT/replay.jsonl" 2>&1 | tee "$OUT/replay.log"

# 4. the zero-cost runner, default flags, FAKE_STREAMS streams (2 rounds each); the tokenizer
# and template are $CKPT's (the default model's, copied by `bench checkpoint`), so no GGUF is
# needed on the machine when $TOKENIZER names a folder holding the default model's tokenizer
serve "$OUT/serve_fake.log" --fake-runner --checkpoint "$CKPT"
load "$OUT/fake_s${FAKE_STREAMS}.jsonl" $(( FAKE_STREAMS * 2 )) "$FAKE_STREAMS" "$FAKE_CLIENTS"
stop_server

"$PY" - "$OUT" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
targets = [0.97, 0.97, 0.95]  # the three concurrencies, lowest first
print("HTTP / Engine, one workload each, resin serve with default flags:")
rows = [json.loads(line) for line in (out / "replay.jsonl").read_text().splitlines() if line]
ratios: dict[int, list[float]] = {}
for row in rows:
    w = row["workload"]
    ratio = row["http_over_engine"]
    ratios.setdefault(w["max_concurrency"], []).append(ratio)
    print(f"  c={w['max_concurrency']:>4} ({w['clients']} client(s), {w['requests']} requests): "
          f"HTTP {row['http_output_tok_s']:,.0f} / Engine {row['output_tok_s']:,.0f} output tok/s"
          f" = {ratio:.1%}")
for (c, got), target in zip(sorted(ratios.items()), targets):
    median = statistics.median(got)
    print(f"  c={c:>4}: median of {len(got)} = {median:.1%} (each {', '.join(f'{r:.1%}' for r in got)};"
          f" target {target:.0%}: {'met' if median >= target else 'MISSED'})")
for path in sorted(out.glob("fake_s*.jsonl")):
    runs = [json.loads(line) for line in path.read_text().splitlines() if line]
    tok = sum(r["output_tok_s"] for r in runs)  # the clients ran together
    failed = sum(r["failed"] for r in runs)
    print(f"zero-cost runner, default flags, {path.stem.removeprefix('fake_s')} streams from "
          f"{len(runs)} clients: {tok:,.0f} output tok/s (target 150,000), failed {failed}")
PY
