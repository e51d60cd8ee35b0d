"""The checker of the chaos test (issue 19): a pure function over what the processes recorded.

Workers record each execution of a task function from inside it (start, end, outcome, task id,
attempt, worker pid); submitters record each call (acknowledged id, or the error with its
outcome class); the harness records the faults it injected and the life of each worker
process; the store's final contents are read once the faults stopped. :func:`check` turns
those into :class:`Verdict`: the figures, and one list of violations per invariant:

- ``lost``: an acknowledged task is missing from the store, or ended ``failed``/``cancelled``
  (nothing here cancels, and every task succeeds when run to its end). A task still live at
  the end (``ready``, ``running``, ``retrying`` ...) is not lost: it is listed in ``unfinished``
  with its status and the store's message.
- ``overlaps``: two executions of one task ran at the same time. An execution with no recorded
  end lasts until its worker process died (or forever, if the worker lived on).
- ``failover_reruns``: an execution started although the previous one of the same task either
  finished normally (the function returned), or was still running on a live worker, or was
  stopped by the worker runtime (``cancelled``) while its worker lived and nobody cancelled the
  task. Only a deliberate failure (``raised``) or a worker that died lets a task run again.
- ``unknown_unkeyed``: an un-keyed submit answered "outcome unknown" that cannot have been
  applied: its task is not in the store and no fault that can cut a call (SIGKILL, SIGSTOP,
  ``pg_terminate_backend``; not SIGTERM, whose drain answers every call) hit while it was in
  flight.
- ``not_applied_landed``: an un-keyed submit answered "not applied" whose task is in the store
  (a keyed one is submitted again with its key until acknowledged, so its task lands).
- ``phantom_successes``: a task the store says succeeded with no execution that returned.
- ``unavailable``: after a fault, no submission begun at or after it was acknowledged within
  the fault kind's limit (``Records.availability_limits``: about the store's lease and 2 s for
  a kill or a freeze, the drain timeout and 2 s for a SIGTERM, whose leader drains first), or
  within ``Records.client_share_limit`` of a replica leading again (what the clients add to a
  failover: leaving a frozen connection, finding the new leader). The figure
  ``availability_max_s`` is that time to the first acknowledgement, by fault kind.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["returned", "raised", "cancelled"]
"""How an execution of the task function ended: it returned (finished normally), raised on
purpose (a retryable failure the test asked for), or was cancelled by the worker runtime."""

Applied = Literal["not_applied", "unknown"]

LIVE = frozenset({"waiting", "scheduled", "ready", "running", "retrying"})
CUTTING_FAULTS = frozenset({"sigkill", "sigstop", "pg_terminate"})
"""Faults that may cut a call the leader had taken (and so make its outcome really unknown)."""
EPSILON = 0.05
"""Seconds of clock slack between processes' wall clocks (one host: the same clock)."""


@dataclass(frozen=True, slots=True)
class Execution:
    task_id: int
    attempt: int
    worker_pid: int
    started: float
    ended: float | None = None
    outcome: Outcome | None = None
    """None with ``ended`` None: no end was recorded (its worker died, or it still runs)."""


@dataclass(frozen=True, slots=True)
class WorkerLife:
    pid: int
    started: float
    died: float | None = None
    """None: it lived until the end of the run."""


