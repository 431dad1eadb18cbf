"""Gemma 3 with images on the fast runner: the Engine drives `CudaRunner` (SigLIP encoder in
eager PyTorch, language model on the fast layers, image tokens attending to each other through
the prefill kernel's `span_end`) and the reference `TorchRunner` on the same random weights
over the same requests; greedy tokens are identical and the sampled rows' logits close, in
float32. Spans are 16 tokens, longer than the 6-token window, so the sliding layers' window and
the span limit meet; 16-token query blocks on the CPU put spans across block boundaries. On CPU
the kernels run in the Triton interpreter."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from resin import Engine, SamplingParams
from resin.plan import BatchPlan, MediaItem, Phase
from resin.protocols import CacheLayout
from resin_app.bench.plans import PagedPlanner
from resin_model.presets import TINY
from resin_models_cuda.kernels import PagedKV, prefill_attention, prefill_blocks
from tests.cuda.test_vs_reference import reference_and_fast

IMAGE = 255
SPAN = 16
RAW: dict[str, Any] = {
    "model_type": "gemma3",
    "text_config": {**TINY["gemma3"], "model_type": "gemma3_text"},
    "vision_config": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "image_size": 56, "patch_size": 14,
    },
    "mm_tokens_per_image": SPAN,
    "image_token_index": IMAGE,
}  # fmt: skip


def _prompt(parts: list[int | str], seed: int) -> tuple[list[int], list[MediaItem]]:
    """Text runs (ints: lengths) and images ("img") in order -> tokens and media items."""
    rng = np.random.default_rng(seed)
    tokens: list[int] = []
    items = []
    for part in parts:
        if part == "img":
            pixels = rng.standard_normal((3, 56, 56)).astype(np.float32)
            items.append(
                MediaItem(0, len(tokens), SPAN, f"{seed}-{len(items)}", pixels, (1, 1, 1), True)
            )
            tokens += [IMAGE] * SPAN
        else:
            assert isinstance(part, int)
            tokens += rng.integers(0, IMAGE, part).tolist()
    return tokens, items


class LogitLog:
    """The logits of every sampled row, keyed by (request order, position), from either runner."""

    def __init__(self, runner: Any) -> None:
        self.rows: dict[tuple[int, int], torch.Tensor] = {}
        if hasattr(runner, "record_logits"):  # the reference runner records every token
            runner.record_logits = True
            self.reference = runner
            return
        self.reference = None
        runner.options = dataclasses.replace(runner.options, keep_logits=True)
        submit = runner.submit

        def logged(plan: BatchPlan) -> None:
            submit(plan)
            rows = np.flatnonzero(plan.sample_rows)
            last = plan.query_indptr[rows + 1] - 1
            for i, row in enumerate(rows):
                key = (int(plan.sequence_ids[row]), int(plan.positions[last[i]]))
                self.rows[key] = runner.last_logits[i].cpu()

        runner.submit = logged

    def table(self) -> dict[tuple[int, int], torch.Tensor]:
        if self.reference is not None:
            for step in self.reference.recorded:
                for j, (sid, pos) in enumerate(zip(step.sequence_ids, step.positions, strict=True)):
                    self.rows[(int(sid), int(pos))] = step.logits[j].float().cpu()
        return self.rows


Prompt = tuple[list[int], list[MediaItem]]
Logits = dict[tuple[int, int], torch.Tensor]


def _generate(
    runner: Any, prompts: list[Prompt], chunk: int, tokens: int
) -> tuple[list[list[int]], Logits]:
    log = LogitLog(runner)
    params = SamplingParams(max_output_tokens=tokens, temperature=0.0, ignore_stop_tokens=True)
    engine = Engine(runner, context_length=100, prefix_cache=True, prefill_chunk_tokens=chunk,
                    max_batch_tokens=48, max_sequences=4)  # fmt: skip
    with engine:
        out = []
        for _ in range(2):  # the second round hits the prefix cache (images by content)
            requests = [engine.submit(p, params, media=m) for p, m in prompts]
            while engine.has_work():
                engine.step()
            out.append([list(r.take_result()) for r in requests])
    assert out[0] == out[1]
    return out[0], log.table()


CASES = {
    "image-first": ([["img", 5], [3, "img", 4, "img", 3]], 24),
    # 16-token chunks: the first would end inside the span (8..23), so it stops right before
    # it, the next runs exactly to its end, the last starts right after it.
    "chunk-at-span": ([[8, "img", 9], [16, "img", 2]], SPAN),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_tokens_and_logits_as_reference_runner(device: str, case: str) -> None:
    shapes, chunk = CASES[case]
    prompts = [_prompt(parts, seed) for seed, parts in enumerate(shapes)]
    reference, fast = reference_and_fast(RAW, device)
    steps = 4 if torch.cuda.is_available() else 2
    ref_tokens, ref_logits = _generate(reference, prompts, chunk, steps)
    fast_tokens, fast_logits = _generate(fast, prompts, chunk, steps)
    assert fast_tokens == ref_tokens
    assert fast.media.encoded == sum(len(m) for _, m in prompts)  # once each, prefix hits after
    assert not fast.media.features  # every span consumed: nothing pinned
    assert fast_logits
    for key, logits in fast_logits.items():
        want = ref_logits[key]
        scale = float(want.abs().max())
        assert float((logits - want).abs().max()) <= 1e-4 * scale, key


def test_images_change_the_output(device: str) -> None:
    """A control: the comparisons above would be vacuous if the features were ignored."""
    tokens, items = _prompt([2, "img", 3], 7)
    other = [dataclasses.replace(items[0], content_hash="x", data=-items[0].data)]
    _, la = _generate(reference_and_fast(RAW, device)[1], [(tokens, items)], 24, 1)
    _, lb = _generate(reference_and_fast(RAW, device)[1], [(tokens, other)], 24, 1)
    key = (0, len(tokens) - 1)
    assert float((la[key] - lb[key]).abs().max()) > 1e-3


def test_text_only_fast_runner_refuses_media(device: str) -> None:
    _, fast = reference_and_fast(TINY["gemma3"], device)
    config = fast.runner_config
    fast.bind(CacheLayout(160, 4, config.page_bytes, config.cache_groups))
    planner = PagedPlanner(160, 4, len(fast.model.group_kinds))
    tokens, items = _prompt([2, "img", 1], 3)
    plan = planner.plan([(planner.new_sequence(tokens), len(tokens))], Phase.PREFILL)
    with pytest.raises(ValueError, match="no vision encoder"):
        fast.forward(dataclasses.replace(plan, media=tuple(items)))


def test_prefill_attention_span_limit(device: str) -> None:
    """The kernel against a dense mask: key k visible to query q iff k <= max(q, span_end) and,
    with a window, k > q - window; two rows, cached prefixes, spans across query blocks."""
    torch.manual_seed(0)
    page, heads, kv_heads, dim = 4, 4, 2, 16
    cached, q_lens = [5, 0], [30, 21]
    spans = [(0, 3, 19), (1, 0, 16)]  # (row, lo, hi) query offsets
    pages_per_row = [(c + q + page - 1) // page for c, q in zip(cached, q_lens, strict=True)]
    page_ids = torch.randperm(sum(pages_per_row), dtype=torch.int32)
    k_cache = torch.randn(len(page_ids), page, kv_heads, dim, device=device)
    v_cache = torch.randn_like(k_cache)
    indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    ends = np.full(int(indptr[-1]), -1, dtype=np.int32)
    for row, lo, hi in spans:
        ends[indptr[row] + lo : indptr[row] + hi] = cached[row] + hi - 1
    q = torch.randn(int(indptr[-1]), heads, dim, device=device)
    block_row, block_off = prefill_blocks(indptr, 16)

    def i32(a: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(a, dtype=np.int32), device=device)

    page_indptr = i32(np.concatenate([[0], np.cumsum(pages_per_row)]))
    for window in (0, 6):
        out = prefill_attention(
            q, PagedKV(k_cache, v_cache, page_indptr, page_ids.to(device), i32([0, 0])),
            i32(indptr), i32(cached), i32(block_row), i32(block_off), scale=dim**-0.5,
            window=window,
            span_end=i32(ends), block_m=16,
        )  # fmt: skip
        for row in range(2):
            pages = page_ids[int(page_indptr[row]) : int(page_indptr[row + 1])].long()
            total = cached[row] + q_lens[row]
            k = k_cache[pages.to(device)].reshape(-1, kv_heads, dim)[:total]
            v = v_cache[pages.to(device)].reshape(-1, kv_heads, dim)[:total]
            qs = q[indptr[row] : indptr[row + 1]]
            pos = torch.arange(cached[row], total, device=device)[:, None]
            limit = torch.maximum(
                pos, torch.as_tensor(ends[indptr[row] : indptr[row + 1]], device=device)[:, None]
            )
            keys = torch.arange(total, device=device)[None, :]
            mask = keys <= limit
            if window:
                mask &= keys > pos - window
            scores = torch.einsum("qhd,khd->hqk", qs, k.repeat_interleave(2, 1)) * dim**-0.5
            probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
            want = torch.einsum("hqk,khd->qhd", probs, v.repeat_interleave(2, 1))
            got = out[indptr[row] : indptr[row + 1]]
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (window, row)


def test_load_runner_reads_a_transformers_checkpoint(device: str) -> None:
    """`load_runner` on a `Gemma3ForConditionalGeneration` folder saved by transformers (nested
    `model.language_model.*` / `model.vision_tower.*` names) writes the reference's tokens."""
    pytest.importorskip("transformers")
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.registry import load_runner as load_reference
    from tests.models.vision_hf import gemma3_vlm, with_images

    folder, _ = gemma3_vlm()
    options = RunnerOptions(page_size=4, max_batch=4, max_context=128, num_pages=160)
    fast = load_runner(folder, options, device, torch.float32)
    reference = load_reference(folder, device, torch.float32, page_size=4, num_pages=160)
    rng = np.random.default_rng(5)
    pixels = [rng.standard_normal((3, 56, 56)) for _ in range(2)]
    prompt = with_images(rng.integers(0, 290, 9).tolist(), [0, 5], 4, pixels, True)
    assert _generate(fast, [prompt], 6, 3)[0] == _generate(reference, [prompt], 6, 3)[0]
