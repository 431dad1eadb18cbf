#!/usr/bin/env bash
# The zero-cost runner served split (engine process + frontend processes) and in one process,
# at 256 and 1,024 streams, from several client processes; one JSON line per client run
# under $OUT (docs/benchmarks.md "Engine in its own process"). About 2 minutes on a 16-core
# H200 host (the GPU is not used: this measures the server around the engine).
#   OUT=/tmp/out scripts/gpu_split_bench.sh
set -euo pipefail
OUT=${OUT:-bench-out}
FRONTENDS=${FRONTENDS:-4}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
PORT=8790

serve() {  # serve API_SERVER_COUNT: start `resin serve --fake-runner`, wait for /health
  "$PY" -m resin_app serve --fake-runner --port "$PORT" --api-server-count "$1" \
    --max-active 1024 --queue-capacity 4096 --disable-log-requests --disable-log-stats \
    > "$OUT/server_$1.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return; sleep 0.2; done
  echo "server did not start" >&2; exit 1
}

load() {  # load NAME STREAMS CLIENTS: CLIENTS processes share STREAMS streams, 2 rounds each
  local per=$(( $2 / $3 ))
  local pids=()
  for c in $(seq "$3"); do
    "$PY" -m resin_app bench serve --url "http://127.0.0.1:$PORT" --endpoint chat \
      --input-len 100 --output-len 256 --max-concurrency "$per" --num-prompts $(( per * 2 )) \
      --seed "$c" --output "$OUT/$1_s$2.jsonl" > "$OUT/$1_s$2_client$c.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
}

for mode in split inprocess; do
  if [ "$mode" = split ]; then serve "$FRONTENDS"; else serve 0; fi
  load "$mode" 256 4
  load "$mode" 1024 8
  kill -TERM "$SERVER"; wait "$SERVER" || true
done

"$PY" - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for path in sorted(out.glob("*_s*.jsonl")):
    runs = [json.loads(line) for line in path.read_text().splitlines() if line]
    tok = sum(r["output_tok_s"] for r in runs)  # the clients ran together
    tpot = max(r["tpot_ms"]["p50"] for r in runs)
    itl = max(r["itl_ms"]["p99"] for r in runs)
    failed = sum(r["failed"] for r in runs)
    print(f"{path.stem}: {len(runs)} clients, {tok:,.0f} output tok/s, "
          f"TPOT p50 {tpot:.1f} ms, ITL p99 {itl:.0f} ms, failed {failed}")
PY
