"""Live runs for the runtime tests: ``rlpipe run`` in a subprocess, its log and final parameters, and
the comparison of two runs' training."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin", "RLPIPE_CACHE_DIR": os.environ["RLPIPE_CACHE_DIR"]}
"""What a test's subprocess sees: the tests' own modules, a bare PATH, the suite's profile cache."""


def _spin(seconds: float) -> float:
    """Spin for ``seconds`` of wall time; the share of it this process got on a core."""
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - start_wall < seconds:
        pass
    return (time.process_time() - start_cpu) / (time.perf_counter() - start_wall)


def free_core_share(cores: int, seconds: float = 1.0) -> float:
    """The smallest share of a core that each of ``cores`` spinning processes got: about 1.0 where the
    machine has that many cores free, 0.5 where another busy process shares two."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(cores) as pool:
        return min(pool.map(_spin, [seconds] * cores))


def _products_per_s(seconds: float) -> float:
    """One core's speed: 256 x 256 matrix products per second, in one thread, for ``seconds``."""
    torch.set_num_threads(1)
    matrix, start, products = torch.randn(256, 256), time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        matrix @ matrix
        products += 1
    return products / (time.perf_counter() - start)


def core_speed(cores: int, seconds: float = 1.0) -> float:
    """The machine's speed now: the mean over ``cores`` processes, one a core, each timing matrix products
    for ``seconds`` (products per second). Measured with nothing else of the test running, since a sampler
    beside a live run measures how much CPU the run leaves free, which moves with its partition (a 3 / 5
    split of layers left it 1.3x more than 5 / 3). On a shared virtual machine it moves by a third from
    one minute to the next with nothing else running here (another tenant of the host)."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(cores) as pool:
        speeds = pool.map(_products_per_s, [seconds] * cores)
    return sum(speeds) / cores


class ForeignCpu:
    """How many cores' worth of CPU time processes other than this test and its children took while the
    ``with`` block ran (machine-wide busy time from ``/proc/stat`` minus this process's and its reaped
    children's own): ``cores`` after the block."""

    @staticmethod
    def _machine_busy_s() -> float:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        import resource

        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))

    def __enter__(self) -> "ForeignCpu":
        self._start = (time.perf_counter(), self._machine_busy_s(), self._own_s())
        return self

    def __exit__(self, *exc) -> None:
        wall, busy, own = (now - then for now, then in zip(
            (time.perf_counter(), self._machine_busy_s(), self._own_s()), self._start, strict=True))
        self.cores = max(busy - own, 0.0) / max(wall, 1e-9)


def run_command(*args, timeout=240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``rlpipe run ARGS`` as a user starts it, however it ends, with ``env`` added to ENV."""
    return subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", *args], capture_output=True, text=True,
                          timeout=timeout, env={**ENV, **(env or {})})


def start_run(*args, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``rlpipe run ARGS`` in the background (to stop or kill its stages), with ``env`` added to ENV.
    SIGINT is set back to its default, as a terminal's foreground job has it: a suite started as a
    background job (``make test &``) passes SIGINT on ignored, and a Ctrl-C sent then reached no one."""
    return subprocess.Popen([sys.executable, "-m", "rlpipe.cli", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**ENV, **(env or {})},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def run_watching_stages(*args, timeout=60) -> tuple[subprocess.CompletedProcess, set[int]]:
    """``rlpipe run ARGS`` to its end, and the pids of every stage process it was seen to start (its own
    children, not another run's)."""
    launcher = start_run(*args)
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while launcher.poll() is None and time.monotonic() < deadline:
        seen |= set(children_with_rank(launcher.pid).values())
        time.sleep(0.01)
    stdout, stderr = launcher.communicate(timeout=max(deadline - time.monotonic(), 1))
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, stdout, stderr), seen


def read_log(log: Path) -> list[dict]:
    return [json.loads(line) for line in Path(log).read_text().splitlines()]


def run_summary(stdout: str) -> str:
    """The run's closing summary line (``rlpipe run: N iterations ...``): the last ``rlpipe run:`` line
    that is no warning. On a busy host a warning that the emulation did not hold may follow it."""
    summaries = [line for line in stdout.splitlines()
                 if line.startswith("rlpipe run:") and not line.startswith("rlpipe run: warning:")]
    assert summaries, stdout[-2000:]
    return summaries[-1]


def rlpipe_run(tmp_path, name, *args, timeout=240, env: dict[str, str] | None = None):
    """A run that must succeed: its log records and its final parameters."""
    log = tmp_path / f"{name}.jsonl"
    params = tmp_path / f"{name}.pt"
    result = run_command(*args, "--log", str(log), "--save-params", str(params), timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return read_log(log), torch.load(params, weights_only=True)


def overran_share(records) -> float:
    """The share of a run's compute chunks that overran their emulated device time (1.0: none timed); over
    0.05, the emulation did not hold (the run says so) and the run measured the host, not the devices."""
    chunks = sum(r["emulation"]["chunks"] for r in records if "emulation" in r)
    return sum(r["emulation"]["overran"] for r in records if "emulation" in r) / chunks if chunks else 1.0


def losses(records):
    return [loss for record in records for loss in record["losses"]]


def assert_same_training(a, b, tolerance=1e-5):
    (records_a, params_a), (records_b, params_b) = a, b
    la, lb = losses(records_a), losses(records_b)
    assert len(la) == len(lb) and all(abs(x - y) <= tolerance for x, y in zip(la, lb)), (la, lb)
    assert params_a.keys() == params_b.keys()
    for key in params_a:
        assert torch.allclose(params_a[key], params_b[key], atol=tolerance, rtol=0), key


def children_with_rank(parent_pid: int) -> dict[int, int]:
    """{rank: pid} of the stage processes a launcher started (they are named ``rlpipe rank N``)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            name = (entry / "comm").read_text().strip()
        except (OSError, StopIteration):
            continue
        if ppid == parent_pid and name.startswith("rlpipe rank "):
            found[int(name.split()[-1])] = int(entry.name)
    return found


def alive(pids) -> list[int]:
    """The processes among ``pids`` that still run (a zombie does not)."""
    running = []
    for pid in pids:
        try:
            state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "zombie" not in state:
            running.append(pid)
    return running
