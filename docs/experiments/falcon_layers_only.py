"""Does falcon lose mixed at 2 replicas to threshold (0.9104 against 0.9137) because its re-split also
rebalances micro-batches? (issue #19, 2026-12-03; not part of the package, not tested.) On those three
episodes falcon stalls 8.6, 13.1 and 13.2 s an hour against threshold's 5.1, 8.8 and 9.1, and in the first it
departs from threshold at a re-split with a new split where threshold holds (docs/experiments/
episode_best_teacher.py). This variant's re-split moves layers only, by the layers-only re-plan's ski-rental
count, keeping whatever split the rebalance made. Rules only, on the README table's episodes (seed 4242, 3 each).

Run from the repository root: `RLPIPE_CACHE_DIR=/tmp/cache .venv/bin/python docs/experiments/falcon_layers_only.py 2 4`
(about 2 minutes).

Results (2026-12-03, 12:12-12:15), efficiency at 4 stages:

| preset | 4 x 2: threshold | falcon | variant | 4 x 4: threshold | falcon | variant |
|---|---|---|---|---|---|---|
| heavy | 0.9559 | 0.9633 | 0.9582 | 0.8647 | 0.9320 | 0.8886 |
| drift | 0.9872 | 0.9907 | 0.9873 | 0.9454 | 0.9863 | 0.9871 |
| periodic | 0.9430 | 0.9589 | 0.9459 | 0.9043 | 0.9433 | 0.9236 |
| persistent | 0.9882 | 0.9881 | 0.9882 | 0.9663 | 0.9935 | 0.9666 |
| bursty | 0.9757 | 0.9741 | 0.9744 | 0.9526 | 0.9535 | 0.9519 |
| mixed | 0.9137 | 0.9104 | 0.9083 | 0.7971 | 0.8297 | 0.7879 |
| mean of the 11 presets | 0.9712 | 0.9732 | 0.9711 | 0.9333 | 0.9523 | 0.9402 |

(none, jitter and seqlen: all three equal; light and network within 0.0007.) The layers-only re-split loses
to falcon almost everywhere (heavy at 4 replicas -0.043, mixed -0.042) and does not win mixed at 2 replicas
either (-0.0021 under falcon): moving the split with the layers is right, and falcon's shortfall there is not
that. Left for a later study: when a rebalance pays in mixed, where the slowed devices change often.
"""

import sys
from dataclasses import dataclass

import numpy as np

from rlpipe.agents import make_policy
from rlpipe.agents.heuristics import FalconPolicy, restart_on_change, ski_rental_fires
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.observation import KEEP, REBALANCE, REPLAN
from rlpipe.seeds import EPISODE_SEED_STRIDE


@dataclass
class LayersOnlyResplit(FalconPolicy):
    """falcon, but the escalation's re-split moves layers only (the split stays what the rebalance made)."""
    name: str = "falcon-layers"

    def act(self, observation, mask, context):
        encoder = context.encoder
        if encoder.latest is None or encoder.planner.replicas == 1:
            return super().act(observation, mask, context)
        self._running = restart_on_change(self._running, context, self._rebalance, self._replan)
        rebalance = ski_rental_fires(self._rebalance, encoder.rebalance_figures, encoder, bool(mask[REBALANCE]),
                                     self.confirm_intervals, self.min_survival)
        resplit = ski_rental_fires(self._replan, encoder.replan_figures, encoder, bool(mask[REPLAN]),
                                   self.confirm_intervals, self.min_survival)
        if resplit:
            return REPLAN
        return REBALANCE if rebalance else KEEP


PRESETS = ["none", "light", "heavy", "bursty", "drift", "periodic", "jitter", "persistent", "seqlen", "network",
           "mixed"]
for replicas in map(int, sys.argv[1:]):
    config = EnvConfig(min_stages=4, max_stages=4, s_max=8, data_parallel=(replicas, replicas), d_max=8)
    seeds = [4242 * EPISODE_SEED_STRIDE + k for k in range(3)]
    means = {}
    for preset in PRESETS:
        row = {}
        for name, factory in (("threshold", lambda: make_policy("threshold")),
                              ("falcon", lambda: make_policy("falcon")), ("falcon-layers", LayersOnlyResplit)):
            row[name] = float(np.mean([run_episode(RepartitionEnv(config), factory(), seed, preset).efficiency
                                       for seed in seeds]))
        means[preset] = row
        print(f"4x{replicas} {preset:10s} " + " ".join(f"{k} {v:.4f}" for k, v in row.items())
              + f"  variant-falcon {row['falcon-layers'] - row['falcon']:+.4f}", flush=True)
    for k in ("threshold", "falcon", "falcon-layers"):
        print(f"4x{replicas} mean {k} {np.mean([means[p][k] for p in PRESETS]):.4f}")
