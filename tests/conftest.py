import os
import sys
import tempfile
from pathlib import Path

import pytest

from rlpipe.profile import LayerCost, LayerProfile

# tests/ holds a user-model package (user_models.py) that CLI tests import as pkg.module:factory.
sys.path.insert(0, str(Path(__file__).parent))
# the profiles runs measure are kept (rlpipe/runtime/profiles.py): the suite keeps its own, so that no test
# depends on what an earlier session, or another test file, left in the user's cache
os.environ.setdefault("RLPIPE_CACHE_DIR", tempfile.mkdtemp(prefix="rlpipe-test-cache-"))


def make_profile(compute_ms, activation_bytes=None, state_bytes=None, name="synthetic") -> LayerProfile:
    """A profile with the given per-layer compute (split 1:2 forward:backward)."""
    n = len(compute_ms)
    activation_bytes = activation_bytes if activation_bytes is not None else [1000] * n
    state_bytes = state_bytes if state_bytes is not None else [3000] * n
    layers = tuple(LayerCost(f"{i}:Layer", c / 3, 2 * c / 3, int(a), int(s) // 3, 2 * (int(s) // 3))
                   for i, (c, a, s) in enumerate(zip(compute_ms, activation_bytes, state_bytes)))
    return LayerProfile(name, 4, layers)


@pytest.fixture
def uniform_profile() -> LayerProfile:
    return make_profile([3.0] * 12)
