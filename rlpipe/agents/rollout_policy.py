"""RolloutPolicy: sb3-contrib's masked actor-critic policy, its rollout forward pass without the wrappers.

Every rollout step of PPO runs the policy once on the 16 environments' observations. sb3-contrib builds that pass
from modules and distribution objects: a masked categorical is built twice (once from the logits, again after
masking) and each step goes through ``nn.Module.__call__``. On 16 observations of the shipped 128-wide network
this wrapping costs more than the arithmetic (measured on 2 cores, one torch thread: 0.50 ms a pass, of which
0.22 ms the distribution's objects). :meth:`RolloutPolicy.forward` runs the same tensor operations in the same
order, so its actions (the same draws of torch's generator), values and log-probabilities are sb3-contrib's bit
for bit (``tests/agents/test_rollout_policy.py``); anything else (the updates, ``predict``, deterministic
actions) is sb3-contrib's own code.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sb3_contrib.common.maskable.distributions import MaskableCategoricalDistribution
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy

__all__ = ["RolloutPolicy"]

MASKED_LOGIT = -1e8  # what sb3-contrib's MaskableCategorical puts in place of a masked action's logit


class RolloutPolicy(MaskableActorCriticPolicy):
    """``MlpPolicy`` of MaskablePPO, with a cheaper sampling forward pass (see the module docstring)."""

    def forward(self, obs: torch.Tensor, deterministic: bool = False,
                action_masks: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if (deterministic or action_masks is None or not self.share_features_extractor
                or not isinstance(self.action_dist, MaskableCategoricalDistribution)):
            return super().forward(obs, deterministic, action_masks)
        features = self.extract_features(obs)
        assert isinstance(features, torch.Tensor)  # one features extractor, shared (checked above)
        latent_pi = latent_vf = features
        for layer in self.mlp_extractor.policy_net:  # Linear and activation modules: their forward, unwrapped
            latent_pi = layer.forward(latent_pi)
        for layer in self.mlp_extractor.value_net:
            latent_vf = layer.forward(latent_vf)
        values = self.value_net.forward(latent_vf)
        logits = self.action_net.forward(latent_pi).view(-1, self.action_dist.action_dim)
        # MaskableCategorical's steps: normalise the logits, mask them, normalise again (torch's Categorical)
        logits = logits - logits.logsumexp(dim=-1, keepdim=True)
        masks = torch.as_tensor(action_masks, dtype=torch.bool, device=logits.device).reshape(logits.shape)
        logits = torch.where(masks, logits, torch.tensor(MASKED_LOGIT, dtype=logits.dtype, device=logits.device))
        logits = logits - logits.logsumexp(dim=-1, keepdim=True)
        # Categorical.sample and log_prob: one draw a row from the softmax, and its normalised logit
        actions = torch.multinomial(F.softmax(logits, dim=-1), 1, True).T.reshape(-1)
        log_prob = logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        return actions.reshape((-1, *self.action_space.shape)), values, log_prob  # type: ignore[misc]
