"""Can a causal rule do better than `falcon` where it trails another rule? (issue #19, 2026-12-03; not part of
the package, not tested.) `falcon` (the threshold rule on one pipeline) is the shipped policy's teacher, and
in the README's 3-episode table it trails static on bursty at 4 x 1 (-0.0036) and threshold on mixed at 4 x 2
(-0.0033). On bursty at 4 x 1, 109 of threshold's moves away from the launch plan in 20 episodes came at a
burst's median age of 6.4 s, with a median 11.5 s of it left: each move is soon undone, paying two stalls.
Three families of change to when `falcon` acts, each one knob:

- `priced`: act once the lost time reaches m x the stall (every action; `rb`: the rebalance only), a
  higher `min_survival` (0.4), or 3 confirming intervals instead of 2;
- `away`: m x the stall for a move away from the launch plan, 1 x for the move back (a move away will be
  paid again on the way back);
- `payoff`: also veto a move away unless its saving over the imbalance's expected remaining life (the
  slowdowns this run has seen end that outlasted its age, at least 3 of them) reaches k x its stall.

Rules only, on the README table's episodes (seed 4242, 3 each, 11 presets). Run from the repository root:
`RLPIPE_CACHE_DIR=/tmp/cache .venv/bin/python docs/experiments/rule_variants.py 4x1,2x1 [VARIANT,...]`
(about a minute a layout of one pipeline, three at 4 x 4, for all variants).

Results (2026-12-03, 13:22-13:40), each variant minus `falcon`: the mean over the 11 presets, and its worst
preset:

| variant | 2 x 1 | 4 x 1 | 8 x 1 | 4 x 2 | 4 x 4 (8 presets) |
|---|---|---|---|---|---|
| priced 1.5 | -0.0001 (bursty -0.0010) | -0.0003 (mixed -0.0013) | -0.0002 (periodic -0.0019) | -0.0006 (drift -0.0027) | -0.0005 (periodic -0.0026) |
| priced 2 | -0.0001 (periodic -0.0003) | -0.0004 (periodic -0.0012) | -0.0008 (periodic -0.0049) | -0.0011 (drift -0.0041) | -0.0010 (periodic -0.0030) |
| rebalance priced 2 or 4 | +0.0000 | +0.0000 | +0.0000 | -0.0000 (bursty -0.0002) | +0.0000 |
| min_survival 0.4 | +0.0000 | +0.0000 (light -0.0004) | +0.0000 | -0.0005 (mixed -0.0050) | -0.0003 (bursty -0.0023) |
| 3 confirming intervals | -0.0014 (heavy -0.0058) | -0.0015 (heavy -0.0055) | -0.0011 (periodic -0.0047) | -0.0037 (periodic -0.0109) | -0.0041 (heavy -0.0196) |
| away 1.5 | -0.0000 (drift -0.0001) | -0.0001 (mixed -0.0013) | -0.0001 (periodic -0.0018) | -0.0005 (drift -0.0028) | -0.0006 (periodic -0.0026) |
| away 2 | -0.0001 (bursty -0.0009) | -0.0001 (periodic -0.0013) | -0.0006 (periodic -0.0047) | -0.0005 (drift -0.0029) | -0.0009 (periodic -0.0030) |
| away 3 | +0.0000 (drift -0.0004) | -0.0006 (periodic -0.0023) | -0.0009 (periodic -0.0085) | -0.0015 (periodic -0.0077) | -0.0018 (periodic -0.0062) |
| payoff 1, 2 | +0.0000 | +0.0000 | +0.0000 | -0.0000 / -0.0005 (drift -0.0040) | |
| payoff 4 | +0.0000 | +0.0001 | +0.0000 | -0.0007 (drift -0.0030) | |

No variant beats `falcon` on the mean of any layout. Those that gain on bursty at 4 x 1 (3 confirming
intervals +0.0011, away 2 +0.0012) lose it on lasting slowdowns (periodic, drift, heavy); mixed at 4 x 2 gains
at most +0.0004. The payoff veto almost never fires: the slowdowns that outlasted a burst's age have a long
mean remaining life (Pareto durations of shape 1.1), so by expectation the moves pay, and they lose only in
the few long bursts three episodes hold. With 30 episodes (seed 777) bursty at 4 x 1 reads threshold 0.9906,
static 0.9896 (the README's paired column: `rlpipe evaluate --episodes 30`): the 3-episode gap is the sample's.
"""

import sys
from dataclasses import dataclass

import numpy as np

from rlpipe.agents import make_policy
from rlpipe.agents.heuristics import FalconPolicy, restart_on_change, ski_rental_fires
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.observation import BOTH, KEEP, REBALANCE, REPLAN
from rlpipe.seeds import EPISODE_SEED_STRIDE


