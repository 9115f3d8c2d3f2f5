"""Environment speed (steps per second, S = 8, one process), the PPO phase's speed end to end as `rlpipe train`
runs it (the shipped config, 2 cores: PPO from the imitated policy, its 16 environments stepped as the config
says, three times, its median and its spread, and all in turn in one process once), PPO's own
share (the same network, rollouts and updates on environments that cost nothing to step), the imitation's
labelling speed in one and two processes, the README's 4,096-step training trial's wall time and policy
decision latency. The figures before the speed-up (observation in Python, 4 environments, 10 epochs) stand
beside them."""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlpipe.agents import DecisionContext, make_policy
from rlpipe.envs import RepartitionEnv

if TYPE_CHECKING:
    from rlpipe.agents.ppo import TrainConfig


def env_steps_per_s(seconds: float = 3.0, keep: float = 0.9, **env_kwargs) -> float:
    """Environment steps per second in one process, actions drawn at random (keep with probability ``keep``,
    else a valid action uniformly): by default 8 stages and one replica; ``env_kwargs`` instead: that
    environment (the training distribution, say)."""
    env = RepartitionEnv(**(env_kwargs or {"min_stages": 8, "max_stages": 8}))
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    env.step(1)  # compile the JIT kernels outside the timing
    steps, episode, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.reset(seed=episode)
        episode += 1
        done = False
        while not done:
            mask = env.action_masks()
            action = 0 if rng.random() < keep else int(rng.choice(np.flatnonzero(mask)))
            _, _, terminated, truncated, _ = env.step(action)
            steps += 1
            done = terminated or truncated
    return steps / (time.perf_counter() - start)


def decision_latency_ms(policy_name: str, decisions: int = 2000) -> float:
    """Median time of encoder.observe + policy.act, as the live controller pays it."""
    env = RepartitionEnv(min_stages=8, max_stages=8)
    policy = make_policy(policy_name)
    env.reset(seed=1)
    timings = []
    while len(timings) < decisions:
        env.reset(seed=len(timings))
        done = False
        while not done and len(timings) < decisions:
            stats = env.encoder.latest
            start = time.perf_counter()
            observation = env.encoder.observe(stats)
            action = policy.act(observation, env.encoder.action_mask(env.boundaries),
                                DecisionContext(env.encoder, env.boundaries))
            timings.append(time.perf_counter() - start)
            _, _, terminated, truncated, _ = env.step(int(action))
            done = terminated or truncated
    return float(np.median(timings) * 1e3)


def shipped_config_path() -> Path:
    """configs/ppo.yml, the shipped policy's training config."""
    return Path(__file__).resolve().parents[1] / "configs" / "ppo.yml"


def shipped_config() -> TrainConfig:
    from rlpipe.agents.ppo import TrainConfig

    return TrainConfig.from_yaml(shipped_config_path())


def ppo_phase_steps_per_s(timesteps: int = 131_072, vec_env: str | None = None,
                          vec_workers: int | None = None, imitate: bool = True,
                          net_arch: list[int] | None = None) -> tuple[float, float]:
    """A training run as `rlpipe train --config configs/ppo.yml --timesteps N` runs it, N = ``timesteps``
    (its imitation in proportion: 40% of N decisions, a critic warm-up of 20%; then PPO from the imitated
    policy, with the behaviour anchor; the periodic evaluations off), its environments stepped as ``vec_env``
    and ``vec_workers`` say (dummy, or subproc in that many processes; None: as the config says), with torch's
    default threads, as the command runs. Returns (the PPO phase's environment steps/s end to end: rollouts,
    updates and the anchor, the scoring at its end left out; the whole run's steps/s, imitation and all).
    ``imitate=False``: PPO from scratch (what this bench timed until 2026-12-04), which is not this phase.
    ``net_arch``: the actor's and the critic's hidden layers instead of the config's."""
    import tempfile

    from rlpipe.agents.phase_times import PhaseTimes
    from rlpipe.agents.ppo import train

    config = shipped_config()
    config.n_timesteps, config.eval_freq, config.checkpoint_freq = timesteps, 10**12, 10**12
    config.vec_env, config.vec_workers = vec_env or config.vec_env, vec_workers or config.vec_workers
    if not imitate:
        config.imitate = None
    if net_arch is not None:
        config.policy_kwargs = {**config.policy_kwargs, "net_arch": net_arch}
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        train(config, out, progress=False)
        whole_s = time.perf_counter() - start
        phases = PhaseTimes(json.loads((Path(out) / "phases.json").read_text()))
    return phases.steps_per_s("ppo"), timesteps / whole_s


