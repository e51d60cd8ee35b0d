"""The configuration reference: every key cronoq-server accepts, made from its config schema.

The keys are the loader's own tables (the ones that decide what is an unknown key), so a key
cannot be missing here or listed when the server would refuse it. Each key's type and default
come from the settings dataclass behind it and its description from that field's docstring;
a key with no field behind it fails the build.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from collections.abc import Iterator
from typing import Any, Literal, get_args, get_origin, get_type_hints

from cronoq_server import _config as schema
from cronoq_store_postgres import PgStoreConfig
from cronoq_store_sqlite import SqliteStoreConfig

_DURATION = "float (seconds)"


@dataclasses.dataclass(frozen=True, slots=True)
class Key:
    key: str
    """As written in the TOML file, dotted under its section."""
    env: str
    kind: str
    default: str
    doc: str


def field_docs(cls: type[Any]) -> dict[str, str]:
    """The docstrings of a dataclass's fields (the string literal after each annotation)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for statement, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[statement.target.id] = markdown(inspect.cleandoc(after.value.value))
    return docs


def _field(cls: type[Any], name: str) -> tuple[str, str, str]:
    """The type, default and description of one field, as table cells."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise LookupError(
            f"the config schema has a key for {cls.__name__}.{name}, a field it lacks"
        )
    found = fields[name]
    hint = get_type_hints(cls, vars(inspect.getmodule(cls)))[name]
    if get_origin(hint) is Literal:
        kind = " or ".join(f'`"{option}"`' for option in get_args(hint))
    elif hint is float and name.endswith("_s"):
        kind = _DURATION
    else:
        kind = f"`{found.type}`" if isinstance(found.type, str) else f"`{hint.__name__}`"
    if found.default is not dataclasses.MISSING:
        default = _shown(found.default)
    elif found.default_factory is not dataclasses.MISSING:
        default = _shown(found.default_factory())
    else:
        default = "required"
    return kind, default, field_docs(cls).get(name, "")


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def markdown(docstring: str) -> str:
    """A docstring's Sphinx roles as code (``:class:`~a.B``` is `B`); double backquotes are
    Markdown code already."""
    return _ROLE.sub(lambda found: f"`{found[1].rsplit('.', 1)[-1]}`", docstring)


def _class_doc(cls: type[Any]) -> str:
    """A class's docstring; "" for a dataclass without one (its generated signature)."""
    doc = markdown(inspect.cleandoc(cls.__doc__ or ""))
    return "" if doc.startswith(f"{cls.__name__}(") else doc


def _shown(value: object) -> str:
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, frozenset | tuple) and not value:
        return "`[]`"
    return f"`{value}`"


def _env(key: str) -> str:
    section, _, name = key.partition(".")
    name = f"{section}__{name}" if name else section
    return f"`{schema.ENV_PREFIX}{name.upper()}`"


def _keys(cls: type[Any], section: str, names: Iterator[str] | list[str]) -> Iterator[Key]:
    for name in sorted(names):
        key = f"{section}.{name}" if section else name
        yield Key(key, _env(key), *_field(cls, name))


def top_level() -> list[Key]:
    return list(_keys(schema.ServerConfig, "", list(schema._TOP_KEYS)))


# Each store kind: its settings dataclass, the store's own config dataclass and the keys made
# from that one's fields.
_STORE_SETTINGS: dict[str, tuple[type[Any], type[Any] | None, dict[str, tuple[str, Any]]]] = {
    "memory": (schema.MemoryStoreSettings, None, {}),
    "sqlite": (schema.SqliteStoreSettings, SqliteStoreConfig, schema._SQLITE_OPTIONS),
    "postgres": (schema.PostgresStoreSettings, PgStoreConfig, schema._PG_OPTIONS),
}


