"""The check of the limits a submission names (``cronoq._limits.limit_keys``)."""

from __future__ import annotations

import pytest

from cronoq import Limit
from cronoq._limits import limit_keys
from cronoq.errors import InvalidArgument, UnknownLimit

CONFIGURED = {"tenant": Limit("tenant", concurrency=2, per_key=True)}


def test_an_unknown_limit_is_unknown_limit_not_a_key_error() -> None:
    with pytest.raises(UnknownLimit, match="unknown limit 'nope'; configured: tenant"):
        limit_keys({"nope": None}, CONFIGURED)


def test_known_limits_with_their_keys_and_the_pool_s() -> None:
    configured = {**CONFIGURED, "stripe": Limit("stripe", rate=1, per=1)}
    assert limit_keys({"tenant": "acme"}, configured, ["stripe"]) == (
        ("stripe", None),
        ("tenant", "acme"),
    )
    with pytest.raises(InvalidArgument, match="per key"):
        limit_keys({"tenant": None}, configured)
