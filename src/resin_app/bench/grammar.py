"""Per-step token-mask time of the grammar engines on this CPU (constrained decoding overhead).

For a JSON schema and the default model's tokenizer (SmolLM2, 49,152 tokens) it drives B
matchers (B = 1 and 64 by default) along the tokens of a valid document, and times, per decode
step, filling the B x ceil(V/32) int32 bitmask plus advancing every matcher by one token:
- `llguidance` sequential (`LLMatcher.unsafe_compute_mask_ptr` row by row) and parallel
  (`LLExecutor`, its thread pool), the engine Resin uses (`resin.constraints`);
- `xgrammar` (sequential `GrammarMatcher` and its `BatchGrammarMatcher`) when it is importable
  (it needs torch; install it beside Resin to compare).
Compile time (cold, per schema) is reported too. `--auto-tools` times the constraint a request
with tools and `tool_choice` auto carries (the recipe's lazily triggered tool-call grammar,
built as the server builds it for the default model: free text, then a call wherever
`<tool_call>` appears): B matchers follow a free-text sentence, one call and more text, through
the engine's own fill and advance (`GrammarBackend.fill_masks` / `GrammarState.sync`), timed
separately on the free-text and the call steps. `--engine` adds the whole engine step:
B requests decoding under a JSON schema through `Engine.step()` with a runner that costs
nothing (it answers each row's lowest allowed token), against the same B requests without a
constraint (the difference is the engine's constrained-decoding time per step).
`--device-ms X` makes that runner sleep X ms per step before sampling (a device step: the
host thread waits, as it does on a CUDA sync), which shows how much of the mask time the
engine hides behind the device when the runner lets it (`waits_for_masks`, "overlap") and
how much it adds when it does not ("inline"). 7.3 ms is Resin's Llama-3.1-8B decode step at
batch 64 on the H200 (docs/benchmarks.md).
`--cuda-preset NAME` (a GPU; `resin_model.presets`, e.g. llama-8b) replaces the emulation
by a real `CudaRunner` on random bf16 weights of that shape, through the Engine: per round, B
requests decode `--output-tokens` greedy tokens unconstrained (overlapped steps, as served),
unconstrained with `overlap=False`, and under a JSON schema whose one string field has a
`minLength` no output reaches (so no row finishes early: every constrained step fills B masks,
and every request ends by length after the same number of steps); decode tok/s from the step
where every request has its first token; medians over `--rounds`, plus the mask fill and the
grammar advance per constrained step (their share of the step).
Prints a table and writes JSONL.

    resin bench grammar --output bench/grammar.jsonl
    resin bench grammar --batch 64 --cuda-preset llama-8b \
        --tokenizer-dir DIR --output docs/bench/gpu/grammar_cuda.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "email", "role", "tags", "address"],
    "additionalProperties": False,
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "role": "admin",
    "tags": ["math", "engines", "poetry"],
    "address": {"city": "London", "zip": "W1"},
}


def _median_ms(samples: list[float]) -> float:
    return 1000.0 * statistics.median(samples)


def bench_llguidance(tokenizer_json: str, tokens: list[int], batch: int) -> dict[str, float]:
    import llguidance as llg

    tok = llg.LLTokenizer(tokenizer_json)
    t0 = time.perf_counter()
    grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    first = llg.LLMatcher(tok, grammar, log_level=0)
    compile_s = time.perf_counter() - t0
    words = (tok.vocab_size + 31) // 32
    out: dict[str, float] = {"compile_ms": compile_s * 1000}
    executor = llg.LLExecutor()
    for mode in ("sequential", "parallel"):
        matchers = [first.deep_copy() for _ in range(batch)]
        mask = np.zeros((batch, words), dtype=np.int32)
        steps: list[float] = []
        for token in tokens:
            t = time.perf_counter()
            if mode == "parallel":
                executor.unsafe_compute_mask_ptr(
                    [(m, i) for i, m in enumerate(matchers)], mask.ctypes.data, words * 4, batch
                )
            else:
                for i, m in enumerate(matchers):
                    m.unsafe_compute_mask_ptr(mask[i].ctypes.data, words * 4)
            for m in matchers:
                m.consume_token(token)
            steps.append(time.perf_counter() - t)
            assert (mask[:, token >> 5] >> (token & 31) & 1).all(), "document token masked out"
        assert all(m.is_accepting() for m in matchers)
        out[f"{mode}_ms"] = _median_ms(steps)
        consume: list[float] = []  # advancing alone: a loop vs llguidance's pool
        walker = first.deep_copy()
        for token in tokens:
            copies = [walker.deep_copy() for _ in range(batch)]
            t = time.perf_counter()
            if mode == "parallel":
                executor.consume_token_par([(m, token) for m in copies])
            else:
                for m in copies:
                    m.consume_token(token)
            consume.append(time.perf_counter() - t)
            walker.consume_token(token)
        out[f"{mode}_consume_ms"] = _median_ms(consume)
        out[f"{mode}_p90_ms"] = 1000.0 * float(np.percentile(steps, 90))
    return out


def bench_xgrammar(model_dir: Path, tokens: list[int], batch: int) -> dict[str, float] | None:
    try:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    hf = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))  # type: ignore[no-untyped-call]
    info = xgr.TokenizerInfo.from_huggingface(hf)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    compile_s = time.perf_counter() - t0
    out: dict[str, float] = {"compile_ms": compile_s * 1000}
    for mode in ("sequential", "parallel"):
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        mask = xgr.allocate_token_bitmask(batch, info.vocab_size)
        batcher = xgr.BatchGrammarMatcher() if mode == "parallel" else None
        steps: list[float] = []
        for token in tokens:
            t = time.perf_counter()
            if batcher is not None:
                batcher.batch_fill_next_token_bitmask(matchers, mask)
            else:
                for i, m in enumerate(matchers):
                    m.fill_next_token_bitmask(mask, i)
            for m in matchers:
                m.accept_token(token)
            steps.append(time.perf_counter() - t)
        out[f"{mode}_ms"] = _median_ms(steps)
        out[f"{mode}_p90_ms"] = 1000.0 * float(np.percentile(steps, 90))
    return out


AUTO_TEXT = (
    "Let me check the weather for you, one moment. ",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","unit":"celsius"}}'
    "\n</tool_call>",
    "\nThat was the call; the answer follows when it returns.",
)


def auto_tools(tokenizer: Any) -> tuple[Any, list[int], int, int]:
    """The default model's auto-tools constraint (as the server builds it) and a scripted
    output: its tokens and where the call starts and ends in them."""
    from resin.recipe import JinjaRecipe, Message, ToolDef
    from resin.server.structured import auto_tool_structure

    weather = {
        "type": "object",
        "required": ["city", "unit"],
        "additionalProperties": False,
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "f"]}},
    }
    time_zone = {"type": "object", "properties": {"zone": {"type": "string"}}}
    tools = [ToolDef("get_weather", "Weather in a city", weather),
             ToolDef("get_time", "Local time", time_zone),
             ToolDef("create_user", "Register a user", SCHEMA)]  # fmt: skip
    prompt = JinjaRecipe(tokenizer).render([Message("user", "Weather in Paris?")], tools=tools)
    constraint = auto_tool_structure(prompt).constraint
    assert constraint is not None
    text, call, rest = (tokenizer.encode(part) for part in AUTO_TEXT)
    return constraint, [*text, *call, *rest], len(text), len(text) + len(call)


def bench_auto_tools(tokenizer: Any, batch: int) -> dict[str, float]:
    from resin import GrammarBackend

    constraint, tokens, start, end = auto_tools(tokenizer)
    backend = GrammarBackend.from_tokenizer(tokenizer)
    t0 = time.perf_counter()
    backend.state(constraint)
    out: dict[str, float] = {"compile_ms": (time.perf_counter() - t0) * 1000}
    states = [backend.state(constraint) for _ in range(batch)]
    mask = np.zeros((batch, backend.mask_words), dtype=np.int32)
    steps: list[float] = []
    seen: list[int] = []
    for token in tokens:
        seen.append(token)
        t = time.perf_counter()
        backend.fill_masks(states, mask)
        for s in states:  # as the engine advances them
            s.sync(seen)
        steps.append(time.perf_counter() - t)
        assert (mask[:, token >> 5] >> (token & 31) & 1).all(), "scripted token masked out"
    assert all(s.error is None for s in states)
    out["text_ms"] = _median_ms(steps[:start] + steps[end:])
    out["call_ms"] = _median_ms(steps[start:end])
    out["all_ms"] = _median_ms(steps)
    out["call_share"] = (end - start) / len(tokens)
    return out


class FirstAllowedRunner:
    """Answers each sampling row's lowest allowed token (any token 1 without a mask), or
    with `script` the script's tokens in a loop (they must be allowed)."""

    def __init__(
        self, vocab: int, device_ms: float = 0.0, waits: bool = False, script: Sequence[int] = ()
    ) -> None:
        from resin import RunnerConfig

        self.runner_config = RunnerConfig(
            vocab_size=vocab, page_size=16, num_pages=8192, waits_for_masks=waits
        )
        self.device_s = device_ms / 1000
        self.script = list(script)
        self.position: dict[int, int] = {}  # sequence -> tokens of the script it wrote

    def forward(self, plan: Any) -> Any:
        from resin import ForwardOutput

        if self.device_s:
            time.sleep(self.device_s)
        rows = np.flatnonzero(plan.sample_rows)
        mask = plan.sampling.bitmask()
        if self.script:
            seqs = [int(plan.sequence_ids[r]) for r in rows]
            for seq in seqs:
                self.position[seq] = self.position.get(seq, -1) + 1
            n = len(self.script)
            ids = np.asarray([self.script[self.position[q] % n] for q in seqs], dtype=np.uint32)
        elif mask is None:
            ids = np.ones(rows.size, dtype=np.uint32)
        else:
            words = mask[rows].view(np.uint32)
            first = (words != 0).argmax(axis=1)
            word = words[np.arange(rows.size), first]
            low = (word & (~word + np.uint32(1))).astype(np.float64)
            ids = (first * 32 + np.log2(low).astype(np.int64)).astype(np.uint32)
        indptr = np.zeros(plan.num_sequences + 1, dtype=np.uint32)
        indptr[1:] = np.cumsum(plan.sample_rows)
        return ForwardOutput(ids, indptr)


