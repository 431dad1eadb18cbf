"""`resin serve | chat | bench | check | worker | quantize`: the command line.

`resin serve` with no arguments serves the default model (SmolLM2-135M-Instruct) with the
prefix cache on at http://127.0.0.1:8000, showing a progress bar while it loads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from resin.frontend.engine_loop import DEFAULT_MAX_ACTIVE

if TYPE_CHECKING:
    from resin_app.loading import LoadOptions


def _serve_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--checkpoint",
        help="a Hugging Face model folder (safetensors) or a .gguf file (converted once into "
        "~/.cache/resin); default: the default model",
    )
    src.add_argument(
        "--model",
        help="a built-in model by name: SmolLM2-135M-Instruct (the default) or gemma-3-270m",
    )
    p.add_argument(
        "--fake-runner",
        action="store_true",
        help="the real engine with a zero-cost runner (load tests); the tokenizer and chat "
        "template are --checkpoint's or --model's when given (no weights load), else the "
        "default model's",
    )
    p.add_argument(
        "--load-format",
        choices=["auto", "dummy"],
        default="auto",
        help="auto (default): the checkpoint's weights; dummy: random weights of its config, "
        "its tokenizer and template real (serving benchmarks without the weights on disk; "
        "`resin bench checkpoint --no-weights` writes such a folder)",
    )
    p.add_argument(
        "--device", default="cpu", help="torch device: cpu, cuda, cuda:1 ... (%(default)s)"
    )
    p.add_argument(
        "--runner",
        choices=["auto", "cuda", "torch"],
        default="auto",
        help="runner family: auto (default: the fast cuda runner on a CUDA device for an "
        "architecture it serves, else the reference torch runner), cuda, torch",
    )
    p.add_argument(
        "--context-length",
        "--max-model-len",
        dest="context_length",
        type=int,
        default=None,
        help="longest sequence, prompt + output (default: the checkpoint's)",
    )
    _sizing_args(p.add_argument_group("sizing (docs/server.md, Serving on a GPU)"))
    p.add_argument(
        "--prefix-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV cache of shared prompt prefixes across requests (default: on)",
    )
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="schedule decode step n+1 while step n runs (default: on when the runner "
        "supports it; --no-overlap runs one step at a time, for debugging)",
    )
    p.add_argument("--recipe", default=None, help="chat recipe name (default: detected)")
    templates = p.add_argument_group("chat template limits (docs/server.md, Limits)")
    templates.add_argument(
        "--template-timeout",
        type=float,
        default=2.0,
        metavar="S",
        help="a chat template renders within S seconds, else 400 (default: %(default)s)",
    )
    templates.add_argument(
        "--template-max-chars",
        type=int,
        default=8_000_000,
        metavar="N",
        help="longest string or list a template builds, and its output (default: %(default)s)",
    )
    templates.add_argument(
        "--template-max-depth",
        type=int,
        default=64,
        metavar="N",
        help="deepest nesting of a template's macro calls (default: %(default)s)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model id clients send and /v1/models lists (default: the folder's name)",
    )
    p.add_argument(
        "--speculative",
        choices=["ngram", "draft", "mtp"],
        default=None,
        help="speculative decoding: ngram (prompt lookup), draft (a second model, "
        "--draft-model) or mtp (the checkpoint's MTP layer, DeepSeek: one draft a step); "
        "docs/engine.md",
    )
    p.add_argument("--draft-model", default=None, help="draft model name or folder")
    p.add_argument("--num-draft-tokens", type=int, default=4, help="drafts per step (4)")
    p.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="N",
        help="shard the model over N devices (reference runner; its N-1 workers start as "
        "`resin worker` processes; docs/distributed.md)",
    )
    p.add_argument(
        "--data-parallel",
        type=int,
        default=1,
        metavar="M",
        help="M engine replicas behind one server: a request goes to the replica with the "
        "longest cached prefix for it, else the least loaded (docs/distributed.md; %(default)s)",
    )
    p.add_argument(
        "--generation-config",
        default="auto",
        help="sampling defaults for omitted request fields: auto (the checkpoint's "
        "generation_config.json / GGUF metadata), none, or a JSON file",
    )


def _sizing_args(p: Any) -> None:
    """The engine's and the fast runner's sizes, under their names and vLLM's."""
    p.add_argument(
        "--memory-fraction",
        "--gpu-memory-utilization",
        dest="memory_fraction",
        type=float,
        default=None,
        help="share of the GPU's free memory for weights + KV arena (fast runner; 0.85)",
    )
    p.add_argument(
        "--kv-cache-memory",
        dest="kv_cache_bytes",
        type=_size,
        default=None,
        metavar="SIZE",
        help="the KV cache's memory, in bytes or with a unit (512MiB, 4GiB, 2GB); it must "
        "hold one --max-model-len sequence (default: on a CPU, 256 MiB or one full context, "
        "whichever is larger; on a GPU, what --gpu-memory-utilization leaves after the "
        "weights)",
    )
    p.add_argument(
        "--max-sequences",
        "--max-num-seqs",
        dest="max_sequences",
        type=int,
        default=None,
        help="sequences running at once (256; the largest CUDA-graph batch)",
    )
    p.add_argument(
        "--max-batch-tokens",
        "--max-num-batched-tokens",
        dest="max_batch_tokens",
        type=int,
        default=None,
        help="query tokens per engine step (8192)",
    )
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="capture decode steps in CUDA graphs (fast runner; --no-cuda-graphs: eager; "
        "default: on)",
    )
    p.add_argument(
        "--graph-prefill-tokens",
        type=_count,
        default=None,
        metavar="N",
        help="fast runner: prefill steps of up to 4 rows of up to N tokens each (a prefix "
        "hit's suffix) replay CUDA graphs as decode steps do (default 16; 0: never)",
    )


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}  # fmt: skip


