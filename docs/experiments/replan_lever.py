"""Should `falcon-early` re-split the layers alone, where that saves more than its rebalance does? (issue #19,
2026-12-06; not part of the package, not tested.)

`bench_live`'s hybrid job (2 replicas x 2 stages, `window`, device time emulated at x6, a decision every 2
iterations): at 18:34 `threshold` (1.2346x static) came out 0.2% above `falcon`, `falcon-early` and the policy
(1.231-1.232x), just beyond the spread. Replayed (`rlpipe run` of both at 20:18, logs through a fresh encoder,
each lever's plan simulated on the logged injected slowdowns): when replica 1's second device turns 3x slow, at
iteration 12 both tests pass; the re-plan of the layers (0, 10) with the even split simulates at 0.611 of the
iteration now, the rebalance (6, 2) at 0.612: the same. The encoder predicts 0.634 and 0.621, and prices the re-plan
at 0.10 s of stall, the rebalance at 2.81 s (one iteration: every stage rebuilt, its first iteration infers
shapes again). `falcon-early` rebalances (the cheap lever first, as FALCON); `threshold` re-plans. Live, the two
moves cost the same: the interval after either took 3.48 s, with the same throughput after (18.4-18.9 samples/s).

The variant here (`fe+layers`): `falcon-early`, plus a third count on the layer re-plan alone (the threshold
rule's); wherever `falcon-early` would rebalance or re-split, it re-plans the layers instead if that count's test
passes too and the re-plan saves more, less its stall, over the imbalance's expected remaining life (as long
again as it has lasted, where too few slowdowns have ended to judge). On the log above it re-plans at iteration 12,
as `threshold` does.

    .venv/bin/python docs/experiments/replan_lever.py 4x2 "falcon-early,fe+layers,fe+layers3" 10 4242
    .venv/bin/python docs/experiments/replan_lever.py heldout "falcon-early,fe+layers,fe+layers3" 132
    .venv/bin/python docs/experiments/replan_lever.py straggler

Measured 2026-12-06 (20:30-21:15), minus `falcon-early`: on the README table's episodes, 4 x 2 periodic +0.0013,
persistent +0.0016, mixed -0.0002, bursty -0.0001, the other seven within 0.0001 (mean 0.9760 against 0.9757);
4 x 4 persistent +0.0010, light, heavy +0.0003, mixed -0.0029 (per episode -0.0151 to +0.0061: one changed
decision sends a `mixed` episode elsewhere), mean 0.9557 against 0.9558. On 132 held-out episodes of the training
distribution (`configs/ppo.yml`: 1-8 replicas, profiles up to 8x slower, where a rebalance's iteration of stall
can cost far more than moving a layer) 0.93935 against 0.93800: 23 episodes differ, 17 up (up to +0.048: `jitter`
on 5 x 8 transformer32, 12 rebalances an hour turned into re-plans), 6 down (to -0.0127: `heavy` on 4 x 2
transformer32).

Not adopted: `straggler` (below) shows its failure. A lasting 3x straggler on one device of a 2 x 2 transformer16
job, a decision every 2 iterations, 20 ms of fixed migration cost: the re-plan is predicted 6.6% slower than the
rebalance (2,310 against 2,167 ms at 8x profile time) but stalls 0.03 s against 3.8 s, and "as long again" as a
young imbalance is too short a horizon to pay the difference; it re-plans, and from the re-planned job the
rebalance no longer clears its 3% gain: the job stays 2.3% slow for the rest of the hour (300 decisions: 0.9751
against `falcon`'s 0.9954 at 8x, 0.9812 against 0.9949 at 1x). A horizon that knows nothing of the slowdown's life
makes the cheaper lever a trap where the slowdown lasts; where it is short (the held-out gains) it pays.

`fe+layers3` re-plans instead only where the re-plan's plan is also predicted within 3% (the rules' least gain) of
the other lever's, so that what the other would add is below what any rule acts on. It rebalances on the
straggler above (0.9949 and 0.9954, as `falcon-early`) and still re-plans on the live log at iteration 12. On the
132 held-out episodes 0.93878 against 0.93800 (16 differ, 14 up, 2 down: -0.0027 and -0.0004); on the table's
episodes 4 x 2 as `fe+layers` (periodic +0.0013, persistent +0.0016, heavy +0.0003, mixed -0.0002; mean 0.9760
against 0.9757), 4 x 4 light, heavy, bursty +0.0002-3, persistent +0.0010, but **mixed -0.0051: 5 of the 10
episodes lower, none higher** (-0.0225 to -0.0035; 0.8327 against 0.8378, `falcon` 0.8299). Not adopted either.
The largest loss, traced (episode 8, cnn16 with 32 micro-batches a replica: iterations of 3.9 s): at the third
decision a 3.4x straggler in replica 4; `falcon-early` re-plans and rebalances together (predicted 1,813.5 ms, for
3.9 s of stall), the variant re-plans alone (1,867.3 ms, 2.97% slower, inside its 3%, for 0.5 s) and, 11 decisions
later, re-plans and rebalances anyway: both stalls paid, and the two runs part (0.6975 against 0.6638 over the next
30 decisions, 0.7541 against 0.7316 over the episode). A plan a few percent short of the other lever's is reached
by an escalation later, for its stall, so the re-plan's smaller stall bought nothing. The live case needs the
tolerance (the re-plan predicted 2.1% slower than the rebalance there, simulated equal); this one needs it tighter.
"""
import sys
from dataclasses import dataclass

