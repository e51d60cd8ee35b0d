"""Leaders as real OS processes (``pg_node.py``) under a steady submit load, killed with SIGKILL:
the kernel closes a killed process's connections, so PostgreSQL frees its advisory lock at once
and a standby leads after its next poll and its recovery."""

from __future__ import annotations

import asyncio
import time

from pg_fault_helpers import config, current_epoch, ids_in_db
from pg_harness import DSN
from pg_node import Node

from cronoq_store_postgres import PgStoreConfig

# A standby polls every lock_poll (0.05 s). After the kill it then bumps the epoch, recovers
# (at most a few hundred rows here), commits its recovery step and prints: measured 15-50 ms
# on an idle 2-core machine. The bound gives half a second of headroom over the poll for a
# loaded machine, and stays far below the 2 s session_timeout: a takeover that waited for a
# timeout, rather than the lock freed when the kernel closed the dead process's sockets,
# would exceed it.
FAILOVER_BOUND = 0.05 + 0.5
SUBMITTERS = 4
INTERVAL = 0.005


async def start_node(cfg: PgStoreConfig, name: str, nodes: list[Node]) -> Node:
    node = await Node.start(DSN, cfg, name, submitters=SUBMITTERS, interval=INTERVAL)
    nodes.append(node)
    return node


async def first_leader(candidates: list[Node], timeout: float = 20.0) -> Node:
    """The first of the candidates to say it leads."""
    waiting = {asyncio.ensure_future(n.wait_for("LEADING", timeout=timeout)): n for n in candidates}
    done, pending = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    task = done.pop()
    task.result()
    return waiting[task]


async def stop_all(nodes: list[Node]) -> None:
    for node in nodes:
        node.kill()
    for node in nodes:
        await node.finished()


async def test_sigkilled_leader_is_replaced_within_poll_plus_recovery_and_no_ack_is_lost(
    schema: str,
) -> None:
    cfg = config(schema)
    nodes: list[Node] = []
    try:
        leader = await start_node(cfg, "leader", nodes)
        await leader.wait_for("LEADING", timeout=20.0)
        standby = await start_node(cfg, "standby", nodes)
        await standby.wait_for("OPEN", timeout=20.0)
        # Mid-load: the leader keeps acknowledging while the standby polls.
        await leader.wait_for("ACK", count=len(leader.acked) + 100)

        killed = time.monotonic()
        leader.kill()
        await standby.wait_for("LEADING", timeout=10.0)
        assert standby.leading_since is not None
        failover = standby.leading_since - killed
        assert failover < FAILOVER_BOUND, failover
        print(f"failover {failover:.3f}s")
        assert await current_epoch(schema) == 2

        assert await leader.finished() != 0
        acked = leader.acked
        assert len(acked) >= 100
        assert await ids_in_db(schema, acked) == set(acked)

        # The new leader serves, and what it acknowledges lands too.
        await standby.wait_for("ACK", count=50)
        standby.terminate()
        await standby.wait_for("CLOSED")
        assert await standby.finished() == 0
        assert await ids_in_db(schema, standby.acked) == set(standby.acked)
        assert set(acked).isdisjoint(standby.acked)
    finally:
        await stop_all(nodes)


async def test_three_processes_survive_repeated_leader_kills_without_losing_an_ack(
    schema: str,
) -> None:
    cfg = config(schema)
    every: list[Node] = []
    try:
        alive = [await start_node(cfg, f"n{i}", every) for i in range(3)]
        for node in alive:
            await node.wait_for("OPEN", timeout=20.0)
        leader = await first_leader(alive)
        epochs = [await current_epoch(schema)]
        per_term: list[int] = []
        failovers: list[float] = []
        for failover in range(3):
            await leader.wait_for("ACK", count=len(leader.acked) + 50)
            others = [node for node in alive if node is not leader]
            killed = time.monotonic()
            leader.kill()
            assert await leader.finished() != 0
            per_term.append(len(leader.acked))
            new_leader = await first_leader(others, timeout=10.0)
            assert [n for n in others if n.leading_since is not None] == [new_leader]
            assert new_leader.leading_since is not None
            failovers.append(new_leader.leading_since - killed)

            # Every submission acknowledged so far, by any node, is in the database.
            acked = [task_id for node in every for task_id in node.acked]
            assert len(set(acked)) == len(acked), "an id was issued twice"
            assert await ids_in_db(schema, acked) == set(acked), f"failover {failover + 1}"
            epochs.append(await current_epoch(schema))
            assert epochs[-1] > epochs[-2]

            replacement = await start_node(cfg, f"n{3 + failover}", every)
            await replacement.wait_for("OPEN", timeout=20.0)  # a standby from now on
            alive = [*others, replacement]
            leader = new_leader

        await leader.wait_for("ACK", count=len(leader.acked) + 50)
        for node in alive:
            node.terminate()
        for node in alive:
            await node.wait_for("CLOSED")
            assert await node.finished() == 0
        per_term.append(len(leader.acked))
        acked = [task_id for node in every for task_id in node.acked]
        assert len(set(acked)) == len(acked)
        assert await ids_in_db(schema, acked) == set(acked)
        assert len(per_term) == 4 and all(count >= 50 for count in per_term), per_term
        assert max(failovers) < FAILOVER_BOUND, failovers
        print(f"failovers {failovers}, acknowledged per term {per_term}")
    finally:
        await stop_all(every)
