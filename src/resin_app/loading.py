"""What `resin serve` and `resin chat` load: engine + recipe + tokenizer, from a checkpoint or
the default model, with a tqdm progress bar; or, for load tests (`--fake-runner`), the real
engine with `ZeroCostRunner` and the default model's tokenizer and recipe."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from resin.engine import Engine
from resin.generation_config import NO_DEFAULTS, GenerationDefaults
from resin.generation_config import resolve as resolve_defaults
from resin.protocols import RunnerConfig
from resin.recipe import Recipe
from resin.tokenizer import Tokenizer


@dataclass(frozen=True)
class LoadOptions:
    checkpoint: str | None = None
    model: str | None = None
    device: str = "cpu"
    context_length: int | None = None
    prefix_cache: bool = True
    recipe: str | None = None
    fake: bool = False
    generation_config: str = "auto"
    """auto | none | a JSON file (`resin.generation_config`)."""
    overlap: bool | None = None
    """Pipeline decode steps (`Engine(overlap=...)`): None = when the runner supports it."""
    speculative: str | None = None
    """None, "ngram" or "draft" (`speculation_for`)."""
    draft_model: str | None = None
    num_draft_tokens: int = 4
    tensor_parallel: int = 1
    """Ranks per replica (`resin_app.worker.checkpoint_replicas` starts the workers)."""
    data_parallel: int = 1
    """Engine replicas behind one server (docs/distributed.md)."""
    runner: str = "auto"
    """`--runner auto|cuda|torch` (`resin_app.runners.choose_family`)."""
    max_sequences: int | None = None
    """Sequences at once (`Engine(max_sequences=...)`, the fast runner's largest graph)."""
    max_batch_tokens: int | None = None
    """Query tokens per step (`Engine(max_batch_tokens=...)`)."""
    memory_fraction: float | None = None
    kv_cache_bytes: int | None = None
    """The KV arena's size (`--kv-cache-memory`); None: the runner family's default."""
    """Share of the device's free memory for weights + KV arena (`BuildRequest`)."""
    cuda_graphs: bool = True
    graph_prefill_tokens: int | None = None
    """Prefill rows up to this many tokens replay CUDA graphs (fast runner; None: its 16)."""
    load_format: str = "auto"
    """`auto`: the checkpoint's weights; `dummy`: random weights of its config (its tokenizer,
    template and generation defaults real), as vLLM's `--load-format dummy`: serving
    benchmarks of models whose weights are not on the disk."""
    template_limits: tuple[int, int, float] | None = None
    """A Jinja chat template's (max chars, max call depth, seconds) per render
    (`resin.recipe.template_limits`; None: its defaults)."""


@dataclass(frozen=True)
class Loaded:
    engines: tuple[Engine, ...]
    """Every replica's engine (one without --data-parallel)."""
    recipe: Recipe
    tokenizer: Tokenizer
    name: str
    context_length: int
    defaults: GenerationDefaults = NO_DEFAULTS
    job: Any = None
    """The `LocalJob` of spawned tensor-parallel workers, if any."""

    @property
    def engine(self) -> Engine:
        """The first replica's engine (the only one without --data-parallel)."""
        return self.engines[0]

    def close(self) -> None:
        """Close every engine, then reap the workers and leave the process group."""
        for engine in self.engines:
            engine.close()
        if self.job is not None:
            self.job.wait()
            from resin.backend.topology import shutdown

            shutdown()


def check_recipe_name(name: str | None) -> None:
    """An unknown `--recipe` is a startup error that lists the known names (checked before
    any weights load), never a silent fall-back to a plain template."""
    if name is None:
        return
    from resin.recipe.registry import native_recipe_names

    known = (*native_recipe_names(), "jinja")
    if name.lower().replace("-", "_") not in known:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(known)}")


