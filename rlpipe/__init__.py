"""rlpipe: a learned controller that repartitions pipeline-parallel training on shared, noisy clusters."""

__version__ = "0.1.0"
