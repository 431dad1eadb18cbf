"""Recipe throughput: render a conversation, and parse a long response token by token.

Prints a table and appends JSONL rows (--output). Needs the npm tokenizers
(scripts/fetch_test_assets.sh). Run: resin bench recipes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from resin.recipe import Message, Recipe, get_native_recipe
from resin.tokenizer import Tokenizer

NPM = Path(__file__).resolve().parents[1] / ".cache" / "npm-tokenizers"
REPLY = {
    "qwen3": '<think>\n{r}\n</think>\n\n{t}<tool_call>\n{{"name": "f", "arguments": {{}}}}\n'
    "</tool_call>",
    "llama3": "{t}",
    "gpt_oss": "<|channel|>analysis<|message|>{r}<|end|><|start|>assistant<|channel|>final"
    "<|message|>{t}",
}
PACKAGES = {"qwen3": "qwen3", "llama3": "llama3", "gpt_oss": "gptoss"}


def _bench(name: str, recipe: Recipe, tokenizer: Tokenizer) -> dict[str, float | str | int]:
    messages = [Message("system", "Be helpful."), Message("user", "Tell me a story. " * 50)]
    start = time.perf_counter()
    for _ in range(50):
        recipe.render(messages)
    render_ms = (time.perf_counter() - start) / 50 * 1e3
    words = "The quick brown fox 😀 jumps over the lazy dog, café 中文. " * 60
    ids = tokenizer.encode(REPLY[name].format(r=words, t=words))
    start = time.perf_counter()
    parser = recipe.create_parser(recipe.render(messages))
    for token in ids:
        parser.feed([token])
    parser.finish()
    seconds = time.perf_counter() - start
    return {
        "recipe": name,
        "render_ms": round(render_ms, 3),
        "tokens": len(ids),
        "parse_tokens_per_s": round(len(ids) / seconds),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resin bench recipes", description=__doc__)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for name, package in PACKAGES.items():
        tokenizer = Tokenizer.from_dir(NPM / f"tokenizer-{package}" / "package" / "models")
        rows.append(_bench(name, get_native_recipe(name, tokenizer), tokenizer))
    print(f"{'recipe':<10} {'render ms':>10} {'tokens':>7} {'parse tok/s':>12}")
    for row in rows:
        print(
            f"{row['recipe']:<10} {row['render_ms']:>10} {row['tokens']:>7} "
            f"{row['parse_tokens_per_s']:>12}"
        )
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("a", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
