"""CodecContext and the codecs that take one (issue 29 item 3): the context's checks and its
one-to-one bytes, and the embedded Scheduler giving every payload and output its context, as
``encode_for``/``decode_for`` see them, while plain codecs keep ``encode``/``decode``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq import (
    BytesCodec,
    CodecContext,
    ContextCodec,
    JsonCodec,
    MemoryStore,
    Pool,
    RetryPolicy,
    Scheduler,
    Status,
    TaskContext,
    TaskRequest,
    binds_context,
    decode_with,
    encode_with,
)
from cronoq.errors import InvalidArgument, PayloadError


class Recording(JsonCodec):
    """JSON that records the contexts it is given and refuses a value made for another: the
    context goes into the bytes."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, CodecContext | None]] = []

    def encode_for(self, value: Any, context: CodecContext) -> bytes:
        self.seen.append(("encode", context))
        return json.dumps([context.to_bytes().hex(), value]).encode()

    def decode_for(self, data: bytes, context: CodecContext) -> Any:
        self.seen.append(("decode", context))
        made_for, value = json.loads(data)
        if made_for != context.to_bytes().hex():
            raise PayloadError("made for another context")
        return value


# --- the context ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (("result", "k", "p"), "role must be 'payload' or 'output'"),
        ((None, "k", "p"), "role must be 'payload' or 'output', got NoneType"),
        (("payload", "", "p"), "kind must not be empty"),
        (("payload", "k", 3), "pool must be a str, got int"),
        (("payload", "k\x00", "p"), "kind must not contain NUL"),
        (("payload", "k", "p\udcff"), "pool must be valid Unicode"),
        (("payload", "k", "p", b"key"), "key must be a str or None, got bytes"),
        (("payload", "k", "p", ""), "key must not be empty"),
        (("payload", "k", "p", None, 5), "a payload's CodecContext has no task_id"),
        (("output", "k", "p"), "an output's CodecContext needs its task_id"),
        (("output", "k", "p", None, 0), "needs its task_id.*out of range"),
        (("output", "k", "p", None, 2**63), "needs its task_id.*out of range"),
        (("output", "k", "p", None, True), "needs its task_id.*got bool"),
        (("output", "k", "p", None, "5"), "needs its task_id.*got str"),
    ],
)
def test_a_context_checks_its_fields(fields: tuple[Any, ...], problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        CodecContext(*fields)


TEXT = st.text(min_size=1, max_size=6).filter(
    lambda t: "\x00" not in t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t)
)
CONTEXTS = st.one_of(
    st.builds(CodecContext, st.just("payload"), TEXT, TEXT, st.none() | TEXT),
    st.builds(
        CodecContext,
        st.just("output"),
        TEXT,
        TEXT,
        st.none() | TEXT,
        st.integers(1, 2**63 - 1),
    ),
)


@settings(max_examples=300, deadline=None)
@given(first=CONTEXTS, second=CONTEXTS)
def test_two_contexts_have_the_same_bytes_only_if_they_are_equal(
    first: CodecContext, second: CodecContext
) -> None:
    assert (first.to_bytes() == second.to_bytes()) == (first == second)


def test_the_bytes_of_a_context_are_as_documented() -> None:
    assert CodecContext("payload", "ab", "p").to_bytes() == (
        b"\x01P" + b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x01p" + b"\x00" + b"\x00"
    )
    assert CodecContext("output", "k", "p", "é", 258).to_bytes() == (
        b"\x01O\x00\x00\x00\x01k\x00\x00\x00\x01p"
        + b"\x01\x00\x00\x00\x02\xc3\xa9"
        + b"\x01\x00\x00\x00\x00\x00\x00\x01\x02"
    )
    # Boundaries between fields cannot move: ("ab", "c") and ("a", "bc") differ.
    assert (
        CodecContext("payload", "ab", "c").to_bytes()
        != CodecContext("payload", "a", "bc").to_bytes()
    )


