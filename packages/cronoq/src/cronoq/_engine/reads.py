"""Reads of the task table: get, wait, list, dependants, and ``explain`` (what holds a task
now). They change nothing but the waiters; every rule they report lives in another room."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import replace
from datetime import UTC, datetime

from cronoq._engine.attempts import Attempts
from cronoq._engine.dispatch import Dispatcher
from cronoq._engine.inputs import ListTasks
from cronoq._engine.outputs import TaskSummary
from cronoq._engine.state import Shared, Task, seconds
from cronoq._engine.tasks import Tasks
from cronoq._explain import Explanation, Hold
from cronoq._model import NS_PER_S, Status
from cronoq.errors import CronoqError, TaskNotFound
from cronoq.store import TaskRecord

__all__ = ["Reads"]


def _utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / NS_PER_S, UTC)


class Reads:
    def __init__(
        self, shared: Shared, tasks: Tasks, attempts: Attempts, dispatcher: Dispatcher
    ) -> None:
        self.shared = shared
        self.tasks = tasks
        self.attempts = attempts
        self.dispatcher = dispatcher

    def get(self, task_id: int) -> TaskRecord | TaskSummary | CronoqError:
        task = self.shared.tasks.get(task_id)
        if task is not None:
            record = task.record()
            waiting_for = self._waiting_for(task)
            return record if waiting_for is None else replace(record, waiting_for=waiting_for)
        quarantined = self.tasks.quarantined.get(task_id)
        if quarantined is not None:
            return quarantined
        done = self.tasks.finished.get(task_id)
        if done is not None:
            return done
        return TaskNotFound(f"no task {task_id}")

    def _waiting_for(self, task: Task) -> str | None:
        """The limit that holds a ready task back now, if one does."""
        if task.status is not Status.READY or not task.spec.limits:
            return None
        return self.shared.gates.describe_wait(task.spec.limits, self.shared.now)

    def dependants(self, task_id: int) -> list[int] | CronoqError:
        """The ids of the tasks that depend on this one, ascending, as far as memory knows:
        see ``Tasks.dependents``. A finished task inside the retention window answers with
        those its live life had (none after a recovery: recovery links a live task only to
        its live parents)."""
        tasks = self.tasks
        if task_id not in self.shared.tasks and task_id not in tasks.finished:
            return TaskNotFound(f"no task {task_id}")
        found = tasks.dependents.get(task_id, []) + tasks.finished_dependents.get(task_id, [])
        return sorted(set(found))

    def get_by_key(self, key: str) -> TaskRecord | TaskSummary | CronoqError | None:
        task_id = self.tasks.keys.get(key)
        return None if task_id is None else self.get(task_id)

    def wait(self, task_id: int, reply_to: object) -> None:
        if task_id in self.shared.tasks:
            self.tasks.waiters.setdefault(task_id, {})[id(reply_to)] = reply_to
        else:
            self.shared.reply(reply_to, self.get(task_id))

    def list(self, query: ListTasks) -> list[TaskSummary]:
        """The matching tasks between ``after`` and ``before`` (ids excluded), in ascending id
        (submission) order, or descending with ``newest_first``, so that either bound pages
        through a stable order: filters applied to each id in turn until ``limit`` matched."""
        table = self.tasks
        listed = table.listed
        if not table.listed_sorted:
            listed.sort()  # a recovery's rows; a duplicate is skipped below
            table.listed_sorted = True
        low = bisect_right(listed, query.after) if query.after is not None else 0
        high = bisect_left(listed, query.before) if query.before is not None else len(listed)
        ids = range(high - 1, low - 1, -1) if query.newest_first else range(low, high)
        tasks = self.shared.tasks
        finished = table.finished
        limit = query.limit
        found: list[TaskSummary] = []
        previous = -1
        for index in ids:
            task_id = listed[index]
            if task_id == previous:
                continue
            previous = task_id
            task = tasks.get(task_id)
            if task is not None:
                spec = task.spec
                if not _matches(query, task.status, spec.pool, spec.kind, spec.tags):
                    continue
                summary = task.summary()
                waiting_for = self._waiting_for(task)
                if waiting_for is not None:
                    summary = replace(summary, waiting_for=waiting_for)
                found.append(summary)
            else:
                done = finished.get(task_id)
                if done is None or not _matches(
                    query, done.status, done.pool, done.kind, done.tags
                ):
                    continue  # pruned, or not wanted
                found.append(done)
            if len(found) == limit:
                break
        return found

    # --- explain ----------------------------------------------------------------------------

    def explain(self, task_id: int) -> Explanation | CronoqError:
        """What holds the task now. For a ready task: a stopped attempt first (the task waits
        for it whatever else frees), then the holds in the order dispatch meets them."""
        task = self.shared.tasks.get(task_id)
        if task is None:
            return self._ended(task_id)
        match task.status:
            case Status.WAITING:
                return self._waiting(task)
            case Status.SCHEDULED:
                start = task.spec.start_at_ns
                assert start is not None
                return self._hold(
                    task, Hold.START_TIME, f"its start time comes in {self._in(start)}", start
                )
            case Status.RETRYING:
                due = task.wake_ns
                summary = f"attempt {task.attempt} failed; the next may start in {self._in(due)}"
                return self._hold(task, Hold.RETRY_BACKOFF, summary, due)
            case Status.RUNNING:
                return self._running(task)
            case _:
                return self._ready(task)

    def _hold(
        self, task: Task, hold: Hold, summary: str, until: int | None = None, **extra: object
    ) -> Explanation:
        return Explanation(
            task.id,
            task.status,
            hold,
            summary,
            _utc(task.updated_ns),
            None if until is None else _utc(until),
            task.attempt,
            pool=task.spec.pool,
            **extra,  # type: ignore[arg-type]
        )

    def _in(self, ns: int | None) -> str:
        return "?" if ns is None else seconds(ns - self.shared.now)

    def _ended(self, task_id: int) -> Explanation | CronoqError:
        found = self.get(task_id)
        if not isinstance(found, TaskSummary | TaskRecord):
            return found
        if isinstance(found, TaskRecord):  # quarantined: its row could not be decoded
            finished, message, pool = found.updated_ns, found.message, found.spec.pool
        else:
            finished, message, pool = found.finished_ns or 0, found.error or "", found.pool
        return Explanation.finished(
            task_id, found.status, found.attempt, _utc(finished), message, pool
        )

    def _waiting(self, task: Task) -> Explanation:
        live = self.shared.tasks
        parents = tuple(sorted({p for p in task.spec.after if p in live}))
        shown = ", ".join(str(p) for p in parents[:10]) + (", ..." if len(parents) > 10 else "")
        summary = f"it waits for {len(parents)} unfinished parent(s): {shown}"
        return self._hold(task, Hold.DEPENDENCIES, summary, parents=parents)

    def _running(self, task: Task) -> Explanation:
        lease_end = self.shared.leases.get(task.id)
        if task.cancel_requested:
            return self._hold(
                task,
                Hold.CANCELLING,
                f"attempt {task.attempt} was asked to stop ({task.message}) and has not ended",
                lease_end,
            )
        where = "" if lease_end is None else f"; its lease ends in {self._in(lease_end)}"
        return self._hold(task, Hold.RUNNING, f"attempt {task.attempt} runs{where}", lease_end)

    def _ready(self, task: Task) -> Explanation:
        shared = self.shared
        spec = task.spec
        if self.attempts.stopping(task.id):  # deferred, or about to be once a slot frees
            end = self.attempts.stopped_until(task.id)
            summary = (
                f"attempt {task.attempt} was stopped but may still run on its worker; the next "
                "starts once it reports"
            ) + ("" if end is None else f" or its lease ends in {self._in(end)}")
            return self._hold(task, Hold.STOPPED_ATTEMPT, summary, end)
        pool = shared.pools[spec.pool]  # restore fails a live task of a removed pool
        if pool.paused:
            return self._hold(
                task, Hold.POOL_PAUSED, f"its pool {spec.pool!r} is paused: resume it to start"
            )
        concurrency = pool.config.concurrency
        if pool.running >= concurrency:
            return self._hold(
                task,
                Hold.POOL_FULL,
                f"its pool {spec.pool!r} is full: {pool.running} of {concurrency} running",
                running=pool.running,
                concurrency=concurrency,
            )
        gates = shared.gates
        if spec.limits and (gate := gates.blocker(spec.limits, shared.now)) is not None:
            free = gates.free_at(gate, shared.now)
            wait = gates.describe_wait(spec.limits, shared.now)
            return self._hold(
                task,
                Hold.LIMIT,
                f"{wait}" + ("" if free is None else f"; the next start in {self._in(free)}"),
                free,
                limit=gate.limit.name,
                limit_key=gate.key,
            )
        if pool.config.lease_ns is not None and not self.dispatcher.has_free_slot(spec.pool):
            return self._hold(
                task,
                Hold.NO_WORKER_SLOTS,
                f"no attached worker offers a free slot for remote pool {spec.pool!r}",
            )
        if not self.dispatcher.dispatching:
            return self._hold(
                task, Hold.LEADER_CHANGE, "the scheduler is stepping down: nothing starts here"
            )
        return self._hold(task, Hold.DISPATCHING, "nothing holds it: it starts at the next step")


def _matches(query: ListTasks, status: Status, pool: str, kind: str, tags: tuple[str, ...]) -> bool:
    return (
        (query.statuses is None or status in query.statuses)
        and (query.pool is None or pool == query.pool)
        and (query.kind is None or kind == query.kind)
        and (query.tag is None or query.tag in tags)
    )
