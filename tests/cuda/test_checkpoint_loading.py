"""Real checkpoint folders on the fast runner's loader: the random-weights writer's folders
(sharded with an index, bf16 / fp16 / fp32 stored, tied embeddings) and the converted GGUF
default model load into the fast runner and the reference runner alike and decode the same
greedy tokens; a missing or mis-shaped tensor is an error naming it, the shape expected and
the file it should be in. CPU: the Triton interpreter, float32 runners."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from resin import Engine, SamplingParams
from resin_app.bench.checkpoint import INDEX, write_checkpoint
from resin_model.presets import TINY

PROMPTS = [[1, 17, 230, 9, 4000, 77, 12], [5, 6, 7]]


def _greedy(runner: object, tokens: int = 4) -> list[list[int]]:
    params = SamplingParams(max_output_tokens=tokens, temperature=0.0, ignore_stop_tokens=True)
    with Engine(runner, context_length=64, max_sequences=4) as engine:  # type: ignore[arg-type]
        requests = [engine.submit(p, params) for p in PROMPTS]
        while engine.has_work():
            engine.step()
        return [list(r.take_result()) for r in requests]


def _both(folder: Path, device: str) -> tuple[list[list[int]], list[list[int]]]:
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.registry import load_runner as load_reference

    options = RunnerOptions(page_size=4, max_batch=4, max_context=64, num_pages=64)
    fast = load_runner(folder, options, device, torch.float32)
    reference = load_reference(folder, device, torch.float32, page_size=4, num_pages=64)
    return _greedy(fast), _greedy(reference)


@pytest.mark.parametrize(
    ("arch", "dtype"), [("llama", "bfloat16"), ("qwen3", "float16"), ("llama", "float32")]
)
def test_sharded_checkpoints_of_every_stored_dtype_decode_as_the_reference(
    arch: str, dtype: str, tmp_path: Path, device: str
) -> None:
    """llama: separate LM head; qwen3: tied embeddings (no lm_head tensor in the folder)."""
    written = write_checkpoint(TINY[arch], tmp_path, dtype=dtype, shard_bytes=1 << 20, std=0.3)
    assert written.shards > 1
    index = json.loads((tmp_path / INDEX).read_text())["weight_map"]
    assert ("lm_head.weight" in index) == (arch == "llama")
    fast, reference = _both(tmp_path, device)
    assert fast == reference and all(len(t) == 4 for t in fast)


def test_the_converted_gguf_default_model_loads_the_reference_tensors() -> None:
    """One `model.safetensors`, no index, float32, tied embeddings: every tensor the fast
    model reads is the reference model's (the decode itself: the GPU test below)."""
    from resin_model.default_model import default_model_dir
    from resin_models_cuda import RunnerOptions
    from resin_models_cuda.runner import load_model
    from resin_models_torch.registry import load_model as load_reference

    folder = default_model_dir()
    assert not (folder / INDEX).exists()
    fast = load_model(folder, RunnerOptions(), "cpu", torch.bfloat16)
    reference = load_reference(folder, "cpu", torch.bfloat16).state_dict()
    assert fast.lm_head is fast.embed  # tied: one tensor
    assert torch.equal(fast.embed, reference["model.embed_tokens.weight"])


@pytest.mark.gpu
def test_the_converted_gguf_default_model_decodes_as_the_reference(device: str) -> None:
    from resin_model.default_model import default_model_dir

    fast, reference = _both(default_model_dir(), device)
    assert fast == reference


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_checkpoint(TINY["llama"], tmp_path, shard_bytes=1 << 20)
    return tmp_path


def _load(folder: Path) -> object:
    from resin_models_cuda import RunnerOptions, load_runner

    return load_runner(folder, RunnerOptions(num_pages=8), "cpu", torch.float32)


def test_a_tensor_missing_from_the_index_is_named_with_its_shape_and_shards(folder: Path) -> None:
    index = json.loads((folder / INDEX).read_text())
    del index["weight_map"]["model.layers.1.mlp.down_proj.weight"]
    (folder / INDEX).write_text(json.dumps(index))
    with pytest.raises(KeyError) as info:
        _load(folder)
    message = str(info.value)
    assert "no tensor 'model.layers.1.mlp.down_proj.weight'" in message
    assert "expected shape (64, 96)" in message and "model-00001-of-" in message


def test_a_tensor_missing_from_its_shard_names_the_shard(folder: Path) -> None:
    index = json.loads((folder / INDEX).read_text())["weight_map"]
    name = "model.layers.0.self_attn.o_proj.weight"
    shard = folder / index[name]
    tensors = load_file(shard)
    del tensors[name]
    save_file(tensors, shard)
    with pytest.raises(KeyError, match=f"{index[name]} has no tensor '{name}'.*expected shape"):
        _load(folder)


def test_a_mis_shaped_tensor_is_named_with_both_shapes_and_its_file(folder: Path) -> None:
    index = json.loads((folder / INDEX).read_text())["weight_map"]
    name = "model.layers.0.mlp.up_proj.weight"
    shard = folder / index[name]
    tensors = load_file(shard)
    tensors[name] = torch.zeros(95, 64, dtype=torch.bfloat16)
    save_file(tensors, shard)
    with pytest.raises(
        ValueError,
        match=rf"{name}: shape \(95, 64\), expected \(96, 64\) "
        rf"\(in {index[name]}\)",
    ):
        _load(folder)


def test_a_shard_the_index_names_but_the_folder_lacks_is_named(folder: Path) -> None:
    index = json.loads((folder / INDEX).read_text())["weight_map"]
    missing = sorted(set(index.values()))[-1]
    (folder / missing).unlink()
    from resin_model.checkpoint_error import CheckpointError

    with pytest.raises(CheckpointError, match=f"{missing}.* is missing"):
        _load(folder)


def test_resin_bench_checkpoint_writes_a_folder_resin_serve_can_tokenize(tmp_path: Path) -> None:
    from resin.tokenizer import Tokenizer
    from resin_app.bench import main
    from resin_model.hf_config import load_config

    assert main(["checkpoint", "--preset", "tiny", "--output", str(tmp_path)]) == 0
    tokenizer = Tokenizer.from_dir(tmp_path)
    config = load_config(tmp_path)
    assert config.vocab_size == tokenizer.vocab_size == 49152  # grown to the tokenizer's
    assert max(tokenizer.encode("a longer sentence, with punctuation!")) < config.vocab_size
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert main(["checkpoint", "--preset", "no-such", "--output", str(tmp_path)]) == 2