def ppo_ceiling_steps_per_s(timesteps: int = 65_536) -> float:
    """PPO's own share of training: the shipped config's network, rollouts and updates on 16 environments that
    cost nothing to step (the real observation and action spaces, a constant observation, every action
    valid), steps/s, with torch's default threads as in training: what the PPO phase would reach on this
    machine with a free environment."""
    import gymnasium as gym
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from rlpipe.agents.ppo import PPO_KEYS, _env_kwargs, without_distribution_checks

    config = shipped_config()
    real = RepartitionEnv(**_env_kwargs(config))

    class FreeEnv(gym.Env):
        observation_space, action_space = real.observation_space, real.action_space

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.steps = 0
            return np.zeros(self.observation_space.shape, dtype=np.float32), {}

        def step(self, action):
            self.steps += 1
            return np.zeros(self.observation_space.shape, dtype=np.float32), 1.0, False, self.steps >= 500, {}

        def action_masks(self) -> np.ndarray:
            return np.ones(self.action_space.n, dtype=bool)

    envs = VecNormalize(DummyVecEnv([FreeEnv] * config.n_envs), norm_obs=False, gamma=config.gamma)
    # the config's "lin_" rate is train()'s notation; a rate changes nothing of the cost
    hyper = {key: getattr(config, key) for key in PPO_KEYS if key != "learning_rate"}
    model = MaskablePPO("MlpPolicy", envs, seed=0, policy_kwargs=dict(config.policy_kwargs), **hyper)
    start = time.perf_counter()
    with without_distribution_checks():  # as training runs
        model.learn(total_timesteps=timesteps)
    return timesteps / (time.perf_counter() - start)


