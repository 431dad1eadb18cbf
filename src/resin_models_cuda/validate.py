"""Correctness of a `CudaRunner` against Hugging Face transformers on the same weights.

Three scenarios drive the runner through `PagedPlanner` plans: mixed prefill batch sizes with
decode in two alternating batches (several graph buckets), chunked prefill with partial rows
(decode of the whole set, eager when above `max_batch`), and prefix sharing (the second prompt
of each pair reuses the first's full pages). Each greedy continuation is checked by teacher
forcing: transformers runs prompt + continuation in one forward, and the continuation agrees
when every generated token is transformers' argmax at its position (then transformers' own
greedy decode would produce the same tokens). The runner's logits at each prompt's last token
are compared with transformers' there. For a bf16 runner the oracle is transformers in float32,
and transformers in bf16 is judged against the same oracle, so the runner's error can be read
against what bf16 itself costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from resin.plan import Phase
from resin.protocols import CacheLayout
from resin_models_cuda.config import ModelConfig
from resin_models_cuda.hf_baseline import build_hf_model
from resin_models_cuda.plans import PagedPlanner, Sequence
from resin_models_cuda.runner import CudaRunner, RunnerOptions
from resin_models_cuda.weights import ModelWeights, cast_weights


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    name: str
    prompts: int
    new_tokens: int
    agree: int  # continuations equal to transformers' greedy for all new_tokens
    mean_agreed_prefix: float  # tokens agreed before the first mismatch, averaged
    logit_max_abs_diff: float  # over every prompt's last-token logits
    logit_mean_abs_diff: float
    logit_ref_max_abs: float  # scale of transformers' logits
    mismatch_margins: tuple[float, ...]  # oracle's top-1 minus our token's logit there
    position_agreement: float  # fraction of generated positions equal to the oracle's argmax
    oracle: str  # dtype of the transformers oracle
    baseline_logit_max_abs_diff: float = float("nan")  # transformers in the runner's dtype
    baseline_logit_mean_abs_diff: float = float("nan")
    baseline_position_agreement: float = float("nan")

    @property
    def agree_fraction(self) -> float:
        return self.agree / self.prompts


def _prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


class _Driver:
    """Runs plans and appends sampled tokens; remembers each prompt's first-token logits."""

    def __init__(self, runner: CudaRunner, planner: PagedPlanner) -> None:
        self.runner, self.planner = runner, planner
        self.first_logits: dict[int, torch.Tensor] = {}

    def step(self, rows: list[tuple[Sequence, int]], phase: Phase) -> None:
        plan = self.planner.plan(rows, phase)
        out = self.runner.forward(plan)
        self.planner.commit(rows)
        logits = self.runner.last_logits
        assert logits is not None
        k = 0
        for i, (seq, _) in enumerate(rows):
            if out.token_indptr[i + 1] > out.token_indptr[i]:
                if seq.seq_id not in self.first_logits:
                    self.first_logits[seq.seq_id] = logits[k].float().cpu()
                seq.tokens.append(int(out.token_ids[out.token_indptr[i]]))
                k += 1

    def decode(self, groups: list[list[Sequence]], steps: int) -> None:
        for _ in range(steps):
            for group in groups:
                self.step([(s, 1) for s in group], Phase.DECODE)


def _scenario_batched(d: _Driver, prompts: list[list[int]], new: int) -> list[Sequence]:
    seqs = [d.planner.new_sequence(p) for p in prompts]
    sizes, at = [1, 3, 12], 0
    for size in [*sizes, len(seqs)]:
        batch = seqs[at : at + size]
        if batch:
            d.step([(s, len(s.tokens)) for s in batch], Phase.PREFILL)
        at += size
    cut = (len(seqs) * 5) // 8
    d.decode([seqs[:cut], seqs[cut:]], new - 1)
    return seqs


def _scenario_chunked(d: _Driver, prompts: list[list[int]], new: int, chunk: int) -> list[Sequence]:
    seqs = [d.planner.new_sequence(p) for p in prompts]
    for g in range(0, len(seqs), 16):
        group = list(zip(seqs[g : g + 16], prompts[g : g + 16], strict=True))
        while any(s.cached < len(p) for s, p in group):
            rows = [(s, min(chunk, len(p) - s.cached)) for s, p in group]
            d.step([r for r in rows if r[1] > 0], Phase.PREFILL)
    d.decode([seqs], new - 1)
    return seqs


def _scenario_prefix(
    d: _Driver, prompts: list[list[int]], new: int, rng: np.random.Generator
) -> list[Sequence]:
    half = len(prompts) // 2
    firsts = [d.planner.new_sequence(p) for p in prompts[:half]]
    d.step([(s, len(s.tokens)) for s in firsts], Phase.PREFILL)
    seconds = []
    for s, other in zip(firsts, prompts[half:], strict=False):
        prompt = s.tokens[: len(other)]
        keep = int(rng.integers(d.planner.page_size, max(d.planner.page_size + 1, len(prompt))))
        tokens = prompt[:keep] + other[keep:]
        seconds.append(d.planner.new_sequence(tokens, share=s, shared_tokens=keep))
    # The shared prompt tokens are the first's prompt tokens, so the cached pages are valid.
    d.step([(s, len(s.tokens) - s.cached) for s in seconds], Phase.PREFILL)
    d.decode([firsts + seconds], new - 1)
    return firsts + seconds


