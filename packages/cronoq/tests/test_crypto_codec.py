"""EncryptedCodec: round trips, refuses every altered byte with PayloadError, decrypts after a
key rotation, and leaves the store nothing but ciphertext. Each value is bound to its
CodecContext (issue 29 item 3): moved to another role, kind, pool, key or task it is refused;
values of the former unbound CQE1 format still decode unless ``accept_unbound=False``."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cronoq import CodecContext, JsonCodec, MemoryStore, Pool, Scheduler, Status, TaskContext
from cronoq.crypto import EncryptedCodec
from cronoq.errors import InvalidArgument, PayloadError

OLD, NEW = EncryptedCodec.generate_key(), EncryptedCodec.generate_key()
VALUE = {"card": "4111 1111 1111 1111", "amount": 42}

CHARGE = CodecContext("payload", "charge", "billing", "order-17")
"""A payload's context: the task's kind, pool and key."""
RECEIPT = CodecContext("output", "charge", "billing", "order-17", task_id=123)
"""The output of task 123, of that kind, pool and key."""
ELSEWHERE = [
    CodecContext("payload", "refund", "billing", "order-17"),  # another kind
    CodecContext("payload", "charge", "other", "order-17"),  # another pool
    CodecContext("payload", "charge", "billing", "order-18"),  # another key
    CodecContext("payload", "charge", "billing"),  # no key
    CodecContext("output", "charge", "billing", "order-17", task_id=1),  # an output
]
"""Contexts that differ from CHARGE in one field each."""


def codec(keys: dict[str, bytes], current: str) -> EncryptedCodec:
    return EncryptedCodec(keys, current, JsonCodec())


def test_round_trip_and_a_fresh_nonce_each_time() -> None:
    c = codec({"k1": OLD}, "k1")
    first, second = c.encode(VALUE), c.encode(VALUE)
    assert first != second
    assert c.decode(first) == c.decode(second) == VALUE
    assert b"4111" not in first
    raw = EncryptedCodec({"k1": OLD}, "k1")
    assert raw.decode(raw.encode(b"")) == b""
    assert raw.decode(raw.encode(b"raw")) == b"raw"
    bound = c.encode_for(VALUE, CHARGE)
    assert bound != c.encode_for(VALUE, CHARGE)
    assert c.decode_for(bound, CHARGE) == VALUE
    assert c.decode_for(c.encode_for(VALUE, RECEIPT), RECEIPT) == VALUE
    assert raw.decode_for(raw.encode_for(b"", CHARGE), CHARGE) == b""


def test_every_altered_byte_is_refused() -> None:
    c = codec({"k1": OLD}, "k1")
    sealed = c.encode(VALUE)
    for index in range(len(sealed)):
        altered = bytearray(sealed)
        altered[index] ^= 0x01
        with pytest.raises(PayloadError):
            c.decode(bytes(altered))
    for cut in (0, 4, 5, 8, len(sealed) - 1):
        with pytest.raises(PayloadError):
            c.decode(sealed[:cut])
    bound = c.encode_for(VALUE, CHARGE)
    # Every byte: the header (format, key id, context digest), the nonce, the ciphertext, the
    # tag; and every bit of the header's bytes.
    for index in range(len(bound)):
        for bit in range(8) if index < 20 else (0,):
            altered = bytearray(bound)
            altered[index] ^= 1 << bit
            with pytest.raises(PayloadError):
                c.decode_for(bytes(altered), CHARGE)
    for cut in (0, 4, 5, 8, 15, 20, 32, len(bound) - 1):
        with pytest.raises(PayloadError):
            c.decode_for(bound[:cut], CHARGE)
    # Labelled as the former format, it fails authentication: no downgrade to unbound.
    with pytest.raises(PayloadError, match="failed authentication"):
        c.decode_for(b"CQE1" + bound[4:], CHARGE)
    # The same id naming another key: authentication fails, it does not decrypt to garbage.
    with pytest.raises(PayloadError, match="failed authentication with key 'k1'"):
        codec({"k1": NEW}, "k1").decode(sealed)


def test_rotation_decrypts_with_any_known_key_and_encrypts_with_the_current() -> None:
    before = codec({"2025-01": OLD}, "2025-01")
    old_value = before.encode(VALUE)
    rotated = codec({"2025-01": OLD, "2025-06": NEW}, "2025-06")
    new_value = rotated.encode(VALUE)
    assert rotated.decode(old_value) == rotated.decode(new_value) == VALUE
    assert new_value[:12] == b"CQE2\x072025-06"
    old_bound = before.encode_for(VALUE, CHARGE)
    assert rotated.decode_for(old_bound, CHARGE) == VALUE
    after = codec({"2025-06": NEW}, "2025-06")
    assert after.decode(new_value) == VALUE
    with pytest.raises(PayloadError, match="key '2025-01', which this codec does not have"):
        after.decode(old_value)


@pytest.mark.parametrize(
    ("keys", "current", "problem"),
    [
        ({}, "a", "at least one key"),
        ({"a": b"short"}, "a", "16, 24 or 32 bytes"),
        ({"": OLD}, "", "1 to 255 bytes"),
        ({"a": OLD}, "b", "current must be one of"),
        ({"\udcff": OLD}, "\udcff", "1 to 255 bytes of text"),
        ({"a": OLD}, ["a"], "current must be one of the key ids, got list"),
    ],
)
def test_bad_keys_are_refused(keys: dict[str, bytes], current: str, problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        EncryptedCodec(keys, current)


@pytest.mark.parametrize("inner", [JsonCodec, "json", object()])
def test_a_bad_inner_codec_is_refused(inner: Any) -> None:
    with pytest.raises(InvalidArgument, match="inner must be a codec"):
        EncryptedCodec({"k": OLD}, "k", inner)


def test_the_key_never_shows() -> None:
    assert OLD.hex() not in repr(codec({"k1": OLD}, "k1"))
    assert repr(OLD) not in repr(codec({"k1": OLD}, "k1"))


async def test_the_store_keeps_only_ciphertext() -> None:
    store = MemoryStore()
    seen: list[Any] = []

    async def run(ctx: TaskContext, payload: Any) -> Any:
        seen.append(payload)
        return {"receipt": "secret-receipt"}

    async with Scheduler([Pool("default", run)], store=store, codec=codec({"k": OLD}, "k")) as s:
        task_id = await s.submit("charge", VALUE)
        info = await s.wait(task_id, timeout=5)
        record = await store.get_task(task_id)
        output = await store.load_output(task_id)
    assert seen == [VALUE] and info.output == {"receipt": "secret-receipt"}
    assert record is not None and b"4111" not in record.spec.payload
    assert output is not None and b"secret-receipt" not in output


# --- bound to its context (issue 29 item 3) -------------------------------------------------


def test_a_value_moved_to_another_context_is_refused_saying_so() -> None:
    c = codec({"k1": OLD}, "k1")
    bound = c.encode_for(VALUE, CHARGE)
    for elsewhere in ELSEWHERE:
        with pytest.raises(PayloadError, match="belongs to another context") as caught:
            c.decode_for(bound, elsewhere)
        message = str(caught.value)
        assert elsewhere.describe() in message
        assert OLD.hex() not in message and repr(OLD) not in message
    # Bound to a task, it is refused without a context, and a value of no context is refused
    # in a task's.
    with pytest.raises(PayloadError, match=r"belongs to another context.*for a task's payload"):
        c.decode(bound)
    with pytest.raises(PayloadError, match="belongs to another context"):
        c.decode_for(c.encode(VALUE), CHARGE)


def test_an_output_is_bound_to_its_task_and_is_no_payload() -> None:
    c = codec({"k1": OLD}, "k1")
    output = c.encode_for(VALUE, RECEIPT)
    with pytest.raises(PayloadError, match="not encrypted for the payload of a task of kind"):
        c.decode_for(output, CHARGE)  # an output used as a payload
    with pytest.raises(PayloadError, match="not encrypted for the output of task 124"):
        c.decode_for(output, CodecContext("output", "charge", "billing", "order-17", 124))
    payload = c.encode_for(VALUE, CHARGE)
    with pytest.raises(PayloadError, match="belongs to another context"):
        c.decode_for(payload, RECEIPT)  # a payload used as an output


def test_a_context_binds_even_where_its_digest_is_forged() -> None:
    """The digest in the header only names the context: the context itself is authenticated.
    A value whose digest is rewritten to the target context's still fails."""
    c = codec({"k1": OLD}, "k1")
    bound = c.encode_for(VALUE, CHARGE)
    target = ELSEWHERE[0]
    start = 5 + len(b"k1")
    forged = bound[:start] + hashlib.sha256(target.to_bytes()).digest()[:8] + bound[start + 8 :]
    with pytest.raises(PayloadError, match="failed authentication with key 'k1'"):
        c.decode_for(forged, target)


