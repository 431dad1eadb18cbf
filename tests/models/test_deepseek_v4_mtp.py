"""DeepSeek-V4's MTP layer as a draft proposer on the reference runner.

transformers builds no MTP for `deepseek_v4` (it ignores `mtp.*`), so the layer is built from
the published layout: `mtp.0.{e_proj,h_proj,enorm,hnorm,norm,hc_head_*}` around one
sliding-only decoder layer (`mtp.0.attn.*`, `mtp.0.ffn.*`, `mtp.0.hc_attn_*`, ...) that shares
the main model's embedding and LM head. The checkpoint here is a tiny transformers model (the
main one) plus the tensors of a second, one-layer transformers model saved in the same
published spelling under `mtp.0.`; the reference for the MTP logits is that one-layer model's
own decoder layer, `hc_head` and `norm` run on the input streams computed by hand
(`e_proj(enorm(embed(token i))) + h_proj(hnorm(main streams at i - 1)))`, the streams read
from transformers' main model before its `hc_head`.

The indexer keeps 64 entries, more than these prompts have (selection complete: no ReLU ties
to break), so every computation selects the same entries; the active top-k is covered by
`test_deepseek_v4.py`. The vocabulary is 16 so random drafts are accepted often enough that
verify steps keep all, some and none of their drafts; rejected drafts are what the compressor
State must drop (`State.rewind`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from resin import Engine, SamplingParams, State
from resin.engine.proposers import MtpProposer
from resin.engine.speculative import Speculation
from resin_models_torch.deepseek_v4 import DeepseekV4ForCausalLM
from resin_models_torch.mtp import MtpRunner
from resin_models_torch.registry import load_model, load_runner
from tests.models.dsv4_tiny import _CONFIG as TINY
from tests.models.dsv4_tiny import randomized

torch.set_num_threads(1)

VOCAB = 16

_CONFIG: dict[str, Any] = {**TINY, "vocab_size": VOCAB, "index_topk": 64}
"""The tiny checkpoint's shapes with 16 tokens and an indexer that keeps every entry (no ReLU
tie can make the runners' selections differ)."""