def trial_run_s(timesteps: int = 4096) -> float:
    """Wall seconds of the README's trial, ``rlpipe train --config configs/ppo.yml --timesteps 4096``, as a user
    runs it: a fresh process (imports included), imitation, PPO, scoring and export."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rlpipe.cli", "train", "--config", str(shipped_config_path()),
                        "--timesteps", str(timesteps), "--out", out], check=True, capture_output=True)
        return time.perf_counter() - start


def imitation_decisions_per_s(teacher: str, workers: int, decisions: int = 60_000) -> float:
    """Teacher decisions labelled per second in the shipped config's training episodes, in ``workers``
    processes (``imitation_workers``)."""
    from rlpipe.agents.imitation import collect
    from rlpipe.agents.ppo import _env_kwargs

    env_kwargs = _env_kwargs(shipped_config())
    collect(env_kwargs, teacher, 200)  # compile the JIT kernels outside the timing
    start = time.perf_counter()
    collect(env_kwargs, teacher, decisions, workers=workers)
    return decisions / (time.perf_counter() - start)


def dagger_decisions_per_s(decisions: int = 10_000, repeats: int = 3) -> dict[str, float]:
    """DAgger's labelling speed in one process, decisions/s: the shipped config's episodes driven by an
    untrained learner (the shipped network), its decisions read from its actor (``learner_action``, what
    training does) and, interleaved with it, from SB3's ``MaskablePPO.predict`` (what training did before
    2026-12-03); the same decisions either way. The median of ``repeats`` each."""
    from unittest import mock

    import torch
    from sb3_contrib import MaskablePPO

    from rlpipe.agents import imitation
    from rlpipe.agents.ppo import _env_kwargs

    torch.set_num_threads(1)
    config = shipped_config()
    env_kwargs = _env_kwargs(config)
    learner = MaskablePPO("MlpPolicy", RepartitionEnv(**env_kwargs), seed=0, policy_kwargs=dict(config.policy_kwargs))

    def predicted(model, observation, mask):
        return int(model.predict(observation, action_masks=mask, deterministic=True)[0])

    imitation.collect(env_kwargs, "falcon", 200, learner=learner)  # compile the JIT kernels outside the timing
    rates: dict[str, list[float]] = {"actor": [], "sb3_predict": []}
    for _ in range(repeats):
        for name in rates:
            with mock.patch.object(imitation, "learner_action", predicted) if name == "sb3_predict" else nullcontext():
                start = time.perf_counter()
                imitation.collect(env_kwargs, "falcon", decisions, learner=learner)
                rates[name].append(decisions / (time.perf_counter() - start))
    return {name: float(np.median(values)) for name, values in rates.items()}


def run() -> dict:
    import torch

    from rlpipe.agents.ppo import _env_kwargs

    # first, with torch's default threads (the later figures set 1). The shipped layout (split: 7 environments
    # stepped in this process while 9 step in another) three times, as this machine's speed moves by a fifth
    # between runs minutes apart: the median, and every run beside it; dummy (all 16 in turn in this process,
    # the default until 2026-12-05) once between its first two runs, and the 256-wide layers shipped until
    # 2026-12-06 22:58 after each of them
    figures: dict = {"torch_threads_in_training": torch.get_num_threads()}
    config = shipped_config()
    shipped = {"vec_env": config.vec_env, "vec_workers": config.workers()}
    runs, wider = [ppo_phase_steps_per_s(**shipped)], []
    dummy = ppo_phase_steps_per_s(vec_env="dummy")
    for _ in range(2):
        wider.append(ppo_phase_steps_per_s(**shipped, net_arch=[256, 256])[0])
        runs.append(ppo_phase_steps_per_s(**shipped))
    phase_rates = [rates[0] for rates in runs]
    median_run = sorted(runs)[1]  # (PPO phase steps/s, whole run steps/s) of the median run
    figures["ppo_phase_steps_per_s_free_env"] = ppo_ceiling_steps_per_s()
    figures.update({"ppo_phase_layout": f"{config.vec_env} x {config.workers()}",
                    "ppo_phase_steps_per_s": median_run[0], "ppo_phase_steps_per_s_lowest": min(phase_rates),
                    "ppo_phase_steps_per_s_highest": max(phase_rates), "ppo_phase_steps_per_s_runs": phase_rates,
                    "ppo_phase_target_steps_per_s": 3_000, "ppo_phase_steps_per_s_vec_env_dummy": dummy[0],
                    "ppo_phase_shipped_over_dummy": median_run[0] / dummy[0],
                    "ppo_phase_steps_per_s_net_256_runs": wider,
                    "ppo_phase_shipped_over_net_256": sum(phase_rates[1:]) / sum(wider),  # the runs beside them
                    # 52,428 decisions imitated, the config's DAgger rounds of 17,476, 28,672 critic steps, then PPO
                    "train_run_131k_steps_per_s": median_run[1],
                    # the measure reported until 2026-12-04 (then with one torch thread), for comparison
                    "ppo_from_scratch_steps_per_s": ppo_phase_steps_per_s(65_536, imitate=False)[0],
                    "env_steps_per_s_S8": env_steps_per_s(), "env_target_steps_per_s": 10_000,
                    "env_steps_per_s_S8_before": 5_269})
    # what the training distribution costs, by replica count (its episodes; a policy that mostly keeps, as the
    # imitated one does), and whether moves cost more than keeps
    env_kwargs = _env_kwargs(shipped_config())
    for replicas in (1, 2, 4, 8):
        figures[f"env_steps_per_s_training_D{replicas}"] = env_steps_per_s(
            4.0, keep=0.97, **{**env_kwargs, "data_parallel": [replicas, replicas]})
    for keep in (0.97, 0.0):
        figures[f"env_steps_per_s_training_keep_{keep}"] = env_steps_per_s(4.0, keep=keep, **env_kwargs)
    figures["train_trial_4096_steps_s"] = trial_run_s()
    dagger = dagger_decisions_per_s()
    figures["dagger_decisions_per_s_actor"] = dagger["actor"]
    figures["dagger_decisions_per_s_sb3_predict"] = dagger["sb3_predict"]
    figures["dagger_actor_over_sb3_predict"] = dagger["actor"] / dagger["sb3_predict"]
    for workers in (1, 2):
        figures[f"imitation_falcon_decisions_per_s_workers_{workers}"] = imitation_decisions_per_s("falcon", workers)
    for name in ["static", "greedy", "dynpipe", "threshold", "ppo"]:
        figures[f"decision_latency_ms_{name}"] = decision_latency_ms(name)
    return figures
