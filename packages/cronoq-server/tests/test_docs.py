"""The docs hold true: every Python snippet of README.md, docs/**/*.md and the packages' READMEs
runs, the exception tree of docs/api.md is cronoq's, and the lifecycle events of docs/server.md
are the ones the server logs; relative links between them lead somewhere.

Each ```python block is written to a file and run with this interpreter in a fresh directory (a
relative path such as ``cronoq.db`` lands there), as a reader would run it, and must exit 0
within ``SNIPPET_TIMEOUT_S``. An HTML comment before a block (blank lines may come between) says
what the block needs beyond the embedded scheduler; GitHub and PyPI do not show it:

- ``<!-- docs-test: server 127.0.0.1:50051 -->``: a cronoq-server. The test starts one (memory
  store, pool ``default``) on a port the OS picks and writes its address in place of this one.
- ``<!-- docs-test: postgres -->``: PostgreSQL. The block's ``schema="..."`` becomes a schema of
  its own, dropped afterwards, and the local DSN the one of ``CRONOQ_TEST_PG_DSN``.
- ``<!-- docs-test: django -->`` and ``<!-- docs-test: fastapi 127.0.0.1:50051 -->``: the
  web framework examples of cronoq-client's README, served by the framework's test client
  (Django's ``myapp/views.py`` under a URLconf of the test's; FastAPI's ``app``) against a
  cronoq-server, and called as a browser would: submit, submit again (the key), read, miss.
- ``<!-- docs-test: skip: REASON -->``: not run (a signature, a fragment of the reader's own
  program); pytest's summary shows the reason.

The module lives with cronoq-server's tests because that package depends on every package the
snippets import, and its helpers start real servers: its nox session runs it.
"""

from __future__ import annotations

import ast
import asyncio
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from server_pg import PG_DSN, pg_schema
from server_process import ServerProcess, config_toml, running_server

import cronoq.errors
import cronoq_server
from cronoq import JsonCodec
from cronoq_client import AsyncClient

__all__ = ["pg_schema"]  # a fixture: used by name

ROOT = Path(__file__).resolve().parents[3]
SNIPPET_TIMEOUT_S = 60.0
# The DSN the docs write for the local server: the tests' own default (server_pg).
DOCS_DSN = "postgresql://postgres@127.0.0.1:5432/test"

_FENCE = re.compile(r"^\s*```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
_SCHEMA = re.compile(r'schema="([^"]*)"')


def doc_files() -> list[Path]:
    return sorted(
        {
            ROOT / "README.md",
            *ROOT.glob("docs/**/*.md"),
            *ROOT.glob("packages/*/README.md"),
            *ROOT.glob("conformance/README.md"),
        }
    )


@dataclass(frozen=True, slots=True)
class Snippet:
    path: Path
    line: int
    """The line of the opening fence, from 1."""
    code: str
    marker: str | None
    """The text of the block's ``docs-test`` comment, if it has one."""

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True, slots=True)
class StrayMarker:
    path: Path
    line: int


