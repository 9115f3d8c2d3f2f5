"""When may `falcon` re-split after one interval instead of two? (issue #19, 2026-12-05; not part of the package,
not tested.) The search behind `falcon-early`, the shipped policy's teacher.

The rules confirm an imbalance over two decision intervals before they move (`RULE_CONFIRM_INTERVALS`). Acting
later was tried (`rule_variants.py`: a third interval lost up to -0.0196); acting sooner was not, until this.
A first pass on the README table's episodes (seed 4242, the first 5 of each preset's 10; a selection was then
made on other episodes, below) confirmed everything over one interval instead:

| variant, minus `falcon` | 4 x 1: mean (worst preset) | 4 x 2: mean (worst preset) |
|---|---|---|
| every lever after 1 interval | +0.0010 (bursty -0.0011) | +0.0010 (persistent -0.0032, seqlen -0.0029) |
| the rebalance after 1 | +0.0000 | -0.0008 (mixed -0.0051, persistent -0.0031) |
| the re-split after 1 (`always`) | +0.0010 (bursty -0.0011) | +0.0010 (persistent -0.0032, seqlen -0.0029) |
| moves home after 1 | +0.0000 | +0.0000 |

Confirming the re-split one interval sooner gains where slowdowns last (heavy +0.0055 and +0.0080, periodic
+0.0042 and +0.0080) and loses on short pauses and bursts. Gates on the early re-split (a second interval is
still needed where the gate does not hold): `survT`, the imbalance's survival (the share of the run's ended
slowdowns that outlasted its age and lasted twice as long) at least T; `marginK`, the round-trip saving at least
K stalls; `lostK`, the time already lost at least K of the re-split's stalls (one interval that lost that much is a
large slowdown). Selected on other episodes (seed 777, 5 each), each minus `falcon`, mean over the 11 presets
(worst preset):

| gate | 4 x 1 | 4 x 2 |
|---|---|---|
| surv0.8 | +0.0011 (bursty -0.0004) | +0.0013 (mixed -0.0021) |
| margin20 | +0.0013 (light -0.0003) | +0.0019 (bursty -0.0020) |
| surv0.6_and_lost2 | +0.0017 (bursty -0.0006) | +0.0016 (all >= -0.0000) |
| margin20_or_lost4 | +0.0016 (light -0.0003) | +0.0022 (bursty -0.0025) |
| lost3 | +0.0019 (all >= 0) | +0.0020 (bursty, network -0.0008) |
| **lost4** | +0.0014 (bursty -0.0001) | +0.0020 (network -0.0011) |
| lost6 | +0.0013 (bursty -0.0006) | +0.0005 (network -0.0011) |

and lost4 at 2 x 1 +0.0022 (every preset >= 0), at 8 x 1 +0.0014 (every preset >= 0; heavy +0.0084), at 4 x 4
+0.0020 (bursty -0.0019, network -0.0012, persistent -0.0009; heavy +0.0186). Adopted: lost4,
`EARLY_RESPLIT_STALLS`. The survival gates cannot tell a burst's onset from a lasting slowdown's (every burst
outlasts its first seconds: bursty's Pareto durations start at 5 s), while lost4 has a reason of its own: a move
there and back costs its round trip, 3 stalls (`ROUND_TRIP_STALLS`), so once one interval has lost more than that,
waiting a second to confirm risks more than a wrong move. lost3 did as well on these episodes; 4 leaves a stall's
margin for the estimate's noise.

Run from the repository root: `.venv/bin/python docs/experiments/early_resplit.py LAYOUT GATES EPISODES SEED`
(LAYOUT as 4x2; GATES comma-separated from the names above and `always`; about a minute a gate for one
pipeline at 5 episodes, three for 4 x 4). Prints each gate minus `falcon` on every preset, then the mean.
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlpipe.agents import make_policy
from rlpipe.agents.heuristics import FalconPolicy, pays_round_trip, restart_on_change, ski_rental_fires
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.observation import BOTH, KEEP, REBALANCE, REPLAN
from rlpipe.seeds import EPISODE_SEED_STRIDE

Gate = Callable  # (count, figures, plan, encoder) -> bool


@dataclass
class GatedEarlyFalcon(FalconPolicy):
    """`falcon` whose re-split may fire after one interval where ``gate`` holds (two intervals otherwise)."""

    gate: Gate = lambda *args: True
    name: str = "gated"

    def _resplit(self, figures, plan, possible, encoder) -> bool:
        fires = ski_rental_fires(self._replan, figures, encoder, possible, 1, self.min_survival)
        if fires and self._replan.held_intervals < self.confirm_intervals:
            fires = self.gate(self._replan, figures, plan, encoder)
        return fires and pays_round_trip(self._replan, figures, encoder, plan, self.round_trip)

    def act(self, observation, mask, context):
        encoder = context.encoder
        if encoder.latest is None:
            return KEEP
        self._running = restart_on_change(self._running, context, self._rebalance, self._replan)
        targets = encoder.targets
        if encoder.planner.replicas == 1:
            plan = (targets.replan, encoder.split)
            return REPLAN if self._resplit(encoder.replan_figures, plan, bool(mask[REPLAN]), encoder) else KEEP
        rebalance_plan = (context.boundaries, targets.rebalance)
        rebalance = ski_rental_fires(self._rebalance, encoder.rebalance_figures, encoder, bool(mask[REBALANCE]),
                                     self.confirm_intervals, self.min_survival)
        rebalance = rebalance and pays_round_trip(self._rebalance, encoder.rebalance_figures, encoder,
                                                  rebalance_plan, self.round_trip)
        both_action = next((action for action, plan in ((REPLAN, (targets.replan, encoder.split)),
                                                        (REBALANCE, rebalance_plan))
                            if plan == targets.both and mask[action]), BOTH)
        if self._resplit(encoder.both_figures, targets.both, bool(mask[both_action]), encoder):
            return both_action
        return REBALANCE if rebalance else KEEP


def survival(threshold: float) -> Gate:
    return lambda count, figures, plan, encoder: encoder.imbalance_survival() >= threshold


def margin(stalls: float) -> Gate:
    def gate(count, figures, plan, encoder) -> bool:
        saving = encoder.round_trip_saving(count.held_iterations, figures, plan)
        return saving is not None and saving[0] >= stalls * saving[1]
    return gate


def lost(stalls: float) -> Gate:
    return lambda count, figures, plan, encoder: count.lost_s >= stalls * figures[2]


GATES: dict[str, Gate] = {
    "always": lambda *args: True,
    "surv0.6": survival(0.6), "surv0.8": survival(0.8), "margin6": margin(6), "margin20": margin(20),
    "lost2": lost(2), "lost3": lost(3), "lost4": lost(4), "lost6": lost(6),
    "surv0.6_and_lost2": lambda *a: survival(0.6)(*a) and lost(2)(*a),
    "margin20_or_lost4": lambda *a: margin(20)(*a) or lost(4)(*a),
}
PRESETS = ["none", "light", "heavy", "bursty", "drift", "periodic", "jitter", "persistent", "seqlen", "network",
           "mixed"]

if __name__ == "__main__":
    layout, gates, episodes, seed = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
    stages, replicas = map(int, layout.split("x"))
    config = EnvConfig(min_stages=stages, max_stages=stages, s_max=8, data_parallel=(replicas, replicas), d_max=8)
    seeds = [seed * EPISODE_SEED_STRIDE + k for k in range(episodes)]
    policies = {"falcon": lambda: make_policy("falcon"),
                **{gate: (lambda gate=gate: GatedEarlyFalcon(gate=GATES[gate])) for gate in gates}}
    means: dict[str, dict[str, float]] = {}
    for preset in PRESETS:
        means[preset] = {name: float(np.mean([run_episode(RepartitionEnv(config), build(), s, preset).efficiency
                                              for s in seeds])) for name, build in policies.items()}
        print(f"{layout} {preset:10s} falcon {means[preset]['falcon']:.4f} " + " ".join(
            f"{g} {means[preset][g] - means[preset]['falcon']:+.4f}" for g in gates), flush=True)
    print(f"{layout} mean minus falcon: " + " ".join(
        f"{g} {np.mean([means[p][g] - means[p]['falcon'] for p in PRESETS]):+.4f}" for g in gates), flush=True)
