"""Lint, type check, test each package on its own, and check the built distributions.

Run everything with `uv run nox`; list the sessions with `uv run nox -l`. Sessions inherit the
environment, so CRONOQ_REQUIRE_POSTGRES (and any PG* variable) reaches the tests.
The Python examples of README.md, docs/ and the packages' READMEs run in tests(cronoq-server)
(packages/cronoq-server/tests/test_docs.py), which has every package they import.
Set CRONOQ_NOX_ALL_PYTHONS=1 to test on Python 3.12 and 3.13 too; uv must find those interpreters
(with pyenv: `PYENV_VERSION=3.11.7:3.12.1:3.13.0`).
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import nox
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

nox.options.default_venv_backend = "uv"

ROOT = Path(__file__).parent
TEST_PYTHONS = (
    ["3.11", "3.12", "3.13"] if os.environ.get("CRONOQ_NOX_ALL_PYTHONS") == "1" else ["3.11"]
)


@dataclass(frozen=True)
class Member:
    path: Path
    import_name: str
    dependencies: frozenset[str]
    test_dependencies: frozenset[str]
    test_extras: dict[str, str]
    """Packages the test group names with extras (workspace or third-party), and those extras
    (comma-joined)."""


def _read_members() -> dict[str, Member]:
    """The workspace packages by distribution name, in the order of the root pyproject."""
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    members: dict[str, Member] = {}
    for member_dir in root["tool"]["uv"]["workspace"]["members"]:
        project = tomllib.loads((ROOT / member_dir / "pyproject.toml").read_text())["project"]
        name = canonicalize_name(project["name"])
        pyproject = tomllib.loads((ROOT / member_dir / "pyproject.toml").read_text())
        # A package's tests may need more than the package: its `test` dependency group.
        test_only = pyproject.get("dependency-groups", {}).get("test", [])
        members[name] = Member(
            path=ROOT / member_dir,
            import_name=name.replace("-", "_"),
            dependencies=frozenset(
                canonicalize_name(Requirement(dep).name) for dep in project.get("dependencies", [])
            ),
            test_dependencies=frozenset(
                canonicalize_name(Requirement(dep).name) for dep in test_only
            ),
            test_extras={
                canonicalize_name(req.name): ",".join(sorted(req.extras))
                for req in map(Requirement, test_only)
                if req.extras
            },
        )
    return members


MEMBERS = _read_members()


def _with_local_dependencies(*names: str) -> list[Path]:
    """The directories of these packages and of the workspace packages they require,
    transitively."""
    found: dict[str, Path] = {}
    pending = list(names)
    while pending:
        current = pending.pop()
        if current not in found:
            found[current] = MEMBERS[current].path
            pending.extend(dep for dep in MEMBERS[current].dependencies if dep in MEMBERS)
    return list(found.values())


def _install_locked(session: nox.Session, *args: str) -> None:
    """`uv pip install` with third-party versions pinned by uv.lock, ignoring workspace sources."""
    constraints = Path(session.create_tmp()) / "constraints.txt"
    session.run_install(
        "uv", "export", "--frozen", "--all-packages", "--no-emit-workspace", "--no-hashes",
        "--quiet", "--output-file", str(constraints),
    )  # fmt: skip
    session.install("--no-sources", "--constraints", str(constraints), *args)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff lint and format check."""
    _install_locked(session, "ruff")
    session.run("ruff", "check")
    session.run("ruff", "format", "--check")


@nox.session
def types(session: nox.Session) -> None:
    """mypy --strict over every package, its tests and this file, in the locked dev environment."""
    session.run_install("uv", "sync", "--locked", "--all-packages")
    session.run("mypy", *session.posargs)


@nox.session(python=TEST_PYTHONS)
@nox.parametrize("package", list(MEMBERS), ids=list(MEMBERS))
def tests(session: nox.Session, package: str) -> None:
    """One package's tests with only that package, its declared dependencies and its `test`
    dependency group installed."""
    # Editable, so the tests always see the current source (uv caches wheels built from a path).
    test_deps = MEMBERS[package].test_dependencies
    local = _with_local_dependencies(package, *(d for d in test_deps if d in MEMBERS))
    # A workspace package named with extras in the test group (``cronoq[crypto]``) is installed
    # with them.
    chosen_extras = MEMBERS[package].test_extras
    extras = {
        MEMBERS[name].path: chosen for name, chosen in chosen_extras.items() if name in MEMBERS
    }
    editables = [
        arg
        for path in local
        for arg in ("-e", f"{path}[{extras[path]}]" if path in extras else str(path))
    ]
    # A third-party one with its extras too (``psycopg[binary]``: without it, no libpq).
    third_party = sorted(
        f"{d}[{chosen_extras[d]}]" if d in chosen_extras else d
        for d in test_deps
        if d not in MEMBERS
    )
    _install_locked(session, *editables, *third_party, "pytest", "pytest-asyncio", "hypothesis")
    tests_dir = MEMBERS[package].path / "tests"
    # Exit code 5: no tests collected, for a package that has none yet.
    session.run("pytest", str(tests_dir), *session.posargs, success_codes=[0, 5])