def load(
    options: LoadOptions, progress: bool = True, on_stage: Callable[[str], None] | None = None
) -> Loaded:
    """Everything `resin serve` serves, warmed up: every engine has run one real prompt
    through prefill and decode (CUDA graphs captured before that, at engine start).
    `on_stage` hears each step's name as it begins (the readiness a server reports)."""
    check_options(options)
    started = time.perf_counter()
    if options.fake:
        loaded = load_fake(options)
        warm_up(loaded)
        return loaded
    from tqdm import tqdm

    steps = ["locate checkpoint", "load weights", "load tokenizer", "start engine", "warm up"]
    with tqdm(total=len(steps), desc="loading", disable=not progress, unit="step") as bar:

        def stage(i: int) -> None:
            if i:
                bar.update()
            bar.set_postfix_str(steps[i])
            if on_stage is not None:
                on_stage(steps[i])

        stage(0)
        from resin_model.default_model import DEFAULT_MODEL_NAME

        def converting(gguf: Any) -> None:  # its own line: minutes on a slow disk, once
            bar.set_postfix_str(f"convert {gguf.name} (once)")
            bar.write(converting_line(gguf), file=sys.stderr)

        folder = served_folder(options, converting)
        checked = check_folder(folder, options)
        if checked is not None:
            check_memory(checked, options)  # before anything is allocated
        context = context_length_of(folder, options.context_length)
        stage(1)
        with startup_errors():
            runners, job = replica_runners(options, folder, context, bar.write)
        stage(2)
        tokenizer = checkpoint_tokenizer(folder)
        recipe = with_vision(recipe_for(tokenizer, options.recipe), tokenizer, folder)
        with_template_limits(recipe, options)
        stage(3)
        engines = start_engines(runners, options, tokenizer, context)
        name = options.model or (_name_of(options.checkpoint) if options.checkpoint else None)
        defaults = resolve_defaults(options.generation_config, folder)
        loaded = Loaded(
            engines, recipe, tokenizer, name or DEFAULT_MODEL_NAME, context, defaults, job
        )
        stage(4)
        warm_up(loaded)
        bar.update()
    bar.write(ready_line(loaded, runners, time.perf_counter() - started), file=sys.stderr)
    return loaded


def check_folder(folder: Any, options: LoadOptions) -> Any:
    """The served folder checked before anything opens it (`check_checkpoint`): its config
    and tokenizer, and with `--load-format auto` its weights' headers against the config (the
    `CheckedCheckpoint`; None for `dummy`, which reads no weights)."""
    from resin_model.checkpoint_folder import check_checkpoint, check_checkpoint_config

    if options.load_format == "dummy":
        check_checkpoint_config(folder)
        return None
    return check_checkpoint(folder)


def check_memory(checked: Any, options: LoadOptions) -> None:
    """A `CheckpointError` when the model's weights (`CheckedCheckpoint`), as the runner holds
    them (float32 on a CPU; on a GPU bf16, or their stored bytes when fewer; shared by the
    tensor-parallel ranks), exceed the memory the device has available now."""
    from resin_model.checkpoint_folder import CheckpointError

    device = options.device.split(":", 1)[0]
    if device == "cpu":
        need, have, where = checked.parameter_count * 4, available_ram(), "available RAM"
    elif device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return
        index = torch.device(options.device).index or 0
        # bf16 at most (a float32 folder is cast), less when stored quantized
        need = min(checked.weight_bytes, checked.parameter_count * 2)
        have = int(torch.cuda.mem_get_info(index)[0])
        where = f"free memory on {options.device}"
    else:
        return
    need //= options.tensor_parallel
    if have is not None and need > have:
        raise CheckpointError(
            f"the model needs {need / 2**30:.1f} GiB for its weights; the {where} is "
            f"{have / 2**30:.1f} GiB"
        )


