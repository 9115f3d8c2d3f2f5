"""Imitation before reinforcement: the PPO actor first learns a teacher's decisions (behaviour
cloning of a heuristic, the threshold rule by default), then its critic learns their value with the
actor held still, and only then does PPO improve on the teacher. Started from scratch, PPO spends most of
a 30-minute budget rediscovering what the ski-rental rule already knows.

The cloning is a plain supervised loop (cross-entropy over the valid actions only); ``imitation``'s BC
does not know MaskablePPO's action masks. Rounds of DAgger then label the clone's own states, and during
PPO a :class:`BehaviourAnchor` keeps the actor near the teacher's decisions.

A teacher can also be privileged (Chen et al. 2019, "Learning by Cheating"): a :class:`PrivilegedTeacher`
labels each episode of one pipeline with whichever of its rules did best on that whole episode, a choice from
its outcome that no causal policy can make; the student sees only the observation, and learns from it when
holding through a slowdown pays and when moving does.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback
from torch import nn

from rlpipe.agents import make_policy
from rlpipe.decision import DecisionContext
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import RepartitionEnv
from rlpipe.observation import KEEP
from rlpipe.seeds import DEMONSTRATION_SEED_BASE

LOOKAHEAD = 16  # episodes per labelling worker started ahead of the one whose decisions are taken next


@dataclass
class Demonstrations:
    """A teacher's decisions: observations, their action masks and the actions taken."""

    observations: np.ndarray
    masks: np.ndarray
    actions: np.ndarray

    def __len__(self) -> int:
        return len(self.actions)


@dataclass(frozen=True)
class PrivilegedTeacher:
    """A teacher that labels an episode of one pipeline with whichever of ``rule`` and ``alternatives`` did
    best on that whole episode (mean efficiency; an alternative only where it beat ``rule`` by more than
    ``margin``, and the earlier of alternatives that tie), and a replicated job's episode with ``rule``: labels
    that switched between layers-only rules and micro-batches-first ones from episode to episode, on replicated
    states that look alike, left a clone that did neither well (up to 0.0074 under falcon;
    docs/experiments/episode_best_teacher.py).

    Args:
        rule: the teacher (a rule's name, as :func:`~rlpipe.agents.make_policy` takes it).
        alternatives: rules that may label an episode of one pipeline instead.
        margin: the efficiency (0-1) by which an alternative must beat ``rule`` on the episode.
    """

    rule: str
    alternatives: tuple[str, ...] = ()
    margin: float = 0.0

    def for_episode(self, env: RepartitionEnv, seed: int) -> str:
        """The rule that labels the episode of ``seed`` (each rule run through it once, one pipeline only)."""
        if not self.alternatives:
            return self.rule
        env.reset(seed=seed)
        if env.situation.replicas > 1:
            return self.rule
        # a rule that does what another did scores within rounding of it
        bar = run_episode(env, make_policy(self.rule), seed, None).efficiency + self.margin + 1e-9
        best = self.rule
        for rule in self.alternatives:
            efficiency = run_episode(env, make_policy(rule), seed, None).efficiency
            if efficiency > bar:
                best, bar = rule, efficiency + 1e-9
        return best

    def __str__(self) -> str:
        if not self.alternatives:
            return self.rule
        margin = f" by more than {self.margin:g}" if self.margin else ""
        return (f"{self.rule}, or on an episode of one pipeline the best of {', '.join(self.alternatives)} where "
                f"it beat {self.rule}{margin}")


Teacher = str | PrivilegedTeacher  # a rule's name, or a rule that may hand an episode to another


def collect(env_kwargs: dict[str, Any], teacher: Teacher, steps: int, learner: Any = None,
            seed_base: int = DEMONSTRATION_SEED_BASE, workers: int = 1) -> Demonstrations:
    """Label ``steps`` decisions with ``teacher``'s, in episodes drawn as training draws them (seeds of
    their own, from ``seed_base``).

    Without ``learner`` the teacher's decisions drive the episodes (behaviour cloning). With one (an SB3
    policy), the learner's deterministic decisions drive them and the teacher labels the states the learner
    reaches (DAgger, Ross et al. 2011: a clone's small mistakes lead it to states the teacher never shows,
    where it then errs more); the rules' counts follow the job that runs, so a label is what the teacher
    would do in the learner's place.

    A :class:`PrivilegedTeacher` labels each episode with the rule it picks for it.

    ``workers`` > 1 runs episodes in that many forked processes (a clairvoyant teacher labels ~300
    decisions a second, a rule ~1,000); the decisions are the same as one process's, in seed order."""
    parts: list[Demonstrations] = []
    total = 0
    episodes = _episodes(env_kwargs, teacher, learner, seed_base, workers, steps)
    for part in episodes:
        parts.append(part)
        total += len(part)
        if total >= steps:
            break
    episodes.close()  # stops the worker processes, if any
    merged = merge(*parts)
    return Demonstrations(merged.observations[:steps], merged.masks[:steps], merged.actions[:steps])


