"""The simulation's own tests, on MemoryStore: a negative control, and histories it found.

Negative control: the simulation must catch the defect of issue 9 item 2 when it is put back.

The defect: after a commit that landed although the driver gave up on it, the rebuild counts
the RUNNING rows of the current epoch as lost attempts, also those whose dispatch was never
released to an executor (and the attempts still running in this process). It is reintroduced
here, in this test only, by an ``Engine.recover`` that drops what the driver tells it about the
attempts of this process: every running row counts as lost.

Found histories: a random history that fails names its steps; the deterministic ones are kept
here, so that a failure reads as one scenario and stays fixed once fixed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from cronoq import MemoryStore
from cronoq._engine import Engine
from cronoq.store import Store
from cronoq_conformance import Capability, StoreHarness
from cronoq_conformance._faults import CommitFault
from cronoq_conformance._simulation import Behaviour, SchedulerMachine


class MemoryHarness(StoreHarness):
    """test_memory_conformance's harness, cut to what a history needs."""

    capabilities = frozenset({Capability.UNAVAILABLE})
    leadership_timeout = 1.0

    def __init__(self) -> None:
        self._first = MemoryStore()
        self._opened = 0

    async def open(self) -> Store:
        self._opened += 1
        return self._first if self._opened == 1 else self._first.connect_another()

    async def crash(self, instance: Store) -> None:
        assert isinstance(instance, MemoryStore)
        instance.simulate_crash()

    async def set_available(self, instance: Store, available: bool) -> None:
        assert isinstance(instance, MemoryStore)
        instance.set_available(available)


# What the defect breaks: attempts that never ran count, attempts that ran are retried while
# they still run, successes are rejected as stale.
DEFECT_FOUND = "counted as used|two attempts at once|succeeded, yet"


@pytest.fixture
def defect_reintroduced(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Engine.__dict__["recover"].__func__

    def counts_every_running_row_as_lost(
        cls: type[Engine], config: Any, epoch: int, now_ns: int, state: Any, *_: Any, **__: Any
    ) -> Any:
        return original(cls, config, epoch, now_ns, state)

    monkeypatch.setattr(Engine, "recover", classmethod(counts_every_running_row_as_lost))


def _not_a_rule(self: SchedulerMachine, **_: Any) -> None:
    """Overrides a rule of the simulation: histories without it."""


class Machine(SchedulerMachine):
    """Histories of uncertain commits only: other defects of issue 9 (waiters, closes,
    cancellations) must not be what the negative control finds."""

    harness = MemoryHarness()
    crash_between_steps = _not_a_rule
    cancel = _not_a_rule
    close_gracefully_and_restart = _not_a_rule
    start_waiting = _not_a_rule


@pytest.mark.usefixtures("defect_reintroduced")
def test_random_histories_find_the_defect_of_a_late_commit_counted_as_lost() -> None:
    Machine.harness = MemoryHarness()
    with pytest.raises(AssertionError, match=DEFECT_FOUND):
        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=30,
                stateful_step_count=12,
                deadline=None,
                derandomize=True,
                database=None,
                phases=[Phase.generate],
                report_multiple_bugs=False,
            ),
        )


@pytest.mark.usefixtures("defect_reintroduced")
def test_a_directed_history_finds_the_defect_of_a_late_commit_counted_as_lost() -> None:
    machine = type("Directed", (SchedulerMachine,), {"harness": MemoryHarness()})()
    try:
        # One attempt: the task the late commit dispatched is dead-lettered without running.
        machine.submit_during_an_uncertain_commit(
            size=1, behaviour=Behaviour.OK, attempts=1, fault=CommitFault.LANDS_AFTER_TIMEOUT
        )
        machine.settle()
        assert any("counted as used" in v for v in machine.violations), machine.violations
    finally:
        with contextlib.suppress(AssertionError):  # the same violations, found again
            machine.teardown()


def test_the_directed_history_passes_without_the_defect() -> None:
    """The same history on the real driver: fails until issue 9 item 2 is fixed."""
    machine = type("Directed", (SchedulerMachine,), {"harness": MemoryHarness()})()
    try:
        machine.submit_during_an_uncertain_commit(
            size=1, behaviour=Behaviour.OK, attempts=1, fault=CommitFault.LANDS_AFTER_TIMEOUT
        )
        machine.settle()
        machine.no_promise_was_broken()
    finally:
        machine.teardown()


# --- histories the simulation found -------------------------------------------------------


@pytest.fixture
def machine() -> Iterator[SchedulerMachine]:
    history = type("Directed", (SchedulerMachine,), {"harness": MemoryHarness()})()
    try:
        yield history
    finally:
        if history.violations:  # the test reported them: teardown would only find them again
            with contextlib.suppress(AssertionError):
                history.teardown()
        else:
            history.teardown()


def test_a_wait_answered_by_a_step_whose_commit_failed_is_still_answered(
    machine: SchedulerMachine,
) -> None:
    # The last attempt times out in a step whose commit does not land: that step finished the
    # task and answered its waiter; the rebuild must answer it again, not drop the answer.
    machine.time_out_during_an_uncertain_commit(fault=CommitFault.LANDS_AFTER_TIMEOUT)
    machine.start_waiting(pick=0)
    machine.time_out_during_an_uncertain_commit(fault=CommitFault.UNAVAILABLE)
    machine.settle()
    machine.no_promise_was_broken()


def test_a_submit_in_flight_when_close_begins_with_the_store_down_is_answered(
    machine: SchedulerMachine,
) -> None:
    machine.close_gracefully_and_restart(timeout=0.05, during="a store outage")
    machine.no_promise_was_broken()
