"""Limits (issue 31), rule by rule, through the pure engine with explicit times and a
MemoryCluster as its durable log; then the Scheduler's checks and reads over real stores.
The property machine (test_engine_properties.py) checks the same rules over random histories
with crashes and failovers."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

import pytest

from cronoq import (
    InvalidArgument,
    LeasedAttempt,
    Limit,
    LimitFull,
    MemoryStore,
    Pool,
    RemotePool,
    Scheduler,
    Status,
    TaskContext,
    TaskRequest,
    UnknownLimit,
)
from cronoq._engine import (
    AttemptReport,
    AttemptSucceeded,
    AttemptToken,
    CancelTask,
    Engine,
    EngineConfig,
    GetTask,
    InFlight,
    Input,
    ListLimits,
    PoolConfig,
    RetryTask,
    StepResult,
    SubmitTasks,
)
from cronoq._memory import MemoryCluster
from cronoq._model import NS_PER_S, TaskSpec
from cronoq.errors import PermissionDenied
from cronoq.store import TimeBase

S = NS_PER_S
MS = S // 1000
T0 = 1_700_000_000 * S
DAY = 24 * 3600 * S


class Log:
    """An engine whose every step is committed to a MemoryCluster, which recovery reads."""

    def __init__(self, limits: Sequence[Limit], concurrency: int = 100) -> None:
        self.config = EngineConfig(
            pools=[PoolConfig("p", concurrency)], retention_ns=3600 * S, seed=1, limits=limits
        )
        self.cluster = MemoryCluster(keep_finished_ns=7 * DAY)
        self.epoch = 1
        self.engine = Engine(self.config, self.epoch)
        self.running: dict[int, AttemptToken] = {}

    def step(self, now: int, inputs: Sequence[Input] = ()) -> StepResult:
        result = self.engine.step(now, list(inputs))
        self.cluster.apply(result.mutations, TimeBase())
        for dispatch in result.dispatches:
            self.running[dispatch.token.task_id] = dispatch.token
        return result

    def submit(self, now: int, *specs: TaskSpec) -> list[int]:
        result = self.step(now, [SubmitTasks(list(specs), "s")])
        (reply,) = [value for tag, value in result.replies if tag == "s"]
        assert isinstance(reply, list), reply
        return [r.task_id for r in reply]

    def finish(self, now: int, *task_ids: int) -> StepResult:
        reports = [
            AttemptReport(self.running.pop(i), AttemptSucceeded(None), None) for i in task_ids
        ]
        return self.step(now, reports)

    def crash(self, now: int) -> StepResult:
        """A new leader takes over: every attempt of this process is gone."""
        self.epoch += 1
        self.running.clear()
        state = self.cluster.recover(TimeBase(), now - self.config.retention_ns)
        self.engine, first = Engine.recover(self.config, self.epoch, now, state)
        self.cluster.apply(first.mutations, TimeBase())
        for dispatch in first.dispatches:
            self.running[dispatch.token.task_id] = dispatch.token
        return first

    def get(self, now: int, task_id: int) -> object:
        result = self.step(now, [GetTask(task_id, "g")])
        return result.replies[0][1]


def task(*limits: tuple[str, str | None], priority: int = 0) -> TaskSpec:
    return TaskSpec("p", "job", b"", priority=priority, limits=tuple(sorted(limits)))


def started(result: StepResult) -> list[int]:
    return [d.token.task_id for d in result.dispatches]


# --- concurrency, per key ------------------------------------------------------------------


def test_a_per_key_concurrency_limit_holds_each_key_apart() -> None:
    log = Log([Limit("tenant", concurrency=1, per_key=True)])
    a1, a2, b1 = log.submit(T0, task(("tenant", "a")), task(("tenant", "a")), task(("tenant", "b")))
    assert sorted(log.running) == [a1, b1]  # one of each key; a2 waits for a1
    assert started(log.finish(T0 + S, b1)) == []  # b's end frees b only
    assert started(log.finish(T0 + 2 * S, a1)) == [a2]


def test_a_stopped_attempt_holds_its_limit_until_it_really_ended() -> None:
    log = Log([Limit("one", concurrency=1)])
    spec = TaskSpec("p", "job", b"", timeout_ns=S, limits=(("one", None),))
    first, second = log.submit(T0, spec, spec)
    assert list(log.running) == [first]
    token = log.running[first]
    after_timeout = log.step(T0 + S)  # timed out: stopped, retried later; it may still run
    assert started(after_timeout) == [] and after_timeout.cancels
    assert started(log.step(T0 + 10 * S)) == []  # its slot is still held
    log.running[first] = token
    # Then one attempt starts: the first task's retry, ahead of the second in its lane.
    result = log.finish(T0 + 11 * S, first)
    assert [(d.token.task_id, d.token.attempt) for d in result.dispatches] == [(first, 2)]
    assert second not in log.running


# --- fairness ---------------------------------------------------------------------------------


def test_one_hot_key_does_not_delay_a_thousand_cold_keys() -> None:
    """Round-robin across keys: 10,000 waiting tasks of one key, then one task for each of
    999 others; the pool's next 1,000 starts take one task of every key."""
    log = Log([Limit("tenant", concurrency=10_000, per_key=True)], concurrency=10)
    hot = log.submit(T0, *(task(("tenant", "hot")) for _ in range(10_000)))
    cold = log.submit(T0 + 1, *(task(("tenant", f"cold-{i}")) for i in range(999)))
    starts: list[int] = []
    now = T0 + S
    while len(starts) < 1000:
        ended = list(log.running)
        result = log.finish(now, *ended)
        starts += started(result)
        now += MS
    keys = Counter("hot" if i in set(hot) else "cold" for i in starts[:1000])
    assert set(cold) <= set(starts[:1000]), "a cold key waited behind the hot one"
    assert keys == {"cold": 999, "hot": 1}


