"""AsyncClient and Worker credentials against a real ``cronoq-server`` with authentication on:
a token and a client certificate from the arguments or the environment, and every refusal
raised at once with a precise error (never after the retries of a passing failure)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from server_process import ServerProcess, config_toml, running_server
from tls_material import Authority

from cronoq import JsonCodec, TaskContext
from cronoq.errors import InvalidArgument, PermissionDenied, Unauthenticated
from cronoq_client import AsyncClient, Tls, Worker
from cronoq_client._credentials import credentials

pytestmark = pytest.mark.asyncio(loop_scope="module")

POOLS = '[[pools]]\nname = "pool-a"\n[[pools]]\nname = "pool-b"\n'
PATIENT = 30.0
"""The clients' timeout: a refusal retried like a passing failure would take this long."""
PROMPT = 5.0
"""A refusal must arrive within this."""
GRANTS: dict[str, dict[str, Any]] = {
    "app": {"permissions": ["read", "submit"]},
    "reader": {"permissions": ["read"]},
    "worker-a": {"permissions": ["work"], "work_pools": ["pool-a"]},
    "kind-limited": {"permissions": ["read", "submit"], "submit_kinds": ["allowed"]},
}
TOKENS = {name: secrets.token_urlsafe(32) for name in GRANTS}


@dataclass(frozen=True, slots=True)
class Secured:
    server: ServerProcess
    ca: Authority
    directory: Path

    @property
    def target(self) -> str:
        return f"localhost:{self.server.grpc_port}"

    def tls(self, name: str = "app") -> Tls:
        cert, key = self.ca.issue(name).write(self.directory, name)
        ca = self.directory / "ca.pem"
        ca.write_bytes(self.ca.pem)
        return Tls(str(ca), str(cert), str(key))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    directory = tmp_path_factory.mktemp("secured")
    ca = Authority()
    cert, key = ca.server().write(directory, "server")
    (directory / "clients.pem").write_bytes(ca.pem)
    identities = "".join(
        f"[[auth.identities]]\nname = {json.dumps(name)}\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in grants.items())
        + f'token_sha256 = ["{hashlib.sha256(TOKENS[name].encode()).hexdigest()}"]\n'
        for name, grants in GRANTS.items()
    )
    tables = (
        f'[tls]\ncert = "{cert}"\nkey = "{key}"\nclient_ca = "{directory / "clients.pem"}"\n'
        + identities
    )
    config = config_toml('[store]\nkind = "memory"\n', pools=POOLS, tables=tables)
    async with running_server(directory, config) as server:
        await server.leading()
        yield Secured(server, ca, directory)


async def test_a_token_and_a_client_certificate_run_a_task_end_to_end(secured: Secured) -> None:
    done = asyncio.Event()

    async def work(ctx: TaskContext, payload: Any) -> Any:
        done.set()
        return {"doubled": payload["n"] * 2}

    worker = Worker(
        secured.target,
        {"pool-a": work},
        codec=JsonCodec(),
        tls=secured.tls("worker-a"),
        token=TOKENS["worker-a"],
    )
    running = asyncio.create_task(worker.run())
    try:
        tls = secured.tls()
        async with AsyncClient(
            secured.target, tls=tls, token=TOKENS["app"], codec=JsonCodec()
        ) as client:
            task_id = await client.submit("double", {"n": 21}, pool="pool-a")
            info = await client.wait(task_id, timeout=PROMPT)
        assert info.output == {"doubled": 42}
    finally:
        worker.stop()
        await running