def parse(path: Path) -> Iterator[Snippet | StrayMarker]:
    """The ```python blocks of a Markdown file, each with the marker before it, and every
    marker that stands before no Python block (a mistake: it would silently do nothing)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    marker: tuple[int, str] | None = None
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        if found := _MARKER.match(line):
            if marker is not None:
                yield StrayMarker(path, marker[0])
            marker = (number, found.group(1))
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip() and marker is not None:
                yield StrayMarker(path, marker[0])
                marker = None
            continue
        start = number
        body: list[str] = []
        while number < len(lines) and not re.match(r"^\s*```\s*$", lines[number]):
            body.append(lines[number])
            number += 1
        number += 1  # the closing fence
        if fence.group(1) == "python":
            code = textwrap.dedent("\n".join(body)) + "\n"
            yield Snippet(path, start, code, None if marker is None else marker[1])
        elif marker is not None:
            yield StrayMarker(path, marker[0])
        marker = None
    if marker is not None:
        yield StrayMarker(path, marker[0])


SNIPPETS = [item for path in doc_files() for item in parse(path) if isinstance(item, Snippet)]


def _with(needs: str) -> list[object]:
    """The snippets whose marker starts with ``needs`` ("" for no marker, with the skipped
    ones marked so)."""
    chosen: list[object] = []
    for snippet in SNIPPETS:
        marker = snippet.marker or ""
        if needs == "" and marker.startswith("skip:"):
            reason = marker.removeprefix("skip:").strip()
            chosen.append(
                pytest.param(
                    snippet,
                    id=snippet.name,
                    marks=pytest.mark.skip(reason=f"{snippet.name}: {reason}"),
                )
            )
        elif marker.split(" ", 1)[0] == needs:
            chosen.append(pytest.param(snippet, id=snippet.name))
    return chosen


async def run_snippet(snippet: Snippet, code: str, directory: Path) -> None:
    script = directory / "snippet.py"
    script.write_text(code, encoding="utf-8")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        cwd=directory,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(SNIPPET_TIMEOUT_S):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"{snippet.name} did not finish within {SNIPPET_TIMEOUT_S:.0f} s")
    text = output.decode("utf-8", "replace")
    assert process.returncode == 0, f"{snippet.name} exited {process.returncode}:\n{text}"


def test_the_docs_have_snippets_and_every_marker_stands_before_one() -> None:
    stray = [
        f"{item.path.relative_to(ROOT)}:{item.line}"
        for path in doc_files()
        for item in parse(path)
        if isinstance(item, StrayMarker)
    ]
    assert not stray, f"docs-test markers before no ```python block: {stray}"
    known = ("", "server", "postgres", "django", "fastapi", "skip:")
    unknown = [s.name for s in SNIPPETS if (s.marker or "").split(" ", 1)[0] not in known]
    assert not unknown, f"unknown docs-test markers at {unknown}: use one of {known}"
    empty = [s.name for s in SNIPPETS if s.marker is not None and s.marker.strip() == "skip:"]
    assert not empty, f"a skip without its reason at {empty}"
    # The parser found the blocks at all: the README's opening example is one.
    assert any(s.path == ROOT / "README.md" for s in SNIPPETS)


@pytest.mark.parametrize("snippet", _with(""))
async def test_snippet_runs_on_the_embedded_scheduler(snippet: Snippet, tmp_path: Path) -> None:
    # Run as it is, it would write into a schema of the shared database that is not its own.
    assert "postgresql://" not in snippet.code, f"{snippet.name}: mark it docs-test: postgres"
    await run_snippet(snippet, snippet.code, tmp_path)


@pytest_asyncio.fixture
async def docs_server(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    async with running_server(tmp_path, config_toml('[store]\nkind = "memory"\n')) as server:
        await server.leading()
        yield server


@pytest.mark.parametrize("snippet", _with("server"))
async def test_snippet_runs_against_a_real_server(
    snippet: Snippet, docs_server: ServerProcess, tmp_path: Path
) -> None:
    assert snippet.marker is not None
    address = snippet.marker.split(" ", 1)[1].strip()
    assert address in snippet.code, f"{snippet.name} does not use {address}, as its marker says"
    directory = tmp_path / "snippet"
    directory.mkdir()
    await run_snippet(snippet, snippet.code.replace(address, docs_server.target), directory)


@pytest.mark.parametrize("snippet", _with("postgres"))
async def test_snippet_runs_on_postgres(snippet: Snippet, pg_schema: str, tmp_path: Path) -> None:
    assert _SCHEMA.search(snippet.code), f"{snippet.name} names no schema= to replace"
    assert DOCS_DSN in snippet.code, f"{snippet.name} does not use {DOCS_DSN}"
    code = _SCHEMA.sub(f'schema="{pg_schema}"', snippet.code).replace(DOCS_DSN, PG_DSN)
    await run_snippet(snippet, code, tmp_path)


# --- the web framework examples ------------------------------------------------------------------

# What a browser does with either example's two endpoints; ``web`` is the framework's test client.
_CALLS = """
first = web.post("/resize/cat.png")
assert first.status_code == 202, (first.status_code, first.content)
task_id = first.json()["task_id"]
again = web.post("/resize/cat.png")
assert again.json()["task_id"] == task_id, "the key made a second task"
read = web.get(f"/tasks/{task_id}")
assert read.status_code == 200, (read.status_code, read.content)
assert read.json() == {"status": "ready", "output": None}, read.json()
missing = web.get(f"/tasks/{task_id + 1000}")
assert missing.status_code == 404, (missing.status_code, missing.content)
print("TASK", task_id)
"""

_DJANGO = """
import django
from django.conf import settings

