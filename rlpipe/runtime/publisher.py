"""What rank 0 writes of a run: one JSONL record per interval (with the run's header first and the
simulator's prediction beside the measurement), and the progress a person watches."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import numpy as np

from rlpipe.runtime.config import PipelineConfig
from rlpipe.runtime.interval import IntervalMeter
from rlpipe.runtime.mesh import ParallelDims
from rlpipe.runtime.progress import RunProgress
from rlpipe.runtime.step_costs import StepCosts
from rlpipe.simulator import Overheads, PipelineCosts


class Publisher:
    """Rank 0's record of a run.

    Args:
        config: the pipeline's options (the log's path, whether to append, the run's length).
        dims: the job's layout.
        predictor: the simulator's model of the run (the profile in device time).
        header: what the log's first record says of the whole run (see :mod:`rlpipe.runlog`).
        overheads: the host overheads the prediction includes.
        bandwidth_gbps: the measured point-to-point bandwidth (pipeline links), Gbit/s.
        step_costs: the gradient sync and optimizer step the prediction includes (measured at start-up).
    """

    def __init__(self, config: PipelineConfig, dims: ParallelDims, predictor: PipelineCosts, header: dict[str, Any],
                 overheads: Overheads, bandwidth_gbps: float, step_costs: StepCosts):
        self.config, self.dims, self.predictor, self.header = config, dims, predictor, header
        self.overheads, self.bandwidth_gbps, self.step_costs = overheads, bandwidth_gbps, step_costs
        self.log: IO[str] | None = None
        if config.log:
            Path(config.log).parent.mkdir(parents=True, exist_ok=True)
            self.log = open(config.log, "a" if config.append_log else "w")
        self.progress = (RunProgress(config.first_iteration, config.total_iterations, config.log, config.duration_s)
                         if config.total_iterations is not None or config.duration_s is not None else None)
        self.header_written = False

    def prediction(self, meter: IntervalMeter) -> dict[str, Any]:
        """What the simulator predicts for the interval's steady iterations (warm-up steps left out, as
        in ``iteration_ms``): their mean iteration time and each stage's compute per micro-batch (its
        stage group's slowest member), for the partitions, splits and injected slowdowns they ran under.
        Each iteration ends with the gradient sync and the optimizer step of the stage holding the most
        parameters."""
        dims, bandwidth = self.dims, self.bandwidth_gbps or np.inf
        iteration_ms, stage_ms = [], []
        steady = [c for c in meter.conditions if not c[-1]] or meter.conditions
        for boundaries, slowdown, split, _ in steady:
            step_ms = self.step_costs.optimizer_ms(float(self.predictor.stage_param_bytes(boundaries).max()))
            timing = self.predictor.simulate_hybrid(boundaries, self.config.schedule, split,
                                                    np.reshape(slowdown, (dims.replicas, dims.stages)), bandwidth,
                                                    overheads=replace(self.overheads, iteration_ms=step_ms),
                                                    dp_bandwidth_gbps=self.step_costs.sync_gbps or bandwidth)
            iteration_ms.append(timing.iteration_ms)
            stage_ms.append(np.max([t.compute_ms / m for t, m in zip(timing.replicas, split, strict=True)], axis=0))
        return {"predicted_iteration_ms": float(np.mean(iteration_ms)),
                "predicted_compute_ms": np.mean(stage_ms, axis=0).tolist()}

    def rescale(self, scale: float, factor: float) -> None:
        """Devices emulated ``factor`` times slower from now on (at ``scale``): predict them so, and say so
        (the header keeps the scale the run started at; the record of the interval says the new one)."""
        self.predictor = PipelineCosts(self.predictor.profile.scaled(factor))
        self.write(f"rlpipe run: emulated device time overran on this busy machine: the devices now run "
                   f"{factor:g}x slower (scale x{scale:g})")

    def publish(self, record: dict[str, Any]) -> None:
        """Append one interval's record (the header goes with the first) and show it."""
        record["p2p_gbps"] = self.bandwidth_gbps
        if not self.header_written:
            record["run"] = self.header
            self.header_written = True
        if self.log:
            self.log.write(json.dumps(record) + "\n")
            self.log.flush()
        if self.progress is not None:
            self.progress.interval(record)

    def write(self, message: str) -> None:
        """A line for the person watching, above the progress bar."""
        if self.progress is not None:
            self.progress.bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.bar.close()
        if self.log:
            self.log.close()
