"""The chaos checker on hand-made records: a clean history passes, and each invariant has a
record set that must violate it (its negative control) and a near miss that must not."""

from __future__ import annotations

import dataclasses

from chaos_checker import (
    Execution,
    Fault,
    FinalTask,
    Records,
    Submission,
    WorkerLife,
    check,
    executions_from_lines,
)

W1, W2 = 101, 102
WORKERS = (WorkerLife(W1, 0.0), WorkerLife(W2, 0.0))


def _sub(tag: str, task_id: int | None, *, keyed: bool = True, at: float = 1.0) -> Submission:
    return Submission("s", tag, keyed, at, at + 0.01, task_id)


def _failed(tag: str, applied: str, *, keyed: bool = False, at: float = 10.0) -> Submission:
    return Submission("s", tag, keyed, at, at + 0.5, None, "boom", applied)  # type: ignore[arg-type]


def _done(task_id: int, tag: str, attempt: int = 1) -> FinalTask:
    return FinalTask(task_id, "succeeded", attempt, "", (tag,))


CLEAN = Records(
    executions=(
        Execution(1, 1, W1, 2.0, 5.0, "returned"),
        # A deliberate failure, then its retry: legitimate.
        Execution(2, 1, W1, 2.0, 3.0, "raised"),
        Execution(2, 2, W2, 4.0, 7.0, "returned"),
        # Its worker died mid-run (no end recorded); the retry after the death is legitimate.
        Execution(3, 1, 103, 2.0),
        Execution(3, 2, W2, 9.0, 12.0, "returned"),
        Execution(50, 1, W1, 12.0, 12.5, "returned"),
        Execution(60, 1, W2, 23.0, 23.5, "returned"),
    ),
    workers=(*WORKERS, WorkerLife(103, 0.0, died=8.0)),
    submissions=(
        _sub("a", 1),
        _sub("b", 2, keyed=False),
        _sub("c", 3),
        _failed("d", "not_applied"),
        # Unknown, but it landed: it was applied, so "unknown" was true.
        _failed("e", "unknown"),
        # Unknown, not landed, but a SIGKILL hit while it was in flight: it may have landed.
        _failed("f", "unknown", at=20.0),
        # The first acknowledgements after each fault: 1.3 s after the SIGTERM (acknowledged
        # at 11.51), 2.21 s after the SIGKILL (at 22.51).
        _sub("after-sigterm", 50, at=11.5),
        _sub("after-sigkill", 60, at=22.5),
    ),
    faults=(Fault("sigterm", 10.2, 10.2, 0.4), Fault("sigkill", 20.3, 20.3, 1.2)),
    final=(
        _done(1, "a"),
        _done(2, "b", 2),
        _done(3, "c", 2),
        FinalTask(4, "ready", 0, "", ("e",)),
        _done(50, "after-sigterm"),
        _done(60, "after-sigkill"),
    ),
    availability_limits={"sigterm": 2.0, "sigkill": 3.0},
)


def test_a_clean_history_passes_with_its_figures() -> None:
    verdict = check(CLEAN)
    assert verdict.failures() == {}, verdict.report()
    assert verdict.figures["acknowledged"] == 5
    assert verdict.figures["availability_max_s"] == {"sigkill": 2.21, "sigterm": 1.31}
    assert verdict.figures["faults"] == {"sigkill": 1, "sigterm": 1}
    assert verdict.figures["failover_p50_s"] == 0.8
    assert verdict.figures["failover_max_s"] == 1.2
    assert verdict.figures["submit_errors"] == {"unkeyed:not_applied": 1, "unkeyed:unknown": 2}


def _with(**changes: object) -> Records:
    return dataclasses.replace(CLEAN, **changes)  # type: ignore[arg-type]


def test_lost_missing_from_the_store() -> None:
    verdict = check(_with(final=CLEAN.final[1:]))
    assert set(verdict.failures()) == {"lost"}
    assert "task 1 (a) acknowledged, not in the store" in verdict.lost


