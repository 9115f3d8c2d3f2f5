"""RepartitionEnv: decide, every interval of K training iterations, whether and how to repartition the
layers and share the micro-batches.

Each ``reset`` draws a training situation (:mod:`rlpipe.envs.situation`: profile, stage and replica
counts, micro-batches, schedule, link bandwidth, migration overhead, interference scenario, timer
model), seeded. Each ``step`` applies the action's partition and micro-batch split (paying the stall at
the start of the interval), runs K iterations of the job through the scenario's piecewise-constant
conditions (:mod:`rlpipe.envs.job`), and reports the interval's statistics, with timer noise, through
the shared :class:`~rlpipe.observation.ObservationEncoder`.

Reward: the interval's throughput (stall included) over the throughput of the best partition and split
for the true conditions of the same stretch of time with free migration (the best of the candidates of
:meth:`~rlpipe.envs.job.SimulatedJob.best` and the partition and split in use); an episode's mean reward
is the policy's efficiency (1.0: the clairvoyant bound). An invalid action is a no-op with a penalty.
An episode is one simulated stretch of training time (default one hour; or a length drawn per episode, see
``EnvConfig.min_duration_s``); it ends by truncation.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any

import gymnasium as gym
import numpy as np
from numba import njit

from rlpipe.envs.job import SimulatedJob
from rlpipe.envs.situation import EnvConfig, Situation, draw_situation
from rlpipe.errors import InputError
from rlpipe.observation import KEEP, OBSERVATION_CLIP, ActionLayout, ObservationEncoder
from rlpipe.planning import Planner
from rlpipe.profile import LayerProfile
from rlpipe.simulator import NO_OVERHEADS, Overheads
from rlpipe.stats import IntervalStats, tail_iterations

__all__ = ["EnvConfig", "FutureView", "Plan", "RepartitionEnv", "Situation"]

Plan = tuple[tuple[int, ...], tuple[int, ...]]  # what a job runs: its partition and its micro-batch split


class RepartitionEnv(gym.Env):
    """See the module docstring. Keyword arguments override :class:`EnvConfig` fields.

    Args:
        config: what a ``reset`` may draw from (the defaults of :class:`EnvConfig` where ``None``).
        step_info: whether each step's ``info`` carries the interval's details (efficiency, stall, wall time,
            partition, split, slowdowns; what evaluation and plots read). Training reads none of them, while
            stable-baselines3's vectorised environments deep-copy every info of every step: its environments
            pass False and step with an empty info (16 of them 4-7% faster a step, measured interleaved).
        overrides: :class:`EnvConfig` fields to replace.
    """

    metadata = {"render_modes": []}

    def __init__(self, config: EnvConfig | None = None, step_info: bool = True, **overrides: Any):
        known = {f.name for f in fields(EnvConfig)}
        unknown = set(overrides) - known
        if unknown:
            raise InputError(f"RepartitionEnv: unknown option(s) {', '.join(sorted(unknown))}")
        self.config = replace(config or EnvConfig(), **overrides).validate()
        size = ObservationEncoder.size_for(self.config.s_max, self.config.history, self.config.d_max)
        self.observation_space = gym.spaces.Box(-OBSERVATION_CLIP, OBSERVATION_CLIP, shape=(size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(ActionLayout(self.config.s_max).num_actions)
        self.step_info = step_info
        self._timer_models = self.config.timer_models()
        self._profiles: dict[str, LayerProfile] = {}
        self._prefetched: tuple[Plan, int] | None = None  # (plan, next row) of prefetch(); None before a reset
        # the step speculate() took ahead: (the state before it, what it returned, the action mask before it)
        self._ahead: tuple[tuple, tuple, np.ndarray] | None = None

    # --- episode set-up -----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.cancel_speculation()  # the episode's generator as the last step left it
        super().reset(seed=seed)
        cfg = self.config
        self.situation = s = draw_situation(cfg, self.np_random, options or {}, self._timer_models, self._profiles)
        self.planner = Planner(s.profile, s.num_stages, s.schedule, s.microbatches, s.bandwidth_gbps, s.migration,
                               replicas=s.replicas)
        self.encoder = ObservationEncoder(self.planner, cfg.s_max, cfg.history, cfg.d_max)
        self._ideal_compute = self.planner.profile.compute_ms()
        self.job = SimulatedJob(self.planner.costs, s.trace, s.replicas, s.num_stages, s.microbatches, s.schedule,
                                s.bandwidth_gbps, self._episode_overheads(), self.planner.ideal_boundaries,
                                self.np_random)
        self._constants_cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.boundaries = self.planner.ideal_boundaries
        self.split = self.planner.even
        self.time_s = 0.0
        self.iteration = 0
        self.repartitions = 0
        self.rebalances = 0
        self.stall_total_s = 0.0
        stats = self._run_interval(0.0)  # the first interval, so that there is something to observe
        self._last_interval_s = stats.wall_s
        self._prefetched = ((self.boundaries, self.split), 0)
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
        if self._ahead is not None:  # as of the state before the step taken ahead, where the caller is
            return self._ahead[2].copy()
        return self.encoder.action_mask(self.boundaries, self.split)

    def step(self, action: int):
        if self._ahead is not None:
            before, keep_step, _ = self._ahead
            self._ahead = None
            if int(action) == KEEP:  # the step was taken ahead
                return keep_step
            self._restore(before)
        target = self.encoder.decode(int(action), self.boundaries, self.split)
        if target is None:
            return self._advance(self.boundaries, self.split, self.config.invalid_action_penalty)
        return self._advance(*target, 0.0)

    def step_to(self, boundaries: tuple[int, ...], split: tuple[int, ...] | None = None):
        """Run any valid partition and split (for simulation-only policies such as the oracle)."""
        self.cancel_speculation()
        return self._advance(self.planner.partition(tuple(boundaries)).boundaries,
                             self.split if split is None else tuple(split), 0.0)

    def _advance(self, boundaries: tuple[int, ...], split: tuple[int, ...], penalty: float):
        stall_s = 0.0  # keeping what runs stops nothing (most steps: skip the prediction below)
        if (tuple(boundaries), tuple(split)) != (self.boundaries, self.split):
            row = self.situation.trace.index_at(self.time_s)
            stall_s = self.planner.change_stall_s((self.boundaries, self.split), (tuple(boundaries), tuple(split)),
                                                  self.job.mean_ms(tuple(boundaries), tuple(split), row))
        if tuple(boundaries) != self.boundaries:
            self.repartitions += 1
            self.boundaries = tuple(boundaries)
        if tuple(split) != self.split:
            self.rebalances += 1
            self.split = tuple(split)
        self.stall_total_s += stall_s
        start_s = self.time_s
        stats = self._run_interval(stall_s)
        self._last_interval_s = stats.wall_s
        efficiency = self.situation.interval_iterations / self.job.reference_iterations(
            self.boundaries, self.split, start_s, self.time_s)
        observation = self.encoder.observe(stats)
        truncated = bool(self.time_s >= self.situation.duration_s)
        info = self._info(stats, efficiency, penalty > 0) if self.step_info else {}
        return observation, float(efficiency - penalty), False, truncated, info

    def _info(self, stats: IntervalStats, efficiency: float, invalid: bool) -> dict[str, Any]:
        return {"efficiency": efficiency, "stall_s": stats.stall_s, "wall_s": stats.wall_s, "time_s": self.time_s,
                "boundaries": self.boundaries, "split": self.split, "invalid_action": invalid,
                "slowdown": self.situation.trace.at(self.time_s)[0].copy()}

    # --- idle time ------------------------------------------------------------------------------

    def prefetch(self) -> bool:
        """Work out now, for the plan running, the reward's reference under one row of conditions that the next
        interval is likely to meet (rows starting within twice the last interval's wall time): the best plan for
        the row and the running plan's own timing, what a step that keeps asks the job for first. Each is a
        function of the row's conditions, cached as the step would cache it, so calls between steps change no
        observation, reward or mask, only when the work is done (:class:`~rlpipe.agents.vec_env.ShardedVecEnv`
        calls this while a process would otherwise wait). Returns whether there was such work."""
        if self._prefetched is None:  # not reset yet: no episode to work ahead in
            return False
        plan, row = self._prefetched
        trace = self.situation.trace
        current = trace.index_at(self.time_s)
        if plan != (self.boundaries, self.split) or row < current:  # a new plan, or rows the steps passed
            plan, row = (self.boundaries, self.split), current
        horizon_s = min(self.time_s + 2.0 * self._last_interval_s, self.situation.duration_s)
        while row < len(trace.change_s) and (row == current or trace.change_s[row] < horizon_s):
            row += 1
            if self.job.prefetch_reference(*plan, row - 1):
                self._prefetched = plan, row
                return True
        self._prefetched = plan, row
        return False

    def speculate(self) -> bool:
        """Take the next step now as if the policy keeps the plan, what it does on most steps, keeping the state
        before it: :meth:`step` then returns it where the action is ``keep``, and otherwise goes back to that
        state first and steps as it would have. Observations, rewards and masks are those of stepping when
        asked (the step draws from the episode's generator, which going back restores); only when the work is
        done changes (:class:`~rlpipe.agents.vec_env.ShardedVecEnv` calls this while a process would otherwise
        wait). Until then the environment's attributes are those after the step taken ahead, while
        :meth:`action_masks` answers as of before it; its other methods, and the vectorised environment before
        any command but a step, go back first (:meth:`cancel_speculation`). Returns whether a step was taken:
        not where one is taken already, before a reset or past the episode's end."""
        if self._prefetched is None or self._ahead is not None or self.time_s >= self.situation.duration_s:
            return False
        mask = self.encoder.action_mask(self.boundaries, self.split)  # what action_masks() answers until then
        before = (dict(vars(self)), self.np_random.bit_generator.state, self.encoder.snapshot())
        self._ahead = before, self._advance(self.boundaries, self.split, 0.0), mask
        return True

    def cancel_speculation(self) -> None:
        """Go back to the state before the step :meth:`speculate` took ahead, if there is one."""
        if self._ahead is not None:
            self._restore(self._ahead[0])

    def _restore(self, state: tuple[dict[str, Any], dict[str, Any], tuple]) -> None:
        attributes, generator_state, encoder_state = state
        vars(self).clear()
        vars(self).update(attributes)  # _ahead among them: None
        self.np_random.bit_generator.state = generator_state
        self.encoder.restore(encoder_state)

    # --- what the job reports -------------------------------------------------------------------

    def _partition_constants(self, boundaries: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per stage of a partition: layer count, memory in bytes, profiled compute in ms (cached)."""
        constants = self._constants_cache.get(boundaries)
        if constants is None:
            planner, firsts = self.planner, np.asarray(boundaries)
            memory = (np.add.reduceat(planner.costs.state_bytes, firsts)
                      + planner.inflight * np.add.reduceat(planner.costs.activation_bytes, firsts))
            layers = np.diff(np.append(firsts, planner.num_layers)).astype(np.float64)
            constants = self._constants_cache[boundaries] = (layers, memory.astype(np.float64),
                                                             np.add.reduceat(self._ideal_compute, firsts))
        return constants

    def _run_interval(self, stall_s: float) -> IntervalStats:
        """Pay ``stall_s``, then run K iterations; return what timers show of them: each device's compute
        per micro-batch (every iteration's own timer noise, then the interval's outliers and the device's
        bias), its dispersion within the interval, communication and idle time with the interval's noise,
        and per stage the stage group's most loaded device."""
        s, rng = self.situation, self.np_random
        k = s.interval_iterations
        start_s = self.time_s
        interval = self.job.run_interval(self.boundaries, self.split, start_s + stall_s, k, rng)
        self.time_s = interval.end_s
        self.iteration += k
        shape = interval.comm_ms.shape
        layers, memory, ideal_compute = self._partition_constants(self.boundaries)
        measured = measure_kernel(interval.compute_ms, s.measurement.iteration_noise(rng, k, shape),
                                  s.measurement.interval_factors(rng, s.stage_bias), interval.comm_ms,
                                  interval.idle_ms, s.measurement.noise(rng, (2, *shape)), ideal_compute,
                                  tail_iterations(k))
        compute, comm, idle, load, cv, loads, tail = measured
        return IntervalStats(self.iteration, k, interval.end_s - start_s, stall_s, self.boundaries, compute, comm,
                             idle, layers, memory, load, compute_cv=cv, replica_load=loads, split=self.split,
                             sync_ms=interval.sync_ms, tail_load=tail)

    def future(self) -> FutureView:
        """The true future, for simulation-only policies."""
        self.cancel_speculation()
        return FutureView(self)


@njit(cache=True)
def measure_kernel(per_iteration, iteration_noise, interval_factor, comm, idle, noise,
                   ideal_compute, tail):  # pragma: no cover
    """What timers show of an interval: every device's compute per micro-batch (each iteration's reading
    with its own noise, their mean times the interval's outlier and bias ``interval_factor``), its
    dispersion within the interval, communication and idle time with the interval's ``noise``; then per
    stage the figures of its stage group's most loaded device. Returns (compute, comm, idle, load, cv)
    per stage, every device's load, and every device's load over the interval's last ``tail`` iterations."""
    iterations, replicas, stages = per_iteration.shape
    loads, tail_loads = np.empty((replicas, stages)), np.empty((replicas, stages))
    compute, comm_out, idle_out = np.empty(stages), np.empty(stages), np.empty(stages)
    load, cv = np.full(stages, -1.0), np.empty(stages)
    for s in range(stages):
        for r in range(replicas):
            total, squares = 0.0, 0.0
            for k in range(iterations):
                reading = per_iteration[k, r, s] * iteration_noise[k, r, s]
                total += reading
                squares += reading * reading
            mean = total / iterations
            spread = 0.0
            if iterations > 1:
                spread = math.sqrt(max(squares - iterations * mean * mean, 0.0) / (iterations - 1)) / mean
            measured = mean * interval_factor[r, s]
            loads[r, s] = measured / ideal_compute[s]
            recent = 0.0
            for k in range(iterations - tail, iterations):
                recent += per_iteration[k, r, s] * iteration_noise[k, r, s]
            tail_loads[r, s] = recent / tail * interval_factor[r, s] / ideal_compute[s]
            if loads[r, s] > load[s]:
                load[s], compute[s], cv[s] = loads[r, s], measured, spread
                comm_out[s], idle_out[s] = comm[r, s] * noise[0, r, s], idle[r, s] * noise[1, r, s]
    return compute, comm_out, idle_out, load, cv, loads, tail_loads


class FutureView:
    """What a clairvoyant policy may ask the simulator: the true conditions ahead."""

    def __init__(self, env: RepartitionEnv):
        self.env = env

    def candidates(self, horizon_s: float, limit: int) -> list[Plan]:
        """The best partitions and splits for the true conditions now and at each change within ``horizon_s``."""
        trace, now = self.env.situation.trace, self.env.time_s
        first, last = trace.index_at(now), trace.index_at(now + horizon_s)
        found: list[Plan] = []
        for row in range(first, min(last, first + limit - 1) + 1):
            boundaries, split, _ = self.env.job.best(row)
            if (boundaries, split) not in found:
                found.append((boundaries, split))
        return found

    @property
    def now_s(self) -> float:
        return self.env.time_s

    @property
    def end_s(self) -> float:
        return self.env.situation.duration_s

    def stall_s(self, old: Plan, new: Plan) -> float:
        """The stall of going from one (partition, split) to another now, s."""
        env = self.env
        row = env.situation.trace.index_at(env.time_s)
        return env.planner.change_stall_s(old, new, env.job.mean_ms(new[0], new[1], row))

    def iterations_per_s(self, plan: Plan, time_s: float) -> float:
        """Iterations per second ``plan`` (partition, split) runs at ``time_s`` under the true conditions."""
        row = self.env.situation.trace.index_at(time_s)
        return 1e3 / self.env.job.mean_ms(plan[0], plan[1], row)

    def iterations_between(self, plan: Plan, start_s: float, end_s: float) -> float:
        """Iterations ``plan`` (partition, split) would run from ``start_s`` to ``end_s`` under the true
        conditions."""
        job = self.env.job
        return sum((until - since) * 1e3 / job.mean_ms(plan[0], plan[1], row)
                   for row, since, until in self.env.situation.trace.segments(start_s, end_s))
