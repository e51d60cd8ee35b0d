"""What a store author supplies: a ``StoreHarness`` that opens instances of one cluster.

Required methods open instances and crash them. Optional hooks are backdoors into the backend
(like zarr's ``get``/``set`` test helpers) that the kit uses to test faults; a harness declares
the ones it implements in ``capabilities``, the kit skips (with the reason) the tests that need
an undeclared one, and checks that every declared one really works.
"""

from __future__ import annotations

import asyncio
import enum
import subprocess
import sys
import textwrap
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path

from cronoq.store import AttemptEnded, ScheduleRecord, Store, TaskRecord, encode_task_options

__all__ = [
    "Capability",
    "ClusterRows",
    "DatabaseCondition",
    "PendingOutboxRow",
    "StoreHarness",
    "run_in_python",
    "task_row",
]


class Capability(enum.Enum):
    UNAVAILABLE = "unavailable"
    """``set_available(instance, False)`` makes the backend fail with ``Unavailable``."""
    FAULT_MID_BATCH = "fault_mid_batch"
    """``fail_next_commit_midway(instance)`` makes the next commit fail after part of its batch."""
    CORRUPT_ROW = "corrupt_row"
    """``corrupt_task(instance, task_id)`` writes an undecodable row for that task."""
    NEWER_SCHEMA = "newer_schema"
    """``set_schema_newer(instance)`` records a schema version newer than this build."""
    PRUNE = "prune"
    """``prune(instance, horizon_unix_ns)`` deletes rows finished before the horizon."""
    SECOND_PROCESS = "second_process"
    """``run_in_other_process(code)`` runs a Python snippet opening an instance elsewhere."""
    PAUSE = "pause"
    """``pause(instance)`` freezes an instance without closing it, as SIGSTOP would: it renews
    nothing, so its leadership runs out; ``resume(instance)`` lets it run again. For stores
    whose leadership can lapse while the holder is frozen (a lease)."""
    FATAL_COMMIT = "fatal_commit"
    """``fail_commits_fatally(instance)`` makes every later commit of the instance meet a
    database error that retrying cannot fix (permission denied, a read-only or corrupt file);
    reads and leadership keep working."""
    PRIVATE_FILES = "private_files"
    """``store_directory()`` is the directory holding every file of the cluster, and only
    those: for stores that own files (they must not be readable by group or others)."""
    LATE_STATEMENT = "late_statement"
    """``hold_next_commit(instance)`` holds the statement by which the instance's next commit
    makes its batch durable in flight, before it reaches the database, and breaks the
    connection it was sent on (the commit fails as on a lost connection);
    ``release_held_commit(instance)`` then delivers that statement to the database, as the
    old connection would have, and returns once the database has run it. For stores that
    reach their database over a connection a statement can outlive (a server)."""
    SUPERSEDE = "supersede"
    """``supersede(instance)`` makes the cluster's current epoch newer than the instance's,
    as another instance's takeover would, without the instance being told: it still believes
    it leads. For stores that cannot ``PAUSE`` a leader."""
    FOREIGN_PATHS = "foreign_paths"
    """``open_at(path)`` opens an instance whose data lives at ``path`` (what a user
    configures: a file or a directory); ``foreign_files(directory)`` creates there files of
    other programs that the store could take for its own (another application's database
    of the same engine) and returns their paths. For stores that keep files: the kit points
    ``open_at`` at things the store does not own and checks it refuses them untouched."""
    EARLIER_SCHEMAS = "earlier_schemas"
    """``open_upgraded_from(version, rows)`` creates a new cluster of its own whose database
    is at an earlier schema ``version`` (one of ``earlier_schema_versions``), holding ``rows``
    as the store of that version wrote them, and opens an instance of this build on it (which
    upgrades it). For stores that migrate a schema: the kit checks that nothing written
    before an upgrade is lost by it."""
    OUTBOX = "outbox"
    """Every instance the harness opens has ``outbox``, a transactional
    ``cronoq.store.OutboxSource`` over the cluster's own outbox (the rows an ``OutboxTaken``
    deletes in its batch's transaction); ``put_outbox_row(kind, payload, options_json)`` adds a
    row to it as an application's committed transaction would and returns its id, and
    ``begin_outbox_row(...)`` writes one in an application's transaction left open
    (``PendingOutboxRow``). For stores that offer a transactional outbox; a store without one
    leaves it out (the kit checks it has none)."""
    DATABASE_CONDITIONS = "database_conditions"
    """``meet_condition(instance, condition)`` makes every later commit of the instance meet
    the error the real database raises for ``condition`` (one of ``conditions``), until
    ``lift_condition(instance)``; reads and leadership keep working where they can."""