def store() -> dict[str, list[Key]]:
    """The keys of ``[store]`` for each ``kind``."""
    by_kind: dict[str, list[Key]] = {}
    if set(_STORE_SETTINGS) != set(schema._STORE_KEYS):
        raise LookupError(
            f"store kinds {sorted(schema._STORE_KEYS)}, documented {sorted(_STORE_SETTINGS)}"
        )
    for kind, (cls, option_cls, options) in _STORE_SETTINGS.items():
        own = sorted(schema._STORE_KEYS[kind] - set(options) - {"kind"})
        keys = list(_keys(cls, "store", own))
        for key, (name, _) in sorted(options.items()):
            assert option_cls is not None
            kind_cell, default, doc = _field(option_cls, name)
            if key.endswith("_s"):
                kind_cell = _DURATION
            keys.append(Key(f"store.{key}", _env(f"store.{key}"), kind_cell, default, doc))
        by_kind[kind] = keys
    return by_kind


# The settings dataclass behind each section other than [store].
_SECTION_CLASSES: dict[str, type[Any]] = {
    "listen": schema.ListenSettings,
    "limits": schema.LimitSettings,
    "tls": schema.TlsSettings,
    "auth": schema.AuthSettings,
    "logging": schema.LoggingSettings,
    "runtime": schema.RuntimeSettings,
    "tracing": schema.TracingSettings,
}


def sections() -> dict[str, list[Key]]:
    documented = {"store", *_SECTION_CLASSES}
    if documented != set(schema._SECTIONS):
        raise LookupError(
            f"config sections {sorted(schema._SECTIONS)}, documented {sorted(documented)}"
        )
    return {
        section: list(_keys(cls, section, sorted(schema._SECTIONS[section])))
        for section, cls in _SECTION_CLASSES.items()
    }


def _table(keys: list[Key], *, env: bool = True) -> list[str]:
    head = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    if env:
        head = [
            "| key | environment variable | type | default | description |",
            "| --- | --- | --- | --- | --- |",
        ]
    rows = []
    for k in keys:
        doc = " ".join(k.doc.split()).replace("|", "\\|")
        variable = f" {k.env} |" if env else ""
        rows.append(f"| `{k.key}` |{variable} {k.kind} | {k.default} | {doc} |")
    return [*head, *rows, ""]


def _items(cls: type[Any], names: frozenset[str] | list[str], prefix: str) -> list[Key]:
    return [Key(f"{prefix}.{name}", "", *_field(cls, name)) for name in sorted(names)]


def render() -> str:
    """The Markdown page of every configuration key."""
    out = [
        "# Configuration reference",
        "",
        "Generated from cronoq-server's config schema "
        "(`packages/cronoq-server/src/cronoq_server/_config.py`) when the site is built: these "
        "are exactly the keys the server accepts, with their types and defaults. How the file "
        "and the environment combine, and what each part is for, is in "
        "[cronoq-server](../server.md#configuration).",
        "",
        markdown(inspect.cleandoc(schema.__doc__ or "")),
        "",
        "## Top-level keys",
        "",
        *_table(top_level()),
    ]
    for kind, keys in store().items():
        out += [f'## `[store]` with `kind = "{kind}"`', ""]
        if doc := _class_doc(_STORE_SETTINGS[kind][0]):
            out += [doc, ""]
        out += _table(keys) if keys else ["No other key.", ""]
    for section, keys in sections().items():
        out += [f"## `[{section}]`", "", *_table(keys)]
    out += [
        "## `[[pools]]`",
        "",
        f"One table per pool run by remote workers; from the environment, all of them as one "
        f"JSON list in `{schema.ENV_PREFIX}POOLS`. The default is one pool, `default`.",
        "",
        *_table(_items(schema.PoolSettings, list(schema._POOL_KEYS), "pools[]"), env=False),
        "## `[[auth.identities]]`",
        "",
        _class_doc(schema.IdentitySettings),
        "From the environment, all of them as one JSON list in "
        f"`{schema.ENV_PREFIX}AUTH__IDENTITIES`. "
        "The permissions are " + ", ".join(f"`{p}`" for p in schema.PERMISSIONS) + ".",
        "",
        *_table(
            _items(schema.IdentitySettings, schema._IDENTITY_KEYS, "auth.identities[]"), env=False
        ),
    ]
    return "\n".join(out)
