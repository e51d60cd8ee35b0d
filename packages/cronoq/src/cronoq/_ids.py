"""Task ids: 63-bit integers with the fencing epoch in the upper bits.

Ids issued under a later epoch are larger than every id of an earlier one, so id order is
submission order across failovers, and a new leader never reissues an id even when the rows
that held the old ones were pruned.

Each epoch owns ``2**SEQUENCE_BITS - 1`` ids (about 1.1 trillion: a year at 34,000 tasks per
second). A leader that has issued them all refuses further submissions with
``SchedulerError`` rather than spill into the next epoch's range (and past ``2**63 - 1`` for
the last epoch); restarting the scheduler leads under a new epoch with a fresh range. That is
simpler than switching epochs under a running leader, which would need the store to fence the
old epoch while its attempts still run.
"""

from __future__ import annotations

from cronoq.errors import StoreFatal

SEQUENCE_BITS = 40
EPOCH_BITS = 63 - SEQUENCE_BITS
MAX_EPOCH = (1 << EPOCH_BITS) - 1


def first_id(epoch: int, high_water_mark: int) -> int:
    """The first id a leader of ``epoch`` issues, above every id issued before.

    ``last_id(epoch) + 1`` when the epoch's ids are already used up (a rebuild of a leader that
    issued them all): every submission is then refused.
    """
    if not 1 <= epoch <= MAX_EPOCH:
        raise StoreFatal(f"epoch {epoch} is outside 1..{MAX_EPOCH}; task ids cannot encode it")
    if high_water_mark > last_id(epoch):
        # Ids of a later epoch exist: the store's epoch went backwards.
        raise StoreFatal(
            f"the store's id high-water mark {high_water_mark} belongs to epoch "
            f"{epoch_of(high_water_mark)}, after this leader's epoch {epoch}"
        )
    return max(epoch << SEQUENCE_BITS | 1, high_water_mark + 1)


def last_id(epoch: int) -> int:
    """The largest id of ``epoch``'s range."""
    return (epoch + 1 << SEQUENCE_BITS) - 1


def epoch_of(task_id: int) -> int:
    return task_id >> SEQUENCE_BITS
