"""PPO training on RepartitionEnv and export to a deploy artifact (``policy.pt`` + ``policy.json``).

Training uses sb3-contrib's MaskablePPO (PPO that never samples a masked action). The deployed side,
which needs only torch, lives in :mod:`rlpipe.agents.deployed`.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import yaml
from sb3_contrib import MaskablePPO
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize

from rlpipe import ENV_ID
from rlpipe.agents import HEURISTICS, imitation
from rlpipe.agents.artifact import Actor, ArtifactMeta, save_artifact
from rlpipe.agents.deployed import PPOPolicy
from rlpipe.agents.phase_times import PhaseTimes
from rlpipe.agents.rollout_policy import RolloutPolicy
from rlpipe.agents.vec_env import ShardedVecEnv
from rlpipe.calibration import Calibration
from rlpipe.envs.evaluation import bootstrap_interval, run_episode
from rlpipe.envs.repartition import RepartitionEnv
from rlpipe.errors import InputError
from rlpipe.fields import check_field_types
from rlpipe.files import read_text
from rlpipe.observation import (
    DEFAULT_D_MAX,
    DEFAULT_HISTORY,
    DEFAULT_S_MAX,
    OBSERVATION_VERSION,
    ActionLayout,
    ObservationEncoder,
)
from rlpipe.seeds import DAGGER_SEED_STRIDE, DEMONSTRATION_SEED_BASE, HELD_OUT_SEED_BASE

PPO_KEYS = ("learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "clip_range",
            "ent_coef", "vf_coef", "max_grad_norm")


@dataclass
class TrainConfig:
    """Everything a training run needs; read from a zoo-style YAML block, overridden by the CLI."""

    n_timesteps: int = 1_000_000
    n_envs: int = 4
    vec_env: str = "dummy"  # "dummy": the environments step in turn in this process; "subproc": in other
    # processes (the same steps), shared among vec_workers of them; "split": in vec_workers shards, the first
    # stepped in this process while the others step in theirs
    vec_workers: int | None = None  # subproc's processes or split's shards; best: one per core (None: for
    # subproc one per environment, SB3's SubprocVecEnv layout; for split 2)
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
    eval_duration_s: float = 1200.0  # simulated s of each held-out episode (a run shorter than eval_freq: in
    # proportion to its share of eval_freq, at least SHORTEST_SCORING_S)
    imitate: str | None = None  # a heuristic whose decisions the actor learns first (None: from scratch)
    imitation_steps: int = 500_000  # at most; a short run imitates in proportion (imitation_share of its steps)
    imitation_best_of: list[str] = field(default_factory=list)  # rules that label an episode of one pipeline
    # instead of the teacher where one of them did best on it (imitation.PrivilegedTeacher)
    imitation_best_margin: float = 0.0  # ... by more than this much efficiency (0-1)
    imitation_share: float = 0.15
    imitation_epochs: int = 8
    imitation_rare_weight: float = 5.0  # the cloning loss weighs the teacher's moves (not keep) this many times
    imitation_rounds: int = 0  # DAgger rounds after the cloning: the teacher labels the clone's own states
    imitation_round_steps: int = 100_000  # decisions labelled per round (a short run: in proportion)
    imitation_workers: int = 1  # processes labelling the teacher's decisions (episodes in parallel, same labels)
    anchor_batches: int = 0  # cloning-loss minibatches on the teacher's decisions after every PPO rollout
    anchor_learning_rate: float = 1e-4
    critic_warmup_steps: int = 200_000  # the critic learns the cloned actor's values, the actor held still (at
    # most; a short run in proportion, half the imitation's share)
    checkpoint_freq: int = 100_000
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        try:
            document = yaml.safe_load(read_text(path, "config file"))
        except yaml.YAMLError as err:
            raise InputError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(document, dict) or ENV_ID not in document:
            raise InputError(f"{path}: expected a block '{ENV_ID}:' with the hyper-parameters")
        block = document[ENV_ID] or {}
        if not isinstance(block, dict):
            raise InputError(f"{path}: {ENV_ID}: expected a mapping of hyper-parameters")
        unknown = set(map(str, block)) - set(cls.__dataclass_fields__)
        if unknown:
            raise InputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
        env_kwargs = block.get("env_kwargs") or {}
        if not isinstance(env_kwargs, dict):
            raise InputError(f"{path}: env_kwargs: expected a mapping of environment options")
        env_kwargs = dict(env_kwargs)
        if isinstance(env_kwargs.get("calibration"), str):  # a file named in the config lies beside it
            env_kwargs["calibration"] = str(Path(path).parent / env_kwargs["calibration"])
        return cls(**{**block, "env_kwargs": env_kwargs}).validate(str(path))

    def validate(self, source: str = "train config") -> TrainConfig:
        """Check every field (types, ranges, the environment options); a problem is one InputError."""
        check_field_types(self, source)
        for name in ("n_timesteps", "n_envs", "n_steps", "batch_size", "n_epochs", "eval_freq", "eval_episodes",
                     "imitation_epochs", "imitation_workers", "checkpoint_freq"):
            if getattr(self, name) < 1:
                raise InputError(f"{source}: {name}: must be >= 1, got {getattr(self, name)}")
        if self.n_envs > MAX_ENVS or self.n_steps * self.n_envs > MAX_ROLLOUT:
            raise InputError(f"{source}: n_envs x n_steps: at most {MAX_ENVS} environments and {MAX_ROLLOUT:,} "
                             f"steps per rollout, got {self.n_envs} x {self.n_steps}")
        if self.batch_size > self.n_steps * self.n_envs:
            raise InputError(f"{source}: batch_size {self.batch_size}: larger than a rollout "
                             f"(n_steps x n_envs = {self.n_steps * self.n_envs})")
        self._validate_imitation(source)
        self._validate_workers(source)
        for name in ("imitation_steps", "imitation_rounds", "imitation_round_steps", "anchor_batches",
                     "critic_warmup_steps", "ent_coef", "vf_coef"):
            if getattr(self, name) < 0:
                raise InputError(f"{source}: {name}: must be >= 0, got {getattr(self, name)}")
        for name, low, high in (("gamma", 0.0, 1.0), ("gae_lambda", 0.0, 1.0)):
            if not low < getattr(self, name) <= high:
                raise InputError(f"{source}: {name}: must be in ({low:g}, {high:g}], got {getattr(self, name)}")
        for name in ("clip_range", "max_grad_norm", "eval_duration_s", "anchor_learning_rate",
                     "imitation_rare_weight"):
            if not getattr(self, name) > 0:
                raise InputError(f"{source}: {name}: must be > 0, got {getattr(self, name)}")
        self._validate_learning_rate(source)
        if set(self.policy_kwargs) - {"net_arch"} or not _is_net_arch(self.policy_kwargs.get("net_arch", [64])):
            raise InputError(f"{source}: policy_kwargs: only net_arch, a list of layer widths (1-{MAX_WIDTH}), "
                             f"is read, got {self.policy_kwargs!r:.80}")
        if self.policy != "MlpPolicy":
            raise InputError(f"{source}: policy: only MlpPolicy fits the flat observation, got {self.policy!r}")
        RepartitionEnv(**_env_kwargs(self))  # the environment options: checked where they are known
        return self

    def _validate_imitation(self, source: str) -> None:
        if not 0 <= self.imitation_share <= 1:
            raise InputError(f"{source}: imitation_share: must be in [0, 1], got {self.imitation_share}")
        if self.imitate is not None and self.imitate not in HEURISTICS:
            raise InputError(f"{source}: imitate: a heuristic to imitate ({', '.join(HEURISTICS)}), got "
                             f"{self.imitate!r}")
        unknown = [rule for rule in self.imitation_best_of if rule not in HEURISTICS]
        if unknown:
            raise InputError(f"{source}: imitation_best_of: heuristics ({', '.join(HEURISTICS)}), got {unknown[0]!r}")
        if not 0 <= self.imitation_best_margin < 1:
            raise InputError(f"{source}: imitation_best_margin: must be in [0, 1), got {self.imitation_best_margin}")
        if self.imitation_best_of and self.imitate is None:
            raise InputError(f"{source}: imitation_best_of: the rules that may label instead of the teacher; "
                             f"name the teacher in imitate")

    def _validate_workers(self, source: str) -> None:
        if self.imitation_workers > MAX_WORKERS:
            raise InputError(f"{source}: imitation_workers: at most {MAX_WORKERS} processes, got "
                             f"{self.imitation_workers}")
        if self.vec_env not in VEC_ENVS:
            raise InputError(f"{source}: vec_env: {', '.join(VEC_ENVS)}, got {self.vec_env!r}")
        workers = self.workers()
        if self.vec_env == "subproc" and not 1 <= workers <= MAX_WORKERS:
            raise InputError(f"{source}: vec_env subproc: 1 to {MAX_WORKERS} processes (vec_workers, by default one "
                             f"per environment), got {workers}")
        if self.vec_env == "split" and not 2 <= workers <= min(MAX_WORKERS, self.n_envs):
            raise InputError(f"{source}: vec_env split: 2 to {min(MAX_WORKERS, self.n_envs)} shards (vec_workers, "
                             f"one stepped in this process; by default 2), got {workers}")

    def workers(self) -> int:
        """subproc's processes or split's shards (``vec_workers``, or its default)."""
        if self.vec_workers is not None:
            return self.vec_workers
        return 2 if self.vec_env == "split" else self.n_envs

    def _validate_learning_rate(self, source: str) -> None:
        rate = self.learning_rate
        if isinstance(rate, str):
            try:
                rate = float(rate.removeprefix("lin_")) if rate.startswith("lin_") else float("nan")
            except ValueError:
                rate = float("nan")
        if not 0 < rate < 1:
            raise InputError(f"{source}: learning_rate: a number in (0, 1) or lin_<number>, got "
                             f"{self.learning_rate!r}")


MAX_ENVS = 256
MAX_WORKERS = 64  # imitation's labelling processes
VEC_ENVS = ("dummy", "subproc", "split")  # where the training environments step (TrainConfig.vec_env)
MAX_ROLLOUT = 10_000_000  # steps per rollout buffer: beyond, memory runs out
MAX_WIDTH = 65_536
SHORTEST_SCORING_S = 120.0  # a short run's held-out episodes last at least this long (simulated s)


def _is_net_arch(net_arch: Any) -> bool:
    """A list of positive layer widths (SB3 also takes a dict of such lists for ``pi`` and ``vf``)."""
    if isinstance(net_arch, dict):
        return set(net_arch) <= {"pi", "vf"} and all(_is_net_arch(widths) for widths in net_arch.values())
    return isinstance(net_arch, list) and all(
        isinstance(width, int) and not isinstance(width, bool) and 1 <= width <= MAX_WIDTH for width in net_arch)


def _source_revision() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        revision = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True, timeout=5).stdout.strip() or "unknown"
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "rlpipe", "configs"],
                                 capture_output=True, text=True, timeout=5).stdout.strip()
        return f"{revision}+uncommitted" if changed and revision != "unknown" else revision
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _env_kwargs(config: TrainConfig) -> dict[str, Any]:
    """The config's environment options, lists (from YAML) turned into the tuples EnvConfig holds."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.env_kwargs.items()}


