"""GLM-5.3 (`glm5_next`) on the fast runner against the reference runner, float32, in the
Triton interpreter on CPU: a tiny random `Glm5NextForConditionalGeneration` (KDA x3, then
indexed MLA; a one-block vision tower, not loaded) saved as a folder in the published layout,
both runners loading it. The indexer is in its sparse regime (`index_topk` 16: one 16-token pool
plus the tail, of up to two). The Engine drives each over the same requests with
16-token prefill chunks and prefix caching (a second round resumes from the first's History
pages and KDA State checkpoints), and the greedy tokens and the logits of every step agree.
The selection is compared through them: a tie that broke differently would show."""

from __future__ import annotations

import functools
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
import tokenizers
import torch
import transformers

from resin.protocols import State
from tests.cuda.host_reads import assert_padded_decode_equals_without_host_reads
from tests.models.glm5_tiny import perturbed
from tests.models.ref_compare import assert_step_logits_equal, generate_twice

_ROOT = Path(tempfile.mkdtemp(prefix="resin-fast-glm5-"))

_TEXT: dict[str, Any] = dict(
    vocab_size=300, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=6,
    num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16,
    v_head_dim=16, index_topk=16, index_head_dim=16, index_n_heads=8, linear_head_dim=16,
    linear_num_heads=2, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    pad_token_id=None, initializer_range=0.1,
)  # fmt: skip
_VISION: dict[str, Any] = dict(
    depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64,
    projection_intermediate_size=32, image_size=28,
)  # fmt: skip


@functools.cache
def tiny() -> Path:
    """The saved model, with non-trivial norms, mHC biases, indexer pools and decays."""
    torch.manual_seed(0)
    config = transformers.Glm5NextConfig(text_config=_TEXT, vision_config=_VISION)
    model = transformers.Glm5NextForConditionalGeneration(config)
    model = perturbed(model)
    folder = _ROOT / "glm5"
    model.save_pretrained(folder)
    return folder


def _runners(device: str, graphs: bool = True) -> tuple[Any, Any]:
    """The reference and the fast runner of the tiny folder; `graphs`: the fast runner's decode
    in CUDA graphs (on a GPU)."""
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.registry import load_runner as load_reference

    folder = tiny()
    reference = load_reference(folder, device, torch.float32, page_size=16, num_pages=64)
    # the grouped MoE GEMM: fewer interpreted programs than the expert GEMV
    options = RunnerOptions(page_size=16, max_batch=4, max_context=128, num_pages=64,
                            moe_gemv_max_pairs=0, cuda_graphs=graphs)  # fmt: skip
    return reference, load_runner(folder, options, device, torch.float32)