def bench_engine(
    tokenizer: Any, batch: int, device_ms: float = 0.0, steps: int = 48, auto: bool = False
) -> dict[str, float]:
    """Engine.step() without and with the constraint; `auto`: the auto-tools constraint and
    the scripted output of `--auto-tools` (looped), else a JSON schema."""
    from resin import Constraint, Engine, GrammarBackend, SamplingParams

    backend = GrammarBackend.from_tokenizer(tokenizer)
    script: list[int] = []
    if auto:
        constraint, script, _, _ = auto_tools(tokenizer)
    else:
        constraint = Constraint.json_schema(
            {"type": "object", "properties": {"notes": {"type": "string"}}}
        )
    out: dict[str, float] = {"device_ms": device_ms}
    cases = (("plain", None, False), ("inline", constraint, False), ("overlap", constraint, True))
    for name, c, waits in cases:
        runner = FirstAllowedRunner(tokenizer.vocab_size, device_ms, waits, script)
        engine = Engine(runner, grammar=backend)
        for i in range(batch):
            engine.submit([5, 6, 7 + i], SamplingParams(max_output_tokens=steps * 4,
                                                        constraint=c))  # fmt: skip
        while engine.num_waiting or any(len(r.output_token_ids) == 0
                                        for r in engine._scheduler.live.values()):  # fmt: skip
            engine.step()
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
        assert all(r.error is None for r in engine._scheduler.live.values())
        engine.close()
        out[f"{name}_step_ms"] = _median_ms(times)
    for name in ("inline", "overlap"):
        out[f"{name}_extra_ms"] = out[f"{name}_step_ms"] - out["plain_step_ms"]
    return out


