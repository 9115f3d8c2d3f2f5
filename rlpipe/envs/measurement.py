"""How a pipeline's measured stage times scatter around the true ones: the environment's timer model.

Live timers are not the simulator's truth: they carry noise, occasional outliers (a garbage-collection
pause, a neighbour's burst) and persistent per-stage biases (a stage whose device or host runs a few
percent off its profile). A policy trained on clean 3% noise chases what it never saw, so training
draws one of several measurement models per episode, a calibrated one (``rlpipe calibrate``) among them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from numba import njit

from rlpipe.calibration import Calibration
from rlpipe.errors import InputError
from rlpipe.fields import is_number

MODEL_LIMITS = {"sigma": 3.0, "outlier_probability": 1.0, "outlier_scale": 100.0, "stage_bias_sigma": 3.0,
                "compute_bias": 100.0, "op_overhead_fraction": 100.0, "iteration_overhead_fraction": 100.0}
"""The largest value of each field a config may give (beyond, timers would overflow)."""


@dataclass(frozen=True)
class MeasurementModel:
    """One way timers behave, for a whole episode.

    Attributes:
        sigma: lognormal sigma of every stage's measured time per interval.
        outlier_probability: the chance that a stage's measurement in an interval is an outlier.
        outlier_scale: an outlier reads ``1 + outlier_scale x U(0.5, 1.5)`` times too long.
        stage_bias_sigma: each stage's persistent bias, drawn per episode: its measured compute reads
            ``exp(N(0, stage_bias_sigma))`` times the truth all episode long.
        compute_bias: a bias every stage shares (measured over true compute, minus 1).
        op_overhead_fraction: overhead per forward or backward operation, beside compute, as a fraction
            of the pipeline's mean operation time (a calibration's figure; it slows the pipeline, and the
            simulated truth includes it).
        iteration_overhead_fraction: overhead per iteration, as a fraction of the ideal iteration time.
        name: what to call it.
    """

    sigma: float = 0.03
    outlier_probability: float = 0.0
    outlier_scale: float = 0.0
    stage_bias_sigma: float = 0.0
    compute_bias: float = 0.0
    op_overhead_fraction: float = 0.0
    iteration_overhead_fraction: float = 0.0
    name: str = "lognormal"

    @classmethod
    def from_calibration(cls, calibration: Calibration) -> MeasurementModel:
        return cls(sigma=calibration.noise_sigma, outlier_probability=calibration.outlier_probability,
                   outlier_scale=calibration.outlier_scale, stage_bias_sigma=calibration.stage_bias_spread,
                   compute_bias=calibration.compute_bias, op_overhead_fraction=calibration.op_overhead_fraction,
                   iteration_overhead_fraction=calibration.iteration_overhead_fraction, name="calibrated")

    @classmethod
    def parse(cls, spec: MeasurementModel | dict[str, Any], where: str = "measurement_models") -> MeasurementModel:
        """A model from itself or from a YAML/JSON mapping of its fields (what configs/ppo.yml holds)."""
        if isinstance(spec, cls):
            return spec
        if not isinstance(spec, dict):
            raise InputError(f"{where}: expected a mapping of {', '.join(f.name for f in fields(cls))}")
        unknown = set(spec) - {f.name for f in fields(cls)}
        if unknown:
            raise InputError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        for key, value in spec.items():
            if key == "name":
                if not isinstance(value, str):
                    raise InputError(f"{where}: name: expected a string, got {value!r}")
            elif not is_number(value) or not 0 <= value <= MODEL_LIMITS[key]:
                raise InputError(f"{where}: {key}: must be a number in [0, {MODEL_LIMITS[key]:g}], got {value!r}")
        return cls(**spec)

    def draw_stage_bias(self, rng: np.random.Generator, num_stages: int) -> np.ndarray:
        """Each stage's persistent measurement factor for one episode."""
        factor = 1.0 + self.compute_bias
        if self.stage_bias_sigma == 0:
            return np.full(num_stages, factor)
        return factor * np.exp(rng.normal(0.0, self.stage_bias_sigma, num_stages))

    def noise(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Multiplicative noise for one interval's measurements."""
        noise = np.exp(rng.normal(0.0, self.sigma, size=shape))
        return noise if self.outlier_probability <= 0 else noise * self.outliers(rng, shape)

    def iteration_noise(self, rng: np.random.Generator, iterations: int, shape: tuple[int, ...]) -> np.ndarray:
        """Multiplicative noise of each iteration's timer reading, ``(iterations, *shape)``: independent
        from one iteration to the next, so that an interval's mean carries ``sigma``, and of mean 1, so
        that it adds no bias."""
        spread = self.sigma * math.sqrt(iterations)
        return np.exp(rng.normal(-spread * spread / 2, spread, size=(iterations, *shape)))

    def interval_factors(self, rng: np.random.Generator, stage_bias: np.ndarray) -> np.ndarray:
        """Each device's factor on one interval's compute readings: its outlier factor times its persistent
        ``stage_bias`` (the bias itself, not a copy, where the model has no outliers: nothing to draw)."""
        if self.outlier_probability <= 0:
            return stage_bias
        return self.outliers(rng, stage_bias.shape) * stage_bias

    def outliers(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Each measurement's outlier factor for one interval (1: none)."""
        if self.outlier_probability <= 0:
            return np.ones(shape)
        return outlier_factors(rng.random(shape), rng.uniform(0.5, 1.5, shape), self.outlier_probability,
                               self.outlier_scale)


@njit(cache=True)
def outlier_factors(draw, stretch, probability, scale):  # pragma: no cover
    """Elementwise: ``1 + scale x stretch`` where ``draw < probability`` (an outlier), else 1. Compiled: the
    environment draws the outliers of every interval."""
    factors = np.ones(draw.shape)
    flat_factors, flat_draw, flat_stretch = factors.reshape(-1), draw.reshape(-1), stretch.reshape(-1)
    for i in range(flat_draw.shape[0]):
        if flat_draw[i] < probability:
            flat_factors[i] = 1.0 + scale * flat_stretch[i]
    return factors
