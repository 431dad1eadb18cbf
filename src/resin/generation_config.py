"""The checkpoint's recommended sampling, for the fields a request leaves out.

Read once at startup beside the tokenizer's metadata (`resin_app.loading`); the server fills a
request's omitted fields from it (`resin.server.service.Service.params`).

vLLM applies a model's `generation_config.json` the same way: a request that sends no
`temperature` samples at the checkpoint's temperature, not at 1.0. Sources, by
`resin serve --generation-config`:
- `auto` (default): the checkpoint folder's `generation_config.json` (the keys `Knob.config` of
  `resin.params.SamplingParams` names: `temperature`, `top_p`, `top_k`, `min_p`,
  `repetition_penalty`, `max_new_tokens` -> the default `max_tokens`); for a
  folder converted from a GGUF file, the file's `general.sampling.*` metadata fills what the
  JSON lacks;
- `none`: no defaults (temperature 1.0, no top-p/top-k/min-p, max_tokens = what the context
  has left);
- a path: a JSON file in `generation_config.json`'s shape (errors there stop the server).
A field a request sends always wins; `/v1/models` shows the defaults in effect. A value is
valid where `SamplingParams` accepts it.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from resin.params import FIELD_TYPES, KNOBS, Knob, SamplingParams

DEFAULTABLE: Mapping[str, Knob] = {
    k.public_name: k for k in KNOBS.values() if k.config is not None or k.gguf is not None
}
"""The fields a checkpoint may give defaults for, by public name (`Knob.config` / `.gguf`)."""
JSON_KEYS = {k.config: name for name, k in DEFAULTABLE.items() if k.config is not None}
GGUF_KEYS = {k.gguf: name for name, k in DEFAULTABLE.items() if k.gguf is not None}


class GenerationDefaults:
    """Defaults for omitted request fields, by public name (`DEFAULTABLE`; a field left out
    or None takes the server's own default). Immutable, compared by value."""

    __slots__ = ("_values",)

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(DEFAULTABLE))
        if unknown:
            raise TypeError(f"no generation defaults for {unknown}; known: {sorted(DEFAULTABLE)}")
        self._values = {k: v for k, v in values.items() if v is not None}

    def get(self, name: str) -> Any:
        """The default for the field of public name `name`, or None."""
        return self._values.get(name)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GenerationDefaults) and self._values == other.as_dict()

    def __hash__(self) -> int:
        return hash(frozenset(self._values.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"GenerationDefaults({inner})"

    @classmethod
    def from_mapping(
        cls, raw: Mapping[str, Any], keys: Mapping[str, str], strict: bool
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
        return GenerationDefaults(**{**other.as_dict(), **self._values})

    def apply(self, sent: Mapping[str, Any]) -> dict[str, Any]:
        """`sent` (values by public name, None = omitted) with these defaults where omitted."""
        return {**self._values, **{k: v for k, v in sent.items() if v is not None}}


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
    """`value` as the field of public name `name` takes it, or None when `SamplingParams`
    would refuse it (one set of bounds for requests and checkpoints)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    knob = DEFAULTABLE[name]
    if FIELD_TYPES[knob.name] is int and int(value) != value:
        return None
    number: float | int = int(value) if FIELD_TYPES[knob.name] is int else float(value)
    try:
        one: dict[str, Any] = {knob.name: number}
        SamplingParams(**one)
    except ValueError:
        return None
    return number