def test_a_key_out_of_its_rate_is_skipped_and_blocks_no_other() -> None:
    log = Log([Limit("api", rate=1, per=60.0, per_key=True)], concurrency=1)
    a1, a2, a3 = log.submit(T0, *(task(("api", "a")) for _ in range(3)))
    (b1,) = log.submit(T0 + 1, task(("api", "b")))
    assert list(log.running) == [a1]
    assert started(log.finish(T0 + S, a1)) == [b1]  # a is out of its rate; b goes next
    log.finish(T0 + 2 * S, b1)
    assert log.engine.step(T0 + 3 * S).next_wake_ns == T0 + 60 * S  # a's window frees then
    assert started(log.step(T0 + 60 * S)) == [a2]
    assert a3 not in log.running


def test_priorities_come_before_turns() -> None:
    log = Log([Limit("tenant", concurrency=100, per_key=True)], concurrency=1)
    low = log.submit(T0, task(("tenant", "a")), task(("tenant", "b")))
    (high,) = log.submit(T0 + 1, task(("tenant", "c"), priority=5))
    assert list(log.running) == [low[0]]  # started in the step that submitted it
    assert started(log.finish(T0 + S, low[0])) == [high]


# --- rates --------------------------------------------------------------------------------


def test_a_rate_allows_that_many_starts_in_any_window() -> None:
    log = Log([Limit("api", rate=3, per=1.0)])
    ids = log.submit(T0, *(task(("api", None)) for _ in range(10)))
    assert sorted(log.running) == ids[:3]
    assert log.engine.step(T0 + 500 * MS).dispatches == []
    result = log.step(T0 + S)
    assert started(result) == ids[3:6]
    assert result.next_wake_ns == T0 + 2 * S


def test_a_burst_spaces_the_starts_past_it() -> None:
    log = Log([Limit("api", rate=4, per=4.0, burst=2)])
    ids = log.submit(T0, *(task(("api", None)) for _ in range(6)))
    assert sorted(log.running) == ids[:2]  # the burst
    held = log.get(T0 + 1, ids[2])
    assert held.waiting_for == "limit 'api': past its burst of 2, one start per 1s"  # type: ignore[attr-defined]
    waking = [(T0 + n * S, 1) for n in (1, 2)]  # then one a second
    for at, count in waking:
        assert len(started(log.step(at))) == count