settings.configure(
    ALLOWED_HOSTS=["testserver"], ROOT_URLCONF="urls", CRONOQ_TARGET=%r, MIDDLEWARE=[]
)
django.setup()
from django.test import Client

web = Client()
"""

_DJANGO_URLS = """
from django.urls import path

from myapp import views

urlpatterns = [
    path("resize/<str:image>", views.resize),
    path("tasks/<int:task_id>", views.resize_status),
]
"""

_FASTAPI = """
from fastapi.testclient import TestClient

from service import app

web = TestClient(app)
"""


async def _served_task(snippet: Snippet, directory: Path, server: ServerProcess) -> int:
    """Run the calls against the example in ``directory``; the task they submitted."""
    script = directory / "calls.py"
    driver = _DJANGO % server.target if snippet.marker == "django" else _FASTAPI
    script.write_text(driver + _CALLS, encoding="utf-8")
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), cwd=directory,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(SNIPPET_TIMEOUT_S):
        output, _ = await process.communicate()
    text = output.decode("utf-8", "replace")
    assert process.returncode == 0, f"{snippet.name} exited {process.returncode}:\n{text}"
    return int(text.rsplit("TASK ", 1)[1])


@pytest.mark.parametrize("snippet", [*_with("django"), *_with("fastapi")])
async def test_web_framework_example_serves_a_real_server(
    snippet: Snippet, docs_server: ServerProcess, tmp_path: Path
) -> None:
    assert snippet.marker is not None
    if snippet.marker == "django":
        (tmp_path / "myapp").mkdir()
        (tmp_path / "myapp" / "__init__.py").write_text("")
        (tmp_path / "myapp" / "views.py").write_text(snippet.code, encoding="utf-8")
        (tmp_path / "urls.py").write_text(_DJANGO_URLS)
    else:
        address = snippet.marker.split(" ", 1)[1].strip()
        assert address in snippet.code, f"{snippet.name} does not use {address}"
        code = snippet.code.replace(address, docs_server.target)
        (tmp_path / "service.py").write_text(code, encoding="utf-8")
    task_id = await _served_task(snippet, tmp_path, docs_server)
    # What the endpoint submitted is on the server, under its key, once.
    async with AsyncClient(docs_server.target, codec=JsonCodec()) as client:
        info = await client.get(task_id)
        assert (info.kind, info.key, info.payload) == (
            "resize",
            "resize:cat.png",
            {"image": "cat.png"},
        )
        assert [t.task_id for t in await client.list(kind="resize")] == [task_id]


def test_both_web_framework_examples_are_run() -> None:
    assert {s.marker.split(" ", 1)[0] for s in SNIPPETS if s.marker} >= {"django", "fastapi"}


# --- links between the docs --------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces as
    hyphens."""
    anchors = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if heading := re.match(r"^#+ (.+)$", line):
            words = re.sub(r"[^\w\- ]", "", heading[1].strip().lower())
            anchors.add(words.replace(" ", "-"))
    return anchors