def test_another_key_under_the_same_id_still_says_so() -> None:
    bound = codec({"k1": OLD}, "k1").encode_for(VALUE, CHARGE)
    with pytest.raises(PayloadError, match="failed authentication with key 'k1'"):
        codec({"k1": NEW}, "k1").decode_for(bound, CHARGE)


def test_a_context_aware_inner_codec_gets_the_context() -> None:
    seen: list[tuple[str, CodecContext | None]] = []

    class Inner(JsonCodec):
        def encode_for(self, value: Any, context: CodecContext) -> bytes:
            seen.append(("encode", context))
            return self.encode(value)

        def decode_for(self, data: bytes, context: CodecContext) -> Any:
            seen.append(("decode", context))
            return self.decode(data)

    c = EncryptedCodec({"k1": OLD}, "k1", Inner())
    assert c.decode_for(c.encode_for(VALUE, CHARGE), CHARGE) == VALUE
    assert seen == [("encode", CHARGE), ("decode", CHARGE)]


# A value the former EncryptedCodec (CQE1) wrote, with the key bytes(range(32)) under the id
# "2025-01" and JsonCodec inside: the bytes a store may still hold.
FORMER_KEY = bytes(range(32))
FORMER_VALUE = bytes.fromhex(
    "4351453107323032352d3031038e49404fcbf0310cbbc448a47a3775df080e26e4cf1109d7d232436980ceaf"
    "2de7c6f3957fccf7b1740486c2b9591dc9654f19df147b1b08b8ce92c4893582a8fb65f0f169"
)


