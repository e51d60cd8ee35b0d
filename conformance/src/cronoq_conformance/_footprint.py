"""Everything observable about a directory tree, to tell whether a store touched it."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, fields
from pathlib import Path

__all__ = ["Entry", "changes", "footprint"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One file or directory. ``ctime_ns`` moves with any change of its inode (a chmod to the
    same mode too); reading moves only the access time, which is left out."""

    mode: str
    owner: tuple[int, int]
    size: int
    mtime_ns: int
    ctime_ns: int
    digest: str | None
    """SHA-256 of a regular file's bytes."""


def footprint(root: Path) -> dict[str, Entry]:
    """Every entry under ``root`` and ``root`` itself, by path relative to it."""
    found = {".": _entry(root)}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = _entry(path)
    return found


def _entry(path: Path) -> Entry:
    info = os.lstat(path)
    digest = None
    if stat.S_ISREG(info.st_mode):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return Entry(
        stat.filemode(info.st_mode),
        (info.st_uid, info.st_gid),
        info.st_size,
        info.st_mtime_ns,
        info.st_ctime_ns,
        digest,
    )


def changes(before: dict[str, Entry], after: dict[str, Entry]) -> list[str]:
    """What differs, one line per entry: created, removed, or the fields that changed."""
    lines = [f"{name}: created" for name in sorted(after.keys() - before.keys())]
    lines += [f"{name}: removed" for name in sorted(before.keys() - after.keys())]
    for name in sorted(before.keys() & after.keys()):
        old, new = before[name], after[name]
        if old != new:
            changed = [
                f"{field.name} {getattr(old, field.name)} -> {getattr(new, field.name)}"
                for field in fields(Entry)
                if getattr(old, field.name) != getattr(new, field.name)
            ]
            lines.append(f"{name}: {', '.join(changed)}")
    return lines