class DatabaseCondition(enum.Enum):
    """What a database can refuse a write for; each is permanent (``StoreFatal``) or
    transient (``Unavailable``), and ``reason`` is what a fatal error must say (a regular
    expression, matched case-insensitively against the error's message)."""

    READ_ONLY = ("a read-only database or file system", True, r"read.?only")
    PERMISSION_DENIED = ("permission denied", True, r"permission|not authori[sz]ed|privilege")
    CANNOT_OPEN = ("a file that cannot be opened", True, r"open")
    BUSY = ("another writer holds a lock (busy, locked)", False, r"")
    CONNECTION_REFUSED = ("the database refuses connections", False, r"")

    def __init__(self, description: str, permanent: bool, reason: str) -> None:
        self.description = description
        self.permanent = permanent
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClusterRows:
    """What a cluster holds, row by row, in Unix nanoseconds: what the kit has a harness write
    at an earlier schema version (``open_upgraded_from``), and what it then expects to read
    back after the upgrade."""

    epoch: int
    """The epoch of the last leader (a new one's is larger)."""
    max_task_id: int
    """The id high-water mark, above every row's id (rows since pruned)."""
    tasks: tuple[TaskRecord, ...]
    """In id order, with their outputs."""
    schedules: tuple[ScheduleRecord, ...]
    pools: tuple[tuple[str, bool], ...]
    """Each pool an operator paused or resumed, and whether it is paused."""
    attempts: tuple[AttemptEnded, ...]

    def keeping(self, *, leases: bool, starts: bool, pools: bool, attempts: bool) -> ClusterRows:
        """These rows as a schema keeps them that has a place for leases, attempt starts,
        pools and attempts or not: what it lacks reads as absent (no lease, no start, no
        pool paused, no attempt)."""
        return replace(
            self,
            tasks=tuple(
                replace(
                    t,
                    lease=t.lease if leases else None,
                    started_ns=t.started_ns if starts else None,
                )
                for t in self.tasks
            ),
            pools=self.pools if pools else (),
            attempts=self.attempts if attempts else (),
        )


def task_row(record: TaskRecord) -> dict[str, object]:
    """The columns of ``record`` in the row format cronoq's SQL stores share (the names of
    ``cronoq.store.TASK_COLUMNS``, and ``finished_ns``): what a SQL store's harness writes
    for ``open_upgraded_from``, keeping the columns its schema version has."""
    lease = record.lease
    return {
        "id": record.task_id,
        "pool": record.spec.pool,
        "kind": record.spec.kind,
        "key": record.spec.key,
        "payload": record.spec.payload,
        "options": encode_task_options(record.spec),
        "status": record.status.value,
        "attempt": record.attempt,
        "message": record.message,
        "submitted_ns": record.submitted_ns,
        "updated_ns": record.updated_ns,
        "due_ns": record.due_ns,
        "finished_ns": record.finished_ns,
        "cancel_requested": record.cancel_requested,
        "output": record.output,
        "lease_epoch": None if lease is None else lease.epoch,
        "lease_hash": None if lease is None else lease.id_hash,
        "started_ns": record.started_ns,
    }


class PendingOutboxRow(ABC):
    """A row an application wrote into the outbox in a transaction it has not ended yet
    (``StoreHarness.begin_outbox_row``)."""

    @abstractmethod
    async def commit(self) -> int:
        """End the transaction with a commit; the row's id."""

    @abstractmethod
    async def rollback(self) -> None:
        """End the transaction with a rollback: the row never existed."""