def test_lost_dead_lettered() -> None:
    final = (FinalTask(1, "failed", 5, "attempt 5 lost", ("a",)), *CLEAN.final[1:])
    verdict = check(_with(final=final))
    assert set(verdict.failures()) == {"lost"}


def test_a_task_still_live_is_unfinished_not_lost() -> None:
    final = (FinalTask(1, "retrying", 2, "attempt 2 lost", ("a",)), *CLEAN.final[1:])
    verdict = check(_with(final=final))
    assert verdict.failures() == {}
    assert verdict.unfinished == ["1 retrying ('attempt 2 lost')"]


def test_overlap_of_two_executions() -> None:
    executions = (*CLEAN.executions, Execution(1, 2, W2, 4.0, 6.0, "returned"))
    verdict = check(_with(executions=executions))
    assert "overlaps" in verdict.failures()
    # It is also a re-run on a live worker (attempt 1 still ran): issue 19 item 1.
    assert "failover_reruns" in verdict.failures()


def test_overlap_with_an_execution_that_never_ended_on_a_live_worker() -> None:
    executions = (
        Execution(1, 1, W1, 2.0),
        Execution(1, 2, W2, 30.0, 33.0, "returned"),
        *CLEAN.executions[1:],
    )
    verdict = check(_with(executions=executions))
    assert len(verdict.overlaps) == 1
    assert "still running on a live worker" in verdict.failover_reruns[0]


def test_an_execution_whose_worker_died_lasts_until_the_death() -> None:
    # Attempt 1 of task 3 has no end; its worker died at 8.0.
    early = (
        *CLEAN.executions[:4],
        Execution(3, 2, W2, 7.5, 12.0, "returned"),
        *CLEAN.executions[5:],
    )
    verdict = check(_with(executions=early))
    assert len(verdict.overlaps) == 1
    assert "failover_reruns" in verdict.failures()  # it started while the worker lived
    late = (
        *CLEAN.executions[:4],
        Execution(3, 2, W2, 8.1, 12.0, "returned"),
        *CLEAN.executions[5:],
    )
    assert check(_with(executions=late)).failures() == {}


def test_rerun_after_a_normal_finish() -> None:
    executions = (*CLEAN.executions, Execution(1, 2, W2, 6.0, 9.0, "returned"))
    verdict = check(_with(executions=executions))
    assert set(verdict.failures()) == {"failover_reruns"}
    assert "finished normally" in verdict.failover_reruns[0]
    assert verdict.figures["failover_reruns"] == 1


def test_rerun_after_the_runtime_stopped_an_attempt_on_a_live_worker() -> None:
    """A stale heartbeat answer after a failover makes the worker cancel the function, which
    ends before the retry starts: no overlap, still a re-run the failover caused."""
    executions = (
        Execution(1, 1, W1, 2.0, 3.0, "cancelled"),
        Execution(1, 2, W2, 4.0, 6.0, "returned"),
        *CLEAN.executions[1:],
    )
    verdict = check(_with(executions=executions))
    assert set(verdict.failures()) == {"failover_reruns"}
    # ... unless the client asked for the cancellation.
    cancelled = _with(executions=executions, cancelled_by_client=frozenset({1}))
    assert check(cancelled).failures() == {}


def test_unknown_outcome_of_an_unkeyed_submit_that_was_not_applied() -> None:
    submissions = (*CLEAN.submissions, _failed("g", "unknown", at=30.0))
    verdict = check(_with(submissions=submissions))
    assert set(verdict.failures()) == {"unknown_unkeyed"}


def test_a_sigterm_does_not_justify_an_unknown_outcome() -> None:
    # "g" was in flight during the SIGTERM at 10.2: a graceful drain answers every call.
    submissions = (*CLEAN.submissions, _failed("g", "unknown", at=10.0))
    assert set(check(_with(submissions=submissions)).failures()) == {"unknown_unkeyed"}
    # A SIGSTOP that lasted over the call does justify it.
    faults = (*CLEAN.faults, Fault("sigstop", 9.0, 11.0))
    assert check(_with(submissions=submissions, faults=faults)).failures() == {}


