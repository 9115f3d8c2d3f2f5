"""Stage processes on one machine: started so that nothing outlives the launcher and the working
directory cannot shadow the installed package, and failures reported so the launcher can name the
rank that failed first (the others fail after it, when their peer disappears)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
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


def first_failure(folder: str | Path, killed: list[tuple[int, int]]) -> tuple[int, str]:
    """The rank that failed first and why.

    Args:
        folder: where the stages wrote their failure reports.
        killed: ``(rank, signal)`` of stages found killed by a signal before the launcher stopped
            anything: such a stage is a cause (it could write no report), not a consequence.
    """
    if killed:
        rank, signum = killed[0]
        return rank, f"killed by signal {signum} ({signal.Signals(signum).name})"
    reports = []
    for path in Path(folder).glob("rank*.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # a report cut short by the stop: its rank failed later anyway
            continue
    if not reports:
        return -1, "no report"
    first = min(reports, key=lambda report: report["time"])
    return int(first["rank"]), str(first["error"])
