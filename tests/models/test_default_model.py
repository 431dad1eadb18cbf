"""default_model_dir / resolve_checkpoint: cache location, convert-once, atomicity, errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from resin_model import default_model
from resin_model.default_model import (
    DEFAULT_GENERATION,
    DEFAULT_GGUF,
    INSTALL_HINT,
    cache_dir,
    default_model_dir,
    resolve_checkpoint,
)
from resin_model.gguf import GGUFError


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RESIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "resin"
    monkeypatch.setenv("RESIN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("RESIN_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "resin"


def test_converts_once_then_reuses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RESIN_CACHE_DIR", str(tmp_path))
    from resin_app.loading import LoadOptions, load

    load(LoadOptions(fake=True)).close()  # `resin serve --fake-runner` on a fresh machine
    converting = [ln for ln in capfd.readouterr().err.splitlines() if "converting" in ln]
    assert len(converting) == 1 and DEFAULT_GGUF in converting[0]  # its own line, once
    seen: list[Path] = []
    first = default_model_dir(seen.append)
    assert not seen  # converted already: the hook is not called
    assert first.is_relative_to(tmp_path)
    config = json.loads((first / "generation_config.json").read_text())
    assert config["eos_token_id"] == 2  # the converter's fields stay
    assert {k: config[k] for k in DEFAULT_GENERATION} == DEFAULT_GENERATION
    names = {p.name for p in first.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert {"tokenizer_config.json", "generation_config.json"} <= names
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    started = time.perf_counter()
    again = default_model_dir()
    assert again == first
    assert time.perf_counter() - started < 1.0
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # not rewritten
    # Only the finished folder is left: no temporary directory survives the rename.
    assert [p.name for p in first.parent.iterdir() if p.is_dir()] == [first.name]
    assert resolve_checkpoint("SmolLM2-135M-Instruct") == first
    assert resolve_checkpoint("smollm2-135m-instruct") == first
    assert resolve_checkpoint(first) == first


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "DEFAULT_PACKAGE", "resin_no_such_package")
    with pytest.raises(FileNotFoundError) as info:
        default_model_dir()
    assert INSTALL_HINT in str(info.value)


def test_an_environment_variable_names_the_gguf(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    packaged = default_model.default_gguf_path()
    monkeypatch.setenv("RESIN_DEFAULT_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match=r"RESIN_DEFAULT_GGUF names .*missing\.gguf"):
        default_model.default_gguf_path()
    monkeypatch.setenv("RESIN_DEFAULT_GGUF", str(packaged))
    monkeypatch.setattr(default_model, "DEFAULT_PACKAGE", "resin_no_such_package")
    assert default_model.default_gguf_path() == packaged


def test_resolve_checkpoint_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RESIN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        resolve_checkpoint(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"neither config\.json nor a \.gguf"):
        resolve_checkpoint(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(GGUFError, match=r"neither a folder nor a \.gguf"):
        resolve_checkpoint(tmp_path / "weights.bin")
    (tmp_path / "bad.gguf").write_bytes(b"nope")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        resolve_checkpoint(tmp_path / "bad.gguf")
    folders = [p for p in (tmp_path / "cache" / "gguf").iterdir() if p.is_dir()]
    assert folders == []  # the failed scratch is gone (the digest index may stay)