def available_ram() -> int | None:
    """`MemAvailable` of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_options(options: LoadOptions) -> None:
    """Every option check that needs no weights (a `ValueError` saying what is wrong)."""
    check_recipe_name(options.recipe)
    if options.template_limits is not None and not (
        options.template_limits[0] >= 1
        and options.template_limits[1] >= 1
        and options.template_limits[2] > 0
    ):
        raise ValueError("--template-max-chars, --template-max-depth, --template-timeout > 0")
    check_speculative(options)
    check_parallel(options)
    if options.load_format not in LOAD_FORMATS:
        raise ValueError(f"--load-format {options.load_format!r}: one of {', '.join(LOAD_FORMATS)}")
    check_checkpoint_exists(options.checkpoint)


LOAD_FORMATS = ("auto", "dummy")
"""`--load-format` (`LoadOptions.load_format`)."""


def check_checkpoint_exists(checkpoint: str | None) -> None:
    """A `--checkpoint` that names nothing is refused before the port is taken or any process
    starts (one line, exit 2), not deep in the loader."""
    from pathlib import Path

    if checkpoint is not None and not Path(checkpoint).expanduser().exists():
        raise ValueError(
            f"--checkpoint {checkpoint}: no such file or folder (give a Hugging Face folder "
            "or a .gguf file; without --checkpoint the default model is served)"
        )


def start_engines(
    runners: Sequence[Any], options: LoadOptions, tokenizer: Any, context: int
) -> tuple[Engine, ...]:
    """One engine per runner (each binds its runner: the KV arena is allocated and the CUDA
    graphs captured here), after checking that the arena holds one `context`-token sequence
    (the knobs named are the device's)."""
    engines: list[Engine] = []
    on_cuda = options.device.split(":", 1)[0] == "cuda"
    with startup_errors():
        for runner in runners:
            check_arena(getattr(runner, "runner_config", None), context, on_cuda)
            engines.append(
                Engine(
                    runner,
                    prefix_cache=options.prefix_cache,
                    context_length=context,
                    grammar=grammar_backend(tokenizer),
                    overlap=options.overlap,
                    speculation=speculation_for(options, context, runner),
                    **engine_sizes(options),
                )
            )
    return tuple(engines)


KNOBS = "lower --max-model-len or --max-num-seqs, or raise --gpu-memory-utilization"
CPU_KNOBS = "raise --kv-cache-memory or lower --max-model-len"


def check_arena(rc: Any, context: int, on_cuda: bool = True) -> None:
    """A `ValueError` naming the knobs when the runner's KV arena (`RunnerConfig`: pages, or
    bytes) cannot hold one sequence of `context` tokens."""
    if not isinstance(rc, RunnerConfig) or rc.page_bytes <= 0:
        return
    pages = rc.num_pages if rc.num_pages is not None else None
    if pages is None and rc.cache_bytes is not None:
        pages = rc.cache_bytes // rc.page_bytes
    if pages is None:
        return
    need = -(-(context + 1) // rc.page_size)
    if pages < need:
        raise ValueError(
            f"the KV arena holds {pages} pages ({pages * rc.page_size} tokens), not one "
            f"sequence of --max-model-len {context} ({need} pages): "
            f"{KNOBS + ' or --kv-cache-memory' if on_cuda else CPU_KNOBS}"
        )


@contextmanager
def startup_errors() -> Iterator[None]:
    """Device out-of-memory while loading or binding becomes a `ValueError` naming the
    knobs that decide the memory (the CLI prints it and exits 2)."""
    try:
        yield
    except Exception as exc:
        if type(exc).__name__ != "OutOfMemoryError" and "out of memory" not in str(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"out of device memory while starting ({first}): {KNOBS}") from exc


WARM_UP_TEXT = "Hello"


def warm_up(loaded: Loaded) -> None:
    """One real prompt through every engine, greedy: a prefill step and a decode step (the
    first step of each kind compiles or loads whatever is lazy), before the server is ready.
    A runner that fails it fails the start."""
    from resin.events import FinishedEvent, FinishReason
    from resin.params import SamplingParams

    vocab = loaded.engine.runner_config.vocab_size or 1 << 31
    prompt = [t for t in loaded.tokenizer.encode(WARM_UP_TEXT) if t < vocab] or [0]
    params = SamplingParams(max_output_tokens=2, temperature=0.0, ignore_stop_tokens=True)
    for engine in loaded.engines:
        request = engine.submit(prompt, params)
        finished: list[FinishedEvent] = []
        while engine.has_work():
            finished += [e for e in engine.step() if isinstance(e, FinishedEvent)]
        if [f.reason for f in finished] != [FinishReason.LENGTH]:
            raise ValueError(f"the warm-up request did not finish: {finished}")
        request.take_result()


def ready_line(loaded: Loaded, runners: Sequence[Any], seconds: float) -> str:
    """The startup log's summary: the arena (pages, tokens), captured graph batch sizes, time
    to ready."""
    layout = loaded.engine.layout
    graphs = getattr(runners[0], "captured_batches", ()) if runners else ()
    captured = ", ".join(map(str, graphs)) if graphs else "none"
    replicas = f" x {len(loaded.engines)} replicas" if len(loaded.engines) > 1 else ""
    return (
        f"resin: ready in {seconds:.1f} s: KV arena {layout.num_pages} pages of "
        f"{layout.page_size} tokens ({layout.num_pages * layout.page_size} tokens){replicas}; "
        f"{loaded.engine.arena}; CUDA graphs for batch sizes: {captured}"
    )


def replica_runners(
    options: LoadOptions, folder: Any, context: int, say: Any = print
) -> tuple[list[Any], Any]:
    """The runner of every replica, from the family `--runner` picks (`choose_family`; its
    reason for not taking the fast runner goes to `say` as one line), and the tensor-parallel
    workers' job (None with one rank)."""
    from resin_app.runners import choose_family, fast_architectures, model_type_of
    from resin_app.worker import checkpoint_replicas
    from resin_model.family import BuildRequest

    on_cuda = options.device.split(":", 1)[0] == "cuda"
    choice = choose_family(
        options.runner,
        device=options.device,
        model_type=model_type_of(folder),
        fast=fast_architectures() if on_cuda else None,
        tensor_parallel=options.tensor_parallel,
    )
    if choice.reason is not None:
        say(f"resin: runner: {choice.reason}", file=sys.stderr)
    request = BuildRequest(
        options.device,
        max_sequences=options.max_sequences or ENGINE_MAX_SEQUENCES,
        context_length=context,
        memory_fraction=options.memory_fraction,
        cuda_graphs=options.cuda_graphs,
        graph_prefill_tokens=options.graph_prefill_tokens,
        mtp=options.speculative == "mtp",
        kv_cache_bytes=options.kv_cache_bytes,
    )
    return checkpoint_replicas(
        folder,
        device=options.device,
        tensor_parallel=options.tensor_parallel,
        data_parallel=options.data_parallel,
        family=choice.family,
        request=request,
        dummy=options.load_format == "dummy",
    )


ENGINE_MAX_SEQUENCES = 256
"""The `Engine`'s own default row cap, which sizes the fast runner's graphs when unset."""

ZERO_COST_MAX_SEQUENCES = 512
"""The zero-cost runner's row cap (`--fake-runner`): its steps cost nothing, so a wider batch
measures the server rather than a cap."""


def engine_sizes(options: LoadOptions) -> dict[str, Any]:
    """The `Engine` sizing keywords the options set (the engine's defaults for the rest)."""
    sizes = {"max_sequences": options.max_sequences, "max_batch_tokens": options.max_batch_tokens}
    return {k: v for k, v in sizes.items() if v is not None}


def converting_line(gguf: Any) -> str:
    return f"resin: converting {gguf.name} into a Hugging Face folder (once, then cached)"


def check_parallel(options: LoadOptions) -> None:
    """`--tensor-parallel` / `--data-parallel` and the sizes make sense (checked before any
    weights load)."""
    if options.tensor_parallel < 1 or options.data_parallel < 1:
        raise ValueError("--tensor-parallel and --data-parallel must be >= 1")
    if options.fake and options.tensor_parallel > 1:
        raise ValueError("--tensor-parallel shards a model; --fake-runner has none")
    if options.load_format == "dummy" and options.tensor_parallel > 1:
        raise ValueError("--load-format dummy runs one rank a replica (no --tensor-parallel)")
    for flag, value in (
        ("--max-num-seqs", options.max_sequences),
        ("--max-num-batched-tokens", options.max_batch_tokens),
        ("--max-model-len", options.context_length),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1")
    if options.kv_cache_bytes is not None and options.kv_cache_bytes < 1:
        raise ValueError("--kv-cache-memory must be a positive size")
    fraction = options.memory_fraction
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {fraction}")


def with_vision(recipe: Recipe, tokenizer: Tokenizer, folder: Any) -> Recipe:
    """Images exactly when the checkpoint has a vision tower (`config.json` `vision_config`):
    a vision checkpoint renders through its own template with the family's image handling
    (`resin.recipe.vision.vision_for`); any other recipe refuses images."""
    import json
    from pathlib import Path

    from resin.recipe import JinjaRecipe
    from resin.recipe.vision import vision_for

    path = Path(folder) / "config.json"
    vision = vision_for(json.loads(path.read_text())) if path.is_file() else None
    if vision is None:
        if isinstance(recipe, JinjaRecipe):
            recipe.set_vision(None)
        return recipe
    jinja = recipe if isinstance(recipe, JinjaRecipe) else JinjaRecipe(tokenizer)
    jinja.set_vision(vision)
    return jinja


def served_folder(options: LoadOptions, on_convert: Callable[[Any], None] | None = None) -> Any:
    """The folder `resin serve` reads: `--checkpoint`'s or `--model`'s, else the default
    model's (a GGUF converted once, `on_convert` told first); `--fake-runner` reads only its
    tokenizer and chat template."""
    from resin_model.default_model import DEFAULT_MODEL_NAME, resolve_checkpoint

    return resolve_checkpoint(options.checkpoint or options.model or DEFAULT_MODEL_NAME, on_convert)


def checkpoint_tokenizer(folder: Any) -> Tokenizer:
    """The checkpoint's tokenizer; a file the tokenizers library cannot read is a
    `CheckpointError` naming the folder (that library raises plain `Exception`s)."""
    from resin_model.checkpoint_folder import CheckpointError

    try:
        return Tokenizer.from_dir(folder)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"the tokenizer of {folder} cannot be read: {reason}") from None


def with_template_limits(recipe: Recipe, options: LoadOptions) -> Recipe:
    """`recipe`, rendering within `options.template_limits` when it renders a Jinja template."""
    from resin.recipe import JinjaRecipe
    from resin.recipe.template_limits import TemplateLimits

    if isinstance(recipe, JinjaRecipe) and options.template_limits is not None:
        chars, depth, seconds = options.template_limits
        recipe.limits = TemplateLimits(max_chars=chars, max_depth=depth, timeout_s=seconds)
    return recipe


def recipe_for(tokenizer: Tokenizer, name: str | None) -> Recipe:
    """The named recipe (its errors, say a tokenizer without the family's special tokens, stop
    the start); unnamed, `resin.recipe.load_recipe`'s choice: the native recipe of the
    template's family when it renders alike, else `JinjaRecipe`; ChatML for a template-less
    tokenizer with ChatML tokens. Neither template nor known tokens is a startup error."""
    from resin.recipe import load_recipe

    try:
        return load_recipe(tokenizer, name)
    except ValueError as exc:
        if name is not None:
            raise
        raise ValueError(f"{exc}: pass --recipe NAME") from None


def grammar_backend(tokenizer: Any) -> Any:
    """The constrained-decoding backend for `tokenizer` (None when llguidance is missing:
    constrained requests then get a 400 saying so)."""
    try:
        from resin.engine.grammar import GrammarBackend

        return GrammarBackend.from_tokenizer(tokenizer)
    except ImportError:
        return None


def check_speculative(options: LoadOptions) -> None:
    """The speculative-decoding options make sense together (checked before any weights load)."""
    if options.speculative not in (None, "ngram", "draft", "mtp"):
        raise ValueError(f"unknown --speculative {options.speculative!r} (ngram, draft or mtp)")
    if options.draft_model is not None and options.speculative != "draft":
        raise ValueError("--draft-model needs --speculative draft")
    if options.speculative == "draft" and options.draft_model is None:
        raise ValueError("--speculative draft needs --draft-model NAME_OR_FOLDER")
    if options.num_draft_tokens < 1:
        raise ValueError("--num-draft-tokens must be >= 1")


def speculation_for(options: LoadOptions, context_length: int, runner: Any = None) -> Any:
    """The engine's `Speculation` for `--speculative ngram|draft|mtp` (None without it). A
    draft model must share the target's tokenizer; it runs on the same device. `mtp`: the
    drafts `runner` computes with its checkpoint's MTP layer (built with `BuildRequest.mtp`),
    one per step."""
    check_speculative(options)
    if options.speculative is None:
        return None
    from resin.engine.proposers import DraftModelProposer, NgramProposer
    from resin.engine.speculative import Speculation

    if options.speculative == "ngram":
        return Speculation(NgramProposer(), options.num_draft_tokens)
    if options.speculative == "mtp":
        from resin.engine.proposers import MtpProposer

        if not hasattr(runner, "drafts"):
            raise ValueError("--speculative mtp needs a runner built with its MTP layer")
        return Speculation(MtpProposer(), 1)
    assert options.draft_model is not None
    from resin_app.runners import build_runner
    from resin_model.checkpoint_folder import check_checkpoint
    from resin_model.default_model import resolve_checkpoint
    from resin_model.family import BuildRequest

    folder = resolve_checkpoint(options.draft_model)
    check_checkpoint(folder, tokenizer=False)
    runner = build_runner(folder, "torch", BuildRequest(options.device))
    proposer = DraftModelProposer(runner, context_length=context_length)
    return Speculation(proposer, options.num_draft_tokens)


class ZeroCostRunner:
    """A runner for the real `Engine` that computes nothing: every sampling row gets
    `token_id` (logprob 0 when asked), or, where the plan's grammar mask forbids it, the
    lowest token the mask allows. All time measured is engine + server overhead."""

    def __init__(self, vocab_size: int, token_id: int, page_size: int = 16) -> None:
        import numpy as np

        from resin.protocols import RunnerConfig

        # It samples nothing, so every feature (penalties included) is as applied as
        # temperature or top-p are: the default `features`.
        self.runner_config = RunnerConfig(vocab_size=vocab_size, page_size=page_size)
        self._token_id = token_id
        self._tokens = np.full(1 << 16, token_id, dtype=np.uint32)

    def forward(self, plan: Any) -> Any:
        import numpy as np

        from resin.plan import ForwardOutput

        rows = np.asarray(plan.sample_rows, dtype=bool)
        indptr = np.zeros(rows.size + 1, dtype=np.uint32)
        np.cumsum(rows, out=indptr[1:])
        n, t = int(indptr[-1]), len(plan.input_ids)
        tokens = self._tokens[:n]
        if plan.sampling.token_bitmask is not None:
            tokens = self._allowed(plan.sampling.token_bitmask[rows], tokens)
        # Logprobs only when the plan asks, as the real runners answer: an output with them
        # sends every row of the step down the engine's per-row commit path.
        wants = int(plan.sampling.logprobs[rows].max(initial=-1))
        if wants < 0 and not plan.prompt_logprob_rows.any():
            return ForwardOutput(tokens, indptr)
        k = max(0, plan.sampling.max_logprobs)
        pk = max(0, int(plan.sampling.prompt_logprobs.max(initial=-1)))
        return ForwardOutput(
            tokens,
            indptr,
            logprobs=np.zeros(n, dtype=np.float32),
            top_ids=np.full((n, k), self._token_id, dtype=np.int32) if k else None,
            top_logprobs=np.zeros((n, k), dtype=np.float32) if k else None,
            prompt_logprobs=np.zeros(t, dtype=np.float32),
            prompt_top_ids=np.full((t, pk), self._token_id, dtype=np.int32) if pk else None,
            prompt_top_logprobs=np.zeros((t, pk), dtype=np.float32) if pk else None,
        )

    def _allowed(self, mask: Any, tokens: Any) -> Any:
        """`tokens` where each row's mask allows `token_id`, else that row's lowest allowed."""
        import numpy as np

        t = self._token_id
        ok = (mask[:, t // 32] >> (t % 32)) & 1
        if ok.all():
            return tokens
        bits = np.unpackbits(mask.view(np.uint8), axis=1, bitorder="little")
        lowest = bits[:, : self.runner_config.vocab_size].argmax(axis=1).astype(np.uint32)
        return np.where(ok.astype(bool), tokens, lowest)


def load_fake(options: LoadOptions) -> Loaded:
    """`resin serve --fake-runner`: the real engine with `ZeroCostRunner` (it answers the
    token for "a" forever, or what a grammar allows), the tokenizer, recipe (`--recipe`
    applies) and grammar backend of `served_folder` (its weights are never read)."""
    folder = served_folder(options, lambda gguf: print(converting_line(gguf), file=sys.stderr))
    check_folder(folder, options)
    tokenizer = checkpoint_tokenizer(folder)
    context = options.context_length or 4096
    engines = tuple(
        Engine(
            ZeroCostRunner(tokenizer.vocab_size, tokenizer.encode("a")[0]),
            context_length=context,
            prefix_cache=options.prefix_cache,
            **({"max_sequences": ZERO_COST_MAX_SEQUENCES} | engine_sizes(options)),
            grammar=grammar_backend(tokenizer),
            overlap=options.overlap,
            speculation=speculation_for(options, context),  # refused: the runner cannot verify
        )
        for _ in range(options.data_parallel)
    )
    recipe = with_template_limits(recipe_for(tokenizer, options.recipe), options)
    return Loaded(engines, recipe, tokenizer, "fake", context)


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