def test_which_codecs_take_a_context() -> None:
    assert binds_context(Recording()) and isinstance(Recording(), ContextCodec)
    assert not binds_context(JsonCodec()) and not binds_context(BytesCodec())
    assert not isinstance(JsonCodec(), ContextCodec)
    # A plain codec is used as before, context or not.
    context = CodecContext("payload", "k", "p")
    assert encode_with(JsonCodec(), [1], "payload", context) == b"[1]"
    assert decode_with(JsonCodec(), b"[1]", "payload", context) == [1]
    # encode_for/decode_for's errors become PayloadError naming the codec, as encode's do.
    with pytest.raises(PayloadError, match="Recording cannot encode the payload"):
        encode_with(Recording(), {1, 2}, "payload", context)
    made = encode_with(Recording(), 1, "payload", context)
    other = CodecContext("payload", "k", "q")
    with pytest.raises(PayloadError, match="made for another context"):
        decode_with(Recording(), made, "x", other)


class HalfCodec(JsonCodec):
    def encode_for(self, value: Any, context: CodecContext) -> bytes:
        return self.encode(value)


def test_a_codec_with_encode_for_but_no_decode_for_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"both encode_for.*and decode_for.*or neither"):
        Scheduler([Pool("default", echo)], codec=HalfCodec())


# --- the scheduler threads the context -----------------------------------------------------


async def echo(ctx: TaskContext, payload: Any) -> Any:
    return payload


async def test_every_payload_and_output_gets_its_tasks_context() -> None:
    codec = Recording()
    pools = [Pool("default", echo), Pool("billing", echo)]
    async with Scheduler(pools, store=MemoryStore(), codec=codec) as s:
        one = await s.submit("charge", {"n": 1}, pool="billing", key="order-1")
        two = await s.submit("plain", [2])
        many = await s.submit_many(
            [TaskRequest("bulk", 3, "billing"), TaskRequest("bulk", 4, "billing", key="b4")]
        )
        template = s.task_spec(0, "spec", None, "billing", "t-key")
        (spec_task,) = await s.submit_specs(s.payload_specs(template, [5]))
        await s.add_schedule("nightly", "0 3 * * *", kind="cron", payload=6, pool="billing")
        scheduled = await s.trigger_schedule("nightly")
        assert scheduled is not None
        nothing = await s.submit("empty")  # no payload: the codec is not called for it
        infos = {
            task_id: await s.wait(task_id, timeout=5)
            for task_id in (one, two, *many, spec_task, scheduled, nothing)
        }
    assert [info.status for info in infos.values()] == [Status.SUCCEEDED] * 7
    assert [info.output for info in infos.values()] == [{"n": 1}, [2], 3, 4, 5, 6, None]

    def payload(kind: str, pool: str, key: str | None = None) -> CodecContext:
        return CodecContext("payload", kind, pool, key)

    def output(task_id: int, kind: str, pool: str, key: str | None = None) -> CodecContext:
        return CodecContext("output", kind, pool, key, task_id)

    expected = {
        one: ("charge", "billing", "order-1"),
        two: ("plain", "default", None),
        many[0]: ("bulk", "billing", None),
        many[1]: ("bulk", "billing", "b4"),
        spec_task: ("spec", "billing", "t-key"),
        scheduled: ("cron", "billing", None),  # a schedule's tasks have no key
    }
    for task_id, (kind, pool, key) in expected.items():
        encoded = [c for op, c in codec.seen if op == "encode"]
        decoded = [c for op, c in codec.seen if op == "decode"]
        assert payload(kind, pool, key) in encoded
        assert payload(kind, pool, key) in decoded  # the executor, then wait()
        assert output(task_id, kind, pool, key) in encoded  # the executor
        assert output(task_id, kind, pool, key) in decoded  # wait()
    assert all(context is not None and context.kind != "empty" for _, context in codec.seen)


async def test_a_retried_task_decodes_its_payload_in_the_same_context() -> None:
    """Attempt 2 (a retry after a failure) and a task made live again by Scheduler.retry
    decode the payload the submitter encoded: a task's context does not change."""
    calls = 0

    async def fails_twice(ctx: TaskContext, payload: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError(f"call {calls}")
        return payload

    codec = Recording()
    retry = RetryPolicy(max_attempts=2, initial_ns=1_000_000)
    async with Scheduler([Pool("default", fails_twice)], codec=codec) as s:
        task_id = await s.submit("job", {"a": 1}, key="once", retry=retry)
        assert (await s.wait(task_id, timeout=5)).status is Status.FAILED
        await s.retry(task_id)
        info = await s.wait(task_id, timeout=5)
    assert (info.status, info.attempt, info.output) == (Status.SUCCEEDED, 3, {"a": 1})
    context = CodecContext("payload", "job", "default", "once")
    assert [c for op, c in codec.seen if op == "decode" and c == context] == [context] * 6