def test_every_relative_link_of_the_docs_leads_somewhere() -> None:
    broken = []
    for path in [*doc_files(), ROOT / "CHANGELOG.md"]:
        prose = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for link in _LINK.findall(prose):
            if re.match(r"^[a-z]+:", link):  # https:, mailto:
                continue
            target, _, anchor = link.partition("#")
            resolved = (path.parent / target) if target else path
            if not resolved.exists() or (
                anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved)
            ):
                broken.append(f"{path.relative_to(ROOT)}: {link}")
    assert not broken


# --- docs/api.md's exception tree --------------------------------------------------------------

# "│   ├── UnknownPool, InvalidCron (also ValueError)      what it means"
_TREE_LINE = re.compile(
    r"^(?P<indent>[│ ]*)(?:├──|└──) (?P<names>[A-Za-z, ]+?)"
    r"(?: \(also (?P<also>[A-Za-z, ]+)\))?(?:\s{2,}.*)?$"
)


def documented_tree() -> dict[str, tuple[str, frozenset[str]]]:
    """Each exception of docs/api.md's tree: its parent and the "(also X)" classes."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    block = text.split("## Errors", 1)[1].split("```", 2)[1]
    lines = block.strip("\n").splitlines()
    assert lines[0] == "CronoqError", lines[0]
    parents: list[str] = ["CronoqError"]  # parents[depth] is the first name at that depth
    tree: dict[str, tuple[str, frozenset[str]]] = {}
    for line in lines[1:]:
        found = _TREE_LINE.match(line)
        assert found, f"not a line of the tree: {line!r}"
        depth = len(found["indent"]) // 4 + 1
        names = [name.strip() for name in found["names"].split(",")]
        also = frozenset(n.strip() for n in (found["also"] or "").split(",") if n.strip())
        for name in names:
            tree[name] = (parents[depth - 1], also)
        del parents[depth:]
        parents.append(names[0])
    return tree


def test_the_exception_tree_of_the_api_docs_is_cronoqs() -> None:
    tree = documented_tree()
    actual: dict[str, tuple[str, frozenset[str]]] = {}
    for name in cronoq.errors.__all__:
        cls = getattr(cronoq.errors, name)
        if cls is cronoq.errors.CronoqError:
            continue
        bases = [base.__name__ for base in cls.__bases__]
        actual[name] = (bases[0], frozenset(bases[1:]))
    assert tree == actual


# --- docs/server.md's lifecycle events ---------------------------------------------------------


def logged_lifecycle_events() -> set[str]:
    """Every event the server's source passes to ``lifecycle(...)``."""
    source = Path(cronoq_server.__file__).parent
    events: set[str] = set()
    for path in source.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "lifecycle"
            ):
                first = node.args[0]
                assert isinstance(first, ast.Constant), f"{path}: a lifecycle event not literal"
                assert isinstance(first.value, str), f"{path}: a lifecycle event not a str"
                events.add(first.value)
    return events


def test_the_lifecycle_events_of_the_server_docs_are_the_ones_it_logs() -> None:
    text = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    table = text.split("one line per lifecycle event", 1)[1].split("\n\n", 2)[1]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))
    assert documented == logged_lifecycle_events()


# --- what every package's page on PyPI says ----------------------------------------------------