@dataclass
class WhenVariant(FalconPolicy):
    """falcon with the buy price of a move away from the launch plan at ``away`` x its stall (every move at
    ``multiple`` x, the rebalance at ``rebalance_multiple`` x), and the payoff veto at ``payoff`` x (0: none)."""

    multiple: float = 1.0
    rebalance_multiple: float = 1.0
    away: float = 1.0
    payoff: float = 0.0
    name: str = "variant"

    def _price(self, encoder, figures, plan, multiple):
        launch = (encoder.planner.ideal_boundaries, encoder.planner.even)
        return np.asarray(figures) * np.array([1.0, 1.0, multiple * (1.0 if plan == launch else self.away)])

    def _pays(self, encoder, figures, plan):
        if not self.payoff or plan == (encoder.planner.ideal_boundaries, encoder.planner.even):
            return True
        now_ms, after_ms, stall_s = figures
        age = max(encoder.lost_time.held_iterations, 1)
        longer = np.asarray(encoder._past_sorted)
        longer = longer[longer > age]
        if len(longer) < 3:
            return True
        residual_s = float(np.mean(longer - age)) * now_ms / 1e3
        return (1.0 - after_ms / now_ms) * residual_s >= self.payoff * stall_s

    def _fires(self, count, figures, plan, multiple, possible, encoder):
        return (ski_rental_fires(count, self._price(encoder, figures, plan, multiple), encoder, possible,
                                 self.confirm_intervals, self.min_survival) and self._pays(encoder, figures, plan))

    def act(self, observation, mask, context):
        encoder = context.encoder
        if encoder.latest is None:
            return KEEP
        self._running = restart_on_change(self._running, context, self._rebalance, self._replan)
        targets = encoder.targets
        if encoder.planner.replicas == 1:
            return REPLAN if self._fires(self._replan, encoder.replan_figures, (targets.replan, encoder.split),
                                         self.multiple, bool(mask[REPLAN]), encoder) else KEEP
        rebalance = self._fires(self._rebalance, encoder.rebalance_figures, (context.boundaries, targets.rebalance),
                                self.rebalance_multiple, bool(mask[REBALANCE]), encoder)
        both_action = next((action for action, plan in ((REPLAN, (targets.replan, encoder.split)),
                                                        (REBALANCE, (context.boundaries, targets.rebalance)))
                            if plan == targets.both and mask[action]), BOTH)
        if self._fires(self._replan, encoder.both_figures, targets.both, self.multiple, bool(mask[both_action]),
                       encoder):
            return both_action
        return REBALANCE if rebalance else KEEP


VARIANTS = {
    "falcon": lambda: make_policy("falcon"),
    "priced1.5": lambda: WhenVariant(multiple=1.5, rebalance_multiple=1.5),
    "priced2": lambda: WhenVariant(multiple=2.0, rebalance_multiple=2.0),
    "rebalance2": lambda: WhenVariant(rebalance_multiple=2.0),
    "rebalance4": lambda: WhenVariant(rebalance_multiple=4.0),
    "survival0.4": lambda: WhenVariant(min_survival=0.4),
    "confirm3": lambda: WhenVariant(confirm_intervals=3),
    "away1.5": lambda: WhenVariant(away=1.5),
    "away2": lambda: WhenVariant(away=2.0),
    "away3": lambda: WhenVariant(away=3.0),
    "payoff1": lambda: WhenVariant(payoff=1.0),
    "payoff2": lambda: WhenVariant(payoff=2.0),
    "payoff4": lambda: WhenVariant(payoff=4.0),
}
PRESETS = ["none", "light", "heavy", "bursty", "drift", "periodic", "jitter", "persistent", "seqlen", "network",
           "mixed"]

if __name__ == "__main__":
    names = ["falcon", *(sys.argv[2].split(",") if len(sys.argv) > 2 else [v for v in VARIANTS if v != "falcon"])]
    for layout in sys.argv[1].split(","):
        stages, replicas = map(int, layout.split("x"))
        config = EnvConfig(min_stages=stages, max_stages=stages, s_max=8, data_parallel=(replicas, replicas), d_max=8)
        seeds = [4242 * EPISODE_SEED_STRIDE + k for k in range(3)]
        means = {}
        for preset in PRESETS:
            means[preset] = {name: float(np.mean([run_episode(RepartitionEnv(config), VARIANTS[name](), seed,
                                                               preset).efficiency for seed in seeds]))
                             for name in names}
            print(f"{layout} {preset:10s} " + " ".join(f"{n} {v - means[preset]['falcon']:+.4f}"
                                                        for n, v in means[preset].items() if n != "falcon"),
                  flush=True)
        print(f"{layout} mean minus falcon: " + " ".join(
            f"{n} {np.mean([means[p][n] - means[p]['falcon'] for p in PRESETS]):+.4f}" for n in names[1:]), flush=True)
