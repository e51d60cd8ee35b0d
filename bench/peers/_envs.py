"""Which interpreter runs each system's processes.

Every system runs on this interpreter, except Oban for Python, which needs Python 3.12+: on an
older interpreter its processes run in a second environment synced from the same ``uv.lock``
(``bench`` group) on the first working Python 3.12+ among CRONOQ_BENCH_PY312, ``uv python find``,
PATH (3.12 first) and pyenv's versions (lowest first), in CRONOQ_BENCH_PY312_VENV (default
``~/.cache/cronoq-bench/venv-py3.12``). Nothing is downloaded: without such a Python, Oban is
reported as not run.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ._peer import REPO_ROOT

NEEDS_312 = {"oban"}


def _works(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _find_312() -> str | None:
    candidates: list[str] = []
    if explicit := os.environ.get("CRONOQ_BENCH_PY312"):
        candidates.append(explicit)
    if uv := shutil.which("uv"):
        found = subprocess.run(
            [uv, "python", "find", ">=3.12"],
            capture_output=True,
            text=True,
            env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        )
        if found.returncode == 0 and found.stdout.strip():
            candidates.append(found.stdout.strip())
    for name in ("python3.12", "python3.13", "python3.14"):
        if path := shutil.which(name):
            candidates.append(path)
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(glob.glob(str(pyenv / "3.1[2-9]*" / "bin" / "python3")))
    return next((c for c in candidates if _works(c)), None)


def python_for(module: str) -> tuple[str | None, str]:
    """The interpreter for ``module``'s processes (None if there is none), and a note."""
    if module not in NEEDS_312 or sys.version_info >= (3, 12):
        return sys.executable, ""
    base = _find_312()
    if base is None:
        return None, "needs Python 3.12+ and none was found (set CRONOQ_BENCH_PY312)"
    uv = shutil.which("uv")
    if uv is None:
        return None, "needs Python 3.12+: found one, but no uv to build its environment"
    default = Path.home() / ".cache" / "cronoq-bench" / "venv-py3.12"
    venv = Path(os.environ.get("CRONOQ_BENCH_PY312_VENV", default))
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["UV_PROJECT_ENVIRONMENT"] = str(venv)
    synced = subprocess.run(
        [uv, "sync", "--frozen", "--quiet", "--group", "bench", "--python", base],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if synced.returncode != 0:
        return None, f"could not build its Python 3.12+ environment: {synced.stderr.strip()}"
    python = venv / "bin" / "python"
    version = subprocess.run(
        [str(python), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return str(python), f"Python {version} ({venv}, synced from uv.lock)"


_LIBRARIES = (
    "import sysconfig; print(*{sysconfig.get_path(p) for p in ('purelib', 'platlib')}, sep=chr(10))"
)
"""Where an interpreter's installed modules are, one directory per line."""


def compile_bytecode(python: str) -> None:
    """Compile every module ``python`` may import (its environment and this repository's
    packages) to bytecode, as an installation has it: pip compiles at install, and
    ``uv sync --compile-bytecode`` does. Without it (``PYTHONDONTWRITEBYTECODE`` set, as on
    this project's machines) each process compiles what it imports from source at every start:
    a cronoq-server led after 1.7 s from source, 0.88 s from bytecode (docs/performance.md)."""
    paths = subprocess.run(
        [python, "-c", _LIBRARIES],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    sources = [
        *sorted(str(p) for p in (REPO_ROOT / "packages").glob("*/src")),
        str(REPO_ROOT / "bench"),
    ]
    # Not checked: a library may ship a file no interpreter compiles (a test of another
    # Python's syntax), which compileall reports and skips.
    subprocess.run(
        [python, "-m", "compileall", "-q", "-j", "0", *paths, *sources],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
