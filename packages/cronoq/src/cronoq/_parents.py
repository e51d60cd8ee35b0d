"""The outputs of a task's parents, handed to it when it runs (``TaskContext.parent_outputs``):
read from the store as encoded (``ParentOutput``), decoded where the task runs, by the codec
that runs it (the scheduler's for a local pool, the worker's for a remote one)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cronoq._codecs import Codec, CodecContext, binds_context, decode_with
from cronoq._model import Status
from cronoq.errors import PayloadError
from cronoq.store import Store

__all__ = [
    "MAX_PARENT_OUTPUT_BYTES",
    "ParentLoader",
    "ParentOutput",
    "decode_parent_outputs",
    "load_parent_outputs",
]


@dataclass(frozen=True, slots=True)
class ParentOutput:
    """A succeeded parent's output as stored (``None``: it returned nothing), with what a
    codec that binds outputs to their task needs to decode it."""

    task_id: int
    kind: str
    pool: str
    key: str | None
    output: bytes | None


ParentLoader = Callable[[Sequence[int]], Awaitable[list[ParentOutput]]]


MAX_PARENT_OUTPUT_BYTES = 64 * 1024 * 1024
"""The most bytes of parents' outputs an attempt is given, by default."""


async def load_parent_outputs(
    store: Store, after: Sequence[int], max_bytes: int = MAX_PARENT_OUTPUT_BYTES
) -> list[ParentOutput]:
    """The outputs of the parents the store still keeps: a parent pruned by the store's
    retention (``keep_finished``) is left out, as is one that did not succeed (its child
    would not run, unless an operator retried the child by hand). Rows are read one at a
    time, and past ``max_bytes`` of outputs a PayloadError says so: memory holds at most that
    much, however many parents there are."""
    found = []
    total = 0
    for parent_id in dict.fromkeys(after):  # a parent named twice is read once
        record = await store.get_task(parent_id)
        if record is None or record.status is not Status.SUCCEEDED:
            continue
        total += len(record.output or b"")
        if total > max_bytes:
            raise PayloadError(
                f"the outputs of its parents take more than {max_bytes} bytes (at parent "
                f"{parent_id})"
            )
        spec = record.spec
        found.append(ParentOutput(parent_id, spec.kind, spec.pool, spec.key, record.output))
    return found


def decode_parent_outputs(codec: Codec, parents: Iterable[ParentOutput]) -> dict[int, Any]:
    """Each parent's output decoded, by parent id; a PayloadError names the parent whose
    output the codec refused."""
    binds = binds_context(codec)
    decoded: dict[int, Any] = {}
    for parent in parents:
        if parent.output is None:
            decoded[parent.task_id] = None
            continue
        context = None
        if binds:  # as the parent's attempt encoded it: bound to the parent
            context = CodecContext("output", parent.kind, parent.pool, parent.key, parent.task_id)
        what = f"output of parent task {parent.task_id}"
        try:
            decoded[parent.task_id] = decode_with(codec, parent.output, what, context)
        except PayloadError as exc:  # a codec's own PayloadError does not say which value
            raise PayloadError(f"{what}: {exc}") from exc
    return decoded
