"""Imitation before reinforcement: the PPO actor first learns a teacher's decisions (behaviour
cloning of a heuristic, the threshold rule by default), then its critic learns their value with the
actor held still, and only then does PPO improve on the teacher. Started from scratch, PPO spends most of
a 30-minute budget rediscovering what the ski-rental rule already knows.

The cloning is a plain supervised loop (cross-entropy over the valid actions only); ``imitation``'s BC
does not know MaskablePPO's action masks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlpipe.agents import make_policy
from rlpipe.decision import DecisionContext
from rlpipe.envs.repartition import RepartitionEnv
from rlpipe.observation import KEEP
from rlpipe.seeds import DEMONSTRATION_SEED_BASE


@dataclass
class Demonstrations:
    """A teacher's decisions: observations, their action masks and the actions taken."""

    observations: np.ndarray
    masks: np.ndarray
    actions: np.ndarray

    def __len__(self) -> int:
        return len(self.actions)


def collect(env_kwargs: dict[str, Any], teacher: str, steps: int) -> Demonstrations:
    """Run ``teacher`` through episodes drawn as training draws them (seeds of their own) for ``steps``
    decisions."""
    env, policy = RepartitionEnv(**env_kwargs), make_policy(teacher)
    observations: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    actions: list[int] = []
    episode = 0
    while len(actions) < steps:
        observation, _ = env.reset(seed=DEMONSTRATION_SEED_BASE + episode)
        policy.reset()
        episode += 1
        done = False
        while not done and len(actions) < steps:
            mask = env.action_masks()
            context = DecisionContext(env.encoder, env.boundaries, split=env.split)
            action = int(policy.act(observation, mask, context))  # type: ignore[arg-type]
            observations.append(observation)
            masks.append(mask)
            actions.append(action)
            observation, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    return Demonstrations(np.array(observations, dtype=np.float32), np.array(masks), np.array(actions))


def actor_logits(policy: Any, observations: torch.Tensor) -> torch.Tensor:
    """An SB3 actor-critic policy's action logits (before masking)."""
    latent = policy.mlp_extractor.forward_actor(policy.extract_features(observations, policy.pi_features_extractor))
    return policy.action_net(latent)


def clone(policy: Any, demonstrations: Demonstrations, epochs: int = 8, batch_size: int = 1024,
          learning_rate: float = 1e-3, rare_weight: float = 5.0, seed: int = 0) -> float:
    """Fit the policy's actor to the demonstrations (cross-entropy over the valid actions, actions other
    than keep weighted ``rare_weight`` times, since keep is most decisions); returns the accuracy on
    the teacher's non-keep decisions."""
    observations = torch.as_tensor(demonstrations.observations)
    masks = torch.as_tensor(demonstrations.masks, dtype=torch.bool)
    actions = torch.as_tensor(demonstrations.actions, dtype=torch.long)
    parameters = [*policy.mlp_extractor.policy_net.parameters(), *policy.action_net.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=learning_rate)
    weights = torch.ones(masks.shape[1])
    weights[KEEP + 1:] = rare_weight
    loss_fn = nn.CrossEntropyLoss(weight=weights)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(actions), generator=generator)
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            logits = actor_logits(policy, observations[batch]).masked_fill(~masks[batch], -1e9)
            loss = loss_fn(logits, actions[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        predicted = actor_logits(policy, observations).masked_fill(~masks, -1e9).argmax(dim=1)
    rare = actions != KEEP
    return float((predicted[rare] == actions[rare]).float().mean()) if rare.any() else 1.0


def hold_actor(policy: Any, held: bool) -> None:
    """Hold the actor still (the critic alone learns) or let it learn again."""
    for parameter in [*policy.mlp_extractor.policy_net.parameters(), *policy.action_net.parameters()]:
        parameter.requires_grad_(not held)
