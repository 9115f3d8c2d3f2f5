"""What rank 0 shows while a run goes: where it starts (a resumed run says from which iteration), a
progress bar with the latest interval's figures, a line per repartition or rebalance, and one summary
line at the end that counts what this run did."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm


class RunProgress:
    """Progress of a live run on rank 0.

    Args:
        first_iteration: where the run starts (a resumed run starts past 0).
        iterations: the iteration it ends at.
        log_path: the JSONL log, named in the summary (``None``: no log).
        duration_s: its wall-time budget, s (``None``: none): the bar then counts seconds.
    """

    def __init__(self, first_iteration: int, iterations: int | None, log_path: str | None,
                 duration_s: float | None = None):
        if first_iteration:
            print(f"rlpipe run: resumed from iteration {first_iteration}", flush=True)
        self.by_time = duration_s is not None
        if self.by_time:
            self.bar = tqdm(total=duration_s, desc="rlpipe run", unit="s", dynamic_ncols=True,
                            bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]")
        else:
            self.bar = tqdm(total=iterations, initial=first_iteration, desc="rlpipe run", unit="it",
                            dynamic_ncols=True)
        self.log_path = log_path
        self.first_iteration = first_iteration
        self.iterations = 0
        self.samples, self.seconds, self.repartitions, self.stall_s = 0.0, 0.0, 0, 0.0
        self.rebalances = 0
        self.chunks = self.overran = 0

    def interval(self, record: dict[str, Any]) -> None:
        """Show one interval's log record."""
        iterations = len(record["losses"]) or record["iteration"] - self.first_iteration - self.iterations
        self.iterations += iterations
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
        if "rebalance" in record:
            self.rebalances += 1
            rebalance = record["rebalance"]
            self.bar.write(f"iteration {rebalance['iteration']}: micro-batches {rebalance['from']} -> "
                           f"{rebalance['to']} from the next iteration")
        postfix = {"samples/s": f"{record['throughput_samples_s']:.1f}", "loss": f"{record['loss']:.4f}",
                   "boundaries": ",".join(map(str, record["boundaries"]))}
        if len(record.get("microbatch_split", [])) > 1:
            postfix["split"] = ",".join(map(str, record["microbatch_split"]))
        if "decision" in record:
            postfix["next"] = record["decision"]["action"]
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(min(record["interval_s"], max(self.bar.total - self.bar.n, 0)) if self.by_time else iterations)

    def overran_fraction(self) -> float | None:
        """The fraction of compute chunks whose real compute overran their emulated device time
        (``None``: device time was real)."""
        return self.overran / self.chunks if self.chunks else None

    def close(self) -> str:
        """Close the bar; returns the run's one-line summary (what this run did, a resumed one included)."""
        self.bar.close()
        throughput = self.samples / self.seconds if self.seconds > 0 else 0.0
        where = f"; log: {self.log_path}" if self.log_path else ""
        fraction = self.overran_fraction()
        emulation = "" if fraction is None else f", {fraction:.1%} of chunks overran their emulated time"
        resumed = f" (iterations {self.first_iteration}-{self.first_iteration + self.iterations})" \
            if self.first_iteration else ""
        rebalances = f", {self.rebalances} rebalances" if self.rebalances else ""
        return (f"rlpipe run: {self.iterations} iterations{resumed}, {throughput:.1f} samples/s over "
                f"{self.seconds:.1f} s, {self.repartitions} repartitions ({self.stall_s:.3f} s stall){rebalances}"
                f"{emulation}{where}")
