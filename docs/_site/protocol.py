"""The protocol reference: a Markdown page made from the comments of a ``.proto`` file.

A comment block (``//`` lines) documents the declaration right after it: the file's first block
(before ``syntax``) is the page's introduction, then each service, rpc, message, enum, field,
oneof and enum value. Only the subset of proto3 that cronoq.proto uses is understood (top-level
declarations, ``optional``/``repeated``/``map`` fields, ``oneof`` groups, server streams); any
other line is an error, so that a construct this page would silently drop fails the build.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_TYPE = r"[A-Za-z_][A-Za-z0-9_.]*"
_BLOCK = re.compile(rf"^(message|enum|service) ({_NAME}) \{{(\}})?$")
_RPC = re.compile(rf"^rpc ({_NAME})\(({_TYPE})\) returns \((stream )?({_TYPE})\);$")
_FIELD = re.compile(
    rf"^(?:(optional|repeated) )?(map<{_TYPE}, {_TYPE}>|{_TYPE}) ({_NAME}) = (\d+);$"
)
_ONEOF = re.compile(rf"^oneof ({_NAME}) \{{$")
_VALUE = re.compile(rf"^({_NAME}) = (\d+);$")
_SKIPPED = re.compile(r"^(syntax|package|import) .*;$")


@dataclass(frozen=True, slots=True)
class Member:
    """A field, enum value or rpc, in the order of the file."""

    name: str
    detail: tuple[str, ...]
    """The cells of its table row after the name (type and number, or request and reply)."""
    doc: str


@dataclass(slots=True)
class Block:
    keyword: str
    name: str
    doc: str
    members: list[Member] = field(default_factory=list)


@dataclass(slots=True)
class ProtoFile:
    package: str
    intro: str
    blocks: list[Block]


def parse(path: Path) -> ProtoFile:
    """The declarations of ``path`` with their comments; ValueError names a line not
    understood."""
    intro: str | None = None
    package = ""
    blocks: list[Block] = []
    comment: list[str] = []
    current: Block | None = None
    oneof: str | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if line.startswith("//"):
            comment.append(line.removeprefix("//").removeprefix(" "))
            continue
        doc = _joined(comment)
        comment = []
        if not line:
            continue
        if intro is None:
            intro = doc  # the file's header comment, whatever follows it
            doc = ""
        if current is None:
            if found := _BLOCK.match(line):
                current = Block(found[1], found[2], doc)
                blocks.append(current)
                if found[3]:  # `message Empty {}`
                    current = None
            elif found := re.match(rf"^package ({_TYPE});$", line):
                package = found[1]
            elif not _SKIPPED.match(line):
                raise ValueError(f"{path}:{number}: not understood: {line}")
        elif line == "}":
            if oneof is not None:
                oneof = None
            else:
                current = None
        elif current.keyword == "service" and (found := _RPC.match(line)):
            reply = f"stream {found[4]}" if found[3] else found[4]
            current.members.append(Member(found[1], (found[2], reply), doc))
        elif current.keyword == "enum" and (found := _VALUE.match(line)):
            current.members.append(Member(found[1], (found[2],), doc))
        elif current.keyword == "message" and (found := _ONEOF.match(line)):
            oneof = found[1]
            current.members.append(Member(oneof, ("", "oneof", ""), doc))
        elif current.keyword == "message" and (found := _FIELD.match(line)):
            label = found[1] or (f"in `{oneof}`:" if oneof else "")
            current.members.append(Member(found[3], (label, found[2], found[4]), doc))
        else:
            raise ValueError(f"{path}:{number}: not understood in {current.name}: {line}")
    return ProtoFile(package, intro or "", blocks)


def _joined(lines: list[str]) -> str:
    """A comment's lines as Markdown: list items and blank lines kept, the rest reflowed."""
    return "\n".join(lines).strip()


def _cell(text: str) -> str:
    """A comment as one table cell: its lines joined, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _field_type(member: Member, type_link: Callable[[str], str]) -> str:
    label, kind, _ = member.detail
    if kind == "oneof":
        return "oneof (one of the fields below it)"
    return f"{label} {type_link(kind)}".strip()


def _anchor(name: str) -> str:
    return name.lower()


def render(path: Path, source_name: str) -> str:
    """The Markdown page of the protocol in ``path`` (shown as ``source_name``)."""
    proto = parse(path)
    known = {block.name for block in proto.blocks}

    def type_link(name: str) -> str:
        """A type, linked to its section when this file declares it."""
        bare = name.removeprefix("stream ")
        shown = f"[`{bare}`](#{_anchor(bare)})" if bare in known else f"`{bare}`"
        return name.removesuffix(bare) + shown

    out = [
        "# Protocol reference",
        "",
        f"Generated from the comments of `{source_name}` (package `{proto.package}`) when the "
        "site is built. The guide to the protocol is in "
        "[cronoq-server](../server.md#the-protocol).",
        "",
        proto.intro,
        "",
    ]
    for keyword, title in (("service", "Services"), ("message", "Messages"), ("enum", "Enums")):
        out += [f"## {title}", ""]
        for block in (b for b in proto.blocks if b.keyword == keyword):
            out += [f"### {block.name} {{#{_anchor(block.name)}}}", ""]
            if block.doc:
                out += [block.doc, ""]
            if not block.members:
                out += ["No fields.", ""]
                continue
            if keyword == "service":
                out += ["| rpc | request | reply | description |", "| --- | --- | --- | --- |"]
                out += [
                    f"| `{m.name}` | {type_link(m.detail[0])} | {type_link(m.detail[1])} "
                    f"| {_cell(m.doc)} |"
                    for m in block.members
                ]
            elif keyword == "message":
                out += ["| field | type | number | description |", "| --- | --- | --- | --- |"]
                out += [
                    f"| `{m.name}` | {_field_type(m, type_link)} | {m.detail[2]} | {_cell(m.doc)} |"
                    for m in block.members
                ]
            else:
                out += ["| value | number | description |", "| --- | --- | --- |"]
                out += [f"| `{m.name}` | {m.detail[0]} | {_cell(m.doc)} |" for m in block.members]
            out.append("")
    return "\n".join(out)
