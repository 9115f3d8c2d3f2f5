"""ShardedVecEnv (vec_env subproc and split): real worker processes stepping real environments, against DummyVecEnv."""

import numpy as np
import pytest
from stable_baselines3.common.monitor import Monitor

from rlpipe.agents.ppo import TrainConfig, _make_vec_env
from rlpipe.agents.vec_env import ShardedVecEnv
from rlpipe.envs import RepartitionEnv


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "workers", "processes"), [
    ("subproc", None, 3),  # a process per environment
    ("subproc", 2, 2),  # two shards of 2 and 1
    ("split", None, 1),  # two shards: 1 here (it also runs the policy), 2 in another process
    ("split", 3, 2),  # one here, one in each of two others
])
def test_environments_in_other_processes_step_as_in_one(kind, workers, processes):
    """vec_env subproc and split change where the environments run, not what they do: the same seeds and actions
    give the same masks, observations, rewards (float32 both ways), episode ends and reset infos as stepping them
    all in turn here."""
    rng = np.random.default_rng(0)
    configs = [TrainConfig(n_envs=3, vec_env=vec_env, vec_workers=workers,
                           env_kwargs={"duration_s": 60.0, "data_parallel": (1, 2)}) for vec_env in ("dummy", kind)]
    in_turn, in_processes = (_make_vec_env(config, config.n_envs, seed=7) for config in configs)
    try:
        assert len(in_processes.processes) == processes
        np.testing.assert_array_equal(in_turn.reset(), in_processes.reset())
        ends = 0
        for _ in range(120):
            masks = np.stack(in_turn.env_method("action_masks"))
            np.testing.assert_array_equal(masks, np.stack(in_processes.env_method("action_masks")))
            actions = np.array([rng.choice(np.flatnonzero(mask)) for mask in masks])
            *one, one_infos = in_turn.step(actions)
            *other, other_infos = in_processes.step(actions)
            for a, b in zip(one, other, strict=True):
                np.testing.assert_array_equal(a, b)
                assert a.dtype == b.dtype  # reward normalisation sees the same numbers
            assert [i.get("efficiency") for i in one_infos] == [i.get("efficiency") for i in other_infos]
            for i, j in zip(one_infos, other_infos, strict=True):  # an ended episode's last observation
                np.testing.assert_array_equal(i.get("terminal_observation", 0), j.get("terminal_observation", 0))
            # what each environment's last reset returned (sent only where one reset: kept as before elsewhere)
            np.testing.assert_equal(in_processes.reset_infos, in_turn.reset_infos)
            ends += int(one[2].sum())
        assert ends >= 3  # episodes ended and restarted alike
        indices = [2, 0, 1]  # answers come in the order asked, across the shards
        assert in_processes.get_attr("repartitions", indices) == in_turn.get_attr("repartitions", indices)
        in_processes.set_attr("repartitions", -1, indices=[1])
        assert in_processes.get_attr("repartitions") == [in_turn.get_attr("repartitions")[0], -1,
                                                         in_turn.get_attr("repartitions")[2]]
        assert in_processes.env_is_wrapped(Monitor) == [True] * 3
        assert in_processes.has_attr("action_masks") and not in_processes.has_attr("no_such_attribute")
    finally:
        in_turn.close()
        in_processes.close()
    assert not any(process.is_alive() for process in in_processes.processes)


def test_the_shard_here_holds_one_environment_fewer():
    """With step_here this process also runs the policy while the workers take their next steps ahead: its shard
    holds one environment fewer than an even share unless ``here`` says otherwise, and every shard at least one."""
    makers = [lambda: RepartitionEnv(duration_s=60.0)] * 6
    for here, shards in [(None, [range(0, 2), range(2, 6)]), (4, [range(0, 4), range(4, 6)])]:
        envs = ShardedVecEnv(makers, workers=2, step_here=True, here=here)
        try:
            assert envs.shards == shards and len(envs.processes) == 1
        finally:
            envs.close()
    with pytest.raises(ValueError, match="here must be 1 to 5"):
        ShardedVecEnv(makers, workers=2, step_here=True, here=6)
