"""``Scheduler.rerun`` (a finished task's spec as a new task, linked to it) and the outputs of
a task's parents handed to it (``TaskContext.parent_outputs``), locally and to a remote worker,
through a codec that binds outputs to their task."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest

from cronoq import (
    AdmissionRejected,
    InvalidArgument,
    JsonCodec,
    LeasedAttempt,
    MemoryStore,
    NotRetryable,
    PayloadError,
    Pool,
    RemotePool,
    RetryPolicy,
    Scheduler,
    Status,
    TaskContext,
    decode_parent_outputs,
)
from cronoq.crypto import EncryptedCodec
from cronoq.errors import TaskNotFound, Unavailable
from cronoq.store import TaskRecord

ONCE = RetryPolicy(max_attempts=1)
AGAIN = RetryPolicy(max_attempts=2, initial_ns=0, max_ns=0, jitter=0.0)


class Calls:
    """Records each call's payload and the parent outputs it was given; returns payload * 2
    (or raises when told to)."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, Mapping[int, Any]]] = []

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        self.seen.append((payload, dict(ctx.parent_outputs)))
        if payload == "fail":
            raise RuntimeError("boom")
        return None if payload is None else payload * 2


def _scheduler(calls: Calls, store: MemoryStore | None = None, **options: Any) -> Scheduler:
    pools = [Pool("default", calls, concurrency=4), Pool("small", calls, max_live=1)]
    return Scheduler(pools, store=store or MemoryStore(), codec=JsonCodec(), **options)


# --- rerun ----------------------------------------------------------------------------------


async def test_a_succeeded_task_runs_again_as_a_new_task_linked_to_it() -> None:
    calls = Calls()
    async with _scheduler(calls) as sched:
        original = await sched.submit("double", 21, tags=["t"], priority=3, key="order-1")
        first = await sched.wait(original, timeout=5)
        rerun = await sched.rerun(original)
        assert rerun > original
        again = await sched.wait(rerun, timeout=5)
        assert (again.status, again.output, again.rerun_of) == (Status.SUCCEEDED, 42, original)
        assert (again.kind, again.payload, again.tags, again.priority, again.attempt) == (
            first.kind,
            first.payload,
            first.tags,
            first.priority,
            1,
        )
        # It took the key over; the original ended as it was.
        assert (await sched.get_by_key("order-1")).task_id == rerun  # type: ignore[union-attr]
        assert (await sched.get(original)).rerun_of is None
        assert (await sched.get(original)).status is Status.SUCCEEDED
        # A rerun of the rerun links to the rerun.
        third = await sched.rerun(rerun)
        assert (await sched.wait(third, timeout=5)).rerun_of == rerun


async def test_rerun_drops_the_fixed_start_and_the_deadline_and_keeps_the_parents() -> None:
    calls = Calls()
    async with _scheduler(calls) as sched:
        parent = await sched.submit("double", 1)
        await sched.wait(parent, timeout=5)
        late = await sched.submit(
            "double", 2, start_at=timedelta(hours=1), deadline=timedelta(hours=2), after=[parent]
        )
        await sched.cancel(late)
        rerun = await sched.rerun(late)
        info = await sched.wait(rerun, timeout=5)
        assert info.status is Status.SUCCEEDED and info.after == (parent,)
        assert calls.seen[-1] == (2, {parent: 2})


async def test_rerun_is_refused_changing_nothing_when_it_could_not_run() -> None:
    calls = Calls()
    async with _scheduler(calls) as sched:
        live = await sched.submit("double", 1, start_at=timedelta(hours=1))
        with pytest.raises(NotRetryable, match="is scheduled: only a finished task"):
            await sched.rerun(live)
        failed = await sched.submit("double", "fail", retry=ONCE)
        await sched.wait(failed, timeout=5)
        child = await sched.submit("double", 1, after=[failed])
        assert (await sched.wait(child, timeout=5)).status is Status.FAILED
        with pytest.raises(NotRetryable, match=f"depends on task {failed}, which failed"):
            await sched.rerun(child)
        with pytest.raises(TaskNotFound):
            await sched.rerun(child + 1000)
        before = len(await sched.list())
        with pytest.raises(NotRetryable):
            await sched.rerun(live)
        assert len(await sched.list()) == before


async def test_rerun_of_a_task_in_a_full_pool_is_refused() -> None:
    calls = Calls()
    async with _scheduler(calls) as sched:
        done = await sched.submit("double", 1, pool="small")
        await sched.wait(done, timeout=5)
        await sched.submit("double", 1, pool="small", start_at=timedelta(hours=1))
        with pytest.raises(AdmissionRejected, match="max_live=1"):
            await sched.rerun(done)


