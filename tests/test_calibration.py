"""rlpipe calibrate: logs synthesised with known parameters are recovered; bad logs are refused."""

import json
import subprocess
import sys

import numpy as np
import pytest

from rlpipe.calibration import Calibration, calibrated_iteration_ms, fit, header_costs
from rlpipe.errors import InputError
from rlpipe.simulator import Overheads

TRUTH = {"compute_bias": 0.04, "noise_sigma": 0.03, "outlier_probability": 0.05, "outlier_scale": 0.5,
         "op_overhead_ms": 1.5, "iteration_overhead_ms": 6.0, "migration_overhead_s": 0.12, "p2p_gbps": 12.0}


def synthetic_run(seed: int, intervals: int = 300) -> list[dict]:
    """A run's log as the truth above would write it: 4 stages, 8 layers, 1F1B, 4 micro-batches."""
    rng = np.random.default_rng(seed)
    header = {"stages": 4, "schedule": "1f1b", "microbatches": 4, "device_time": "emulated",
              "device_time_scale": 2.0, "oversubscribed": False, "p2p_gbps": TRUTH["p2p_gbps"],
              "forward_ms": rng.uniform(2, 6, 8).tolist(), "backward_ms": rng.uniform(4, 12, 8).tolist()}
    costs = header_costs(header)
    stage_bias = rng.normal(0.0, 0.02, 4)
    records = []
    for k in range(intervals):
        boundaries = [[0, 2, 4, 6], [0, 3, 5, 7], [0, 1, 4, 6]][k % 3]
        slowdown = 1.0 + rng.exponential(0.2, 4) * (rng.random(4) < 0.3)
        clean = costs.simulate(boundaries, "1f1b", 4, slowdown)
        live = costs.simulate(boundaries, "1f1b", 4, slowdown * (1 + TRUTH["compute_bias"]),
                              overheads=Overheads(TRUTH["op_overhead_ms"], TRUTH["iteration_overhead_ms"]))
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


def test_known_parameters_are_recovered_within_ten_percent():
    calibration = fit([synthetic_run(seed) for seed in range(3)])
    for key, value in TRUTH.items():
        assert getattr(calibration, key) == pytest.approx(value, rel=0.10), key
    assert calibration.stage_bias_spread == pytest.approx(0.02, rel=0.6)  # 12 stages drawn: a rough figure


def test_the_calibrated_simulator_predicts_a_run_it_was_not_fitted_on():
    calibration = fit([synthetic_run(seed) for seed in range(2)])
    held_out = synthetic_run(7, intervals=60)
    predicted = calibrated_iteration_ms(held_out, calibration)
    errors = [abs(r["iteration_ms"] / p - 1) for r, p in zip(held_out, predicted, strict=True)]
    plain = [abs(r["iteration_ms"] / r["predicted_iteration_ms"] - 1) for r in held_out]
    assert np.median(errors) < 0.01 < np.median(plain)


def test_a_calibration_file_round_trips_and_bad_ones_are_refused(tmp_path):
    calibration = fit([synthetic_run(0, intervals=30)])
    calibration.save(tmp_path / "c.json")
    assert Calibration.load(tmp_path / "c.json") == calibration
    data = json.loads((tmp_path / "c.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps({**data, "noise_sigma": "wide"}))
    with pytest.raises(InputError, match="noise_sigma"):
        Calibration.load(tmp_path / "bad.json")


def rlpipe(*args):
    return subprocess.run([sys.executable, "-m", "rlpipe.cli", *args], capture_output=True, text=True)


def test_calibrate_command_writes_the_fit(tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in synthetic_run(1, intervals=40)))
    result = rlpipe("calibrate", str(log), "-o", str(tmp_path / "cal.json"))
    assert result.returncode == 0, result.stderr
    assert "calibrated" in result.stdout and (tmp_path / "cal.json").exists()
    assert Calibration.load(tmp_path / "cal.json").intervals == 40


@pytest.mark.parametrize("content, message", [
    ("", "no records"),
    ('{"iteration": 1}\n', "missing field"),
    ("not json\n", "not JSON"),
])
def test_calibrate_refuses_a_malformed_or_empty_log(tmp_path, content, message):
    log = tmp_path / "run.jsonl"
    log.write_text(content)
    result = rlpipe("calibrate", str(log), "-o", str(tmp_path / "cal.json"))
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_log_without_a_run_header_is_refused(tmp_path):
    records = synthetic_run(0, intervals=5)
    del records[0]["run"]
    with pytest.raises(InputError, match="no run header"):
        fit([records])


def test_evaluate_and_train_take_a_calibration(tmp_path):
    fit([synthetic_run(0, intervals=30)]).save(tmp_path / "cal.json")
    result = rlpipe("evaluate", "--policies", "static,dynpipe", "--scenarios", "heavy", "--episodes", "1",
                    "--stages", "4", "--duration-s", "300", "--calibration", str(tmp_path / "cal.json"),
                    "--out", str(tmp_path / "eval"))
    assert result.returncode == 0, result.stderr
    (tmp_path / "broken.json").write_text("{}")
    refused = rlpipe("train", "--timesteps", "64", "--calibration", str(tmp_path / "broken.json"),
                     "--out", str(tmp_path / "agent"))
    assert refused.returncode == 2 and "broken.json" in refused.stderr and "Traceback" not in refused.stderr
