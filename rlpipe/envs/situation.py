"""What an episode may be: the environment's options (:class:`EnvConfig`) and the drawing of one
episode's training situation (profile, stages, replicas, micro-batches, schedule, links, migration
cost, scenario, timer model)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlpipe.calibration import Calibration
from rlpipe.envs.measurement import MeasurementModel
from rlpipe.errors import InputError
from rlpipe.fields import check_field_types
from rlpipe.interference import InterferenceTrace, check_scenario, load_scenario
from rlpipe.observation import DEFAULT_D_MAX, DEFAULT_HISTORY, DEFAULT_S_MAX
from rlpipe.partition import SCHEDULES
from rlpipe.profile import LayerProfile, load_profile
from rlpipe.simulator import MigrationCost

CONGESTED_LINKS_GBPS = 10.0  # links' nominal bandwidth in episodes whose scenario congests them, Gbit/s

MAX_S_MAX = 64
MAX_DURATION_S = 7 * 24 * 3600.0  # a week of simulated training per episode


@dataclass(frozen=True)
class EnvConfig:
    """What a ``reset`` may draw from. Tuples are choices drawn uniformly; ranges are (low, high).

    Attributes:
        profiles: shipped profile names or JSON paths to draw from.
        profile: a profile object to use instead of ``profiles``.
        min_stages, max_stages: stage count range (capped by the profile's layer count).
        s_max: the largest stage count the observation has room for.
        data_parallel: (low, high) range of replicas D; drawn uniformly among ``low``, ``high`` and the
            powers of two between them (1, 2, 4, 8 for (1, 8)).
        d_max: the largest replica count the observation has room for.
        microbatches: micro-batch counts per iteration to draw from (1F1B draws only M >= S).
        schedules: ``"1f1b"`` / ``"gpipe"`` to draw from.
        scenarios: interference presets or ``trace:FILE.csv`` to draw from.
        duration_s: simulated training time per episode, s (the longest, with ``min_duration_s``).
        min_duration_s: when set, each episode lasts a duration drawn log-uniformly from
            [``min_duration_s``, ``duration_s``]: short episodes put slowdowns in a run's first intervals,
            where a live job also meets them, before the observation's history has filled.
        interval_iterations: K, training iterations per decision interval (the largest, with
            ``min_interval_iterations``).
        min_interval_iterations: when set, each episode's K is drawn uniformly among the integers from it to
            ``interval_iterations``: a live job may decide every few iterations (``rlpipe run --interval``),
            where durations counted in iterations (how long a count has held, past slowdowns) take values
            that intervals of 10 never show.
        timer_noise: relative standard deviation of the measured times (lognormal), when no
            ``measurement_models`` are given.
        measurement_models: timer models to draw one from per episode (``None``: lognormal
            ``timer_noise`` only); mappings of :class:`MeasurementModel` fields are accepted.
        calibration: a fit from ``rlpipe calibrate`` (or its JSON path): its measurement model and
            overheads join the draws (alone, when ``measurement_models`` is ``None``).
        bandwidth_gbps: link bandwidths between stages to draw from, Gbit/s (``inf``: free).
        migration_overhead_s: range of the fixed cost of a repartition, s (drawn log-uniformly).
        migration_bandwidth_gbps: bandwidth parameters and optimizer state move at, Gbit/s.
        profile_time_scale: range of a factor on the drawn profile's layer times (drawn log-uniformly): the
            same model on slower devices, whose state moves as fast, so a stall is a smaller share of an
            iteration (a live job whose device time is emulated at x6 runs iterations of seconds).
        history: intervals of device load in the observation.
        invalid_action_penalty: subtracted from the reward of an invalid action.
    """

    profiles: tuple[str, ...] = ("transformer16", "transformer32", "mlp16", "cnn16")
    profile: LayerProfile | None = None
    min_stages: int = 2
    max_stages: int = 8
    s_max: int = DEFAULT_S_MAX
    data_parallel: tuple[int, int] = (1, 1)
    d_max: int = DEFAULT_D_MAX
    microbatches: tuple[int, ...] = (8, 16, 32)
    schedules: tuple[str, ...] = ("1f1b", "gpipe")
    scenarios: tuple[str, ...] = ("none", "light", "heavy", "bursty", "drift", "periodic", "persistent", "seqlen",
                                  "network", "mixed")
    duration_s: float = 3600.0
    min_duration_s: float | None = None
    interval_iterations: int = 10
    min_interval_iterations: int | None = None
    timer_noise: float = 0.03
    measurement_models: tuple[Any, ...] | None = None
    calibration: Calibration | str | None = None
    bandwidth_gbps: tuple[float, ...] = (math.inf, 10.0)
    migration_overhead_s: tuple[float, float] = (0.5, 0.5)
    migration_bandwidth_gbps: float = 10.0
    profile_time_scale: tuple[float, float] = (1.0, 1.0)
    history: int = DEFAULT_HISTORY
    invalid_action_penalty: float = 0.1

    def timer_models(self) -> tuple[MeasurementModel, ...] | None:
        """The measurement models to draw from (``None``: the plain lognormal ``timer_noise``)."""
        models = [MeasurementModel.parse(m) for m in self.measurement_models or ()]
        if self.calibration is not None:
            calibration = (Calibration.load(self.calibration) if isinstance(self.calibration, str)
                           else self.calibration)
            models.append(MeasurementModel.from_calibration(calibration))
        return tuple(models) or None

    def validate(self) -> EnvConfig:
        """Check every option (types, ranges, that named profiles and scenarios exist): a problem is one
        InputError naming the option, at construction rather than in some later episode."""
        check_field_types(self, "env_kwargs", infinite_ok=("bandwidth_gbps",))
        if not 2 <= self.s_max <= MAX_S_MAX or self.history < 1:
            raise InputError(f"env_kwargs: need 2 <= s_max <= {MAX_S_MAX} and history >= 1, got {self.s_max}, "
                             f"{self.history}")
        fewest, most = self.data_parallel
        if not 1 <= fewest <= most <= self.d_max <= MAX_S_MAX:
            raise InputError(f"env_kwargs: data_parallel: need 1 <= low <= high <= d_max ({self.d_max}) <= "
                             f"{MAX_S_MAX}, got {list(self.data_parallel)}")
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise InputError(f"env_kwargs: duration_s: must be in (0, {MAX_DURATION_S:g}] s, got {self.duration_s}")
        if self.min_duration_s is not None and not 0 < self.min_duration_s <= self.duration_s:
            raise InputError(f"env_kwargs: min_duration_s: must be in (0, duration_s = {self.duration_s:g}] s, "
                             f"got {self.min_duration_s}")
        if any(m < 1 for m in self.microbatches) or any(not b > 0 for b in self.bandwidth_gbps):
            raise InputError("env_kwargs: microbatches must be >= 1 and bandwidth_gbps > 0")
        low, high = self.migration_overhead_s
        if not 0 < low <= high or not self.migration_bandwidth_gbps > 0 or self.timer_noise < 0:
            raise InputError("env_kwargs: need 0 < migration_overhead_s[0] <= [1], migration_bandwidth_gbps > 0 "
                             "and timer_noise >= 0")
        _check_range("profile_time_scale", self.profile_time_scale)
        unknown = [s for s in self.schedules if s not in SCHEDULES]
        if unknown:
            raise InputError(f"env_kwargs: schedules: {unknown[0]!r} is none of {', '.join(SCHEDULES)}")
        for scenario in self.scenarios:
            check_scenario(scenario)
        if self.profile is None:
            for name in self.profiles:
                load_profile(name)
        self.timer_models()
        if not 1 <= self.min_stages <= self.max_stages:
            raise InputError(f"stages: need 1 <= min_stages <= max_stages, got {self.min_stages}, {self.max_stages}")
        if self.max_stages > self.s_max:
            raise InputError(f"pipelines of up to {self.max_stages} stages do not fit an observation with room "
                             f"for {self.s_max} (s_max)")
        fewest_iterations = self.interval_iterations if self.min_interval_iterations is None \
            else self.min_interval_iterations
        _check_range("(min_interval_iterations, interval_iterations)", (fewest_iterations, self.interval_iterations))
        if not self.scenarios or not self.microbatches or not self.schedules:
            raise InputError("scenarios, microbatches and schedules must each offer at least one choice")
        return self


    def replica_choices(self) -> list[int]:
        """The replica counts a reset draws from."""
        low, high = self.data_parallel
        return sorted({low, high} | {2**k for k in range(7) if low <= 2**k <= high})


def _check_range(option: str, bounds: tuple[float, float]) -> None:
    """A (low, high) range option: 0 < low <= high, or one InputError naming it."""
    low, high = bounds
    if not 0 < low <= high:
        raise InputError(f"env_kwargs: {option}: need 0 < low <= high, got {list(bounds)}")


@dataclass(frozen=True)
class Situation:
    """The training situation of one episode.

    Attributes:
        replicas: D, the data-parallel replicas of the pipeline.
        microbatches: M, each replica's micro-batches at the even split.
        trace: the scenario over the job's D x S devices.
        stage_bias: (D, S) each device's measured over true compute, all episode.
        duration_s: the episode's simulated training time, s.
        interval_iterations: K, training iterations per decision interval in this episode.
    """

    profile: LayerProfile
    num_stages: int
    microbatches: int
    schedule: str
    bandwidth_gbps: float
    migration: MigrationCost
    trace: InterferenceTrace
    measurement: MeasurementModel
    stage_bias: np.ndarray
    replicas: int = 1
    duration_s: float = 3600.0
    interval_iterations: int = 10


def draw_situation(config: EnvConfig, rng: np.random.Generator, options: dict[str, Any],
                   timer_models: tuple[MeasurementModel, ...] | None,
                   profiles: dict[str, LayerProfile]) -> Situation:
    """One episode's situation, drawn as ``config`` says (``options`` may fix the profile, stage and
    replica counts, schedule, micro-batches and scenario, or give the trace itself as ``trace``;
    ``profiles`` caches loaded profiles)."""
    cfg = config
    profile = options.get("profile") or cfg.profile
    if profile is None:
        name = cfg.profiles[int(rng.integers(len(cfg.profiles)))]
        profile = profiles.setdefault(name, load_profile(name))
    max_stages = min(cfg.max_stages, profile.num_layers)
    num_stages = options.get("num_stages") or int(rng.integers(min(cfg.min_stages, max_stages), max_stages + 1))
    schedule = options.get("schedule") or cfg.schedules[int(rng.integers(len(cfg.schedules)))]
    choices = [m for m in cfg.microbatches if schedule == "gpipe" or m >= num_stages] or [max(cfg.microbatches)]
    microbatches = options.get("microbatches") or choices[int(rng.integers(len(choices)))]
    bandwidth = float(cfg.bandwidth_gbps[int(rng.integers(len(cfg.bandwidth_gbps)))])
    low, high = cfg.migration_overhead_s  # drawn log-uniformly: every order of magnitude alike
    log_overhead = rng.uniform(math.log(low), math.log(high))
    overhead = low if low == high else float(math.exp(log_overhead))
    scenario = options.get("scenario") or cfg.scenarios[int(rng.integers(len(cfg.scenarios)))]
    replica_choices = cfg.replica_choices()
    replicas = options.get("replicas") or (replica_choices[int(rng.integers(len(replica_choices)))]
                                           if len(replica_choices) > 1 else replica_choices[0])
    duration_s = cfg.duration_s
    if cfg.min_duration_s is not None:  # drawn only then: configurations without it keep their episodes' draws
        duration_s = float(math.exp(rng.uniform(math.log(cfg.min_duration_s), math.log(cfg.duration_s))))
    trace_seed = int(rng.integers(2**31))
    given: InterferenceTrace | None = options.get("trace")
    trace = (given.for_devices(replicas * num_stages) if given is not None
             else load_scenario(scenario, replicas * num_stages, duration_s, seed=trace_seed))
    if math.isinf(bandwidth) and np.any(trace.link_factor < 1):
        bandwidth = CONGESTED_LINKS_GBPS  # a scenario that congests links needs links that cost something
    if timer_models is None:  # no further draws: the plain model keeps earlier episodes' streams
        measurement = MeasurementModel(sigma=cfg.timer_noise, name="plain")
        stage_bias = np.ones((replicas, num_stages))
    else:
        measurement = timer_models[int(rng.integers(len(timer_models)))]
        stage_bias = measurement.draw_stage_bias(rng, replicas * num_stages).reshape(replicas, num_stages)
    low, high = cfg.profile_time_scale  # drawn last and only if a range: other configurations keep their draws
    time_scale = low if low == high else float(math.exp(rng.uniform(math.log(low), math.log(high))))
    if time_scale != 1.0:
        profile = profile.scaled(time_scale)
    interval_iterations = (cfg.interval_iterations if cfg.min_interval_iterations is None  # drawn only then
                           else int(rng.integers(cfg.min_interval_iterations, cfg.interval_iterations + 1)))
    return Situation(profile, num_stages, microbatches, schedule, bandwidth,
                     MigrationCost(cfg.migration_bandwidth_gbps, overhead), trace, measurement, stage_bias, replicas,
                     duration_s, interval_iterations)
