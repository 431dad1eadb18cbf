"""Compile a runner kernel for sm_90 on a machine without a GPU (Triton's NVIDIA backend and
its bundled ptxas need no device): what the interpreter accepts and the compiler refuses (a
constexpr reassigned in an unrolled loop, say) shows here instead of on the GPU. In a process
of its own, since the suite runs Triton's interpreter, which compiles nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

SCRIPT = """
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget

spec = json.loads(sys.argv[1])
fn = getattr(importlib.import_module(spec["module"]), spec["kernel"])
signature = {n: spec["signature"].get(n, "constexpr") for n in fn.arg_names}
source = triton.compiler.ASTSource(fn, signature, spec["constexprs"])
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=spec["options"])
print(json.dumps([compiled.asm["ptx"], compiled.metadata.launch_pdl]))
"""


def compile_sm90(
    module: str,
    kernel: str,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    **options: Any,
) -> tuple[str, bool]:
    """`module.kernel` compiled for sm_90: its PTX and whether it launches with PDL.
    `signature` types the runtime arguments (`*bf16`, `i32`, ...); every other argument is a
    constexpr, valued in `constexprs`."""
    spec = {"module": module, "kernel": kernel, "signature": signature,
            "constexprs": constexprs, "options": options}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ptx, launch_pdl = json.loads(done.stdout.splitlines()[-1])
    return ptx, launch_pdl
