"""Generation defaults from the checkpoint (`--generation-config auto|none|FILE`): omitted
request fields take them, sent fields win, `/v1/models` shows them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import openai
import pytest

from resin.generation_config import GenerationDefaults, resolve
from resin.params import SamplingParams
from resin.server.launch import running
from tests.server.conftest import MODEL, make_server
from tests.server.doubles import FakeEngine, FakeRequest


class RecordingEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[SamplingParams] = []

    def submit(
        self, prompt_token_ids: Sequence[int], sampling_params: SamplingParams | None = None
    ) -> FakeRequest:
        assert sampling_params is not None
        self.seen.append(sampling_params)
        return super().submit(prompt_token_ids, sampling_params)


def write(folder: Path, config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_resolve_auto_none_and_file(tmp_path: Path) -> None:
    config = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
              "max_new_tokens": 64, "eos_token_id": 2}  # fmt: skip
    folder = write(tmp_path / "ckpt", config)
    auto = resolve("auto", folder)
    assert auto == GenerationDefaults(temperature=0.6, top_p=0.95, top_k=20, max_tokens=64)
    assert resolve("none", folder) == GenerationDefaults()
    assert resolve("auto", tmp_path / "empty") == GenerationDefaults()
    # auto skips what it cannot use; an explicit file must be right
    bad = write(tmp_path / "bad", {"temperature": -1, "top_p": 0.5})
    assert resolve("auto", bad) == GenerationDefaults(top_p=0.5)
    with pytest.raises(ValueError, match="invalid temperature -1"):
        resolve(str(bad / "generation_config.json"), None)
    with pytest.raises(ValueError, match="generation config"):
        resolve(str(tmp_path / "missing.json"), None)
    assert resolve(str(folder / "generation_config.json"), None) == auto


def test_omitted_fields_take_the_defaults_and_sent_fields_win() -> None:
    engine = RecordingEngine()
    defaults = GenerationDefaults(temperature=0.3, top_p=0.8, top_k=7, min_p=0.05, max_tokens=5)
    with running(make_server(engine, generation_defaults=defaults)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=1.5,
            top_p=1.0, max_tokens=3, extra_body={"top_k": 0},
        )  # fmt: skip
        client.completions.create(model=MODEL, prompt="hi")
        card = client.models.list().data[0]
    bare, sent, completion = engine.seen
    assert (bare.temperature, bare.top_p, bare.top_k, bare.min_p, bare.max_output_tokens) == (
        pytest.approx(0.3), pytest.approx(0.8), 7, pytest.approx(0.05), 5)  # fmt: skip
    assert (sent.temperature, sent.top_p, sent.top_k, sent.max_output_tokens) == (1.5, 1.0, 0, 3)
    # completions keep the API's own max_tokens default (16), as OpenAI documents it
    assert completion.temperature == pytest.approx(0.3) and completion.max_output_tokens == 16
    assert card.model_extra is not None
    assert card.model_extra["generation_defaults"] == {
        "temperature": 0.3, "top_p": 0.8, "top_k": 7, "min_p": 0.05, "max_tokens": 5}  # fmt: skip


def test_without_defaults_a_bare_request_samples_at_one() -> None:
    engine = RecordingEngine()
    with running(make_server(engine)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        card = client.models.list().data[0]
    assert engine.seen[0].temperature == 1.0 and engine.seen[0].top_k == 0
    assert card.model_extra is not None and card.model_extra["generation_defaults"] == {}


def test_serve_help_lists_generation_config(capsys: pytest.CaptureFixture[str]) -> None:
    from resin_app.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--generation-config" in capsys.readouterr().out


def test_gguf_sampling_metadata_fills_what_the_json_lacks(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])  # skipped on the way
    writer.add_float32("general.sampling.temp", 0.25)
    writer.add_float32("general.sampling.top_p", 0.5)
    writer.add_int32("general.sampling.top_k", 40)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    folder = write(tmp_path / "converted", {"top_p": 0.9, "eos_token_id": 2})
    (folder / "resin_source.json").write_text(json.dumps({"source": str(path)}), encoding="utf-8")
    assert resolve("auto", folder) == GenerationDefaults(temperature=0.25, top_p=0.9, top_k=40)
    (folder / "resin_source.json").write_text(json.dumps({"source": "/gone.gguf"}), "utf-8")
    assert resolve("auto", folder) == GenerationDefaults(top_p=0.9)