def _size(text: str) -> int:
    """`4GiB`, `512MiB`, `2GB`, `1e9`: bytes."""
    import re

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (say 512MiB, 4GiB or 2GB)")
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the size must be positive")
    return size


def _count(value: str, also: str = "") -> int:
    """An integer >= 0 (`also`: what else the option takes, for the message)."""
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count{also}, got {value!r}") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0{also}, got {count}")
    return count


def _server_count(value: str) -> int | str:
    """`--api-server-count`: `auto`, or a count >= 0."""
    return value if value == "auto" else _count(value, " or auto")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="resin", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the OpenAI/Anthropic-compatible server")
    _serve_args(serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (%(default)s: this machine)"
    )
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (%(default)s)")
    serve.add_argument("--api-key", default=None, help="require this key (Bearer or x-api-key)")
    serve.add_argument(
        "--queue-capacity",
        type=int,
        default=1024,
        help="requests waiting to enter the engine; more get 429 (%(default)s)",
    )
    serve.add_argument(
        "--max-active",
        type=int,
        default=DEFAULT_MAX_ACTIVE,
        help="requests inside the engine at once; the rest wait in the queue (%(default)s; "
        "below --max-sequences it, not the scheduler, caps the batch)",
    )
    serve.add_argument(
        "--api-server-count",
        type=_server_count,
        default="auto",
        metavar="N|auto",
        help="N >= 1: N frontend processes sharing the port, each engine replica in its own "
        "process; auto (default): as many frontends as the cores allow (1 to 4); 0: "
        "everything in this one process",
    )
    serve.add_argument(
        "--stream-interval",
        type=int,
        default=4,
        help="tokens per streamed chunk once a stream has started (%(default)s)",
    )
    serve.add_argument(
        "--max-body-mb",
        type=float,
        default=4.0,
        help="request bodies above this many MiB get 413 (%(default)s)",
    )
    serve.add_argument("--disable-log-requests", action="store_true", help="no line per request")
    serve.add_argument(
        "--disable-log-stats", action="store_true", help="no periodic throughput/queue/KV line"
    )
    serve.add_argument(
        "--log-stats-interval",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between the throughput / queue / KV-cache log lines (%(default)s)",
    )
    limits = serve.add_argument_group("limits (docs/server.md)")
    limits.add_argument(
        "--timeout-keep-alive",
        type=int,
        default=5,
        metavar="S",
        help="close an idle kept-alive connection after S seconds (5)",
    )
    limits.add_argument(
        "--timeout-headers",
        type=float,
        default=10.0,
        metavar="S",
        help="a client must send its request headers within S seconds (%(default)s)",
    )
    limits.add_argument(
        "--timeout-body",
        type=float,
        default=30.0,
        metavar="S",
        help="a client must send its whole request body within S seconds of its headers, "
        "else 408 and the connection closes (%(default)s)",
    )
    limits.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="/health answers 503 'stalled' once the engine made no progress for S seconds "
        "with work queued or running (%(default)s)",
    )
    limits.add_argument(
        "--max-header-kb",
        type=int,
        default=64,
        help="request line + headers above this get 431 (64)",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="open connections at once; more get 503 (1024, below the fd limit)",
    )
    limits.add_argument(
        "--max-generations",
        type=int,
        default=64,
        help="engine requests one HTTP request may start, n x prompts (64)",
    )
    limits.add_argument(
        "--allowed-hosts",
        default=None,
        metavar="H1,H2",
        help="accepted Host header names, '*' for any (default: loopback "
        "names when bound to loopback, else any)",
    )
    limits.add_argument(
        "--special-tokens-in-text",
        action="store_true",
        help="old behaviour: special-token strings in user or tool text "
        "become special tokens (default: they stay text)",
    )
    chat = sub.add_parser("chat", help="chat in the terminal (with a server URL or in-process)")
    _serve_args(chat)
    chat.add_argument("--url", default=None, help="an existing server; else start one")
    chat.add_argument("--api-key", default=None, help="the server's key (with --url)")
    chat.add_argument(
        "--max-tokens", type=int, default=512, help="longest reply in tokens (%(default)s)"
    )
    chat.add_argument("--temperature", type=float, default=None, help="(the model's default)")
    chat.add_argument("--system", default=None, help="a system message for the conversation")
    # `bench TOOL` parses its own options too: `resin bench --help` lists the tools.
    sub.add_parser("bench", help="run one benchmark tool (`resin bench --help` lists them)")
    # `check` parses its own options (main() hands them over); listed here for --help.
    sub.add_parser("check", help="check a running server (`resin check --help`)")
    # `worker` parses its own options too (docs/distributed.md).
    sub.add_parser("worker", help="one non-leader rank of a multi-GPU job (`resin worker --help`)")
    # `quantize` parses its own options too (`resin quantize --help`; docs/checkpoints.md).
    sub.add_parser("quantize", help="write an FP8 / MXFP4 checkpoint folder from a bf16 one")
    return parser


