"""Stage processes on one machine: forked from the launcher (which has imported torch and rlpipe
already, so a stage starts in milliseconds) so that nothing outlives it, and failures reported so the
launcher can name the rank that failed first (the others fail after it, when their peer disappears)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
FAILURE_DIR_ENV = "RLPIPE_FAILURE_DIR"


def _prctl(option: int, value: int | bytes) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)
    except OSError:  # not Linux: the parent's own clean-up still applies
        pass


def die_with_parent() -> None:
    """``preexec_fn`` for Popen (Linux): the child gets SIGKILL when its parent dies, however it dies."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def stage_name(rank: int) -> str:
    """A stage process's name as ``ps`` and ``/proc/PID/comm`` show it."""
    return f"rlpipe rank {rank}"


class StageProcess:
    """One stage process, forked from the launcher: ``target()`` runs in it with ``env`` added to its
    environment, and its return value is the exit status (an exception: 1, its traceback on stderr).
    The same ``poll`` / ``wait`` / ``terminate`` / ``kill`` / ``returncode`` as a Popen, negative for a
    signal."""

    def __init__(self, rank: int, env: dict[str, str], target: Callable[[], int]):
        self.rank = rank
        self.returncode: int | None = None
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the stage process: never returns into the launcher's code
            code = 1
            try:
                die_with_parent()
                _prctl(PR_SET_NAME, stage_name(rank).encode())
                os.environ.update(env)
                code = target()
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(stage_name(self.rank), timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


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