async def test_credentials_come_from_the_environment(
    secured: Secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = secured.tls()
    assert tls.ca is not None and tls.cert is not None and tls.key is not None
    token_file = secured.directory / "token"
    token_file.write_text(TOKENS["app"] + "\n")
    monkeypatch.setenv("CRONOQ_TLS_CA", tls.ca)
    monkeypatch.setenv("CRONOQ_TLS_CERT", tls.cert)
    monkeypatch.setenv("CRONOQ_TLS_KEY", tls.key)
    monkeypatch.setenv("CRONOQ_TOKEN_FILE", str(token_file))
    async with AsyncClient(secured.target, timeout=PROMPT) as client:
        assert await client.submit("k", pool="pool-b") > 0


async def test_a_refused_token_fails_at_once(secured: Secured) -> None:
    # The certificate names an identity too, but a token, when sent, decides.
    token = "not-a-known-token"
    async with AsyncClient(secured.target, tls=secured.tls(), token=token, timeout=PATIENT) as c:
        async with asyncio.timeout(PROMPT):
            with pytest.raises(Unauthenticated) as raised:
                await c.list()
    assert token not in str(raised.value)


async def test_a_missing_permission_fails_at_once_naming_it(secured: Secured) -> None:
    async with (
        AsyncClient(secured.target, tls=secured.tls(), token=TOKENS["reader"]) as client,
        asyncio.timeout(PROMPT),
    ):
        with pytest.raises(PermissionDenied) as raised:
            await client.submit("k", pool="pool-a")
    assert raised.value.permission == "submit"
    assert str(raised.value) == "identity 'reader' lacks the permission 'submit'"


async def test_a_submission_refused_in_a_shared_call_fails_only_its_caller(
    secured: Secured,
) -> None:
    async with (
        AsyncClient(secured.target, tls=secured.tls(), token=TOKENS["kind-limited"]) as client,
        asyncio.timeout(PROMPT),
    ):
        with pytest.raises(PermissionDenied) as alone:
            await client.submit("other", pool="pool-a")
        # The first leaves alone; the three that arrive while it is in flight share a call.
        submits = [
            asyncio.ensure_future(client.submit(kind, pool="pool-a"))
            for kind in ("allowed", "allowed", "other", "allowed")
        ]
        await asyncio.sleep(0)  # each runs up to its wait, queued behind the first
        outcomes = await asyncio.gather(*submits, return_exceptions=True)
    refused = outcomes.pop(2)
    assert all(isinstance(task_id, int) for task_id in outcomes), outcomes
    assert type(refused) is PermissionDenied and refused.permission == "submit"
    assert str(refused) == str(alone.value)
    assert str(refused) == "identity 'kind-limited' lacks the permission 'submit' for kind 'other'"


async def test_an_untrusted_server_certificate_fails_at_once(secured: Secured) -> None:
    stranger = secured.directory / "stranger-ca.pem"
    stranger.write_bytes(Authority("stranger").pem)
    tls = secured.tls()
    untrusting = Tls(str(stranger), tls.cert, tls.key)
    async with AsyncClient(secured.target, tls=untrusting, token=TOKENS["app"]) as client:
        async with asyncio.timeout(PROMPT):
            with pytest.raises(Unauthenticated, match="TLS handshake"):
                await client.list()


async def test_a_worker_with_refused_credentials_stops_at_once(secured: Secured) -> None:
    async def work(ctx: TaskContext, payload: Any) -> None:
        raise AssertionError("never leased")

    tls = secured.tls("worker-a")
    wrong = Worker(secured.target, {"pool-a": work}, tls=tls, token="not-a-known-token")
    other_pool = Worker(secured.target, {"pool-b": work}, tls=tls, token=TOKENS["worker-a"])
    async with asyncio.timeout(PROMPT):
        with pytest.raises(Unauthenticated):
            await wrong.run()
        with pytest.raises(PermissionDenied) as raised:
            await other_pool.run()
    assert str(raised.value) == "identity 'worker-a' lacks the permission 'work' on pool 'pool-b'"


async def test_credentials_are_checked_when_made(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="token must be"):
        credentials(None, "two words", {})
    with pytest.raises(InvalidArgument, match="both cert and key"):
        credentials(Tls(cert="c.pem"), None, {})
    with pytest.raises(InvalidArgument, match=r"tls.ca .*missing.pem: cannot read it"):
        credentials(Tls(ca=str(tmp_path / "missing.pem")), None, {})
    assert credentials(None, None, {}).channel is None
    assert credentials(None, None, {}).interceptors == ()
    from_env = credentials(None, None, {"CRONOQ_TOKEN": "abc"})
    assert from_env.channel is None and len(from_env.interceptors) == 2
    assert "abc" not in repr(from_env)
