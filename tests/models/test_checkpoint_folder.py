"""A checkpoint is a closed folder, checked before anything is allocated
(`resin_model.checkpoint_folder`): crafted folders made from one tiny `resin bench checkpoint`
folder, each with one defect, must be refused with one `CheckpointError` line naming the entry,
and the real layouts (a sharded folder, a hub snapshot of symlinks into blobs/) still pass."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from resin_app.bench.checkpoint import INDEX, write_checkpoint
from resin_app.loading import LoadOptions, check_memory
from resin_model.checkpoint_folder import (
    CheckedCheckpoint,
    CheckpointError,
    TensorInfo,
    check_checkpoint,
)
from resin_model.presets import TINY
from resin_model.quant_config import parse_quant_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    write_checkpoint(TINY["llama"], folder, shard_bytes=1 << 20)
    return folder


def copy(tiny: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny, folder)
    return folder


def edit_json(path: Path, **changes: Any) -> None:
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def first_shard(folder: Path) -> str:
    return sorted(json.loads((folder / INDEX).read_text())["weight_map"].values())[0]


def refused(folder: Path, *words: str) -> str:
    with pytest.raises(CheckpointError) as info:
        check_checkpoint(folder)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


def test_the_tiny_folder_passes(tiny: Path) -> None:
    checked = check_checkpoint(tiny)
    assert checked.config.num_layers == 2
    assert checked.weight_bytes == sum(p.stat().st_size for p in tiny.glob("*.safetensors")) - sum(
        8 + int.from_bytes(p.read_bytes()[:8], "little") for p in tiny.glob("*.safetensors")
    )


def test_hybrid_layouts_pass_and_their_attention_is_still_checked(tmp_path: Path) -> None:
    """Qwen3.5's q_proj emits each head's output gate (twice the heads' rows) and its linear
    layers have their own heads: a `resin bench checkpoint` folder of it passes, and a wrong
    projection of a full-attention layer is still refused."""
    from resin_model.presets import PRESETS

    folder = tmp_path / "qwen3_5"
    write_checkpoint(PRESETS["tiny-qwen3_5_moe"], folder, shard_bytes=1 << 20)
    assert check_checkpoint(folder).config.layer_types.count("linear") == 3
    edit_json(folder / "config.json", head_dim=8)
    refused(folder, "layers.3.self_attn.", "rows")


@pytest.mark.parametrize("entry", ["../outside.safetensors", "/etc/passwd", "a/../../x"])
def test_index_entries_outside_the_folder_are_refused(
    tiny: Path, tmp_path: Path, entry: str
) -> None:
    folder = copy(tiny, tmp_path)
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"]["lm_head.weight"] = entry
    (folder / INDEX).write_text(json.dumps(index))
    refused(folder, repr(entry), "outside the folder")


@pytest.mark.parametrize("name", ["shard", "config.json", "tokenizer.json", INDEX])
def test_symlinks_leaving_the_folder_are_refused(tiny: Path, tmp_path: Path, name: str) -> None:
    folder = copy(tiny, tmp_path)
    name = first_shard(folder) if name == "shard" else name
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(folder / name, elsewhere / name)
    (folder / name).symlink_to(elsewhere / name)
    refused(folder, repr(name), "outside the folder")


def test_a_symlink_loop_is_refused(tiny: Path, tmp_path: Path) -> None:
    folder = copy(tiny, tmp_path)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("loop.json")
    (folder / "loop.json").symlink_to("tokenizer.json")
    refused(folder, "'tokenizer.json'")


def test_a_symlink_to_a_device_is_refused(tiny: Path, tmp_path: Path) -> None:
    folder = copy(tiny, tmp_path)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("/dev/zero")
    refused(folder, "'tokenizer.json'")


def test_a_fifo_is_refused_without_blocking(tiny: Path, tmp_path: Path) -> None:
    """A FIFO in place of a shard (found by the glob) or of config.json: refused at once
    (opening one for reading would block forever)."""
    folder = copy(tiny, tmp_path)
    (folder / INDEX).unlink()
    for name in ("model-fifo.safetensors", "generation_config.json"):
        os.mkfifo(folder / name)
        errors: list[BaseException] = []
        worker = threading.Thread(target=lambda e=errors: e.append(_raised(folder)), daemon=True)
        worker.start()
        worker.join(10)
        assert not worker.is_alive(), f"the check blocked on the FIFO {name}"
        assert isinstance(errors[0], CheckpointError) and "not a regular file" in str(errors[0])
        (folder / name).unlink()


def _raised(folder: Path) -> BaseException:
    try:
        check_checkpoint(folder)
    except BaseException as exc:  # the test thread hands it over
        return exc
    return AssertionError("no error")


def test_symlinks_inside_the_folder_are_followed(tiny: Path, tmp_path: Path) -> None:
    folder = copy(tiny, tmp_path)
    (folder / "store").mkdir()
    shard = first_shard(folder)
    shutil.move(folder / shard, folder / "store" / shard)
    (folder / shard).symlink_to(Path("store") / shard)
    check_checkpoint(folder)


def test_a_hub_snapshot_of_symlinks_into_blobs_passes(tiny: Path, tmp_path: Path) -> None:
    """The Hugging Face cache: `<repo>/snapshots/<rev>/<file> -> ../../blobs/<hash>`: the
    closed folder is the repository folder."""
    repo = tmp_path / "models--org--tiny"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, path in enumerate(sorted(tiny.iterdir())):
        shutil.copyfile(path, blobs / f"hash{i}")
        (snapshot / path.name).symlink_to(Path("../../blobs") / f"hash{i}")
    assert check_checkpoint(snapshot).config.num_layers == 2
    # ... but a snapshot's symlink may not leave the repository
    outside = tmp_path / "outside.json"
    shutil.copyfile(tiny / "config.json", outside)
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(outside)
    refused(snapshot, "'config.json'", "outside the folder")


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ("missing config", ("'config.json'", "missing")),
        ("config not an object", ("config.json", "not a JSON object")),
        ("config not JSON", ("config.json", "not valid JSON")),
        ("missing tokenizer", ("'tokenizer.json'", "missing")),
        ("missing shard", ("missing",)),
        ("header length", ("safetensors header",)),
        ("header not JSON", ("safetensors header is not JSON",)),
        ("offsets", ("data offsets",)),
        ("index names an absent tensor", ("does not hold it",)),
    ],
)
def test_malformed_files_are_one_line_errors(
    tiny: Path, tmp_path: Path, damage: str, words: tuple[str, ...]
) -> None:
    folder = copy(tiny, tmp_path)
    shard = folder / first_shard(folder)
    if damage == "missing config":
        (folder / "config.json").unlink()
    elif damage == "config not an object":
        (folder / "config.json").write_text("[1, 2]")
    elif damage == "config not JSON":
        (folder / "config.json").write_text("{")
    elif damage == "missing tokenizer":
        (folder / "tokenizer.json").unlink()
    elif damage == "missing shard":
        shard.unlink()
    elif damage == "header length":
        shard.write_bytes((10**12).to_bytes(8, "little") + shard.read_bytes()[8:])
    elif damage == "header not JSON":
        data = shard.read_bytes()
        shard.write_bytes(data[:8] + b"\xff" * 16 + data[24:])
    elif damage == "offsets":
        data = bytearray(shard.read_bytes())
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + n])
        name = next(k for k in header if k != "__metadata__")
        header[name]["data_offsets"][1] += 4
        text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
        shard.write_bytes(bytes(data[:8]) + text[:n] + bytes(data[8 + n :]))
    elif damage == "index names an absent tensor":
        edit_json(folder / INDEX, weight_map={"model.norm.weight": first_shard(folder)})
    refused(folder, *words)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"num_hidden_layers": 1000000}, ("num_hidden_layers",)),
        ({"num_hidden_layers": 3}, ("3 layers", "lack layer 2")),
        ({"hidden_size": 64.5}, ("hidden_size=64.5", "not an integer")),
        ({"vocab_size": True}, ("vocab_size=True", "not an integer")),
        ({"num_attention_heads": 0}, ("num_attention_heads",)),
        ({"vocab_size": 1000}, ("embed_tokens", "vocab_size 1000")),
        ({"num_attention_heads": 8, "num_key_value_heads": 2}, ("q_proj", "rows")),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ("lacks the key",)),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [10**9, 1]}},
            ("weight_block_size",),
        ),
        ({"quantization_config": {"quant_method": "mxfp4"}}, ("mxfp4", "no tensor")),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
            ("FP8",),
        ),
    ],
)
def test_config_checked_against_the_shards(
    tiny: Path, tmp_path: Path, changes: dict[str, Any], words: tuple[str, ...]
) -> None:
    folder = copy(tiny, tmp_path)
    edit_json(folder / "config.json", **changes)
    refused(folder, *words)


def test_integer_weights_where_floats_belong_are_refused(tiny: Path, tmp_path: Path) -> None:
    folder = copy(tiny, tmp_path)
    (folder / INDEX).unlink()
    for shard in folder.glob("*.safetensors"):
        shard.unlink()
    checked = check_checkpoint(tiny)
    tensors = {
        name: np.zeros(t.shape, dtype=np.int16 if "q_proj" in name else np.float16)
        for name, t in checked.tensors.items()
    }
    save_file(tensors, str(folder / "model.safetensors"))
    refused(folder, "q_proj", "I16")


def test_weight_block_size_is_bounded() -> None:
    with pytest.raises(CheckpointError, match="weight_block_size"):
        parse_quant_config({"quant_method": "fp8", "weight_block_size": [10**9, 1]})


def test_memory_is_checked_before_allocating(tiny: Path) -> None:
    """What the weights need on the device (float32 on a CPU) against what it has now."""
    small = check_checkpoint(tiny)
    check_memory(small, LoadOptions(device="cpu"))
    huge = CheckedCheckpoint(
        small.config, {"model.embed_tokens.weight": TensorInfo("BF16", (1 << 40, 1), "x")}
    )
    with pytest.raises(CheckpointError, match="GiB for its weights; the available RAM"):
        check_memory(huge, LoadOptions(device="cpu"))
