"""What rank 0 shows while a run goes: a progress bar with the latest interval's figures, a line per
repartition, and one summary line at the end."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm


class RunProgress:
    """Progress of a live run on rank 0.

    Args:
        first_iteration: where the run starts (a resumed run starts past 0).
        iterations: the iteration it ends at.
        log_path: the JSONL log, named in the summary (``None``: no log).
    """

    def __init__(self, first_iteration: int, iterations: int, log_path: str | None):
        self.bar = tqdm(total=iterations, initial=first_iteration, desc="rlpipe run", unit="it", dynamic_ncols=True)
        self.log_path = log_path
        self.samples, self.seconds, self.repartitions, self.stall_s = 0.0, 0.0, 0, 0.0
        self.chunks = self.overran = 0

    def interval(self, record: dict[str, Any]) -> None:
        """Show one interval's log record."""
        iterations = len(record["losses"]) or record["iteration"] - self.bar.n
        self.samples += record["throughput_samples_s"] * record["interval_s"]
        self.seconds += record["interval_s"]
        if "emulation" in record:
            self.chunks += record["emulation"]["chunks"]
            self.overran += record["emulation"]["overran"]
        for repartition in record.get("repartitions", [record["repartition"]] if "repartition" in record else []):
            if repartition["committed"]:
                self.repartitions += 1
                self.stall_s += repartition["stall_s"]
            outcome = "moved" if repartition["committed"] else "aborted, kept"
            self.bar.write(f"iteration {repartition['iteration']}: repartition {repartition['from']} -> "
                           f"{repartition['to']} {outcome} in {repartition['stall_s']:.3f} s")
        postfix = {"samples/s": f"{record['throughput_samples_s']:.1f}", "loss": f"{record['loss']:.4f}",
                   "boundaries": ",".join(map(str, record["boundaries"]))}
        if "decision" in record:
            postfix["next"] = record["decision"]["action"]
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(iterations)

    def overran_fraction(self) -> float | None:
        """The fraction of compute chunks whose real compute overran their emulated device time
        (``None``: device time was real)."""
        return self.overran / self.chunks if self.chunks else None

    def close(self) -> str:
        """Close the bar; returns the run's one-line summary."""
        self.bar.close()
        throughput = self.samples / self.seconds if self.seconds > 0 else 0.0
        where = f"; log: {self.log_path}" if self.log_path else ""
        fraction = self.overran_fraction()
        emulation = "" if fraction is None else f", {fraction:.1%} of chunks overran their emulated time"
        return (f"rlpipe run: {self.bar.n} iterations, {throughput:.1f} samples/s over {self.seconds:.1f} s, "
                f"{self.repartitions} repartitions ({self.stall_s:.3f} s stall){emulation}{where}")
