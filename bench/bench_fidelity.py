"""The simulator held against live runs: emulated device time, 2, 4 and 8 stages, GPipe and 1F1B, with
and without injected slowdowns. Per run, the median over intervals of |live / predicted iteration time
- 1|; then calibration earning its keep: ``rlpipe calibrate`` fitted on half the runs (the 1F1B ones)
predicts the other half (GPipe, other stage counts and traces) better than the uncalibrated simulator.
The runs' logs stay in ``runs/bench_fidelity/`` (``rlpipe calibrate`` and ``rlpipe report`` read them).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from rlpipe.calibration import calibrated_iteration_ms, fit
from rlpipe.runlog import load_run

GRID = [(stages, schedule, interference) for stages in (2, 4, 8) for schedule in ("1f1b", "gpipe")
        for interference in (None, "heavy")]
ITERATIONS = 40


def one_run(root: Path, folder: Path, stages: int, schedule: str, interference: str | None) -> list[dict]:
    log = folder / f"{stages}-{schedule}-{interference or 'none'}.jsonl"
    microbatches = max(stages, 4)
    args = ["--model", "transformer", "--layers", "12", "--stages", str(stages), "--schedule", schedule,
            "--microbatches", str(microbatches), "--batch", str(4 * microbatches), "--iterations", str(ITERATIONS),
            "--interval", "5", "--device-time", "emulated", "--log", str(log)]
    if interference:
        args += ["--interference", interference, "--time-scale", "60", "--seed", str(stages)]
    subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", *args], check=True, cwd=root,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return load_run(log)


def median_error(records: list[dict], predicted: list[float | None] | None = None) -> float:
    predictions = predicted or [r["predicted_iteration_ms"] for r in records]
    return float(np.median([abs(r["iteration_ms"] / p - 1) for r, p in zip(records, predictions, strict=True) if p]))


def run() -> dict:
    root = Path(__file__).resolve().parents[1]
    folder = root / "runs" / "bench_fidelity"
    shutil.rmtree(folder, ignore_errors=True)  # this run's logs only
    folder.mkdir(parents=True)
    runs = {}
    for stages, schedule, interference in GRID:
        name = f"{stages} stages, {schedule}, {interference or 'no interference'}"
        print(f"  {name}", flush=True)
        runs[name] = one_run(root, folder, stages, schedule, interference)
    rows = {name: {"fidelity": median_error(records),
                   "overran": sum(r["emulation"]["overran"] for r in records)
                   / max(sum(r["emulation"]["chunks"] for r in records), 1),
                   "scale": records[0]["run"]["device_time_scale"]} for name, records in runs.items()}
    fitted_on = [name for name in runs if "1f1b" in name]
    calibration = fit([runs[name] for name in fitted_on], fitted_on)
    held_out = {name: (median_error(records), median_error(records, calibrated_iteration_ms(records, calibration)))
                for name, records in runs.items() if name not in fitted_on}
    lines = ["Emulated device time, 12-layer transformer, 40 iterations, 5-iteration intervals; fidelity = median "
             "over intervals of |live / predicted iteration time - 1| (goal <= 0.10). The logs: "
             "`runs/bench_fidelity/` (not committed).", "",
             "| run | device-time scale | overran | fidelity |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['scale']:g} | {r['overran']:.1%} | {r['fidelity']:.3f} |" for name, r in rows.items()]
    lines += ["", f"Calibration fitted on the {len(fitted_on)} 1F1B runs, judged on the others (goal <= 0.05):", "",
              "| held-out run | uncalibrated | calibrated |", "|---|---|---|"]
    lines += [f"| {name} | {before:.3f} | {after:.3f} |" for name, (before, after) in held_out.items()]
    return {"runs": rows, "worst_fidelity": max(r["fidelity"] for r in rows.values()),
            "median_fidelity": float(np.median([r["fidelity"] for r in rows.values()])),
            "held_out_median_uncalibrated": float(np.median([b for b, _ in held_out.values()])),
            "held_out_median_calibrated": float(np.median([a for _, a in held_out.values()])),
            "held_out_worst_calibrated": max(a for _, a in held_out.values()),
            "calibration": calibration.__dict__, "markdown": "\n".join(lines)}