def test_values_of_the_former_format_still_decode_unbound() -> None:
    c = codec({"2025-01": FORMER_KEY}, "2025-01")
    assert c.decode(FORMER_VALUE) == VALUE
    # Bound to nothing: it decodes in any context, which is why it can be turned off.
    for context in (CHARGE, RECEIPT, *ELSEWHERE):
        assert c.decode_for(FORMER_VALUE, context) == VALUE
    for index in range(len(FORMER_VALUE)):
        altered = bytearray(FORMER_VALUE)
        altered[index] ^= 0x01
        with pytest.raises(PayloadError):
            c.decode_for(bytes(altered), CHARGE)
    # New values are bound, in the new format.
    assert c.encode_for(VALUE, CHARGE).startswith(b"CQE2")
    assert c.encode(VALUE).startswith(b"CQE2")


def test_accept_unbound_false_refuses_the_former_format() -> None:
    c = EncryptedCodec({"2025-01": FORMER_KEY}, "2025-01", JsonCodec(), accept_unbound=False)
    for decode in (c.decode, lambda data: c.decode_for(data, CHARGE)):
        with pytest.raises(PayloadError, match=r"former CQE1 format.*accept_unbound=False"):
            decode(FORMER_VALUE)
    assert c.decode_for(c.encode_for(VALUE, CHARGE), CHARGE) == VALUE
    assert "accept_unbound=False" in repr(c)
    with pytest.raises(InvalidArgument, match="accept_unbound must be a bool"):
        EncryptedCodec({"k": OLD}, "k", accept_unbound=1)  # type: ignore[arg-type]


def test_a_former_value_made_here_decodes_too() -> None:
    """The former format, as its documentation described it, made with AES-GCM directly."""
    header = b"CQE1" + bytes([2]) + b"k1"
    nonce = b"\x07" * 12
    value = header + nonce + AESGCM(OLD).encrypt(nonce, b"raw", header)
    assert EncryptedCodec({"k1": OLD}, "k1").decode_for(value, CHARGE) == b"raw"


def test_decode_for_takes_only_a_codec_context() -> None:
    c = codec({"k1": OLD}, "k1")
    with pytest.raises(InvalidArgument, match="context must be a CodecContext"):
        c.encode_for(VALUE, ("payload", "charge", "billing"))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="context must be a CodecContext"):
        c.decode_for(c.encode_for(VALUE, CHARGE), None)  # type: ignore[arg-type]


