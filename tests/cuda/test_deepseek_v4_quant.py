"""DeepSeek-V4's published quantized layout (deepseek-ai/DeepSeek-V4-Flash): FP8 e4m3 weights in
128 x 128 blocks with UE8M0 scales named `<module>.scale` (float8_e8m0fnu), and with
`expert_dtype: fp4` the routed experts as packed e2m1 (int8 [N, K / 2]) with one e8m0 scale per
32 values. The tiny transformers checkpoint of `tests/models/test_deepseek_v4.py` is written in
that layout by the quantizer (`resin quantize --format fp8-block | mxfp4` on a V4 folder), and
its exact dequantization as a float32 twin. The reference runner decodes the quantized folder
exactly as the twin (the same logits, bit for bit), and the fast runner (in the Triton
interpreter) keeps the experts quantized (FP8 kernels; FP4 through the MXFP4 kernels, whose
bits they are) and produces the reference's greedy tokens."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from resin import Engine, SamplingParams
from tests.models.dsv4_tiny import _checkpoint

_ROOT = Path(tempfile.mkdtemp(prefix="resin-dsv4-quant-"))
PROMPTS = [[(7 * i + 3) % 300 for i in range(21)], [5, 200, 17, 99, 42, 8]]


@functools.cache
def _folders(fmt: str) -> tuple[Path, Path]:
    """(the tiny checkpoint quantized in `fmt`, its exact float32 dequantization)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from resin_app.quantize import quantize_folder
    from resin_model.hf_config import parse_config
    from resin_model.quant_checkpoint import dequantized

    src, _ = _checkpoint(_ROOT)
    quantized = quantize_folder(src, _ROOT / fmt, fmt)
    raw = json.loads((quantized / "config.json").read_text())
    quant = parse_config(raw).quant
    assert quant is not None
    with safe_open(str(quantized / "model.safetensors"), framework="pt") as f:
        stored = [(name, f.get_tensor(name)) for name in f.keys()]  # noqa: SIM118
    twin = _ROOT / f"{fmt}-dequantized"
    twin.mkdir()
    tensors = {name: t.float().contiguous() for name, t in dequantized(iter(stored), quant)}
    save_file(tensors, str(twin / "model.safetensors"), metadata={"format": "pt"})
    raw.pop("quantization_config")
    raw.pop("expert_dtype", None)
    (twin / "config.json").write_text(json.dumps(raw))
    return quantized, twin


def test_the_written_layout_is_the_published_one() -> None:
    """What the quantizer writes for a V4 folder: e4m3 weights with e8m0 `.scale` blocks, FP4
    experts as int8 with e8m0 scales per 32, the routers and the compressors' projections
    unquantized, `expert_dtype` at the config's top level (where the V4 configs put it)."""
    from safetensors import safe_open

    folder, _ = _folders("mxfp4")
    raw = json.loads((folder / "config.json").read_text())
    assert raw["expert_dtype"] == "fp4" and raw["quantization_config"]["scale_fmt"] == "ue8m0"
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    p = "model.layers.3."
    assert (
        dtypes[p + "attn.wq_a.weight"] == "F8_E4M3" and dtypes[p + "attn.wq_a.scale"] == "F8_E8M0"
    )
    assert dtypes[p + "ffn.shared_experts.w1.weight"] == "F8_E4M3"
    assert dtypes[p + "ffn.experts.0.w1.weight"] == "I8"
    assert shapes[p + "ffn.experts.0.w1.weight"] == (32, 32)  # [inner, hidden / 2]
    assert shapes[p + "ffn.experts.0.w1.scale"] == (32, 2)  # [inner, hidden / 32]
    assert shapes[p + "ffn.experts.0.w2.scale"] == (64, 1)
    for kept in ("ffn.gate.weight", "attn.compressor.wkv.weight", "attn.compressor.wgate.weight"):
        assert dtypes[p + kept] == "F32", kept
    assert dtypes["model.layers.2.attn.indexer.weights_proj.weight"] == "F32"