def test_a_start_that_reached_no_executor_does_not_count() -> None:
    """A commit in doubt: the rebuild puts an attempt no executor received back in its queue,
    and takes its start out of the rate window too."""
    log = Log([Limit("api", rate=1, per=60.0)])
    (first,) = log.submit(T0, task(("api", None)))
    log.running.clear()  # its dispatch was never released
    state = log.cluster.recover(TimeBase(), T0)
    _, result = Engine.recover(log.config, log.epoch, T0 + S, state, InFlight())
    assert [d.token for d in result.dispatches] == [AttemptToken(1, first, 1)]


# --- on_full --------------------------------------------------------------------------------


def test_reject_refuses_a_submission_with_no_room_and_applies_nothing() -> None:
    log = Log([Limit("solo", concurrency=1, on_full="reject")])
    log.submit(T0, task(("solo", None)))
    result = log.step(T0 + 1, [SubmitTasks([task(), task(("solo", None))], "s")])
    (reply,) = [value for tag, value in result.replies if tag == "s"]
    assert isinstance(reply, LimitFull) and not result.mutations
    assert "limit 'solo' is full: 1 running, 0 waiting, of 1" in str(reply)


def test_reject_counts_the_batch_itself() -> None:
    log = Log([Limit("pair", concurrency=2, on_full="reject")])
    result = log.step(T0, [SubmitTasks([task(("pair", None))] * 3, "s")])
    assert isinstance(result.replies[0][1], LimitFull) and not result.mutations


def test_cancel_running_cancels_the_oldest_attempt_of_the_key() -> None:
    log = Log([Limit("deploy", concurrency=1, per_key=True, on_full="cancel_running")])
    (old,) = log.submit(T0, task(("deploy", "web")))
    (other,) = log.submit(T0 + 1, task(("deploy", "db")))
    result = log.step(T0 + S, [SubmitTasks([task(("deploy", "web"))], "s")])
    new = result.replies[0][1][0].task_id  # type: ignore[index]
    assert [c.token.task_id for c in result.cancels] == [old]  # not db's
    assert started(result) == []  # the old attempt holds the slot until it ends
    record = log.get(T0 + S, old)
    assert record.cancel_requested  # type: ignore[attr-defined]
    assert "on_full=cancel_running" in record.message  # type: ignore[attr-defined]
    assert started(log.finish(T0 + 2 * S, old)) == [new]
    assert other in log.running


def test_keep_latest_replaces_the_waiting_task_of_the_key() -> None:
    log = Log([Limit("sync", concurrency=1, per_key=True, on_full="keep_latest")])
    (running,) = log.submit(T0, task(("sync", "a")))
    (waiting,) = log.submit(T0 + 1, task(("sync", "a")))
    (latest,) = log.submit(T0 + S, task(("sync", "a")))
    assert log.get(T0 + S, waiting).status is Status.CANCELLED  # type: ignore[attr-defined]
    assert started(log.finish(T0 + 2 * S, running)) == [latest]


# --- reads ----------------------------------------------------------------------------------


def test_get_says_which_limit_holds_a_ready_task() -> None:
    log = Log([Limit("tenant", concurrency=1, per_key=True)])
    _, held = log.submit(T0, task(("tenant", "a")), task(("tenant", "a")))
    record = log.get(T0 + 1, held)
    assert record.waiting_for == "limit 'tenant' key 'a': 1 of 1 running"  # type: ignore[attr-defined]
    infos = log.step(T0 + 2, [ListLimits("l", keys=5)]).replies[0][1]
    assert isinstance(infos, list)
    (info,) = infos
    assert (info.keys_in_use, info.running, info.waiting) == (1, 1, 1)
    assert [(k.key, k.running, k.waiting) for k in info.keys] == [("a", 1, 1)]


# --- takeovers -----------------------------------------------------------------------------