def _generate(runner: Any, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    return generate_twice(runner, prompts, context_length=128)


_PATHS = {  # IndexedMla's A/B switches: (sparse_kernel, stored_pools)
    "stored": (True, True),  # the default: each pool pooled once, into its History page
    "repooled": (True, False),  # every complete pool pooled again each step
    "torch": (False, False),
}


def _path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    from resin_models_cuda.models.glm5_next import IndexedMla

    sparse_kernel, stored_pools = _PATHS[path]
    monkeypatch.setattr(IndexedMla, "sparse_kernel", sparse_kernel)
    monkeypatch.setattr(IndexedMla, "stored_pools", stored_pools)


@pytest.mark.parametrize("path", ["stored", "repooled"])
def test_same_tokens_as_the_reference_with_prefix_hits(
    device: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _path(monkeypatch, path)
    reference, fast = _runners(device)
    assert isinstance(fast.runner_config.cache_groups[-1], State)
    gen = torch.Generator().manual_seed(7)
    shared = torch.randint(0, 300, (17,), generator=gen).tolist()
    prompts = [shared + torch.randint(0, 300, (n,), generator=gen).tolist() for n in (2, 16)]
    want, reused_ref = _generate(reference, prompts)
    got, reused = _generate(fast, prompts)
    assert got == want
    assert reused == reused_ref > 0


def _complete_pools(runner: Any, group: int, pool: int, per_page: int) -> dict[int, int]:
    """Wraps `runner.submit`: per arena page, how many of its `per_page` pool slots hold a
    complete pool of the tokens its page holds now (those of the last plan row that held the
    page: that row's page table and length after the step), filled in as plans run. Judged
    from the plans, not from the bytes: a page handed to a new owner keeps the old owner's
    tokens past the new one's, and whatever pool the old owner stored there."""
    complete: dict[int, int] = {}
    submit = runner.submit

    def tracked(plan: Any) -> None:
        submit(plan)
        g = plan.cache_groups[group]
        for b, total in enumerate(plan.total_lens.tolist()):
            ids = g.page_ids[g.page_indptr[b] : g.page_indptr[b + 1]].tolist()
            for i, page in enumerate(ids, start=int(g.page_start[b])):
                complete[page] = min(per_page, max(0, total // pool - i * per_page))

    runner.submit = tracked
    return complete


def test_pools_completed_inside_and_across_prefill_chunks_are_stored_and_reused(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored pools (the default): prompts whose 16-token prefill chunks, cut short by the
    step's token budget, complete pools both inside a chunk and across a chunk boundary (the
    pool's first tokens in an earlier step); a second round hits the prefix cache and scores
    the reused pages' stored pools. The tokens equal the reference's, and in each indexed layer
    every pool slot that holds a complete pool of its page's current tokens (by the plans'
    page tables, `_complete_pools`) holds their gated pool; one page handed to a new owner
    still holds an earlier owner's tokens and pool past the new owner's, and is not read."""
    from resin.engine import engine
    from resin_models_cuda.kernels.compressor import gated_pool
    from resin_models_cuda.models.glm5_next import IndexedMla

    assert IndexedMla.stored_pools and IndexedMla.sparse_kernel
    # Decode rows preempt prefill after `max_decode_wait_s` of wall-clock: the interpreter's
    # slow steps waited that long, a GPU's did not, and the pages were handed out in another
    # order. Without the clock, every device runs the same schedule (and pages).
    config = functools.partial(engine.EngineConfig, max_decode_wait_s=math.inf)
    monkeypatch.setattr(engine, "EngineConfig", config)
    reference, fast = _runners(device)
    model, chunks, fixed = fast.model, [], []
    queries = model._queries

    def recorded(step: Any) -> Any:
        view = queries(step)
        if view.rows is not None:
            chunks.extend((row.total - (row.hi - row.lo), row.total) for row in view.rows)
        elif step.info.query > 1:  # a short prefill in the fixed-shape body
            lens, q_lens = step.info.seq_lens.tolist(), step.info.q_lens.tolist()
            fixed.extend((n - q, n) for n, q in zip(lens, q_lens, strict=True) if n)
        return view

    model._queries = recorded
    mixers = [layer.mixer for layer in model.layers if isinstance(layer.mixer, IndexedMla)]
    pool, per_page = model.glm.index_kpool, model.pools_per_page
    complete = _complete_pools(fast, mixers[0].slot.group, pool, per_page)
    gen = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 300, (35,), generator=gen).tolist()
    prompts = [shared + torch.randint(0, 300, (n,), generator=gen).tolist() for n in (3, 12)]
    # the third row gets the step's last 8 tokens first, so its pool 0 completes across chunks;
    # its own prefix keeps its pages (and their pools) in the cache for the second round
    prompts.append(torch.randint(0, 300, (56,), generator=gen).tolist())
    want, reused_ref = _generate(reference, prompts)
    got, reused = _generate(fast, prompts)
    assert got == want
    assert reused == reused_ref >= 2 * 32
    chunks += fixed
    assert fixed, "no short prefill ran in the fixed-shape body"
    assert any(c % 16 and t // 16 > c // 16 for c, t in chunks)  # a pool across chunks
    assert any(-(-c // 16) * 16 + 16 <= t for c, t in chunks)  # a pool inside one chunk
    pages = torch.tensor(list(complete), dtype=torch.long, device=model.device)
    held = torch.tensor(list(complete.values()), device=model.device)
    pooled = int(held.sum())
    assert pooled >= 4
    # over the arena the last step ran on (`model._kv`; closing drops the runner's)
    for mixer in mixers:
        tokens, pools = model.token_view(mixer.slot.index), model.pool_view(mixer.slot.index)
        assert pools is not None
        rank, d = mixer.mla.kv_lora_rank, mixer.glm.index_head_dim
        # a page whose every token is written, but in part by an earlier owner
        written = (tokens[pages] != 0).any(dim=-1).all(dim=-1)
        assert bool((written & (held < per_page)).any())
        keys = tokens[pages, :, rank : rank + d].reshape(len(pages), per_page, pool, d)
        gates = tokens[pages, :, rank + d :].reshape(keys.shape).float()
        slots = torch.arange(per_page, device=model.device) < held[:, None]  # [pages, per_page]
        want_pools = gated_pool(keys[slots], gates[slots], mixer.ape)
        torch.testing.assert_close(pools[pages][slots], want_pools, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", list(_PATHS))
def test_logits_equal_the_reference_step_by_step(
    device: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the sparse attention kernel over stored pools, over pools pooled again each step,
    and on the torch path it replaced (the A/B switches)."""
    _path(monkeypatch, path)
    reference, fast = _runners(device, graphs=False)  # every step calls `logits` in Python
    prompt = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(9)).tolist()
    steps = assert_step_logits_equal(reference, fast, prompt, context_length=128)
    assert steps >= 4  # 3 prefill chunks, then decode


@pytest.mark.parametrize("path", list(_PATHS))
def test_padded_decode_equals_the_reference_without_host_reads(
    device: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode steps take the runner's persistent-buffer path (what a CUDA graph replays),
    every batch padded to a 4-row bucket as a captured graph's would be: the greedy tokens
    equal the reference's over decode steps that complete a pool (positions 15 and 31: an
    empty tail, the query's own pool competing in the top-k) and start the next, and the
    step's body (the model forward, the logits, their argmax) reads nothing on the host."""
    _path(monkeypatch, path)
    reference, fast = _runners(device, graphs=False)  # the body runs, padded, each step
    # a varlen step reads its row lengths in `_queries`
    assert_padded_decode_equals_without_host_reads(reference, fast, 128, fast.model._queries)


def _stored(folder: Path, name: str) -> torch.Tensor:
    from safetensors import safe_open

    for shard in folder.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            if name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                return f.get_tensor(name).float()
    raise KeyError(name)


def test_both_name_layouts_load(tmp_path: Path) -> None:
    """The published names (the transformers-saved folder above: `hc_attn_fn`,
    `self_attn.dt_bias`) and the runners' own (`resin bench checkpoint`: `attn_hc.fn`,
    `self_attn.decay.dt_bias`) load the same parameters into the fast model."""
    from resin_app.bench.checkpoint import write_checkpoint
    from resin_model.presets import PRESETS
    from resin_models_cuda import RunnerOptions, load_runner

    options = RunnerOptions(page_size=16, max_batch=2, max_context=64, num_pages=16)
    # a two-word tokenizer of its own: the weights' names are the point, and a GPU machine
    # without the default model's GGUF runs this test too
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, "[UNK]"))
    (tmp_path / "tok").mkdir()
    words.save(str(tmp_path / "tok" / "tokenizer.json"))
    write_checkpoint(PRESETS["tiny-glm5_next"], tmp_path / "own", tokenizer=tmp_path / "tok",
                     shard_bytes=1 << 20)  # fmt: skip
    published = ("model.language_model.layers.0.hc_attn_fn",
                 "model.language_model.layers.0.self_attn.dt_bias")  # fmt: skip
    own = ("model.layers.0.attn_hc.fn", "model.layers.0.self_attn.decay.dt_bias")
    for folder, names in ((tiny(), published), (tmp_path / "own", own)):
        layer = load_runner(folder, options, "cpu", torch.float32).model.layers[0]
        torch.testing.assert_close(layer.attn_hc.fn, _stored(folder, names[0]))
        torch.testing.assert_close(layer.mixer.dt_bias, _stored(folder, names[1]))


def test_shared_prefix_hits_on_the_fast_runners_layout() -> None:
    """Held out (issue 37): 64 requests sharing a 1,024-token prefix, on the cache groups and
    page bytes the fast runner declares for GLM-5.3-Flash's cache shapes (a KDA State page of
    ~141 MiB beside 267 KiB History pages of latents, indexer entries and pooled keys) in a
    60 GB arena, hit the cache as often as a pure-attention layout of the same History pages
    and bytes. The engine drives a runner that simulates the model through the cache."""
    from dataclasses import replace

    from resin_model.presets import preset
    from resin_models_cuda import CudaRunner, RunnerOptions, build_model
    from resin_models_cuda.layers import RandomWeights
    from tests.models.ref_compare import assert_layout_hits_like_attention

    # The real KDA, latent and indexer shapes (45 layers); what no cache holds shrunk: hidden,
    # attention heads, q LoRA, experts, vocabulary.
    real = preset("glm-5.3-flash")
    assert real.moe is not None and real.mla is not None
    moe = replace(real.moe, num_experts=2, top_k=1, num_groups=1, topk_groups=1)
    mla = replace(real.mla, q_lora_rank=16)
    config = replace(real, hidden_size=16, vocab_size=300, moe=moe, mla=mla, num_heads=2,
                     num_kv_heads=2, intermediate_size=16)  # fmt: skip
    model = build_model(config, RandomWeights("cpu", torch.bfloat16))
    layout = CudaRunner(model, RunnerOptions(cache_bytes=60 * 10**9)).runner_config
    assert isinstance(layout.cache_groups[1], State)
    assert layout.cache_groups[1].bytes_per_page == 34 * (64 * 128 * 128 * 4 + 24576 * 3 * 2)
    # 11 layers of 16 tokens and the page's pooled indexer key (one 16-token pool)
    assert layout.page_bytes == 11 * (16 * (512 + 2 * 128) + 128) * 2

    assert_layout_hits_like_attention(layout)
