"""DeepSeek-V4 reference runner against `transformers`' `DeepseekV4ForCausalLM` (fp32, CPU).

The tiny model keeps every mechanism of the real one: the checkpoint's schedule (two
sliding-only layers, then CSA and HCA), hash routing in the first layer, mHC with 2 streams,
a YaRN compress rope, a 16-token window. The HCA ratio is shrunk from 128 to 16 so that prompts
of ~300 tokens emit many entries of both compressed kinds; the CSA ratio stays 4.

The indexer's top-k (4 of up to ~80 candidates) is active. Its scores go through ReLU, so with
few indexer heads many tie at exactly 0 and `torch.topk` may keep different members of a tie in
different computations. The comparison is made tie-aware by construction: 8 indexer heads make
an all-zero score rare, and each test first checks, on transformers' own scores for the whole
sequence, that no query's k-th and (k+1)-th candidates are within `TIE` of each other, so the
selection is unique and the logits must agree everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from dsv4_tiny import _CONFIG, HCA_RATIO, _checkpoint
from ref_compare import hf_greedy, hf_logits

from resin import Compressed, Engine, SamplingParams, State, TokensEvent, Window
from resin_app.bench.checkpoint import write_checkpoint
from resin_model.hf_config import parse_config
from resin_model.presets import checkpoint_bytes, param_counts, preset, preset_hf
from resin_model.quant_checkpoint import quantization_config
from resin_models_torch.deepseek_v4 import DeepseekV4ForCausalLM, v4_checkpoint_name
from resin_models_torch.registry import load_runner
from resin_models_torch.runner import RecordedStep

torch.set_num_threads(1)  # tiny matrices: threads only add contention

TIE = 1e-6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    return _checkpoint(tmp_path_factory.mktemp("dsv4"))


def _prompt(seed: int, n: int) -> list[int]:
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference(hf: Any, tokens: list[int]) -> tuple[torch.Tensor, int]:
    """transformers' logits over `tokens`, after checking that its indexer selection is unique
    at every query (no tie within TIE at the top-k boundary); also returns how many queries
    had more candidates than the top-k keeps."""
    scores: list[torch.Tensor] = []
    indexer = hf.model.layers[2].self_attn.compressor.indexer
    handle = indexer.scorer.register_forward_hook(lambda m, i, out: scores.append(out[0]))
    logits = hf_logits(hf, tokens)
    handle.remove()
    k, ratio, active = indexer.index_topk, indexer.compress_rate, 0
    for p in range(len(tokens)):
        candidates = (p + 1) // ratio
        if candidates > k:
            ranked = scores[0][p, :candidates].sort(descending=True).values
            assert float(ranked[k - 1] - ranked[k]) > TIE, f"tie at position {p}"
            active += 1
    return logits, active


def _worst(recorded: list[RecordedStep], request_id: int, ref: torch.Tensor) -> float:
    """Largest |resin - transformers| logit over every position computed for the request."""
    worst = 0.0
    for step in recorded:
        mask = torch.from_numpy(step.sequence_ids == request_id)
        if mask.any():
            assert step.logits is not None
            positions = torch.from_numpy(step.positions.astype("int64"))[mask]
            worst = max(worst, float((step.logits[mask] - ref[positions]).abs().max()))
    return worst


def test_config_schedule_and_names(tiny: tuple[Path, Any]) -> None:
    folder, _ = tiny
    raw = {"model_type": "deepseek_v4", "bos_token_id": 0, "eos_token_id": 1, **_CONFIG}
    v4 = parse_config(raw).deepseek_v4
    assert v4 is not None
    assert v4.attention == ("sliding", "sliding", "csa", "hca")
    assert (v4.csa_ratio, v4.hca_ratio, v4.rope_dim) == (4, HCA_RATIO, 8)
    assert v4.hash_layers == (True, False, False, False)
    assert v4.compress_rope.kind == "yarn" and v4.compress_rope.attention_factor == 1.0
    # the published Flash schedule (43 layers) is read as listed, not the class default
    flash = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(41)]
    big = parse_config({**raw, "num_hidden_layers": 43, "compress_ratios": flash})
    assert big.deepseek_v4 is not None
    kinds = big.deepseek_v4.attention
    assert kinds[:4] == ("sliding", "sliding", "csa", "hca")
    assert (kinds.count("csa"), kinds.count("hca")) == (21, 20)
    default = parse_config({k: v for k, v in raw.items() if k != "compress_ratios"})
    assert default.deepseek_v4 is not None and default.deepseek_v4.attention[:3] == (
        "hca", "hca", "hca")  # fmt: skip
    # the saved folder's spelling (layer_types, compress_rates, nested rope) reads the same
    assert parse_config(json.loads((folder / "config.json").read_text())) == (parse_config(raw))
    with pytest.raises(ValueError, match="compress_ratios"):
        parse_config({**raw, "compress_ratios": [0, 0, 4, 64]})
    # published names (no `model.` prefix) and transformers' saved names load the same
    assert v4_checkpoint_name("embed.weight") == "model.embed_tokens.weight"
    assert v4_checkpoint_name("head.weight") == "lm_head.weight"
    assert v4_checkpoint_name("hc_head_fn") == "model.hc_head.hc_fn"
    # the MTP layer: its own pieces, a decoder layer's names, no copy of embedding or head
    mtp = {
        "mtp.0.attn.wq_a.weight": "mtp.0.self_attn.q_a_proj.weight",
        "mtp.0.attn.kv_norm.weight": "mtp.0.self_attn.kv_norm.weight",
        "mtp.0.attn.norm.weight": "mtp.0.self_attn.kv_norm.weight",
        "mtp.0.hc_attn_fn": "mtp.0.attn_hc.fn",
        "mtp.0.ffn.experts.1.w3.weight": "mtp.0.mlp.experts.1.up_proj.weight",
        "mtp.0.e_proj.weight": "mtp.0.e_proj.weight",
        "mtp.0.hnorm.weight": "mtp.0.hnorm.weight",
        "mtp.0.norm.weight": "mtp.0.norm.weight",
        "mtp.0.hc_head_scale": "mtp.0.hc_head.hc_scale",
        "mtp.0.emb.tok_emb.weight": None,
        "mtp.0.head.weight": None,
    }
    for published, mapped in mtp.items():
        assert v4_checkpoint_name(published) == mapped
        assert v4_checkpoint_name("model." + published) == mapped
    expect = {
        "layers.2.attn.indexer.compressor.wkv.weight": "compressor.indexer.kv_proj.weight",
        "layers.2.attn.indexer.wq_b.weight": "compressor.indexer.q_b_proj.weight",
        "layers.2.attn.indexer.weights_proj.weight": "compressor.indexer.scorer.weights_proj",
        "layers.2.attn.compressor.ape": "self_attn.compressor.position_bias",
        "layers.2.attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
        "layers.2.attn.wq_b.weight": "self_attn.q_b_proj.weight",
        "layers.2.attn.attn_sink": "self_attn.sinks",
        "layers.2.ffn.experts.3.w2.weight": "mlp.experts.3.down_proj.weight",
        "layers.2.ffn.gate.bias": "mlp.gate.e_score_correction_bias",
        "layers.2.hc_ffn_fn": "layers.2.ffn_hc.fn",
    }
    for published, ours in expect.items():
        for name in (published, "model." + published):
            mapped = v4_checkpoint_name(name)
            assert mapped is not None and mapped.startswith("model.layers.2.")
            assert ours in mapped, (name, mapped)


@pytest.mark.parametrize("page_size", [16, 4])
def test_full_prompt_logits_match_transformers(tiny: tuple[Path, Any], page_size: int) -> None:
    folder, hf = tiny
    prompt = _prompt(1, 320)
    ref, active = _reference(hf, prompt)
    assert active > 250  # the top-k is active almost everywhere
    runner = load_runner(folder, page_size=page_size)
    # the window of every layer; CSA entries (K=V 32 + indexer key 16) and HCA entries; the
    # pending projections of each kind (CSA: 7 tokens x (2 x 64 + 2 x 32), HCA: 15 x 2 x 32)
    per_page = {16: (4, 1), 4: (1, 1)}[page_size]
    assert runner.runner_config.cache_groups == (
        Window(16, 4 * page_size * 32 * 4),
        Compressed(4, per_page[0] * 48 * 4),
        Compressed(HCA_RATIO, per_page[1] * 32 * 4),
        State(7 * 192 * 4),
        State(15 * 64 * 4),
    )
    # sliding layers read the window; CSA its entries and state, HCA its own
    assert runner.runner_config.layer_groups == ((0,), (0,), (0, 1, 3), (0, 2, 4))
    runner.record_logits = True
    params = SamplingParams(max_output_tokens=1, temperature=0.0)
    with Engine(runner, context_length=512, prefill_chunk_tokens=512) as engine:
        request = engine.submit(prompt, params)
        while engine.has_work():
            engine.step()
    assert sum(int((s.sequence_ids == request.id).sum()) for s in runner.recorded) == 320
    assert _worst(runner.recorded, request.id, ref) < 2e-4


def _collect(engine: Engine) -> dict[int, list[TokensEvent]]:
    events: dict[int, list[TokensEvent]] = {}
    while engine.has_work():
        for event in engine.step():
            if isinstance(event, TokensEvent):
                events.setdefault(event.request_id, []).append(event)
    return events


@pytest.mark.parametrize(("page_size", "chunk", "num_pages"), [(16, 16, 88), (4, 12, 220)])
def test_engine_chunks_retraction_prefix_hit(
    tiny: tuple[Path, Any], page_size: int, chunk: int, num_pages: int
) -> None:
    """Chunked prefill and decode for two 300-token prompts at once in too few pages
    for both to finish: the engine evicts what only the prefix cache holds, then retracts
    the second and recomputes it; then a third prompt shares a prefix of the second (whose
    recompute ran with room to spare, so the cache kept its Window pages): a hit at a page
    boundary where the engine kept a State checkpoint (the CSA overlap, and any pending HCA
    tokens, come from it)."""
    folder, hf = tiny
    second = _prompt(4, 300)
    shared = 256 + (page_size if page_size < HCA_RATIO else 0)
    prompts = [_prompt(2, 300), second, second[:shared] + _prompt(3, 40)]
    new = (40, 40, 8)
    runner = load_runner(folder, page_size=page_size, num_pages=num_pages)
    runner.record_logits = True
    # prompt logprobs for the second request only (a request asking for them skips the
    # prefix cache)
    params = [SamplingParams(max_output_tokens=n, temperature=0.0) for n in new]
    params[1] = SamplingParams(max_output_tokens=new[1], temperature=0.0, prompt_logprobs=1)
    with Engine(runner, context_length=512, prefill_chunk_tokens=chunk, max_batch_tokens=32,
                prefix_cache=True) as engine:  # fmt: skip
        requests = [engine.submit(p, q) for p, q in zip(prompts[:2], params, strict=False)]
        events = _collect(engine)
        assert engine.metrics is not None and engine.metrics.num_preemptions > 0
        requests.append(engine.submit(prompts[2], params[2]))
        events.update(_collect(engine))
    # the tight pool evicted part of the shared prefix: the hit is whole pages of it
    hit = requests[2].cached_tokens
    assert 0 < hit <= shared and hit % page_size == 0
    for request, prompt, n in zip(requests, prompts, new, strict=True):
        generated = request.take_result()
        tokens = prompt + generated
        logits, _ = _reference(hf, tokens)
        assert _worst(runner.recorded, request.id, logits) < 2e-4
        assert generated == hf_greedy(hf, prompt, n)
        lps = [lp for e in events.get(request.id, []) for lp in (e.prompt_logprobs or ())]
        assert len(lps) == (len(prompt) - 1 if request is requests[1] else 0)
        ref = torch.log_softmax(logits, dim=-1)
        for p, value in enumerate(lps):
            assert abs(value - float(ref[p, prompt[p + 1]])) < 2e-4


def test_bfloat16_within_transformers_own_error(tiny: tuple[Path, Any]) -> None:
    """bf16 weights and activations: our logits stay as close to the fp32 reference as
    transformers' own bf16 model does (max and mean |error| within 1.5x of its)."""
    folder, hf = tiny
    prompt = _prompt(1, 320)
    ref = hf_logits(hf, prompt)
    hf_bf16 = transformers.DeepseekV4ForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    theirs = (hf_logits(hf_bf16.eval(), prompt) - ref).abs()
    runner = load_runner(folder, dtype=torch.bfloat16, page_size=16)
    runner.record_logits = True
    params = SamplingParams(max_output_tokens=1, temperature=0.0)
    with Engine(runner, context_length=512, prefill_chunk_tokens=16) as engine:
        engine.submit(prompt, params)
        while engine.has_work():
            engine.step()
    ours = torch.full_like(ref, float("nan"))
    for step in runner.recorded:
        assert step.logits is not None
        ours[torch.from_numpy(step.positions.astype("int64"))] = step.logits
    error = (ours[: len(prompt)] - ref).abs()
    assert float(error.max()) < 1.5 * float(theirs.max())
    assert float(error.mean()) < 1.5 * float(theirs.mean())