def test_a_new_leader_recounts_the_starts_inside_the_window() -> None:
    log = Log([Limit("api", rate=2, per=10.0)])
    first, second, third = log.submit(T0, *(task(("api", None)) for _ in range(3)))
    log.finish(T0 + S, first, second)
    result = log.crash(T0 + 2 * S)
    assert started(result) == [], "the new leader forgot two starts inside the window"
    assert log.engine.step(T0 + 3 * S).next_wake_ns == T0 + 10 * S
    assert started(log.step(T0 + 10 * S)) == [third]


def test_a_rebuild_keeps_the_limit_of_an_attempt_whose_task_left_the_rows() -> None:
    """A stopped attempt still runs while its finished task is pruned; a commit in doubt then
    rebuilds the engine: the attempt holds its limit (InFlight says which), not only its pool
    slot, or a second attempt of the key would start beside it."""
    log = Log([Limit("tenant", concurrency=1, per_key=True)])
    spec = TaskSpec("p", "job", b"", deadline_ns=T0 + S, limits=(("tenant", "a"),))
    (doomed,) = log.submit(T0, spec)
    token = log.running[doomed]
    log.step(T0 + S)  # past its deadline: failed, its attempt stopped but still running
    log.cluster.prune(T0 + 2 * DAY)
    (waiting,) = log.submit(T0 + 2 * DAY, task(("tenant", "a")))
    assert waiting not in log.running
    state = log.cluster.recover(TimeBase(), T0 + 2 * DAY - log.config.retention_ns)
    assert doomed not in {r.task_id for r in state.tasks}
    inflight = InFlight(executing={token: "p"}, lanes={token: (("tenant", "a"),)})
    _, result = Engine.recover(log.config, log.epoch, T0 + 2 * DAY + 1, state, inflight)
    assert result.dispatches == [], "a second attempt of the key started beside the first"


def test_a_recovered_task_naming_a_limit_no_longer_configured_runs_without_it() -> None:
    log = Log([Limit("gone", concurrency=1), Limit("kept", concurrency=5)])
    ids = log.submit(T0, *(task(("gone", None), ("kept", None)) for _ in range(3)))
    log.config = EngineConfig(
        pools=log.config.pools, retention_ns=3600 * S, limits=[Limit("kept", concurrency=5)]
    )
    log.crash(T0 + S)
    # The first one's attempt was lost with its leader (it retries after a backoff); the
    # other two start at once: "gone" allowed one at a time.
    assert sorted(log.running) == ids[1:]


# --- the Scheduler: checks and reads over real stores ---------------------------------------


