"""The chaos test of issue 19 on real processes: 3 replicas on SQLite and on PostgreSQL behind
the test balancer, 2 worker processes running tasks of 2-8 s (longer than a failover),
submitters with and without keys, a fault on the leader every 2-4 s (each kind once per
cycle), and the checker's invariants over what every process recorded (see chaos.py and
chaos_checker.py).

Skipped unless ``CRONOQ_CHAOS=1``, so that the package's own test session (and a quick
``uv run pytest``) does not spend two minutes on it: the default nox session ``chaos-short``
runs it (and so ``.ci/run`` does). ``CRONOQ_CHAOS_PROFILE`` picks the profile (``short``:
about 45 s of faults per store; ``long``: 10 minutes, what ``nox -s chaos`` runs);
``CRONOQ_CHAOS_SEED`` replays one run's choices of faults and tasks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chaos import PROFILES, run_chaos
from chaos_checker import check
from server_pg import pg_schema

__all__ = ["pg_schema"]  # a fixture: requested by name

pytestmark = pytest.mark.skipif(
    os.environ.get("CRONOQ_CHAOS") != "1", reason="the chaos test runs with CRONOQ_CHAOS=1"
)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """The store's kind, and its PostgreSQL schema (a fresh one, dropped afterwards)."""
    if request.param == "sqlite":
        return "sqlite", None
    schema: str = request.getfixturevalue("pg_schema")
    return "postgres", schema


async def test_chaos(tmp_path: Path, store: tuple[str, str | None]) -> None:
    profile = PROFILES[os.environ.get("CRONOQ_CHAOS_PROFILE", "short")]
    store_kind, schema = store
    seed = os.environ.get("CRONOQ_CHAOS_SEED")
    records = await run_chaos(
        tmp_path, store_kind, profile, schema, None if seed is None else int(seed)
    )
    verdict = check(records)
    print(f"\n--- chaos {profile.name} on {store_kind} ---\n{verdict.report()}")
    assert verdict.failures() == {}, verdict.report()
