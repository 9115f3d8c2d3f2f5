"""Gymnasium environments. ``import rlpipe`` registers ``rlpipe/Repartition-v0``."""

from rlpipe.envs.repartition import EnvConfig, RepartitionEnv

__all__ = ["EnvConfig", "RepartitionEnv"]
