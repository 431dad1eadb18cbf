"""bf16 accuracy on the GPU, for every architecture transformers has: the fast runner's logits
against a float32 oracle (transformers in float32 on the same weights) must be within 1.25x of
transformers-bf16's own error, at every prompt's last token (prefill) and over 8 decode steps
(CUDA graphs) teacher-forced on fixed tokens. Shapes: the real presets' widths and head
layouts with fewer layers and a smaller vocabulary (random weights)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from resin.plan import Phase
from resin_model.presets import preset_hf

CASES = {
    "llama": ("llama-8b", {"num_hidden_layers": 4}),
    "qwen3_moe": ("qwen3-30b-a3b", {"num_hidden_layers": 4}),
    "gemma3": ("gemma3-12b", {"num_hidden_layers": 6, "sliding_window": 64}),
    "gpt_oss": ("gpt-oss-20b", {"num_hidden_layers": 4, "sliding_window": 64}),
    "olmo2": ("olmo2-7b", {"num_hidden_layers": 4}),
    "glm4_moe": ("glm-4.5-air", {"num_hidden_layers": 4}),
}


def _hf_model(raw: dict[str, Any]) -> Any:
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    fields = {k: v for k, v in raw.items() if k != "model_type"}
    config = CONFIG_MAPPING[raw["model_type"]](**fields)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).cuda().eval()


def fast_logits(
    raw: dict[str, Any],
    state: dict[str, torch.Tensor],
    tokens: torch.Tensor,
    prompt: int,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Fast runner logits [B, steps + 1, V] at positions prompt-1 .. end: a prefill of the
    first prompt-1 tokens, then one decode step (graph replay) per position."""
    from resin.protocols import CacheLayout
    from resin_app.bench.plans import PagedPlanner
    from resin_model.hf_config import parse_config
    from resin_models_cuda import CudaRunner, RunnerOptions, build_model
    from resin_models_cuda.layers import StateDictWeights

    options = RunnerOptions(page_size=16, max_batch=8, max_context=256, keep_logits=True)
    source = StateDictWeights(state, device, dtype)
    runner = CudaRunner(build_model(parse_config(raw), source, options.build_options()), options)
    groups = len(runner.model.group_kinds)
    rc = runner.runner_config
    runner.bind(CacheLayout(groups * 100, 16, rc.page_bytes, rc.cache_groups))
    planner = PagedPlanner(groups * 100, 16, groups)
    seqs = [planner.new_sequence(row.tolist()) for row in tokens.cpu()]
    rows = [(s, prompt - 1) for s in seqs]
    runner.forward(planner.plan(rows, Phase.PREFILL))
    planner.commit(rows)
    out = []
    for _ in range(tokens.shape[1] - prompt + 1):
        rows = [(s, 1) for s in seqs]
        runner.forward(planner.plan(rows, Phase.DECODE))
        planner.commit(rows)
        assert runner.last_logits is not None
        out.append(runner.last_logits.float())
    runner.close()
    return torch.stack(out, dim=1)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", sorted(CASES))
def test_bf16_error_within_transformers_bf16(arch: str) -> None:
    pytest.importorskip("transformers")
    name, changes = CASES[arch]
    raw = {**preset_hf(name), **changes, "vocab_size": 32000}
    hf = _hf_model(raw)
    rng = np.random.default_rng(0)
    prompt, steps, batch = 100, 8, 4
    tokens = torch.tensor(rng.integers(0, 32000, size=(batch, prompt + steps)), device="cuda")
    with torch.no_grad():
        oracle = hf(tokens).logits[:, prompt - 1 :].float()
        state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
        hf_bf16 = hf.to(torch.bfloat16)
        baseline = hf_bf16(tokens).logits[:, prompt - 1 :].float()
    del hf, hf_bf16
    ours = fast_logits(raw, state, tokens, prompt)
    ours_err = (ours - oracle).abs().mean().item()
    hf_err = (baseline - oracle).abs().mean().item()
    print(f"{arch}: mean |dlogit| resin-bf16 {ours_err:.4f} transformers-bf16 {hf_err:.4f}")
    assert ours_err <= 1.25 * hf_err, (ours_err, hf_err)
