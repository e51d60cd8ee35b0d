"""Task limits on the wire: a limit and its use round-trip, a ListLimits reply stays within
the message limit by leaving busiest keys out (and saying so), and a request's limits are
bounded before they are decoded."""

from __future__ import annotations

import pytest

from cronoq import BytesCodec, Limit, LimitInfo, LimitKeyInfo, OnFull, TaskRequest
from cronoq.errors import InvalidArgument
from cronoq_client import protocol as wire
from cronoq_client._wire import _limit_keys_from_pb, task_request_to_pb
from cronoq_client.protocol import pb

LIMITS = [
    Limit("tenant", concurrency=2, per_key=True, on_full="keep_latest"),
    Limit("stripe", rate=100, per=1, burst=10, on_full=OnFull.REJECT),
    Limit("slow", rate=3, per=1.5),
    Limit("db", concurrency=5, on_full="cancel_running"),
]


@pytest.mark.parametrize("limit", LIMITS, ids=lambda limit: limit.name)
def test_a_limit_and_its_use_round_trip(limit: Limit) -> None:
    keys = (LimitKeyInfo("acme", 2, 1, 3), LimitKeyInfo(None, 0, 0, 0))
    info = LimitInfo(limit, 7, 2, 1, 3, keys)
    message = pb.LimitInfo.FromString(wire.limit_info_to_pb(info).SerializeToString())
    back = wire.limit_info_from_pb(message)
    assert back == info
    assert back.limit.describe() == limit.describe()


def test_a_reply_too_large_leaves_busiest_keys_out_and_flags_them() -> None:
    keys = tuple(LimitKeyInfo(f"tenant-{i:04}" + "x" * 100, 1, 0, 0) for i in range(100))
    infos = [LimitInfo(LIMITS[0], 100, 100, 0, 0, keys), LimitInfo(LIMITS[1], 0, 0, 0, 0, ())]
    whole = wire.list_limits_response_to_pb(infos, 1 << 20)
    assert [len(i.keys) for i in whole.limits] == [100, 0]
    assert not any(i.keys_omitted for i in whole.limits)
    cut = wire.list_limits_response_to_pb(infos, 4000)
    assert cut.ByteSize() <= 4000
    assert 0 < len(cut.limits[0].keys) < 100 and cut.limits[0].keys_omitted
    assert [k.key for k in cut.limits[0].keys] == [k.key for k in keys[: len(cut.limits[0].keys)]]
    assert len(cut.limits) == 2


def test_a_task_request_s_limits_travel_and_are_bounded() -> None:
    message = task_request_to_pb(
        TaskRequest("k", limits={"tenant": "acme", "stripe": None}), wire_codec()
    )
    assert _limit_keys_from_pb(message.limits) == {"tenant": "acme", "stripe": None}
    with pytest.raises(InvalidArgument, match="must be a mapping"):
        task_request_to_pb(TaskRequest("k", limits=["tenant"]), wire_codec())  # type: ignore[arg-type]
    many = pb.TaskRequest(limits=[pb.LimitKey(name=f"l{i}") for i in range(17)])
    with pytest.raises(InvalidArgument, match="at most 16 limits"):
        _limit_keys_from_pb(many.limits)
    twice = pb.TaskRequest(limits=[pb.LimitKey(name="a"), pb.LimitKey(name="a", key="k")])
    with pytest.raises(InvalidArgument, match="limits name limit 'a' twice"):
        _limit_keys_from_pb(twice.limits)
    assert wire.list_limits_kwargs(pb.ListLimitsRequest()) == {}
    assert wire.list_limits_kwargs(wire.list_limits_request(0)) == {"keys": 0}


def wire_codec() -> BytesCodec:

    return BytesCodec()
