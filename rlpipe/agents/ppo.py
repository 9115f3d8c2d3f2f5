"""The learned policy: PPO training on RepartitionEnv, export to a deploy artifact, and the deployed
policy with its heuristic fallback.

Training uses sb3-contrib's MaskablePPO (PPO that never samples a masked action). Deployment needs
only torch: :class:`PPOPolicy` runs the exported actor and falls back to a heuristic (dynpipe by
default) whenever the artifact or the input does not fit, counting and logging every fallback.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlpipe.agents.artifact import Actor, ArtifactMeta, load_artifact, save_artifact
from rlpipe.agents.base import DecisionContext, Policy
from rlpipe.agents.heuristics import DynPipePolicy
from rlpipe.errors import InputError
from rlpipe.observation import OBSERVATION_VERSION, KEEP, ActionLayout, ObservationEncoder

log = logging.getLogger("rlpipe.ppo")
ENV_ID = "rlpipe/Repartition-v0"
PPO_KEYS = ("learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "clip_range",
            "ent_coef", "vf_coef", "max_grad_norm")


@dataclass
class TrainConfig:
    """Everything a training run needs; read from a zoo-style YAML block, overridden by the CLI."""

    n_timesteps: int = 1_000_000
    n_envs: int = 4
    seed: int = 1
    policy: str = "MlpPolicy"
    learning_rate: float | str = 3e-4  # or "lin_3e-4": decays linearly to 0
    n_steps: int = 512
    batch_size: int = 256
    n_epochs: int = 10
    gamma: float = 0.98
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.003
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    normalize_reward: bool = True
    policy_kwargs: dict[str, Any] = field(default_factory=lambda: {"net_arch": [128, 128]})
    eval_freq: int = 20_000
    eval_episodes: int = 8
    checkpoint_freq: int = 100_000
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "TrainConfig":
        try:
            document = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise InputError(f"{path}: no such config file") from None
        except yaml.YAMLError as err:
            raise InputError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(document, dict) or ENV_ID not in document:
            raise InputError(f"{path}: expected a block '{ENV_ID}:' with the hyper-parameters")
        block = document[ENV_ID] or {}
        unknown = set(block) - set(cls.__dataclass_fields__)
        if unknown:
            raise InputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
        return cls(**block)


def _source_revision() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _make_vec_env(config: TrainConfig, n_envs: int, seed: int):
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlpipe.envs.repartition import RepartitionEnv

    env_kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in config.env_kwargs.items()}
    vec = DummyVecEnv([lambda: Monitor(RepartitionEnv(**env_kwargs)) for _ in range(n_envs)])
    vec.seed(seed)
    return vec


class SB3Policy:
    """A (Maskable)PPO model behind the :class:`Policy` protocol, for evaluation during training."""

    name = "ppo-training"

    def __init__(self, model: Any):
        self.model = model

    def reset(self) -> None:
        pass

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> int:
        action, _ = self.model.predict(observation, action_masks=mask, deterministic=True)
        return int(action)


def make_efficiency_callback(config: TrainConfig, out: Path) -> Any:
    """An EvalCallback that scores the deterministic policy by mean efficiency on the same held-out
    episodes every time (common random numbers, seeds never used in training) and keeps the best."""
    from stable_baselines3.common.callbacks import BaseCallback

    from rlpipe.envs.repartition import RepartitionEnv
    from rlpipe.evaluate import run_episode

    env_kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in config.env_kwargs.items()}
    scenarios = list(env_kwargs.get("scenarios", ("heavy", "bursty", "none")))
    episodes = [(scenarios[i % len(scenarios)], 50_000_017 + i) for i in range(config.eval_episodes)]

    class EfficiencyEvalCallback(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.env = RepartitionEnv(**env_kwargs)
            self.best = -np.inf
            self.history: list[tuple[int, float]] = []

        def _on_step(self) -> bool:
            if self.n_calls % max(config.eval_freq // config.n_envs, 1):
                return True
            policy = SB3Policy(self.model)
            score = float(np.mean([run_episode(self.env, policy, seed, scenario).efficiency
                                   for scenario, seed in episodes]))
            self.history.append((self.num_timesteps, score))
            self.logger.record("eval/mean_efficiency", score)
            (out / "eval").mkdir(parents=True, exist_ok=True)
            (out / "eval" / "efficiency.json").write_text(json.dumps(self.history))
            if score > self.best:
                self.best = score
                (out / "best").mkdir(parents=True, exist_ok=True)
                self.model.save(out / "best" / "best_model.zip")
            return True

    return EfficiencyEvalCallback()


def train(config: TrainConfig, out_dir: str | Path, progress: bool = True) -> Path:
    """Train MaskablePPO, keep the best model on held-out seeds, export ``policy.pt`` / ``policy.json``.

    Writes under ``out_dir``: ``best/`` and ``checkpoints/`` (SB3 zips), ``eval/efficiency.json``
    (held-out efficiency over training), ``tb/`` (TensorBoard), ``final_model.zip``, ``policy.pt``
    and ``policy.json``.
    """
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import CheckpointCallback
    from stable_baselines3.common.vec_env import VecNormalize

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_env = _make_vec_env(config, config.n_envs, config.seed)
    if config.normalize_reward:
        # Rewards hover near 1.0; scaling returns helps the value function. Observations stay raw
        # (they are scale-free by construction), so deployment applies no statistics.
        train_env = VecNormalize(train_env, norm_obs=False, norm_reward=True, gamma=config.gamma)
    callbacks = [
        make_efficiency_callback(config, out),
        CheckpointCallback(save_freq=max(config.checkpoint_freq // config.n_envs, 1),
                           save_path=str(out / "checkpoints"), name_prefix="ppo"),
    ]
    hyper = {key: getattr(config, key) for key in PPO_KEYS}
    if isinstance(config.learning_rate, str) and config.learning_rate.startswith("lin_"):  # zoo notation
        initial = float(config.learning_rate[4:])
        hyper["learning_rate"] = lambda progress_remaining: progress_remaining * initial
    model = MaskablePPO(config.policy, train_env, seed=config.seed, tensorboard_log=str(out / "tb"),
                        policy_kwargs=dict(config.policy_kwargs), verbose=0, **hyper)
    try:
        model.learn(total_timesteps=config.n_timesteps, callback=callbacks, progress_bar=progress)
    finally:  # an interrupted run keeps what it learned
        model.save(out / "final_model.zip")
    best = out / "best" / "best_model.zip"
    if best.exists():
        model = MaskablePPO.load(best, device="cpu")
    history = config.env_kwargs.get("history", 4)
    s_max = config.env_kwargs.get("s_max", 8)
    export(model, s_max, history, out, training={
        "config": {**config.__dict__}, "seed": config.seed, "source_revision": _source_revision(),
        "selected": "best on held-out seeds" if best.exists() else "final"})
    return out / "policy.pt"


def export(model: Any, s_max: int, history: int, out_dir: str | Path, training: dict[str, Any] | None = None,
           stem: str = "policy") -> tuple[Path, Path]:
    """Copy an SB3 (Maskable)PPO model's actor into a plain :class:`Actor` and save the artifact."""
    policy = model.policy
    net_arch = policy.net_arch if isinstance(policy.net_arch, list) else policy.net_arch["pi"]
    activation = "relu" if "ReLU" in type(policy.activation_fn()).__name__ else "tanh"
    size = ObservationEncoder.size_for(s_max, history)
    actor = Actor(size, list(net_arch), ActionLayout(s_max).num_actions, activation)
    linears = [m for m in policy.mlp_extractor.policy_net if hasattr(m, "weight")] + [policy.action_net]
    targets = [m for m in actor.net if hasattr(m, "weight")]
    for source, target in zip(linears, targets, strict=True):
        target.weight.data.copy_(source.weight.data)
        target.bias.data.copy_(source.bias.data)
    meta = ArtifactMeta(OBSERVATION_VERSION, s_max, history, size, ActionLayout(s_max).num_actions,
                        list(net_arch), activation, training=training or {})
    return save_artifact(actor, meta, out_dir, stem)