def _episodes(env_kwargs: dict[str, Any], teacher: Teacher, learner: Any, seed_base: int, workers: int,
              steps: int) -> Generator[Demonstrations, None, None]:
    """Every labelled episode from ``seed_base`` on, in seed order, none longer than the ``steps`` decisions
    wanted (one process: than the decisions still wanted)."""
    if workers <= 1:
        for episode in itertools.count():
            labelled = _episode(env_kwargs, teacher, learner, seed_base + episode, steps)
            steps -= len(labelled)
            yield labelled
        return
    # a child forked while torch's OpenMP threads are up (after a cloning's matrix products) hangs in its first
    # parallel operation: fork from one thread; the labelling here only waits on the workers
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # forked workers inherit what they label with (a learner need not pickle); a task is only its seed
        with multiprocessing.get_context("fork").Pool(workers, initializer=_hold_work,
                                                      initargs=((env_kwargs, teacher, learner),)) as pool:
            seeds = itertools.count(seed_base)
            # episodes run from 4 to 10,000+ decisions: the workers run ahead of the oldest while it finishes
            pending = collections.deque(pool.apply_async(_episode_of_seed, (next(seeds), steps))
                                        for _ in range(LOOKAHEAD * workers))
            while True:
                labelled = pending.popleft().get()
                pending.append(pool.apply_async(_episode_of_seed, (next(seeds), steps)))
                yield labelled
    finally:
        torch.set_num_threads(threads)


_work: tuple[dict[str, Any], Teacher, Any] | None = None  # a labelling worker's options, teacher and learner


def _hold_work(work: tuple[dict[str, Any], Teacher, Any]) -> None:
    global _work
    _work = work


def _episode_of_seed(seed: int, limit: int) -> Demonstrations:
    assert _work is not None  # set as the worker started
    return _episode(*_work, seed, limit)


def _episode(env_kwargs: dict[str, Any], teacher: Teacher, learner: Any, seed: int, limit: int) -> Demonstrations:
    """One episode of ``seed`` (its first ``limit`` decisions), every decision labelled with ``teacher``'s
    (see :func:`collect`)."""
    env = RepartitionEnv(**env_kwargs)
    policy = make_policy(teacher.for_episode(env, seed) if isinstance(teacher, PrivilegedTeacher) else teacher)
    observations: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    actions: list[int] = []
    observation, _ = env.reset(seed=seed)
    policy.reset()
    done = False
    while not done and len(actions) < limit:
        mask = env.action_masks()
        # the future: a clairvoyant teacher (hindsight, oracle) reads it; the rules do not
        context = DecisionContext(env.encoder, env.boundaries, env.future(), env.split)
        action = int(policy.act(observation, mask, context))  # type: ignore[arg-type]
        observations.append(observation)
        masks.append(mask)
        actions.append(action)
        if learner is not None:
            action = learner_action(learner, observation, mask)
        observation, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    return Demonstrations(np.array(observations, dtype=np.float32), np.array(masks), np.array(actions))


def merge(*sets: Demonstrations) -> Demonstrations:
    """Every set of decisions in one, in order (DAgger's aggregate; a collection's episodes)."""
    return Demonstrations(np.concatenate([d.observations for d in sets]), np.concatenate([d.masks for d in sets]),
                          np.concatenate([d.actions for d in sets]))


def actor_logits(policy: Any, observations: torch.Tensor) -> torch.Tensor:
    """An SB3 actor-critic policy's action logits (before masking)."""
    latent = policy.mlp_extractor.forward_actor(policy.extract_features(observations, policy.pi_features_extractor))
    return policy.action_net(latent)


def actor_parameters(policy: Any) -> list[torch.nn.Parameter]:
    """The weights of an SB3 actor-critic policy's actor (its action head and the layers before it)."""
    return [*policy.mlp_extractor.policy_net.parameters(), *policy.action_net.parameters()]


