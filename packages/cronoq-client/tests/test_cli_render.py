"""The CLI's tables show every value as the text it is: a value is the callers' (a tenant's
limit key, a task's kind or tag), never rich markup or a terminal escape."""

from __future__ import annotations

import io

from rich.console import Console

from cronoq_client._cli._render import fields, table

HOSTILE = ["[/x]", "[link=https://example.invalid]click[/link]", "red\x1b[31mtext", "a\nb"]


def _shown(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(renderable)
    return out.getvalue()


def test_a_table_shows_markup_and_escapes_as_text() -> None:
    shown = _shown(table([{"key": value} for value in HOSTILE], [("key", "KEY")]))
    assert "[/x]" in shown and "[link=https://example.invalid]click[/link]" in shown
    assert "\x1b" not in shown and "red\\x1b[31mtext" in shown
    assert "a\\nb" in shown


def test_a_record_shows_markup_and_escapes_as_text() -> None:
    shown = _shown(fields({"kind": HOSTILE[0], "waiting_for": HOSTILE[2]}))
    assert "[/x]" in shown and "red\\x1b[31mtext" in shown and "\x1b" not in shown