LONG_STRING = {
    "type": "object",
    "properties": {"notes": {"type": "string", "minLength": 100_000}},
    "required": ["notes"],
    "additionalProperties": False,
}


class _Timed:
    """Wall time of each call of one method of an object; with `events`, CUDA events recorded
    before and after each call too (where the device reaches that point of the stream)."""

    def __init__(self, obj: Any, name: str, events: bool = False) -> None:
        self.samples: list[float] = []
        self.events: list[tuple[Any, Any]] = []
        inner = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            import torch

            pair = None
            if events:
                pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
                pair[0].record()
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.samples.append(time.perf_counter() - t)
                if pair is not None:
                    pair[1].record()
                    self.events.append(pair)

        setattr(obj, name, timed)

    def clear(self) -> None:
        self.samples.clear()
        self.events.clear()


class _Probe:
    """Where a decode step's time goes: host time in the engine's constraint hooks, the
    runner's submit / collect / sampling, the grammar backend's fill and advance; device time
    of each submitted step, of its sampling, and the idle gap between steps."""

    def __init__(self, engine: Any, runner: Any, backend: Any) -> None:
        self.timers = {
            "submit": _Timed(runner, "submit", events=True),
            "pick": _Timed(runner._sampler, "pick", events=True),
            "collect": _Timed(runner, "collect"),
            "attach": _Timed(engine._constraints, "attach"),
            "fill": _Timed(backend, "fill_masks"),
            "advance": _Timed(engine._constraints, "advance"),
        }

    def start(self) -> None:
        for timer in self.timers.values():
            timer.clear()

    def summary(self) -> dict[str, float]:
        import torch

        torch.cuda.synchronize()
        out = {f"{k}_ms": _median_ms(t.samples) for k, t in self.timers.items() if t.samples}
        steps = self.timers["submit"].events
        picks = self.timers["pick"].events
        if steps:
            out["gpu_step_ms"] = statistics.median(a.elapsed_time(b) for a, b in steps)
            gaps = [p[1].elapsed_time(n[0]) for p, n in itertools.pairwise(steps)]
            out["gpu_idle_ms"] = statistics.median(max(g, 0.0) for g in gaps) if gaps else 0.0
        if picks:
            out["gpu_sample_ms"] = statistics.median(a.elapsed_time(b) for a, b in picks)
        return out


