"""Task ids: 63-bit integers with the fencing epoch in the upper bits.

Ids issued under a later epoch are larger than every id of an earlier one, so id order is
submission order across failovers, and a new leader never reissues an id even when the rows
that held the old ones were pruned.
"""

from __future__ import annotations

from cronoq.errors import StoreFatal

SEQUENCE_BITS = 40
EPOCH_BITS = 63 - SEQUENCE_BITS
MAX_EPOCH = (1 << EPOCH_BITS) - 1


def first_id(epoch: int, high_water_mark: int) -> int:
    """The first id a leader of ``epoch`` issues, above every id issued before."""
    if not 1 <= epoch <= MAX_EPOCH:
        raise StoreFatal(f"epoch {epoch} is outside 1..{MAX_EPOCH}; task ids cannot encode it")
    return max(epoch << SEQUENCE_BITS | 1, high_water_mark + 1)


def epoch_of(task_id: int) -> int:
    return task_id >> SEQUENCE_BITS
