"""The deployed PPO policy: the exported actor behind the Policy protocol, with a heuristic fallback.

Needs only torch (never stable-baselines3), so the live runtime can load it. Falls back to a
heuristic (dynpipe by default) whenever the input does not fit the actor, counting and logging
every fallback by reason.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

import numpy as np

from rlpipe.agents.artifact import Actor, ArtifactMeta, load_artifact
from rlpipe.agents.heuristics import DynPipePolicy
from rlpipe.decision import DecisionContext, Policy, PolicyBase
from rlpipe.errors import InputError
from rlpipe.observation import KEEP

log = logging.getLogger("rlpipe.ppo")


class PPOPolicy(PolicyBase):
    """The deployed PPO actor with a heuristic fallback.

    Falls back (and counts why) when the artifact did not load, when the pipeline has more stages
    than the artifact's ``s_max`` (or more replicas than its ``d_max``), when the observation does not
    match its layout, or when the
    observation holds non-finite values.

    Args:
        actor: the exported network (``None``: the artifact did not load).
        meta: its ``policy.json`` (``None`` likewise).
        fallback: the policy that decides when the actor cannot (default: dynpipe).
        load_error: why the artifact did not load, for the fallback's reason.
        name: what logs and tables call it.
    """

    def __init__(self, actor: Actor | None, meta: ArtifactMeta | None, fallback: Policy | None = None,
                 load_error: str | None = None, name: str = "ppo"):
        super().__init__()
        self.actor, self.meta = actor, meta
        self.fallback = fallback or DynPipePolicy()
        self.load_error = load_error
        self.name = name
        self.observation_layout = None if meta is None else (meta.s_max, meta.history, meta.d_max)

    def reset(self) -> None:
        self.fallback.reset()

    def _unfit(self, observation: np.ndarray | None, context: DecisionContext) -> str | None:
        if self.actor is None or self.meta is None:
            return f"artifact unavailable ({self.load_error})"
        if context.encoder.planner.num_stages > self.meta.s_max:
            return f"{context.encoder.planner.num_stages} stages exceed the artifact's s_max {self.meta.s_max}"
        if context.encoder.planner.replicas > self.meta.d_max:
            return f"{context.encoder.planner.replicas} replicas exceed the artifact's d_max {self.meta.d_max}"
        if observation is None or np.shape(observation) != (self.meta.observation_size,):
            return "observation missing or of another layout"
        if not np.all(np.isfinite(observation)):
            return "non-finite statistics"
        return None

    def act(self, observation: np.ndarray | None, mask: np.ndarray, context: DecisionContext) -> int:
        reason = self._unfit(observation, context)
        self.last_fallback = reason
        if reason is None:
            assert self.actor is not None and observation is not None  # _unfit checked both
            return self.actor.act(observation, mask)
        self.fallbacks[reason] += 1
        log.warning("ppo falls back to %s: %s", self.fallback.name, reason)
        try:
            decision = self.fallback.act(observation, mask, context)  # type: ignore[arg-type]
        except Exception as err:  # the fallback itself cannot read this input: hold still
            log.warning("fallback %s failed (%s): keeping the partition", self.fallback.name, err)
            return KEEP
        return int(decision)  # type: ignore[arg-type]  # a live fallback returns an action index


def default_artifact_path() -> Path:
    """The shipped default policy's weights, ``rlpipe/policies/default.pt``."""
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