def _options(args: argparse.Namespace) -> LoadOptions:
    from resin_app.loading import LoadOptions

    return LoadOptions(
        checkpoint=args.checkpoint,
        model=args.model,
        device=args.device,
        context_length=args.context_length,
        prefix_cache=args.prefix_cache,
        recipe=args.recipe,
        fake=args.fake_runner,
        generation_config=args.generation_config,
        overlap=args.overlap,
        speculative=args.speculative,
        draft_model=args.draft_model,
        num_draft_tokens=args.num_draft_tokens,
        tensor_parallel=args.tensor_parallel,
        data_parallel=args.data_parallel,
        runner=args.runner,
        max_sequences=args.max_sequences,
        max_batch_tokens=args.max_batch_tokens,
        memory_fraction=args.memory_fraction,
        kv_cache_bytes=args.kv_cache_bytes,
        cuda_graphs=args.cuda_graphs,
        graph_prefill_tokens=args.graph_prefill_tokens,
        load_format=args.load_format,
        template_limits=(args.template_max_chars, args.template_max_depth, args.template_timeout),
    )


def _refuse(args: argparse.Namespace, exc: Exception) -> SystemExit:
    """A bad option or a failed start: say so and exit 2, as argparse does."""
    print(f"resin {args.command}: error: {exc}", file=sys.stderr)
    return SystemExit(2)


