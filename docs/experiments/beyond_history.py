"""How the round-trip test judges an imbalance older than nearly every slowdown a run has seen end (issue #19,
2026-12-04; not part of the package, not tested).

`threshold` and `falcon` make a move away from the launch plan save 3 stalls over the imbalance's expected
remaining life, the mean further life of the ended slowdowns that outlasted its age. With fewer than 3 of those,
the test used to wave the move through ("an imbalance older than every one seen may be of a new kind"). On
`seqlen`, garbage-collection pauses of 1-2 s come about once a minute on every device; now and then one outlasts
all but two of those seen, and the rules paid a re-plan's stall near the pause's end and another on the way back.
Variants of `ObservationEncoder.expected_remaining_iterations` where fewer than 3 outlasted the age (with at least
3 ended; fewer: no history, the count alone decides):

- `lindy`: as long again as the age beyond the third-longest slowdown seen;
- `lindy2` (adopted): the larger of that and the mean further life of the one or two that outlasted it.

Run from the repository root: `.venv/bin/python docs/experiments/beyond_history.py VARIANT LAYOUTS [PRESETS]
[POLICIES]` (VARIANT `lindy`, `lindy2` or a number: the old rule with that many needed; LAYOUTS as 4x1,4x2;
PRESETS and POLICIES comma-separated, by default all eleven presets and `threshold`, plus `falcon` on replicated
jobs). The README table's episodes (seed 4242, 10 each). Prints each rule's mean efficiency and repartitions an
hour. About a minute a layout of one pipeline, three a replicated one.

Results (2026-12-04), each variant minus the old rule (the README's previous table), seqlen's repartitions an
hour from -> to:

| variant | 2 x 1 | 4 x 1 | 8 x 1 | 4 x 2 `threshold` / `falcon` | 4 x 4 `threshold` / `falcon` |
|---|---|---|---|---|---|
| lindy, mean over 11 presets | -0.0001 | +0.0000 | +0.0000 | -0.0002 / -0.0002 | -0.0000 / -0.0004 |
| lindy, worst preset | bursty -0.0003 | periodic -0.0003 | heavy -0.0003 | mixed -0.0008 / mixed -0.0014 | mixed -0.0015 / mixed -0.0042 |
| lindy, seqlen | 0.4 -> 0.2/h | 3.2 -> 0.4/h | 7.5 -> 0.4/h | 6.1 -> 0.0 / 0.4 -> 0.8 | 17.3 -> 0.7 / 1.2 -> 0.6 |
| lindy2 on mixed, seqlen, heavy | | +0.0001, +0.0003, +0.0000 | -0.0002, +0.0007, -0.0003 | +0.0005, +0.0005, -0.0001 / +0.0000, -0.0000, -0.0001 | +0.0005, +0.0014, +0.0004 / +0.0001, +0.0002, -0.0004 |

`lindy` held a new lasting slowdown where the run had seen one or two longer ones end (mixed, with replicas,
-0.0042); `lindy2` lets those few speak and holds on seqlen as well (0.0-0.8 repartitions an hour for either rule).
The README's table is of `lindy2`, on every preset.
"""

import bisect
import sys
import time

import numpy as np

from rlpipe.agents import make_policy
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.observation import ObservationEncoder
from rlpipe.seeds import EPISODE_SEED_STRIDE

SEED, EPISODES = 4242, 10
PRESETS = ["none", "light", "heavy", "bursty", "drift", "periodic", "jitter", "persistent", "seqlen", "network", "mixed"]


def lindy(self: ObservationEncoder, age_iterations: float, min_seen: int = 3) -> float | None:
    age = max(age_iterations, 1)
    longer = self._past_sorted[bisect.bisect_right(self._past_sorted, age):]
    if len(longer) >= min_seen:
        return sum(longer) / len(longer) - age
    if len(self._past_sorted) < min_seen:
        return None
    return age - self._past_sorted[-min_seen]


def old_rule(min_seen: int):
    def expected(self: ObservationEncoder, age_iterations: float) -> float | None:
        age = max(age_iterations, 1)
        longer = self._past_sorted[bisect.bisect_right(self._past_sorted, age):]
        return None if len(longer) < min_seen else sum(longer) / len(longer) - age
    return expected


def main() -> None:
    variant = sys.argv[1]
    if variant == "lindy":
        ObservationEncoder.expected_remaining_iterations = lindy
    elif variant != "lindy2":  # lindy2 is the encoder's own since 2026-12-04
        ObservationEncoder.expected_remaining_iterations = old_rule(int(variant))
    presets = sys.argv[3].split(",") if len(sys.argv) > 3 else PRESETS
    for layout in sys.argv[2].split(","):
        stages, replicas = map(int, layout.split("x"))
        config = EnvConfig(min_stages=stages, max_stages=stages, s_max=8, data_parallel=(replicas, replicas), d_max=8)
        policies = sys.argv[4].split(",") if len(sys.argv) > 4 else ["threshold"] + ["falcon"] * (replicas > 1)
        for preset in presets:
            for name in policies:
                started = time.time()
                runs = [run_episode(RepartitionEnv(config), make_policy(name), SEED * EPISODE_SEED_STRIDE + k, preset)
                        for k in range(EPISODES)]
                print(f"{variant} {layout} {preset:10s} {name:9s} {np.mean([r.efficiency for r in runs]):.5f} "
                      f"{np.mean([r.repartitions_per_hour for r in runs]):6.1f}/h ({time.time() - started:.0f} s)",
                      flush=True)


if __name__ == "__main__":
    main()