@functools.cache
def _checkpoint(root: Path) -> tuple[Path, Any, Any, dict[str, torch.Tensor]]:
    """(folder with main + MTP weights, transformers main model, transformers one-layer model
    holding the MTP block, the MTP's own tensors)."""
    main = randomized(_CONFIG, 0)
    block = randomized({**_CONFIG, "num_hidden_layers": 1, "compress_ratios": [0],
                         "num_hash_layers": 0}, 1)  # fmt: skip
    folder, block_folder = root / "dsv4-mtp", root / "block"
    main.save_pretrained(folder)
    block.save_pretrained(block_folder)
    tensors = load_file(folder / "model.safetensors")
    saved = load_file(block_folder / "model.safetensors")
    gen = torch.Generator().manual_seed(5)
    own = {
        "e_proj.weight": 0.2 * torch.randn(64, 64, generator=gen),
        "h_proj.weight": 0.2 * torch.randn(64, 64, generator=gen),
        "enorm.weight": 1 + 0.1 * torch.randn(64, generator=gen),
        "hnorm.weight": 1 + 0.1 * torch.randn(64, generator=gen),
    }
    for name, value in saved.items():  # the published spelling transformers saves
        if name.startswith("model.layers.0."):
            tensors["mtp.0." + name.removeprefix("model.layers.0.")] = value
        elif name.startswith("model.hc_head.hc_"):
            tensors["mtp.0.hc_head_" + name.removeprefix("model.hc_head.hc_")] = value
        elif name == "model.norm.weight":
            tensors["mtp.0.norm.weight"] = value
    tensors.update({"mtp.0." + k: v for k, v in own.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    return folder, main, block, own


@pytest.fixture(scope="module")
def tiny(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Any, Any, dict[str, torch.Tensor]]:
    return _checkpoint(tmp_path_factory.mktemp("dsv4mtp"))


def _norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _reference(
    main: Any, block: Any, own: dict[str, torch.Tensor], tokens: list[int], drafts: int
) -> tuple[torch.Tensor, list[int]]:
    """Row i: the MTP logits for token i + 1 from (token i, main streams at i - 1) (row 0
    NaN); and `drafts` greedy drafts after `tokens`, each chained on the MTP layer's own
    output streams at the last position."""
    ids = torch.tensor([tokens])
    streams: list[torch.Tensor] = []
    handle = main.model.hc_head.register_forward_pre_hook(lambda m, a: streams.append(a[0]))
    with torch.no_grad():
        main(ids)
    handle.remove()
    previous, chain_ids = streams[0][:, :-1], ids[:, 1:]  # streams at i - 1 beside token i

    def mtp(token_ids: torch.Tensor, before: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = main.model.embed_tokens(token_ids)
        x = _norm(embeds, own["enorm.weight"]) @ own["e_proj.weight"].T
        h = _norm(before, own["hnorm.weight"]) @ own["h_proj.weight"].T
        inputs = x[:, :, None, :] + h
        out: list[torch.Tensor] = []
        layer = block.model.layers[0]
        swap = layer.register_forward_pre_hook(lambda m, a, kw: ((inputs, *a[1:]), kw),
                                               with_kwargs=True)  # fmt: skip
        keep = layer.register_forward_hook(lambda m, a, o: out.append(o))
        n = token_ids.shape[1]
        positions = torch.arange(1, n + 1)[None]
        hidden = block.model(inputs_embeds=embeds, position_ids=positions).last_hidden_state
        swap.remove()
        keep.remove()
        return main.lm_head(hidden)[0], out[0]

    with torch.no_grad():
        logits, out = mtp(chain_ids, previous)
        chain: list[int] = []
        for _ in range(drafts):
            token = int(logits[-1].argmax())
            chain.append(token)
            chain_ids = torch.cat((chain_ids, torch.tensor([[token]])), dim=1)
            previous = torch.cat((previous, out[:, -1:]), dim=1)
            logits, out = mtp(chain_ids, previous)
        full, _ = mtp(ids[:, 1:], streams[0][:, :-1])
    return torch.cat((torch.full_like(full[:1], float("nan")), full)), chain


def test_mtp_loads_and_matches_the_published_block(
    tiny: tuple[Path, Any, Any, dict[str, torch.Tensor]],
) -> None:
    folder, main, block, own = tiny
    model = load_model(folder)
    assert isinstance(model, DeepseekV4ForCausalLM) and len(model.mtp) == 1
    # no overlap: the last drafts are those of the last kept step (a pipelined step past
    # the end would draft for a token the engine drops)
    runner = MtpRunner(model, num_drafts=2, page_size=4, overlap=False)
    # the MTP window is one more layer of group 0; the compressor states keep 2 more tokens
    groups = runner.runner_config.cache_groups
    assert groups[0].bytes_per_page == 5 * 4 * 32 * 4
    assert groups[3:] == (State(9 * 192 * 4, rewind=2), State(17 * 64 * 4, rewind=2))
    runner.record_logits = True
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (70, 1, 37)]
    params = SamplingParams(max_output_tokens=10, temperature=0.0)
    with Engine(runner, context_length=128, prefill_chunk_tokens=16, max_batch_tokens=32) as engine:
        requests = [engine.submit(p, params) for p in prompts]
        while engine.has_work():
            engine.step()
    for request, prompt in zip(requests, prompts, strict=True):
        tokens = prompt + request.take_result()
        ref, chain = _reference(main, block, own, tokens, 2)
        compared = 0
        for step in runner.mtp_recorded:
            for j in (step.sequence_ids == request.id).nonzero()[0].tolist():
                position = int(step.positions[j])
                if position == 0:
                    continue  # no MTP pair at position 0
                assert step.logits is not None
                diff = float((step.logits[j] - ref[position]).abs().max())
                assert diff < 2e-4, (request.id, position, diff)
                compared += 1
        assert compared == len(tokens) - 2  # every position but 0 and the last sampled
        assert runner.drafts[request.id] == (len(tokens), chain)


def test_checkpoint_without_mtp_loads_without_it(
    tiny: tuple[Path, Any, Any, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    folder, _, _, _ = tiny
    plain = tmp_path / "plain"
    plain.mkdir()
    tensors = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not k.startswith("mtp.")},
              plain / "model.safetensors")  # fmt: skip
    (plain / "config.json").write_bytes((folder / "config.json").read_bytes())
    model = load_model(plain)
    assert isinstance(model, DeepseekV4ForCausalLM) and not model.mtp
    with pytest.raises(ValueError, match="MTP layers"):
        MtpRunner(model)
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file({k: v for k, v in tensors.items() if k != "mtp.0.e_proj.weight"},
              broken / "model.safetensors")  # fmt: skip
    (broken / "config.json").write_bytes((folder / "config.json").read_bytes())
    with pytest.raises(ValueError, match=r"missing \['mtp\.0\.e_proj\.weight'\]"):
        load_model(broken)


def _generate(runner: Any, speculation: Speculation | None) -> tuple[list[list[int]], Any]:
    gen = torch.Generator().manual_seed(4)
    shared = torch.randint(0, VOCAB, (48,), generator=gen).tolist()
    prompts = [
        [*shared, 3, 1],
        torch.randint(0, VOCAB, (29,), generator=gen).tolist(),
        [*shared, 9],  # a prefix hit on the first prompt's pages
        [5],
    ]
    params = SamplingParams(max_output_tokens=40, temperature=0.0)
    with Engine(runner, context_length=160, prefix_cache=True, prefill_chunk_tokens=16,
                max_batch_tokens=48, speculation=speculation) as engine:  # fmt: skip
        requests = [engine.submit(prompts[0], params)]
        engine.step()
        requests += [engine.submit(p, params) for p in prompts[1:]]
        while engine.has_work():
            engine.step()
        metrics = engine.metrics
    return [r.take_result() for r in requests], metrics


@pytest.mark.parametrize("drafts", [1, 3])
def test_speculative_mtp_equals_plain_greedy(
    tiny: tuple[Path, Any, Any, dict[str, torch.Tensor]], drafts: int
) -> None:
    folder, _, _, _ = tiny
    expected, base = _generate(load_runner(folder, page_size=16, overlap=False), None)
    assert base.prefix_cache_hits > 0
    mtp = MtpRunner(load_model(folder), num_drafts=drafts, page_size=16)
    got, metrics = _generate(mtp, Speculation(MtpProposer(), num_draft_tokens=drafts))
    assert got == expected
    assert metrics.prefix_cache_hits > 0
    # drafts ran through verification: some kept, some dropped (the State rewound)
    assert metrics.spec_decode_num_drafts > 20
    assert 0 < metrics.spec_decode_num_accepted_tokens < metrics.spec_decode_num_draft_tokens
