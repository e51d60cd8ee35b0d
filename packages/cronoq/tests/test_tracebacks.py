"""A failed attempt's traceback: formatted where the exception was caught, bounded, kept after
the first line of the task's message, and shown by ``TaskInfo``, ``AttemptInfo`` and the list's
``TaskSummary.error``."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronoq import (
    InvalidArgument,
    LeasedAttempt,
    MemoryStore,
    Pool,
    RemotePool,
    RetryPolicy,
    Scheduler,
    Status,
    TaskContext,
    TaskError,
)
from cronoq._tracebacks import (
    HEADER,
    MAX_TRACEBACK,
    bound_traceback,
    format_traceback,
    split_traceback,
    stored_traceback,
)

ONCE = RetryPolicy(max_attempts=1)
NOT_TEXT: Any = b"x"
TWICE = RetryPolicy(max_attempts=2, initial_ns=0, max_ns=0, jitter=0.0)


def _parse(payload: dict[str, str]) -> int:
    secret = payload["password"]
    return int(secret)  # ValueError; its message shows the value, as int() words it


def _recurse(depth: int) -> None:
    if depth == 0:
        raise RecursionError("too deep for this test")
    _recurse_again(depth - 1)  # two functions in turn: Python folds only repeats of one line


def _recurse_again(depth: int) -> None:
    _recurse(depth)


def _raised(fn: Any, *args: Any) -> BaseException:
    try:
        fn(*args)
    except Exception as exc:
        return exc
    raise AssertionError("it did not raise")


def test_a_traceback_has_the_frames_and_the_chain_but_no_local_values() -> None:
    exc = _raised(_parse, {"password": "hunter2", "user": "alice-the-operator"})
    text = format_traceback(exc)
    assert text.startswith(HEADER + "\n")
    assert "in _parse\n    return int(secret)" in text
    assert text.endswith("ValueError: invalid literal for int() with base 10: 'hunter2'")
    # A frame's local variables and arguments are not printed: only what an exception's
    # message says is there (the other value of the payload is not).
    assert "alice-the-operator" not in text


def test_a_chain_whose_first_exception_was_never_raised_still_starts_with_the_header() -> None:
    def fails() -> None:
        raise KeyError("outer") from ValueError("never raised")

    text = format_traceback(_raised(fails))
    assert text.startswith(HEADER + "\nValueError: never raised\n")
    assert text.endswith("KeyError: 'outer'")
    assert split_traceback(f"attempt 1 failed: KeyError: 'outer'\n{text}")[1] == text


def test_skip_leaves_out_the_outermost_frames_but_never_the_one_that_raised() -> None:
    exc = _raised(_parse, {"password": "x"})
    assert "in _raised" in format_traceback(exc)
    skipped = format_traceback(exc, skip=1)
    assert "in _raised" not in skipped and "in _parse" in skipped
    assert "in _parse" in format_traceback(exc, skip=99)
    for bad in (-1, True, 1.5, "1"):
        with pytest.raises(InvalidArgument, match="skip must be a non-negative int"):
            format_traceback(exc, skip=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="exc must be an exception, got str"):
        format_traceback("boom")  # type: ignore[arg-type]


def test_a_deep_recursion_is_bounded_keeping_its_first_and_last_frames() -> None:
    text = format_traceback(_raised(_recurse, 400))
    assert len(text) <= MAX_TRACEBACK
    assert text.startswith(HEADER + "\n")
    assert "characters of the traceback left out" in text
    assert text.endswith("RecursionError: too deep for this test")
    assert "in _raised" in text  # the outermost frame


@given(text=st.text(max_size=3_000), limit=st.integers(200, 2_000))
def test_bounding_keeps_a_short_traceback_and_cuts_a_long_one_to_its_limit(
    text: str, limit: int
) -> None:
    bounded = bound_traceback(text, limit)
    assert len(bounded) <= limit
    if len(text) <= limit:
        assert bounded == text
    else:  # some "left out" line joins a head and a tail of the text that make it up whole
        assert any(
            text.startswith(bounded[: m.start()])
            and text.endswith(bounded[m.end() :])
            and m.start() + int(m[1]) + len(bounded) - m.end() == len(text)
            for m in _LEFT_OUT.finditer(bounded)
        )


_LEFT_OUT = re.compile(r"\n  \.\.\. (\d+) characters of the traceback left out \.\.\.\n")


def test_a_message_without_the_header_has_no_traceback() -> None:
    assert split_traceback("attempt 1 failed: TaskError says\nTraceback is a word") == (
        "attempt 1 failed: TaskError says\nTraceback is a word",
        None,
    )
    assert stored_traceback("") == ""
    assert stored_traceback("  File x\nOops: y\n\n") == f"{HEADER}\n  File x\nOops: y"


async def test_a_failed_local_attempt_keeps_its_traceback_and_a_task_error_none() -> None:
    async def work(ctx: TaskContext, payload: Any) -> None:
        if payload == b"deliberate":
            raise TaskError("refused: bad input", retryable=False)
        _parse({"password": payload.decode()})

    async with Scheduler([Pool("default", work)], store=MemoryStore()) as sched:
        crashed = await sched.submit("job", b"x1", retry=TWICE)
        refused = await sched.submit("job", b"deliberate")
        info = await sched.wait(crashed, timeout=10)
        assert info.status is Status.FAILED
        first_line = "attempt 2 failed: ValueError: invalid literal for int() with base 10: 'x1'"
        assert info.error == first_line + "; no attempts left"
        assert info.traceback is not None
        assert info.traceback.startswith(HEADER) and "in _parse" in info.traceback
        # It starts at the function: the executor's frame that caught it is left out.
        assert info.traceback.startswith(f'{HEADER}\n  File "{__file__}"')
        assert info.message == f"{info.error}\n{info.traceback}"
        first, last = await sched.attempts(crashed)
        assert first.traceback is not None and "in _parse" in first.traceback
        assert first.message.startswith("attempt 1 failed: ValueError: ")
        assert last.message == info.message

        deliberate = await sched.wait(refused, timeout=10)
        assert deliberate.traceback is None
        assert deliberate.error == "attempt 1 failed (not retryable): refused: bad input"
        summaries = {s.task_id: s for s in await sched.list()}
        assert summaries[crashed].error == info.error
        assert summaries[refused].error == deliberate.error


async def test_a_function_run_in_a_thread_keeps_its_traceback_and_its_task_error() -> None:
    """A plain function raises in a worker thread, where its traceback is formatted."""

    def work(ctx: TaskContext, payload: Any) -> None:
        if payload == b"deliberate":
            raise TaskError("refused", retryable=False)
        _parse({"password": payload.decode()})

    async with Scheduler([Pool("default", work)], store=MemoryStore()) as sched:
        crashed = await sched.submit("job", b"y2", retry=ONCE)
        refused = await sched.submit("job", b"deliberate")
        info = await sched.wait(crashed, timeout=10)
        assert info.traceback is not None and "in work\n" in info.traceback
        assert "_executors.py" not in info.traceback
        assert info.traceback.endswith("ValueError: invalid literal for int() with base 10: 'y2'")
        deliberate = await sched.wait(refused, timeout=10)
        assert (deliberate.error, deliberate.traceback) == (
            "attempt 1 failed (not retryable): refused",
            None,
        )


async def test_a_remote_report_carries_its_traceback_a_longer_one_cut_a_non_text_one_refused() -> (
    None
):
    async with Scheduler([RemotePool("remote")], store=MemoryStore()) as sched:
        link = sched.attach(["remote"], slots=1)
        task_id = await sched.submit("job", pool="remote", retry=ONCE)
        attempt = await asyncio.wait_for(link.next(), 5)
        assert isinstance(attempt, LeasedAttempt)
        lease = attempt.lease_id
        with pytest.raises(InvalidArgument, match="traceback must be a str, got bytes"):
            await sched.report_failure(attempt.token, "E: e", lease_id=lease, traceback=NOT_TEXT)
        assert (await sched.get(task_id)).status is Status.RUNNING  # nothing applied
        # A worker in another language may send a longer stack: cut, never refused.
        remote = '  File "worker.py", line 3, in work\n' + "  at Frame.call\n" * 20_000 + "E: e\n"
        await sched.report_failure(attempt.token, "E: e", lease_id=lease, traceback=remote)
        info = await sched.get(task_id)
        assert info.error == "attempt 1 failed: E: e; no attempts left"
        assert info.traceback is not None and len(info.traceback) <= MAX_TRACEBACK
        assert info.traceback.startswith(f'{HEADER}\n  File "worker.py", line 3, in work\n')
        assert info.traceback.endswith("  at Frame.call\nE: e")
        link.close()


async def test_a_retrying_task_keeps_its_traceback_in_its_history_not_in_memory() -> None:
    """A million retrying tasks must not hold 8 KiB each: the traceback is in the row and the
    attempt's history, and the live task keeps only what happened."""
    async with Scheduler([RemotePool("remote")], store=MemoryStore()) as sched:
        link = sched.attach(["remote"], slots=1)
        later = RetryPolicy(
            max_attempts=2, initial_ns=3600 * 10**9, max_ns=3600 * 10**9, jitter=0.0
        )
        task_id = await sched.submit("job", pool="remote", retry=later)
        attempt = await asyncio.wait_for(link.next(), 5)
        assert isinstance(attempt, LeasedAttempt)
        trace = f'{HEADER}\n  File "w.py", line 1, in f\nE: e'
        await sched.report_failure(
            attempt.token, "E: e", lease_id=attempt.lease_id, traceback=trace
        )
        live = await sched.get(task_id)
        assert live.status is Status.RETRYING
        assert live.message.startswith("attempt 1 failed: E: e; retrying in ")
        assert live.traceback is None
        [ended] = await sched.attempts(task_id)
        assert (ended.description, ended.traceback) == (live.message, trace)
        link.close()