def _load(args: argparse.Namespace, on_stage: Any = None) -> object:
    from resin_app.loading import check_options, load

    options = _options(args)
    try:
        check_options(options)
        return load(options, on_stage=on_stage)
    except (ValueError, OSError) as exc:  # a bad option, a bad checkpoint, a failed start
        raise _refuse(args, exc) from None


def serve(args: argparse.Namespace) -> int:
    """Each engine replica in its own process behind `--api-server-count` frontends
    (docs/server.md "Processes"); with `--api-server-count 0`, everything in this process:
    the port bound first (503 `loading` on it while the model loads and warms up), then
    served."""
    from resin_app.loading import check_options
    from resin_app.serving import build_server, log_to_stderr
    from resin_app.startup import Listener, serve_after_loading

    options = _options(args)
    try:
        check_options(options)  # refused before any process starts or weight loads
        listener = Listener(args.host, args.port)
    except (ValueError, OSError) as exc:
        raise _refuse(args, exc) from None
    if args.api_server_count != 0:
        from resin_app import serve_split

        return serve_split.serve(args, options, listener)
    log_to_stderr()
    url = f"http://{args.host}:{args.port}"
    return serve_after_loading(
        listener,
        lambda readiness: _load(args, readiness.set),
        lambda loaded: build_server(
            args,
            loaded.engines,
            loaded.recipe,
            loaded.tokenizer,
            args.served_model_name or loaded.name,
            loaded.context_length,
            loaded.defaults,
        ),
        lambda loaded, uv: _announce_when_ready(uv, url, args.served_model_name or loaded.name),
    )


def _announce_when_ready(uv: object, url: str, name: str) -> None:
    import threading
    import time

    def wait() -> None:
        while not getattr(uv, "started", False):
            if getattr(uv, "should_exit", False):
                return
            time.sleep(0.05)
        print(f"resin: serving {name} at {url}  (chat page: {url}/ , API: {url}/v1)", flush=True)

    threading.Thread(target=wait, daemon=True).start()


def chat(args: argparse.Namespace) -> int:
    from resin_app.terminal import chat_loop

    if args.url:
        return chat_loop(args.url, args.api_key, args.max_tokens, args.system, args.temperature)
    from resin.server import HttpServer
    from resin.server.launch import free_port, running
    from resin_app.loading import Loaded

    loaded = _load(args)
    assert isinstance(loaded, Loaded)
    server = HttpServer(
        list(loaded.engines),
        loaded.recipe,
        tokenizer=loaded.tokenizer,
        model=loaded.name,
        port=free_port(),
        stream_interval=1,
        generation_defaults=loaded.defaults,
    )
    try:
        with running(server) as url:
            return chat_loop(url, None, args.max_tokens, args.system, args.temperature)
    finally:
        loaded.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        # The checker parses its own options (`resin check --help` shows them); a leading
        # `--` only separates them from ours.
        from resin_app import check

        return check.main(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    if argv[:1] == ["bench"]:  # `resin bench TOOL ...`: the tool's options go through untouched
        from resin_app import bench

        return bench.main(argv[1:])
    if argv[:1] == ["worker"]:  # its own options (docs/distributed.md)
        from resin_app import worker

        return worker.main(argv[1:])
    if argv[:1] == ["quantize"]:  # its own options (docs/checkpoints.md)
        from resin_app import quantize

        return quantize.main(argv[1:])
    args = _build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    try:
        return chat(args)
    except KeyboardInterrupt:  # Ctrl-C while the model loads: quit without a traceback
        print()
        return 130


if __name__ == "__main__":
    sys.exit(main())
