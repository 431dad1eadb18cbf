"""Convert a llama.cpp `.gguf` checkpoint into a Hugging Face-style folder.

`convert_gguf(path, out_dir)` writes config.json, model.safetensors (float32),
generation_config.json, tokenizer.json and tokenizer_config.json, so every runner that reads a
Hugging Face folder (`registry.load_runner`) and `transformers` itself can load the result.

Invariants:
- every tensor is dequantized by the `gguf` package's own `gguf.quants.dequantize` and stored as
  float32, which holds every dequantized value exactly (Q4/Q8 blocks are f16 scale * int + f16
  offset, computed in f32): the folder's weights equal `transformers`' own GGUF loading bit for bit;
- llama.cpp stores llama-architecture Q/K projections with the rotary halves interleaved per head
  (its converter permutes them for its "normal" RoPE); `_unpermute_qk` undoes exactly that;
- llama.cpp stores Gemma RMSNorm weights as `1 + w`; the `- 1` is undone so the weights mean what
  Hugging Face's Gemma code expects;
- a tensor name without a mapping is an error, never silently dropped (a dropped tensor would give a
  model that loads and talks nonsense).

Neither `transformers` nor `torch` is imported: conversion needs `gguf`, `numpy`, `safetensors`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from resin_model.checkpoint_error import CheckpointError
from resin_model.gguf_tokenizer import build_tokenizer_files

GGUF_MAGIC = b"GGUF"


class GGUFError(CheckpointError):
    """A `.gguf` file that cannot be read or converted (the message says which and why)."""


@dataclass(frozen=True)
class GGUFFile:
    """The parsed metadata of one `.gguf` file and a lazy view of its tensors."""

    path: Path
    metadata: dict[str, Any]
    """llama.cpp keys -> Python values (str, int, float, bool, or lists of those)."""
    reader: Any  # gguf.GGUFReader (numpy memmap over the file)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """Metadata `<architecture>.<key>` (llama.cpp prefixes model keys with the arch)."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(str(t.name) for t in self.reader.tensors)

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(GGUF name, float32 array in PyTorch's row-major shape), dequantized one at a time."""
        from gguf.quants import dequantize

        for tensor in self.reader.tensors:
            array = dequantize(tensor.data, tensor.tensor_type)
            shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
            yield str(tensor.name), np.ascontiguousarray(array.reshape(shape), dtype=np.float32)


def read_gguf(path: str | Path) -> GGUFFile:
    """Open a `.gguf` file (memory-mapped) and read all its metadata."""
    file = Path(path)
    if not file.is_file():
        raise GGUFError(f"GGUF file not found: {file}")
    with file.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise GGUFError(f"{file} is not a GGUF file (it does not start with b'GGUF')")
    import gguf

    try:
        reader = gguf.GGUFReader(str(file))
        metadata = {name: _field_value(field) for name, field in reader.fields.items()}
    except Exception as exc:  # a truncated or corrupt file: say which file, on one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GGUFError(f"cannot read GGUF file {file}: {reason}") from None
    return GGUFFile(path=file, metadata=metadata, reader=reader)


def _field_value(field: Any) -> Any:
    value = field.contents()
    if isinstance(value, np.generic):
        return value.item()
    return value


# --- names ------------------------------------------------------------------------------------

_LLAMA_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}

_GEMMA3_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^([a-z_0-9]+)\.(weight|bias)$")


