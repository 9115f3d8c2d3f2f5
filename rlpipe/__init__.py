"""rlpipe: a learned controller that repartitions pipeline-parallel training on shared, noisy clusters."""

import gymnasium

__version__ = "0.1.0"

if "rlpipe/Repartition-v0" not in gymnasium.registry:
    gymnasium.register(id="rlpipe/Repartition-v0", entry_point="rlpipe.envs.repartition:RepartitionEnv")
