"""The web dashboard under ``/ui`` (docs/dashboard.md): pages, templates and assets."""

from cronoq_server._ui._app import Dashboard

__all__ = ["Dashboard"]
