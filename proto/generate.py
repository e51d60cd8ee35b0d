"""Generate the Python modules of the wire protocol from proto/cronoq/v1/*.proto.

    uv run python proto/generate.py            # regenerate the committed copy in cronoq-client
    uv run python proto/generate.py --check    # fail, with a diff summary, if it is stale

The generator is grpcio-tools (protoc and the gRPC plugin) with mypy-protobuf's plugins for the
``.pyi`` stubs, all pinned in the root ``dev`` dependency group: the generated code checks the
protobuf and grpcio versions it runs on, so cronoq-client declares what this generator emits.

protoc's virtual include mapping puts the sources at ``cronoq_client/_proto/``, so the modules
import each other as ``cronoq_client._proto.cronoq_pb2``; a ``cronoq/v1`` import path would make
them a ``cronoq`` package, colliding with the scheduler's. The protobuf package (and so every
service and message name on the wire) stays ``cronoq.v1``.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "proto" / "cronoq" / "v1"
PACKAGE = "cronoq_client/_proto"
SRC = ROOT / "packages" / "cronoq-client" / "src"
COMMITTED = SRC / PACKAGE
# Written by hand, not by protoc: the checks leave it alone.
HAND_WRITTEN = frozenset({"__init__.py"})


def _protoc(out: Path) -> None:
    """Run protoc over every source into ``out`` (a directory holding ``cronoq_client/``)."""
    from grpc_tools import protoc  # the dev group's; imported here so --help needs nothing

    plugins = Path(sys.executable).parent
    well_known = resources.files("grpc_tools") / "_proto"
    sources = sorted(SOURCES.glob("*.proto"))
    args = [
        "protoc",
        f"-I{PACKAGE}={SOURCES}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={plugins / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugins / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out=quiet:{out}",
        f"--mypy_grpc_out=quiet:{out}",
        *(f"{PACKAGE}/{source.name}" for source in sources),
    ]
    (out / PACKAGE).mkdir(parents=True, exist_ok=True)
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed (its message is above)")


def _generated(directory: Path) -> dict[str, str]:
    return {
        path.name: path.read_text()
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name not in HAND_WRITTEN
    }


def diff_summary(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """One line per file that differs (missing, extra, or changed with its line counts)."""
    lines = []
    for name in sorted(expected.keys() | actual.keys()):
        if name not in actual:
            lines.append(f"missing: {name}")
        elif name not in expected:
            lines.append(f"not generated (stale?): {name}")
        elif expected[name] != actual[name]:
            diff = list(
                difflib.unified_diff(
                    actual[name].splitlines(), expected[name].splitlines(), lineterm="", n=0
                )
            )
            added = sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
            removed = sum(1 for d in diff if d.startswith("-") and not d.startswith("---"))
            lines.append(f"differs: {name} (+{added} -{removed} lines)")
            lines.extend(f"    {d}" for d in diff[2:12])
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and compare with the committed copy",
    )
    parser.add_argument(
        "--against",
        type=Path,
        default=COMMITTED,
        help="the directory --check compares with (default: the committed copy)",
    )
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        _protoc(out)
        fresh = out / PACKAGE
        if options.check:
            problems = diff_summary(_generated(fresh), _generated(options.against))
            if problems:
                print(f"{options.against} is not what proto/generate.py makes now:")
                print("\n".join(problems))
                print("Run `uv run python proto/generate.py` and commit the result.")
                return 1
            print(f"{options.against} is up to date")
            return 0
        for stale in _generated(COMMITTED):
            (COMMITTED / stale).unlink()
        for name in _generated(fresh):
            shutil.copyfile(fresh / name, COMMITTED / name)
        print(f"generated {', '.join(sorted(_generated(COMMITTED)))} in {COMMITTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
