"""A directory the server's OS user can enter, for the tests that run a server as it.

As root, the private cluster's commands and PgBouncer run as the ``postgres`` user (PgBouncer
and initdb refuse root), in a directory of their own. That user must be able to search every
directory above it: a TMPDIR under a 0700 home or checkout, or a /tmp left at 0700, would make
initdb or pgbouncer fail with tracebacks of their own. So the directory is made under the
first base (TMPDIR, then /var/tmp, then /dev/shm) that the user can reach, and given to it;
no existing directory's mode is changed. When no base will do, the test fails with one line
that says what blocks each. Run as anyone else, the server runs as that user, in TMPDIR.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

__all__ = ["SERVER_USER", "as_server_user", "server_directory", "unreachable"]

SERVER_USER = "postgres"


def as_server_user() -> bool:
    """Whether the server runs as SERVER_USER: root may not run it."""
    return os.geteuid() == 0


def unreachable(directory: Path, user: str) -> str | None:
    """What keeps ``user`` from entering ``directory`` (a directory above it, or itself,
    that it may not search), or None."""
    account = pwd.getpwnam(user)
    groups = {account.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    for step in reversed([directory, *directory.parents]):
        info = step.stat()
        if info.st_uid == account.pw_uid:
            needed = stat.S_IXUSR
        elif info.st_gid in groups:
            needed = stat.S_IXGRP
        else:
            needed = stat.S_IXOTH
        if not info.st_mode & needed:
            mode = oct(stat.S_IMODE(info.st_mode))
            return f"{step} (mode {mode}, uid {info.st_uid}) does not let {user} enter it"
    return None


def server_directory(prefix: str, bases: Sequence[str] | None = None) -> Path:
    """A new directory for a server's files, that the server's user can enter: given to
    SERVER_USER when running as root. Fails the test in one line when there is none."""
    if not as_server_user():
        return Path(tempfile.mkdtemp(prefix=prefix))
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        pytest.fail(f"there is no {SERVER_USER!r} user to run the server as", pytrace=False)
    if bases is None:
        bases = [tempfile.gettempdir(), "/var/tmp", "/dev/shm"]
    refused: list[str] = []
    for base in dict.fromkeys(os.path.realpath(b) for b in bases):
        if not os.path.isdir(base):
            continue
        why = unreachable(Path(base), SERVER_USER)
        if why is not None:
            refused.append(why)
            continue
        root = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        shutil.chown(root, user=SERVER_USER)
        return root
    pytest.fail(
        f"no directory to run a server as the {SERVER_USER} user in: {'; '.join(refused)} "
        "(set TMPDIR to a directory it can enter)",
        pytrace=False,
    )
