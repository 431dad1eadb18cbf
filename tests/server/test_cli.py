"""`resin serve` as a subprocess: prints its URL when ready, serves, and on SIGTERM ends an
open stream cleanly and exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from resin.server.launch import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_signal_ends_streams_with_an_error_not_a_stop(sig: int) -> None:
    """A stream cut by SIGTERM/SIGINT ends with an error event (no
    finish_reason "stop", no [DONE]) and SIGINT prints no traceback."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "resin_app.cli", "serve", "--fake-runner", "--port", str(port)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in banner, banner
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/health").status_code == 200
        lines: list[str] = []
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 20000, "stream": True,
                "ignore_eos": True}  # fmt: skip

        def read() -> None:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    lines.append(line)

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 10
        while len(lines) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(sig)
        reader.join(30)
        # uvicorn re-raises the captured signal after its clean shutdown.
        assert proc.wait(30) in (0, -sig, 130)
        data = [ln for ln in lines if ln.startswith("data: ")]
        assert data and "data: [DONE]" not in data
        assert not any('"finish_reason":"stop"' in d for d in data)
        assert "shutting down" in data[-1] and '"error"' in data[-1]
        rest = proc.stdout.read()
        assert "Traceback" not in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
