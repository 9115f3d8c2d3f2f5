"""rlpipe calibrate: logs synthesised with known parameters are recovered; bad logs are refused."""

import json
import subprocess
import sys

import numpy as np
import pytest
from synthetic_logs import TRUTH, synthetic_run

from rlpipe.calibration import Calibration, calibrated_iteration_ms, fit
from rlpipe.errors import InputError


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


@pytest.mark.parametrize("where", ["iteration", "prediction"])
def test_a_log_with_times_no_run_produces_is_refused_by_iteration(where):
    """Values each finite, as the log's checks ask, but past anything a run produces: a 1e308 ms
    iteration or a zero prediction would turn the fit into inf or nan, and is refused naming the interval."""
    records = synthetic_run(0, intervals=30)
    if where == "iteration":
        records[5]["iteration_ms"] = 1e308
    else:
        records[5]["predicted_compute_ms"][0] = 0.0
    with pytest.raises(InputError, match=f"run 0: iteration {records[5]['iteration']}: times no run produces"):
        fit([records])


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
