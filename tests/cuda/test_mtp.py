"""MTP drafts on the fast runner (`RunnerOptions.mtp`): a tiny random DeepSeek-V3 with one MTP
layer, fp32, through the engine's speculative decoding. The fast runner's drafts are the
reference `MtpRunner`'s, proposal by proposal, and greedy tokens are the same with and without
drafts, also under chunked prefill and prefix hits (where a draft may differ, never a token)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from resin import Engine, SamplingParams
from resin.engine.proposers import MtpProposer
from resin.engine.request import Request
from resin.engine.speculative import Speculation
from tests.cuda.test_vs_reference import reference_and_fast
from tests.models.test_deepseek_mtp import CONFIG as MTP_CONFIG

VOCAB = 64
# The reference MTP test's model, with a vocabulary where greedy choices are not near-ties and a
# rope wide enough for `tl.dot` on the GPU (K >= 16).
CONFIG: dict[str, Any] = {**MTP_CONFIG, "vocab_size": VOCAB, "qk_rope_head_dim": 16}


class Recording:
    """The proposer's answers, as (sequence length, drafts) per request in submit order."""

    def __init__(self, inner: MtpProposer) -> None:
        self.inner = inner
        self.seen: list[tuple[int, int, list[int]]] = []

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        out = self.inner.propose(requests, limits)
        self.seen += [(r.id, r.num_tokens, d) for r, d in zip(requests, out, strict=True)]
        return out


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(5)
    shared = rng.integers(0, VOCAB, size=9).tolist()
    return [[*shared, 3, 1], rng.integers(0, VOCAB, size=6).tolist(), [*shared, 7]]


def _run(runner: Any, proposer: Any, *, chunk: int, prefix: bool) -> list[list[int]]:
    speculation = None if proposer is None else Speculation(proposer, num_draft_tokens=1)
    with Engine(
        runner,
        context_length=96,
        prefix_cache=prefix,
        prefill_chunk_tokens=chunk,
        max_batch_tokens=64,
        speculation=speculation,
    ) as engine:
        params = SamplingParams(max_output_tokens=10, temperature=0.0)
        requests = [engine.submit(p, params) for p in _prompts()]
        while engine.has_work():
            engine.step()
    return [r.take_result() for r in requests]


@pytest.fixture(scope="module")
def runners() -> tuple[Any, Any, Any]:
    from resin_model.hf_config import parse_config
    from resin_models_cuda import CudaRunner, build_model
    from resin_models_cuda.layers import StateDictWeights
    from resin_models_torch.mtp import MtpRunner

    device = "cuda" if torch.cuda.is_available() else "cpu"
    reference, fast = reference_and_fast(CONFIG, device)
    options = replace(fast.options, mtp=True, max_draft_tokens=1)
    source = StateDictWeights(reference.model.state_dict(), device, torch.float32)
    drafting = CudaRunner(
        build_model(parse_config(CONFIG), source, options.build_options()), options
    )
    mtp = MtpRunner(reference.model, num_drafts=1, page_size=4, num_pages=160)
    return reference, mtp, drafting


def test_fast_mtp_drafts_equal_the_reference_mtp_runner(runners: tuple[Any, Any, Any]) -> None:
    reference, mtp, fast = runners
    expected = _run(reference, None, chunk=512, prefix=False)
    ours, theirs = Recording(MtpProposer()), Recording(MtpProposer())
    assert _run(fast, ours, chunk=512, prefix=False) == expected
    assert _run(mtp, theirs, chunk=512, prefix=False) == expected
    assert ours.seen == theirs.seen
    assert sum(len(d) for _, _, d in ours.seen) > 10  # drafts really were proposed


def test_fast_mtp_keeps_tokens_under_chunks_and_prefix_hits(
    runners: tuple[Any, Any, Any],
) -> None:
    reference, _, fast = runners
    expected = _run(reference, None, chunk=4, prefix=True)
    ours = Recording(MtpProposer())
    assert _run(fast, ours, chunk=4, prefix=True) == expected
    assert sum(len(d) for _, _, d in ours.seen) > 10


def test_mtp_needs_a_checkpoint_with_mtp_layers(device: str) -> None:
    from resin_model.hf_config import parse_config
    from resin_models_cuda import RunnerOptions, build_model
    from resin_models_cuda.layers import RandomWeights

    config = parse_config({**CONFIG, "num_nextn_predict_layers": 0})
    options = RunnerOptions(mtp=True).build_options()
    with pytest.raises(ValueError, match="no MTP layers"):
        build_model(config, RandomWeights(device, torch.float32, seed=0), options)