def _decode(runner: Any, backend: Any, batch: int, args: argparse.Namespace,
            constrained: bool, overlap: bool | None) -> dict[str, float]:  # fmt: skip
    """One Engine run: decode tok/s and ms/step over the steps after every first token, and
    where a step's time goes (`_Probe`)."""
    import torch

    from resin import Constraint, Engine, SamplingParams

    constraint = Constraint.json_schema(LONG_STRING) if constrained else None
    params = SamplingParams(max_output_tokens=args.output_tokens, temperature=0.0,
                            ignore_stop_tokens=True, constraint=constraint)  # fmt: skip
    engine = Engine(runner, grammar=backend, context_length=args.prompt + args.output_tokens + 64,
                    max_sequences=batch, max_batch_tokens=16384, prefill_chunk_tokens=8192,
                    enable_metrics=False, overlap=overlap)  # fmt: skip
    probe = _Probe(engine, runner, backend)
    rng = np.random.default_rng(batch)
    requests = [
        engine.submit(rng.integers(0, backend.vocab_size, args.prompt).tolist(), params)
        for _ in range(batch)
    ]
    t0 = None
    tokens = steps = 0
    while engine.has_work():
        events = engine.step()
        if t0 is not None:
            tokens += sum(len(getattr(e, "token_ids", ())) for e in events)
            steps += 1
        elif all(r.output_token_ids for r in requests):
            torch.cuda.synchronize()
            probe.start()
            t0 = time.perf_counter()
    wall = time.perf_counter() - (t0 or time.perf_counter())
    lengths = {len(r.take_result()) for r in requests}
    assert lengths == {args.output_tokens}, f"requests finished early: {lengths}"
    engine.close()
    return {"tok_s": tokens / wall, "ms_per_step": wall / max(steps, 1) * 1e3, "steps": steps,
            **probe.summary()}  # fmt: skip


