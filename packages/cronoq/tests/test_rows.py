"""Row encodings used by stores: exact round trips, and ValueError on anything malformed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronoq._model import CatchUpPolicy, MissPolicy, OverlapPolicy
from cronoq.store import (
    RetryPolicy,
    ScheduleSpec,
    TaskSpec,
    TaskTemplate,
    decode_schedule_spec,
    decode_task_spec,
    encode_schedule_spec,
    encode_task_options,
)

text = st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s)
maybe_ns = st.none() | st.integers(0, 2**62)
retries = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 1000),
    initial_ns=st.integers(0, 10**9),
    multiplier=st.floats(1.0, 100.0),
    max_ns=st.integers(10**9, 10**12),
    jitter=st.floats(0.0, 1.0),
)
specs = st.builds(
    TaskSpec,
    pool=text,
    kind=text,
    payload=st.binary(max_size=64),
    key=st.none() | text,
    tags=st.lists(text, max_size=3).map(tuple),
    name=st.none() | text,
    priority=st.integers(-(2**31), 2**31),
    retry=st.just(RetryPolicy()) | retries,
    start_at_ns=maybe_ns,
    miss_policy=st.sampled_from(MissPolicy),
    grace_ns=st.integers(0, 10**12),
    deadline_ns=maybe_ns,
    timeout_ns=maybe_ns,
    after=st.lists(st.integers(1, 2**63 - 1), max_size=4).map(tuple),
    schedule=st.none() | text,
)


@given(specs)
def test_task_specs_round_trip_exactly(spec: TaskSpec) -> None:
    options = encode_task_options(spec)
    assert decode_task_spec(spec.pool, spec.kind, spec.key, spec.payload, options) == spec


def test_a_default_spec_stores_an_empty_object() -> None:
    assert encode_task_options(TaskSpec("default", "job", b"")) == "{}"


@given(
    st.builds(
        ScheduleSpec,
        name=text,
        cron=text,
        timezone=text,
        template=st.builds(
            TaskTemplate,
            pool=text,
            kind=text,
            payload=st.binary(max_size=32),
            tags=st.lists(text, max_size=3).map(tuple),
            priority=st.integers(-100, 100),
            retry=retries,
            timeout_ns=maybe_ns,
        ),
        overlap=st.sampled_from(OverlapPolicy),
        catch_up=st.sampled_from(CatchUpPolicy),
        grace_ns=st.integers(0, 10**12),
    )
)
def test_schedule_specs_round_trip_exactly(spec: ScheduleSpec) -> None:
    assert decode_schedule_spec(spec.name, encode_schedule_spec(spec)) == spec


@pytest.mark.parametrize(
    "options",
    [
        "not json",
        "[]",
        '{"tags": "abc"}',
        '{"priority": "high"}',
        '{"priority": true}',
        '{"retry": [1, 2]}',
        '{"retry": [0, 1, 2.0, 3, 0.1]}',
        '{"miss_policy": "sometimes"}',
        '{"after": ["x"]}',
    ],
)
def test_malformed_task_options_raise_value_error(options: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError: the store quarantines it
        decode_task_spec("default", "job", None, b"", options)


@pytest.mark.parametrize(
    ("pool", "payload", "options"),
    [(None, b"", "{}"), ("default", "text", "{}"), ("default", b"", None)],
)
def test_malformed_columns_raise_value_error(
    pool: object, payload: object, options: object
) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        decode_task_spec(pool, "job", None, payload, options)


@pytest.mark.parametrize("text_", ["{}", "[]", '{"cron": 5}', "{", '{"payload": "***"}'])
def test_malformed_schedules_raise_value_error(text_: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        decode_schedule_spec("s", text_)
