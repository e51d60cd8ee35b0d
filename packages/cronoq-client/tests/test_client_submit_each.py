"""AsyncClient.submit's coalescing: the submissions that overlap a call in flight leave together
in one SubmitEach, each answered and judged as its own Submit would be. Against a real
cronoq-server (the calls counted by its /metrics), and against scripted servers for the
failures of a whole call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_client import (
    HOLD,
    MARGIN,
    NOT_DURABLE,
    PARK,
    STANDBY,
    ServerProcess,
    Start,
    client,
    scripted,
    server,
)

from cronoq.errors import SchedulerError, UnknownDependency, UnknownPool
from cronoq_client import AsyncClient
from cronoq_client.protocol import Reason, pb

__all__ = ["client", "scripted", "server"]  # fixtures

SUBMIT = "cronoq.v1.SchedulerService/Submit"
SUBMIT_EACH = "cronoq.v1.SchedulerService/SubmitEach"


async def _calls(server: ServerProcess) -> dict[str, float]:
    """The server's answered calls by method, from its /metrics."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    async with asyncio.timeout(5):
        raw = await reader.read(-1)
    writer.close()
    calls: dict[str, float] = {}
    for family in text_string_to_metric_families(raw.partition(b"\r\n\r\n")[2].decode()):
        for sample in family.samples:
            if sample.name == "cronoq_grpc_calls_total":
                method = sample.labels["method"]
                calls[method] = calls.get(method, 0) + sample.value
    return calls


def _submissions(request: pb.SubmitRequest | pb.SubmitEachRequest) -> int:
    return len(request.submissions) if isinstance(request, pb.SubmitEachRequest) else 1


async def _queued(*submits: Awaitable[int]) -> list[asyncio.Task[int]]:
    """The submits as tasks, each run up to its wait: a submit queues (or sends) before its
    first suspension, so one pass of the loop lets every one of them reach the client."""
    tasks = [asyncio.ensure_future(s) for s in submits]
    await asyncio.sleep(0)
    return tasks


# --- against a real server ------------------------------------------------------------------


@pytest.fixture
async def serving(server: ServerProcess) -> ServerProcess:
    """The server once it serves: before, its calls are refused (and retried one by one)."""
    await server.until('msg="serving" role=leading')
    return server


async def test_concurrent_submits_share_a_few_calls(
    serving: ServerProcess, client: AsyncClient
) -> None:
    ids = await asyncio.gather(*(client.submit("k", b"%d" % i) for i in range(100)))
    assert len(set(ids)) == 100
    listed = await client.list(limit=1000)
    assert sorted(t.task_id for t in listed) == sorted(ids)
    assert {bytes(t.payload) for t in [await client.get(i) for i in ids]} == {
        b"%d" % i for i in range(100)
    }
    calls = await _calls(serving)
    # The first leaves alone, the 99 that arrived while it was in flight in one SubmitEach.
    assert calls[SUBMIT] + calls[SUBMIT_EACH] <= 3, calls


async def test_a_lone_submit_goes_as_submit(serving: ServerProcess, client: AsyncClient) -> None:
    task_id = await client.submit("k")
    assert (await client.get(task_id)).kind == "k"
    calls = await _calls(serving)
    assert (calls[SUBMIT], calls[SUBMIT_EACH]) == (1, 0)


async def test_a_bad_submission_fails_only_its_caller(
    serving: ServerProcess, client: AsyncClient
) -> None:
    with pytest.raises(UnknownPool) as alone:
        await client.submit("k", pool="nope")
    with pytest.raises(UnknownDependency) as bad_alone:
        await client.submit("k", after=[2**62])
    first, *batch = await _queued(
        client.submit("k", b"first"),
        client.submit("k", b"a"),
        client.submit("k", pool="nope"),
        client.submit("k", after=[2**62]),
        client.submit("k", b"b"),
    )
    outcomes = await asyncio.gather(first, *batch, return_exceptions=True)
    assert isinstance(outcomes[0], int) and isinstance(outcomes[1], int)
    assert isinstance(outcomes[4], int)
    assert type(outcomes[2]) is UnknownPool and str(outcomes[2]) == str(alone.value)
    assert type(outcomes[3]) is UnknownDependency and str(outcomes[3]) == str(bad_alone.value)
    assert [bytes((await client.get(i)).payload) for i in outcomes if isinstance(i, int)] == [
        b"first",
        b"a",
        b"b",
    ]
    assert (await _calls(serving))[SUBMIT_EACH] == 1


async def test_a_key_repeated_in_one_call_names_one_task(
    serving: ServerProcess, client: AsyncClient
) -> None:
    first, *batch = await _queued(
        client.submit("k", b"lone"),
        client.submit("k", b"one", key="same"),
        client.submit("k", b"two", key="same"),
        client.submit("k", b"other", key="other"),
    )
    lone, one, two, other = await asyncio.gather(first, *batch)
    assert (await _calls(serving))[SUBMIT_EACH] == 1
    # As two Submits one after the other: the second finds the key held by the first.
    assert one == two != other
    assert lone not in (one, other)
    assert bytes((await client.get(one)).payload) == b"one"
    assert await client.submit("k", b"three", key="same") == one