def test_fast_deepseek_verify_steps_are_causal(runners: tuple[Any, Any, Any]) -> None:
    """Verify steps of an MLA model: each query slot sees the keys up to its own position
    (n-gram drafts, so rows verify drafts the MTP layer did not choose)."""
    from resin.engine.proposers import NgramProposer

    reference, _, fast = runners
    expected = _run(reference, None, chunk=512, prefix=False)
    assert _run(fast, NgramProposer(1, 1), chunk=512, prefix=False) == expected


@pytest.mark.parametrize("runner", ["cuda", "torch"])
@pytest.mark.parametrize("forced", [False, True])
def test_bench_speculative_mtp(tmp_path: Any, runner: str, forced: bool) -> None:
    """`resin bench speculative --speculative mtp`: real MTP drafts keep greedy outputs; with
    `--accepted-drafts 1` every verify step commits two tokens."""
    import json

    from resin_app.cli import main

    out = tmp_path / "spec.jsonl"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    argv = ["bench", "speculative", "--speculative", "mtp", "--random-weights",
            "--model-config", "tiny-deepseek-mtp", "--runner", runner, "--device", device,
            "--num-draft-tokens", "1", "--batch-sizes", "1,2", "--input-len", "8",
            "--output-len", "7", "--output", str(out)]  # fmt: skip
    if forced:
        argv += ["--accepted-drafts", "1"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["draft_tokens"] > 0
        if forced:
            assert r["accepted_tokens"] == r["draft_tokens"] and r["spec_steps"] == 3
        else:
            assert r["identical"] is True


@pytest.mark.parametrize("family", ["cuda", "torch"])
def test_families_build_drafting_runners_for_speculative_mtp(family: str) -> None:
    """`resin serve --speculative mtp` asks its family for `BuildRequest(mtp=True)`: a DeepSeek
    with an MTP layer drafts (`drafts`, which `speculation_for` hands to the engine); a model
    without one is refused before it serves."""
    from resin_app.loading import LoadOptions, speculation_for
    from resin_app.runners import build_runner
    from resin_model.family import BuildRequest
    from resin_model.presets import preset

    device = "cuda" if torch.cuda.is_available() else "cpu"
    request = BuildRequest(device, mtp=True, max_sequences=4, context_length=64)
    runner = build_runner(preset("tiny-deepseek-mtp"), family, request)
    spec = speculation_for(LoadOptions(speculative="mtp"), 64, runner)
    assert isinstance(spec.proposer, MtpProposer) and spec.num_draft_tokens == 1
    with Engine(runner, context_length=64, speculation=spec) as engine:
        request_ = engine.submit([1, 2, 3, 4], SamplingParams(max_output_tokens=5))
        while engine.has_work():
            engine.step()
        assert len(request_.take_result()) == 5
        assert engine.metrics is not None and engine.metrics.spec_decode_num_drafts > 0
    for name in ("tiny-deepseek", "tiny-llama"):
        with pytest.raises(ValueError, match="MTP"):
            build_runner(preset(name), family, request)
    with pytest.raises(ValueError, match="MTP layer"):
        speculation_for(LoadOptions(speculative="mtp"), 64, object())


def test_bench_speculative_quantizes_a_preset_named_with_its_format() -> None:
    """`--model-config NAME:FORMAT` on the cuda runner builds the preset's weights quantized as
    `resin bench runner` does (DeepSeek-V4-Flash at 8 layers fits an 80 GB card only so), and an
    unknown format is refused."""
    from resin_app.bench import speculative

    def built(name: str) -> tuple[int, str | None]:  # bytes held, the quantization method
        args = speculative.parse_args(["--speculative", "mtp", "--random-weights",
                                       "--model-config", name, "--runner", "cuda",
                                       "--device", "cpu", "--num-draft-tokens", "1"])  # fmt: skip
        runner = speculative._runner(args, name, None)
        quant = runner.config.quant
        return runner.model.nbytes(), None if quant is None else quant.scheme

    plain, fp8 = built("tiny-deepseek_v4"), built("tiny-deepseek_v4:fp8-block")
    assert plain[1] is None and fp8[1] == "fp8_block"
    assert fp8[0] < 0.8 * plain[0]
    with pytest.raises(ValueError, match="unknown quantized format"):
        built("tiny-deepseek_v4:fp9")
