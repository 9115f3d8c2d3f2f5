"""RolloutPolicy: its rollout forward pass against sb3-contrib's MaskableActorCriticPolicy, the same weights and
the same draws of torch's generator."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy

from rlpipe.agents.rollout_policy import RolloutPolicy


def _policies(net_arch: list[int]) -> tuple[MaskableActorCriticPolicy, RolloutPolicy]:
    observations, actions = gym.spaces.Box(-5.0, 5.0, (40,), np.float32), gym.spaces.Discrete(18)
    policies = []
    for policy_class in (MaskableActorCriticPolicy, RolloutPolicy):
        torch.manual_seed(0)  # the same initial weights
        policies.append(policy_class(observations, actions, lambda _: 1e-4, net_arch=net_arch))
    for a, b in zip(policies[0].state_dict().values(), policies[1].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    return policies[0], policies[1]  # type: ignore[return-value]


@pytest.mark.parametrize("net_arch", [[128, 128], [16]])
def test_rollout_forward_is_sb3_contribs_bit_for_bit(net_arch):
    """Actions, values and log-probabilities equal to the bit, every action drawn from the same generator state,
    masks of every kind (one valid action only, all valid, random), several rows at once and one alone."""
    sb3_policy, rollout_policy = _policies(net_arch)
    rng = np.random.default_rng(1)
    for rows in (16, 1):
        observations = torch.as_tensor(rng.normal(size=(rows, 40)), dtype=torch.float32)
        for masks in (rng.random((rows, 18)) < 0.4, np.ones((rows, 18), dtype=bool), np.eye(18, dtype=bool)[
                rng.integers(18, size=rows)]):
            masks[:, 0] |= masks.sum(axis=1) == 0  # keep is always valid
            with torch.no_grad():
                torch.manual_seed(3)
                expected = [sb3_policy(observations, action_masks=masks) for _ in range(20)]
                torch.manual_seed(3)
                got = [rollout_policy(observations, action_masks=masks) for _ in range(20)]
            for one, other in zip(expected, got, strict=True):
                for a, b in zip(one, other, strict=True):
                    assert a.shape == b.shape and a.dtype == b.dtype
                    assert torch.equal(a, b)
            assert all(masks[np.arange(rows), actions.numpy()].all() for actions, _, _ in got)  # only valid actions


def test_without_masks_or_sampling_it_is_sb3_contribs_own_pass():
    """Deterministic actions and unmasked ones go through sb3-contrib's forward itself."""
    sb3_policy, rollout_policy = _policies([16])
    observations = torch.as_tensor(np.random.default_rng(2).normal(size=(4, 40)), dtype=torch.float32)
    with torch.no_grad():
        for kwargs in ({"deterministic": True}, {}):
            torch.manual_seed(4)
            expected = sb3_policy(observations, **kwargs)
            torch.manual_seed(4)
            for a, b in zip(expected, rollout_policy(observations, **kwargs), strict=True):
                assert torch.equal(a, b)
