"""rlpipe: a learned controller that repartitions pipeline-parallel training on shared, noisy clusters."""

import gymnasium

__version__ = "0.1.0"
ENV_ID = "rlpipe/Repartition-v0"  # the environment's gymnasium id, and its block in configs/ppo.yml

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="rlpipe.envs.repartition:RepartitionEnv")
