"""Where the PPO phase's time goes in `make bench`'s short run (issue #19, 2026-12-07; not part of the package, not
tested).

`bench_env` times the PPO phase of a 131,072-step run of the shipped config; the shipped policy's own retrain
(753,664 PPO steps) ran its phase at 3,158 steps/s where the bench, an hour later and on the same code, measured
2,798. Three modes, run from the repository root (``PYTHONPATH=.``: it imports the bench's run):

    PYTHONPATH=. .venv/bin/python docs/experiments/ppo_phase_time.py rollouts 131072
    PYTHONPATH=. .venv/bin/python docs/experiments/ppo_phase_time.py episodes 400
    PYTHONPATH=. .venv/bin/python docs/experiments/ppo_phase_time.py costly 131072

`rollouts N`: a run as `bench_env` runs it (`ppo_phase_steps_per_s(N)`), with every PPO rollout and update timed,
and in each rollout the seconds this process stepped its own 8 environments and waited for the worker's 8. Prints
the phase's steps/s, the rollouts' seconds in order, and the phase's steps/s had every rollout taken the median's
time. `episodes N`: N episodes of the training distribution, one environment in one process, a policy keeping 97%
of the time (as `bench_env`'s environment figures): each episode's seconds and steps, the share of all the time
spent in episodes costing more than 1 ms a step, and the costliest episodes' layout. `costly N`: a run as
`bench_env` runs it, every episode of any process (imitation, warm-up, PPO) that cost over 0.3 s printed as it ends,
with its process, when it began and ended (seconds since the run began; the PPO phase's start is printed too) and
its layout.

Measured 2026-12-07 01:40-02:20 (this code, on slow hours: `bench_env`'s phase on this code measured 2,798 at
00:07; here, runs of 65,536 and 131,072 steps made 1,550 to 2,522 steps/s):
- rollouts 131072, twice (2,522 and 1,741 steps/s): the first two PPO rollouts took 4.10 and 3.51 s, then 5.86 and
  4.66 s, against a median rollout of 1.18 and 1.4-2.3 s. In the first this process stepped its 8 environments in
  1.3-1.8 s and waited 3.2-3.6 s for the worker; in the second it stepped its own in 4.0-4.5 s. It happened with
  seeds 2, 3 and 4 alike (the environments all reset as PPO starts; why a costly episode comes first in each shard
  is not explained here): one shard, then the other, steps an episode whose steps cost tens of milliseconds (one
  environment 3.0-4.0 s of its shard's 4.5-4.6 s; CPU time equal to wall time; gen-2 garbage collections 0.1-0.2 s).
  About 5 s more than two median rollouts on the fastest of ten such runs (seeds 2, 3 and 4), 7.6 s on the slowest:
  some 11% of a 131,072-step phase, 2% of the shipped run's 753,664 steps.
- episodes 400: 67.6 s for 185,354 steps (365 us a step; 200-360 us in most episodes); 116 episodes over 1 ms a
  step: 3.2% of the steps, 27.8% of the time. Most are short (under 100 steps: a reset of 3.5-7 ms and first steps
  of 1-2 ms, before the caches of a new job fill; resets 3.4% of all the time) or see a new row of conditions
  every second or so (over 1,000 rows an hour: pauses here and there on 32-64 devices; 29% of the time). With 8
  replicas an interval of long iterations spans dozens of rows, and each new row costs the reward's reference
  (`best_kernel`, 294 us at 8 x 7 with 32 micro-batches) and the plan's own timing under each micro-batch pattern
  (5 runs of `job_timing_kernel`, 42 us each): episode 124 ran 41-48 ms a step. Episodes with 8 replicas took 38%
  of the time for 21% of the steps. In training, while one shard steps such an episode the other waits: in a
  65,536-step phase this process waited for the worker 1.14 ms a step on average against a median of 0.4 ms, and
  its own shard took 3.39 ms on average against a median of 2.88.
- costly 131072 (seed 2, 05:40, a phase of 1,960 steps/s; the same episodes at 04:10): the phase began at 78.7 s; the
  worker's first episode after the reset, 8 x 8 with 32 micro-batches under 4,264 rows, cost 2.40 s for 32 steps
  (79.1-81.6 s), this process's 8 x 7 with 16 under 3,733 rows 1.34 s for 70 steps and 8 x 8 under 847 rows 0.41 s
  (84.0-86.8 s): some 4 s of the phase's start. Later such episodes came now and then (8 x 6 under 3,682 rows: 1.30 s;
  4 x 8 under 2,905: 1.13 s). Not every seed's: seeds 2, 3 and 4 share 14-15 of their 16 environment seeds. With
  `--seed 40` (rollouts mode), the first two rollouts took 2.61 and 1.62 s against a median of 1.58 s; with `--seed
  100`, 1.21 and 1.08 s against 1.42 (a phase of 2,833 steps/s).
"""
import argparse
import os
import statistics
import time