@dataclass(frozen=True, slots=True)
class Submission:
    submitter: str
    tag: str
    """Unique per call (the task carries it as a tag), so a landed task is found by it."""
    keyed: bool
    begun: float
    ended: float
    task_id: int | None = None
    """The acknowledged id; None if the call failed."""
    error: str | None = None
    applied: Applied | None = None
    """The client's verdict of a failed call: not applied, or unknown."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    """``sigkill``, ``sigterm``, ``sigstop`` (until SIGCONT), ``pg_terminate``."""
    at: float
    until: float
    """End of the fault (SIGCONT for a SIGSTOP; ``at`` for the others)."""
    failover_s: float | None = None
    """Seconds until a replica led after it (None: none did, or it was not measured)."""


@dataclass(frozen=True, slots=True)
class FinalTask:
    task_id: int
    status: str
    attempt: int
    message: str = ""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Records:
    executions: tuple[Execution, ...]
    workers: tuple[WorkerLife, ...]
    submissions: tuple[Submission, ...]
    faults: tuple[Fault, ...]
    final: tuple[FinalTask, ...]
    cancelled_by_client: frozenset[int] = frozenset()
    availability_limits: Mapping[str, float] = field(default_factory=dict)
    """Per fault kind, the longest a fault may keep every new submission unacknowledged
    (a kind not named has no limit)."""
    client_share_limit: float | None = None
    """The longest from a replica leading after a fault to the first acknowledgement of a
    submission sent after the fault (None: no limit)."""


@dataclass
class Verdict:
    figures: dict[str, object] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    failover_reruns: list[str] = field(default_factory=list)
    unknown_unkeyed: list[str] = field(default_factory=list)
    not_applied_landed: list[str] = field(default_factory=list)
    phantom_successes: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)

    INVARIANTS = (
        "lost",
        "overlaps",
        "failover_reruns",
        "unknown_unkeyed",
        "not_applied_landed",
        "phantom_successes",
        "unavailable",
    )

    def failures(self) -> dict[str, list[str]]:
        """The violated invariants, each with its violations."""
        return {name: getattr(self, name) for name in self.INVARIANTS if getattr(self, name)}

    def report(self, limit: int = 10) -> str:
        lines = [f"{k}: {v}" for k, v in self.figures.items()]
        for name, found in self.failures().items():
            lines.append(f"VIOLATED {name} ({len(found)}):")
            lines.extend(f"  {v}" for v in found[:limit])
            if len(found) > limit:
                lines.append(f"  ... {len(found) - limit} more")
        if self.unfinished:
            lines.append(f"unfinished ({len(self.unfinished)}): {self.unfinished[:limit]}")
        return "\n".join(lines)


def check(records: Records) -> Verdict:
    verdict = Verdict()
    final = {t.task_id: t for t in records.final}
    by_tag = {tag: t for t in records.final for tag in t.tags}
    acked = {s.task_id: s for s in records.submissions if s.task_id is not None}
    _check_lost(verdict, acked, final)
    reruns = _check_executions(verdict, records, final)
    _check_submissions(verdict, records, by_tag)
    unavailable = _check_availability(verdict, records)
    _figures(verdict, records, acked, reruns)
    verdict.figures["availability_max_s"] = {
        kind: round(max(gaps), 3) for kind, gaps in sorted(unavailable.items())
    }
    verdict.figures["availability_p50_s"] = {
        kind: round(statistics.median(gaps), 3) for kind, gaps in sorted(unavailable.items())
    }
    return verdict


def _check_availability(verdict: Verdict, records: Records) -> dict[str, list[float]]:
    """Per fault kind, the seconds from each fault to the first acknowledgement of a
    submission begun at or after it. A fault never followed by one counts to the end of the
    records and violates its limit, unless the submitters stopped within its limit after it
    (a fault injected as the run ended: not measured)."""
    acks = sorted((s.begun, s.ended) for s in records.submissions if s.task_id is not None)
    end = max((s.ended for s in records.submissions), default=0.0)
    last_begun = max((s.begun for s in records.submissions), default=0.0)
    gaps: dict[str, list[float]] = defaultdict(list)
    for fault in records.faults:
        first = min((ended for begun, ended in acks if begun >= fault.at), default=None)
        limit = records.availability_limits.get(fault.kind)
        if first is None and limit is not None and fault.at + limit > last_begun:
            continue
        gap = (end if first is None else first) - fault.at
        gaps[fault.kind].append(gap)
        share = records.client_share_limit
        led = fault.failover_s
        if first is not None and share is not None and led is not None and gap - led > share:
            verdict.unavailable.append(
                f"{fault.kind} at {fault.at:.3f}: a replica led after {led:.3f} s, the first "
                f"acknowledgement of a submission sent after the fault came {gap:.3f} s after "
                f"it (the clients' share limit is {share} s)"
            )
        if first is None or (limit is not None and gap > limit):
            verdict.unavailable.append(
                f"{fault.kind} at {fault.at:.3f}: the first acknowledgement of a submission "
                f"sent after it came {'never' if first is None else f'{gap:.3f} s later'}"
                f" (limit {limit} s)"
            )
    return gaps


def _check_lost(
    verdict: Verdict, acked: Mapping[int, Submission], final: Mapping[int, FinalTask]
) -> None:
    for task_id, sub in sorted(acked.items()):
        task = final.get(task_id)
        if task is None:
            verdict.lost.append(f"task {task_id} ({sub.tag}) acknowledged, not in the store")
        elif task.status in LIVE:
            verdict.unfinished.append(f"{task_id} {task.status} ({task.message!r})")
        elif task.status != "succeeded":
            verdict.lost.append(
                f"task {task_id} ({sub.tag}) ended {task.status} after attempt "
                f"{task.attempt}: {task.message!r}"
            )


def _check_executions(verdict: Verdict, records: Records, final: Mapping[int, FinalTask]) -> int:
    died = {w.pid: (math.inf if w.died is None else w.died) for w in records.workers}
    by_task: dict[int, list[Execution]] = defaultdict(list)
    for e in records.executions:
        by_task[e.task_id].append(e)
    reruns = 0
    for task_id, runs in sorted(by_task.items()):
        runs.sort(key=lambda e: (e.started, e.attempt))
        for i, later in enumerate(runs):
            for earlier in runs[:i]:
                end = earlier.ended if earlier.ended is not None else died.get(earlier.worker_pid)
                end = math.inf if end is None else end
                if later.started + EPSILON < end:
                    verdict.overlaps.append(
                        f"task {task_id}: attempt {later.attempt} (pid {later.worker_pid}) "
                        f"started at {later.started:.3f} while attempt {earlier.attempt} "
                        f"(pid {earlier.worker_pid}, from {earlier.started:.3f}) ran until "
                        f"{_at(end)}"
                    )
            if i == 0:
                continue
            prev = runs[i - 1]
            why = _rerun_cause(prev, later, died, task_id in records.cancelled_by_client)
            if why is not None:
                reruns += 1
                verdict.failover_reruns.append(
                    f"task {task_id}: attempt {later.attempt} (pid {later.worker_pid}, at "
                    f"{later.started:.3f}) after attempt {prev.attempt} (pid "
                    f"{prev.worker_pid}) {why}"
                )
    for task in final.values():
        if task.status == "succeeded" and not any(
            e.outcome == "returned" for e in by_task.get(task.task_id, ())
        ):
            verdict.phantom_successes.append(f"task {task.task_id} succeeded, never returned")
    return reruns


def _rerun_cause(
    prev: Execution, later: Execution, died: Mapping[int, float], cancelled: bool
) -> str | None:
    """Why ``later`` should not have run after ``prev`` (None: it legitimately could)."""
    if prev.outcome == "returned":
        return f"finished normally at {_at(prev.ended)}"
    if prev.outcome == "raised":
        return None
    worker_died = died.get(prev.worker_pid, math.inf)
    if worker_died <= later.started + EPSILON:
        return None  # its worker had died: the retry is what a lost lease is for
    if prev.outcome is None:
        return "was still running on a live worker"
    if not cancelled:
        return f"was stopped by the worker runtime at {_at(prev.ended)} while its worker lived"
    return None


def _check_submissions(verdict: Verdict, records: Records, by_tag: Mapping[str, FinalTask]) -> None:
    for s in records.submissions:
        if s.task_id is not None:
            continue
        landed = by_tag.get(s.tag)
        if s.applied == "not_applied" and not s.keyed and landed is not None:
            verdict.not_applied_landed.append(
                f"{s.tag}: answered not applied ({s.error}), yet task {landed.task_id} exists"
            )
        if s.applied == "unknown" and not s.keyed and landed is None:
            cut = [
                f.kind
                for f in records.faults
                if f.kind in CUTTING_FAULTS
                and s.begun - EPSILON <= f.until
                and f.at <= s.ended + EPSILON
            ]
            if not cut:
                verdict.unknown_unkeyed.append(
                    f"{s.tag}: answered outcome unknown ({s.error}) in "
                    f"[{s.begun:.3f}, {s.ended:.3f}], not applied, no cutting fault meanwhile"
                )


def _figures(
    verdict: Verdict, records: Records, acked: Mapping[int, Submission], reruns: int
) -> None:
    errors = [s for s in records.submissions if s.task_id is None]
    failovers = sorted(f.failover_s for f in records.faults if f.failover_s is not None)
    verdict.figures = {
        "faults": dict(sorted(Counter(f.kind for f in records.faults).items())),
        "acknowledged": len(acked),
        "acknowledged_unkeyed": sum(not s.keyed for s in acked.values()),
        "executions": len(records.executions),
        "lost": len(verdict.lost),
        "unfinished": len(verdict.unfinished),
        "overlaps": len(verdict.overlaps),
        "failover_reruns": reruns,
        "failover_p50_s": round(statistics.median(failovers), 3) if failovers else None,
        "failover_max_s": round(failovers[-1], 3) if failovers else None,
        "failovers_unmeasured": sum(f.failover_s is None for f in records.faults),
        "submit_errors": dict(sorted(Counter(_error_class(s) for s in errors).items())),
        "unknown_unkeyed_unjustified": len(verdict.unknown_unkeyed),
    }


def _error_class(s: Submission) -> str:
    return f"{'keyed' if s.keyed else 'unkeyed'}:{s.applied}"


def _at(t: float | None) -> str:
    return "?" if t is None else ("the end" if math.isinf(t) else f"{t:.3f}")


_OUTCOMES: dict[str, Outcome] = {
    "returned": "returned",
    "raised": "raised",
    "cancelled": "cancelled",
}


def executions_from_lines(lines: Iterable[Mapping[str, object]]) -> list[Execution]:
    """Executions from a worker's sink lines: ``{"ev": "start"|"end", "task", "attempt",
    "pid", "t", "outcome"}`` (a start without its end stays open)."""
    open_: dict[tuple[int, int, int], Execution] = {}
    done: list[Execution] = []
    for line in lines:
        k = (int(str(line["task"])), int(str(line["attempt"])), int(str(line["pid"])))
        t = float(str(line["t"]))
        if line["ev"] == "start":
            open_[k] = Execution(k[0], k[1], k[2], t)
        else:
            begun = open_.pop(k, None)
            outcome = _OUTCOMES[str(line["outcome"])]
            started = t if begun is None else begun.started
            done.append(Execution(k[0], k[1], k[2], started, t, outcome))
    return done + list(open_.values())
