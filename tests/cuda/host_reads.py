"""A recorder of the host reads a fast runner's own code makes (for the tests that prove a
decode step is CUDA-graph safe: it reads nothing from the device on the host)."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Torch calls that read a device tensor on the host (a sync, or a shape that depends on data).
_HOST_READS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__index__",
                         "__float__", "nonzero", "argwhere", "masked_select", "unique",
                         "unique_consecutive"})  # fmt: skip
_INDEXING = frozenset({"__getitem__", "__setitem__", "index_put", "index_put_"})


def _has_mask(index: Any) -> bool:
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool and p.dim() for p in parts)


class HostReads(TorchFunctionMode):
    """Records every host read (`_HOST_READS`, indexing by a boolean mask) that the fast
    runner's own code (`resin_models_cuda`) makes while the mode is on. Tensors stay on the
    CPU here, so nothing would block; a call recorded is one that would sync on a GPU or give
    a shape CUDA graphs cannot replay. The Triton interpreter's own torch calls are not the
    runner's and are not recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in _HOST_READS or (name in _INDEXING and len(args) > 1 and _has_mask(args[1])):
            frame = sys._getframe(1)
            while frame.f_back is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            if "resin_models_cuda" in frame.f_code.co_filename:
                self.seen.append(f"{name} at {frame.f_code.co_filename}:{frame.f_lineno}")
        return func(*args, **(kwargs or {}))


def assert_padded_decode_equals_without_host_reads(
    reference: Any, fast: Any, context_length: int, varlen_probe: Any
) -> None:
    """The greedy tokens of two prompts (13 and 30 tokens, 5 out, 16-token prefill chunks)
    equal between `reference` and `fast` while every decode step of `fast` takes the
    persistent-buffer path a CUDA graph replays, padded to a 4-row bucket, and that step's body
    (the model forward, the logits, their argmax) reads nothing on the host; nor does the body
    of a prefill the runner runs in fixed shapes (`graph_prefill_tokens`). Then the recorder
    is shown to see a read: `varlen_probe(step)` runs the model's varlen step set-up (which
    reads its row lengths) on a two-row prefill `StepTensors`."""
    from resin import Engine, SamplingParams
    from resin_models_cuda.step import PrefillInfo, StepTensors

    assert not fast.model.eager_only
    fast._pick_graph = lambda b, q: (4, 1) if q == 1 else None  # the 4-row bucket, padded
    body, mode, shapes = fast._decode_body, HostReads(), []

    def watched(rows: int, query: int) -> Any:
        shapes.append((rows, query))
        with mode:
            return body(rows, query)

    fast._decode_body = watched
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (13, 30)]
    params = SamplingParams(max_output_tokens=5, temperature=0.0, ignore_stop_tokens=True)

    def run(runner: Any) -> list[list[int]]:
        with Engine(runner, context_length=context_length, prefill_chunk_tokens=16) as engine:
            requests = [engine.submit(p, params) for p in prompts]
            while engine.has_work():
                engine.step()
            return [list(r.take_result()) for r in requests]

    assert run(fast) == run(reference)
    decode = [s for s in shapes if s[1] == 1]  # (a short prefill has more query slots)
    assert len(decode) >= 4 and set(decode) == {(4, 1)}
    assert fast.model.graph_prefill == any(q > 1 for _, q in shapes)  # the prompts' chunks
    assert mode.seen == []

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=fast.device)

    info = PrefillInfo(i32([0, 2]), i32([5]), i32([0]), i32([0]), 16)
    with mode:
        varlen_probe(StepTensors(i32([1, 2]), i32([5, 6]), (), info))
    assert mode.seen and mode.seen[0].startswith("tolist at ")
