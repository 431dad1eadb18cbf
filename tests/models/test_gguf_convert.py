"""GGUF -> Hugging Face folder on a synthetic file: a random `transformers` Llama is written out the
way llama.cpp's converter writes it (Q/K rows permuted per head, one tensor Q8_0-quantized, a
byte-level BPE vocabulary), converted back by Resin, and compared with the original weights and
with `transformers`' own GGUF loader."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from resin.tokenizer import Tokenizer
from resin_model.default_model import converted_gguf_dir
from resin_model.gguf import GGUFError, convert_gguf, read_gguf
from resin_model.gguf_tokenizer import GGUFTokenizerError


def _config(vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["hello", "world", "the", "capital", "Paris", "ing"]


def _vocab() -> tuple[list[str], list[str]]:
    """Specials, the 256 byte symbols, then merges building a few words (with and without Ġ)."""
    tokens = SPECIALS + list(bytes_to_unicode().values())
    merges: list[str] = []
    for word in WORDS + ["Ġ" + w for w in WORDS]:
        current = word[0]
        for char in word[1:]:
            merged = current + char
            if merged not in tokens:
                merges.append(f"{current} {char}")
                tokens.append(merged)
            current = merged
    return tokens, merges


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj / k_proj (its `permute`)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _write_gguf(model: LlamaForCausalLM, path: Path, tokens: list[str], merges: list[str]) -> None:
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}{% endfor %}")
    for name, tensor in model.state_dict().items():
        w = tensor.numpy()
        if name == "model.embed_tokens.weight":
            writer.add_tensor("token_embd.weight", w)
        elif name == "model.norm.weight":
            writer.add_tensor("output_norm.weight", w)
        elif name == "lm_head.weight":
            writer.add_tensor("output.weight", w)
        else:
            _, _, layer, *rest = name.split(".")
            part = GGUF_NAMES[".".join(rest[:-1])]
            if part == "attn_q":
                w = _llama_cpp_permute(w, cfg.num_attention_heads)
            elif part == "attn_k":
                w = _llama_cpp_permute(w, cfg.num_key_value_heads)
            gname = f"blk.{layer}.{part}.weight"
            if part == "ffn_down":  # one quantized tensor, as real files have
                q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
                writer.add_tensor(gname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                writer.add_tensor(gname, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaForCausalLM, Path, Path]:
    torch.manual_seed(0)
    tokens, merges = _vocab()
    model = LlamaForCausalLM(_config(len(tokens))).eval()
    for p in model.parameters():  # norms start at 1: make them distinguishable too
        torch.nn.init.normal_(p, std=0.5)
    root = tmp_path_factory.mktemp("synthetic")
    _write_gguf(model, root / "tiny.gguf", tokens, merges)
    return model, root / "tiny.gguf", convert_gguf(root / "tiny.gguf", root / "hf")


def test_weights_round_trip_through_llama_cpp_layout(synthetic: tuple) -> None:
    model, _, folder = synthetic
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    original, converted = model.state_dict(), loaded.state_dict()
    assert set(original) == set(converted)
    for name, tensor in original.items():
        if "down_proj" in name:  # Q8_0: within one quantization step of the original
            step = tensor.abs().amax(dim=1, keepdim=True) / 127
            assert ((converted[name] - tensor).abs() <= step).all(), name
            assert not torch.equal(converted[name], tensor)  # it really went through Q8_0
        else:
            assert torch.equal(converted[name], tensor), name
    # With the Q8_0 tensors taken over, the two models are the same function.
    model_q = LlamaForCausalLM(model.config).eval()
    model_q.load_state_dict({**original, **{k: v for k, v in converted.items() if "down" in k}})
    ids = torch.tensor([[5, 9, 200, 3, 77, 14]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model_q(ids).logits, atol=1e-5, rtol=0)


def test_matches_transformers_gguf_loader(synthetic: tuple) -> None:
    _, file, folder = synthetic
    pytest.importorskip("accelerate", reason="transformers loads GGUF weights only with it")
    reference = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name)
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    ref, got = reference.state_dict(), loaded.state_dict()
    assert set(ref) == set(got)
    for name in ref:
        assert torch.equal(ref[name], got[name]), name


def test_config_and_tokenizer_files(synthetic: tuple) -> None:
    model, file, folder = synthetic
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    for field in ("hidden_size", "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps"):
        assert getattr(loaded.config, field) == getattr(model.config, field), field
    assert loaded.config.tie_word_embeddings is False
    tok = Tokenizer.from_dir(folder)
    assert tok.eos_token_ids == (2,)
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template
    reference = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    for text in ["hello world", " the capital Paris 42!", "<|im_start|>hello<|im_end|>", "é😀"]:
        assert tok.encode(text) == reference.encode(text, add_special_tokens=False), text
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("hello") == [tok.token_to_id("hello")]
    assert tok.encode("<|im_end|>") == [2]


def test_bad_files_give_clear_errors(tmp_path: Path, synthetic: tuple) -> None:
    with pytest.raises(GGUFError, match="not found"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        convert_gguf(tmp_path / "junk.gguf", tmp_path / "out")
    _, file, _ = synthetic
    (tmp_path / "cut.gguf").write_bytes(file.read_bytes()[:5000])
    with pytest.raises(GGUFError, match="cannot read"):
        read_gguf(tmp_path / "cut.gguf")


def test_unsupported_architecture_and_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_tokenizer_model("bert")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError, match="architecture 'mamba' is not supported"):
        convert_gguf(path, tmp_path / "out")
    from resin_model.gguf_tokenizer import build_tokenizer_files

    with pytest.raises(GGUFTokenizerError, match=r"'bert' .* is not supported"):
        build_tokenizer_files(read_gguf(path).metadata, path)


def test_cache_key_follows_the_content(tmp_path: Path, synthetic: tuple) -> None:
    _, file, _ = synthetic
    cache = tmp_path / "cache"
    source = tmp_path / "model.gguf"
    source.write_bytes(file.read_bytes())
    first = converted_gguf_dir(source, root=cache)
    assert converted_gguf_dir(source, root=cache) == first
    # The same file in a new virtualenv (another path, another mtime): no second copy.
    again = tmp_path / "venv2" / "model.gguf"
    again.parent.mkdir()
    again.write_bytes(file.read_bytes())
    os.utime(again, ns=(again.stat().st_atime_ns, again.stat().st_mtime_ns + 10**9))
    converting: list[Path] = []
    assert converted_gguf_dir(again, root=cache, on_convert=converting.append) == first
    assert not converting
    # A copy under the old (name, size, mtime) key is removed by the next conversion, and so
    # is the copy of this file's old content once the content changes.
    old = cache / "model-0123456789abcdef"
    shutil.copytree(first, old)
    (old / "resin_source.json").write_text(json.dumps({"source": str(source)}))
    data = bytearray(source.read_bytes())
    data[-1] ^= 1  # the last tensor's last byte: still a valid file, other content
    source.write_bytes(bytes(data))
    second = converted_gguf_dir(source, root=cache)
    assert second != first and (second / "config.json").is_file()
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == [second.name]


def test_conversion_imports_neither_torch_nor_transformers(
    tmp_path: Path, synthetic: tuple
) -> None:
    _, file, _ = synthetic
    code = (
        "import sys\n"
        "from resin_model.gguf import convert_gguf\n"
        f"convert_gguf({str(file)!r}, {str(tmp_path / 'out')!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "out" / "model.safetensors").is_file()
