"""Authentication and authorization through real ``cronoq-server`` processes: every RPC against
every permission set, pool isolation of workers, bearer tokens (missing, wrong, revoked by a
reload), client certificates (none, another CA, expired, a CA rotated by a reload), /metrics
behind a token, and no secret in any log line or error."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import signal
import socket
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from server_process import AttachStream, ServerProcess, config_toml, running_server
from tls_material import Authority

from cronoq import AttemptToken, BytesCodec, CancelRequested, LeasedAttempt, TaskRequest
from cronoq_client import protocol as wire
from cronoq_client.protocol import pb
from cronoq_server import ConfigError, load_config
from cronoq_server._config import AuthSettings, IdentitySettings
from cronoq_server._credentials import CredentialFiles

pytestmark = pytest.mark.asyncio(loop_scope="module")

Code = grpc.StatusCode
MEMORY = '[store]\nkind = "memory"\n'
POOLS = "".join(f'[[pools]]\nname = "{name}"\n' for name in ("matrix", "pool-a", "pool-b"))
NEVER = "0 0 1 1 *"
TIMEOUT = 5.0

# The documented table (docs/security.md), written out here rather than read from the server.
REQUIRED = {
    "Submit": "submit",
    "SubmitMany": "submit",
    "SubmitEach": "submit",
    "Get": "read",
    "GetByKey": "read",
    "GetTaskData": "read",
    "List": "read",
    "Wait": "read",
    "ListSchedules": "read",
    "PreviewSchedule": "read",
    "Cancel": "cancel",
    "AddSchedule": "schedules",
    "PauseSchedule": "schedules",
    "ResumeSchedule": "schedules",
    "RemoveSchedule": "schedules",
    "Attach": "work",
    "Heartbeat": "work",
    "HeartbeatMany": "work",
    "Report": "work",
    "ReportMany": "work",
    "ListPools": "read",
    "ListWorkers": "read",
    "ListLimits": "read",
    "PausePool": "admin",
    "ResumePool": "admin",
    "Retry": "admin",
    "TriggerSchedule": "admin",
    "OutboxStatus": "read",
    "ListOutboxQuarantine": "read",
    "RequeueOutbox": "admin",
    "DiscardOutbox": "admin",
    "Explain": "read",
    "ListOccurrences": "read",
    "GetAttempts": "read",
    "GetDependants": "read",
    "Rerun": "admin",
}
IDENTITIES: dict[str, dict[str, Any]] = {
    "reader": {"permissions": ["read"]},
    "submitter": {"permissions": ["submit"], "submit_pools": ["matrix", "pool-a"]},
    "kind-limited": {"permissions": ["submit"], "submit_kinds": ["allowed", "k"]},
    "canceller": {"permissions": ["cancel"]},
    "scheduler": {"permissions": ["schedules"]},
    "worker-a": {"permissions": ["work"], "work_pools": ["matrix", "pool-a"]},
    "watcher": {"permissions": ["metrics"]},
    "admin": {"permissions": ["admin"]},
}
TOKENS = {name: secrets.token_urlsafe(32) for name in IDENTITIES}
WRONG_TOKEN = secrets.token_urlsafe(32)


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def identities_toml(identities: dict[str, dict[str, Any]], tokens: dict[str, str]) -> str:
    tables = []
    for name, grants in identities.items():
        lines = [f"[[auth.identities]]\nname = {json.dumps(name)}"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in grants.items()]
        if name in tokens:
            lines.append(f"token_sha256 = [{json.dumps(sha256(tokens[name]))}]")
        tables.append("\n".join(lines))
    return "\n".join(tables) + "\n"


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return () if token is None else (("authorization", f"Bearer {token}"),)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServerProcess]:
    tables = "[auth]\nreload_interval_s = 600\n" + identities_toml(IDENTITIES, TOKENS)
    config = config_toml(MEMORY, pools=POOLS, tables=tables)
    async with running_server(tmp_path_factory.mktemp("auth"), config) as process:
        await process.leading()
        yield process


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def channel(server: ServerProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.target) as opened:
        yield opened


def _request(method: str) -> Message:
    token = AttemptToken(1, 2**40, 1)
    report = wire.report_request(token, bytes(16), wire.ReportSuccess(None))
    codec = BytesCodec()
    requests: dict[str, Message] = {
        "Submit": wire.submit_request(TaskRequest("k", pool="matrix"), codec),
        "SubmitMany": wire.submit_many_request([TaskRequest("k", pool="matrix")], codec),
        "SubmitEach": pb.SubmitEachRequest(
            submissions=[wire.submit_request(TaskRequest("k", pool="matrix"), codec)]
        ),
        "Get": wire.get_request(2**40),
        "GetByKey": wire.get_by_key_request("absent"),
        "GetTaskData": pb.GetTaskDataRequest(task_id=2**40, data=pb.TASK_DATA_OUTPUT),
        "List": wire.list_request(),
        "Wait": wire.wait_request(2**40, 0.01),
        "ListSchedules": pb.ListSchedulesRequest(),
        "PreviewSchedule": pb.PreviewScheduleRequest(cron="* * * * *"),
        "Cancel": wire.cancel_request(2**40),
        "AddSchedule": wire.add_schedule_request(
            codec, f"s-{uuid.uuid4().hex}", NEVER, kind="k", pool="matrix"
        ),
        "PauseSchedule": pb.PauseScheduleRequest(name="absent"),
        "ResumeSchedule": pb.ResumeScheduleRequest(name="absent"),
        "RemoveSchedule": pb.RemoveScheduleRequest(name="absent"),
        "Attach": wire.attach_request("w", ["matrix"], 1),
        "Heartbeat": wire.heartbeat_request(token, bytes(16)),
        "HeartbeatMany": pb.HeartbeatManyRequest(
            heartbeats=[wire.heartbeat_request(token, bytes(16))]
        ),
        "Report": report,
        "ReportMany": pb.ReportManyRequest(reports=[report]),
        # Unknown names and ids: the server answers, and the module's pools stay unpaused.
        "ListPools": pb.ListPoolsRequest(),
        "ListWorkers": pb.ListWorkersRequest(),
        "ListLimits": wire.list_limits_request(),
        "PausePool": pb.PausePoolRequest(name="absent"),
        "ResumePool": pb.ResumePoolRequest(name="absent"),
        "Retry": pb.RetryRequest(task_id=2**40),
        "TriggerSchedule": pb.TriggerScheduleRequest(name="absent"),
        # This server has no outbox: past authorization, each is answered NO_OUTBOX.
        "OutboxStatus": pb.OutboxStatusRequest(),
        "ListOutboxQuarantine": pb.ListOutboxQuarantineRequest(),
        "RequeueOutbox": pb.RequeueOutboxRequest(row_ids=[2**40]),
        "DiscardOutbox": pb.DiscardOutboxRequest(row_ids=[2**40]),
        "Explain": wire.explain_request(2**40),
        "ListOccurrences": wire.list_occurrences_request("absent"),
        "GetAttempts": wire.get_attempts_request(2**40),
        "GetDependants": wire.get_dependants_request(2**40),
        "Rerun": wire.rerun_request(2**40),
    }
    return requests[method]


def _path(method: str) -> str:
    service = (
        "WorkerService"
        if method in ("Attach", "Heartbeat", "HeartbeatMany", "Report", "ReportMany")
        else ("SchedulerService")
    )
    return f"/{pb.DESCRIPTOR.services_by_name[service].full_name}/{method}"


async def call(
    channel: grpc.aio.Channel, method: str, token: str | None, request: Message | None = None
) -> grpc.aio.AioRpcError | None:
    """The call's error, or None if it was answered (the first stream message, for Attach)."""
    message = _request(method) if request is None else request
    path = _path(method)
    try:
        if method == "Attach":
            stream: grpc.aio.UnaryStreamMultiCallable[Message, bytes] = channel.unary_stream(
                path, request_serializer=type(message).SerializeToString
            )
            attach = stream(message, metadata=metadata(token), timeout=TIMEOUT)
            try:
                await attach.read()
            finally:
                attach.cancel()
        else:
            unary: grpc.aio.UnaryUnaryMultiCallable[Message, bytes] = channel.unary_unary(
                path, request_serializer=type(message).SerializeToString
            )
            await unary(message, metadata=metadata(token), timeout=TIMEOUT)
    except grpc.aio.AioRpcError as err:
        return err
    return None


