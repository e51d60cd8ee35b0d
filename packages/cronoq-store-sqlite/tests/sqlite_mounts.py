"""Small tmpfs mounts (as root) for the read-only and full-disk tests; always unmounted."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


class MountFailed(Exception):
    """``mount`` refused (not root, or no CAP_SYS_ADMIN in this container)."""


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


@contextlib.contextmanager
def tmpfs(directory: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (e.g. ``"4m"``) on ``directory``; unmount it afterwards."""
    directory.mkdir(exist_ok=True)
    options = f"size={size},mode=0700" + (",ro" if read_only else "")
    mounted = _run("mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory))
    if mounted.returncode != 0:
        raise MountFailed(mounted.stderr.strip() or f"mount exited {mounted.returncode}")
    try:
        yield directory
    finally:
        if _run("umount", str(directory)).returncode != 0:
            # Something still holds a file open there (a failing test): detach it anyway, so
            # that no mount outlives the test.
            _run("umount", "-l", str(directory))


def remount_read_only(directory: Path) -> None:
    result = _run("mount", "-o", "remount,ro", str(directory))
    if result.returncode != 0:
        raise MountFailed(result.stderr.strip() or f"remount exited {result.returncode}")
