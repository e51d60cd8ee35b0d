"""MkDocs hooks of the documentation site (mkdocs.yml): the pages made at build time.

- ``reference/api/<module>.md``, one per module that the nav lists there: every name of the
  module's ``__all__``, rendered by mkdocstrings from the docstrings.
- ``reference/protocol.md`` from the comments of proto/cronoq/v1/cronoq.proto.
- ``reference/configuration.md`` from cronoq-server's config schema.
- ``packages/<distribution>.md``: the packages' READMEs, which docs/ links to.

None of them is written to the source tree, so none can fall behind what it describes. The
guides of docs/ are published as they are; links between the Markdown files of the repository
(a guide to a package README, a README to a guide) are pointed at their pages on the site.
"""

from __future__ import annotations

import importlib
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import configuration
import protocol
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
PROTO = "proto/cronoq/v1/cronoq.proto"
API_DIR = "reference/api/"
# Repository path of each published README -> its page.
READMES = {
    **{
        f"packages/{path.parent.name}/README.md": f"packages/{path.parent.name}.md"
        for path in sorted(ROOT.glob("packages/*/README.md"))
    },
    "conformance/README.md": "packages/cronoq-conformance.md",
}
_FENCE = re.compile(r"^\s*```.*?^\s*```\s*$", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _nav_pages(nav: Any) -> Iterator[str]:
    """Every page path of the nav (a list of strings and one-key mappings)."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def public_names(module_name: str) -> tuple[list[str], list[str]]:
    """A module's ``__all__``: the names mkdocstrings renders, and the modules generated from
    the .proto (``cronoq_client.protocol.pb``), whose reference is the protocol page."""
    module = importlib.import_module(module_name)
    names = list(getattr(module, "__all__", ()))
    if not names:
        raise PluginError(f"{module_name} has no __all__: the API reference lists public names")
    generated = [n for n in names if isinstance(getattr(module, n), ModuleType)]
    for name in generated:
        if not getattr(module, name).__name__.endswith(("_pb2", "_pb2_grpc")):
            raise PluginError(f"{module_name}.{name} is a module: say how to document it")
    return [n for n in names if n not in generated], generated


def api_page(module_name: str) -> str:
    """mkdocstrings' directive for every public name of a module, as its ``__all__`` says."""
    names, generated = public_names(module_name)
    members = "\n".join(f"        - {name}" for name in names)
    page = f"::: {module_name}\n    options:\n      members:\n{members}\n"
    if generated:
        shown = ", ".join(f"`{name}`" for name in generated)
        page += (
            f"\n## Generated modules\n\n{shown}: the messages and stubs protoc generates from "
            f"`{PROTO}`; they are described in the [protocol reference](../protocol.md).\n"
        )
    return page


def on_files(files: Files, config: MkDocsConfig) -> Files:
    generated = {
        "reference/protocol.md": protocol.render(ROOT / PROTO, PROTO),
        "reference/configuration.md": configuration.render(),
        **{
            page: api_page(page.removeprefix(API_DIR).removesuffix(".md"))
            for page in _nav_pages(config.nav)
            if page.startswith(API_DIR)
        },
        **{page: (ROOT / readme).read_text(encoding="utf-8") for readme, page in READMES.items()},
    }
    for src_uri, content in generated.items():
        files.append(File.generated(config, src_uri, content=content))
    return files


def _origin(page: Page) -> str:
    """The repository path a page's Markdown comes from."""
    for readme, src_uri in READMES.items():
        if page.file.src_uri == src_uri:
            return readme
    return f"docs/{page.file.src_uri}"


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Links to another published Markdown file of the repository, pointed at its page."""
    origin = _origin(page)
    published = {**READMES, **{f"docs/{f.src_uri}": f.src_uri for f in files.documentation_pages()}}

    def repoint(found: re.Match[str]) -> str:
        link = found[1]
        if re.match(r"^[a-z]+:", link) or link.startswith("#"):
            return found[0]
        target, hash_, anchor = link.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(origin), target))
        if resolved not in published:
            return found[0]  # MkDocs reports it if it leads nowhere
        here = posixpath.dirname(page.file.src_uri) or "."
        return f"]({posixpath.relpath(published[resolved], here)}{hash_}{anchor})"

    out, last = [], 0
    for fence in _FENCE.finditer(markdown):
        out += [_LINK.sub(repoint, markdown[last : fence.start()]), fence[0]]
        last = fence.end()
    out.append(_LINK.sub(repoint, markdown[last:]))
    return "".join(out)


def on_post_page(output: str, page: Page, config: MkDocsConfig) -> str:
    """Fail the build if an API page left out a public name (mkdocstrings skips a member it
    cannot find without a word)."""
    src_uri = page.file.src_uri
    if src_uri.startswith(API_DIR):
        module_name = src_uri.removeprefix(API_DIR).removesuffix(".md")
        names, _ = public_names(module_name)
        missing = [name for name in names if f'id="{module_name}.{name}"' not in output]
        if missing:
            raise PluginError(f"{src_uri} does not render {', '.join(missing)}")
    return output