def test_a_keyed_unknown_outcome_is_not_judged() -> None:
    submissions = (*CLEAN.submissions, _failed("g", "unknown", keyed=True, at=30.0))
    assert check(_with(submissions=submissions)).failures() == {}


def test_not_applied_but_landed() -> None:
    final = (*CLEAN.final, FinalTask(5, "ready", 0, "", ("d",)))
    assert set(check(_with(final=final)).failures()) == {"not_applied_landed"}


def test_phantom_success() -> None:
    final = (*CLEAN.final, FinalTask(6, "succeeded", 1, "", ("x",)))
    assert set(check(_with(final=final)).failures()) == {"phantom_successes"}


def test_unavailable_past_the_limit_of_its_fault_kind() -> None:
    verdict = check(_with(availability_limits={"sigterm": 2.0, "sigkill": 2.0}))
    assert set(verdict.failures()) == {"unavailable"}
    [found] = verdict.unavailable
    assert found.startswith("sigkill at 20.300: the first acknowledgement"), found
    assert "2.210 s later (limit 2.0 s)" in found


def test_unavailable_when_no_submission_after_a_fault_was_acknowledged() -> None:
    """Even for a kind without a limit: a fault after which nothing was acknowledged."""
    verdict = check(
        _with(availability_limits={}, faults=(*CLEAN.faults, Fault("sigstop", 30.0, 35.0)))
    )
    assert set(verdict.failures()) == {"unavailable"}
    assert verdict.unavailable == [
        "sigstop at 30.000: the first acknowledgement of a submission sent after it came never "
        "(limit None s)"
    ]


def test_unavailable_past_the_clients_share_after_a_replica_led() -> None:
    """Whatever the store's failover took, the clients add at most their share to it: the
    SIGKILL's replica led 1.2 s after it, its first acknowledgement came 2.21 s after it."""
    assert check(_with(client_share_limit=1.1)).failures() == {}
    verdict = check(_with(client_share_limit=1.0))
    assert set(verdict.failures()) == {"unavailable"}
    assert verdict.unavailable == [
        "sigkill at 20.300: a replica led after 1.200 s, the first acknowledgement of a "
        "submission sent after the fault came 2.210 s after it (the clients' share limit is "
        "1.0 s)"
    ]


def test_a_fault_as_the_submitters_stopped_is_not_measured() -> None:
    """Injected within its limit of the last submission: nothing could be acknowledged."""
    late = Fault("sigkill", 23.0, 23.0)  # the last submission began at 22.5, limit 3 s
    verdict = check(_with(faults=(*CLEAN.faults, late)))
    assert verdict.failures() == {}, verdict.report()
    assert verdict.figures["availability_max_s"] == {"sigkill": 2.21, "sigterm": 1.31}
    # Submissions went on past its limit, none acknowledged: measured, and unavailable.
    refused = _failed("refused-after", "not_applied", at=26.5)
    verdict = check(_with(faults=(*CLEAN.faults, late), submissions=(*CLEAN.submissions, refused)))
    assert set(verdict.failures()) == {"unavailable"}
    assert verdict.unavailable[0].startswith("sigkill at 23.000"), verdict.unavailable


def test_executions_from_sink_lines() -> None:
    lines = [
        {"ev": "start", "task": 1, "attempt": 1, "pid": W1, "t": 1.0},
        {"ev": "start", "task": 2, "attempt": 1, "pid": W1, "t": 1.5},
        {"ev": "end", "task": 1, "attempt": 1, "pid": W1, "t": 2.0, "outcome": "returned"},
    ]
    assert sorted(executions_from_lines(lines), key=lambda e: e.task_id) == [
        Execution(1, 1, W1, 1.0, 2.0, "returned"),
        Execution(2, 1, W1, 1.5),
    ]
