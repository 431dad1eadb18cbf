# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Programmatic dependent launch (PDL): a kernel may start while the one before it on the
stream is still running, so its launch and its programs' setup hide behind that kernel's tail
(Hopper and later; inside CUDA graphs too, where capture turns it into programmatic edges).

The rule that keeps it correct: every Triton kernel of the runner takes `PDL: tl.constexpr`
and calls `pdl_enter(PDL)` before its first memory access. With PDL on that is
`griddepcontrol.wait` (block until the previous kernel has finished and its writes are
visible) then `griddepcontrol.launch_dependents` (the next kernel may launch now). A kernel
that waits before touching memory cannot read a value its predecessor has not written, nor
overwrite one the predecessor still reads; and since each such kernel finishes only after its
own wait, the order holds transitively across any chain. Kernels that are not ours (cuBLAS,
torch's elementwise ops) launch as before and keep ordinary stream order.

Launchers pass `**pdl_args()`: `PDL` and Triton's `launch_pdl` option, both off unless
`set_pdl(True)` turned them on (a `CudaRunner` built with `RunnerOptions.pdl`, default from
`RESIN_PDL=1`). The switch is process-wide and read at each launch, so graphs capture what was
set when they were captured. It stays off on devices older than sm_90 and under the Triton
interpreter (the instructions do not exist there).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_state = {"on": False}
# What `pdl_args` hands every launch: one dict each way, not one per launch (never mutated).
_ARGS = {on: {"PDL": on, "launch_pdl": on} for on in (False, True)}


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` can launch with PDL (CUDA, sm_90 or later, compiled)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


def set_pdl(on: bool, device: torch.device) -> bool:
    """Turn PDL on or off for the kernels launched from now on; returns whether it is on (it
    stays off where `pdl_supported` says no)."""
    _state["on"] = on and pdl_supported(device)
    return _state["on"]


def pdl_args() -> dict[str, bool]:
    """The launch keywords of every runner kernel: its `PDL` constexpr and Triton's option."""
    return _ARGS[_state["on"]]


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of a kernel: with PDL, wait for the previous kernel, then let the next
    one launch (module doc). Nothing without."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
