"""DeepSeek-V4 on the fast runner against the reference runner, float32, in the Triton
interpreter on CPU: the tiny transformers model of `tests/models/test_deepseek_v4.py` (sliding,
sliding, CSA, HCA; HCA ratio 16; indexer top-4 active) saved as a folder, both runners loading
it. Both declare the same cache groups byte for byte; the Engine drives each over the same
requests with 16-token prefill chunks and prefix caching (a second round resumes from the
first's pages and State checkpoints), and the greedy tokens and the logits of every step
agree. The selection is compared where it is unique (the reference test checks the gap at the
k-th candidate for its prompts; here the tokens and logits must agree, so a tie that broke
differently would show)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from resin import Engine, SamplingParams
from tests.cuda.host_reads import assert_padded_decode_equals_without_host_reads
from tests.models.dsv4_tiny import _checkpoint
from tests.models.ref_compare import assert_step_logits_equal, generate_twice

_ROOT = Path(tempfile.mkdtemp(prefix="resin-fast-dsv4-"))
# The MoE's expert GEMV up to 4 token-expert pairs (a decode row: top-2 and the shared expert),
# the grouped GEMM above: both paths run, and the interpreter's GEMV programs (one per pair and
# tile) stay few.
GEMV_PAIRS = 4


def _runners(device: str, graphs: bool = True) -> tuple[Any, Any]:
    """The reference and the fast runner; `graphs`: decode in CUDA graphs captured at bind."""
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.registry import load_runner as load_reference

    folder, _ = _checkpoint(_ROOT)
    reference = load_reference(folder, device, torch.float32, page_size=16, num_pages=64)
    # no draft room, so the State groups are the reference's byte for byte
    options = RunnerOptions(page_size=16, max_batch=4, max_context=256, num_pages=64,
                            max_draft_tokens=0, moe_gemv_max_pairs=GEMV_PAIRS,
                            cuda_graphs=graphs)  # fmt: skip
    return reference, load_runner(folder, options, device, torch.float32)


def _generate(runner: Any, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    return generate_twice(runner, prompts, context_length=256)


def test_same_tokens_and_groups_as_the_reference(device: str) -> None:
    reference, fast = _runners(device)
    assert fast.runner_config.cache_groups == reference.runner_config.cache_groups
    gen = torch.Generator().manual_seed(7)
    shared = torch.randint(0, 300, (36,), generator=gen).tolist()
    prompts = [shared + torch.randint(0, 300, (n,), generator=gen).tolist() for n in (3, 14)]
    want, reused_ref = _generate(reference, prompts)
    got, reused = _generate(fast, prompts)
    assert got == want
    assert reused == reused_ref > 0


def test_logits_equal_the_reference_step_by_step(device: str) -> None:
    reference, fast = _runners(device, graphs=False)  # every step calls `logits` in Python
    prompt = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(9)).tolist()
    steps = assert_step_logits_equal(reference, fast, prompt, context_length=256)
    assert steps == 5  # the same steps on both


def test_padded_fixed_shape_decode_equals_the_reference_without_host_reads(device: str) -> None:
    """Decode steps take the runner's persistent-buffer path (what a CUDA graph replays),
    every batch padded to a 4-row bucket as a captured graph's would be: the greedy tokens
    equal the reference's over decode steps that complete CSA and HCA entries, and the step's
    body (the model forward, the logits, their argmax) reads nothing on the host."""
    reference, fast = _runners(device, graphs=False)  # the body runs, padded, each step
    # decode at positions 13..16 and 30..33: lengths 16 and 32 complete CSA and HCA entries;
    # a varlen step's `_begin` reads its row lengths
    assert_padded_decode_equals_without_host_reads(
        reference, fast, 256, lambda step: fast.model._begin(step, fast.kv)
    )


def _fixed_shapes(runner: Any) -> list[tuple[int, int]]:
    """The (rows, query slots) of every fixed-shape decode body `runner` runs from now on
    (what a CUDA graph replays), recorded as they run."""
    shapes: list[tuple[int, int]] = []
    body = runner._decode_body

    def recording(rows: int, query: int) -> Any:
        shapes.append((rows, query))
        return body(rows, query)

    runner._decode_body = recording
    return shapes


def _drafts_each_step(runner: Any, prompts: list[list[int]]) -> tuple[list[list[int]], set[Any]]:
    """The greedy tokens, and every (request, sequence length, drafts) the runner offered
    (what `MtpProposer` would propose after a sequence that long; the fast runner offers them
    a step later, as it collects a step after the next is submitted)."""
    params = SamplingParams(max_output_tokens=6, temperature=0.0, ignore_stop_tokens=True)
    seen = set()
    with Engine(runner, context_length=128, prefill_chunk_tokens=512) as engine:
        requests = [engine.submit(p, params) for p in prompts]
        while engine.has_work():
            engine.step()
            for r in requests:
                if r.id in runner.drafts:
                    length, drafts = runner.drafts[r.id]
                    seen.add((r.id, length, tuple(drafts)))
        tokens = [r.take_result() for r in requests]
    return tokens, seen


def test_mtp_drafts_equal_the_reference_mtp_runner(device: str, tmp_path_factory: Any) -> None:
    """The MTP layer (`RunnerOptions.mtp`) drafts what the reference `MtpRunner` drafts, step
    by step (one draft, no verification: the fast version's State groups cannot drop drafts
    yet). The checkpoint of `tests/models/test_deepseek_v4_mtp.py` (vocabulary 16, the
    indexer keeping every entry)."""
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.mtp import MtpRunner
    from resin_models_torch.registry import load_model
    from tests.models.test_deepseek_v4_mtp import _checkpoint as mtp_checkpoint

    folder = mtp_checkpoint(tmp_path_factory.mktemp("dsv4mtp"))[0]
    reference = MtpRunner(load_model(folder, device, torch.float32), num_drafts=1, page_size=16,
                          num_pages=64)  # fmt: skip
    options = RunnerOptions(page_size=16, max_batch=4, max_context=128, num_pages=64, mtp=True,
                            moe_gemv_max_pairs=GEMV_PAIRS)  # fmt: skip
    fast = load_runner(folder, options, device, torch.float32)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 16, (n,), generator=gen).tolist() for n in (21, 6)]
    want = _drafts_each_step(reference, prompts)
    got = _drafts_each_step(fast, prompts)
    assert got == want
    assert len(got[1]) >= 12  # a draft after every sampled token of both requests


def test_fast_mtp_drafts_verified_keep_greedy_tokens(device: str, tmp_path_factory: Any) -> None:
    """With room for a draft in its State groups (`State.rewind`), the fast runner verifies
    its MTP drafts through the Engine's speculative decoding: greedy tokens equal the plain
    reference's, under 16-token chunks and a prefix hit, with drafts kept and dropped. The
    verify steps take the fixed-shape decode path (what a CUDA graph replays: two query slots
    a row, rows without a draft padded), not the varlen one."""
    from resin.engine.proposers import MtpProposer
    from resin.engine.speculative import Speculation
    from resin.protocols import State
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.registry import load_runner as load_reference
    from tests.models.test_deepseek_v4_mtp import _checkpoint as mtp_checkpoint

    folder = mtp_checkpoint(tmp_path_factory.mktemp("dsv4spec"))[0]
    options = RunnerOptions(page_size=16, max_batch=4, max_context=128, num_pages=64, mtp=True,
                            max_draft_tokens=1, moe_gemv_max_pairs=GEMV_PAIRS)  # fmt: skip
    fast = load_runner(folder, options, device, torch.float32)
    assert fast.runner_config.max_draft_tokens == 1
    shapes = _fixed_shapes(fast)
    assert all(g.rewind == 1 for g in fast.runner_config.cache_groups if isinstance(g, State))
    gen = torch.Generator().manual_seed(4)
    shared = torch.randint(0, 16, (20,), generator=gen).tolist()
    prompts = [[*shared, 3, 1], [*shared, 9]]
    params = SamplingParams(max_output_tokens=12, temperature=0.0, ignore_stop_tokens=True)

    def run(runner: Any, speculation: Any) -> tuple[list[list[int]], Any]:
        with Engine(runner, context_length=128, prefix_cache=True, prefill_chunk_tokens=16,
                    speculation=speculation) as engine:  # fmt: skip
            requests = [engine.submit(prompts[0], params)]
            engine.step()
            requests.append(engine.submit(prompts[1], params))
            while engine.has_work():
                engine.step()
            return [r.take_result() for r in requests], engine.metrics

    want, _ = run(load_reference(folder, device, torch.float32, page_size=16, num_pages=64), None)
    got, metrics = run(fast, Speculation(MtpProposer(), num_draft_tokens=1))
    assert got == want
    assert metrics.prefix_cache_hits > 0
    assert 0 < metrics.spec_decode_num_accepted_tokens < metrics.spec_decode_num_draft_tokens
    assert any(query == 2 for _, query in shapes), shapes  # verify steps in fixed shapes


def test_long_verify_rows_complete_several_entries_in_fixed_shapes(
    device: str, tmp_path_factory: Any
) -> None:
    """Verify rows of up to six query tokens (n-gram drafts, five a row) in the fixed-shape
    path: a row's tokens may complete two CSA entries (ratio 4) in one step, each pooled at
    its own token's `entry_at` slot; greedy tokens equal the plain reference's."""
    from resin.engine.proposers import NgramProposer
    from resin.engine.speculative import Speculation
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.registry import load_runner as load_reference
    from tests.models.test_deepseek_v4_mtp import _checkpoint as mtp_checkpoint

    folder = mtp_checkpoint(tmp_path_factory.mktemp("dsv4ngram"))[0]
    options = RunnerOptions(page_size=16, max_batch=2, max_context=96, num_pages=32,
                            max_draft_tokens=5, moe_gemv_max_pairs=GEMV_PAIRS)  # fmt: skip
    fast = load_runner(folder, options, device, torch.float32)
    shapes = _fixed_shapes(fast)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 3  # repeats: the n-gram proposer drafts
    params = SamplingParams(max_output_tokens=20, temperature=0.0, ignore_stop_tokens=True)

    def run(runner: Any, speculation: Any) -> list[int]:
        with Engine(runner, context_length=96, speculation=speculation) as engine:
            request = engine.submit(prompt, params)
            while engine.has_work():
                engine.step()
            return request.take_result()

    want = run(load_reference(folder, device, torch.float32, page_size=16, num_pages=32), None)
    got = run(fast, Speculation(NgramProposer(max_ngram=2, min_ngram=1), num_draft_tokens=5))
    assert got == want
    assert any(query >= 5 for _, query in shapes), shapes  # rows of 5+ tokens, fixed shapes


def test_bench_runner_runs_the_v4_presets_fast_runner(tmp_path: Path) -> None:
    """`resin bench runner --random-weights --model-config deepseek-v4-flash-8l` (the command
    of docs/benchmarks.md) at CPU size: the same path on the tiny preset's shapes, prefill and
    decode rows written (on CPU through the interpreter)."""
    import json

    from resin_app.cli import main

    out = tmp_path / "runner.jsonl"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    argv = ["bench", "runner", "--random-weights", "--model-config", "tiny-deepseek_v4",
            "--device", device, "--dtype", "fp32", "--context-lengths", "40", "--batch-sizes",
            "2", "--decode-contexts", "40", "--warmup", "0", "--iters", "1",
            "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [(r["kind"], r.get("context"), r.get("batch")) for r in rows if r["kind"] != "env"]
    assert kinds == [("prefill", 40, 1), ("decode", 40, 2)]
    assert all(r["median_ms"] > 0 for r in rows if r["kind"] != "env")
