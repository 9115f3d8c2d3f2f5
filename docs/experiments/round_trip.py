"""The round-trip test in `threshold` and `falcon`: the rules with it (the default, 3 stalls) and without it
(`round_trip=0`, the rules before 2026-12-03), and `static`, on the README's ten episodes per preset (seed 4242).
Not part of the package, not tested.

A move away from the launch plan has a way back: once the imbalance ends the job runs a plan fitted to it
until the count brings it home, then pays the stall back. On `seqlen` with the `mlp16` profile (13 ms
iterations, a decision interval of 0.16 s) a garbage-collection pause of 1-2 s spans about ten intervals, so
the ski-rental count alone pays a re-plan's stall within a few and chases every pause.

Run from the repository root: `.venv/bin/python docs/experiments/round_trip.py 4x2[,4x1,...] [PRESETS]`
(layouts as STAGESxREPLICAS; PRESETS comma-separated, all eleven by default). Prints, per preset, each
policy's mean efficiency and repartitions per hour, and the rule with the test minus the rule without it.
"""

import sys
import time

import numpy as np

from rlpipe.agents import FalconPolicy, StaticPolicy
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.seeds import EPISODE_SEED_STRIDE

EPISODES = 10
SEED = 4242  # the README's tables
PRESETS = ["none", "light", "heavy", "bursty", "drift", "periodic", "jitter", "persistent", "seqlen", "network",
           "mixed"]
POLICIES = {"static": StaticPolicy, "one-way": lambda: FalconPolicy(round_trip=0.0), "round-trip": FalconPolicy}


def main() -> None:
    presets = sys.argv[2].split(",") if len(sys.argv) > 2 else PRESETS
    for layout in sys.argv[1].split(","):
        stages, replicas = map(int, layout.split("x"))
        config = EnvConfig(min_stages=stages, max_stages=stages, s_max=8, data_parallel=(replicas, replicas), d_max=8)
        seeds = [SEED * EPISODE_SEED_STRIDE + k for k in range(EPISODES)]
        started, differences = time.time(), []
        for preset in presets:
            results = {name: [run_episode(RepartitionEnv(config), make(), seed, preset) for seed in seeds]
                       for name, make in POLICIES.items()}
            efficiency = {name: float(np.mean([r.efficiency for r in runs])) for name, runs in results.items()}
            per_hour = {name: float(np.mean([r.repartitions_per_hour for r in runs])) for name, runs in results.items()}
            differences.append(efficiency["round-trip"] - efficiency["one-way"])
            print(f"{layout} {preset:10s} " + "  ".join(f"{name} {efficiency[name]:.4f} ({per_hour[name]:.0f}/h)"
                                                         for name in POLICIES)
                  + f"  round-trip - one-way {differences[-1]:+.4f}", flush=True)
        print(f"{layout} mean over the presets: round-trip - one-way {np.mean(differences):+.4f} "
              f"({time.time() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
