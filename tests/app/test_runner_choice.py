"""`--runner auto|cuda|torch`: the family `resin serve` builds, a pure function of the device,
the checkpoint's architecture and what the fast family serves; then the real loading path on
the CPU (the reference runner, with the one line saying why)."""

from __future__ import annotations

import pytest

from resin_app.runners import RunnerChoice, choose_family, fast_architectures

FAST = frozenset({"llama", "qwen3", "gemma3_text"})


def _choose(
    requested: str, device: str = "cuda", model_type: str = "llama", **kw: object
) -> RunnerChoice:
    return choose_family(requested, device=device, model_type=model_type, fast=FAST, **kw)  # type: ignore[arg-type]


def test_auto_takes_the_fast_runner_on_cuda_for_an_architecture_it_serves() -> None:
    assert _choose("auto") == RunnerChoice("cuda")
    assert _choose("auto", device="cuda:3", model_type="qwen3") == RunnerChoice("cuda")
    assert _choose("cuda") == RunnerChoice("cuda")


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"device": "cpu"}, "needs a CUDA device (--device cuda), this is 'cpu'"),
        ({"model_type": "lfm2"}, "no model for 'lfm2'; it serves gemma3_text, llama, qwen3"),
        ({"tensor_parallel": 2}, "no tensor parallelism"),
    ],
)
def test_auto_falls_back_to_torch_saying_why(kwargs: dict[str, object], why: str) -> None:
    choice = _choose("auto", **kwargs)
    assert choice.family == "torch"
    assert choice.reason is not None and why in choice.reason
    assert choice.reason.startswith("the reference runner (torch): ")


def test_auto_without_a_loadable_fast_family_is_torch() -> None:
    choice = choose_family("auto", device="cuda", model_type="llama", fast=None)
    assert choice.family == "torch" and "does not load" in str(choice.reason)


def test_a_named_family_that_cannot_serve_is_an_error_naming_what_would() -> None:
    with pytest.raises(
        ValueError,
        match="--runner cuda: the fast runner has no model for "
        "'lfm2'; it serves gemma3_text, llama, qwen3",
    ):
        _choose("cuda", model_type="lfm2")
    with pytest.raises(ValueError, match="--runner cuda: the fast runner needs a CUDA device"):
        _choose("cuda", device="cpu")
    with pytest.raises(ValueError, match="unknown --runner 'fast'"):
        _choose("fast")


def test_torch_is_always_torch_with_no_reason() -> None:
    assert _choose("torch") == RunnerChoice("torch")
    assert _choose("torch", device="cpu", model_type="lfm2") == RunnerChoice("torch")


def test_the_installed_fast_family_serves_the_default_model() -> None:
    fast = fast_architectures()
    assert fast is not None and "llama" in fast and "lfm2" not in fast


def test_serve_on_the_cpu_builds_the_reference_runner_and_says_why() -> None:
    from resin_app.loading import LoadOptions, replica_runners
    from resin_model.default_model import default_model_dir
    from resin_models_torch.runner import TorchRunner

    lines: list[str] = []
    runners, job = replica_runners(
        LoadOptions(), default_model_dir(), 256, lambda line, **_: lines.append(line)
    )
    assert job is None and [type(r) for r in runners] == [TorchRunner]
    assert lines == [
        "resin: runner: the reference runner (torch): the fast runner needs a CUDA device "
        "(--device cuda), this is 'cpu'"
    ]


def test_serve_runner_cuda_on_the_cpu_is_a_startup_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from resin_app.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--runner", "cuda", "--api-server-count", "0", "--port", "1"])
    assert exit_info.value.code == 2
    assert "--runner cuda: the fast runner needs a CUDA device" in capsys.readouterr().err


def test_device_cuda_without_a_checkpoint_serves_the_default_model_on_the_fast_runner() -> None:
    from resin_app.runners import model_type_of
    from resin_model.default_model import default_model_dir

    model_type = model_type_of(default_model_dir())
    choice = choose_family("auto", device="cuda", model_type=model_type, fast=fast_architectures())
    assert choice == RunnerChoice("cuda")


def test_the_fast_arena_is_the_memory_share_less_the_weights() -> None:
    from resin_models_cuda.family import arena_bytes

    assert arena_bytes(100 * 10**9, 16 * 10**9, 0.85) == 69 * 10**9
    with pytest.raises(ValueError) as info:
        arena_bytes(20 * 10**9, 17 * 10**9, 0.85)
    assert "weights (17.00 GB) leave no KV arena in 0.85 of the free device memory" in str(
        info.value
    )
    assert "--gpu-memory-utilization" in str(info.value)
