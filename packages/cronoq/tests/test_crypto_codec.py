"""EncryptedCodec: round trips, refuses every altered byte with PayloadError, decrypts after a
key rotation, and leaves the store nothing but ciphertext."""

from __future__ import annotations

from typing import Any

import pytest

from cronoq import JsonCodec, MemoryStore, Pool, Scheduler, TaskContext
from cronoq.crypto import EncryptedCodec
from cronoq.errors import InvalidArgument, PayloadError

OLD, NEW = EncryptedCodec.generate_key(), EncryptedCodec.generate_key()
VALUE = {"card": "4111 1111 1111 1111", "amount": 42}


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
    # The same id naming another key: authentication fails, it does not decrypt to garbage.
    with pytest.raises(PayloadError, match="failed authentication with key 'k1'"):
        codec({"k1": NEW}, "k1").decode(sealed)


def test_rotation_decrypts_with_any_known_key_and_encrypts_with_the_current() -> None:
    before = codec({"2025-01": OLD}, "2025-01")
    old_value = before.encode(VALUE)
    rotated = codec({"2025-01": OLD, "2025-06": NEW}, "2025-06")
    new_value = rotated.encode(VALUE)
    assert rotated.decode(old_value) == rotated.decode(new_value) == VALUE
    assert new_value[5:12] == b"2025-06"
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
    ],
)
def test_bad_keys_are_refused(keys: dict[str, bytes], current: str, problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        EncryptedCodec(keys, current)


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