def test_presets_count_the_published_sizes_and_run(tmp_path: Path) -> None:
    full, reduced = preset("deepseek-v4-flash"), preset("deepseek-v4-flash-8l")
    assert full.deepseek_v4 is not None and reduced.deepseek_v4 is not None
    assert (full.deepseek_v4.attention.count("csa"), full.deepseek_v4.attention.count("hca")) == (
        21, 20)  # fmt: skip
    assert reduced.deepseek_v4.attention == ("sliding",) * 2 + ("csa", "hca") * 3
    embedding = full.vocab_size * full.hidden_size
    active, total = param_counts(full)
    assert 284.2 < (total + embedding) / 1e9 < 284.5  # 284 B published (MTP left out)
    assert 13.2 < active / 1e9 < 13.3  # 13.3 B a token without the embedding
    # the 8-layer preset fits one H200 (~141 GB) in bf16 and in FP8 (head and embedding bf16)
    assert 107 < checkpoint_bytes(reduced) / 1e9 < 108
    fp8_block = quantization_config("fp8-block")
    raw = {**preset_hf("deepseek-v4-flash-8l"), "quantization_config": fp8_block}
    fp8 = parse_config(raw)
    assert 54 < checkpoint_bytes(fp8) / 1e9 < 55.5
    # `resin bench checkpoint`'s folder of the tiny preset loads (MTP included) and serves; the
    # hash-routing table spreads tokens over the experts
    written = write_checkpoint(preset_hf("tiny-deepseek_v4"), tmp_path / "tiny")
    runner = load_runner(written.folder, page_size=16)
    model = runner.model
    assert isinstance(model, DeepseekV4ForCausalLM) and len(model.mtp) == 1
    table = model.model.layers[0].mlp.gate.tid2eid
    assert table is not None and set(table[:2].flatten().tolist()) == {0, 1, 2, 3}
    with Engine(runner, context_length=256) as engine:
        request = engine.submit(_prompt(3, 40), SamplingParams(max_output_tokens=4))
        while engine.has_work():
            engine.step()
    assert len(request.take_result()) == 4