def bench_cuda(tokenizer: Any, batch: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Plain vs json_schema decoding through the Engine on a real `CudaRunner` (module doc)."""
    from resin import GrammarBackend
    from resin_model.presets import preset
    from resin_models_cuda import CudaRunner, RunnerOptions, random_runner

    context = args.prompt + args.output_tokens + 64
    options = RunnerOptions(max_batch=batch, max_context=context, cache_bytes=16 << 30)
    model = random_runner(preset(args.cuda_preset), options).model
    # One json_schema case per --fill-threads value (0: llguidance's default pool), named
    # json_schema for the first and json_schema_t<n> for the others.
    threads = args.fill_threads
    backends = {
        t: GrammarBackend.from_tokenizer(tokenizer, fill_threads=t or None) for t in threads
    }
    json_cases = [("json_schema" if i == 0 else f"json_schema_t{t}", True, t)
                  for i, t in enumerate(threads)]  # fmt: skip
    cases = [("plain", False, None), ("plain_sync", False, False), *json_cases]
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds + 1):  # round 0 warms up (Triton compiles, graph capture)
        for name, constrained, knob in cases:
            runner = CudaRunner(model, options)  # same weights, a fresh arena
            backend = backends[knob if constrained else threads[0]]
            overlap = None if constrained else knob
            r = _decode(runner, backend, batch, args, constrained, overlap)
            if rnd:
                rows.append({"engine": "resin-cuda", "case": name, "batch": batch,
                             "round": rnd, "preset": args.cuda_preset, **r})  # fmt: skip
    summary: dict[str, Any] = {
        "engine": "resin-cuda", "case": "summary", "batch": batch, "preset": args.cuda_preset,
        "rounds": args.rounds, "prompt": args.prompt, "output_tokens": args.output_tokens,
    }  # fmt: skip
    for name, _, _ in cases:
        mine = [r for r in rows if r["case"] == name]
        summary[f"{name}_tok_s"] = statistics.median(r["tok_s"] for r in mine)
        summary[f"{name}_ms"] = statistics.median(r["ms_per_step"] for r in mine)
    for name, _, _ in cases[1:]:
        mine = [r for r in rows if r["case"] == name]
        for key in sorted({k for r in mine for k in r if k.endswith("_ms") and k != "ms"}):
            prefix = "" if name == "json_schema" else f"{name}_"
            summary[prefix + key] = statistics.median(r[key] for r in mine if key in r)
    summary["fill_threads"] = threads
    for name, _, _ in json_cases:
        suffix = "" if name == "json_schema" else f"_{name}"
        summary[f"ratio{suffix}"] = summary[f"{name}_tok_s"] / summary["plain_tok_s"]
        summary[f"ratio_vs_sync{suffix}"] = summary[f"{name}_tok_s"] / summary["plain_sync_tok_s"]
    summary["fill_share"] = summary["fill_ms"] / summary["json_schema_ms"]
    return [*rows, summary]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resin bench grammar", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--output", type=Path, default=None, help="JSONL file to append to")
    parser.add_argument("--engine", action="store_true", help="also time Engine.step()")
    parser.add_argument(
        "--auto-tools", action="store_true", help="the tool_choice auto constraint instead"
    )
    parser.add_argument("--device-ms", type=float, nargs="+", default=[0.0])
    parser.add_argument("--cuda-preset", default=None, help="a real CudaRunner of this shape")
    parser.add_argument("--rounds", type=int, default=5, help="--cuda-preset: timed rounds")
    parser.add_argument("--fill-threads", type=int, nargs="+", default=[0],
                        help="--cuda-preset: mask-fill threads, one json_schema case each "
                        "(0: llguidance's default)")  # fmt: skip
    parser.add_argument("--prompt", type=int, default=256, help="--cuda-preset: prompt tokens")
    parser.add_argument("--output-tokens", type=int, default=256, help="--cuda-preset: per request")
    parser.add_argument(
        "--tokenizer-dir", type=Path, default=None, help="default: the default model's folder"
    )
    args = parser.parse_args(argv)
    from resin.tokenizer import Tokenizer

    if args.tokenizer_dir is not None:
        model_dir = args.tokenizer_dir
    else:
        from resin_model.default_model import default_model_dir

        model_dir = default_model_dir()
    tokenizer = Tokenizer.from_dir(model_dir)
    tokens = tokenizer.encode(json.dumps(DOCUMENT))
    tokenizer_json = tokenizer.backend.to_str()
    engines: dict[str, Callable[[int], dict[str, float] | None]] = {
        "llguidance": lambda b: bench_llguidance(tokenizer_json, tokens, b),
        "xgrammar": lambda b: bench_xgrammar(model_dir, tokens, b),
    }
    rows = []
    print(f"cpu cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f}, {len(tokens)} steps")
    if args.auto_tools:
        engines = {}
        print("auto tools  batch  compile ms  text ms/step  call ms/step  all ms/step")
        for b in args.batch:
            r = bench_auto_tools(tokenizer, b)
            rows.append({"engine": "llguidance-auto-tools", "batch": b, **r})
            print(f"{'':<11} {b:>5} {r['compile_ms']:>11.2f} {r['text_ms']:>13.3f}"
                  f" {r['call_ms']:>13.3f} {r['all_ms']:>12.3f}")  # fmt: skip
    else:
        print(f"{'engine':<11} {'batch':>5} {'compile ms':>10} {'seq ms/step':>12} "
              f"{'par ms/step':>12}")  # fmt: skip
    for name, run in engines.items():
        for b in args.batch:
            result = run(b)
            if result is None:
                print(f"{name:<11} (not installed)")
                break
            row = {"engine": name, "batch": b, "vocab": tokenizer.vocab_size, **result}
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            print(
                f"{name:<11} {b:>5} {result['compile_ms']:>10.2f} {result['sequential_ms']:>12.3f}"
                f" {result['parallel_ms']:>12.3f}"
            )
    if args.engine:
        print("engine step  batch  device ms   plain ms  inline +ms  overlap +ms")
        for device_ms in args.device_ms:
            for b in args.batch:
                r = bench_engine(tokenizer, b, device_ms, auto=args.auto_tools)
                kind = "resin-engine-auto-tools" if args.auto_tools else "resin-engine"
                rows.append({"engine": kind, "batch": b, **r})
                print(
                    f"{'':<11} {b:>6} {device_ms:>10.2f} {r['plain_step_ms']:>10.3f}"
                    f" {r['inline_extra_ms']:>11.3f} {r['overlap_extra_ms']:>12.3f}"
                )
    if args.cuda_preset:
        print("cuda engine  batch  plain tok/s  plain-sync tok/s  json tok/s  ratio  fill ms"
              "  advance ms  json ms/step")  # fmt: skip
        for b in args.batch:
            summary = bench_cuda(tokenizer, b, args)
            rows += summary
            r = summary[-1]
            print(
                f"{'':<11} {b:>6} {r['plain_tok_s']:>12.0f} {r['plain_sync_tok_s']:>17.0f}"
                f" {r['json_schema_tok_s']:>11.0f} {r['ratio']:>6.3f} {r['fill_ms']:>8.3f}"
                f" {r['advance_ms']:>11.3f} {r['json_schema_ms']:>13.3f}"
            )
            for t in args.fill_threads[1:]:
                name = f"json_schema_t{t}"
                print(f"{'':<11} {name:>40} {r[f'{name}_tok_s']:>11.0f} {r[f'ratio_{name}']:>6.3f}"
                      f" {r[f'{name}_fill_ms']:>8.3f} {r[f'{name}_advance_ms']:>11.3f}"
                      f" {r[f'{name}_ms']:>13.3f}")  # fmt: skip
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
