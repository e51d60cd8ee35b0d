"""Golden traces of the engine: seeded random histories whose every output was recorded.

Each history drives :class:`cronoq._engine.Engine` the way the driver does (group commit into a
``MemoryCluster``, release after commit, rebuilds after failed and late-landing commits, crashes
under a new epoch, pruning) with inputs drawn from a seeded ``random.Random``: submissions with
every option, reports, heartbeats, cancels, waits, reads, withdrawals, worker slot offers and
schedules in time zones around their DST changes. Every ``StepResult``, every recovered state
and the engine's final counters are serialised, one JSON line per history.

The recorded lines (``data/engine_golden.jsonl.xz``) were produced by the engine before it was
split into rooms (issue 18); the split engine must reproduce them byte for byte. Regenerate only
for a deliberate behaviour change, and say so in the commit:

    uv run python packages/cronoq/tests/test_engine_golden.py --write
"""

from __future__ import annotations

import dataclasses
import enum
import json
import lzma
import random
import sys
from dataclasses import MISSING
from pathlib import Path

import pytest

from cronoq._engine import (
    AddSchedule,
    AttemptFailed,
    AttemptReport,
    AttemptSucceeded,
    AttemptToken,
    CancelTask,
    Engine,
    EngineConfig,
    GetTask,
    GetTaskByKey,
    Heartbeat,
    InFlight,
    Input,
    ListSchedules,
    ListTasks,
    OfferSlots,
    PauseSchedule,
    PoolConfig,
    RemoveSchedule,
    ResumeSchedule,
    StepResult,
    SubmitTasks,
    WaitTask,
    WithdrawAttempts,
)
from cronoq._memory import MemoryCluster
from cronoq._metrics import Counters
from cronoq._model import (
    NS_PER_S,
    CatchUpPolicy,
    MissPolicy,
    OverlapPolicy,
    RetryPolicy,
    ScheduleSpec,
    Status,
    TaskSpec,
    TaskTemplate,
)
from cronoq._mutations import Mutation, OccurrenceRecorded
from cronoq.store import RecoveredState, TimeBase

DATA = Path(__file__).parent / "data" / "engine_golden.jsonl.xz"
HISTORIES = 200
TURNS = 60

MS = 1_000_000
S = NS_PER_S
NEVER_AUTO_PRUNE_NS = 200 * 366 * 24 * 3600 * S
"""``MemoryCluster.apply`` prunes against the real clock; this long a keep_finished disables it,
so only the histories' own prune turns (on their fake clock) prune."""

# Instants one minute before a DST change (UTC): Paris forward and back, New York forward and
# back, Lord Howe's half-hour step back.
STARTS = (
    1711846740 * S,  # 2024-03-31 00:59 UTC
    1729990740 * S,  # 2024-10-27 00:59 UTC
    1710053940 * S,  # 2024-03-10 06:59 UTC
    1730613540 * S,  # 2024-11-03 05:59 UTC
    1712415540 * S,  # 2024-04-06 14:59 UTC
)
ZONES = ("Europe/Paris", "America/New_York", "UTC", "Australia/Lord_Howe", "Nowhere/Zone")
CRONS = ("* * * * * *", "*/7 * * * * *", "*/2 * * * *", "30 2 * * *", "0 3 * * sun", "not a cron")
KEYS = ("k1", "k2", "k3")
POOL_NAMES = ("a", "a", "b", "r", "r")