import numpy as np
from sb3_contrib import MaskablePPO

from bench import bench_env
from bench.bench_env import ppo_phase_steps_per_s, shipped_config
from rlpipe.agents import vec_env
from rlpipe.agents.ppo import _env_kwargs
from rlpipe.envs import RepartitionEnv


def use_seed(seed: int) -> None:
    """The bench's runs from here on train with ``seed`` instead of the shipped config's (its 16 environments
    take ``seed``, ``seed + 1``, ...)."""
    def seeded():
        config = shipped_config()
        config.seed = seed
        return config
    bench_env.shipped_config = seeded


def rollouts(timesteps: int) -> None:
    """The PPO phase's rollouts and updates, timed one by one."""
    marks: dict[str, list[float]] = {"rollout": [], "update": [], "own": [], "wait": []}
    in_phase = [False]
    collect, update, learn = MaskablePPO.collect_rollouts, MaskablePPO.train, MaskablePPO.learn
    step_wait, here_recv = vec_env.ShardedVecEnv.step_wait, vec_env._ShardHere.recv
    clock = {"own": 0.0, "wait": 0.0}

    def timed_learn(self, *args, **kwargs):
        in_phase[0] = kwargs.get("tb_log_name") == "ppo"
        return learn(self, *args, **kwargs)

    def timed_collect(self, *args, **kwargs):
        clock.update(own=0.0, wait=0.0)
        start = time.perf_counter()
        result = collect(self, *args, **kwargs)
        if in_phase[0]:
            marks["rollout"].append(time.perf_counter() - start)
            marks["own"].append(clock["own"])
            marks["wait"].append(clock["wait"] - clock["own"])
        return result

    def timed_update(self, *args, **kwargs):
        start = time.perf_counter()
        update(self, *args, **kwargs)
        if in_phase[0]:
            marks["update"].append(time.perf_counter() - start)

    def clocked(method, key: str):
        """``method``, its seconds added to ``clock[key]``."""
        def timed(self):
            start = time.perf_counter()
            try:
                return method(self)
            finally:
                clock[key] += time.perf_counter() - start
        return timed

    MaskablePPO.learn, MaskablePPO.collect_rollouts, MaskablePPO.train = timed_learn, timed_collect, timed_update
    vec_env.ShardedVecEnv.step_wait = clocked(step_wait, "wait")  # this shard's steps, then the worker's answer
    vec_env._ShardHere.recv = clocked(here_recv, "own")  # this shard's steps
    phase_steps_per_s, _ = ppo_phase_steps_per_s(timesteps)
    steps_per_rollout = timesteps / len(marks["rollout"])
    median = statistics.median(r + u for r, u in zip(marks["rollout"], marks["update"]))
    print(f"PPO phase {phase_steps_per_s:,.0f} steps/s; {len(marks['rollout'])} rollouts of {steps_per_rollout:,.0f} "
          f"steps; at the median rollout and update ({median:.2f} s): {steps_per_rollout / median:,.0f} steps/s")
    for i, (rollout, own, wait) in enumerate(zip(marks["rollout"], marks["own"], marks["wait"])):
        print(f"rollout {i:3d}: {rollout:5.2f} s (own 8 environments {own:5.2f} s, "
              f"waiting for the worker {wait:5.2f} s)")