async def test_the_scheduler_binds_payloads_and_outputs_to_their_tasks() -> None:
    """Embedded, someone with the store's rows swaps values between them: an output copied
    into another task's row, and a payload copied into the row of a task of another kind. Each
    is refused with PayloadError; the task whose payload was replaced fails without its
    function seeing the other task's payload."""
    store = MemoryStore()
    rows = store._cluster  # what database credentials reach
    seen: list[Any] = []

    async def run(ctx: TaskContext, payload: Any) -> Any:
        seen.append((ctx.kind, payload))
        return {"for": ctx.kind}

    c = codec({"k": OLD}, "k")
    async with Scheduler([Pool("default", run)], store=store, codec=c) as s:
        first = await s.submit("charge", VALUE, key="order-17")
        second = await s.submit("refund", {"amount": 1})
        assert (await s.wait(first, timeout=5)).output == {"for": "charge"}
        assert (await s.wait(second, timeout=5)).output == {"for": "refund"}
        rows.tasks[second] = replace(rows.tasks[second], output=rows.tasks[first].output)
        with pytest.raises(PayloadError, match=f"task {second} .*belongs to another context"):
            await s.get(second)
        assert (await s.get(first)).output == {"for": "charge"}
        await s.pause_pool("default")
        charge = await s.submit("charge", VALUE, key="order-18")
        refund = await s.submit("refund", {"amount": 2})
    # While no scheduler runs, the refund's row gets the charge's payload.
    moved = rows.tasks[charge].spec.payload
    rows.tasks[refund] = replace(
        rows.tasks[refund], spec=replace(rows.tasks[refund].spec, payload=moved)
    )
    async with Scheduler([Pool("default", run)], store=store, codec=c) as s:
        await s.resume_pool("default")
        assert (await s.wait(charge, timeout=5)).output == {"for": "charge"}
        # wait() cannot decode the payload either: it says the task failed, and why.
        with pytest.raises(PayloadError, match=f"task {refund} .*belongs to another context"):
            await s.wait(refund, timeout=5)
        failed = rows.tasks[refund]
        assert (failed.status, failed.attempt) == (Status.FAILED, 1)
        assert failed.message.startswith(
            "attempt 1 failed (not retryable): payload could not be decoded: an encrypted value "
            "that belongs to another context: it was not encrypted for the payload of a task "
            "of kind 'refund' in pool 'default'"
        )
    assert seen == [
        ("charge", VALUE),
        ("refund", {"amount": 1}),
        ("charge", VALUE),
    ]


def test_a_copy_in_the_same_context_decodes_which_binding_cannot_stop() -> None:
    """A replay: the same role, kind, pool and key (no task id for a payload) is the same
    context, whichever task the value is copied into (docs/security.md)."""
    c = codec({"k1": OLD}, "k1")
    keyless = CodecContext("payload", "charge", "billing")
    assert (
        c.decode_for(c.encode_for(VALUE, keyless), CodecContext("payload", "charge", "billing"))
        == VALUE
    )
    assert c.decode_for(c.encode_for(VALUE, CHARGE), replace(CHARGE)) == VALUE


def test_the_format_is_as_documented() -> None:
    """CQE2, the key id's length and the key id, 8 bytes of the context's SHA-256, a 12-byte
    nonce, the ciphertext and its 16-byte tag; the associated data is the header followed by
    the context's bytes (docs/security.md)."""
    sealed = EncryptedCodec({"k1": OLD}, "k1").encode_for(b"plain", CHARGE)
    digest = hashlib.sha256(CHARGE.to_bytes()).digest()[:8]
    header = b"CQE2\x02k1" + digest
    assert sealed.startswith(header)
    assert len(sealed) == len(header) + 12 + len(b"plain") + 16
    nonce, rest = sealed[len(header) : len(header) + 12], sealed[len(header) + 12 :]
    assert AESGCM(OLD).decrypt(nonce, rest, header + CHARGE.to_bytes()) == b"plain"
    unbound = EncryptedCodec({"k1": OLD}, "k1").encode(b"plain")  # no context: b""
    assert unbound.startswith(b"CQE2\x02k1" + hashlib.sha256(b"").digest()[:8])


async def test_a_schedule_registered_again_drops_its_unbound_payload() -> None:
    """A schedule keeps a former (CQE1) payload until add_schedule(..., replace=True)
    encrypts it anew; then a codec with accept_unbound=False runs its tasks."""
    store = MemoryStore()
    rows = store._cluster
    seen: list[Any] = []

    async def run(ctx: TaskContext, payload: Any) -> None:
        seen.append(payload)

    former = codec({"2025-01": FORMER_KEY}, "2025-01")
    strict = EncryptedCodec({"2025-01": FORMER_KEY}, "2025-01", JsonCodec(), accept_unbound=False)
    async with Scheduler([Pool("default", run)], store=store, codec=former) as s:
        await s.add_schedule("nightly", "0 3 * * *", kind="charge", payload=VALUE)
    record = rows.schedules["nightly"]
    template = replace(record.spec.template, payload=FORMER_VALUE)  # as an earlier release left it
    rows.schedules["nightly"] = replace(record, spec=replace(record.spec, template=template))
    async with Scheduler([Pool("default", run)], store=store, codec=strict) as s:
        refused = await s.trigger_schedule("nightly")
        assert refused is not None
        with pytest.raises(PayloadError, match="former CQE1 format"):
            await s.wait(refused, timeout=5)
        await s.add_schedule("nightly", "0 3 * * *", kind="charge", payload=VALUE, replace=True)
        assert rows.schedules["nightly"].spec.template.payload.startswith(b"CQE2")
        ran = await s.trigger_schedule("nightly")
        assert ran is not None
        assert (await s.wait(ran, timeout=5)).status is Status.SUCCEEDED
    assert seen == [VALUE]