class CloningLoss:
    """Cross-entropy of the actor's masked logits against the teacher's actions, actions other than keep
    weighted ``rare_weight`` times (keep is most decisions)."""

    def __init__(self, demonstrations: Demonstrations, rare_weight: float = 5.0):
        self.observations = torch.as_tensor(demonstrations.observations)
        self.masks = torch.as_tensor(demonstrations.masks, dtype=torch.bool)
        self.actions = torch.as_tensor(demonstrations.actions, dtype=torch.long)
        weights = torch.ones(self.masks.shape[1])
        weights[KEEP + 1:] = rare_weight
        self._loss = nn.CrossEntropyLoss(weight=weights)

    def __len__(self) -> int:
        return len(self.actions)

    def __call__(self, policy: Any, batch: torch.Tensor) -> torch.Tensor:
        logits = actor_logits(policy, self.observations[batch]).masked_fill(~self.masks[batch], -1e9)
        return self._loss(logits, self.actions[batch])

    def accuracy(self, policy: Any) -> float:
        """The share of the teacher's non-keep decisions the actor repeats."""
        with torch.no_grad():
            predicted = actor_logits(policy, self.observations).masked_fill(~self.masks, -1e9).argmax(dim=1)
        rare = self.actions != KEEP
        return float((predicted[rare] == self.actions[rare]).float().mean()) if rare.any() else 1.0


def learner_action(learner: Any, observation: np.ndarray, mask: np.ndarray) -> int:
    """A MaskablePPO learner's deterministic decision, as its ``predict(observation, action_masks=mask,
    deterministic=True)`` makes it (the most likely valid action), from its actor alone: ``predict`` also
    runs the critic and SB3's checks, about 1.7 ms a decision, 4x what the teacher's decision and the
    environment's step cost together in DAgger's labelling."""
    with torch.no_grad():
        logits = actor_logits(learner.policy, torch.as_tensor(observation, dtype=torch.float32)[None])[0]
    return int(logits.masked_fill(~torch.as_tensor(mask, dtype=torch.bool), -torch.inf).argmax())


def clone(policy: Any, demonstrations: Demonstrations, epochs: int = 8, batch_size: int = 1024,
          learning_rate: float = 1e-3, rare_weight: float = 5.0, seed: int = 0) -> float:
    """Fit the policy's actor to the demonstrations (:class:`CloningLoss`); returns the accuracy on the
    teacher's non-keep decisions."""
    loss = CloningLoss(demonstrations, rare_weight)
    optimizer = torch.optim.Adam(actor_parameters(policy), lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(loss), generator=generator)
        for start in range(0, len(order), batch_size):
            optimizer.zero_grad()
            loss(policy, order[start:start + batch_size]).backward()
            optimizer.step()
    return loss.accuracy(policy)


class BehaviourAnchor(BaseCallback):
    """Keeps PPO near the teacher it started from: after every rollout, before PPO's update, a few
    minibatches of the cloning loss on the teacher's decisions. PPO's clipped steps then refine the
    imitated rule where its returns say so, rather than drift from it everywhere at once.

    Args:
        demonstrations: the teacher's decisions (the imitation phase's aggregate).
        batches: minibatches of the cloning loss per rollout.
        learning_rate: the cloning steps' learning rate.
        batch_size: decisions per minibatch.
        rare_weight: the cloning loss's weight of the teacher's moves (:class:`CloningLoss`).
    """

    def __init__(self, demonstrations: Demonstrations, batches: int, learning_rate: float = 1e-4,
                 batch_size: int = 1024, seed: int = 0, rare_weight: float = 5.0):
        super().__init__()
        self.loss = CloningLoss(demonstrations, rare_weight)
        self.batches, self.learning_rate, self.batch_size = batches, learning_rate, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer: torch.optim.Optimizer | None = None

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        policy = self.model.policy
        if self.optimizer is None:
            self.optimizer = torch.optim.Adam(actor_parameters(policy), lr=self.learning_rate)
        for _ in range(self.batches):
            batch = torch.randint(len(self.loss), (self.batch_size,), generator=self.generator)
            self.optimizer.zero_grad()
            self.loss(policy, batch).backward()
            self.optimizer.step()


def hold_actor(policy: Any, held: bool) -> None:
    """Hold the actor still (the critic alone learns) or let it learn again."""
    for parameter in actor_parameters(policy):
        parameter.requires_grad_(not held)
