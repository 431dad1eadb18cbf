"""IncrementalDetokenizer round-trips text token by token on real tokenizers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resin.detokenizer import IncrementalDetokenizer
from tests.recipe.assets import npm_tokenizer, smollm2_tokenizer

SAMPLES = [
    "Hello, world! How are you today?",
    "Emoji: 😀👍🏽🇫🇷 and a family 👨‍👩‍👧‍👦 done.",
    "中文测试：你好，世界！日本語のテキスト。한국어 텍스트",
    "Accents: café, naïve, façade, Ångström, Žluťoučký kůň.",
    "  leading spaces\n\nnewlines\ttabs   and trailing  ",
    "Math ∑∫√∞ ≠ ≤ and code `x = {'a': [1, 2]}`",
    "Mixed😀中文é\u200dz",
    "Rare 𓀀🦩ꙮ𝔘 glyphs",
]

TOKENIZERS = ["qwen3", "llama3", "gemma3", "smollm2"]


def _load(name: str):  # type: ignore[no-untyped-def]
    return smollm2_tokenizer() if name == "smollm2" else npm_tokenizer(name)


def _stream(tok, ids: list[int], splits: list[int]) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
    pieces: list[str] = []
    start = 0
    for end in [*splits, len(ids)]:
        pieces.append(detok.push(ids[start:end]))
        start = end
    pieces.append(detok.flush())
    return "".join(pieces), pieces


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("text", SAMPLES)
def test_token_by_token_round_trip(name: str, text: str) -> None:
    tok = _load(name)
    ids = tok.encode(text)
    expected = tok.decode(ids, skip_special_tokens=True)
    streamed, pieces = _stream(tok, ids, list(range(1, len(ids))))
    assert streamed == expected
    # Nothing emitted is a half character.
    assert all("\ufffd" not in p for p in pieces)


@pytest.mark.parametrize("name", ["gemma3", "llama3"])
def test_incomplete_character_is_held_back(name: str) -> None:
    tok = _load(name)
    char = "𓀀"  # byte-fallback pieces in Gemma, byte-level BPE pieces in Llama 3
    ids = tok.encode(char)
    assert len(ids) > 1, "the character should take several byte tokens"
    detok = IncrementalDetokenizer(tok)
    assert detok.push(ids[:1]) == ""
    assert detok.push(ids[1:]) == char
    assert detok.flush() == ""


def test_flush_reports_unfinished_character() -> None:
    tok = _load("llama3")
    ids = tok.encode("😀")
    detok = IncrementalDetokenizer(tok)
    assert detok.push(ids[:1]) == ""
    assert detok.flush() == "\ufffd"


def test_sentencepiece_leading_space_kept_between_pushes() -> None:
    tok = _load("gemma3")
    ids = tok.encode("one two three")
    detok = IncrementalDetokenizer(tok)
    out = [detok.push([i]) for i in ids]
    assert "".join(out) == "one two three"
    assert out[1].startswith(" ")


def test_special_tokens_skipped_or_kept() -> None:
    tok = _load("qwen3")
    ids = [*tok.encode("hi"), tok.token_to_id("<|im_end|>")]
    assert "".join(IncrementalDetokenizer(tok).push([i]) for i in ids) == "hi"
    keep = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert "".join(keep.push([i]) for i in ids) == "hi<|im_end|>"


@settings(max_examples=25, deadline=None)
@given(
    text=st.text(
        st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40
    ),
    data=st.data(),
)
def test_random_text_random_splits(text: str, data: st.DataObject) -> None:
    for name in ("qwen3", "gemma3"):
        tok = _load(name)
        ids = tok.encode(text)
        expected = tok.decode(ids, skip_special_tokens=True)
        splits = sorted(
            set(data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)), label=name))
        )
        streamed, _ = _stream(tok, ids, splits)
        if "\ufffd" not in expected:
            assert streamed == expected