def _generate(runner: Any) -> list[list[int]]:
    params = SamplingParams(max_output_tokens=3, temperature=0.0, ignore_stop_tokens=True)
    with Engine(runner, context_length=64, prefill_chunk_tokens=16, max_batch_tokens=24,
                max_sequences=4) as engine:  # fmt: skip
        requests = [engine.submit(p, params) for p in PROMPTS]
        while engine.has_work():
            engine.step()
        return [list(r.take_result()) for r in requests]


@pytest.mark.parametrize("fmt", ["fp8-block", "mxfp4"])
def test_reference_decodes_the_quantized_folder_as_its_dequantized_twin(
    device: str, fmt: str
) -> None:
    """The reference runner dequantizes exactly: the same logits, bit for bit, every step."""
    from resin_models_torch.registry import load_runner

    folder, twin = _folders(fmt)
    steps = []
    for path in (folder, twin):
        runner = load_runner(path, device, torch.float32, page_size=16, num_pages=32)
        runner.record_logits = True
        tokens = _generate(runner)
        steps.append((tokens, [s.logits for s in runner.recorded]))
    (got, got_logits), (want, want_logits) = steps
    assert got == want
    assert len(got_logits) == len(want_logits) > 0
    for a, b in zip(got_logits, want_logits, strict=True):
        assert a is not None and b is not None and torch.equal(a, b)


@pytest.mark.parametrize("fmt", ["fp8-block", "mxfp4"])
def test_fast_runner_keeps_the_experts_quantized_and_decodes_as_the_reference(
    device: str, fmt: str
) -> None:
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_cuda.kernels.moe_fp8 import Fp8Experts
    from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts
    from resin_models_torch.registry import load_runner as load_reference

    folder, _ = _folders(fmt)
    options = RunnerOptions(page_size=16, max_batch=4, max_context=64, num_pages=32,
                            max_draft_tokens=0, moe_gemv_max_pairs=4)  # fmt: skip
    fast = load_runner(folder, options, device, torch.float32)
    moe = fast.model.layers[-1].moe
    kind = Mxfp4Experts if fmt == "mxfp4" else Fp8Experts
    assert isinstance(moe.moe.w.gate_up, kind) and isinstance(moe.moe.w.down, kind)
    assert (moe.shared is not None) == (fmt == "mxfp4")  # folded into an FP8 stack
    reference = load_reference(folder, device, torch.float32, page_size=16, num_pages=32)
    assert _generate(fast) == _generate(reference)


def test_random_weights_build_the_quantized_experts(device: str) -> None:
    """`resin bench runner --random-weights --model-config deepseek-v4-flash-8l:FMT` builds
    `random_runner(..., quantize=FMT)`: FP8 experts (the shared one folded in) for
    `fp8-block`, the published FP4 experts as MXFP4 (the shared one beside) for `mxfp4`;
    random hash tables name valid, distinct experts."""
    from resin_model.presets import preset
    from resin_models_cuda import RunnerOptions
    from resin_models_cuda.kernels.moe_fp8 import Fp8Experts
    from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts
    from resin_models_cuda.runner import random_runner

    options = RunnerOptions(page_size=16, max_batch=2, max_context=64, num_pages=16)
    config = preset("tiny-deepseek_v4")
    for fmt, kind in (("fp8-block", Fp8Experts), ("mxfp4", Mxfp4Experts)):
        model = random_runner(config, options, device, torch.float32, quantize=fmt).model  # type: ignore[arg-type]
        moe = model.layers[-1].moe
        assert isinstance(moe.moe.w.gate_up, kind) and isinstance(moe.moe.w.down, kind)
        assert moe.moe.w.shared == (1 if fmt == "fp8-block" else 0)
        table = model.layers[0].moe.moe.w.hash_table
        assert table is not None and int(table.max()) < config.moe.num_experts  # type: ignore[union-attr]
        assert all(len(set(row)) == len(row) for row in table.tolist())