class PPOPolicy:
    """The deployed PPO actor with a heuristic fallback.

    Falls back (and counts why) when the artifact did not load, when the pipeline has more stages
    than the artifact's ``s_max``, when the observation does not match its layout, or when the
    observation holds non-finite values.
    """

    def __init__(self, actor: Actor | None, meta: ArtifactMeta | None, fallback: Policy | None = None,
                 load_error: str | None = None, name: str = "ppo"):
        self.actor, self.meta = actor, meta
        self.fallback = fallback or DynPipePolicy()
        self.load_error = load_error
        self.name = name
        self.fallbacks: Counter[str] = Counter()
        self.last_reason: str | None = None

    def reset(self) -> None:
        self.fallback.reset()

    def _unfit(self, observation: np.ndarray | None, context: DecisionContext) -> str | None:
        if self.actor is None or self.meta is None:
            return f"artifact unavailable ({self.load_error})"
        if context.encoder.planner.num_stages > self.meta.s_max:
            return f"{context.encoder.planner.num_stages} stages exceed the artifact's s_max {self.meta.s_max}"
        if observation is None or np.shape(observation) != (self.meta.observation_size,):
            return "observation missing or of another layout"
        if not np.all(np.isfinite(observation)):
            return "non-finite statistics"
        return None

    def act(self, observation: np.ndarray | None, mask: np.ndarray, context: DecisionContext) -> int:
        reason = self._unfit(observation, context)
        self.last_reason = reason
        if reason is None:
            return self.actor.act(observation, mask)
        self.fallbacks[reason] += 1
        log.warning("ppo falls back to %s: %s", self.fallback.name, reason)
        try:
            return self.fallback.act(observation, mask, context)
        except Exception as err:  # the fallback itself cannot read this input: hold still
            log.warning("fallback %s failed (%s): keeping the partition", self.fallback.name, err)
            return KEEP


def default_artifact_path() -> Path:
    return Path(str(resources.files("rlpipe") / "policies" / "default.pt"))


def load_deployed_policy(path: str | None = None, fallback: Policy | None = None, strict: bool = True) -> PPOPolicy:
    """The PPO policy from ``path`` (a folder or ``.pt`` file) or the shipped default.

    ``strict``: raise :class:`InputError` if the artifact is missing or does not fit; otherwise
    return a policy that always falls back, with the reason recorded.
    """
    target = Path(path) if path else default_artifact_path()
    try:
        actor, meta = load_artifact(target)
    except InputError as err:
        if strict:
            raise
        return PPOPolicy(None, None, fallback, load_error=str(err))
    return PPOPolicy(actor, meta, fallback)
