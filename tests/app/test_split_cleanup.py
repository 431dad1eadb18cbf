"""The split server's socket folder (`/tmp/resin-ipc-*`) goes with it on every exit: the
engines remove it when they end, so a SIGKILLed supervisor (its children get SIGTERM) leaves
none behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.server.test_split_serve import Split, split  # noqa: F401 (the fixture)


def socket_folders(served: Split) -> set[str]:
    folders: set[str] = set()
    for proc in served.engines():
        for conn in proc.net_connections(kind="unix"):
            path = conn.laddr if isinstance(conn.laddr, str) else ""
            if "/resin-ipc-" in path:
                folders.add(os.path.dirname(path))
    return folders


def test_a_killed_supervisor_leaves_no_socket_folder(split: Split) -> None:  # noqa: F811
    folders = socket_folders(split)
    assert folders and all(Path(f).is_dir() for f in folders)
    split.proc.send_signal(signal.SIGKILL)
    split.proc.wait(10)
    assert not split.left()
    assert not [f for f in folders if Path(f).exists()]


def test_sigterm_leaves_no_socket_folder(split: Split) -> None:  # noqa: F811
    folders = socket_folders(split)
    assert folders
    split.proc.send_signal(signal.SIGTERM)
    assert split.proc.wait(60) == 0
    assert not [f for f in folders if Path(f).exists()]
    assert not split.left()
