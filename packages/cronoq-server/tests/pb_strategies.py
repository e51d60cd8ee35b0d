"""Hypothesis strategies of arbitrary protobuf messages, built from their descriptors.

Every field may be absent or take any value its wire type can carry, not only the values a
client's encoder would send: strings with NUL or of any length, numbers at the ends of their
range, enum numbers no enum names, Durations and Timestamps whose nanos disagree with their
seconds, several members of a oneof tried in turn (the last one set wins). Values a server knows
(pool names, a cron, a time zone) come up often enough to get past the first check.
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

__all__ = ["messages", "variations"]

INT64 = (-(2**63), 2**63 - 1)
INT32 = (-(2**31), 2**31 - 1)
MAX_DEPTH = 3

_WORDS = [
    "", "\x00", "default", "attach", "fuzz", "job", "UTC", "Europe/Paris", "* * * * *",
    "0 0 1 1 *", "61 * * * *", "1", "-1", "9" * 19, "x" * 256, "\u00e9t\u00e9 \U0001f600",
]  # fmt: skip
_texts = st.sampled_from(_WORDS) | st.text(st.characters(codec="utf-8"), max_size=20)


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [low, low + 1, -1, 0, 1, 2, 1000, 2**31, high - 1, high]
    return st.sampled_from([e for e in edges if low <= e <= high]) | st.integers(low, high)


_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_STRING: _texts,
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=64),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_DOUBLE: st.floats(),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32),
    FieldDescriptor.TYPE_INT64: _integers(*INT64),
    FieldDescriptor.TYPE_SINT64: _integers(*INT64),
    FieldDescriptor.TYPE_SFIXED64: _integers(*INT64),
    FieldDescriptor.TYPE_INT32: _integers(*INT32),
    FieldDescriptor.TYPE_SINT32: _integers(*INT32),
    FieldDescriptor.TYPE_SFIXED32: _integers(*INT32),
    FieldDescriptor.TYPE_UINT64: _integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: _integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_UINT32: _integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: _integers(0, 2**32 - 1),
    # Open enums: any int32, named or not.
    FieldDescriptor.TYPE_ENUM: st.integers(-1, 10) | _integers(*INT32),
}


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.message_type is not None:
        return messages(field.message_type, depth + 1)
    return _SCALARS[field.type]


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """A message of this type with arbitrary fields (nested messages to MAX_DEPTH)."""
    cls = GetMessageClass(descriptor)
    if depth >= MAX_DEPTH:
        return st.just(cls())
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue  # no request has a map
        if field.is_repeated:
            fields[field.name] = st.lists(_value(field, depth), max_size=4)
        else:
            fields[field.name] = st.none() | _value(field, depth)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message = cls()
        for field in descriptor.fields:
            if field.name not in fields:
                continue
            value = draw(fields[field.name])
            if value is None:
                continue
            target = getattr(message, field.name)
            if field.is_repeated:
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                target.SetInParent()  # present even when empty
                target.CopyFrom(value)
            else:
                setattr(message, field.name, value)
        return message

    return build()


def variations(base: Message) -> st.SearchStrategy[Message]:
    """``base`` (a valid request) with one or two of its fields, at any depth, replaced by an
    arbitrary value or cleared: past the checks a wholly arbitrary message fails first."""
    # The stubs type a message's DESCRIPTOR as protobuf's or upb's class; both are one API.
    descriptor = cast(Descriptor, base.DESCRIPTOR)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message = type(base)()
        message.CopyFrom(base)
        replaced = draw(messages(descriptor))
        names = st.sampled_from([f.name for f in descriptor.fields])
        for name in draw(st.sets(names, min_size=1, max_size=2)):
            field = descriptor.fields_by_name[name]
            nested = _nested(message, field)
            if nested is not None and draw(st.booleans()):
                nested.CopyFrom(draw(variations(nested)))
                continue
            message.ClearField(name)
            if field.is_repeated:
                getattr(message, name).extend(getattr(replaced, name))
            elif not field.has_presence or replaced.HasField(name):
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    getattr(message, name).CopyFrom(getattr(replaced, name))
                else:
                    setattr(message, name, getattr(replaced, name))
        return message

    return build()


def _nested(message: Message, field: FieldDescriptor) -> Message | None:
    """The message a field of ``message`` holds (its first, if repeated), if it holds one."""
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return None
    value = getattr(message, field.name)
    if field.is_repeated:
        return value[0] if len(value) else None
    return value if message.HasField(field.name) else None