async def test_the_matrix_covers_every_rpc() -> None:
    methods = {
        method.name
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert methods == set(REQUIRED)


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
@pytest.mark.parametrize("method", sorted(REQUIRED))
async def test_every_rpc_for_every_permission_set(
    channel: grpc.aio.Channel, identity: str, method: str
) -> None:
    permissions = IDENTITIES[identity]["permissions"]
    err = await call(channel, method, TOKENS[identity])
    if "admin" in permissions or REQUIRED[method] in permissions:
        # Past authorization: answered, or refused for what the request names (not found...).
        assert err is None or err.code() not in (Code.PERMISSION_DENIED, Code.UNAUTHENTICATED), err
    else:
        assert err is not None and err.code() is Code.PERMISSION_DENIED, err
        assert err.details() == f"identity {identity!r} lacks the permission {REQUIRED[method]!r}"
        error = wire.error_from_rpc(err)
        assert getattr(error, "permission", None) == REQUIRED[method]


@pytest.mark.parametrize("method", sorted(REQUIRED))
async def test_no_credentials_is_unauthenticated(channel: grpc.aio.Channel, method: str) -> None:
    err = await call(channel, method, None)
    assert err is not None and err.code() is Code.UNAUTHENTICATED
    assert "requires authentication" in (err.details() or "")


async def test_a_wrong_or_malformed_token_gets_one_answer(channel: grpc.aio.Channel) -> None:
    answers = set()
    for value in (WRONG_TOKEN, "", sha256(TOKENS["admin"]), TOKENS["admin"] + "x"):
        err = await call(channel, "Get", value)
        assert err is not None and err.code() is Code.UNAUTHENTICATED
        answers.add(err.details())
    get: grpc.aio.UnaryUnaryMultiCallable[pb.GetRequest, bytes] = channel.unary_unary(
        _path("Get"), request_serializer=pb.GetRequest.SerializeToString
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await get(wire.get_request(1), metadata=(("authorization", f"Basic {TOKENS['admin']}"),))
    answers.add(raised.value.details())
    assert answers == {"the credentials were not accepted"}


async def test_submit_is_limited_to_its_pools_and_kinds(channel: grpc.aio.Channel) -> None:
    codec = BytesCodec()
    err = await call(
        channel, "Submit", TOKENS["submitter"],
        wire.submit_request(TaskRequest("k", pool="pool-b"), codec),
    )  # fmt: skip
    assert err is not None and err.code() is Code.PERMISSION_DENIED
    assert err.details() == "identity 'submitter' lacks the permission 'submit' on pool 'pool-b'"
    many = wire.submit_many_request(
        [TaskRequest("k", pool="pool-a"), TaskRequest("k", pool="pool-b")], codec
    )
    err = await call(channel, "SubmitMany", TOKENS["submitter"], many)
    assert err is not None and err.code() is Code.PERMISSION_DENIED
    err = await call(
        channel, "Submit", TOKENS["kind-limited"],
        wire.submit_request(TaskRequest("other", pool="matrix"), codec),
    )  # fmt: skip
    assert err is not None and err.code() is Code.PERMISSION_DENIED
    assert err.details() == "identity 'kind-limited' lacks the permission 'submit' for kind 'other'"
    allowed = wire.submit_request(TaskRequest("allowed", pool="matrix"), codec)
    assert await call(channel, "Submit", TOKENS["kind-limited"], allowed) is None


async def test_submit_each_authorizes_each_submission_alone(channel: grpc.aio.Channel) -> None:
    codec = BytesCodec()
    other_kind = wire.submit_request(TaskRequest("other", pool="matrix"), codec)
    allowed = wire.submit_request(TaskRequest("allowed", pool="matrix"), codec)
    alone = await call(channel, "Submit", TOKENS["kind-limited"], other_kind)
    assert alone is not None
    stub = wire.pb_grpc.SchedulerServiceStub(channel)
    reply = await stub.SubmitEach(
        pb.SubmitEachRequest(submissions=[allowed, other_kind, allowed]),
        metadata=metadata(TOKENS["kind-limited"]),
        timeout=TIMEOUT,
    )
    first, refused, second = reply.results
    assert first.task_id > 0 and second.task_id > first.task_id
    # What the Submit of it alone failed with, to the letter (the client rebuilds it).
    info = wire.error_info(alone)
    assert info is not None
    assert (refused.refused.reason, refused.refused.message, dict(refused.refused.metadata)) == (
        info.reason,
        alone.details(),
        dict(info.metadata),
    )


async def _submit(channel: grpc.aio.Channel, pool: str) -> int:
    stub = wire.pb_grpc.SchedulerServiceStub(channel)
    request = wire.submit_request(TaskRequest("k", pool=pool), BytesCodec())
    reply = await stub.Submit(request, metadata=metadata(TOKENS["admin"]), timeout=TIMEOUT)
    return reply.task_id


async def test_rerun_needs_admin_whatever_the_tasks_pool_as_retry_does(
    channel: grpc.aio.Channel,
) -> None:
    """Rerun is Retry's: an operator call (docs/security.md), so an identity scoped to pools
    may rerun no task, one of its own pools included, and a reader none; an admin reruns any.
    The reads of issue 32 are a reader's."""
    stub = wire.pb_grpc.SchedulerServiceStub(channel)
    admin = metadata(TOKENS["admin"])
    inside, outside = await _submit(channel, "pool-a"), await _submit(channel, "pool-b")
    for task_id in (inside, outside):  # finished: what a rerun takes
        await stub.Cancel(wire.cancel_request(task_id), metadata=admin, timeout=TIMEOUT)
    for identity in ("submitter", "kind-limited", "reader"):
        for task_id in (inside, outside):
            err = await call(channel, "Rerun", TOKENS[identity], wire.rerun_request(task_id))
            assert err is not None and err.code() is Code.PERMISSION_DENIED, (identity, err)
            assert err.details() == f"identity {identity!r} lacks the permission 'admin'"
    for method, request in (
        ("Explain", wire.explain_request(outside)),
        ("GetAttempts", wire.get_attempts_request(outside)),
        ("GetDependants", wire.get_dependants_request(outside)),
    ):
        assert await call(channel, method, TOKENS["reader"], request) is None, method
    rerun = await stub.Rerun(wire.rerun_request(outside), metadata=admin, timeout=TIMEOUT)
    try:
        info = await stub.Get(wire.get_request(rerun.task_id), metadata=admin, timeout=TIMEOUT)
        assert (info.rerun_of, info.pool, info.status) == (outside, "pool-b", pb.STATUS_READY)
    finally:  # no live task left in pool-b for the workers of the other tests
        await stub.Cancel(wire.cancel_request(rerun.task_id), metadata=admin, timeout=TIMEOUT)


async def _attach(channel: grpc.aio.Channel, token: str, pools: list[str]) -> AttachStream:
    stub = wire.pb_grpc.WorkerServiceStub(channel)
    stream = AttachStream(stub.Attach(wire.attach_request("w", pools, 2), metadata=metadata(token)))
    assert isinstance(await stream.event(), wire.Attached)
    return stream


async def test_a_worker_of_pool_a_never_gets_an_attempt_of_pool_b(
    channel: grpc.aio.Channel,
) -> None:
    in_b = await _submit(channel, "pool-b")
    in_a = await _submit(channel, "pool-a")
    for pools in (["pool-b"], ["pool-a", "pool-b"]):
        err = await call(channel, "Attach", TOKENS["worker-a"], wire.attach_request("w", pools, 1))
        assert err is not None and err.code() is Code.PERMISSION_DENIED
        assert err.details() == "identity 'worker-a' lacks the permission 'work' on pool 'pool-b'"
    worker = await _attach(channel, TOKENS["worker-a"], ["pool-a"])
    admin = await _attach(channel, TOKENS["admin"], ["pool-b"])
    try:
        mine = await worker.event()
        assert isinstance(mine, LeasedAttempt) and (mine.pool, mine.token.task_id) == (
            "pool-a",
            in_a,
        )
        # Ready while worker-a had a free slot, pool B's attempt went to pool B's worker.
        theirs = await admin.event()
        assert isinstance(theirs, LeasedAttempt) and theirs.token.task_id == in_b
        worker_stub = wire.pb_grpc.WorkerServiceStub(channel)
        as_worker = metadata(TOKENS["worker-a"])
        # Even with pool B's lease id (leaked: it was never sent to worker-a), it is refused.
        stolen = wire.heartbeat_request(theirs.token, theirs.lease_id)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await worker_stub.Heartbeat(stolen, metadata=as_worker)
        assert raised.value.code() is Code.PERMISSION_DENIED
        report = wire.report_request(theirs.token, theirs.lease_id, wire.ReportSuccess(b"stolen"))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await worker_stub.Report(report, metadata=as_worker)
        assert raised.value.code() is Code.PERMISSION_DENIED
        many = await worker_stub.ReportMany(
            pb.ReportManyRequest(reports=[report]), metadata=as_worker
        )
        assert [r.reason for r in many.results] == ["PERMISSION_DENIED"]
        # In a batch each heartbeat is authorized alone: pool B's is refused and renews
        # nothing (its worker was never heard of), worker-a's own is renewed.
        own = wire.heartbeat_request(mine.token, mine.lease_id)
        beats = await worker_stub.HeartbeatMany(
            pb.HeartbeatManyRequest(heartbeats=[stolen, own]), metadata=as_worker
        )
        refused, renewed = beats.results
        assert (refused.refused.reason, refused.refused.message) == (
            "PERMISSION_DENIED",
            "identity 'worker-a' lacks the permission 'work' on pool 'pool-b'",
        )
        assert renewed.WhichOneof("result") == "renewed"
        workers = await wire.pb_grpc.SchedulerServiceStub(channel).ListWorkers(
            pb.ListWorkersRequest(), metadata=metadata(TOKENS["admin"])
        )
        heard = {tuple(w.pools): w.HasField("last_heartbeat_at") for w in workers.workers}
        assert heard == {("pool-a",): True, ("pool-b",): False}
        # Each is listed with the identity its connection authenticated as, not a name it gave.
        identities = {tuple(w.pools): w.identity for w in workers.workers}
        assert identities == {("pool-a",): "worker-a", ("pool-b",): "admin"}
        # Without the lease id, pool B's attempt gets the answer of an attempt that does not
        # exist, word for word but the id: a refusal naming the pool would tell it is there.
        answers = []
        for task_id in (theirs.token.task_id, 2**40):
            guessed = AttemptToken(theirs.token.epoch, task_id, 1)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await worker_stub.Heartbeat(
                    wire.heartbeat_request(guessed, bytes(16)), metadata=as_worker
                )
            details = (raised.value.details() or "").replace(str(task_id), "ID")
            answers.append((raised.value.code(), details))
        assert answers[0] == answers[1], answers
        assert answers[0][0] is Code.FAILED_PRECONDITION
        # Nothing was applied: the attempt is still pool B's worker's to report.
        heartbeat = wire.heartbeat_request(mine.token, mine.lease_id)
        await worker_stub.Heartbeat(heartbeat, metadata=as_worker)
        await worker_stub.Report(
            wire.report_request(theirs.token, theirs.lease_id, wire.ReportSuccess(b"mine")),
            metadata=metadata(TOKENS["admin"]),
        )
    finally:
        worker.cancel()
        admin.cancel()
    stub = wire.pb_grpc.SchedulerServiceStub(channel)
    done = await stub.Get(
        wire.get_request(in_b, include_output=True), metadata=metadata(TOKENS["admin"])
    )
    assert done.output == b"mine"


# --- issue 29: keys, Attach's running attempts, one log line per refused call ----------------


def _stub(channel: grpc.aio.Channel) -> wire.pb_grpc.SchedulerServiceAsyncStub:
    return wire.pb_grpc.SchedulerServiceStub(channel)


async def _tagged(channel: grpc.aio.Channel, tag: str) -> list[tuple[int, str, str | None]]:
    """The tasks of this tag, as the admin lists them: (id, pool, key)."""
    reply = await _stub(channel).List(
        wire.list_request(tag=tag), metadata=metadata(TOKENS["admin"]), timeout=TIMEOUT
    )
    return [(t.task_id, t.pool, t.key if t.HasField("key") else None) for t in reply.tasks]


async def test_a_key_held_outside_the_grant_is_refused_without_naming_its_task(
    channel: grpc.aio.Channel,
) -> None:
    """Issue 29 item 1: a submitter limited to pools matrix and pool-a that names the key of
    a live or finished task of pool-b (or, limited to kinds, of another kind) is refused
    PERMISSION_DENIED, never answered with that task's id, and nothing is created."""
    tag = f"keys-{uuid.uuid4().hex}"
    codec = BytesCodec()
    stub = _stub(channel)
    as_admin = metadata(TOKENS["admin"])

    async def admin_submit(kind: str, pool: str, key: str) -> int:
        request = wire.submit_request(TaskRequest(kind, pool=pool, key=key, tags=[tag]), codec)
        return (await stub.Submit(request, metadata=as_admin, timeout=TIMEOUT)).task_id

    live = await admin_submit("k", "pool-b", f"{tag}-live")
    done = await admin_submit("k", "pool-b", f"{tag}-done")
    await stub.Cancel(wire.cancel_request(done), metadata=as_admin, timeout=TIMEOUT)
    other_kind = await admin_submit("other", "matrix", f"{tag}-kind")
    own = await admin_submit("k", "pool-a", f"{tag}-own")
    before = await _tagged(channel, tag)

    def submission(key: str | None, pool: str = "pool-a") -> pb.SubmitRequest:
        return wire.submit_request(TaskRequest("k", pool=pool, key=key, tags=[tag]), codec)

    for key, holder in ((f"{tag}-live", live), (f"{tag}-done", done)):
        err = await call(channel, "Submit", TOKENS["submitter"], submission(key))
        assert err is not None and err.code() is Code.PERMISSION_DENIED, err
        assert err.details() == (
            f"identity 'submitter' may not submit with this key: the key {key!r} is held by a "
            "task outside the pools and kinds this submission may use (give each tenant keys "
            "of its own, with a prefix)"
        )
        assert str(holder) not in (err.details() or "")
        assert getattr(wire.error_from_rpc(err), "permission", None) == "submit"
        # Whole: the other task of the batch is not created either.
        many = pb.SubmitManyRequest(tasks=[submission(None).task, submission(key).task])
        err = await call(channel, "SubmitMany", TOKENS["submitter"], many)
        assert err is not None and err.code() is Code.PERMISSION_DENIED, err
    # Each alone: the one with the key is refused, the others are submitted.
    each = pb.SubmitEachRequest(
        submissions=[submission(None), submission(f"{tag}-live"), submission(f"{tag}-new")]
    )
    reply = await stub.SubmitEach(each, metadata=metadata(TOKENS["submitter"]), timeout=TIMEOUT)
    first, refused, new = reply.results
    assert refused.refused.reason == "PERMISSION_DENIED"
    assert str(live) not in refused.refused.message
    # Limited to kinds: a key held by a task of another kind (in a pool it may use).
    kind_limited = wire.submit_request(
        TaskRequest("k", pool="matrix", key=f"{tag}-kind", tags=[tag]), codec
    )
    err = await call(channel, "Submit", TOKENS["kind-limited"], kind_limited)
    assert err is not None and err.code() is Code.PERMISSION_DENIED, err
    assert str(other_kind) not in (err.details() or "")
    # A key held inside the grant is deduplicated as ever, and an admin's key as before.
    again = await stub.Submit(
        submission(f"{tag}-own"), metadata=metadata(TOKENS["submitter"]), timeout=TIMEOUT
    )
    assert again.task_id == own
    theirs = await stub.Submit(submission(f"{tag}-live"), metadata=as_admin, timeout=TIMEOUT)
    assert theirs.task_id == live
    # Nothing was created by a refusal: only SubmitEach's two accepted submissions are new.
    after = await _tagged(channel, tag)
    assert after == [
        *before,
        (first.task_id, "pool-a", None),
        (new.task_id, "pool-a", f"{tag}-new"),
    ]


async def test_attach_refuses_a_running_attempt_of_a_pool_it_may_not_work_on(
    channel: grpc.aio.Channel,
) -> None:
    """Issue 29 item 2: worker-a (pool-a) re-attaching with pool-b's attempt and its lease id
    among its running attempts is refused PERMISSION_DENIED, and nothing moves: the attempt
    stays on pool-b's worker's link, which still receives its cancellation."""
    in_b = await _submit(channel, "pool-b")
    admin = await _attach(channel, TOKENS["admin"], ["pool-b"])
    try:
        theirs = await _leased(admin, in_b)
        running = [(theirs.token, theirs.lease_id)]
        request = wire.attach_request("w", ["pool-a"], 2, running=running)
        err = await call(channel, "Attach", TOKENS["worker-a"], request)
        assert err is not None and err.code() is Code.PERMISSION_DENIED, err
        assert err.details() == "identity 'worker-a' lacks the permission 'work' on pool 'pool-b'"
        stub = _stub(channel)
        await stub.Cancel(
            wire.cancel_request(in_b), metadata=metadata(TOKENS["admin"]), timeout=TIMEOUT
        )
        async with asyncio.timeout(TIMEOUT):
            cancel = await admin.event()
        assert isinstance(cancel, CancelRequested) and cancel.token == theirs.token
        # A running attempt this scheduler never leased (a guessed token) is no refusal: it is
        # held as an unproven claim, which moves nothing and learns nothing.
        guessed = [(AttemptToken(theirs.token.epoch, 2**40, 1), bytes(16))]
        request = wire.attach_request("w", ["pool-a"], 2, running=guessed)
        assert await call(channel, "Attach", TOKENS["worker-a"], request) is None
        report = wire.report_request(theirs.token, theirs.lease_id, wire.ReportFailure("stop"))
        await wire.pb_grpc.WorkerServiceStub(channel).Report(
            report, metadata=metadata(TOKENS["admin"]), timeout=TIMEOUT
        )
    finally:
        admin.cancel()


async def _leased(stream: AttachStream, task_id: int) -> LeasedAttempt:
    """The attempt of ``task_id`` from this stream (others that come first are skipped)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            event = await stream.event()
            if isinstance(event, LeasedAttempt) and event.token.task_id == task_id:
                return event


def _denied_total(body: str, permission: str) -> float:
    prefix = f'cronoq_permission_denied_total{{permission="{permission}"}} '
    found = [float(line[len(prefix) :]) for line in body.splitlines() if line.startswith(prefix)]
    return found[0] if found else 0.0


async def _metrics(server: ServerProcess) -> str:
    status, body = await asyncio.to_thread(_get, f"{server.http}/metrics", TOKENS["watcher"])
    assert status == 200
    return body


async def test_a_refused_batch_call_is_logged_in_one_line_with_its_count(
    server: ServerProcess, channel: grpc.aio.Channel
) -> None:
    """Issue 29 item 3: a SubmitEach of 1,000 refused submissions (and a SubmitMany of 1,000
    tasks outside the grant, a HeartbeatMany and a ReportMany of 500 refused entries) logs one
    ``permission denied`` line per call, with the number of items it refused. The metric
    counts each refused item of a batch answered item by item, and a SubmitMany once."""
    start = len(server.lines)
    earlier = {id(line) for line in server.lines}
    metrics_before = await _metrics(server)
    codec = BytesCodec()
    as_submitter = metadata(TOKENS["submitter"])
    refused = wire.submit_request(TaskRequest("k", pool="pool-b"), codec)
    each = await _stub(channel).SubmitEach(
        pb.SubmitEachRequest(submissions=[refused] * 1000), metadata=as_submitter, timeout=TIMEOUT
    )
    assert {r.refused.reason for r in each.results} == {"PERMISSION_DENIED"}
    many = wire.submit_many_request(
        [TaskRequest("k", pool="pool-b", key=f"many-{i}") for i in range(1000)], codec
    )
    err = await call(channel, "SubmitMany", TOKENS["submitter"], many)
    assert err is not None and err.code() is Code.PERMISSION_DENIED
    in_b = await _submit(channel, "pool-b")
    admin = await _attach(channel, TOKENS["admin"], ["pool-b"])
    try:
        theirs = await _leased(admin, in_b)
        as_worker = metadata(TOKENS["worker-a"])
        worker_stub = wire.pb_grpc.WorkerServiceStub(channel)
        stolen = wire.heartbeat_request(theirs.token, theirs.lease_id)
        beats = await worker_stub.HeartbeatMany(
            pb.HeartbeatManyRequest(heartbeats=[stolen] * 500), metadata=as_worker
        )
        assert {r.refused.reason for r in beats.results} == {"PERMISSION_DENIED"}
        report = wire.report_request(theirs.token, theirs.lease_id, wire.ReportSuccess(None))
        reports = await worker_stub.ReportMany(
            pb.ReportManyRequest(reports=[report] * 500), metadata=as_worker
        )
        assert {r.reason for r in reports.results} == {"PERMISSION_DENIED"}
        await worker_stub.Report(report, metadata=metadata(TOKENS["admin"]), timeout=TIMEOUT)
    finally:
        admin.cancel()
    # A last refused call: once its line is in, so is every line of the calls before it.
    await call(channel, "Get", TOKENS["watcher"])
    await server.wait_line(
        lambda line: (
            id(line) not in earlier
            and line.get("msg") == "permission denied"
            and line.get("identity") == "watcher"
        ),
        "the last refusal's line",
    )
    denials = [
        (line["method"].rsplit("/", 1)[-1], line.get("refused"))
        for line in server.lines[start:]
        if line.get("msg") == "permission denied" and line.get("identity") != "watcher"
    ]
    assert sorted(denials) == [
        ("HeartbeatMany", "500"),
        ("ReportMany", "500"),
        ("SubmitEach", "1000"),
        ("SubmitMany", "1000"),
    ]
    metrics_after = await _metrics(server)
    assert _denied_total(metrics_after, "submit") - _denied_total(metrics_before, "submit") == (
        1000 + 1
    )
    assert _denied_total(metrics_after, "work") - _denied_total(metrics_before, "work") == 1000


async def test_health_is_open_and_reflection_needs_an_identity(
    channel: grpc.aio.Channel,
) -> None:
    check: grpc.aio.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    reply = await check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    info: grpc.aio.StreamStreamMultiCallable[Any, Any] = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in info(iter([ask]), timeout=TIMEOUT):
            pass
    assert raised.value.code() is Code.UNAUTHENTICATED
    answers = info(iter([ask]), metadata=metadata(TOKENS["watcher"]), timeout=TIMEOUT)
    services = [s.name async for reply in answers for s in reply.list_services_response.service]
    assert "cronoq.v1.SchedulerService" in services


def _get(url: str, token: str | None) -> tuple[int, str]:
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_metrics_need_a_metrics_token_and_count_refusals(
    server: ServerProcess, channel: grpc.aio.Channel
) -> None:
    await call(channel, "Get", WRONG_TOKEN)
    await call(channel, "Cancel", TOKENS["reader"])
    # No token, or one nobody holds: 401, as UNAUTHENTICATED.
    for token in (None, WRONG_TOKEN):
        status, body = await asyncio.to_thread(_get, f"{server.http}/metrics", token)
        assert status == 401, (token, status, body)
        assert json.loads(body)["error"].endswith(
            "; /metrics needs a bearer token of the metrics permission"
        )
    # A valid token without the permission: 403 naming it, as PERMISSION_DENIED does.
    status, body = await asyncio.to_thread(_get, f"{server.http}/metrics", TOKENS["reader"])
    assert (status, json.loads(body)) == (
        403,
        {"error": "identity 'reader' lacks the permission 'metrics'", "permission": "metrics"},
    )
    status, body = await asyncio.to_thread(_get, f"{server.http}/metrics", TOKENS["watcher"])
    assert status == 200
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(("cronoq_auth_failures_total", "cronoq_permission_denied_total"))
    }
    assert values['cronoq_auth_failures_total{reason="invalid"}'] >= 1
    assert values['cronoq_permission_denied_total{permission="cancel"}'] >= 1
    for probe in ("/healthz", "/readyz"):
        assert (await asyncio.to_thread(_get, f"{server.http}{probe}", None))[0] == 200


async def test_no_secret_in_any_log_line_or_error(
    server: ServerProcess, channel: grpc.aio.Channel
) -> None:
    errors = [
        await call(channel, "PreviewSchedule", WRONG_TOKEN),
        await call(channel, "Cancel", TOKENS["reader"]),
    ]
    await server.wait_for("authentication failed", method=_path("PreviewSchedule"))
    await server.wait_for("permission denied", identity="reader", method=_path("Cancel"))
    secrets_sent = [WRONG_TOKEN, *TOKENS.values()]
    for err in errors:
        assert err is not None
        assert not any(s in (err.details() or "") for s in secrets_sent)
    leaked = [line for line in server.raw for s in secrets_sent if s in line]
    assert leaked == []


# --- tokens reloaded from a file --------------------------------------------------------------


def _rotating(tokens: Path, *, reload_interval_s: float) -> str:
    """A server whose identity ``rotating`` (read) has its tokens in the file ``tokens``."""
    tables = (
        f"[auth]\ntokens_file = {json.dumps(str(tokens))}\n"
        f"reload_interval_s = {reload_interval_s}\n"
        + identities_toml({"rotating": {"permissions": ["read"]}}, {})
    )
    return config_toml(MEMORY, tables=tables)


async def test_a_token_revoked_by_a_reload_is_refused(tmp_path: Path) -> None:
    first, second, third = (secrets.token_urlsafe(32) for _ in range(3))
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# rotation\nrotating {sha256(first)}\n")
    async with (
        running_server(tmp_path, _rotating(tokens, reload_interval_s=0.1)) as server,
        grpc.aio.insecure_channel(server.target) as channel,
    ):
        await server.leading()
        assert await call(channel, "List", first) is None
        tokens.write_text(f"rotating {sha256(second)}\n")
        server.signal(signal.SIGHUP)
        await server.wait_for("credentials_reloaded", why="SIGHUP")
        err = await call(channel, "List", first)
        assert err is not None and err.code() is Code.UNAUTHENTICATED
        assert await call(channel, "List", second) is None
        # A change is noticed without a signal too. The watcher may yet log a reload of the
        # file it read before this write (it may have noticed the change SIGHUP reloaded):
        # the reloads after the write are awaited, one log line each, until one took it.
        earlier = {id(line) for line in server.lines}
        tokens.write_text(f"rotating {sha256(third)}\n")
        for _ in range(3):
            reload = await _next_reload(server, earlier)
            assert reload == {**reload, "msg": "credentials_reloaded", "why": "a file changed"}
            if await call(channel, "List", third) is None:
                break
        else:
            raise AssertionError("three reloads after the write, and the new token still refused")
        # A bad file is refused whole, naming the line and not its content; the old set stays.
        tokens.write_text(f"rotating {third}\n")
        await server.wait_for("credentials_reload_failed")
        assert await call(channel, "List", third) is None
        assert not [line for line in server.raw if any(t in line for t in (first, second, third))]


async def _next_reload(server: ServerProcess, earlier: set[int]) -> dict[str, str]:
    """The first ``credentials_reloaded`` or ``credentials_reload_failed`` line not among
    ``earlier`` (the ids of lines seen before), waiting for it; it joins ``earlier``."""
    line = await server.wait_line(
        lambda line: (
            id(line) not in earlier
            and line.get("msg") in ("credentials_reloaded", "credentials_reload_failed")
        ),
        "a reload",
    )
    earlier.update(id(seen) for seen in server.lines)
    return line


async def test_an_empty_missing_or_broken_tokens_file_on_reload_keeps_the_tokens(
    tmp_path: Path,
) -> None:
    """Issue 29 item 6: a tokens file read empty on reload (an editor that truncates, then
    writes) revoked every token in it. Empty (or blank), missing, or unparsable, a reload
    now keeps the tokens read before and says so in one line; a file of comments alone is a
    deliberate "no tokens" and revokes them."""
    token = secrets.token_urlsafe(32)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"rotating {sha256(token)}\n")
    tokens.chmod(0o600)
    async with (
        running_server(tmp_path, _rotating(tokens, reload_interval_s=600)) as server,
        grpc.aio.insecure_channel(server.target) as channel,
    ):
        await server.leading()
        earlier = {id(line) for line in server.lines}
        assert await call(channel, "List", token) is None
        damages: dict[str, str | None] = {  # the file's new text; None: removed
            "empty": "",
            "blank": "\n  \n",
            "missing": None,
            "unparsable": "rotating not-a-digest\n",
        }
        for what, damaged in damages.items():
            if damaged is None:
                tokens.unlink()
            else:
                tokens.write_text(damaged)
            server.signal(signal.SIGHUP)
            failed = await _next_reload(server, earlier)
            assert failed["msg"] == "credentials_reload_failed", (what, failed)
            assert failed["kept"].startswith("the previous credentials keep serving"), what
            assert await call(channel, "List", token) is None, what
        assert "is empty, as a file caught in the middle of a write is" in " ".join(server.raw)
        assert "cannot read it: No such file or directory" in " ".join(server.raw)
        tokens.write_text("# every token revoked\n")
        server.signal(signal.SIGHUP)
        assert (await _next_reload(server, earlier))["msg"] == "credentials_reloaded"
        err = await call(channel, "List", token)
        assert err is not None and err.code() is Code.UNAUTHENTICATED


EXPOSED = "a credentials file is readable by others"


async def test_a_tokens_file_or_private_key_readable_by_others_is_warned_about_at_load(
    tmp_path: Path,
) -> None:
    """Issue 29 item 6: one warning line per such file at each load, naming it and the fix."""
    cert, key = Authority().server().write(tmp_path, "server")
    token = secrets.token_urlsafe(32)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"reader {sha256(token)}\n")
    for path, mode in ((key, 0o644), (tokens, 0o640), (cert, 0o644)):
        path.chmod(mode)
    tables = (
        f"[tls]\ncert = {json.dumps(str(cert))}\nkey = {json.dumps(str(key))}\n"
        f"[auth]\ntokens_file = {json.dumps(str(tokens))}\nreload_interval_s = 600\n"
        + identities_toml({"reader": {"permissions": ["read"]}}, {})
    )
    async with running_server(tmp_path, config_toml(MEMORY, tables=tables)) as server:
        await server.leading()
        warned = {line["setting"]: line for line in server.events(EXPOSED)}
        assert sorted(warned) == ["auth.tokens_file", "tls.key"]  # not the certificate
        assert warned["tls.key"]["file"] == str(key) and warned["tls.key"]["mode"] == "0644"
        assert warned["tls.key"]["fix"] == f"chmod 600 {key}"
        assert warned["auth.tokens_file"]["readable_by"] == "its group or other users"
        # Fixed, a reload warns no more.
        earlier = {id(line) for line in server.lines}
        key.chmod(0o600)
        tokens.chmod(0o600)
        server.signal(signal.SIGHUP)
        assert (await _next_reload(server, earlier))["msg"] == "credentials_reloaded"
        new = [line.get("msg") for line in server.lines if id(line) not in earlier]
        assert EXPOSED not in new


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another user: needs root")
async def test_a_file_of_another_owner_may_be_read_through_its_group_not_by_everyone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As a Kubernetes Secret volume is mounted: root's, with the pod's fsGroup."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"reader {sha256(WRONG_TOKEN)}\n")
    os.chown(tokens, 12345, 12345)
    identities = (IdentitySettings("reader", frozenset({"read"})),)
    settings = AuthSettings(identities=identities, tokens_file=str(tokens))
    for mode, warned in ((0o440, False), (0o640, False), (0o644, True)):
        tokens.chmod(mode)
        caplog.clear()
        files = CredentialFiles(None, settings)
        files.reload("SIGHUP")  # each load: the start's and a reload's
        lines = [r for r in caplog.records if r.getMessage() == EXPOSED]
        assert len(lines) == 2 * int(warned), oct(mode)
    assert lines[0].__dict__["readable_by"] == "every user"
    assert "defaultMode: 0440" in lines[0].__dict__["fix"]


# --- client certificates ------------------------------------------------------------------


def _channel(server: ServerProcess, trust: bytes, pem: Any | None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        trust, None if pem is None else pem.key, None if pem is None else pem.cert
    )
    return grpc.aio.secure_channel(
        f"localhost:{server.grpc_port}",
        credentials,
        options=[("grpc.use_local_subchannel_pool", 1)],
    )


async def _code(server: ServerProcess, trust: bytes, pem: Any | None) -> Code | None:
    async with _channel(server, trust, pem) as channel:
        err = await call(channel, "List", None)
    return None if err is None else err.code()


async def test_client_certificates(tmp_path: Path) -> None:
    ca, other, rotated = Authority("ca"), Authority("other"), Authority("rotated")
    cert, key = ca.server().write(tmp_path, "server")
    client_ca = tmp_path / "clients.pem"
    client_ca.write_bytes(ca.pem)
    tables = (
        f"[tls]\ncert = {json.dumps(str(cert))}\nkey = {json.dumps(str(key))}\n"
        f"client_ca = {json.dumps(str(client_ca))}\n"
        "[auth]\nreload_interval_s = 600\n"
        + identities_toml({"reader.example": {"permissions": ["read"]}}, {})
    )
    async with running_server(tmp_path, config_toml(MEMORY, tables=tables)) as server:
        await server.leading()
        trust = ca.pem
        assert await _code(server, trust, ca.issue("ignored-cn", ("reader.example",))) is None
        assert await _code(server, trust, ca.issue("reader.example")) is None
        # Trusted, but no identity has its name: authenticated, allowed nothing.
        async with _channel(server, trust, ca.issue("stranger")) as channel:
            err = await call(channel, "List", None)
        assert err is not None and err.code() is Code.PERMISSION_DENIED
        assert err.details() == "identity 'stranger' lacks the permission 'read'"
        # Refused in the TLS handshake: no certificate, another CA's, an expired one.
        assert await _code(server, trust, None) is Code.UNAVAILABLE
        assert await _code(server, trust, other.issue("reader.example")) is Code.UNAVAILABLE
        expired = ca.issue("reader.example", expired=True)
        assert await _code(server, trust, expired) is Code.UNAVAILABLE
        # The CA bundle rotated: the new CA's certificates in, the old one's out.
        client_ca.write_bytes(rotated.pem)
        server.signal(signal.SIGHUP)
        await server.wait_for("credentials_reloaded", why="SIGHUP")
        assert await _code(server, trust, rotated.issue("reader.example")) is None
        assert await _code(server, trust, ca.issue("reader.example")) is Code.UNAVAILABLE


async def test_the_servers_own_certificate_rotates_on_reload(tmp_path: Path) -> None:
    """Issue 20 audit gap 2: a new ``tls.cert``/``tls.key`` pair (another CA's) is served to
    new connections after SIGHUP; a connection opened before goes on being served."""
    ca, rotated = Authority("ca"), Authority("rotated")
    cert, key = ca.server().write(tmp_path, "server")
    client_ca = tmp_path / "clients.pem"
    client_ca.write_bytes(ca.pem)
    client = ca.issue("reader.example")
    tables = (
        f"[tls]\ncert = {json.dumps(str(cert))}\nkey = {json.dumps(str(key))}\n"
        f"client_ca = {json.dumps(str(client_ca))}\n"
        "[auth]\nreload_interval_s = 600\n"
        + identities_toml({"reader.example": {"permissions": ["read"]}}, {})
    )
    async with running_server(tmp_path, config_toml(MEMORY, tables=tables)) as server:
        await server.leading()
        served = ssl.PEM_cert_to_DER_cert(cert.read_text())
        assert await _served_certificate(server, ca.pem, client, tmp_path) == served
        assert await _code(server, rotated.pem, client) is Code.UNAVAILABLE
        async with _channel(server, ca.pem, client) as before:
            assert await call(before, "List", None) is None
            fresh = rotated.server()
            cert.write_bytes(fresh.cert)
            key.write_bytes(fresh.key)
            server.signal(signal.SIGHUP)
            await server.wait_for("credentials_reloaded", why="SIGHUP")
            new = ssl.PEM_cert_to_DER_cert(fresh.cert.decode())
            assert await _served_certificate(server, rotated.pem, client, tmp_path) == new
            assert await _code(server, rotated.pem, client) is None
            assert await _code(server, ca.pem, client) is Code.UNAVAILABLE
            assert await call(before, "List", None) is None, "the old connection is served"


async def _served_certificate(
    server: ServerProcess, trust: bytes, client: Any, directory: Path
) -> bytes:
    """The DER certificate the server presents to a new TLS connection that trusts only
    ``trust`` (the handshake fails unless that CA signed it)."""
    cert, key = client.write(directory, f"client-{uuid.uuid4().hex[:8]}")
    context = ssl.create_default_context(cadata=trust.decode())
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])

    def handshake() -> bytes:
        with (
            socket.create_connection(("localhost", server.grpc_port), timeout=TIMEOUT) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der

    return await asyncio.to_thread(handshake)


# --- secure by default --------------------------------------------------------------------


async def test_a_non_loopback_address_needs_authentication_or_insecure(tmp_path: Path) -> None:
    wide = {"CRONOQ_LISTEN__GRPC": "0.0.0.0:0"}
    with pytest.raises(ConfigError) as raised:
        load_config(None, wide)
    [issue] = raised.value.issues
    assert issue.key == "listen.grpc" and "no authentication is configured" in issue.problem
    assert load_config(None, {**wide, "CRONOQ_AUTH__INSECURE": "true"}).auth.insecure
    for loopback in ("127.0.0.1:0", "[::1]:0", "localhost:0"):
        load_config(None, {"CRONOQ_LISTEN__GRPC": loopback})
    identities = json.dumps([{"name": "a", "permissions": ["read"], "token_sha256": ["0" * 64]}])
    with pytest.raises(ConfigError) as raised:
        load_config(None, {**wide, "CRONOQ_AUTH__IDENTITIES": identities})
    [issue] = raised.value.issues
    assert "would cross the network in clear" in issue.problem
    cert, key = Authority().server().write(tmp_path, "server")
    secured = load_config(
        None,
        {
            **wide,
            "CRONOQ_AUTH__IDENTITIES": identities,
            "CRONOQ_TLS__CERT": str(cert),
            "CRONOQ_TLS__KEY": str(key),
        },
    )
    assert secured.auth.enabled
