"""RepartitionEnv: decide, every interval of K training iterations, whether and how to repartition.

Each ``reset`` draws a training situation (profile, stage count, micro-batches, schedule, link
bandwidth, migration overhead, interference scenario), seeded. Each ``step`` applies the action's
partition (paying the migration stall at the start of the interval), runs K iterations through the
scenario's piecewise-constant conditions, and reports the interval's StageStats, with timer noise,
through the shared :class:`~rlpipe.observation.ObservationEncoder`.

Reward: the interval's throughput (stall included) over the throughput of the best partition for
the true conditions of the same stretch of time with free migration (the best of the bottleneck-
optimal partition for those conditions, the launch partition and the partition in use); an episode's mean reward is
the policy's efficiency (1.0: the clairvoyant bound). An invalid action is a no-op with a penalty.
An episode is one simulated stretch of training time (default one hour); it ends by truncation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import gymnasium as gym
import numpy as np

from rlpipe.calibration import Calibration
from rlpipe.envs.measurement import MeasurementModel
from rlpipe.errors import InputError
from rlpipe.fields import check_field_types
from rlpipe.interference import InterferenceTrace, check_scenario, load_scenario
from rlpipe.observation import DEFAULT_HISTORY, DEFAULT_S_MAX, OBSERVATION_CLIP, ActionLayout, ObservationEncoder
from rlpipe.partition import SCHEDULES, bottleneck_dp, inflight_microbatches, stage_edges
from rlpipe.planning import Planner
from rlpipe.profile import LayerProfile, load_profile
from rlpipe.simulator import NO_OVERHEADS, IterationTiming, MigrationCost, Overheads, operation_graph, simulate_kernel
from rlpipe.stats import IntervalStats

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
        microbatches: micro-batch counts per iteration to draw from (1F1B draws only M >= S).
        schedules: ``"1f1b"`` / ``"gpipe"`` to draw from.
        scenarios: interference presets or ``trace:FILE.csv`` to draw from.
        duration_s: simulated training time per episode, s.
        interval_iterations: K, training iterations per decision interval.
        timer_noise: relative standard deviation of the measured times (lognormal), when no
            ``measurement_models`` are given.
        measurement_models: timer models to draw one from per episode (``None``: lognormal
            ``timer_noise`` only); mappings of :class:`MeasurementModel` fields are accepted.
        calibration: a fit from ``rlpipe calibrate`` (or its JSON path): its measurement model and
            overheads join the draws (alone, when ``measurement_models`` is ``None``).
        bandwidth_gbps: link bandwidths between stages to draw from, Gbit/s (``inf``: free).
        migration_overhead_s: range of the fixed cost of a repartition, s (drawn log-uniformly).
        migration_bandwidth_gbps: bandwidth parameters and optimizer state move at, Gbit/s.
        history: intervals of device load in the observation.
        invalid_action_penalty: subtracted from the reward of an invalid action.
    """

    profiles: tuple[str, ...] = ("transformer16", "transformer32", "mlp16", "cnn16")
    profile: LayerProfile | None = None
    min_stages: int = 2
    max_stages: int = 8
    s_max: int = DEFAULT_S_MAX
    microbatches: tuple[int, ...] = (8, 16, 32)
    schedules: tuple[str, ...] = ("1f1b", "gpipe")
    scenarios: tuple[str, ...] = ("none", "light", "heavy", "bursty", "drift", "periodic", "persistent", "seqlen",
                                  "network", "mixed")
    duration_s: float = 3600.0
    interval_iterations: int = 10
    timer_noise: float = 0.03
    measurement_models: tuple[Any, ...] | None = None
    calibration: Calibration | str | None = None
    bandwidth_gbps: tuple[float, ...] = (math.inf, 10.0)
    migration_overhead_s: tuple[float, float] = (0.5, 0.5)
    migration_bandwidth_gbps: float = 10.0
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
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise InputError(f"env_kwargs: duration_s: must be in (0, {MAX_DURATION_S:g}] s, got {self.duration_s}")
        if any(m < 1 for m in self.microbatches) or any(not b > 0 for b in self.bandwidth_gbps):
            raise InputError("env_kwargs: microbatches must be >= 1 and bandwidth_gbps > 0")
        low, high = self.migration_overhead_s
        if not 0 < low <= high or not self.migration_bandwidth_gbps > 0 or self.timer_noise < 0:
            raise InputError("env_kwargs: need 0 < migration_overhead_s[0] <= [1], migration_bandwidth_gbps > 0 "
                             "and timer_noise >= 0")
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
        if self.interval_iterations < 1 or self.duration_s <= 0:
            raise InputError("interval_iterations must be >= 1 and duration_s > 0")
        if not self.scenarios or not self.microbatches or not self.schedules:
            raise InputError("scenarios, microbatches and schedules must each offer at least one choice")
        return self


