"""Gymnasium environments. ``import rlpipe`` registers ``rlpipe/Repartition-v0``."""

from rlpipe.envs.repartition import RepartitionEnv
from rlpipe.envs.situation import EnvConfig

__all__ = ["EnvConfig", "RepartitionEnv"]
