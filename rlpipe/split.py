"""How a hybrid job's micro-batches are shared among its data-parallel replicas.

A job of D replicas of an S-stage pipeline trains D x M micro-batches per iteration (M per replica
when the split is even). Replica r runs ``split[r]`` of them; any split with the same total gives the
same update, because each replica's gradient is weighted by the samples it ran (see
:mod:`rlpipe.runtime.split`). A replica needs at least one micro-batch, and under 1F1B at least as
many as it has stages. Moving micro-batches to faster replicas (FALCON, USENIX ATC'25) moves no state:
it takes effect at the next iteration.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from rlpipe.errors import InputError


def minimum_per_replica(schedule: str, num_stages: int) -> int:
    """The fewest micro-batches a replica may run: one, and under 1F1B one per stage."""
    return max(1, num_stages) if schedule == "1f1b" else 1


def even_split(replicas: int, microbatches: int) -> tuple[int, ...]:
    """``microbatches`` micro-batches on every replica."""
    return (microbatches,) * replicas


def parse_split(text: str, option: str = "split") -> tuple[int, ...]:
    """``"3,5"`` as a split; errors name the option."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"{option} '{text}': expected comma-separated micro-batch counts like 3,5") from None


def check_split(split: Sequence[int], replicas: int, microbatches: int, schedule: str, num_stages: int,
                option: str = "split") -> tuple[int, ...]:
    """The split as a tuple, or one InputError saying what is wrong with it.

    Args:
        split: micro-batches per replica.
        replicas: the job's data-parallel degree D.
        microbatches: micro-batches per replica of the even split (M): the split must total D x M.
        schedule, num_stages: what sets the fewest micro-batches a replica may run.
        option: what to call it in errors.
    """
    values = tuple(int(m) for m in split)
    shown = ("" if option.endswith(":") else " ") + ",".join(map(str, values))
    if len(values) != replicas:
        raise InputError(f"{option}{shown}: {len(values)} replicas, the job has {replicas}")
    if sum(values) != replicas * microbatches:
        raise InputError(f"{option}{shown}: totals {sum(values)} micro-batches, the job trains "
                         f"{replicas} x {microbatches} = {replicas * microbatches} per iteration")
    fewest = minimum_per_replica(schedule, num_stages)
    if min(values) < fewest:
        why = f" (1F1B needs one per stage, {num_stages})" if schedule == "1f1b" and fewest > 1 else ""
        raise InputError(f"{option}{shown}: every replica needs at least {fewest} micro-batch(es){why}")
    return values


def balanced_split(fill_ms: Sequence[float], step_ms: Sequence[float], total: int, minimum: int) -> tuple[int, ...]:
    """The split of ``total`` micro-batches that minimises the slowest replica's time, each replica's time
    with m micro-batches taken as ``fill_ms[r] + (m - 1) step_ms[r]`` (its pipeline's fill, then one
    bottleneck per further micro-batch): every replica starts at ``minimum``, then each further micro-batch
    goes where the time after adding it is smallest (optimal for such linear times).

    Args:
        fill_ms: each replica's time with one micro-batch, ms.
        step_ms: what each further micro-batch adds, ms.
        total: micro-batches to share.
        minimum: the fewest a replica may run.
    """
    replicas = len(fill_ms)
    if total < replicas * minimum:
        raise InputError(f"{total} micro-batches cannot give {replicas} replicas {minimum} each")
    counts = greedy_split(np.asarray(fill_ms, dtype=np.float64), np.asarray(step_ms, dtype=np.float64), total,
                           minimum)
    return tuple(int(m) for m in counts)


@njit(cache=True)
def greedy_split(fill, step, total, minimum):  # pragma: no cover
    replicas = fill.shape[0]
    counts = np.full(replicas, minimum, dtype=np.int64)
    for _ in range(total - replicas * minimum):
        best, best_ms = 0, np.inf
        for r in range(replicas):
            after = fill[r] + counts[r] * step[r]  # its time with one more micro-batch
            if after < best_ms:
                best, best_ms = r, after
        counts[best] += 1
    return counts
