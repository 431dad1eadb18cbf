#!/usr/bin/env bash
# Time a fresh clone's `make serve` until its first chat answer (docs/benchmarks.md, Serving).
# Usage: scripts/first_answer.sh [REPO] [PORT]; prints the seconds and the answer, then stops
# the server. Run it on a quiet machine: the figure is mostly pip installing torch. For a cold
# start, point PIP_CACHE_DIR and RESIN_CACHE_DIR at empty folders.
set -euo pipefail
repo="${1:-$(pwd)}"
port="${2:-8000}"
dir="$(mktemp -d)/resin"
git clone -q "$repo" "$dir"
cd "$dir"
start=$(date +%s.%N)
# Job control gives `make serve` (and the server it starts) a process group of its own, so the
# script stops exactly what it started, by id, also when it fails.
set -m
make serve ARGS="--port ${port}" >"$dir/serve.log" 2>&1 &
server=$!
trap 'kill -- -"${server}" 2>/dev/null || true' EXIT
url="http://127.0.0.1:${port}/v1"
ask() {
    model=$(curl -sf -m 5 "$url/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])') &&
    curl -sf -m 60 "$url/chat/completions" -H 'content-type: application/json' -d \
        '{"model":"'"$model"'","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":16}'
}
until answer=$(ask 2>/dev/null); do
    kill -0 "${server}" 2>/dev/null || { echo "make serve exited; see $dir/serve.log" >&2; exit 1; }
    sleep 1
done
end=$(date +%s.%N)
echo "first answer after $(python3 -c "print(round($end - $start, 1))") s from a fresh clone"
echo "$answer"