@dataclass(frozen=True)
class Situation:
    """The training situation of one episode."""

    profile: LayerProfile
    num_stages: int
    microbatches: int
    schedule: str
    bandwidth_gbps: float
    migration: MigrationCost
    trace: InterferenceTrace
    measurement: MeasurementModel
    stage_bias: np.ndarray  # each stage's measured / true compute, all episode


class RepartitionEnv(gym.Env):
    """See the module docstring. Keyword arguments override :class:`EnvConfig` fields."""

    metadata = {"render_modes": []}

    def __init__(self, config: EnvConfig | None = None, **overrides: Any):
        known = {f.name for f in fields(EnvConfig)}
        unknown = set(overrides) - known
        if unknown:
            raise InputError(f"RepartitionEnv: unknown option(s) {', '.join(sorted(unknown))}")
        self.config = replace(config or EnvConfig(), **overrides).validate()
        size = ObservationEncoder.size_for(self.config.s_max, self.config.history)
        self.observation_space = gym.spaces.Box(-OBSERVATION_CLIP, OBSERVATION_CLIP, shape=(size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(ActionLayout(self.config.s_max).num_actions)
        self._timer_models = self.config.timer_models()
        self._profiles: dict[str, LayerProfile] = {}

    # --- episode set-up -----------------------------------------------------------------------

    def _draw_situation(self, options: dict[str, Any]) -> Situation:
        cfg, rng = self.config, self.np_random
        profile = options.get("profile") or cfg.profile
        if profile is None:
            name = cfg.profiles[int(rng.integers(len(cfg.profiles)))]
            profile = self._profiles.setdefault(name, load_profile(name))
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
        trace = load_scenario(scenario, num_stages, cfg.duration_s, seed=int(rng.integers(2**31)))
        if math.isinf(bandwidth) and np.any(trace.link_factor < 1):
            bandwidth = CONGESTED_LINKS_GBPS  # a scenario that congests links needs links that cost something
        if self._timer_models is None:  # no further draws: the plain model keeps earlier episodes' streams
            measurement, stage_bias = MeasurementModel(sigma=cfg.timer_noise, name="plain"), np.ones(num_stages)
        else:
            measurement = self._timer_models[int(rng.integers(len(self._timer_models)))]
            stage_bias = measurement.draw_stage_bias(rng, num_stages)
        return Situation(profile, num_stages, microbatches, schedule, bandwidth,
                         MigrationCost(cfg.migration_bandwidth_gbps, overhead), trace, measurement, stage_bias)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.situation = s = self._draw_situation(options or {})
        self.planner = Planner(s.profile, s.num_stages, s.schedule, s.microbatches, s.bandwidth_gbps, s.migration)
        self.encoder = ObservationEncoder(self.planner, self.config.s_max, self.config.history)
        self._state_bytes = self.planner.costs.state_bytes
        self._ideal_compute = self.planner.profile.compute_ms()
        self._memory_inflight = inflight_microbatches(s.num_stages, s.microbatches, s.schedule)
        self._overheads = self._episode_overheads()
        self._timing_cache: dict[tuple[tuple[int, ...], int], IterationTiming] = {}
        self._partition_cost_cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._graph = operation_graph(s.num_stages, s.microbatches, s.schedule)
        self._activation_bits = np.asarray(self.planner.costs.activation_bytes, dtype=np.float64) * 8e-6
        self._best_cache: dict[int, tuple[tuple[int, ...], float]] = {}
        self._constants_cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.boundaries = self.planner.ideal_boundaries
        self.time_s = 0.0
        self.iteration = 0
        self.repartitions = 0
        self.stall_total_s = 0.0
        stats, _ = self._run_interval(0.0)  # the first interval, so that there is something to observe
        return self.encoder.observe(stats), self._info(stats, 1.0, False)

    def _episode_overheads(self) -> Overheads:
        """The measurement model's overheads for this episode's pipeline, in its own time units."""
        m, s = self.situation.measurement, self.situation
        if not (m.op_overhead_fraction or m.iteration_overhead_fraction):
            return NO_OVERHEADS
        mean_op_ms = float(self.planner.profile.compute_ms().sum()) / (2 * s.num_stages)
        return Overheads(op_ms=m.op_overhead_fraction * mean_op_ms,
                         iteration_ms=m.iteration_overhead_fraction * self.planner.ideal_iteration_ms)

    # --- stepping -----------------------------------------------------------------------------

    def action_masks(self) -> np.ndarray:
        """Valid actions now (the sb3-contrib MaskablePPO convention)."""
        return self.encoder.action_mask(self.boundaries)

    def step(self, action: int):
        target = self.encoder.decode(int(action), self.boundaries)
        if target is None:
            return self._advance(self.boundaries, self.config.invalid_action_penalty)
        return self._advance(target, 0.0)

    def step_to(self, boundaries: tuple[int, ...]):
        """Repartition to any valid partition (for simulation-only policies such as the oracle)."""
        return self._advance(self.planner.partition(tuple(boundaries)).boundaries, 0.0)

    def _advance(self, target: tuple[int, ...], penalty: float):
        stall_s = self.planner.stall_s(self.boundaries, target)
        if stall_s > 0:
            self.repartitions += 1
            self.stall_total_s += stall_s
            self.boundaries = tuple(target)
        start_s = self.time_s
        stats, end_s = self._run_interval(stall_s)
        efficiency = self.config.interval_iterations / self._ideal_iterations(start_s, end_s)
        observation = self.encoder.observe(stats)
        truncated = bool(self.time_s >= self.config.duration_s)
        info = self._info(stats, efficiency, penalty > 0)
        return observation, float(efficiency - penalty), False, truncated, info

    def _info(self, stats: IntervalStats, efficiency: float, invalid: bool) -> dict[str, Any]:
        return {"efficiency": efficiency, "stall_s": stats.stall_s, "wall_s": stats.wall_s, "time_s": self.time_s,
                "boundaries": self.boundaries, "invalid_action": invalid,
                "slowdown": self.situation.trace.at(self.time_s)[0].copy()}

    # --- the simulated pipeline ---------------------------------------------------------------

    def timing(self, boundaries: tuple[int, ...], row: int) -> IterationTiming:
        """One iteration of ``boundaries`` under the true conditions of trace row ``row`` (cached).
        The simulator's arithmetic (``PipelineCosts.simulate``), called straight into its kernel."""
        key = (boundaries, row)
        timing = self._timing_cache.get(key)
        if timing is None:
            trace, overheads = self.situation.trace, self._overheads
            stage_fwd, stage_bwd, link_ms = self._partition_costs(boundaries)
            slowdown = trace.slowdown[row]
            iteration, compute, comm, idle = simulate_kernel(  # type: ignore[call-arg]
                *self._graph, stage_fwd * slowdown, stage_bwd * slowdown, link_ms / trace.link_factor[row]
                if len(link_ms) == len(trace.link_factor[row]) else link_ms, float(overheads.op_ms),
                np.ones(self.situation.microbatches))
            if overheads.iteration_ms:
                iteration, idle = iteration + overheads.iteration_ms, idle + overheads.iteration_ms
            timing = self._timing_cache[key] = IterationTiming(float(iteration), compute, comm, np.maximum(idle, 0.0))
        return timing

    def _partition_costs(self, boundaries: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A partition's interference-free forward and backward ms per stage and one-way link ms (cached)."""
        costs = self._partition_cost_cache.get(boundaries)
        if costs is None:
            costs = self._partition_cost_cache[boundaries] = (
                *self.planner.costs.stage_fwd_bwd_ms(boundaries),
                self.planner.costs.link_ms(boundaries, self.situation.bandwidth_gbps) if len(boundaries) > 1
                else np.zeros(1))
        return costs

    def best_partition(self, row: int) -> tuple[tuple[int, ...], float]:
        """The best partition for the true conditions of trace row ``row`` and its iteration time, ms
        (the bottleneck-optimal partition, or the interference-free one if that simulates faster)."""
        best = self._best_cache.get(row)
        if best is None:
            s, planner = self.situation, self.planner
            num_stages = s.num_stages
            roundtrip = np.zeros((max(num_stages - 1, 1), planner.num_layers))
            if num_stages > 1:  # what optimal_boundaries does, without its checks
                links_gbps = s.bandwidth_gbps * s.trace.link_factor[row]
                roundtrip[:] = 2 * (self._activation_bits[None, :] / links_gbps[:, None])
            found, _, _ = bottleneck_dp(planner.layer_compute_ms, roundtrip, planner.costs.state_bytes,
                                        planner.costs.activation_bytes, 1.0 / s.trace.slowdown[row], np.inf,
                                        np.ones(num_stages))
            optimal = tuple(int(b) for b in found)
            candidates = [(self.timing(b, row).iteration_ms, b) for b in (optimal, planner.ideal_boundaries)]
            iteration_ms, boundaries = min(candidates)
            best = self._best_cache[row] = (boundaries, iteration_ms)
        return best

    def future(self) -> FutureView:
        """The true future, for simulation-only policies."""
        return FutureView(self)

    def _ideal_iterations(self, start_s: float, end_s: float) -> float:
        """Iterations the best partition for the true conditions would run in [start_s, end_s)."""
        total = 0.0
        for row, since, until in self.situation.trace.segments(start_s, end_s):
            # The partition in use counts as a candidate too, so that the reference is never beaten.
            best_ms = min(self.best_partition(row)[1], self.timing(self.boundaries, row).iteration_ms)
            total += (until - since) * 1e3 / best_ms
        return max(total, 1e-12)

    def _partition_constants(self, boundaries: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per stage of a partition: layer count, memory in bytes, profiled compute in ms (cached)."""
        constants = self._constants_cache.get(boundaries)
        if constants is None:
            firsts = np.asarray(boundaries)
            memory = (np.add.reduceat(self._state_bytes, firsts)
                      + self._memory_inflight * np.add.reduceat(self.planner.costs.activation_bytes, firsts))
            constants = self._constants_cache[boundaries] = (
                np.diff(stage_edges(boundaries, self.planner.num_layers)).astype(np.float64), memory.astype(np.float64),
                np.add.reduceat(self._ideal_compute, firsts))
        return constants

    def _run_interval(self, stall_s: float) -> tuple[IntervalStats, float]:
        """Pay ``stall_s``, then run K iterations through the trace; return noisy stats and the end time."""
        s, trace, k = self.situation, self.situation.trace, self.config.interval_iterations
        start_s = self.time_s
        time_s, done = start_s + stall_s, 0.0
        weighted = np.zeros((3, s.num_stages))  # compute per micro-batch, comm, idle; iteration-weighted
        while done < k - 1e-9:
            row, until = trace.span_at(time_s)
            timing = self.timing(self.boundaries, row)
            take = min(k - done, (until - time_s) * 1e3 / timing.iteration_ms)
            take = max(take, min(k - done, 1e-6))  # never stall on a change that falls exactly now
            weighted[0] += take / s.microbatches * timing.compute_ms
            weighted[1] += take * timing.comm_ms
            weighted[2] += take * timing.idle_ms
            time_s += take * timing.iteration_ms / 1e3
            done += take
        self.time_s = time_s
        self.iteration += k
        mean = weighted / k
        measured = mean * s.measurement.noise(self.np_random, mean.shape)
        measured[0] *= s.stage_bias
        layers, memory, ideal_compute = self._partition_constants(self.boundaries)
        stats = IntervalStats(self.iteration, k, time_s - start_s, stall_s, tuple(self.boundaries), measured[0],
                              measured[1], measured[2], layers, memory, measured[0] / ideal_compute)
        return stats, time_s


class FutureView:
    """What a clairvoyant policy may ask the simulator: the true conditions ahead."""

    def __init__(self, env: RepartitionEnv):
        self.env = env

    def candidates(self, horizon_s: float, limit: int) -> list[tuple[int, ...]]:
        """Best partitions for the true conditions now and at each change within ``horizon_s``."""
        trace, now = self.env.situation.trace, self.env.time_s
        first, last = trace.index_at(now), trace.index_at(now + horizon_s)
        found: list[tuple[int, ...]] = []
        for row in range(first, min(last, first + limit - 1) + 1):
            boundaries = self.env.best_partition(row)[0]
            if boundaries not in found:
                found.append(boundaries)
        return found

    @property
    def now_s(self) -> float:
        return self.env.time_s

    @property
    def end_s(self) -> float:
        return self.env.config.duration_s

    def stall_s(self, old: tuple[int, ...], new: tuple[int, ...]) -> float:
        return self.env.planner.stall_s(old, new)

    def iterations_between(self, boundaries: tuple[int, ...], start_s: float, end_s: float) -> float:
        """Iterations ``boundaries`` would run from ``start_s`` to ``end_s`` under the true conditions."""
        return sum((until - since) * 1e3 / self.env.timing(tuple(boundaries), row).iteration_ms
                   for row, since, until in self.env.situation.trace.segments(start_s, end_s))
