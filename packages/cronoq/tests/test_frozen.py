"""quick_init: the same __init__ as the dataclass's own (signature, defaults, errors,
__post_init__), the instance as frozen as before; refused where it cannot be the same."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import InitVar, dataclass, field

import pytest

from cronoq import TaskInfo, TaskRequest
from cronoq._engine import SubmitResult
from cronoq._frozen import quick_init
from cronoq._model import RetryPolicy, TaskSpec
from cronoq.store import TaskRecord, TaskSubmitted, TaskUpdated


@dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str = "b"
    c: tuple[int, ...] = ()


@quick_init
@dataclass(frozen=True, slots=True)
class _Quick:
    a: int
    b: str = "b"
    c: tuple[int, ...] = ()


def _outcome(cls: type, *args: object, **kwargs: object) -> object:
    try:
        made = cls(*args, **kwargs)
    except TypeError as exc:
        # The message names the function: the same text but for the class's name.
        return ("raised", str(exc).replace(cls.__qualname__, "C"))
    return ("made", dataclasses.astuple(made), repr(made).replace(cls.__qualname__, "C"))


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1,), {}),
        ((1, "x", (2,)), {}),
        ((), {"a": 1, "c": (3,)}),
        ((), {}),
        ((1, "x", (), 4), {}),
        ((1,), {"a": 2}),
        ((1,), {"d": 2}),
    ],
)
def test_it_takes_and_refuses_what_the_dataclass_init_does(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    assert _outcome(_Quick, *args, **kwargs) == _outcome(_Plain, *args, **kwargs)


def test_the_instance_stays_frozen_equal_and_hashable() -> None:
    made = _Quick(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.a = 2  # type: ignore[misc]
    assert made == _Quick(1, "b", ())
    assert hash(made) == hash(_Quick(1))
    assert dataclasses.replace(made, b="z") == _Quick(1, "z")


def test_post_init_still_runs() -> None:
    @quick_init
    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    assert Checked(1).a == 1
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)


@pytest.mark.parametrize(
    "cls", [TaskRequest, TaskSpec, TaskInfo, TaskRecord, TaskSubmitted, TaskUpdated, SubmitResult]
)
def test_the_signature_is_the_fields(cls: type) -> None:
    parameters = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in parameters] == [f.name for f in fields]
    assert [p.default for p in parameters] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]


def test_what_it_cannot_reproduce_is_refused() -> None:
    @dataclass(slots=True)
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = field(default_factory=list)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KeywordOnly:
        a: int

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        scale: InitVar[int] = 1

        def __post_init__(self, scale: int) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class NotInInit:
        a: int
        b: int = field(default=0, init=False)

    clashing = dataclasses.make_dataclass(
        "Clashing", [("__quick_init_set0", int)], frozen=True, slots=True
    )
    refused = (Mutable, NoSlots, Factory, KeywordOnly, WithInitVar, NotInInit, clashing, int)
    for cls in refused:
        with pytest.raises(TypeError):
            quick_init(cls)


def test_the_annotations_resolve_in_the_module() -> None:
    # Strings under `from __future__ import annotations`: documentation tools evaluate them.
    hints = typing.get_type_hints(TaskRequest.__init__)
    assert hints == {**typing.get_type_hints(TaskRequest), "return": type(None)}
    assert inspect.signature(TaskSpec, eval_str=True).parameters["retry"].annotation is RetryPolicy
