"""Tokenizer loading (Hugging Face `tokenizers`, imported lazily) and its metadata.

`Tokenizer` wraps a `tokenizers.Tokenizer` with what a server and a recipe need from
`tokenizer_config.json`: the chat template, BOS/EOS tokens, and the stop token ids.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import tokenizers


class TokenizerLike(Protocol):
    """Text <-> token ids: the part of `Tokenizer` a server and the recipe helpers use (test
    doubles implement it too)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def special_token_strings(self) -> Sequence[str]: ...

    def encode_plain(self, text: str) -> list[int]:
        """`text` with special-token matching off (their strings stay text)."""
        ...


@dataclass(frozen=True)
class TokenizerInfo:
    """Metadata from `tokenizer_config.json` (or GGUF metadata)."""

    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    add_bos_token: bool = False
    extra_eos_token_ids: tuple[int, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)


class Tokenizer:
    """Text <-> token ids, plus the metadata a chat recipe needs."""

    def __init__(self, backend: tokenizers.Tokenizer, info: TokenizerInfo) -> None:
        self.backend = backend
        self.info = info
        self._plain: tokenizers.Tokenizer | None = None
        self._plain_lock = threading.Lock()
        self.source_dir: Path | None = None
        """The checkpoint folder it was read from (`from_dir`): where a server finds the
        checkpoint's generation defaults."""

    @classmethod
    def from_files(
        cls, tokenizer_json: str | Path, config_json: str | Path | None = None
    ) -> Tokenizer:
        import tokenizers

        backend = tokenizers.Tokenizer.from_file(str(tokenizer_json))
        raw: dict[str, Any] = {}
        if config_json is not None and Path(config_json).exists():
            raw = json.loads(Path(config_json).read_text(encoding="utf-8"))
        return cls(backend, _info_from_config(raw))

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json and chat_template.jinja from a folder.

        The stop tokens (`eos_token_ids`) are the config's EOS token plus every `eos_token_id`
        of generation_config.json (end-of-turn tokens such as `<|im_end|>` or `<|eot_id|>`).
        """
        folder = Path(path)
        tok = cls.from_files(folder / "tokenizer.json", folder / "tokenizer_config.json")
        template_file = folder / "chat_template.jinja"
        if template_file.exists() and tok.info.chat_template is None:
            info = TokenizerInfo(
                **{**tok.info.__dict__, "chat_template": template_file.read_text(encoding="utf-8")}
            )
            tok = cls(tok.backend, info)
        extra = _generation_eos_ids(folder / "generation_config.json")
        if extra:
            ids = tuple(dict.fromkeys((*tok.info.extra_eos_token_ids, *extra)))
            tok = cls(tok.backend, dataclasses.replace(tok.info, extra_eos_token_ids=ids))
        tok.source_dir = folder
        return tok

    def to_json(self) -> str:
        """The backend tokenizer serialized (what a grammar engine builds its vocabulary from)."""
        return str(self.backend.to_str())

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def chat_template(self) -> str | None:
        return self.info.chat_template

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        value = self.backend.token_to_id(token)
        return None if value is None else int(value)

    def id_to_token(self, token_id: int) -> str | None:
        value = self.backend.id_to_token(token_id)
        return None if value is None else str(value)

    @property
    def special_token_strings(self) -> tuple[str, ...]:
        """The strings of the special tokens (added tokens marked special)."""
        added = self.backend.get_added_tokens_decoder().values()
        return tuple(t.content for t in added if t.special and t.content)

    def encode_plain(self, text: str) -> list[int]:
        """`text` tokenized with special-token matching off: a special token's string in it
        stays plain text (`<`, `|`, `im`, ... tokens)."""
        with self._plain_lock:
            if self._plain is None:
                import tokenizers

                clone = tokenizers.Tokenizer.from_str(self.backend.to_str())
                clone.encode_special_tokens = True
                self._plain = clone
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    @property
    def bos_token_id(self) -> int | None:
        return None if self.info.bos_token is None else self.token_to_id(self.info.bos_token)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The EOS token of the config plus any extra end-of-turn ids, de-duplicated."""
        ids: list[int] = []
        if self.info.eos_token is not None:
            eos = self.token_to_id(self.info.eos_token)
            if eos is not None:
                ids.append(eos)
        ids.extend(i for i in self.info.extra_eos_token_ids if i not in ids)
        return tuple(ids)


def _generation_eos_ids(path: Path) -> tuple[int, ...]:
    """`eos_token_id` of generation_config.json (an int or a list): the model's stop tokens."""
    if not path.is_file():
        return ()
    value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    values = value if isinstance(value, list) else [value]
    return tuple(int(v) for v in values if isinstance(v, int) and not isinstance(v, bool))


def _token_text(value: object) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _info_from_config(raw: dict[str, Any]) -> TokenizerInfo:
    template = raw.get("chat_template")
    if isinstance(template, list):  # a list of named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return TokenizerInfo(
        chat_template=template if isinstance(template, str) else None,
        bos_token=_token_text(raw.get("bos_token")),
        eos_token=_token_text(raw.get("eos_token")),
        pad_token=_token_text(raw.get("pad_token")),
        add_bos_token=bool(raw.get("add_bos_token", False)),
        raw=raw,
    )
