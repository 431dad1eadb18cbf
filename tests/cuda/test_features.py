"""The request features the server exposes, on the fast runner against the reference runner on
the same weights, through the Engine, in float32 (CPU: the Triton interpreter):

- sampled-token logprobs and their top-k alternatives, with and without `logit_bias` (a bias
  that moves the argmax), greedy: identical tokens and top-k ids, values within tolerance;
- grammar masks (llguidance's bitmask, SmolLM2's tokenizer): identical greedy tokens, inside
  the grammar (seeded masked sampling: `test_async_runner.py`);
- seeds and top-k / top-p / min-p: the two families draw differently (docs/gpu.md "Request
  features"), so a seeded fast run must give the same tokens alone and batched, and every
  token it samples must lie in the set the filter allows under the reference model's logits
  at that position (teacher-forced), with some tokens off the argmax;
- speculative decoding with the n-gram proposer and with draft models (the same weights on a
  second fast runner: every draft accepted; unrelated weights: mostly rejected): the
  reference runner's greedy tokens;
- images need a vision encoder: a text-only fast runner refuses them at submit, naming them
  (Gemma 3 with images is `test_gemma3_vision.py`)."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
import torch

from resin import Constraint, Engine, SamplingParams
from resin.engine.proposers import DraftModelProposer, NgramProposer
from resin.engine.speculative import Speculation
from resin.events import ErrorEvent, TokensEvent
from resin.plan import MediaItem
from resin_model.presets import TINY
from tests.cuda.test_gemma3_vision import RAW as VISION
from tests.cuda.test_vs_reference import reference_and_fast

ATOL = 2e-4
ENGINE: dict[str, Any] = {
    "context_length": 100,
    "prefix_cache": True,
    "prefill_chunk_tokens": 8,
    "max_batch_tokens": 40,
    "max_sequences": 8,
}


def _run(runner: Any, requests: list[tuple[list[int], SamplingParams]], **kw: Any) -> list[Any]:
    """Per request: output tokens, their logprobs [n] and top-k (ids, logprobs)."""
    with Engine(runner, **(ENGINE | kw)) as engine:
        handles = [engine.submit(p, s) for p, s in requests]
        events: dict[int, list[TokensEvent]] = {h.id: [] for h in handles}
        while engine.has_work():
            for event in engine.step():
                assert not isinstance(event, ErrorEvent), event.message
                if isinstance(event, TokensEvent):
                    events[event.request_id].append(event)
    out = []
    for h in handles:
        lps = [lp for e in events[h.id] for lp in e.logprobs or ()]
        tops = [row for e in events[h.id] for row in e.top_logprobs or ()]
        ids = [[t.token_id for t in row] for row in tops]
        values = np.asarray([[t.logprob for t in row] for row in tops])
        out.append((list(h.output_token_ids), np.asarray(lps), ids, values))
    return out


def _prompts(vocab: int, n: int = 3, seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, vocab, size=9).tolist()
    return [shared + rng.integers(0, vocab, size=2 + 5 * i).tolist() for i in range(n)]


def test_logprobs_and_logit_bias_match_the_reference_runner(device: str) -> None:
    reference, fast = reference_and_fast(TINY["llama"], device)
    plain = SamplingParams(max_output_tokens=4, temperature=0.0, ignore_stop_tokens=True)
    want = _run(reference, [(p, plain) for p in _prompts(256)])
    favoured = want[1][0][1]  # the second token request 1 writes: biased up from the first
    biased = {favoured: 100.0, want[0][0][0]: -100.0}
    params = [
        SamplingParams(max_output_tokens=4, temperature=0.0, ignore_stop_tokens=True, logprobs=k)
        for k in (0, 3)
    ]
    params.append(
        SamplingParams(max_output_tokens=4, temperature=0.0, ignore_stop_tokens=True,
                       logprobs=5, logit_bias=tuple(sorted(biased.items())))
    )  # fmt: skip
    requests = list(zip(_prompts(256), params, strict=True))
    got, want = _run(fast, requests), _run(reference, requests)
    for g, w in zip(got, want, strict=True):
        assert g[0] == w[0] and g[2] == w[2]
        np.testing.assert_allclose(g[1], w[1], atol=ATOL, rtol=0)
        if w[3].size:
            np.testing.assert_allclose(g[3], w[3], atol=ATOL, rtol=0)
    assert got[2][0] == [favoured] * 4  # the bias decided every token
    assert len(got[0][2]) == 0 and len(got[1][2][0]) == 3 and len(got[2][2][0]) == 5
    assert got[2][1].max() > -1e-3  # logprobs of the biased distribution


def _smol_tokenizer() -> Any:
    from resin.tokenizer import Tokenizer
    from resin_model.default_model import default_model_dir

    try:
        return Tokenizer.from_dir(default_model_dir())
    except FileNotFoundError as exc:
        pytest.skip(f"default model unavailable: {exc}")


def test_grammar_masks_match_the_reference_runner(device: str) -> None:
    from resin import GrammarBackend

    tok = _smol_tokenizer()
    grammar = GrammarBackend.from_tokenizer(tok)
    reference, fast = reference_and_fast({**TINY["llama"], "vocab_size": tok.vocab_size}, device)
    regex = Constraint("regex", "(yes|no)[0-9]{2,5}")
    schema = Constraint.json_schema(
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
         "additionalProperties": False}
    )  # fmt: skip
    stops = tok.eos_token_ids

    def params(c: Constraint) -> SamplingParams:
        return SamplingParams(max_output_tokens=16, temperature=0.0, stop_token_ids=stops,
                              constraint=c)  # fmt: skip

    requests = [(p, params(c)) for p, c in zip(_prompts(1000, 2), (regex, schema), strict=True)]
    got = _run(fast, requests, grammar=grammar)
    assert [g[0] for g in got] == [w[0] for w in _run(reference, requests, grammar=grammar)]
    texts = [tok.decode([t for t in g[0] if t not in stops]) for g in got]
    assert re.fullmatch(r"(yes|no)[0-9]{2,5}", texts[0]), texts[0]
    assert json.loads(texts[1]) in ({"ok": True}, {"ok": False})


def _allowed(logits: torch.Tensor, p: SamplingParams) -> set[int]:
    """Ids the filters keep under `logits` (vLLM's order: temperature, top-k, top-p, min-p)."""
    probs = torch.softmax(logits.double() / p.temperature, dim=-1)
    ordered, ids = probs.sort(descending=True)
    keep = (ordered.cumsum(0) - ordered) < p.top_p
    if p.top_k:
        keep[p.top_k :] = False
    keep &= ordered >= p.min_p * ordered[0]
    keep[0] = True
    return set(ids[keep].tolist())


def _teacher_forced(reference: Any, prompt: list[int], out: list[int]) -> torch.Tensor:
    """The reference model's logits for each output position [len(out), V]."""
    reference.record_logits, reference.recorded = True, []
    params = SamplingParams(max_output_tokens=1, temperature=0.0)
    with Engine(reference, context_length=100, prefill_chunk_tokens=100) as engine:
        engine.submit(prompt + out[:-1], params)
        while engine.has_work():
            engine.step()
    reference.record_logits = False
    logits = reference.recorded[0].logits
    return logits[len(prompt) - 1 :]


FILTERS: list[dict[str, Any]] = [
    {"top_k": 3, "temperature": 4.0},
    {"top_p": 0.6, "temperature": 4.0},
    # min-p keeps every token whose logit is within temperature * ln(1 / min_p) of the best:
    # at temperature 4 that is 6.4, more than the random model's logits may span (its weights
    # are drawn on the device, so they differ between the GPU and the CPU interpreter), and the
    # filter would then rightly keep the whole vocabulary and test nothing. At 1.5 it is 2.4.
    {"min_p": 0.2, "temperature": 1.5},
    {"top_k": 4, "top_p": 0.8, "min_p": 0.05, "temperature": 4.0},
]


def test_seeded_filters_keep_to_the_reference_allowed_sets(device: str) -> None:
    reference, fast = reference_and_fast(TINY["llama"], device)
    prompts = _prompts(256, 4, seed=8)
    requests = [
        (prompt, SamplingParams(max_output_tokens=6, seed=11 + i, ignore_stop_tokens=True, **f))
        for i, (prompt, f) in enumerate(zip(prompts, FILTERS, strict=True))
    ]  # fmt: skip
    batched = _run(fast, requests)
    alone = [_run(fast, [r])[0] for r in requests[:2]]
    assert [b[0] for b in batched[:2]] == [a[0] for a in alone]  # the seed, not the batch
    off_argmax = 0
    for (prompt, params), (tokens, *_) in zip(requests, batched, strict=True):
        logits = _teacher_forced(reference, prompt, tokens)
        for j, token in enumerate(tokens):
            allowed = _allowed(logits[j], params)
            assert token in allowed, (params, j, token, allowed)
            assert len(allowed) < 256  # the filter bit
            off_argmax += token != int(logits[j].argmax())
    assert off_argmax >= 3  # these rows sampled, not just took the argmax


def test_speculation_gives_the_reference_runner_tokens(device: str) -> None:
    from resin_models_cuda import CudaRunner
    from resin_models_torch.registry import random_runner

    reference, fast = reference_and_fast(TINY["llama"], device)
    rng = np.random.default_rng(5)
    motif = rng.integers(0, 256, size=6).tolist()
    prompts = [motif * 3 + [7], motif * 2]
    greedy = SamplingParams(max_output_tokens=5, temperature=0.0, ignore_stop_tokens=True)
    requests = [(p, greedy) for p in prompts]
    want = [w[0] for w in _run(reference, requests)]
    proposers: list[Any] = [
        NgramProposer(max_ngram=3, min_ngram=1),
        DraftModelProposer(CudaRunner(fast.model, fast.options), context_length=100),
        DraftModelProposer(random_runner(TINY["llama"], seed=9, page_size=4), context_length=100),
    ]
    for proposer in proposers:
        spec = Speculation(proposer, num_draft_tokens=3)
        runner = CudaRunner(fast.model, fast.options)
        with Engine(runner, speculation=spec, **ENGINE) as engine:
            handles = [engine.submit(p, s) for p, s in requests]
            while engine.has_work():
                engine.step()
            assert [list(h.output_token_ids) for h in handles] == want, proposer
            metrics = engine.metrics
            assert metrics is not None and metrics.spec_decode_num_draft_tokens > 0
            accepted = metrics.spec_decode_num_accepted_tokens
            if proposer is proposers[1]:  # the same weights: every draft is right
                assert accepted == metrics.spec_decode_num_draft_tokens
            if proposer is proposers[2]:  # unrelated weights: rejections happen
                assert accepted < metrics.spec_decode_num_draft_tokens


def test_a_text_only_fast_runner_refuses_images_at_submit(device: str) -> None:
    _, fast = reference_and_fast(TINY["llama"], device)
    assert "media" not in fast.runner_config.features
    assert {"prompt_logprobs", "logit_bias", "constraint"} <= fast.runner_config.features
    image = MediaItem(0, 1, 4, "x", np.zeros((3, 56, 56), dtype=np.float32))
    with Engine(fast, **ENGINE) as engine:
        with pytest.raises(ValueError, match=r"does not support media \(images\)"):
            engine.submit([1] * 8, media=[image])
        assert not engine.has_work()
    _, vision = reference_and_fast(VISION, device)
    assert "media" in vision.runner_config.features
