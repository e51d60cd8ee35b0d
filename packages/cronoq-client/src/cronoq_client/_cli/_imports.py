"""``MODULE:OBJECT`` references of the command line (a worker's pools, a codec), as uvicorn
and PgQueuer take them: the module is imported with the working directory on ``sys.path``."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from cronoq_client._cli._errors import ConfigError

__all__ = ["load_object"]


def load_object(reference: str, what: str) -> Any:
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(
            f"{what} must be MODULE:OBJECT (e.g. myapp.tasks:pools), got {reference!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the project's own modules
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the module's own error too: one line, not a traceback
        raise ConfigError(
            f"{what} {reference}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigError(f"{what} {reference}: {module_name} has no {attribute}") from None
    return found