def _make_vec_env(config: TrainConfig, n_envs: int, seed: int) -> VecEnv:
    """``n_envs`` seeded training environments, stepped in this process, in ``vec_workers`` others, or in
    both (``vec_env``)."""
    env_kwargs = _env_kwargs(config)
    # PPO reads no step's details (the info that evaluation reads), and the vectorised environment copies them
    makers: list[Callable[[], gym.Env]] = [lambda: Monitor(RepartitionEnv(**env_kwargs, step_info=False))
                                           for _ in range(n_envs)]
    # forked, the processes start with everything imported (the environments never use torch)
    vec = DummyVecEnv(makers) if config.vec_env == "dummy" else ShardedVecEnv(
        makers, config.workers(), step_here=config.vec_env == "split")
    vec.seed(seed)
    return vec


class RolloutThreads(BaseCallback):
    """Rollouts on one torch thread, updates on torch's default, where environments step in other processes
    at the same time as this one (``vec_env`` subproc or split): after each forward pass torch's idle threads
    wait spinning, on the core a worker needs. Measured with ``split`` on 2 cores, 65,536-step runs: the PPO
    phase 1.17x and 1.23x ``dummy``'s with this, 0.83x and 0.99x without. One thread costs the forward pass
    on 16 observations about a tenth."""

    def _on_rollout_start(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def _on_rollout_end(self) -> None:
        torch.set_num_threads(self.threads)

    def _on_step(self) -> bool:
        return True


def beats_beyond_noise(efficiencies: np.ndarray, kept: np.ndarray | None) -> bool:
    """Whether a model with ``efficiencies`` (one per held-out episode) replaces the kept model with ``kept``
    (the same episodes; None: nothing kept yet): the 95% bootstrap interval of the per-episode gain lies
    above 0."""
    return kept is None or bootstrap_interval(efficiencies - kept)[0] > 0


class EfficiencyEvalCallback(BaseCallback):
    """Scores the deterministic policy by mean efficiency on the same held-out episodes every time
    (common random numbers, seeds never used in training) and keeps the best model. A later model replaces
    the kept one only where it is better beyond the held-out episodes' noise: the 95% bootstrap interval of
    its per-episode gain lies above 0. A gain inside that noise is a tie, and the tie keeps the earlier model
    (the imitated rule, say) rather than one picked by the episodes' luck.

    Args:
        config: the training run (its evaluation frequency, episode count and environment options).
        out: the run's folder: ``eval/efficiency.json`` and ``best/best_model.zip`` go there.
    """

    def __init__(self, config: TrainConfig, out: Path):
        super().__init__()
        env_kwargs = _env_kwargs(config)
        scenarios = list(env_kwargs.get("scenarios", ("heavy", "bursty", "none")))
        # a run shorter than its evaluation cadence is scored at its end only, on fewer and shorter episodes (in
        # proportion: a 4,096-step trial is not scored for longer than it trained)
        short = config.n_timesteps < config.eval_freq
        episodes = min(config.eval_episodes, max(2, config.n_timesteps // 20_000)) if short else config.eval_episodes
        duration_s = config.eval_duration_s
        if short:
            duration_s = max(duration_s * config.n_timesteps / config.eval_freq, min(duration_s, SHORTEST_SCORING_S))
        stride = max(len(scenarios) // episodes, 1)  # fewer episodes than scenarios: spread, not the first few
        self.episodes = [(scenarios[i * stride % len(scenarios)], HELD_OUT_SEED_BASE + i) for i in range(episodes)]
        self.every_calls = max(config.eval_freq // config.n_envs, 1)
        self.out = out
        # held-out episodes of one length, whatever lengths training draws: the scores of a run are comparable
        self.env = RepartitionEnv(**{**env_kwargs, "duration_s": duration_s, "min_duration_s": None})
        self.best = -np.inf
        self.best_efficiencies: np.ndarray | None = None  # the kept model's, episode by episode
        self.history: list[tuple[int, float]] = []
        self.seconds = 0.0  # spent scoring, wall s (the run's phases.json leaves it out of PPO's steps/s)

    def _on_step(self) -> bool:
        if self.n_calls % self.every_calls == 0:
            self._evaluate()
        return True

    def score(self, model: Any) -> None:
        """Score ``model`` now, outside ``learn`` (the imitated policy, before PPO changes it)."""
        self.init_callback(model)
        self._evaluate()

    def _on_training_end(self) -> None:
        if not self.history or self.history[-1][0] != self.num_timesteps:  # a short run is scored at its end
            self._evaluate()

    def _evaluate(self) -> None:
        start = time.perf_counter()
        config = self.env.config
        policy = PPOPolicy(*actor_of(self.model, config.s_max, config.history, config.d_max))  # as deployed
        efficiencies = np.array([run_episode(self.env, policy, seed, scenario).efficiency
                                 for scenario, seed in self.episodes])
        score = float(efficiencies.mean())
        self.history.append((self.num_timesteps, score))
        if hasattr(self.model, "_logger"):  # a model that has not learned yet has no logger
            self.logger.record("eval/mean_efficiency", score)
        (self.out / "eval").mkdir(parents=True, exist_ok=True)
        (self.out / "eval" / "efficiency.json").write_text(json.dumps(self.history))
        if beats_beyond_noise(efficiencies, self.best_efficiencies):
            self.best, self.best_efficiencies = score, efficiencies
            (self.out / "best").mkdir(parents=True, exist_ok=True)
            self.model.save(self.out / "best" / "best_model.zip")
        self.seconds += time.perf_counter() - start


def train(config: TrainConfig, out_dir: str | Path, progress: bool = True) -> Path:
    """Train MaskablePPO, keep the best model on held-out seeds, export ``policy.pt`` / ``policy.json``.

    Writes under ``out_dir``: ``eval/efficiency.json`` (held-out efficiency every ``eval_freq`` steps and
    at the end), ``best/best_model.zip`` (the best of those), ``checkpoints/`` (every ``checkpoint_freq``
    steps, if the run is that long), ``tb/`` (TensorBoard), ``final_model.zip`` (the last weights, also
    written when interrupted), ``phases.json`` (each phase's wall seconds and steps/s, also written when
    interrupted) and the deploy artifact ``policy.pt`` / ``policy.json`` (from the best).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    revision = _source_revision()  # the code it trains on: taken now, not when a long run ends
    train_env: VecEnv = _make_vec_env(config, config.n_envs, config.seed)
    if config.normalize_reward:
        # Rewards hover near 1.0; scaling returns helps the value function. Observations stay raw
        # (they are scale-free by construction), so deployment applies no statistics.
        train_env = VecNormalize(train_env, norm_obs=False, norm_reward=True, gamma=config.gamma)
    scorer = EfficiencyEvalCallback(config, out)
    # first: the rollouts' thread count is back before any other callback's rollout end (the behaviour anchor's)
    callbacks: list[BaseCallback] = [RolloutThreads()] if config.vec_env != "dummy" else []
    callbacks += [scorer, CheckpointCallback(save_freq=max(config.checkpoint_freq // config.n_envs, 1),
                                             save_path=str(out / "checkpoints"), name_prefix="ppo")]
    hyper = {key: getattr(config, key) for key in PPO_KEYS}
    if isinstance(config.learning_rate, str) and config.learning_rate.startswith("lin_"):  # zoo notation
        initial = float(config.learning_rate[4:])
        hyper["learning_rate"] = lambda progress_remaining: progress_remaining * initial
    # MlpPolicy, the only policy the config takes (validate), with a cheaper rollout forward pass, bit for bit
    model = MaskablePPO(RolloutPolicy, train_env, seed=config.seed, tensorboard_log=str(out / "tb"),
                        policy_kwargs=dict(config.policy_kwargs), verbose=0, **hyper)
    times = PhaseTimes()
    try:
        with without_distribution_checks():
            _learn(model, config, out, progress, callbacks, scorer, times)
    finally:  # an interrupted run keeps what it learned, and says how long each phase took
        model.save(out / "final_model.zip")
        train_env.close()  # the environments' processes end with the run
        checkpoints = out / "checkpoints"
        if checkpoints.is_dir() and not any(checkpoints.iterdir()):  # a run shorter than checkpoint_freq
            checkpoints.rmdir()
        times.write(out / "phases.json")
        if progress:
            print(times.summary(), flush=True)
    best = out / "best" / "best_model.zip"
    if best.exists():
        model = MaskablePPO.load(best, device="cpu")
    s_max, history, d_max = _observation_shape(config)
    calibration = config.env_kwargs.get("calibration")
    export(model, s_max, history, d_max, out, training={
        "config": {**config.__dict__}, "seed": config.seed, "source_revision": revision,
        "selected": "best on held-out seeds" if best.exists() else "final",
        "calibration": asdict(Calibration.load(calibration)) if isinstance(calibration, str) else None})
    return out / "policy.pt"


@contextmanager
def without_distribution_checks() -> Iterator[None]:
    """torch's distributions check their parameters each time one is built, by default: a categorical over
    18 actions for every call of the policy, in every rollout step and every minibatch. The logits come from
    the network and sb3-contrib's mask, so the check finds nothing a sample would not (NaN logits still fail
    in ``torch.multinomial``), while it costs a twentieth of the rollouts' time (measured, rollout by rollout
    in one run). The results are the same bit for bit: the check computes nothing that is used."""
    checking = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(checking)


def _learn(model: Any, config: TrainConfig, out: Path, progress: bool, callbacks: list[BaseCallback],
           scorer: EfficiencyEvalCallback, times: PhaseTimes) -> None:
    """The run's phases in order, training ``model`` in place: imitation (and the critic's warm-up), scoring
    the imitated policy, PPO; each timed in ``times``."""
    if config.imitate:
        with times.phase("imitation"):
            demonstrations = _imitate(model, config, out, progress)
        warmup = imitation_budget(config)[2]
        if warmup:  # the critic learns the imitated actor's values, the actor held still
            with times.phase("critic warm-up", steps=warmup):
                imitation.hold_actor(model.policy, True)
                model.learn(total_timesteps=warmup, progress_bar=progress, tb_log_name="critic",
                            callback=[c for c in callbacks if isinstance(c, RolloutThreads)])
                imitation.hold_actor(model.policy, False)
        with times.phase("scoring the imitated policy"):
            scorer.score(model)  # the imitated policy is a candidate too: PPO's must beat it to replace it
        if config.anchor_batches:
            callbacks.append(imitation.BehaviourAnchor(demonstrations, config.anchor_batches,
                                                       config.anchor_learning_rate, seed=config.seed,
                                                       rare_weight=config.imitation_rare_weight))
    rollout = config.n_steps * config.n_envs  # PPO learns in whole rollouts: the run ends on one
    total = -(-config.n_timesteps // rollout) * rollout
    if progress and total != config.n_timesteps:
        print(f"training {total:,} steps: {config.n_timesteps:,} rounded up to whole rollouts of {rollout:,} "
              f"({config.n_envs} environments x {config.n_steps} steps)", flush=True)
    scored_before = scorer.seconds
    with times.phase("ppo", steps=total) as record:
        try:
            model.learn(total_timesteps=total, callback=callbacks, progress_bar=progress, tb_log_name="ppo")
        finally:
            record["evaluation_seconds"] = scorer.seconds - scored_before


def imitation_budget(config: TrainConfig) -> tuple[int, int, int]:
    """(teacher decisions, decisions per DAgger round, critic warm-up steps) of a run: the configured ones,
    or for a short run its share of the run's steps (so a 4,096-step trial imitates for seconds, not
    minutes)."""
    decisions = max(min(config.imitation_steps, int(config.imitation_share * config.n_timesteps)), 1)
    per_round = min(config.imitation_round_steps,
                    int(config.imitation_round_steps * decisions / max(config.imitation_steps, 1)))
    warmup = min(config.critic_warmup_steps, int(config.imitation_share / 2 * config.n_timesteps))
    # PPO learns in whole rollouts: a warm-up rounds up to them, and one under half a rollout is skipped (a
    # 4,096-step trial's 819 would otherwise cost a whole 4,096-step rollout, as much as the trial's PPO)
    rollout = config.n_steps * config.n_envs
    warmup = -(-warmup // rollout) * rollout if 2 * warmup >= rollout else 0
    return decisions, max(per_round, 1), warmup


def _imitate(model: Any, config: TrainConfig, out: Path, progress: bool) -> imitation.Demonstrations:
    """The actor learns the teacher's decisions, then (DAgger) the teacher's decisions on its own states.
    Returns every decision learned from; the imitated actor is saved as ``imitated/policy.pt``."""
    decisions, per_round, warmup = imitation_budget(config)
    env_kwargs = _env_kwargs(config)
    teacher = imitation.PrivilegedTeacher(str(config.imitate), tuple(config.imitation_best_of),
                                          config.imitation_best_margin)
    if progress:
        print(f"imitation: {decisions:,} decisions of {teacher} ...", flush=True)
    demonstrations = imitation.collect(env_kwargs, teacher, decisions, workers=config.imitation_workers)
    accuracy = imitation.clone(model.policy, demonstrations, epochs=config.imitation_epochs,
                               rare_weight=config.imitation_rare_weight, seed=config.seed)
    for round_ in range(1, config.imitation_rounds + 1):
        if progress:
            print(f"imitation: the actor repeats {accuracy:.1%} of the teacher's moves; DAgger round {round_} of "
                  f"{config.imitation_rounds}: {per_round:,} of its own decisions labelled ...", flush=True)
        own = imitation.collect(env_kwargs, teacher, per_round, learner=model,
                                seed_base=DEMONSTRATION_SEED_BASE + DAGGER_SEED_STRIDE * round_,
                                workers=config.imitation_workers)
        demonstrations = imitation.merge(demonstrations, own)
        accuracy = imitation.clone(model.policy, demonstrations, epochs=max(config.imitation_epochs // 2, 1),
                                   rare_weight=config.imitation_rare_weight, seed=config.seed + round_)
    export(model, *_observation_shape(config), out / "imitated", training={"imitated": str(teacher)})
    if progress:
        critic = f"the critic learns their value ({warmup:,} steps)" if warmup else "no critic warm-up (too short)"
        print(f"imitation: the actor repeats {accuracy:.1%} of the teacher's moves; {critic}", flush=True)
    return demonstrations


def _observation_shape(config: TrainConfig) -> tuple[int, int, int]:
    """(s_max, history, d_max) of the observation the run trains on."""
    kwargs = config.env_kwargs
    return (kwargs.get("s_max", DEFAULT_S_MAX), kwargs.get("history", DEFAULT_HISTORY),
            kwargs.get("d_max", DEFAULT_D_MAX))


def actor_of(model: Any, s_max: int, history: int, d_max: int = DEFAULT_D_MAX,
             training: dict[str, Any] | None = None) -> tuple[Actor, ArtifactMeta]:
    """An SB3 (Maskable)PPO model's actor as a plain :class:`Actor`, with the metadata acting needs."""
    policy = model.policy
    net_arch = policy.net_arch if isinstance(policy.net_arch, list) else policy.net_arch["pi"]
    activation = "relu" if "ReLU" in type(policy.activation_fn()).__name__ else "tanh"
    size = ObservationEncoder.size_for(s_max, history, d_max)
    actor = Actor(size, list(net_arch), ActionLayout(s_max).num_actions, activation)
    linears = [m for m in policy.mlp_extractor.policy_net if hasattr(m, "weight")] + [policy.action_net]
    targets = [m for m in actor.net if hasattr(m, "weight")]
    for source, target in zip(linears, targets, strict=True):
        target.load_state_dict(source.state_dict())
    actor.eval()
    meta = ArtifactMeta(OBSERVATION_VERSION, s_max, history, size, ActionLayout(s_max).num_actions,
                        list(net_arch), activation, training=training or {}, d_max=d_max)
    return actor, meta


def export(model: Any, s_max: int, history: int, d_max: int, out_dir: str | Path,
           training: dict[str, Any] | None = None, stem: str = "policy") -> tuple[Path, Path]:
    """Copy an SB3 (Maskable)PPO model's actor into a plain :class:`Actor` and save the artifact."""
    actor, meta = actor_of(model, s_max, history, d_max, training)
    return save_artifact(actor, meta, out_dir, stem)
