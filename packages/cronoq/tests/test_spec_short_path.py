"""Scheduler._spec takes a short path for a request whose fields other than pool, kind,
payload and limits are all at their defaults. It must build what the full checks build, and
refuse what they refuse with the same error, for any request: the full checks are the
reference."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq import Limit, MissPolicy, Pool, RetryPolicy, Scheduler, TaskContext, TaskRequest

_DEFAULTS = TaskRequest("")
_NOW_NS = 1_700_000_000 * 1_000_000_000


async def _noop(ctx: TaskContext, payload: Any) -> None:
    pass


# Per field: its default (often, so the short path is taken), or a value the checks accept or
# refuse, including values equal to the default but not the default object (0.0, False, a list).
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "kind": st.sampled_from(["k", "", "a\x00b", "\udcff", 3, None]),
    "payload": st.sampled_from([None, b"", b"p", "text", 7, b"x" * 70_000]),
    "pool": st.sampled_from(["default", "slow", "nope", "", 1, None]),
    "key": st.sampled_from([None, "key", "", 5]),
    "tags": st.sampled_from([(), [], ("t",), "t", "", None]),
    "name": st.sampled_from([None, "n", ""]),
    "priority": st.sampled_from([0, 0.0, False, 3, -(10**30)]),
    "retry": st.sampled_from([None, RetryPolicy(max_attempts=2), "retry"]),
    "start_at": st.sampled_from([None, timedelta(seconds=5), datetime(2030, 1, 1, tzinfo=UTC)]),
    "miss_policy": st.sampled_from([MissPolicy.RUN_LATE, "run_late", MissPolicy.SKIP, "x"]),
    "grace": st.sampled_from([_DEFAULTS.grace, 60.0, 60, 0, -1.0, timedelta(seconds=60)]),
    "deadline": st.sampled_from([None, timedelta(seconds=1), "soon"]),
    "timeout": st.sampled_from([None, 2.5, 0]),
    "after": st.sampled_from([(), [], (1,), (0,), "1", ""]),
    "limits": st.sampled_from(
        [
            None,
            {},
            {"tenant": "a"},
            {"tenant": None},
            {"api": None},
            {"api": "k"},
            {"nope": 1},
            {"tenant": "a", "api": None},
            {3: None},
            ["api"],
            {"tenant": "a\x00"},
        ]
    ),
}


@st.composite
def _requests(draw: st.DrawFn) -> TaskRequest:
    # A few fields given, the rest left at their defaults: a request one field away from the
    # short path is the case that tells a missing condition.
    given = draw(st.lists(st.sampled_from(sorted(_FIELDS)), max_size=3, unique=True))
    fields = {name: draw(_FIELDS[name]) for name in given}
    return TaskRequest(**{"kind": "k", **fields})


def _outcome(call: Any) -> tuple[Any, ...]:
    try:
        return ("built", call())
    except Exception as exc:
        return ("raised", type(exc), str(exc))


@settings(max_examples=600, deadline=None)
@given(_requests())
def test_the_short_path_builds_and_refuses_as_the_full_checks(request: TaskRequest) -> None:
    limits = [Limit("tenant", concurrency=1, per_key=True), Limit("api", rate=5, per=1.0)]
    pools = [Pool("default", _noop), Pool("slow", _noop, limits=("api",))]
    sched = Scheduler(pools, limits=limits)
    ours = _outcome(lambda: sched._spec(request, _NOW_NS))
    assert ours == _outcome(lambda: sched._checked_spec(request, _NOW_NS))


def test_a_request_at_its_defaults_is_built_as_the_full_checks_build_it() -> None:
    sched = Scheduler([Pool("default", _noop)])
    request = TaskRequest("k", b"p")
    assert sched._spec(request, _NOW_NS) == sched._checked_spec(request, _NOW_NS)