# --- failures of a whole call, against scripted servers -------------------------------------


async def test_a_standby_answering_the_batch_is_retried_for_each(scripted: Start) -> None:
    servicer, target = await scripted(PARK, STANDBY, None)
    async with AsyncClient(target, timeout=5.0) as client:
        first, *batch = await _queued(*(client.submit("k") for _ in range(4)))
        await servicer.parked.wait()
        servicer.released.set()
        # Not applied: each, keyless, is sent again (and lands).
        assert await asyncio.gather(first, *batch) == [7] * 4
    kinds = [type(r).__name__ for r in servicer.requests]
    assert kinds[:2] == ["SubmitRequest", "SubmitEachRequest"]
    assert sum(_submissions(r) for r in servicer.requests[2:]) == 3


async def test_an_unknown_outcome_of_the_batch_is_judged_for_each(scripted: Start) -> None:
    servicer, target = await scripted(PARK, NOT_DURABLE, None)
    async with AsyncClient(target, timeout=5.0) as client:
        first, *batch = await _queued(
            client.submit("k"),
            client.submit("k", key="a"),
            client.submit("k"),
            client.submit("k", key="b"),
        )
        await servicer.parked.wait()
        servicer.released.set()
        outcomes = await asyncio.gather(first, *batch, return_exceptions=True)
    assert outcomes[0] == 7
    # Keyed: repeated, and found. Keyless: may have been applied, never sent again.
    assert outcomes[1] == 7 and outcomes[3] == 7
    unknown = outcomes[2]
    assert type(unknown) is SchedulerError and unknown.applied is None
    resent = list(servicer.requests[2:])
    assert all(
        s.task.HasField("key")
        for r in resent
        for s in (r.submissions if isinstance(r, pb.SubmitEachRequest) else [r])
    )


async def test_each_submission_answered_alone_is_judged_alone(scripted: Start) -> None:
    """A submission's own answer may say what a whole Submit call's failure says: STOPPING
    (nothing applied: sent again), NOT_DURABLE (maybe applied: raised for a keyless one)."""
    servicer, target = await scripted(PARK, None)
    servicer.each = [
        pb.SubmitResult(task_id=3),
        pb.SubmitResult(refused=pb.ReportResult(reason=Reason.STOPPING, message="stopping")),
        pb.SubmitResult(refused=pb.ReportResult(reason=Reason.NOT_DURABLE, message="unsure")),
    ]
    async with AsyncClient(target, timeout=5.0) as client:
        first, *batch = await _queued(*(client.submit("k") for _ in range(4)))
        await servicer.parked.wait()
        servicer.released.set()
        outcomes = await asyncio.gather(first, *batch, return_exceptions=True)
    assert outcomes[:3] == [7, 3, 7]  # the STOPPING one sent again, alone: a Submit
    assert type(outcomes[3]) is SchedulerError and outcomes[3].applied is None
    assert "unsure" in str(outcomes[3])
    assert [type(r).__name__ for r in servicer.requests] == [
        "SubmitRequest",
        "SubmitEachRequest",
        "SubmitRequest",
    ]


async def test_each_caller_keeps_its_own_deadline(scripted: Start) -> None:
    servicer, target = await scripted(PARK, HOLD)
    timeout = 0.5
    async with AsyncClient(target, timeout=timeout) as client:
        first, *batch = await _queued(*(client.submit("k") for _ in range(3)))
        await servicer.parked.wait()
        servicer.released.set()
        assert await first == 7
        await servicer.held.wait()  # the batch, in flight until its callers give up
        started = time.monotonic()
        outcomes = await asyncio.gather(*batch, return_exceptions=True)
        assert time.monotonic() - started < timeout + MARGIN
    for outcome in outcomes:
        assert type(outcome) is SchedulerError and outcome.applied is None, outcome


async def test_a_caller_that_gives_up_before_its_submission_left_sends_nothing(
    scripted: Start,
) -> None:
    servicer, target = await scripted(PARK, None)
    async with AsyncClient(target, timeout=5.0) as client:
        first, gone, kept = await _queued(
            client.submit("first"), client.submit("gone"), client.submit("kept")
        )
        await servicer.parked.wait()
        gone.cancel()
        servicer.released.set()
        assert await first == 7 and await kept == 7
        with pytest.raises(asyncio.CancelledError):
            await gone
    kinds = [
        s.task.kind
        for r in servicer.requests
        for s in (r.submissions if isinstance(r, pb.SubmitEachRequest) else [r])
    ]
    assert kinds == ["first", "kept"]