def _judge(
    name: str, model: object, seqs: list[Sequence], prompt_lens: list[int], new: int,
    first_logits: dict[int, torch.Tensor], device: torch.device, baseline: object | None,
) -> ScenarioResult:  # fmt: skip
    agree, prefixes, margins, diffs, means, scale = 0, [], [], [], [], 0.0
    same_all, base_same, base_max, base_mean = [], [], [], []
    for seq, plen in zip(seqs, prompt_lens, strict=True):
        ids = torch.tensor([seq.tokens[: plen + new - 1]], device=device)
        with torch.no_grad():
            ref = model(ids).logits[0].float()  # type: ignore[operator]
            base = None if baseline is None else baseline(ids).logits[0].float()  # type: ignore[operator]
        ours = torch.tensor(seq.tokens[plen : plen + new], device=device)
        pred = ref[plen - 1 : plen - 1 + new].argmax(-1)
        if base is not None:
            base_pred = base[plen - 1 : plen - 1 + new].argmax(-1)
            base_same.append(float((base_pred == pred).float().mean()))
            d = (base[plen - 1] - ref[plen - 1]).abs()
            base_max.append(float(d.max()))
            base_mean.append(float(d.mean()))
        same = (pred == ours).cpu().numpy()
        same_all.append(float(same.mean()))
        n = int(np.argmin(same)) if not same.all() else new
        prefixes.append(n)
        if n == new:
            agree += 1
        else:
            row = ref[plen - 1 + n]
            margins.append(float(row.max() - row[ours[n]]))
        mine = first_logits[seq.seq_id].to(device)
        diff = (mine - ref[plen - 1]).abs()
        diffs.append(float(diff.max()))
        means.append(float(diff.mean()))
        scale = max(scale, float(ref[plen - 1].abs().max()))
    oracle = str(next(model.parameters()).dtype)  # type: ignore[attr-defined]
    nan = float("nan")
    return ScenarioResult(
        name, len(seqs), new, agree, float(np.mean(prefixes)), max(diffs), float(np.mean(means)),
        scale, tuple(sorted(margins)), float(np.mean(same_all)), oracle,
        max(base_max) if base_max else nan, float(np.mean(base_mean)) if base_mean else nan,
        float(np.mean(base_same)) if base_same else nan,
    )  # fmt: skip


def validate(
    config: ModelConfig,
    weights: ModelWeights,
    options: RunnerOptions,
    *,
    num_prompts: int = 64,
    new_tokens: int = 32,
    prompt_lens: tuple[int, int] = (20, 300),
    chunk: int = 97,
    seed: int = 0,
    progress: Callable[[str], None] = lambda _: None,
) -> list[ScenarioResult]:
    """Run the three scenarios; returns one result per scenario."""
    longest = prompt_lens[1] + new_tokens + 1
    opts = replace(options, keep_logits=True, num_pages=None,
                   max_context=max(options.max_context, longest))  # fmt: skip
    runner = CudaRunner(config, weights, opts)
    per_seq = -(-(prompt_lens[1] + new_tokens) // opts.page_size) + 1
    num_pages = 3 * num_prompts * per_seq + 8
    rc = runner.runner_config
    runner.bind(CacheLayout(num_pages, opts.page_size, rc.page_bytes, rc.cache_groups))
    # The oracle is transformers in float32 on a float32 copy of the weights; transformers in
    # the runner's own dtype (same memory as the runner) is judged against it as a baseline.
    device = weights.embed.device
    baseline = None
    if weights.embed.dtype != torch.float32:
        model = build_hf_model(config, cast_weights(weights, torch.float32))
        baseline = build_hf_model(config, weights)
    else:
        model = build_hf_model(config, weights)
    rng = np.random.default_rng(seed)
    results = []
    plans: list[tuple[str, Callable[[_Driver, list[list[int]]], list[Sequence]]]] = [
        ("batched", lambda d, p: _scenario_batched(d, p, new_tokens)),
        ("chunked", lambda d, p: _scenario_chunked(d, p, new_tokens, chunk)),
        ("prefix", lambda d, p: _scenario_prefix(d, p, new_tokens, rng)),
    ]
    planner = PagedPlanner(num_pages, opts.page_size)
    for i, (name, run) in enumerate(plans):
        prompts = _prompts(num_prompts, *prompt_lens, config.vocab_size, seed + i)
        driver = _Driver(runner, planner)
        seqs = run(driver, prompts)
        lens = [len(s.tokens) - new_tokens for s in seqs]
        progress(f"{name}: generated, judging with transformers")
        results.append(
            _judge(name, model, seqs, lens, new_tokens, driver.first_logits, device, baseline)
        )
    runner.close()
    return results