def costly(timesteps: int) -> None:
    """A bench-sized run, every episode costing over 0.3 s printed when it ends."""
    step, reset, learn = RepartitionEnv.step, RepartitionEnv.reset, MaskablePPO.learn
    run_start = time.time()  # wall time, as the forked processes read it too

    def timed_reset(self, *args, **kwargs):
        start = time.perf_counter()
        result = reset(self, *args, **kwargs)
        self.episode_cost_s, self.episode_steps, self.episode_began = time.perf_counter() - start, 0, time.time()
        return result

    def timed_step(self, action):
        start = time.perf_counter()
        result = step(self, action)
        self.episode_cost_s += time.perf_counter() - start
        self.episode_steps += 1
        if (result[2] or result[3]) and self.episode_cost_s > 0.3:
            s, began = self.situation, self.episode_began - run_start
            print(f"process {os.getpid()}: {self.episode_cost_s:.2f} s, {self.episode_steps:,} steps, from "
                  f"{began:.1f} to {time.time() - run_start:.1f} s; {s.replicas} x {s.num_stages}, "
                  f"{s.microbatches} micro-batches, K = {s.interval_iterations}, {len(s.trace.slowdown):,} rows",
                  flush=True)
        return result

    def marked_learn(self, *args, **kwargs):
        if kwargs.get("tb_log_name") == "ppo":
            print(f"the PPO phase begins at {time.time() - run_start:.1f} s", flush=True)
        return learn(self, *args, **kwargs)

    RepartitionEnv.step, RepartitionEnv.reset, MaskablePPO.learn = timed_step, timed_reset, marked_learn
    print(f"PPO phase {ppo_phase_steps_per_s(timesteps)[0]:,.0f} steps/s")


def episodes(count: int) -> None:
    """The training distribution's episodes, one by one, timed."""
    env = RepartitionEnv(**_env_kwargs(shipped_config()), step_info=False)
    env.reset(seed=0)
    env.step(1)  # compile outside the timing
    rng = np.random.default_rng(0)
    rows = []
    for episode in range(count):
        start = time.perf_counter()
        env.reset(seed=episode)
        steps, done = 0, False
        while not done:
            mask = env.action_masks()
            action = 0 if rng.random() < 0.97 else int(rng.choice(np.flatnonzero(mask)))
            _, _, terminated, truncated, _ = env.step(action)
            steps, done = steps + 1, terminated or truncated
        s = env.situation
        rows.append((time.perf_counter() - start, steps, episode, s.replicas, s.num_stages, s.microbatches,
                     s.interval_iterations, len(s.trace.slowdown)))
    total_s, total_steps = sum(r[0] for r in rows), sum(r[1] for r in rows)
    over_1_ms = [r for r in rows if r[0] / r[1] > 1e-3]
    print(f"{count} episodes: {total_s:.1f} s, {total_steps:,} steps ({total_s / total_steps * 1e6:.0f} us a step); "
          f"{len(over_1_ms)} episodes over 1 ms a step: {sum(r[1] for r in over_1_ms) / total_steps:.1%} of the steps, "
          f"{sum(r[0] for r in over_1_ms) / total_s:.1%} of the time")
    for seconds, steps, episode, replicas, stages, microbatches, k, trace_rows in sorted(rows, reverse=True)[:10]:
        print(f"episode {episode:4d}: {seconds:5.2f} s, {steps:6,} steps, {seconds / steps * 1e3:6.2f} ms a step; "
              f"{replicas} x {stages}, {microbatches} micro-batches, K = {k}, {trace_rows:,} trace rows")


def at_least(minimum: int):
    """An argument type: a whole number of at least ``minimum`` (argparse turns a bad one into a one-line error)."""
    def whole(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise ValueError(text)
        return value
    whole.__name__ = f"whole number >= {minimum}"  # argparse names the type in its error
    return whole


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Where the PPO phase's time goes (see the module docstring).")
    parser.add_argument("mode", choices=["rollouts", "episodes", "costly"],
                        help="rollouts: a bench-sized training run, every PPO rollout timed; episodes: the training "
                             "distribution's episodes timed one by one; costly: a bench-sized run's costly episodes")
    parser.add_argument("amount", type=at_least(1),
                        help="rollouts, costly: training steps (the bench: 131072); episodes: episodes")
    parser.add_argument("--seed", type=at_least(0),
                        help="rollouts, costly: the training seed instead of the config's (2)")
    args = parser.parse_args()
    if args.seed is not None:
        use_seed(args.seed)
    {"rollouts": rollouts, "episodes": episodes, "costly": costly}[args.mode](args.amount)
