"""Seed salts: the one place that says how derived random streams are told apart.

Each stream mixes a user's seed with its own large prime, so that two streams never draw the same
numbers by accident (an episode seed never equals a data seed, the held-out evaluation episodes never
meet a training episode).
"""

EPISODE_SEED_STRIDE = 100_003
"""``rlpipe evaluate``: episode e of seed s is seeded ``s * EPISODE_SEED_STRIDE + e``."""

HELD_OUT_SEED_BASE = 50_000_017
"""Training's held-out evaluation episodes are seeded from here on: far above any training seed."""

DATA_SEED_STRIDE = 1_000_003
"""Live synthetic data: batch b of seed s is generated from ``s * DATA_SEED_STRIDE + b``."""

TARGET_SEED_OFFSET = 7919
"""Live synthetic targets use the data seed plus this, so inputs and targets are independent."""

LAYER_SEED_STRIDE = 10_007
"""A layer built from structure alone (the meta device) is initialised from ``seed * LAYER_SEED_STRIDE
+ its index``: whichever rank builds it gets the same values."""

DEMONSTRATION_SEED_BASE = 70_000_003
"""A teacher's demonstrations (training's imitation phase) come from episodes seeded from here on."""

DAGGER_SEED_STRIDE = 50_000
"""DAgger round r of the imitation phase labels episodes seeded from ``DEMONSTRATION_SEED_BASE + r *
DAGGER_SEED_STRIDE`` on (the first collection uses far fewer episodes)."""
