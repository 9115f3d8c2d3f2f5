"""Run logs synthesised with known simulator parameters (what ``rlpipe calibrate`` should recover), shared by
the calibration, CLI and training tests."""

import numpy as np

from rlpipe.calibration import header_costs
from rlpipe.simulator import Overheads

TRUTH = {"compute_bias": 0.04, "noise_sigma": 0.03, "outlier_probability": 0.05, "outlier_scale": 0.5,
         "op_overhead_ms": 1.5, "iteration_overhead_ms": 6.0, "migration_overhead_s": 0.12, "p2p_gbps": 12.0}


def synthetic_run(seed: int, intervals: int = 300, start_up: tuple[float, float] | None = None) -> list[dict]:
    """A run's log as the truth above would write it: 4 stages, 8 layers, 1F1B, 4 micro-batches.

    ``start_up``: (per-operation overhead ms, optimizer step ms per MiB) the run measured at start-up, as
    its header says and its live prediction includes; the truth's overheads are then beyond them.
    ``None``: a log from before those measurements."""
    rng = np.random.default_rng(seed)
    header = {"stages": 4, "schedule": "1f1b", "microbatches": 4, "device_time": "real",
              "device_time_scale": 2.0, "oversubscribed": False, "p2p_gbps": TRUTH["p2p_gbps"],
              "forward_ms": rng.uniform(2, 6, 8).tolist(), "backward_ms": rng.uniform(4, 12, 8).tolist()}
    if start_up is not None:
        header.update(op_overhead_ms=start_up[0], optimizer_ms_per_mb=start_up[1], sync_gbps=None,
                      # drawn apart, so that the rest of the run is that of the same seed without start-up figures
                      param_bytes=np.random.default_rng(seed + 1).integers(2 * 2**20, 6 * 2**20, 8).tolist())
    costs = header_costs(header)
    stage_bias = rng.normal(0.0, 0.02, 4)
    records = []
    for k in range(intervals):
        boundaries = [[0, 2, 4, 6], [0, 3, 5, 7], [0, 1, 4, 6]][k % 3]
        slowdown = 1.0 + rng.exponential(0.2, 4) * (rng.random(4) < 0.3)
        start_up_overheads = Overheads()
        if start_up is not None:  # the optimizer step of the stage holding the most parameters
            start_up_overheads = Overheads(start_up[0], start_up[1] * costs.stage_param_bytes(boundaries).max() / 2**20)
        clean = costs.simulate(boundaries, "1f1b", 4, slowdown, overheads=start_up_overheads)
        live = costs.simulate(boundaries, "1f1b", 4, slowdown * (1 + TRUTH["compute_bias"]),
                              overheads=Overheads(start_up_overheads.op_ms + TRUTH["op_overhead_ms"],
                                                  start_up_overheads.iteration_ms + TRUTH["iteration_overhead_ms"]))
        predicted_compute = clean.compute_ms / 4
        noise = rng.normal(0.0, TRUTH["noise_sigma"], 4)
        outlier = rng.random(4) < TRUTH["outlier_probability"]
        noise[outlier] = np.log1p(TRUTH["outlier_scale"])
        measured = predicted_compute * (1 + TRUTH["compute_bias"]) * np.exp(stage_bias + noise)
        record = {"iteration": 10 * (k + 1), "wall_s": float(k), "interval_s": 1.0, "boundaries": boundaries,
                  "throughput_samples_s": 10.0, "iteration_ms": live.iteration_ms * np.exp(rng.normal(0, 0.005)),
                  "predicted_iteration_ms": clean.iteration_ms, "predicted_compute_ms": predicted_compute.tolist(),
                  "injected_slowdown": slowdown.tolist(), "p2p_gbps": TRUTH["p2p_gbps"], "warmup_s": 0.0,
                  "stages": [{"compute_ms": float(m), "num_layers": 2} for m in measured]}
        if k % 25 == 24:
            moved = int(rng.integers(10**7, 5 * 10**7))
            record["repartition"] = {"from": records[-1]["boundaries"], "to": boundaries, "committed": True,
                                     "bytes_moved": moved, "stall_s": TRUTH["migration_overhead_s"]
                                     + moved * 8 / (TRUTH["p2p_gbps"] * 1e9)}
        records.append(record)
    records[0]["run"] = header
    return records