async def test_a_caller_cancelled_once_sent_leaves_the_others_their_answers(
    scripted: Start,
) -> None:
    servicer, target = await scripted(PARK, PARK)
    async with AsyncClient(target, timeout=5.0) as client:
        first, gone, kept = await _queued(*(client.submit("k") for _ in range(3)))
        await servicer.parked.wait()
        # The first released; the two that waited leave together and park in turn.
        releasing, servicer.released = servicer.released, asyncio.Event()
        servicer.parked.clear()
        releasing.set()
        assert await first == 7
        await servicer.parked.wait()
        gone.cancel()
        servicer.released.set()
        assert await kept == 7
        with pytest.raises(asyncio.CancelledError):
            await gone
    assert isinstance(servicer.requests[1], pb.SubmitEachRequest)


async def test_a_server_without_submit_each_gets_submits(scripted: Start) -> None:
    servicer, target = await scripted(PARK, None)
    servicer.knows_submit_each = False
    async with AsyncClient(target, timeout=5.0) as client:
        first, *batch = await _queued(*(client.submit("k") for _ in range(3)))
        await servicer.parked.wait()
        servicer.released.set()
        assert await asyncio.gather(first, *batch) == [7] * 3
        # From now on this connection sends every submission alone, at once.
        servicer.released.clear()
        servicer.script = [PARK]
        again = await _queued(*(client.submit("k") for _ in range(3)))
        servicer.released.set()
        assert await asyncio.gather(*again) == [7] * 3
    kinds = [type(r).__name__ for r in servicer.requests]
    assert kinds == ["SubmitRequest", "SubmitEachRequest"] + ["SubmitRequest"] * 5


async def test_the_fallback_answers_each_as_submit_would(scripted: Start) -> None:
    servicer, target = await scripted(PARK, NOT_DURABLE)
    servicer.knows_submit_each = False
    async with AsyncClient(target, timeout=5.0) as client:
        first, *batch = await _queued(*(client.submit("k") for _ in range(3)))
        await servicer.parked.wait()
        servicer.released.set()
        outcomes = await asyncio.gather(first, *batch, return_exceptions=True)
    assert outcomes[0] == 7
    for outcome in outcomes[1:]:
        assert type(outcome) is SchedulerError and outcome.applied is None


async def test_an_answer_too_large_to_receive_is_never_sent_again(scripted: Start) -> None:
    """The answer of a SubmitEach over the client's size limit: the server handled the
    submissions (here one landed), so none is sent again; a keyless one's outcome is unknown."""
    servicer, target = await scripted(PARK, None)
    refusal = pb.ReportResult(reason=Reason.STOPPING, message="x" * 5000)
    servicer.each = [pb.SubmitResult(task_id=3), pb.SubmitResult(refused=refusal)]
    async with AsyncClient(target, timeout=5.0, max_message_bytes=4096) as client:
        first, *batch = await _queued(*(client.submit("k") for _ in range(3)))
        await servicer.parked.wait()
        servicer.released.set()
        outcomes = await asyncio.gather(first, *batch, return_exceptions=True)
    assert outcomes[0] == 7
    for outcome in outcomes[1:]:
        assert type(outcome) is SchedulerError and outcome.applied is None, outcome
        assert "too large" in str(outcome)
    assert [type(r).__name__ for r in servicer.requests] == ["SubmitRequest", "SubmitEachRequest"]


async def test_a_submission_queued_on_a_retired_connection_goes_on_the_current_one(
    scripted: Start,
) -> None:
    """Another call retired the connection a queued submission was bound to (a failover): the
    closing channel refuses it unsent, and it is sent on the current connection, not failed
    as if the client were closed."""
    servicer, target = await scripted(PARK, None)
    async with AsyncClient(target, timeout=5.0) as client:
        first, queued = await _queued(client.submit("k", key="first"), client.submit("k"))
        await servicer.parked.wait()
        client._channels.replace(client._channels.current())  # white box: as a failed call does
        await asyncio.sleep(0)  # the old channel starts closing, its call still in flight
        servicer.released.set()
        assert await first == 7
        assert await queued == 7
    assert len(servicer.requests) == 2
    assert servicer.peers[0] != servicer.peers[1]  # a new connection


def test_the_codes_of_rebuilt_answers() -> None:
    from cronoq_client._status import rpc_error_of

    stopping = rpc_error_of(pb.ReportResult(reason=Reason.STOPPING, message="m"))
    assert stopping.code() is grpc.StatusCode.UNAVAILABLE and stopping.details() == "m"
    pool = rpc_error_of(pb.ReportResult(reason=Reason.UNKNOWN_POOL, message="m"))
    assert pool.code() is grpc.StatusCode.INVALID_ARGUMENT
    newer = rpc_error_of(pb.ReportResult(reason="FROM_THE_FUTURE", message="m"))
    assert newer.code() is grpc.StatusCode.UNKNOWN
