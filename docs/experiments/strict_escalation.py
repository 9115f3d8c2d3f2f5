"""Should `falcon-early` re-split a replicated job for a plan the rebalance nearly reaches? (issue #19,
2026-12-06; not part of the package, not tested.) The search behind its strict escalation.

On `seqlen` at 4 stages x 4 replicas (the README table's episode 5 of seed 4242, mlp16, 13 ms iterations),
pauses of a second or two on two replicas at once passed both of `falcon`'s tests, and a re-split took priority:
predicted 20.9 ms after it against 21.3 ms after the rebalance alone, for a stall of 0.51 s against 0.07 s, and a
move home when the pause ended (12 re-splits in the hour for `falcon-early`, 8 for `falcon`). The same rule
with each of those re-splits turned into a rebalance scored 0.9410 against its 0.9391 (`static` 0.9134).

Variants, each `falcon-early` with:
- `fe-old`: `falcon`'s escalation and its rebalance after two intervals (`falcon-early` before this change);
- `fe-whole`: a re-split must save its whole stall's round trip from the rebalance's plan (a first form);
- `fe-esc`: a re-split must also save, from the rebalance's plan, the round trip of the stall it costs beyond the
  rebalance's (`ObservationEncoder.escalation_figures`), the rebalance after two intervals;
- `falcon-early`: `fe-esc`, and its rebalance after one interval that lost 4 of its stalls (as shipped).

Two ways to score them, as `keen_resplit.py` does:

    .venv/bin/python docs/experiments/strict_escalation.py 4x4 "fe-old,fe-esc,falcon-early" 10 4242
    .venv/bin/python docs/experiments/strict_escalation.py heldout "fe-old,fe-whole,fe-esc,falcon-early" 264

Measured 2026-12-06. The first form lost on 66 held-out episodes of the training distribution, 0.93605 against
`fe-old`'s 0.93799: where a rebalance costs as much as a re-split (a 5 x 8 cnn16 job, both stalls 3-15 s) it
never re-split a job whose slowdowns kept growing (heavy: -0.0647). The shipped form: on 264 held-out episodes
0.92660 against 0.92666, a tie (15 episodes differ, 9 up and 6 down); on the table's episodes `falcon-early` at
4 x 2: 0.9749 against 0.9748 (seqlen +0.0006, mixed +0.0007), at 4 x 4: 0.9545 against 0.9543 (seqlen +0.0010
with 0 re-splits an hour against 1.2, mixed +0.0018, heavy +0.0003, drift -0.0006); `fe-esc` alone gave back
part of that (4 x 4 0.9542: the early rebalance reaches the pause before it ends). One pipeline is unchanged.
"""
import sys

import keen_resplit
import numpy as np
import onset_blind

from rlpipe.agents.heuristics import EarlyFalconPolicy
from rlpipe.observation import ObservationEncoder


class WholeStallEscalation(EarlyFalconPolicy):
    """The first form: the escalation figures with the re-split's whole stall."""

    def act(self, observation, mask, context):
        figures = ObservationEncoder.escalation_figures

        def whole(encoder):
            f = encoder.targets.figures
            return np.array([f[2], f[3], f[6]])

        ObservationEncoder.escalation_figures = property(whole)
        try:
            return super().act(observation, mask, context)
        finally:
            ObservationEncoder.escalation_figures = figures


keen_resplit.VARIANTS.update({  # its build and held-out scoring then build these too
    "fe-old": lambda: EarlyFalconPolicy(escalation=False, early_rebalance_stalls=0.0, name="fe-old"),
    "fe-whole": lambda: WholeStallEscalation(early_rebalance_stalls=0.0, name="fe-whole"),
    "fe-esc": lambda: EarlyFalconPolicy(early_rebalance_stalls=0.0, name="fe-esc")})


if __name__ == "__main__":
    if sys.argv[1] == "heldout":
        keen_resplit.held_out(sys.argv[2].split(","), int(sys.argv[3]))
    else:
        onset_blind.build = keen_resplit.build  # the worker processes fork after this: they build the variants too
        onset_blind.main(sys.argv)
