"""One iteration's batch among the replicas: which rows each trains, in how many micro-batches, and
how their losses and gradients are weighted.

Every rank is handed the same global batch. Replica r trains micro-batches ``sum(split[:r])`` to
``sum(split[:r + 1]) - 1`` of it, every micro-batch the same number of rows. Each micro-batch's loss is
a mean over its rows, so the job's loss is the mean of all micro-batch losses and its gradient the
sum of their gradients over the job's micro-batch count: the same for every split.

A batch whose rows do not divide into the job's micro-batches (a DataLoader's short last batch) is
trained in smaller micro-batches that do divide it, shared in proportion to the split: the loss and
gradients are those of its real rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rlpipe.errors import InputError


@dataclass(frozen=True)
class BatchPlan:
    """How one batch is trained.

    Attributes:
        rows: rows in the batch.
        microbatch_rows: rows in every micro-batch.
        split: micro-batches per replica.
    """

    rows: int
    microbatch_rows: int
    split: tuple[int, ...]

    @property
    def total(self) -> int:
        """Micro-batches of the whole job."""
        return sum(self.split)

    def replica_rows(self, replica: int) -> slice:
        """The rows of the global batch that ``replica`` trains."""
        start = sum(self.split[:replica]) * self.microbatch_rows
        return slice(start, start + self.split[replica] * self.microbatch_rows)

    @property
    def gradient_scale(self) -> float:
        """What each replica's summed micro-batch gradients are multiplied by before the replicas sum them."""
        return 1.0 / self.total


def plan_batch(rows: int, split: Sequence[int], minimum: int) -> BatchPlan:
    """The plan for a batch of ``rows`` under ``split``: equal micro-batches of ``rows / sum(split)`` when
    they divide; otherwise the largest micro-batch that divides ``rows`` into enough micro-batches for
    every replica (``minimum`` each), shared in proportion to ``split``.

    Raises :class:`InputError` when the batch is too small for any plan.
    """
    total = sum(split)
    if rows >= total and rows % total == 0:
        return BatchPlan(rows, rows // total, tuple(split))
    replicas = len(split)
    for size in range(max(rows // total, 1), 0, -1):
        if rows % size or rows // size < replicas * minimum:
            continue
        return BatchPlan(rows, size, _proportional(rows // size, split, minimum))
    raise InputError(f"a batch of {rows} samples cannot be trained by {replicas} replica(s) needing {minimum} "
                     f"micro-batch(es) each; drop it (DataLoader(..., drop_last=True))")


def _proportional(count: int, split: Sequence[int], minimum: int) -> tuple[int, ...]:
    """``count`` micro-batches in proportion to ``split`` (largest remainders), each at least ``minimum``."""
    total = sum(split)
    shares = [count * m / total for m in split]
    counts = [max(minimum, math.floor(s)) for s in shares]
    while sum(counts) > count:  # the minimums took too much: take back from the largest
        counts[max(range(len(counts)), key=lambda r: counts[r] - minimum)] -= 1
    order = sorted(range(len(split)), key=lambda r: shares[r] - math.floor(shares[r]), reverse=True)
    for k in range(count - sum(counts)):
        counts[order[k % len(order)]] += 1
    return tuple(counts)
