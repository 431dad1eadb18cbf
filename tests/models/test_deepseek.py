"""DeepSeek specifics beyond the shared parity suites (which run the tiny V2/V3 configs of
`ref_hf.ARCHS` through `test_torch_logits.py` and `test_torch_engine.py`):

- the MLA cache group: bytes per token the engine sizes, against a Llama-style layout;
- MTP layers: loaded from `model.layers.{N}.*`, and their outputs equal `transformers`'
  `MtpModel` at every position (the draft of each step included);
- the config translation's refusals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ref_hf import _COMMON, ARCHS, checkpoint
from ref_planner import TinyPlanner
from safetensors.torch import load_file, save_file
from transformers.modeling_layers import MtpModel

from resin import Engine
from resin_model.hf_config import parse_config
from resin_models_torch.mtp import MtpRunner
from resin_models_torch.registry import load_model, random_runner
from resin_models_torch.runner import TorchRunner


def _tiny(model_type: str, layers: int, **dims: Any) -> dict[str, Any]:
    """A narrow config (hidden 64, 4 experts) whose cache dims are `dims`."""
    return {
        "model_type": model_type,
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "rms_norm_eps": 1e-6,
        **dims,
    }


def _deepseek(layers: int, kv_lora_rank: int, rope: int) -> dict[str, Any]:
    return _tiny(
        "deepseek_v3",
        layers,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=128,
        v_head_dim=128,
        q_lora_rank=None,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        moe_intermediate_size=16,
        first_k_dense_replace=layers,  # dense layers keep the test light; the cache is the same
    )


def _page_bytes_per_token(raw: dict[str, Any]) -> float:
    runner = random_runner(raw, dtype=torch.bfloat16, page_size=16, cache_bytes=1 << 24)
    with Engine(runner, context_length=64) as engine:
        layout = engine.layout
    assert layout.page_bytes == runner.runner_config.page_bytes
    return layout.page_bytes / layout.page_size


@pytest.mark.parametrize(("name", "layers"), [("V2-Lite", 27), ("V3", 61)])
def test_latent_cache_bytes_per_token(name: str, layers: int) -> None:
    # One (kv_lora_rank 512 + rope 64) bf16 vector per token per layer: 1152 bytes a layer.
    deepseek = _page_bytes_per_token(_deepseek(layers, 512, 64))
    assert deepseek == layers * (512 + 64) * 2
    # Llama-style at equal depth: K and V of 16 heads x 128 (V2-Lite's width, 2048) per layer.
    llama = _page_bytes_per_token(
        _tiny("llama", layers, num_attention_heads=16, num_key_value_heads=16, head_dim=128)
    )
    assert llama == layers * 2 * 16 * 128 * 2
    assert deepseek / llama == 576 / 4096  # = 9/64 = 0.140625, about 1/7.1


def test_engine_fits_more_tokens_in_the_same_bytes() -> None:
    cache = 1 << 22
    runner = random_runner(_deepseek(2, 512, 64), page_size=16, cache_bytes=cache)
    with Engine(runner, context_length=64) as engine:
        pages = engine.layout.num_pages
    assert pages == cache // (2 * 576 * 4 * 16)  # fp32: 2 layers x 576 values x 4 bytes x 16
    assert runner.model.cache_specs[0].width == 576  # type: ignore[union-attr]


def test_unsupported_deepseek_configs_fail_clearly() -> None:
    raw = _deepseek(2, 32, 8)
    with pytest.raises(ValueError, match="no weight_block_size"):
        parse_config({**raw, "quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(ValueError, match="unsupported scoring_func='softmax'"):
        parse_config({**raw, "scoring_func": "softmax"})
    v2 = {**raw, "model_type": "deepseek_v2", "topk_method": "greedy"}
    with pytest.raises(ValueError, match="norm_topk_prob"):
        parse_config({**v2, "norm_topk_prob": True})
    with pytest.raises(ValueError, match="n_group"):
        parse_config({**raw, "n_group": 3})
    # DeepSeek's own config keys translate (V3: rope_scaling + rope_theta, routing names).
    cfg = parse_config(
        {**raw, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
         "ep_size": 1, "seq_aux": True, "aux_loss_alpha": 0.001, "rope_theta": 10000,
         "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                          "original_max_position_embeddings": 4096, "beta_fast": 32,
                          "beta_slow": 1}}
    )  # fmt: skip
    mscale = 0.1 * torch.log(torch.tensor(40.0)).item() + 1.0
    assert cfg.rope.attention_factor == 1.0
    assert abs(cfg.scale - (136**-0.5) * mscale**2) < 1e-9


def _mtp_checkpoint(folder: Path) -> tuple[Any, Any]:
    """A tiny V3 checkpoint with one MTP layer in DeepSeek's layout, and the `transformers`
    main model and `MtpModel` holding the same weights."""
    _, _, extra = ARCHS["deepseek_v3"]
    config = transformers.DeepseekV3Config(**{**_COMMON, **extra, "num_mtp_layers": 1})
    main_folder, _ = checkpoint("deepseek_v3")
    main = transformers.DeepseekV3ForCausalLM.from_pretrained(main_folder).eval()
    torch.manual_seed(3)
    mtp = MtpModel(main, 1).eval()
    with torch.no_grad():
        for name, param in mtp.layers.named_parameters():
            param.copy_(1.0 + 0.1 * torch.randn_like(param) if "norm" in name else
                        0.1 * torch.randn_like(param))  # fmt: skip
        for name, buffer in mtp.layers.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn_like(buffer))
    tensors = load_file(main_folder / "model.safetensors")
    n = config.num_hidden_layers
    for name, value in mtp.layers[0].state_dict().items():
        if name == "mtp_block.mlp.experts.gate_up_proj":
            for e, gate_up in enumerate(value):
                gate, up = gate_up.chunk(2)
                tensors[f"model.layers.{n}.mlp.experts.{e}.gate_proj.weight"] = gate
                tensors[f"model.layers.{n}.mlp.experts.{e}.up_proj.weight"] = up
        elif name == "mtp_block.mlp.experts.down_proj":
            for e, down in enumerate(value):
                tensors[f"model.layers.{n}.mlp.experts.{e}.down_proj.weight"] = down
        else:
            name = name.removeprefix("mtp_block.").replace("post_norm", "shared_head.norm")
            tensors[f"model.layers.{n}.{name}"] = value
    # DeepSeek's checkpoints repeat the embedding and LM head in the MTP layer.
    tensors[f"model.layers.{n}.embed_tokens.weight"] = main.model.embed_tokens.weight
    tensors[f"model.layers.{n}.shared_head.head.weight"] = main.lm_head.weight
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    raw = json.loads((main_folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "num_nextn_predict_layers": 1}))
    return main, mtp


def _hf_mtp_logits(main: Any, mtp: Any, tokens: list[int]) -> torch.Tensor:
    """Row i: the MTP layer's logits for token i+1 from (token i, main hidden at i-1)."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        hidden = main(ids, output_hidden_states=True).hidden_states[-1]
        positions = torch.arange(1, len(tokens))[None]
        out = mtp.forward_layer(0, hidden[:, :-1], positions, None, input_ids=ids[:, 1:])
        logits = mtp._project_to_logits(out)[0].float()
    return torch.cat((torch.full_like(logits[:1], float("nan")), logits))


