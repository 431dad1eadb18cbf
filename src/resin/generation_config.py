"""The checkpoint's recommended sampling, for the fields a request leaves out.

Read once at startup beside the tokenizer's metadata (`resin_app.loading`); the server fills a
request's omitted fields from it (`resin.server.service.Service.params`).

vLLM applies a model's `generation_config.json` the same way: a request that sends no
`temperature` samples at the checkpoint's temperature, not at 1.0. Sources, by
`resin serve --generation-config`:
- `auto` (default): the checkpoint folder's `generation_config.json` (`temperature`, `top_p`,
  `top_k`, `min_p`, `repetition_penalty`, `max_new_tokens` -> the default `max_tokens`); for a
  folder converted from a GGUF file, the file's `general.sampling.*` metadata fills what the
  JSON lacks;
- `none`: no defaults (temperature 1.0, no top-p/top-k/min-p, max_tokens = what the context
  has left);
- a path: a JSON file in `generation_config.json`'s shape (errors there stop the server).
A field a request sends always wins; `/v1/models` shows the defaults in effect.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
}
JSON_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
    "repetition_penalty": "repetition_penalty",
}


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    """Defaults for omitted request fields (None: the server's own default)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    repetition_penalty: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_mapping(
        cls, raw: dict[str, Any], keys: dict[str, str], strict: bool
    ) -> GenerationDefaults:
        """The known fields of `raw` (renamed by `keys`); an invalid value raises `ValueError`
        when `strict`, else is left out."""
        values: dict[str, Any] = {}
        for key, name in keys.items():
            if key not in raw or raw[key] is None:
                continue
            value = _checked(name, raw[key])
            if value is None and strict:
                raise ValueError(f"generation config: invalid {key} {raw[key]!r}")
            if value is not None:
                values[name] = value
        return cls(**values)

    def fill(self, other: GenerationDefaults) -> GenerationDefaults:
        """These defaults, with `other`'s values where these have none."""
        return replace(other, **self.as_dict())


NO_DEFAULTS = GenerationDefaults()


def resolve(setting: str, folder: str | Path | None) -> GenerationDefaults:
    """The defaults for `--generation-config setting` and the checkpoint `folder`."""
    if setting == "none":
        return GenerationDefaults()
    if setting != "auto":
        path = Path(setting)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"generation config {setting}: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"generation config {setting}: not a JSON object")
        return GenerationDefaults.from_mapping(raw, JSON_KEYS, strict=True)
    if folder is None:
        return GenerationDefaults()
    base = Path(folder)
    found = GenerationDefaults()
    config = base / "generation_config.json"
    if config.is_file():
        try:
            raw = json.loads(config.read_text(encoding="utf-8"))
        except ValueError:
            raw = {}
        if isinstance(raw, dict):
            found = GenerationDefaults.from_mapping(raw, JSON_KEYS, strict=False)
    return found.fill(_gguf_defaults(base))


def _gguf_defaults(folder: Path) -> GenerationDefaults:
    """`general.sampling.*` of the GGUF file a converted folder came from (if any)."""
    source = folder / "resin_source.json"
    if not source.is_file():
        return GenerationDefaults()
    try:
        path = json.loads(source.read_text(encoding="utf-8"))["source"]
        metadata = gguf_scalars(Path(path), set(GGUF_KEYS))
    except Exception:  # a moved or unreadable source only loses its defaults
        return GenerationDefaults()
    return GenerationDefaults.from_mapping(metadata, GGUF_KEYS, strict=False)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip


def gguf_scalars(path: Path, wanted: set[str]) -> dict[str, Any]:
    """The scalar metadata values named in `wanted`, read from a GGUF header (v2/v3) without
    loading the tensors (the full reader takes seconds on a tokenizer's arrays)."""
    found: dict[str, Any] = {}
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, _tensors, count = struct.unpack("<IQQ", f.read(20))
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        for _ in range(count):
            key = _string(f)
            kind = struct.unpack("<I", f.read(4))[0]
            value = _value(f, kind)
            if key in wanted:
                found[key] = value
            if len(found) == len(wanted):
                break
    return found


def _string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n).decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
    if kind == 8:
        return _string(f)
    if kind == 9:  # arrays are skipped (none of the wanted keys is one)
        item, n = struct.unpack("<IQ", f.read(12))
        if item in _SCALARS:
            f.seek(n * struct.calcsize(_SCALARS[item]), 1)
        else:
            for _ in range(n):
                _value(f, item)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def _checked(name: str, value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if name in ("top_k", "max_tokens"):
        if int(value) != value or value < 0 or (name == "max_tokens" and value < 1):
            return None
        return int(value) if value > 0 else None
    if name == "temperature":
        return float(value) if 0 <= value <= 2 else None
    if name == "top_p":
        return float(value) if 0 < value <= 1 else None
    if name == "repetition_penalty":
        return float(value) if 0 < value <= 100 else None
    return float(value) if 0 <= value <= 1 else None