async def test_a_rerun_whose_key_another_live_task_holds_is_refused() -> None:
    calls = Calls()
    async with _scheduler(calls) as sched:
        done = await sched.submit("double", 1, key="k")
        await sched.wait(done, timeout=5)
        await sched.pause_pool("default")
        rerun = await sched.rerun(done)  # takes the key, and waits in the paused pool
        assert (await sched.get(rerun)).status is Status.READY
        with pytest.raises(NotRetryable, match=f"key 'k' is held by live task {rerun}"):
            await sched.rerun(done)
        await sched.resume_pool("default")
        await sched.wait(rerun, timeout=5)


# --- parent outputs ---------------------------------------------------------------------------


async def test_a_child_gets_its_parents_outputs_by_id() -> None:
    calls = Calls()
    async with _scheduler(calls) as sched:
        a = await sched.submit("double", 10)
        b = await sched.submit("double", None)
        child = await sched.submit("double", 1, after=[a, b])
        await sched.wait(child, timeout=5)
        assert calls.seen[-1] == (1, {a: 20, b: None})
        # A task without parents gets none.
        assert calls.seen[0][1] == {}


async def test_a_parent_pruned_from_the_store_is_absent() -> None:
    calls = Calls()
    store = MemoryStore(keep_finished=3600)
    async with _scheduler(calls, store) as sched:
        parent = await sched.submit("double", 10)
        kept = await sched.submit("double", 5)
        await sched.wait(parent, timeout=5)
        await sched.wait(kept, timeout=5)
        store.prune(horizon_unix_ns=2**62)  # the store forgets every finished row
        assert await sched.parent_outputs([parent, kept]) == []
        child = await sched.submit("double", 1, after=[parent])
        await sched.wait(child, timeout=5)
        assert calls.seen[-1] == (1, {})


class FlakyReads(MemoryStore):
    """A store whose next lookups of tasks fail, as a store out of reach does."""

    failures = 0

    async def get_task(self, task_id: int) -> TaskRecord | None:
        if self.failures:
            self.failures -= 1
            raise Unavailable("the store is out of reach (injected)")
        return await super().get_task(task_id)


async def test_parents_that_cannot_be_read_fail_the_attempt_which_retries() -> None:
    calls = Calls()
    store = FlakyReads()
    async with _scheduler(calls, store) as sched:
        parent = await sched.submit("double", 10)
        await sched.wait(parent, timeout=5)
        store.failures = 1
        child = await sched.submit("double", 1, after=[parent], retry=AGAIN)
        info = await sched.wait(child, timeout=5)
        assert (info.status, info.attempt) == (Status.SUCCEEDED, 2)
        [first] = await sched.attempts(child)
        assert "the outputs of its parents could not be read" in first.message
        assert calls.seen[-1] == (1, {parent: 20}), "the function ran once, with them"


def _binding_codec() -> EncryptedCodec:
    return EncryptedCodec({"k": os.urandom(32)}, "k", JsonCodec())


async def test_outputs_bound_to_their_task_reach_children_and_remote_workers() -> None:
    codec = _binding_codec()
    calls = Calls()
    pools: list[Pool | RemotePool] = [Pool("default", calls), RemotePool("remote", lease=5.0)]
    async with Scheduler(pools, store=MemoryStore(), codec=codec) as sched:
        parent = await sched.submit("double", 21, key="p")
        await sched.wait(parent, timeout=5)
        local = await sched.submit("double", 1, after=[parent])
        await sched.wait(local, timeout=5)
        assert calls.seen[-1] == (1, {parent: 42})
        # A remote worker reads them from the attempt's parents, and decodes them itself.
        link = sched.attach(["remote"], slots=1, name="w")
        remote = await sched.submit("double", 2, pool="remote", after=[parent, local])
        attempt = await asyncio.wait_for(link.next(), 5)
        assert isinstance(attempt, LeasedAttempt) and attempt.after == (parent, local)
        stored = await sched.parent_outputs(attempt.after)
        assert [p.task_id for p in stored] == [parent, local]
        assert decode_parent_outputs(codec, stored) == {parent: 42, local: 2}
        # Another key's codec refuses them, naming the parent.
        with pytest.raises(PayloadError, match=f"^output of parent task {parent}: "):
            decode_parent_outputs(_binding_codec(), stored)
        await sched.report_success(attempt.token, lease_id=attempt.lease_id)
        assert (await sched.wait(remote, timeout=5)).status is Status.SUCCEEDED


async def test_parent_outputs_validates_its_input() -> None:
    async with _scheduler(Calls()) as sched:
        bad: Sequence[object]
        for bad in ([0], ["1"], [True], [2**63]):
            with pytest.raises(InvalidArgument, match=r"after|dependency id"):
                await sched.parent_outputs(bad)  # type: ignore[arg-type]