def nox_pythons() -> list[str]:
    """Every Python version noxfile.py tests (its TEST_PYTHONS with all versions on)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "TEST_PYTHONS" for t in node.targets
        ):
            assert isinstance(node.value, ast.IfExp) and isinstance(node.value.body, ast.List)
            return [ast.literal_eval(element) for element in node.value.body.elts]
    raise AssertionError("noxfile.py defines no TEST_PYTHONS")


def test_every_package_is_licensed_and_classified_for_the_pythons_nox_tests() -> None:
    members = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    pythons = nox_pythons()
    oldest = min(pythons, key=lambda v: tuple(int(part) for part in v.split(".")))
    for member in members["members"]:
        project = tomllib.loads((ROOT / member / "pyproject.toml").read_text())["project"]
        assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])
        # A wheel carries only its own package's files: each holds a copy of the licence.
        assert (ROOT / member / "LICENSE").read_text(encoding="utf-8") == licence, member
        versions = [
            found[1]
            for c in project["classifiers"]
            if (found := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))
        ]
        assert sorted(versions) == sorted(pythons), member
        assert project["requires-python"] == f">={oldest}", member


# --- what a package index shows: metadata and READMEs ------------------------------------------

DOCS_SITE = "https://cronoq.github.io/cronoq/"
REPOSITORY = "https://github.com/cronoq/cronoq"
PROJECT_URLS = {
    "Homepage": REPOSITORY,
    "Documentation": DOCS_SITE,
    "Repository": REPOSITORY,
    "Changelog": f"{REPOSITORY}/blob/main/CHANGELOG.md",
    "Issues": f"{REPOSITORY}/issues",
}


def workspace_members() -> list[Path]:
    members = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]
    return [ROOT / member for member in members["members"]]


def test_every_package_names_its_authors_and_the_projects_urls() -> None:
    site = dict(
        re.findall(r"^(site_url|repo_url): (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    )
    assert site == {"site_url": DOCS_SITE, "repo_url": REPOSITORY}
    for member in workspace_members():
        project = tomllib.loads((member / "pyproject.toml").read_text())["project"]
        assert project["authors"] == [{"name": "The cronoq authors"}], member
        assert project["urls"] == PROJECT_URLS, member


def test_a_built_wheel_carries_the_authors_and_project_urls(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH: the pyproject test above checks the same fields")
    subprocess.run(
        [uv, "build", "--package", "cronoq-store-sqlite", "--wheel", "-o", str(tmp_path), "-q"],
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(name).decode()
    lines = metadata.split("\n\n", 1)[0].splitlines()
    assert "Author: The cronoq authors" in lines
    assert [line for line in lines if line.startswith("Project-URL: ")] == [
        f"Project-URL: {label}, {url}" for label, url in PROJECT_URLS.items()
    ]


def test_the_package_readmes_link_absolutely_to_pages_that_exist() -> None:
    # A package index shows a README alone: a relative link there leads nowhere.
    readmes = [member / "README.md" for member in workspace_members()]
    assert len(readmes) == 6
    wrong = []
    for readme in readmes:
        prose = re.sub(r"```.*?```", "", readme.read_text(encoding="utf-8"), flags=re.S)
        for link in _LINK.findall(prose):
            if not link.startswith("https://"):
                wrong.append(f"{readme.relative_to(ROOT)}: {link} is not absolute")
            elif link.startswith(DOCS_SITE):
                page = link.removeprefix(DOCS_SITE).split("#")[0].rstrip("/") or "index"
                if not (ROOT / "docs" / f"{page}.md").exists():
                    wrong.append(f"{readme.relative_to(ROOT)}: {link} is no page of docs/")
        # "docs/x.md of the repository" in prose is a link a reader cannot follow either.
        wrong += [
            f"{readme.relative_to(ROOT)}: {found}"
            for found in re.findall(r"(?<![/\w])docs/[\w/.-]+\.md", prose)
        ]
    assert not wrong


# --- docstrings as the API reference renders them ----------------------------------------------

# Sphinx roles: mkdocstrings renders Markdown, where ":meth:`close`" stays as written.
_SPHINX_ROLE = re.compile(r":(?:meth|class|func|attr|data|mod|exc|obj):`")


def docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """Every docstring of a module (its own, its classes' and functions', and the string
    after an assignment that documents an attribute): its line and text."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.lineno, node.value.value


def test_no_docstring_uses_a_sphinx_role() -> None:
    sources = [
        path
        for path in [*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("conformance/src/**/*.py")]
        if "_proto" not in path.parts
    ]
    assert len(sources) > 100
    found = [
        f"{path.relative_to(ROOT)}:{line}: {role.group()}..."
        for path in sources
        for line, text in docstrings(path)
        for role in _SPHINX_ROLE.finditer(text)
    ]
    assert not found, "write ``name`` instead:\n" + "\n".join(found)
