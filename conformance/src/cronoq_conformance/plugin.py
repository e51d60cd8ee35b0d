"""pytest plugin (registered by the ``pytest11`` entry point): makes the kit's plain ``assert``
statements report their values, as assertions in test files do."""

import pytest

pytest.register_assert_rewrite("cronoq_conformance")
