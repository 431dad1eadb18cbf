"""Run the Triton kernels through the interpreter on machines without CUDA.

`TRITON_INTERPRET` is read when a `@triton.jit` function is defined, so it must be set before
any kernel module is imported: this conftest is imported first by pytest.
"""

from __future__ import annotations

import os

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a dev dependency
    HAS_CUDA = False

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False


def _fix_interpreter_scalar_index() -> None:
    """Triton 3.6's interpreter turns a loaded scalar into a Python int with `int(array)`,
    which NumPy >= 2.4 refuses for 1-element arrays (a loop bound read from memory fails).
    Re-patch `__index__` to take the single element explicitly."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor: object, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(  # type: ignore[attr-defined]
            tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0])
        )

    interpreter._patch_lang_tensor = patched


def _patch_the_language_once_per_launch() -> None:
    """Triton's interpreter patches `triton.language` anew at every call of a `@triton.jit`
    device function (`_patch_lang`: `inspect.getmembers` over tl, tl.tensor and tl.math, each
    call, in each program of the grid), although the kernel's launch patched it already and
    keeps it patched until the launch returns; the repeats find nothing left to patch. On the
    interpreted GLM-5.3 tests they were about a third of the time. Skip a repeat where every
    namespace it would patch is patched (its builtins replaced): the launch's own patch, and
    its restore at the end, are unchanged."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    builtin = getattr(tl.core, "is_builtin", None)
    if original is None or scope_type is None or builtin is None:
        return  # another interpreter: leave it be

    def patched_already(lang: object) -> bool:
        probes = [lang.program_id, lang.tensor.__add__]  # type: ignore[attr-defined]
        probes.append(tl.core.tensor_descriptor_base.load)
        if lang is tl:
            probes.append(tl.math.exp)
        return not any(builtin(probe) for probe in probes)

    def patch_lang(fn: object) -> object:
        globals_ = getattr(fn, "__globals__", {})
        langs = [value for value in globals_.values() if value is tl or value is tl.core]
        if langs and all(patched_already(lang) for lang in langs):
            return scope_type()  # nothing to patch, nothing to restore
        return original(fn)

    interpreter._patch_lang = patch_lang


if HAS_TRITON and not HAS_CUDA:
    _fix_interpreter_scalar_index()
    _patch_the_language_once_per_launch()


def _share_the_gpu(workers: int) -> None:
    """Under pytest-xdist every worker shares one card, and a runner built without a page
    count sizes its KV arena from `torch.cuda.mem_get_info` (90% of what is free): one worker
    building such a runner left the others out of memory for their next small tensor (the
    H200 run of 2026-12-03). Each worker is shown at most its share of the card as free."""
    real = torch.cuda.mem_get_info

    def share(device: object = None) -> tuple[int, int]:
        free, total = real(device)  # type: ignore[arg-type]
        return min(free, total // workers), total

    torch.cuda.mem_get_info = share  # type: ignore[assignment]


if HAS_CUDA and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    _share_the_gpu(int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    skip_triton = pytest.mark.skip(reason="needs triton")
    for item in items:
        if "tests/cuda" not in str(item.fspath):
            continue
        if item.get_closest_marker("gpu") is not None and not HAS_CUDA:
            item.add_marker(skip_gpu)
        elif not HAS_TRITON:
            item.add_marker(skip_triton)


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"
