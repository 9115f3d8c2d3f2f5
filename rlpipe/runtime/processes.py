"""Stage processes on one machine: started so that nothing outlives the launcher and the working
directory cannot shadow the installed package, and failures reported so the launcher can name the
rank that failed first (the others fail after it, when their peer disappears)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
FAILURE_DIR_ENV = "RLPIPE_FAILURE_DIR"

# ``python -m`` would put the working directory first on sys.path, where a folder named ``rlpipe``
# (a clone, say) would shadow the installed package; this drops that entry before importing rlpipe.
STAGE_BOOTSTRAP = "import sys; del sys.path[0]; from rlpipe.runtime.__main__ import main; sys.exit(main())"


def stage_command(argv: list[str]) -> list[str]:
    """The command line of one stage process."""
    return [sys.executable, "-c", STAGE_BOOTSTRAP, *argv]


def die_with_parent() -> None:
    """``preexec_fn`` for Popen (Linux): the child gets SIGKILL when its parent dies, however it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the parent's own clean-up still applies
        pass


def report_failure(rank: int, error: BaseException) -> None:
    """A failing stage writes when and why it failed, where the launcher looks (if it set the place)."""
    folder = os.environ.get(FAILURE_DIR_ENV)
    if not folder:
        return
    message = f"{type(error).__name__}: {error}".splitlines()[0] if str(error) else type(error).__name__
    Path(folder, f"rank{rank}.json").write_text(json.dumps({"rank": rank, "time": time.time(), "error": message}))


HEARTBEAT_S = 1.0
"""How often a stage process marks that it is alive, s."""


def start_heartbeat(rank: int, interval_s: float = HEARTBEAT_S) -> None:
    """Mark, every ``interval_s`` from a background thread, that this process runs, where the launcher
    looks (if it set the place). A stage stopped (SIGSTOP, a frozen node) stops beating; one blocked in
    a collective beats on (torch releases the GIL while it waits), so the launcher can tell them apart."""
    folder = os.environ.get(FAILURE_DIR_ENV)
    if not folder:
        return
    beat = Path(folder, f"heartbeat{rank}")

    def beat_forever() -> None:
        while True:
            beat.touch()
            time.sleep(interval_s)

    threading.Thread(target=beat_forever, name="rlpipe-heartbeat", daemon=True).start()


def first_failure(folder: str | Path, killed: list[tuple[int, int]],
                  silent: list[int] | None = None) -> tuple[int, str]:
    """The rank that failed first and why.

    Args:
        folder: where the stages wrote their failure reports and heartbeats.
        killed: ``(rank, signal)`` of stages found killed by a signal before the launcher stopped
            anything: such a stage is a cause (it could write no report), not a consequence.
        silent: ranks still running, without a report, when the launcher gave up waiting.

    When stages failed because they timed out waiting, the cause is the stage they waited for: one
    that stopped (its heartbeat is stale) or, failing that, one still running that never timed out
    (stuck in its own work).
    """
    if killed:
        rank, signum = killed[0]
        return rank, f"killed by {signal.Signals(signum).name}"
    reports = []
    for path in Path(folder).glob("rank*.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not reports:
        return -1, "no report"
    if any(TIMED_OUT.search(str(report["error"])) for report in reports):
        stalled = _stalest(folder)
        if stalled is not None:
            return stalled
        if silent:
            return silent[0], "stopped answering: the others timed out waiting for it, it never failed itself"
    first = min(reports, key=lambda report: report["time"])
    return int(first["rank"]), str(first["error"])


TIMED_OUT = re.compile(r"time[d]? ?out", re.IGNORECASE)


def _stalest(folder: str | Path) -> tuple[int, str] | None:
    """The rank whose heartbeat stopped while the others' went on, and since when."""
    now = time.time()
    ages = {int(path.name[len("heartbeat"):]): now - path.stat().st_mtime for path in Path(folder).glob("heartbeat*")}
    if not ages:
        return None
    # the others stop beating too once they give up, so a stopped rank is one that fell silent well
    # before the last heartbeat any rank wrote
    freshest = min(ages.values())
    stale = [rank for rank, age in ages.items() if age - freshest > 3 * HEARTBEAT_S]
    if not stale:
        return None
    oldest = max(stale, key=lambda rank: ages[rank])
    return oldest, (f"stopped responding: no heartbeat for {ages[oldest]:.0f} s, and the others timed out "
                    f"waiting for it")
