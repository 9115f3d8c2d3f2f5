"""Timer models in the environment: noise, outliers, per-stage bias, a calibration's overheads."""

import numpy as np
import pytest

from rlpipe.calibration import Calibration
from rlpipe.envs import RepartitionEnv
from rlpipe.envs.measurement import MeasurementModel, outlier_factors
from rlpipe.errors import InputError

QUIET = {"scenarios": ("none",), "profiles": ("transformer16",), "min_stages": 4, "max_stages": 4,
         "schedules": ("1f1b",), "microbatches": (8,), "duration_s": 3600}


def loads(env, seed, steps=60):
    env.reset(seed=seed)
    found = [np.array([s.device_load for s in env.encoder.latest.stages])]
    for _ in range(steps):
        env.step(0)
        found.append(np.array([s.device_load for s in env.encoder.latest.stages]))
    return np.array(found)  # (intervals, stages): measured over true compute, no interference here


def test_the_plain_model_scatters_by_timer_noise():
    measured = loads(RepartitionEnv(**QUIET, timer_noise=0.05), seed=0, steps=200)
    assert np.std(np.log(measured)) == pytest.approx(0.05, rel=0.15)
    assert abs(np.median(measured) - 1) < 0.01


def test_a_biased_model_keeps_each_stage_off_for_the_whole_episode():
    model = MeasurementModel(sigma=0.005, stage_bias_sigma=0.05)
    measured = loads(RepartitionEnv(**QUIET, measurement_models=(model,)), seed=1)
    per_stage = np.median(measured, axis=0)
    assert np.ptp(per_stage) > 0.02  # stages read differently ...
    assert np.all(np.abs(measured / per_stage - 1) < 0.03)  # ... and each keeps its bias


def test_outliers_are_rare_and_large():
    model = MeasurementModel(sigma=0.01, outlier_probability=0.05, outlier_scale=0.5)
    measured = loads(RepartitionEnv(**QUIET, measurement_models=(model,)), seed=2, steps=300)
    outliers = measured > 1.15
    assert 0.02 < outliers.mean() < 0.09 and measured[outliers].min() > 1.2


def test_a_calibration_slows_the_simulated_pipeline_by_its_overheads():
    calibration = Calibration(compute_bias=0.0, stage_bias_spread=0.0, noise_sigma=0.01, outlier_probability=0.0,
                              outlier_scale=0.0, op_overhead_ms=1.0, op_overhead_fraction=0.2,
                              iteration_overhead_ms=0.0, iteration_overhead_fraction=0.1, migration_overhead_s=None,
                              p2p_gbps=10.0, runs=1, intervals=10)
    plain, calibrated = RepartitionEnv(**QUIET), RepartitionEnv(**QUIET, calibration=calibration)
    plain.reset(seed=3)
    calibrated.reset(seed=3)
    assert calibrated.situation.measurement.name == "calibrated"
    assert calibrated.encoder.latest.iteration_ms > 1.2 * plain.encoder.latest.iteration_ms


def test_models_from_a_config_mapping_and_their_refusals():
    env = RepartitionEnv(**QUIET, measurement_models=({"sigma": 0.02, "outlier_probability": 0.01},))
    env.reset(seed=0)
    assert env.situation.measurement == MeasurementModel(sigma=0.02, outlier_probability=0.01)
    with pytest.raises(InputError, match="unknown key"):
        RepartitionEnv(**QUIET, measurement_models=({"sigmaa": 0.02},))
    with pytest.raises(InputError, match="sigma"):
        RepartitionEnv(**QUIET, measurement_models=({"sigma": -1},))


def test_the_compiled_outlier_factors_are_numpys_elementwise_choice():
    """Bit for bit what ``np.where(draw < p, 1 + scale x stretch, 1)`` gives, in any shape."""
    rng = np.random.default_rng(1)
    for shape in [(3,), (2, 5), (4, 2, 8)]:
        draw, stretch = rng.random(shape), rng.uniform(0.5, 1.5, shape)
        expected = np.where(draw < 0.3, 1.0 + 0.7 * stretch, 1.0)
        np.testing.assert_array_equal(outlier_factors(draw, stretch, 0.3, 0.7), expected)


@pytest.mark.parametrize("model", [MeasurementModel(sigma=0.03), MeasurementModel(outlier_probability=0.3)])
def test_an_intervals_factors_are_its_outliers_times_the_bias_from_the_same_draws(model):
    bias = np.array([[1.0, 1.1, 0.9], [1.05, 1.0, 0.95]])
    drawn, expected = np.random.default_rng(3), np.random.default_rng(3)
    np.testing.assert_array_equal(model.interval_factors(drawn, bias), model.outliers(expected, bias.shape) * bias)
    assert drawn.random() == expected.random()  # as many numbers drawn (none without outliers)