def _hf_mtp_chain(main: Any, mtp: Any, tokens: list[int]) -> list[int]:
    """Two greedy drafts after `tokens`: MTP on (last token, main hidden before it), then on
    (draft 1, the MTP hidden state that predicted it), each over the whole sequence."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        hidden = main(ids, output_hidden_states=True).hidden_states[-1][:, :-1]
        ids = ids[:, 1:]
        drafts = []
        for _ in range(2):
            positions = torch.arange(1, ids.shape[1] + 1)[None]
            out = mtp.forward_layer(0, hidden, positions, None, input_ids=ids)
            draft = mtp._project_to_logits(out[:, -1:]).argmax(dim=-1)
            drafts.append(int(draft))
            ids, hidden = torch.cat((ids, draft), dim=1), torch.cat((hidden, out[:, -1:]), dim=1)
    return drafts


def test_mtp_layers_load_and_match_transformers(tmp_path: Path) -> None:
    main, mtp = _mtp_checkpoint(tmp_path / "mtp")
    model = load_model(tmp_path / "mtp")
    assert len(model.mtp) == 1  # type: ignore[attr-defined]
    # The cache declared is the one used: 3 latent layers without drafting, 3 + 1 MTP with.
    plain = TorchRunner(model, page_size=4)
    assert plain.runner_config.cache_groups[0].bytes_per_page == 4 * 3 * 4 * 40
    runner = MtpRunner(model, num_drafts=2, page_size=4)  # type: ignore[arg-type]
    assert runner.runner_config.cache_groups[0].bytes_per_page == 4 * 4 * 4 * 40
    runner.record_logits = True
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (13, 1, 6)]
    planner = TinyPlanner(runner)
    seqs = planner.run(prompts, max_new=12, chunk=5)
    for seq in seqs:
        ref = _hf_mtp_logits(main, mtp, seq.tokens)
        compared = 0
        for step in runner.mtp_recorded:
            for j in (step.sequence_ids == seq.sid).nonzero()[0].tolist():
                position = int(step.positions[j])
                if position == 0:
                    continue  # no MTP pair at position 0
                diff = (step.logits[j] - ref[position]).abs().max()  # type: ignore[index]
                assert diff < 1e-4, (seq.sid, position, float(diff))
                compared += 1
        assert compared == len(seq.tokens) - 2
        # The last step's drafts: the greedy MTP prediction of the token after the sequence,
        # then the layer chained on its own prediction and hidden state.
        assert runner.drafts[seq.sid] == (len(seq.tokens), _hf_mtp_chain(main, mtp, seq.tokens))
    # A prefix hit reuses the source's MTP entries (they depend on tokens only); its first
    # computed token lacks the main hidden state before it, so later drafts may differ from
    # transformers' (quality, not exactness), but they are made.
    fork = planner.fork(seqs[0], 8, [5, 6, 7], sid=300)
    planner.finish([fork], max_new=4)
    assert runner.drafts[300][0] == len(fork.tokens)


def test_missing_mtp_weights_are_named(tmp_path: Path) -> None:
    folder, _ = checkpoint("deepseek_v3")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    raw = json.loads((folder / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**raw, "num_nextn_predict_layers": 1}))
    with pytest.raises(ValueError, match=r"missing \['model\.layers\.3\."):
        load_model(broken)
