"""A server whose pages do not move forward is refused, not followed forever (the client's
paged reads of attempts and dependants; occurrences share the check)."""

from __future__ import annotations

import pytest

from cronoq.errors import InvalidArgument
from cronoq_client import AsyncClient
from cronoq_client._proto import cronoq_pb2 as pb


async def test_pages_that_do_not_advance_are_refused() -> None:
    client = AsyncClient("127.0.0.1:1", timeout=1.0)
    calls = 0

    async def stuck_dependants(message: pb.GetDependantsRequest) -> pb.GetDependantsResponse:
        nonlocal calls
        calls += 1
        return pb.GetDependantsResponse(task_ids=[7], next_after=7)

    async def stuck_attempts(message: pb.GetAttemptsRequest) -> pb.GetAttemptsResponse:
        nonlocal calls
        calls += 1
        return pb.GetAttemptsResponse(
            attempts=[pb.AttemptInfo(attempt=1, message="x")], next_after=1
        )

    client._dependants_page = stuck_dependants  # type: ignore[method-assign]
    client._attempts_page = stuck_attempts  # type: ignore[method-assign]
    with pytest.raises(InvalidArgument, match="GetDependants answer does not page forward"):
        await client.dependants(5)
    assert calls == 2
    calls = 0
    with pytest.raises(InvalidArgument, match="GetAttempts answer does not page forward"):
        await client.attempts(5)
    assert calls == 2

    # Pages that advance are followed to the last.
    pages = iter([([1, 2], 2), ([3], None)])

    async def advancing(message: pb.GetDependantsRequest) -> pb.GetDependantsResponse:
        ids, after = next(pages)
        reply = pb.GetDependantsResponse(task_ids=ids)
        if after is not None:
            reply.next_after = after
        return reply

    client._dependants_page = advancing  # type: ignore[method-assign]
    assert await client.dependants(5) == [1, 2, 3]
