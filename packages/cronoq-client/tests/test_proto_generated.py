"""The committed modules of cronoq_client._proto are what proto/generate.py makes now, and its
check (the nox session ``proto``) notices when they are not."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grpc
from google.protobuf import __version__ as protobuf_version
from packaging.requirements import Requirement
from packaging.version import Version

import cronoq_client._proto

ROOT = Path(__file__).resolve().parents[3]
GENERATE = ROOT / "proto" / "generate.py"
COMMITTED = Path(cronoq_client._proto.__file__).parent


def _check(against: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATE), "--check", "--against", str(against)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_committed_modules_are_fresh() -> None:
    result = _check(COMMITTED)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is up to date" in result.stdout


def test_a_stale_copy_fails_with_a_summary_of_the_differences(tmp_path: Path) -> None:
    stale = tmp_path / "_proto"
    shutil.copytree(COMMITTED, stale)
    pyi = stale / "cronoq_pb2.pyi"
    pyi.write_text(pyi.read_text().replace("class TaskRequest", "class TaskRequests", 1))
    (stale / "cronoq_pb2_grpc.py").unlink()
    (stale / "old_pb2.py").write_text("# from a removed .proto\n")
    result = _check(stale)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "differs: cronoq_pb2.pyi (+1 -1 lines)" in result.stdout
    assert "-class TaskRequests" in result.stdout
    assert "missing: cronoq_pb2_grpc.py" in result.stdout
    assert "not generated (stale?): old_pb2.py" in result.stdout
    assert "cronoq_pb2.py:" not in result.stdout  # an unchanged file is not listed


def test_the_declared_requirements_are_what_the_generated_code_checks() -> None:
    # cronoq_pb2 refuses a protobuf runtime older than its gencode or of another major
    # version; cronoq_pb2_grpc refuses a grpcio older than the grpcio-tools that made it.
    from cronoq_client._proto import cronoq_pb2_grpc

    header = (COMMITTED / "cronoq_pb2.py").read_text()
    gencode = re.search(r"^# Protobuf Python Version: (\S+)$", header, re.MULTILINE)
    assert gencode is not None
    major = Version(gencode[1]).major
    project = tomllib.loads((COMMITTED.parents[2] / "pyproject.toml").read_text())["project"]
    declared = {r.name: r.specifier for r in map(Requirement, project["dependencies"])}
    assert str(declared["protobuf"]) == f"<{major + 1},>={gencode[1]}"
    assert str(declared["grpcio"]) == f">={cronoq_pb2_grpc.GRPC_GENERATED_VERSION}"
    # And the installed runtime passed those checks (the modules imported).
    assert Version(protobuf_version) in declared["protobuf"]
    assert Version(grpc.__version__) in declared["grpcio"]