import keen_resplit
import numpy as np
import onset_blind

from rlpipe.agents.heuristics import (
    EarlyFalconPolicy,
    FalconPolicy,
    pays_round_trip,
    restart_on_change,
    ski_rental_fires,
)
from rlpipe.decision import DecisionContext
from rlpipe.envs import RepartitionEnv
from rlpipe.interference import InterferenceTrace
from rlpipe.observation import BOTH, KEEP, REBALANCE, REPLAN, LostTime


@dataclass
class LayersLeverFalcon(EarlyFalconPolicy):
    """`falcon-early` with the layer re-plan as a third lever, taken where it saves more net of its stall
    (``within``: and only where its plan is predicted within that gain of the other lever's; None: anywhere)."""

    within: float | None = None

    def __post_init__(self):
        super().__post_init__()
        self._layers = LostTime(self.min_gain, self.noise_multiple, self.outlived_gain)  # the re-plan's own count
        self._seen = None  # the plan it last saw running

    def reset(self):
        super().reset()
        self._layers.reset()
        self._seen = None

    def act(self, observation, mask, context):
        encoder = context.encoder
        chosen = super().act(observation, mask, context)
        if encoder.latest is None or encoder.planner.replicas == 1:
            return chosen
        self._seen = restart_on_change(self._seen, context, self._layers)
        replan = encoder.replan_figures
        layers = ski_rental_fires(self._layers, replan, encoder, bool(mask[REPLAN]), self.confirm_intervals,
                                  self.min_survival, self.early_stalls) and pays_round_trip(
            self._layers, replan, encoder, (encoder.targets.replan, encoder.split), self.round_trip)
        if not layers or chosen not in (REBALANCE, BOTH):
            return chosen
        figures = encoder.rebalance_figures if chosen == REBALANCE else encoder.both_figures
        if self.within is not None and replan[1] > figures[1] * (1 + self.within):
            return chosen  # the other plan is faster by a gain the rules act on: the re-plan is no way there
        return REPLAN if self._net_saving_s(replan, encoder) > self._net_saving_s(figures, encoder) else chosen

    def _net_saving_s(self, figures, encoder):
        age = max(self._layers.held_iterations, encoder.imbalance_age_iterations, 1)
        remaining = encoder.expected_remaining_iterations(age)
        now_ms, after_ms, stall_s = figures
        return (now_ms - after_ms) / 1e3 * (age if remaining is None else remaining) - stall_s


def straggler():
    """A lasting 3x straggler on replica 1's second device (2 x 2, transformer16, 4 micro-batches, decisions every
    2 iterations): each rule's first moves and its mean efficiency over 300 decisions, at 1x and 8x profile time."""
    for scale in (1.0, 8.0):
        for rule in (FalconPolicy(), EarlyFalconPolicy(), LayersLeverFalcon(name="fe+layers"),
                     LayersLeverFalcon(within=0.03, name="fe+layers3")):
            env = RepartitionEnv(min_stages=2, max_stages=2, timer_noise=0.03, profiles=("transformer16",),
                                 schedules=("1f1b",), microbatches=(4,), scenarios=("none",), duration_s=3600,
                                 migration_overhead_s=(0.02, 0.02), interval_iterations=2, data_parallel=(2, 2),
                                 profile_time_scale=(scale, scale))
            slow = np.ones((2, 4))
            slow[1, 3] = 3.0
            trace = InterferenceTrace(np.array([0.0, 60.0]), slow, np.ones((2, 3)), 3600.0)
            env.reset(seed=0, options={"trace": trace})
            observation, moves, rewards = None, [], []
            for step in range(300):
                action = rule.act(observation, env.action_masks(), DecisionContext(env.encoder, env.boundaries,
                                                                                   split=env.split))
                if action != KEEP:
                    moves.append((step, action))
                observation, reward, *_ = env.step(action)
                rewards.append(reward)
            print(f"x{scale:g} {rule.name:12s} moves {moves[:3]} efficiency {np.mean(rewards):.4f}")


keen_resplit.VARIANTS.update({"fe+layers": lambda: LayersLeverFalcon(name="fe+layers"),
                              "fe+layers3": lambda: LayersLeverFalcon(within=0.03, name="fe+layers3")})

if __name__ == "__main__":
    if sys.argv[1] == "heldout":
        keen_resplit.held_out(sys.argv[2].split(","), int(sys.argv[3]))
    elif sys.argv[1] == "straggler":
        straggler()
    else:
        onset_blind.build = keen_resplit.build  # the worker processes fork after this: they build the variants too
        onset_blind.main(sys.argv)
