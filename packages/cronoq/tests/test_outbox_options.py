"""The outbox options' JSON form (cronoq._outbox), without a database: what
``encode_outbox_options`` writes, ``decode_outbox_options`` reads back as ``submit`` would take
the same values, to the nanosecond; and what SQL may write instead is read by the same rules.
(The PostgreSQL helpers' tests check the whole way, through the server and the ingest.)"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronoq import _validate as check
from cronoq._outbox import decode_outbox_options, encode_outbox_options
from cronoq.errors import InvalidArgument

TEN_YEARS_S = check.MAX_DURATION_NS // 1_000_000_000


def durations() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(0, TEN_YEARS_S),
        st.floats(0.0, float(TEN_YEARS_S)),
        st.timedeltas(timedelta(0), timedelta(seconds=TEN_YEARS_S)),
        # Long durations with microseconds: past 2**53 ns a float of seconds cannot hold them.
        st.builds(
            lambda days, us: timedelta(days=days, microseconds=us),
            st.integers(105, 3650),
            st.integers(1, 999_999),
        ),
    )


@given(value=durations(), name=st.sampled_from(["timeout", "grace"]))
def test_a_duration_reads_back_to_the_nanosecond_submit_makes_of_it(value: Any, name: str) -> None:
    expected = check.duration_ns(value, name)
    if expected == 0 and name == "timeout":
        return  # refused (a timeout is more than 0), by the encoder as by submit
    decoded = decode_outbox_options(encode_outbox_options({name: value}, time.time_ns()))
    assert check.duration_ns(decoded[name], name) == expected, decoded


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("30", 30_000_000_000),
        ("0.25", 250_000_000),
        ("0.000000001", 1),
        ("1e-9", 1),
        ("2.5E1", 25_000_000_000),
        ("16848000.000001", 16_848_000_000_001_000),
        ("2300000.000000999", 2_300_000_000_000_999),
        ("0.0000000004", None),  # rounds to 0: a timeout must be more than 0
        ("-1", None),
        ("-0.5", None),
        ("1e400", None),
        ("316224001", None),  # over ten years
        ("true", None),
        ('"30"', None),
        ("[30]", None),
        ("{}", None),
    ],
)
def test_a_duration_written_by_sql_is_read_as_its_decimal_value(text: str, ns: int | None) -> None:
    def read() -> int:
        options = decode_outbox_options(f'{{"timeout": {text}}}')
        return check.duration_ns(options["timeout"], "timeout", allow_zero=False)

    if ns is None:
        with pytest.raises(InvalidArgument, match="timeout"):
            read()
    else:
        assert read() == ns


def test_other_numbers_are_floats_as_json_reads_them() -> None:
    options = decode_outbox_options(
        '{"priority": 2.0, "tags": [1.5], "retry": {"multiplier": 1.5, "jitter": 0.25}}'
    )
    assert options["priority"] == 2.0 and type(options["priority"]) is float
    assert options["tags"] == [1.5] and type(options["tags"][0]) is float
    assert (options["retry"].multiplier, options["retry"].jitter) == (1.5, 0.25)


@pytest.mark.parametrize("name", ["pool", "tags", "priority", "miss_policy", "grace"])
def test_none_is_refused_where_submit_refuses_it(name: str) -> None:
    with pytest.raises(InvalidArgument, match=name.rstrip("s")):
        encode_outbox_options({name: None}, time.time_ns())


@pytest.mark.parametrize("name", ["key", "name", "retry", "start_at", "deadline", "timeout"])
def test_none_is_the_default_where_submits_default_is_none(name: str) -> None:
    assert encode_outbox_options({name: None}, time.time_ns()) == "{}"