def _pool(name: str = "default", **options: object) -> Pool:
    async def noop(ctx: TaskContext, payload: object) -> None:
        return None

    return Pool(name, noop, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("limits", "pools", "message"),
    [
        ([Limit("a", concurrency=1)] * 2, None, "limit names must be unique"),
        ([Limit("a", concurrency=1)], [_pool(limits=("b",))], "names unknown limit 'b'"),
        ([Limit("t", concurrency=1, per_key=True)], [_pool(limits=("t",))], "which is per key"),
        ([Limit("w", rate=1, per=7200.0)], None, "longer than the retention"),
        ("a", None, "limits must be a list of Limit"),
    ],
)
def test_a_scheduler_refuses_limits_it_could_not_hold(
    limits: object, pools: list[Pool] | None, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Scheduler(pools or [_pool()], limits=limits)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"concurrency": 0}, InvalidArgument, "concurrency must be between 1"),
        ({}, InvalidArgument, "bounds nothing"),
        ({"rate": 5}, InvalidArgument, "rate and per go together"),
        ({"rate": 5, "per": 1.0, "burst": 6}, InvalidArgument, "burst must be between 1 and 5"),
        ({"concurrency": 1, "on_full": "drop"}, InvalidArgument, "on_full must be one of"),
        ({"rate": 1, "per": 1.0, "on_full": "cancel_running"}, InvalidArgument, "needs a"),
    ],
)
def test_a_limit_refuses_what_bounds_nothing_or_cannot_hold(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Limit("x", **options)  # type: ignore[arg-type]


async def test_submissions_name_configured_limits_with_the_right_keys() -> None:
    limits = [Limit("tenant", concurrency=2, per_key=True), Limit("api", rate=100, per=600.0)]
    store = MemoryStore()
    async with Scheduler([_pool(limits=("api",))], store=store, limits=limits) as scheduler:
        with pytest.raises(UnknownLimit, match="unknown limit 'nope'; configured: api, tenant"):
            await scheduler.submit("job", limits={"nope": None})
        with pytest.raises(InvalidArgument, match="is per key: the task must name its key"):
            await scheduler.submit("job", limits={"tenant": None})
        with pytest.raises(InvalidArgument, match="is not per key"):
            await scheduler.submit("job", limits={"api": "k"})
        with pytest.raises(InvalidArgument, match="NUL"):
            await scheduler.submit("job", limits={"tenant": "a\x00"})
        task_id = await scheduler.submit("job", limits={"tenant": "acme"})
        (other,) = await scheduler.submit_many([TaskRequest("job")])
        done = await scheduler.wait(task_id, timeout=10)
        assert done.limits == (("api", None), ("tenant", "acme"))  # its pool's added
        assert (await scheduler.wait(other, timeout=10)).limits == (("api", None),)
        infos = {info.limit.name: info for info in await scheduler.list_limits()}
        assert infos["api"].starts == 2  # inside its window
        assert infos["tenant"].keys == ()  # both ended: a key in use by nothing is not shown
    # The limits are in the row: a new leader reads them back (every store: the kit's
    # test_limits_and_the_latest_start_round_trip_through_recovery).
    async with Scheduler(
        [_pool(limits=("api",))], store=store.connect_another(), limits=limits
    ) as scheduler:
        assert (await scheduler.get(task_id)).limits == (("api", None), ("tenant", "acme"))


async def test_a_pool_limit_holds_for_remote_and_scheduled_tasks_too() -> None:
    limits = [Limit("one", concurrency=1)]
    async with Scheduler([RemotePool("r", limits=("one",))], limits=limits) as scheduler:
        first, second = await scheduler.submit_many([TaskRequest("job", pool="r")] * 2)
        link = scheduler.attach(["r"], slots=10)
        leased = await asyncio.wait_for(link.next(), 10)
        assert isinstance(leased, LeasedAttempt) and leased.token.task_id == first
        held = await scheduler.get(second)
        assert held.waiting_for == "limit 'one': 1 of 1 running"
        await scheduler.report_success(leased.token, lease_id=leased.lease_id)
        following = await asyncio.wait_for(link.next(), 10)
        assert isinstance(following, LeasedAttempt) and following.token.task_id == second
        await scheduler.report_success(following.token, lease_id=following.lease_id)
        assert (await scheduler.wait(second, timeout=10)).status is Status.SUCCEEDED


def test_a_scoped_submitter_cannot_cancel_another_pools_task_through_a_limit() -> None:
    """A token that may submit only some kinds (cronoq-server's permissions) must not cancel,
    by on_full, a task of a kind it could not touch: refused, nothing applied."""
    log = Log([Limit("sync", concurrency=1, per_key=True, on_full="keep_latest")])
    log.submit(T0, task(("sync", "a")))  # running
    (theirs,) = log.submit(T0 + 1, task(("sync", "a")))  # waiting: kind "job"
    mine = TaskSpec("p", "mine", b"", limits=(("sync", "a"),))
    scoped = SubmitTasks([mine], "s", key_kinds=frozenset({"mine"}))
    result = log.step(T0 + 2, [scoped])
    assert isinstance(result.replies[0][1], PermissionDenied) and not result.mutations
    assert log.get(T0 + 3, theirs).status is Status.READY  # type: ignore[attr-defined]
    # Within its scope it replaces as anyone would.
    allowed = SubmitTasks([mine], "s", key_kinds=frozenset({"mine", "job"}))
    assert isinstance(log.step(T0 + 4, [allowed]).replies[0][1], list)
    assert log.get(T0 + 5, theirs).status is Status.CANCELLED  # type: ignore[attr-defined]


def test_a_retried_task_naming_a_removed_limit_runs_without_it() -> None:
    """An operator's retry rebuilds a task from its row, which may name a limit no longer
    configured: the limit is dropped (as recovery drops it), and the leader serves on."""
    log = Log([Limit("gone", concurrency=1), Limit("kept", concurrency=5)])
    (first,) = log.submit(T0, task(("gone", None), ("kept", None)))
    log.step(T0 + 1, [CancelTask(first, "stop", "c")])
    log.config = EngineConfig(
        pools=log.config.pools, retention_ns=3600 * S, limits=[Limit("kept", concurrency=5)]
    )
    log.crash(T0 + S)
    row = log.cluster.tasks[first]
    result = log.step(T0 + 2 * S, [RetryTask(first, row, "again", "r")])
    assert result.replies[0][1].spec.limits == (("kept", None),)  # type: ignore[attr-defined]
    assert [d.token.task_id for d in result.dispatches] == [first]


def test_a_task_not_ready_when_submitted_displaces_nothing() -> None:
    """A task that starts tomorrow (or after its parents) does not cancel today's attempt
    nor the tasks waiting now: only a task ready when submitted displaces."""
    log = Log(
        [
            Limit("deploy", concurrency=1, per_key=True, on_full="cancel_running"),
            Limit("sync", concurrency=1, per_key=True, on_full="keep_latest"),
        ]
    )
    (running,) = log.submit(T0, task(("deploy", "web"), ("sync", "a")))
    (waiting,) = log.submit(T0 + 1, task(("sync", "a")))
    later = TaskSpec(
        "p", "job", b"", start_at_ns=T0 + DAY, limits=(("deploy", "web"), ("sync", "a"))
    )
    result = log.step(T0 + 2, [SubmitTasks([later], "s")])
    assert result.cancels == []
    assert log.get(T0 + 3, waiting).status is Status.READY  # type: ignore[attr-defined]
    assert running in log.running


def test_a_freed_slot_brings_back_one_lane_and_the_next_if_that_one_parks_elsewhere() -> None:
    """A freed slot brings back as many parked lanes as it has room for (not all of them);
    one brought back that another limit holds parks there, and the next comes back in the
    same step, so the slot is not left idle."""
    log = Log([Limit("global", concurrency=1), Limit("tenant", concurrency=1, per_key=True)])
    (holds_x,) = log.submit(T0, task(("tenant", "x")))
    (holds_global,) = log.submit(T0 + 1, task(("global", None)))
    (behind_x,) = log.submit(T0 + 2, task(("global", None), ("tenant", "x")))
    (behind_global,) = log.submit(T0 + 3, task(("global", None), ("tenant", "z")))
    assert sorted(log.running) == [holds_x, holds_global]
    # The slot of "global" frees: its longest-parked lane is tenant x's, which x holds back.
    assert started(log.finish(T0 + S, holds_global)) == [behind_global]
    assert started(log.finish(T0 + 2 * S, holds_x)) == []  # global is full again
    assert started(log.finish(T0 + 3 * S, behind_global)) == [behind_x]


def test_a_freed_slot_does_not_wake_every_parked_lane() -> None:
    """5,000 lanes parked on a full limit: one freed slot brings back one of them, not 5,000
    that all but one would park again."""
    log = Log([Limit("global", concurrency=1), Limit("tenant", concurrency=1, per_key=True)])
    (first,) = log.submit(T0, task(("global", None)))
    log.submit(T0 + 1, *(task(("global", None), ("tenant", f"k{i}")) for i in range(5000)))
    pool = log.engine._shared.pools["p"]
    assert len(pool.parked) == 5000 and not pool.levels  # a lane per key, all behind global
    gate = log.engine._shared.gates.gates[("global", None)]
    assert gate.blocked is not None and len(gate.blocked) == 5000
    assert len(started(log.finish(T0 + S, first))) == 1
    assert len(gate.blocked) == 4999  # only the lane that started came back