class Reply:
    """A caller: its number names it in the trace (the engine keys waiters by identity)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class Plain:
    """Turns values into JSON naming every field not at its default, with no address or module
    in it. A task spec is written out once per history and then named by its number (traces
    stay small)."""

    def __init__(self) -> None:
        self.specs: dict[TaskSpec, int] = {}

    def __call__(self, value: object) -> object:
        if isinstance(value, enum.Enum):
            return f"{type(value).__name__}.{value.name}"
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float):
            return repr(value)
        if isinstance(value, bytes):
            return "b:" + value.hex()
        if isinstance(value, Reply):
            return f"R{value.n}"
        if isinstance(value, TaskSpec):
            number = self.specs.get(value)
            if number is not None:
                return f"spec{number}"
            self.specs[value] = len(self.specs)
        if isinstance(value, BaseException):
            extra = {name: self(v) for name, v in sorted(vars(value).items())}
            return {"!": type(value).__name__, "message": str(value), **extra}
        if isinstance(value, Counters):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            histogram = fields.pop("start_delay")
            fields.pop("occurrences")  # added with the occurrence ledger (issue 32)
            return {**{k: self(v) for k, v in fields.items()}, "start_delay": histogram.counts}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            # A field at its default is left out: a new optional field changes no trace. (No
            # pool paused is an empty frozenset equal to the default, not the same object.)
            if isinstance(value, StepResult):  # the ledger's records came after the recording
                kept: list[Mutation] = [
                    m for m in value.mutations if not isinstance(m, OccurrenceRecorded)
                ]
                value = dataclasses.replace(value, mutations=kept)
            shown = {
                f.name: self(v)
                for f in dataclasses.fields(value)
                if (v := getattr(value, f.name)) is not f.default or f.default is MISSING
            }
            if isinstance(value, RecoveredState) and not value.paused_pools:
                shown.pop("paused_pools", None)
            if isinstance(value, InFlight) and not value.lanes:  # added with limits
                shown.pop("lanes", None)
            return {"!": type(value).__name__, **shown}
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        if isinstance(value, set | frozenset):
            return sorted((self(v) for v in value), key=json.dumps)
        if isinstance(value, dict):
            return [[self(k), self(v)] for k, v in value.items()]
        raise TypeError(f"cannot serialise {type(value).__name__}")


class History:
    """One seeded history, played against the engine as the driver plays it."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lease_ids_drawn = 0
        rng = self.rng
        pools = [
            PoolConfig("a", concurrency=rng.choice([1, 2, 4])),
            PoolConfig("b", concurrency=1, max_live=rng.choice([None, 3])),
            PoolConfig("r", concurrency=3, lease_ns=rng.choice([2 * S, 5 * S])),
        ]
        self.config = EngineConfig(
            pools,
            retention_ns=rng.choice([20 * S, 60 * S]),
            max_live_tasks=rng.choice([None, None, 12]),
            seed=seed,
            lease_ids=self._lease_id,
        )
        self.cluster = MemoryCluster(NEVER_AUTO_PRUNE_NS)
        self.counters = Counters()
        self.epoch = 1
        self.now = rng.choice(STARTS) + rng.randrange(0, 40) * S
        self.replies = 0
        self.ids: list[int] = []
        self.executing: dict[AttemptToken, str] = {}
        self.lease_ids: dict[AttemptToken, bytes] = {}
        self.withheld: list[AttemptToken] = []
        self.abandoned: set[AttemptToken] = set()
        self.again: list[Input] = []
        self.next_wake: int | None = None
        self.waits: list[tuple[int, Reply]] = []
        self.draining = False
        self.turns = 0
        self.trace: list[object] = []
        self.plain = Plain()
        self.engine = self.rebuild(None)

    def _lease_id(self) -> bytes:
        """Deterministic, so that the trace records them (never so outside a test)."""
        self.lease_ids_drawn += 1
        return self.lease_ids_drawn.to_bytes(16, "big")

    # --- the driver's part --------------------------------------------------------------

    def reply(self) -> Reply:
        self.replies += 1
        return Reply(self.replies)

    def rebuild(self, inflight: InFlight | None) -> Engine:
        state = self.cluster.recover(TimeBase(), self.now - self.config.retention_ns)
        self.trace.append(
            ["recover", self.epoch, self.now, self.plain(inflight), self.plain(state)]
        )
        engine, first = Engine.recover(
            self.config, self.epoch, self.now, state, inflight, self.counters
        )
        if self.draining:
            engine.stop_dispatching()
        self.trace.append(["first", self.plain(first)])
        self.commit(first)
        return engine

    def commit(self, result: StepResult) -> None:
        self.cluster.apply(result.mutations, TimeBase())
        for dispatch in result.dispatches:
            # A remote worker that left before the attempt was sent: withdrawn. (Never a local
            # pool's: the driver withholds those only while closing, and then dispatches none.)
            if dispatch.spec.pool == "r" and self.rng.random() < 0.1:
                self.withheld.append(dispatch.token)
            else:
                self.executing[dispatch.token] = dispatch.spec.pool
            if dispatch.lease_id is not None:
                self.lease_ids[dispatch.token] = dispatch.lease_id
        for token in result.expired:
            self.executing.pop(token, None)
        self.next_wake = result.next_wake_ns

    def turn(self) -> None:
        rng = self.rng
        action = rng.choices(["inputs", "crash", "prune", "waiters"], weights=[40, 1, 2, 1], k=1)[0]
        if action == "crash":
            # Remote attempts run on in their workers, which speak to the next leader.
            self.executing = {t: p for t, p in self.executing.items() if p == "r"}
            self.withheld.clear()
            self.abandoned.clear()
            self.again.clear()
            self.draining = False  # a new process
            self.epoch += 1
            self.now += rng.choice([0, S, 10 * S, 400 * S])
            self.trace.append(["crash"])
            self.engine = self.rebuild(None)
            return
        if action == "prune":
            horizon = self.now - self.config.retention_ns - rng.choice([0, 30 * S])
            self.cluster.prune(horizon)
            self.trace.append(["prune", horizon])
            return
        if action == "waiters" and self.waits and rng.random() < 0.5:
            task_id, waiter = self.waits.pop(rng.randrange(len(self.waits)))
            self.engine.drop_waiter(task_id, waiter)  # its caller gave up
            self.trace.append(["drop_waiter", task_id, self.plain(waiter)])
            return
        if action == "waiters":
            taken = self.engine.take_waiters()
            self.trace.append(["take_waiters", self.plain(taken)])
            self.again.extend(WaitTask(task_id, w) for task_id, w in taken)
            return
        if not self.draining and self.turns > TURNS - 12 and rng.random() < 0.05:
            self.draining = True  # a graceful close began: no more attempts start
            self.engine.stop_dispatching()
            self.trace.append(["stop_dispatching"])
        if self.executing and rng.random() < 0.02:
            # A close that timed out left this attempt running without a report.
            token = rng.choice(sorted(self.executing, key=lambda t: (t.task_id, t.attempt)))
            del self.executing[token]
            self.abandoned.add(token)
        self.advance()
        inputs = [*self.again, *self.inputs()]
        self.again = []
        result = self.engine.step(self.now, inputs)
        outcome = rng.choices(["ok", "lost", "landed"], weights=[14, 1, 1], k=1)[0]
        self.trace.append(["step", self.now, outcome, self.plain(result)])
        if outcome == "ok" or not result.mutations:
            self.commit(result)
            for item in inputs:
                if isinstance(item, AttemptReport):
                    self.executing.pop(item.token, None)
            return
        # The commit failed: maybe it landed. Rebuild, then apply the reports again.
        if outcome == "landed":
            self.cluster.apply(result.mutations, TimeBase())
        reports = [item for item in inputs if isinstance(item, AttemptReport)]
        for item in reports:
            self.executing.pop(item.token, None)
        mine = {t: p for t, p in self.executing.items() if t.epoch == self.epoch}
        inflight = InFlight(
            executing=mine,
            reported=frozenset(item.token for item in reports),
            abandoned=frozenset(self.abandoned),
            lease_ids={t: self.lease_ids[t] for t in mine if t in self.lease_ids},
        )
        waiters = self.engine.take_waiters()
        self.engine = self.rebuild(inflight)
        self.again = [*reports, *(WaitTask(t, w) for t, w in waiters)]

    def advance(self) -> None:
        rng = self.rng
        choice = rng.choice(["none", "small", "wake", "wake", "second", "minute", "hour"])
        if choice == "small":
            self.now += rng.choice([MS, 300 * MS])
        elif choice == "wake" and self.next_wake is not None:
            self.now = max(self.now, self.next_wake)
        elif choice == "second":
            self.now += rng.choice([S, 3 * S])
        elif choice == "minute":
            self.now += rng.choice([40 * S, 90 * S])
        elif choice == "hour":
            self.now += rng.choice([1800 * S, 3600 * S])

    # --- inputs ---------------------------------------------------------------------------

    def inputs(self) -> list[Input]:
        rng = self.rng
        made: list[Input] = []
        if rng.random() < 0.7:
            free = rng.choice([0, 1, 3, 8])
            groups = [(frozenset({"r"}), free)]
            if rng.random() < 0.3:
                groups.append((frozenset({"r", "a"}), rng.choice([0, 2])))
            made.append(OfferSlots(groups))
        for _ in range(rng.choice([1, 1, 2, 3])):
            made.append(self.one_input())
        return made

    def one_input(self) -> Input:
        rng = self.rng
        kind = rng.choices(
            ["submit", "report", "heartbeat", "cancel", "schedule", "read", "withdraw"],
            weights=[10, 9, 4, 2, 3, 3, 1],
            k=1,
        )[0]
        if kind == "report" and (token := self.token()) is not None:
            if rng.random() < 0.6:
                outcome: AttemptSucceeded | AttemptFailed = AttemptSucceeded(
                    rng.choice([None, b"out"])
                )
            else:
                retry_after = rng.choice([None, None, 0, 2 * S])
                outcome = AttemptFailed("boom", rng.random() < 0.85, retry_after)
            remote = token.task_id in self.ids and self.leased(token)
            received = self.now - rng.choice([0, 0, S]) if remote else None
            lease_id = self.lease_id(token) if remote else None
            return AttemptReport(token, outcome, self.reply(), remote, received, lease_id)
        if kind == "heartbeat" and (token := self.token()) is not None:
            lease_id = self.lease_id(token)
            return Heartbeat(token, self.reply(), True, self.now, lease_id)
        if kind == "cancel" and self.ids:
            target = rng.choice([*self.ids[-8:], 12345])
            return CancelTask(target, "cancelled by the history", self.reply())
        if kind == "schedule":
            return self.schedule_input()
        if kind == "read":
            return self.read_input()
        if kind == "withdraw" and self.withheld:
            tokens, self.withheld = self.withheld, []
            return WithdrawAttempts(tokens, "the history withdrew it")
        return SubmitTasks([self.spec() for _ in range(rng.choice([1, 1, 2, 5]))], self.reply())

    def lease_id(self, token: AttemptToken) -> bytes | None:
        """Its worker's lease id, or now and then an impostor's guess."""
        if self.rng.random() < 0.1:
            return bytes(16)
        return self.lease_ids.get(token)

    def leased(self, token: AttemptToken) -> bool:
        return self.executing.get(token) == "r"

    def token(self) -> AttemptToken | None:
        rng = self.rng
        if self.executing and rng.random() < 0.85:
            return rng.choice(sorted(self.executing, key=lambda t: (t.task_id, t.attempt)))
        if not self.ids:
            return None
        # A stale or forged token: another epoch, another attempt, or no such task.
        return AttemptToken(
            rng.choice([self.epoch, self.epoch - 1]),
            rng.choice([*self.ids[-5:], 999]),
            rng.choice([1, 2]),
        )

    def spec(self) -> TaskSpec:
        rng = self.rng
        now = self.now
        after: tuple[int, ...] = ()
        if self.ids and rng.random() < 0.3:
            after = tuple(rng.sample(self.ids[-10:], min(len(self.ids), rng.choice([1, 2]))))
            if rng.random() < 0.1:
                after = (*after, rng.choice([0, self.ids[-1] + 10**6]))
            elif rng.random() < 0.1:
                after = (*after, after[0])  # a parent named twice
        return TaskSpec(
            pool=rng.choice(POOL_NAMES) if rng.random() < 0.97 else "zz",
            kind=rng.choice(["mail", "sync"]),
            payload=bytes(rng.randrange(256) for _ in range(rng.randrange(4))),
            key=rng.choice([None, None, *KEYS]),
            tags=tuple(t for t in ("t1", "t2") if rng.random() < 0.3),
            name=rng.choice([None, "named"]),
            priority=rng.randint(-2, 2),
            retry=RetryPolicy(
                rng.randint(1, 4),
                rng.choice([0, 100 * MS, S]),
                rng.choice([1.0, 2.0, 3.5]),
                5 * S,
                rng.choice([0.0, 0.1, 0.5]),
            ),
            start_at_ns=rng.choice(
                [None, None, now - 120 * S, now - S, now + 500 * MS, now + 90 * S]
            ),
            miss_policy=rng.choice(list(MissPolicy)),
            grace_ns=rng.choice([0, S, 60 * S]),
            deadline_ns=rng.choice([None, None, now + S, now + 5 * S, now + 300 * S]),
            timeout_ns=rng.choice([None, 500 * MS, 2 * S, 10 * S]),
            after=after,
        )

    def schedule_input(self) -> Input:
        rng = self.rng
        name = rng.choice(["s1", "s2", "s3"])
        action = rng.choice(["add", "add", "pause", "resume", "remove"])
        if action == "pause":
            return PauseSchedule(name, self.reply())
        if action == "resume":
            return ResumeSchedule(name, self.reply())
        if action == "remove":
            return RemoveSchedule(name, self.reply())
        template = TaskTemplate(
            pool=rng.choice(["a", "r", "zz"] if rng.random() < 0.1 else ["a", "r"]),
            kind="tick",
            payload=b"t",
            tags=rng.choice([(), ("cron",)]),
            priority=rng.randint(-1, 1),
            retry=RetryPolicy(rng.randint(1, 3), 100 * MS),
            timeout_ns=rng.choice([None, S]),
        )
        spec = ScheduleSpec(
            name,
            rng.choice(CRONS),
            rng.choice(ZONES),
            template,
            overlap=rng.choice(list(OverlapPolicy)),
            catch_up=rng.choice(list(CatchUpPolicy)),
            grace_ns=rng.choice([0, 5 * S, 60 * S]),
        )
        return AddSchedule(spec, replace=rng.random() < 0.5, reply_to=self.reply())

    def read_input(self) -> Input:
        rng = self.rng
        target = rng.choice([*self.ids[-8:], 777])
        read = rng.choice(["get", "key", "wait", "wait", "list", "schedules"])
        if read == "get":
            return GetTask(target, self.reply())
        if read == "key":
            return GetTaskByKey(rng.choice(KEYS), self.reply())
        if read == "wait":
            waiter = self.reply()
            self.waits.append((target, waiter))
            return WaitTask(target, waiter, rng.choice([None, 1.5]))
        if read == "schedules":
            return ListSchedules(self.reply())
        return ListTasks(
            self.reply(),
            statuses=rng.choice([None, frozenset({Status.READY, Status.RUNNING})]),
            pool=rng.choice([None, "a", "r"]),
            kind=rng.choice([None, "mail"]),
            tag=rng.choice([None, "t1"]),
            limit=rng.choice([None, 3]),
            after=rng.choice([None, *self.ids[-3:]]),
        )

    def play(self) -> str:
        for self.turns in range(TURNS):
            self.turn()
            # Ids the store knows, for later inputs to name (never the engine's private view).
            self.ids = sorted(self.cluster.tasks)[-30:]
        engine = self.engine
        depth, running = engine.gauges()
        self.trace.append(
            [
                "end",
                engine.high_water_mark,
                engine.live_count,
                self.plain(sorted(engine.running_tokens(), key=lambda t: (t.task_id, t.attempt))),
                self.plain(depth),
                self.plain(running),
                self.plain(self.counters),
                self.plain(engine.take_waiters()),
            ]
        )
        return json.dumps(self.trace, separators=(",", ":"))


