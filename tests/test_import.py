"""`import resin` must not import torch or any CUDA library (a fresh interpreter proves it)."""

import subprocess
import sys


def test_import_resin_imports_no_torch_or_cuda() -> None:
    code = (
        "import sys, resin, resin.engine, resin.params, resin.plan, resin.protocols\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'torch', 'triton', 'cupy', 'pycuda', 'jax', 'tensorflow'} or 'cuda' in m.lower())\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"import resin pulled in: {out}"
