"""A confidence gate on the shipped policy: keep unless the actor's probability for its move reaches P (issue
#19, 2026-12-04; not part of the package, not tested).

`clone_divergence.py` found the policy less sure of the moves `falcon` would not make (median 0.74 against 0.996
on seqlen at 2 replicas). This asks whether keeping below P holds on noise without losing lasting slowdowns.
Same ten episodes per preset as the README's table (seed 4242); P = 0 reproduces the table's ppo figures.

Run from the repository root: `.venv/bin/python docs/experiments/confidence_gate.py 4x2[,4x4,...] 0,0.8,0.9`
(about 20 s per preset and gate at 4 stages).

Results (2026-12-04, layouts 4 x 2 and 4 x 4; efficiency, repartitions an hour; the best rule from the table):

| preset | layout | best rule | P = 0 (shipped) | P = 0.8 | P = 0.9 |
|---|---|---|---|---|---|
| seqlen | 4 x 2 | static 0.9368 | 0.9360, 8.8/h | 0.9361, 8.0/h | 0.9363, 4.3/h |
| seqlen | 4 x 4 | falcon 0.8758 | 0.8747, 10.7/h | 0.8752, 4.8/h | 0.8755, 2.1/h |
| heavy | 4 x 2 | falcon 0.9595 | 0.9589 | 0.9565 (-0.0030) | 0.9540 (-0.0055) |
| heavy | 4 x 4 | falcon 0.9282 | 0.9265 | 0.9254 (-0.0028) | 0.9254 (-0.0028) |
| mixed | 4 x 2 | falcon 0.9103 | 0.9106 | 0.9068 (-0.0035) | 0.9080 (-0.0023) |
| mixed | 4 x 4 | falcon 0.8313 | 0.8303 | 0.8304 (-0.0009) | 0.8279 (-0.0034) |
| drift | 4 x 2 | falcon 0.9905 | 0.9888 | 0.9909 | 0.9910 |
| persistent | 4 x 4 | falcon 0.9846 | 0.9854 | 0.9850 | 0.9832 (-0.0014) |

Other presets moved by at most 0.0012. The gate trades one bar for another: it halves or quarters the
repartitions on seqlen and still leaves 2-8 an hour, and it delays moves at the onset of lasting slowdowns
enough to fall more than 0.003 under `falcon` on heavy or mixed. Not adopted: the clone's uncertainty is not a
clean signal of its teacher's "keep".
"""

import json
import sys
import time

import numpy as np
import torch
from clone_divergence import chosen_probability  # beside this script (run from the repository root)

from rlpipe.agents import make_policy
from rlpipe.decision import DecisionContext
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.observation import KEEP
from rlpipe.seeds import EPISODE_SEED_STRIDE

EPISODES, SEED = 10, 4242
PRESETS = ["none", "light", "heavy", "bursty", "drift", "periodic", "jitter", "persistent", "seqlen", "network",
           "mixed"]


class GatedPolicy:
    """The shipped policy, keeping unless its move's probability among the valid actions reaches ``gate``."""

    live = False

    def __init__(self, gate: float):
        self.inner, self.gate, self.name = make_policy("ppo"), gate, f"ppo gated at {gate}"

    def reset(self) -> None:
        self.inner.reset()

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> int:
        action = self.inner.act(observation, mask, context)
        if action == KEEP or self.gate <= 0 or not mask[KEEP]:
            return action
        return action if chosen_probability(self.inner, observation, mask, action) >= self.gate else KEEP


def main(layouts: list[str], gates: list[float]) -> None:
    torch.set_num_threads(1)
    figures = {}
    for layout in layouts:
        stages, replicas = map(int, layout.split("x"))
        config = EnvConfig(min_stages=stages, max_stages=stages, s_max=8, data_parallel=(replicas, replicas), d_max=8)
        seeds = [SEED * EPISODE_SEED_STRIDE + k for k in range(EPISODES)]
        for preset in PRESETS:
            for gate in gates:
                started = time.time()
                runs = [run_episode(RepartitionEnv(config), GatedPolicy(gate), seed, preset) for seed in seeds]
                efficiency = float(np.mean([r.efficiency for r in runs]))
                per_hour = float(np.mean([r.repartitions_per_hour for r in runs]))
                figures[f"{layout} {preset} {gate}"] = {"efficiency": efficiency, "repartitions_per_hour": per_hour}
                print(f"{layout} {preset:10s} gate {gate}: {efficiency:.4f}, {per_hour:.1f} repartitions/h "
                      f"({time.time() - started:.0f} s)", flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: confidence_gate.py LAYOUTS GATES (e.g. 4x2,4x4 0,0.8,0.9)")
    main(sys.argv[1].split(","), [float(g) for g in sys.argv[2].split(",")])