def hf_tensor_name(gguf_name: str, layer_names: dict[str, str]) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; unknown names raise."""
    match = _LAYER_RE.match(gguf_name)
    if match and match.group(2) in layer_names:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{layer_names[part]}.{kind}"
    match = _GLOBAL_RE.match(gguf_name)
    if match and match.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[match.group(1)]}.{match.group(2)}"
    raise GGUFError(f"GGUF tensor {gguf_name!r} has no Hugging Face name in this converter")


def _unpermute_qk(array: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head (2, d/2) -> (d/2, 2) row interleave of a Q or K projection."""
    rows = array.shape[0]
    head_dim = rows // num_heads
    tail = array.shape[1:]
    out = array.reshape(num_heads, head_dim // 2, 2, *tail).swapaxes(1, 2)
    return np.ascontiguousarray(out.reshape(rows, *tail))


# --- per-architecture recipes ---------------------------------------------------------------


@dataclass(frozen=True)
class _ArchRecipe:
    """How one llama.cpp architecture maps onto a Hugging Face model type."""

    layer_names: dict[str, str]
    config: Callable[[GGUFFile], dict[str, Any]]
    fix_tensor: Callable[[GGUFFile, str, np.ndarray], np.ndarray]


def _round_f32(value: Any) -> float:
    """GGUF stores floats as f32; print 1e-05, not 9.999999747378752e-06 (same f32 value)."""
    return float(str(np.float32(value)))


def _llama_config(gg: GGUFFile) -> dict[str, Any]:
    heads = int(gg.arch_value("attention.head_count"))
    hidden = int(gg.arch_value("embedding_length"))
    head_dim = int(gg.arch_value("attention.key_length", hidden // heads))
    rope_theta = _round_f32(gg.arch_value("rope.freq_base", 10000.0))
    scaling = gg.arch_value("rope.scaling.type")
    if scaling not in (None, "none"):
        raise GGUFError(f"{gg.path}: RoPE scaling {scaling!r} is not supported by this converter")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(gg.arch_value("feed_forward_length")),
        "num_hidden_layers": int(gg.arch_value("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(gg.arch_value("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _round_f32(gg.arch_value("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "rope_scaling": None,
        "max_position_embeddings": int(gg.arch_value("context_length", 2048)),
        "attention_bias": any(n.endswith("attn_q.bias") for n in gg.tensor_names),
        "mlp_bias": False,
    }


def _llama_fix(gg: GGUFFile, name: str, array: np.ndarray) -> np.ndarray:
    if ".attn_q." in name:
        return _unpermute_qk(array, int(gg.arch_value("attention.head_count")))
    if ".attn_k." in name:
        heads = gg.arch_value("attention.head_count_kv", gg.arch_value("attention.head_count"))
        return _unpermute_qk(array, int(heads))
    return array


def _gemma3_config(gg: GGUFFile) -> dict[str, Any]:
    heads = int(gg.arch_value("attention.head_count"))
    window = int(gg.arch_value("attention.sliding_window", 512))
    layers = int(gg.arch_value("block_count"))
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": int(gg.arch_value("embedding_length")),
        "intermediate_size": int(gg.arch_value("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(gg.arch_value("attention.head_count_kv", heads)),
        "head_dim": int(gg.arch_value("attention.key_length")),
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": _round_f32(gg.arch_value("attention.layer_norm_rms_epsilon")),
        "rope_theta": _round_f32(gg.arch_value("rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": 10000.0,
        "sliding_window": window,
        # Gemma 3: every sixth layer is global, the others slide (llama.cpp hard-codes the same).
        "layer_types": [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)
        ],
        "query_pre_attn_scalar": int(gg.arch_value("attention.key_length")),
        "max_position_embeddings": int(gg.arch_value("context_length", 32768)),
        "attention_bias": False,
    }


def _gemma3_fix(gg: GGUFFile, name: str, array: np.ndarray) -> np.ndarray:
    if name.endswith("norm.weight"):
        return array - np.float32(1.0)
    return array


_RECIPES = {
    "llama": _ArchRecipe(_LLAMA_LAYER_NAMES, _llama_config, _llama_fix),
    "gemma3": _ArchRecipe(_GEMMA3_LAYER_NAMES, _gemma3_config, _gemma3_fix),
}


def _recipe(gg: GGUFFile) -> _ArchRecipe:
    if gg.architecture not in _RECIPES:
        raise GGUFError(
            f"{gg.path}: GGUF architecture {gg.architecture!r} is not supported "
            f"(supported: {sorted(_RECIPES)})"
        )
    return _RECIPES[gg.architecture]


# --- the conversion ---------------------------------------------------------------------------


def hf_state_dict(gg: GGUFFile) -> dict[str, np.ndarray]:
    """Every tensor of the file, dequantized to float32 and renamed to Hugging Face names."""
    recipe = _recipe(gg)
    return {
        hf_tensor_name(name, recipe.layer_names): recipe.fix_tensor(gg, name, array)
        for name, array in gg.tensors()
    }


def hf_config(gg: GGUFFile) -> dict[str, Any]:
    """config.json for the file: architecture fields plus vocabulary and special token ids."""
    config = _recipe(gg).config(gg)
    tokens = gg.metadata.get("tokenizer.ggml.tokens")
    vocab_size = gg.arch_value("vocab_size", len(tokens) if tokens is not None else None)
    if vocab_size is None:
        raise GGUFError(f"{gg.path}: neither a vocabulary size nor a token list in the metadata")
    config.update(
        vocab_size=int(vocab_size),
        tie_word_embeddings="output.weight" not in gg.tensor_names,
        torch_dtype="float32",
        bos_token_id=gg.metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=gg.metadata.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=gg.metadata.get("tokenizer.ggml.padding_token_id"),
    )
    return config


def stop_token_ids(gg: GGUFFile) -> list[int]:
    """EOS plus end-of-turn / end-of-message ids, in that order, without repeats."""
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    ids = [gg.metadata.get(f"tokenizer.ggml.{key}") for key in keys]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def generation_config(gg: GGUFFile) -> dict[str, Any]:
    stops = stop_token_ids(gg)
    return {
        "bos_token_id": gg.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": stops[0] if len(stops) == 1 else stops,
        "pad_token_id": gg.metadata.get("tokenizer.ggml.padding_token_id"),
    }


def convert_gguf(path: str | Path, out_dir: str | Path) -> Path:
    """Write the Hugging Face folder for `path` into `out_dir` (created; existing files replaced).

    Returns `out_dir`. Raises `GGUFError` for a missing, corrupt or unsupported file.
    """
    from safetensors.numpy import save_file

    gg = read_gguf(path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        config = hf_config(gg)
        tokenizer_json, tokenizer_config = build_tokenizer_files(gg.metadata, gg.path)
        state = hf_state_dict(gg)
    except GGUFError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        # metadata of the wrong type or shape: the file is malformed, not the converter
        raise GGUFError(f"{gg.path.name}: malformed GGUF metadata or tensors ({exc!r})") from None
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation_config(gg))
    _write_json(out / "tokenizer.json", tokenizer_json)
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    return out


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
