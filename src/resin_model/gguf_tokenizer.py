"""Build `tokenizer.json` + `tokenizer_config.json` from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary (`tokenizer.ggml.tokens`), the
BPE merges, per-token types (1 normal, 3 control, 4 user-defined, 6 byte), the special token ids,
the chat template, and the *name* of its pre-tokenizer (`tokenizer.ggml.pre`), whose regex lives in
llama.cpp's source. This module rebuilds the equivalent Hugging Face `tokenizers` pipeline.

Supported: byte-level BPE (`tokenizer.ggml.model == "gpt2"`), as SmolLM2, Llama 3, Qwen 2 and
GPT-2 use it, and Gemma's SentencePiece BPE with byte fallback (`"llama"` in a Gemma file).
Invariants:
- token ids equal the file's indices (the vocabulary is the file's list, in order);
- control tokens (type 3) become special added tokens and user-defined ones (type 4) plain added
  tokens, so both are matched whole in text, as llama.cpp does;
- an unknown `tokenizer.ggml.pre` is an error: a wrong split regex gives plausible but wrong ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONTROL, USER_DEFINED = 3, 4

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# llama.cpp pre-tokenizer name -> (digits split one by one first?, split regex).
# "smollm"/"starcoder"/"refact" are GPT-2's regex after isolating every digit, which is what
# SmolLM2's own tokenizer.json spells as Digits(individual_digits) + ByteLevel.
_PRE_TOKENIZERS: dict[str, tuple[bool, str]] = {
    "default": (False, _GPT2_SPLIT),
    "gpt-2": (False, _GPT2_SPLIT),
    "smollm": (True, _GPT2_SPLIT),
    "starcoder": (True, _GPT2_SPLIT),
    "refact": (True, _GPT2_SPLIT),
    "llama-bpe": (False, _LLAMA3_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT),
    "smaug-bpe": (False, _LLAMA3_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
}


_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")


class GGUFTokenizerError(ValueError):
    """The file's tokenizer metadata is missing or describes an unsupported tokenizer."""


def build_tokenizer_files(
    metadata: dict[str, Any], source: Path | str = "<gguf>"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer.json, tokenizer_config.json) contents for a GGUF file's metadata."""
    model = metadata.get("tokenizer.ggml.model")
    arch = metadata.get("general.architecture")
    if model == "gpt2":
        tokenizer = _byte_level_bpe(metadata, source)
    elif model == "llama" and arch in _GEMMA_ARCHS:
        tokenizer = _gemma_bpe(metadata, source)
    else:
        raise GGUFTokenizerError(
            f"{source}: GGUF tokenizer model {model!r} (architecture {arch!r}) is not supported "
            "(supported: 'gpt2' byte-level BPE; 'llama' SentencePiece BPE for Gemma)"
        )
    return json.loads(tokenizer.to_str()), _tokenizer_config(metadata)


def _byte_level_bpe(metadata: dict[str, Any], source: Path | str) -> Any:
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
    merges_text: list[str] = list(metadata.get("tokenizer.ggml.merges") or [])
    if not tokens or not merges_text:
        raise GGUFTokenizerError(f"{source}: no tokenizer.ggml.tokens / merges in the metadata")
    types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    pre_name = str(metadata.get("tokenizer.ggml.pre", "default"))
    if pre_name not in _PRE_TOKENIZERS:
        raise GGUFTokenizerError(
            f"{source}: GGUF pre-tokenizer {pre_name!r} is not supported "
            f"(supported: {sorted(_PRE_TOKENIZERS)})"
        )
    digits, split = _PRE_TOKENIZERS[pre_name]

    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFTokenizerError(f"{source}: the vocabulary has duplicate tokens")
    # Byte-level tokens never hold a real space (it is spelled "Ġ"), so one space separates a pair.
    merges = [_merge_pair(m, source) for m in merges_text]
    bpe = models.BPE(
        vocab=vocab,
        merges=merges,
        fuse_unk=False,
        byte_fallback=False,
        ignore_merges=split is _LLAMA3_SPLIT,  # Llama 3's own tokenizer.json sets this
    )
    tokenizer = Tokenizer(bpe)
    steps: list[Any] = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps += [
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(metadata, tokens, processors)
    _add_special_tokens(tokenizer, tokens, types)
    return tokenizer


def _add_special_tokens(tokenizer: Any, tokens: list[str], types: list[int]) -> None:
    """Control tokens match whole as special tokens, user-defined ones as plain added tokens."""
    from tokenizers import AddedToken

    pairs = list(zip(tokens, types, strict=True))
    control = [AddedToken(t, special=True, normalized=False) for t, k in pairs if k == CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, k in pairs if k == USER_DEFINED]
    tokenizer.add_special_tokens(control)
    tokenizer.add_tokens(user)


def _gemma_bpe(metadata: dict[str, Any], source: Path | str) -> Any:
    """Gemma's SentencePiece BPE with byte fallback: spaces become "▁", no prefix space.

    The file has no merges; they are recovered from the vocabulary. Gemma's scores do not follow
    its merge order, the token order does: a token earlier in the file merges first, and of the
    ways to split one token, the longest left piece ranks first.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    raw: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
    if not raw:
        raise GGUFTokenizerError(f"{source}: no tokenizer.ggml.tokens in the metadata")
    types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(raw))
    # llama.cpp stores Gemma's all-space tokens with real spaces; SentencePiece spells them "▁".
    tokens = ["▁" * len(t) if t and not t.strip(" ") else t for t in raw]
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFTokenizerError(f"{source}: the vocabulary has duplicate tokens")
    merges = [
        (token[:cut], token[cut:])
        for token in tokens
        for cut in range(len(token) - 1, 0, -1)
        if token[:cut] in vocab and token[cut:] in vocab
    ]
    unk_id = int(metadata.get("tokenizer.ggml.unknown_token_id", 3))
    bpe = models.BPE(
        vocab=vocab, merges=merges, unk_token=tokens[unk_id], fuse_unk=True, byte_fallback=True
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.post_processor = _post_processor(metadata, tokens, processors)
    _add_special_tokens(tokenizer, tokens, types)
    return tokenizer


def _merge_pair(merge: str, source: Path | str) -> tuple[str, str]:
    left, space, right = merge.partition(" ")
    if not space or not left or not right:
        raise GGUFTokenizerError(f"{source}: malformed BPE merge {merge!r}")
    return left, right


def _post_processor(metadata: dict[str, Any], tokens: list[str], processors: Any) -> Any:
    """Prepend BOS when the file asks for it (`add_special_tokens=True` encodes only)."""
    bos_id = metadata.get("tokenizer.ggml.bos_token_id")
    if not metadata.get("tokenizer.ggml.add_bos_token", False) or bos_id is None:
        return processors.ByteLevel(trim_offsets=False)
    bos = tokens[int(bos_id)]
    return processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
    )


def _tokenizer_config(metadata: dict[str, Any]) -> dict[str, Any]:
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
    }
    arch = metadata.get("general.architecture")
    context = metadata.get(f"{arch}.context_length")
    if context is not None:
        config["model_max_length"] = int(context)
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    return config