async def test_a_message_that_quotes_a_traceback_is_not_cut_there() -> None:
    """A TaskError (or a crash) whose message carries another process's traceback keeps it
    in what happened: only the traceback cronoq kept is split off."""
    quoted = f'child failed:\n{HEADER}\n  File "c.py", line 2\nOSError: x'

    async def work(ctx: TaskContext, payload: Any) -> None:
        if payload == b"meant":
            raise TaskError(quoted, retryable=False)
        raise RuntimeError(quoted)

    async with Scheduler([Pool("default", work)], store=MemoryStore()) as sched:
        meant = await sched.wait(await sched.submit("job", b"meant"), timeout=10)
        assert meant.traceback is None
        assert meant.description.endswith("OSError: x") and "\n " + HEADER in meant.description
        crashed = await sched.wait(await sched.submit("job", b"x", retry=ONCE), timeout=10)
        assert crashed.description.endswith("OSError: x; no attempts left")
        assert crashed.traceback is not None
        assert crashed.traceback.startswith(f'{HEADER}\n  File "{__file__}"')


async def test_a_cancel_reason_that_quotes_a_traceback_is_not_cut_there() -> None:
    reason = f'operator: see\n{HEADER}\n  File "x.py", line 1'
    async with Scheduler([RemotePool("remote")], store=MemoryStore()) as sched:
        task_id = await sched.submit("job", pool="remote")
        await sched.cancel(task_id, reason)
        info = await sched.get(task_id)
        assert (info.traceback, info.error) == (None, "operator: see")
        assert info.description == reason.replace(f"\n{HEADER}", f"\n {HEADER}")


@given(
    exc=st.one_of(st.none(), st.integers(), st.text(max_size=5), st.binary(max_size=5)),
    skip=st.one_of(st.integers(max_value=-1), st.floats(), st.booleans(), st.text(max_size=3)),
)
def test_format_traceback_refuses_what_is_not_an_exception_or_a_count(exc: Any, skip: Any) -> None:
    with pytest.raises(InvalidArgument):
        format_traceback(exc)
    with pytest.raises(InvalidArgument):
        format_traceback(ValueError("x"), skip=skip)