@nox.session(python="3.11")
def fuzz(session: nox.Session) -> None:
    """The fuzz suite of cronoq's public API with many examples, and how many inputs it checked.

    CRONOQ_FUZZ_PROFILE picks the Hypothesis profile of packages/cronoq/tests/test_fuzz_api.py:
    `fuzz` (the default here: 600 examples per entry point, over 10,000 inputs), `quick` (what
    the ordinary test run uses) or `probe` (no shrinking).
    """
    cronoq = MEMBERS["cronoq"].path
    # With the crypto extra: EncryptedCodec's entry points are fuzzed too.
    _install_locked(session, "-e", f"{cronoq}[crypto]", "pytest", "pytest-asyncio", "hypothesis")
    profile = os.environ.get("CRONOQ_FUZZ_PROFILE", "fuzz")
    session.run(
        "pytest",
        str(cronoq / "tests" / "test_fuzz_api.py"),
        "-q",
        *session.posargs,
        env={"CRONOQ_FUZZ_PROFILE": profile},
    )


@nox.session
def proto(session: nox.Session) -> None:
    """The wire protocol's modules committed in cronoq-client are what proto/generate.py makes
    from proto/ now, with the pinned generator: regenerated into a temporary directory, and a
    summary of the differences if they are stale."""
    _install_locked(session, "grpcio-tools", "mypy-protobuf")
    session.run("python", str(ROOT / "proto" / "generate.py"), "--check")


@nox.session
def build(session: nox.Session) -> None:
    """Build every sdist and wheel without workspace sources, install the wheels, import them."""
    with tempfile.TemporaryDirectory() as out_dir:
        session.run("uv", "build", "--all-packages", "--no-sources", "--out-dir", out_dir)
        _install_locked(session, *(str(wheel) for wheel in sorted(Path(out_dir).glob("*.whl"))))
    session.run("python", "-c", "import " + ", ".join(m.import_name for m in MEMBERS.values()))
    # Files the code reads at run time, which a wheel holds only if the build includes them:
    # the dashboard's templates and its assets (htmx with its licence; no CDN).
    session.run("python", "-c", _WHEEL_DATA_CHECK)


_WHEEL_DATA_CHECK = """
from importlib import resources
ui = resources.files("cronoq_server._ui")
for name in ("templates/base.html", "templates/overview.html", "static/htmx.min.js",
             "static/htmx.LICENSE", "static/ui.css"):
    assert ui.joinpath(name).is_file(), f"the cronoq-server wheel lacks _ui/{name}"
"""


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml) built with --strict into a temporary directory: a
    broken link or anchor, a page outside the nav or a public name the API reference misses
    fails it. Preview it with `uv run mkdocs serve`."""
    # Every package (cronoq with its crypto and otel extras), since the reference pages import
    # them and read their docstrings; ruff lays out the signatures.
    editables = [
        arg
        for name, member in MEMBERS.items()
        for arg in ("-e", f"{member.path}[crypto,otel]" if name == "cronoq" else str(member.path))
    ]
    _install_locked(session, *editables, "mkdocs", "mkdocs-material", "mkdocstrings-python", "ruff")
    with tempfile.TemporaryDirectory() as site_dir:
        session.run(
            "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
            "--site-dir", site_dir,
            env={"NO_MKDOCS_2_WARNING": "1"},
        )  # fmt: skip


@nox.session(python=False, name="chaos-short")
def chaos_short(session: nox.Session) -> None:
    """The short chaos profile of issue 19 (about 45 s of faults per store, SQLite and
    PostgreSQL): replicas killed, stopped, frozen past the lease and cut from the database
    while remote workers run tasks longer than a failover; fails on any acknowledged task lost,
    any two attempts of one task at once, or any re-run a failover caused."""
    session.run_install("uv", "sync", "--locked", "--all-packages")
    session.run(
        "pytest",
        str(MEMBERS["cronoq-server"].path / "tests" / "test_server_chaos.py"),
        "-s",
        "-q",
        *session.posargs,
        env={"CRONOQ_CHAOS": "1", "CRONOQ_CHAOS_PROFILE": "short"},
    )


@nox.session(python=False, default=False)
def chaos(session: nox.Session) -> None:
    """The long chaos profile of issue 19 (10 minutes of faults per store, SQLite and
    PostgreSQL), printing its figures; not a default session. The short profile is the same
    test with CRONOQ_CHAOS=1 and no profile. Runs in the locked dev environment (`uv sync`)."""
    session.run_install("uv", "sync", "--locked", "--all-packages")
    session.run(
        "pytest",
        str(MEMBERS["cronoq-server"].path / "tests" / "test_server_chaos.py"),
        "-s",
        "-q",
        *session.posargs,
        env={"CRONOQ_CHAOS": "1", "CRONOQ_CHAOS_PROFILE": "long"},
    )