class StoreHarness(ABC):
    """Opens store instances on ONE cluster that starts empty for each test.

    Several instances of one cluster are how leadership, fencing and recovery are tested: a
    crash is simulated by abandoning an instance (``crash``) and opening another one.
    """

    capabilities: frozenset[Capability] = frozenset()
    conditions: frozenset[DatabaseCondition] = frozenset()
    """With ``DATABASE_CONDITIONS``: the conditions ``meet_condition`` can produce."""
    earlier_schema_versions: tuple[int, ...] = ()
    """With ``EARLIER_SCHEMAS``: every schema version the store still upgrades from."""
    leadership_timeout: float = 5.0
    """Upper bound, in seconds, on how long a takeover may take after a crash (tests fail
    beyond it). Harnesses should configure their stores with short timings."""
    handover_timeout: float = 0.5
    """Upper bound, in seconds, on how long a waiting instance takes to lead after the leader's
    clean ``release_leadership()``. Keep it well under what a crash takes (a lease's time to
    live): then a release that does not free leadership, so that the standby leads only once
    the lease runs out, fails the kit instead of passing as a slow handover."""

    @abstractmethod
    async def open(self) -> Store:
        """A new instance on the cluster, as a new process would open it."""

    @abstractmethod
    async def crash(self, instance: Store) -> None:
        """Make ``instance`` vanish as a killed process would: nothing released or flushed.

        Afterwards another instance must be able to take over within ``leadership_timeout``
        (a lease store expires the lease; a lock store drops the lock session), and the crashed
        instance must not commit again.
        """

    async def close_all(self) -> None:  # noqa: B027 - optional hook
        """Release whatever the harness holds; called after each test."""

    # --- optional hooks (declare them in ``capabilities``) -------------------------------

    async def set_available(self, instance: Store, available: bool) -> None:
        raise NotImplementedError

    async def fail_next_commit_midway(self, instance: Store) -> None:
        raise NotImplementedError

    async def corrupt_task(self, instance: Store, task_id: int) -> None:
        raise NotImplementedError

    async def set_schema_newer(self, instance: Store) -> None:
        raise NotImplementedError

    async def prune(self, instance: Store, horizon_unix_ns: int) -> None:
        raise NotImplementedError

    async def pause(self, instance: Store) -> None:
        raise NotImplementedError

    async def resume(self, instance: Store) -> None:
        raise NotImplementedError

    async def fail_commits_fatally(self, instance: Store) -> None:
        raise NotImplementedError

    def store_directory(self) -> Path:
        raise NotImplementedError

    async def hold_next_commit(self, instance: Store) -> None:
        raise NotImplementedError

    async def release_held_commit(self, instance: Store) -> None:
        raise NotImplementedError

    async def supersede(self, instance: Store) -> None:
        raise NotImplementedError

    async def open_at(self, path: Path) -> Store:
        raise NotImplementedError

    def foreign_files(self, directory: Path) -> list[Path]:
        """None by default: the kit's own foreign paths (a directory, a text file, random
        bytes) apply to every store."""
        return []

    async def meet_condition(self, instance: Store, condition: DatabaseCondition) -> None:
        raise NotImplementedError

    async def open_upgraded_from(
        self, version: int, rows: ClusterRows
    ) -> tuple[Store, ClusterRows]:
        """A new cluster (not the harness's own: the kit calls this once per version) whose
        database is at schema ``version`` and holds ``rows`` as the store of that version wrote
        them, its own SQL or code, and an instance of this build opened on it, which upgrades
        it; returns the instance and ``rows`` as that version keeps them
        (``rows.keeping(...)``: only what it has no place for left out). ``close_all``
        releases it."""
        raise NotImplementedError

    async def lift_condition(self, instance: Store) -> None:
        raise NotImplementedError

    async def put_outbox_row(self, kind: str, payload: bytes, options_json: str) -> int:
        """Add a row to the cluster's outbox as an application would, in a transaction of its
        own that commits before this returns (not through a store instance: on a connection
        of its own, say); return the row's id. ``options_json`` is a JSON object's text,
        written as given, unchecked (as SQL can write it). Called once the cluster's first
        instance is open."""
        raise NotImplementedError

    async def begin_outbox_row(
        self, kind: str, payload: bytes, options_json: str
    ) -> PendingOutboxRow:
        """Write a row as ``put_outbox_row`` does, in a transaction left open until the
        returned row's ``commit()`` or ``rollback()`` (no store instance may see the row
        before). ``close_all`` rolls back what is still open."""
        raise NotImplementedError

    async def run_in_other_process(self, code: str) -> str:
        """Run ``code`` in another process and return what it printed.

        ``code`` is the body of an ``async def``: it may use ``asyncio`` and
        ``await open_store()``, which opens an instance of this cluster in that process.
        """
        raise NotImplementedError


async def run_in_python(open_store_source: str, code: str, timeout: float = 60.0) -> str:
    """Run ``code`` as the body of an ``async def`` in a new Python process; return its output.

    ``open_store_source`` is Python source defining ``async def open_store()`` (with its
    imports); ``asyncio`` is imported. A harness's ``run_in_other_process`` is usually this call.
    """
    script = "\n".join(
        [
            "import asyncio",
            textwrap.dedent(open_store_source),
            "async def main():",
            textwrap.indent(textwrap.dedent(code), "    ") or "    pass",
            "asyncio.run(main())",
        ]
    )
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"the other process failed:\n{result.stderr}")
    return result.stdout