def traces() -> list[str]:
    return [History(seed).play() for seed in range(HISTORIES)]


def _recorded() -> list[str]:
    with lzma.open(DATA, "rt", encoding="utf-8") as file:
        return file.read().splitlines()


@pytest.mark.parametrize("chunk", range(10))
def test_the_engine_reproduces_the_recorded_histories(chunk: int) -> None:
    recorded = _recorded()
    assert len(recorded) == HISTORIES
    for seed in range(chunk, HISTORIES, 10):
        played = History(seed).play()
        if played != recorded[seed]:
            now, then = json.loads(played), json.loads(recorded[seed])
            first = next(
                (i for i, (a, b) in enumerate(zip(now, then, strict=False)) if a != b),
                min(len(now), len(then)),
            )
            shown_now = json.dumps(now[first] if first < len(now) else None)[:3000]
            shown_then = json.dumps(then[first] if first < len(then) else None)[:3000]
            pytest.fail(
                f"history {seed} differs at entry {first}:\n now: {shown_now}\nthen: {shown_then}"
            )


def test_a_one_nanosecond_change_of_a_rule_breaks_the_traces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The comparison is sensitive: backoffs one nanosecond longer change recorded histories."""
    recorded = _recorded()
    delay_ns = RetryPolicy.delay_ns
    monkeypatch.setattr(RetryPolicy, "delay_ns", lambda self, *args: delay_ns(self, *args) + 1)
    assert any(History(seed).play() != recorded[seed] for seed in range(5))


def test_the_histories_reach_every_corner() -> None:
    """The recorded histories exercise what they claim (a generator change cannot quietly
    stop covering a path)."""
    text = "\n".join(_recorded())
    for needle in (
        '"crash"',
        '"prune"',
        '"lost"',
        '"landed"',
        '"StaleAttempt"',
        '"CancelAttempt"',
        "was not started: the history withdrew it",
        '"HeartbeatReply"',
        '"ScheduleSaved"',
        '"ScheduleRemoved"',
        '"InvalidCron"',
        '"UnknownTimeZone"',
        '"UnknownPool"',
        '"UnknownDependency"',
        '"AdmissionRejected"',
        '"DuplicateSchedule"',
        "skipped: fixed start missed",
        "timed out after",
        "lost: its worker stopped heartbeating",
        "lost: the scheduler stopped while it ran",
        "was not started (its commit was uncertain)",
        "deadline passed during attempt",
        "dependency",
        "no attempts left",
        '"Status.SUCCEEDED"',
        '"drop_waiter"',
        '"stop_dispatching"',
        '"abandoned":[{',
        '"reason":"lease"',
        "was never started",
        "a newer attempt exists",
        '"stopped":true',
        "is unknown with this lease id",
        "was not adopted",
    ):
        assert needle in text, needle


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: test_engine_golden.py --write   (records the engine's current traces)")
    DATA.parent.mkdir(exist_ok=True)
    text = "\n".join(traces()) + "\n"
    DATA.write_bytes(lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
    print(f"wrote {HISTORIES} histories to {DATA} ({DATA.stat().st_size} bytes)")
