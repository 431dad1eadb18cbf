"""Build what `resin serve` serves: engine + chat format + tokenizer, from a checkpoint or
the default model, with a tqdm progress bar; or the zero-cost fake for load testing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from resin.server.ports import ChatFormat, EngineLike, TokenizerLike


@dataclass(frozen=True)
class LoadOptions:
    checkpoint: str | None = None
    model: str | None = None
    device: str = "cpu"
    context_length: int | None = None
    prefix_cache: bool = True
    recipe: str | None = None
    fake: bool = False


@dataclass(frozen=True)
class Loaded:
    engine: EngineLike
    chat: ChatFormat
    tokenizer: TokenizerLike
    name: str
    context_length: int


def check_recipe_name(name: str | None) -> None:
    """An unknown `--recipe` is a startup error that lists the known names (checked before
    any weights load), never a silent fall-back to a plain template."""
    if name is None:
        return
    from resin.recipe.registry import native_recipe_names

    known = (*native_recipe_names(), "jinja")
    if name.lower().replace("-", "_") not in known:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(known)}")


def load(options: LoadOptions, progress: bool = True) -> Loaded:
    check_recipe_name(options.recipe)
    if options.fake and options.recipe is not None:
        raise ValueError("--recipe does not apply to --fake-runner (it has its own chat format)")
    if options.fake:
        return load_fake(options.context_length or 4096, options.prefix_cache)
    from tqdm import tqdm

    steps = ["locate checkpoint", "load weights", "load tokenizer", "start engine"]
    with tqdm(total=len(steps), desc="loading", disable=not progress, unit="step") as bar:
        bar.set_postfix_str(steps[0])
        from resin_models_torch.default_model import DEFAULT_MODEL_NAME, resolve_checkpoint

        folder = resolve_checkpoint(options.checkpoint or options.model or DEFAULT_MODEL_NAME)
        bar.update()
        bar.set_postfix_str(steps[1])
        from resin_models_torch.registry import load_runner

        runner = load_runner(folder, device=options.device)
        bar.update()
        bar.set_postfix_str(steps[2])
        from resin.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_dir(folder)
        chat = chat_format(tokenizer, options.recipe)
        bar.update()
        bar.set_postfix_str(steps[3])
        from resin.engine import Engine

        context = context_length_of(folder, options.context_length)
        real = Engine(runner, prefix_cache=options.prefix_cache, context_length=context)
        engine = cast(EngineLike, cast(object, real))
        bar.update()
    name = options.model or (_name_of(options.checkpoint) if options.checkpoint else None)
    name = name or DEFAULT_MODEL_NAME
    return Loaded(engine, chat, tokenizer, name, context)


def chat_format(tokenizer: Any, recipe: str | None) -> ChatFormat:
    """The named recipe (its errors — say, a tokenizer without the family's special tokens —
    stop the start); unnamed, a native recipe when `resin.recipe` has one for this tokenizer,
    else the template."""
    from resin.server.recipe_adapter import RecipeChatFormat

    if recipe is not None:
        return RecipeChatFormat.load(tokenizer, recipe)
    try:
        return RecipeChatFormat.load(tokenizer, None)
    except (LookupError, ValueError):
        pass
    from resin.server.adapters import TemplateChatFormat

    return TemplateChatFormat(tokenizer)


def load_fake(context_length: int = 4096, prefix_cache: bool = True) -> Loaded:
    """The real engine with a zero-cost runner (`resin serve --fake-runner`): everything a
    load test measures is HTTP, actor and engine overhead."""
    from resin.engine import Engine
    from resin.server.testing import ByteTokenizer, ChatMLFormat, ZeroCostRunner

    tok = ByteTokenizer()
    engine = Engine(
        ZeroCostRunner(),
        context_length=context_length,
        prefix_cache=prefix_cache,
        max_sequences=512,
    )
    return Loaded(cast(EngineLike, engine), ChatMLFormat(tok), tok, "fake", context_length)


def _name_of(folder: str) -> str:
    return folder.rstrip("/").rsplit("/", 1)[-1] or "resin"


def context_length_of(folder: Any, requested: int | None) -> int:
    """The checkpoint's trained context (config.json), or less when asked."""
    import json
    from pathlib import Path

    config = Path(folder) / "config.json"
    trained = None
    if config.is_file():
        trained = json.loads(config.read_text(encoding="utf-8")).get("max_position_embeddings")
    limit = int(trained) if isinstance(trained, int) and trained > 0 else 32768
    return min(requested, limit) if requested else limit
