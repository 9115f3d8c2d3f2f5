"""How much of the oracle's lead could a causal policy take? (issue #19, 2026-12-05; not part of the package,
not tested.) Runs variants side by side on the same episodes (those of `rlpipe evaluate --seed SEED`), each minus the
first named, with moves (repartitions and rebalances) an hour.

Names: any policy `make_policy` knows (`onset-blind`, `oracle`, `ppo`, ...); `ob:lag_intervals=1` (the onset-blind
oracle told of a slowdown only once a whole interval has shown it); `fe:min_gain=0.01` (`falcon-early` with another
argument; `fe:onset=0`, without its onset re-split: `falcon-early` before 2026-12-05 21:00); `true-plan`
(`falcon-early`'s timing with the plan best for the true conditions now). The README's table (Results, "Is the oracle's lead out of a causal policy's reach?") is

    .venv/bin/python docs/experiments/onset_blind.py 4x1 \
        "falcon-early,oracle,onset-blind,ob:lag_intervals=1,fe:min_gain=0.01,ppo" 10 4242 heavy,drift,persistent,mixed

(about 3 minutes in 2 processes). Arguments: LAYOUT (stages x replicas), NAMES, EPISODES, SEED, [PRESETS].
"""
import contextlib
import sys
from multiprocessing import Pool
from unittest import mock

import numpy as np

from rlpipe.agents import make_policy
from rlpipe.agents.heuristics import EarlyFalconPolicy
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import RepartitionEnv
from rlpipe.seeds import EPISODE_SEED_STRIDE

PRESETS = ["none","light","heavy","bursty","drift","periodic","jitter","persistent","seqlen","network","mixed"]
class TruePlanFalcon(EarlyFalconPolicy):
    """`falcon-early`'s timing with the plan best for the true conditions now (simulation only): how much of the
    oracle's lead is the estimates' error in what a move should be."""

    def act(self, observation, mask, context):
        action = super().act(observation, mask, context)
        if action == 0:
            return action
        best = context.future.candidates(0.0, 1)[0]
        return best if best != (tuple(context.boundaries), tuple(context.split or context.encoder.split)) else 0


def build(name):
    if name == "true-plan":
        return TruePlanFalcon()
    if name.startswith("fe:"):
        kw = dict(p.split("=") for p in name[3:].split(";"))
        return EarlyFalconPolicy(**{k: float(v) for k, v in kw.items()})
    if name.startswith("ob:"):
        from rlpipe.agents.heuristics import OnsetBlindOraclePolicy
        kw = dict(p.split("=") for p in name[3:].split(";"))
        return OnsetBlindOraclePolicy(**{k: float(v) for k, v in kw.items()})
    return make_policy(name)
def job(args):
    layout, preset, name, episodes, seed = args
    S, D = map(int, layout.split("x"))
    env = RepartitionEnv(min_stages=S, max_stages=S, data_parallel=(D, D))
    out = []
    for ep in range(episodes):
        r = run_episode(env, build(name), seed * EPISODE_SEED_STRIDE + ep, preset)
        out.append((r.efficiency, r.repartitions_per_hour + r.rebalances_per_hour))
    return (layout, preset, name), out


_episodes_job = job  # scripts replace ``job``; the variants below run this one


@contextlib.contextmanager
def patched(patches):
    """``patches`` ((object, attribute, value) each) in force within the block, in this process only."""
    with contextlib.ExitStack() as stack:
        for target, attribute, value in patches:
            stack.enter_context(mock.patch.object(target, attribute, value))
        yield


def falcon_early_job(args, patches):
    """:func:`job` for `falcon-early` with ``patches`` in force (an encoder variant), under the variant's name."""
    layout, preset, name, episodes, seed = args
    with patched(patches):
        _, out = _episodes_job((layout, preset, "falcon-early", episodes, seed))
    return (layout, preset, name), out


def main(argv):
    """The table for ``argv`` (LAYOUT NAMES EPISODES SEED [PRESETS]); episodes run in 2 forked processes, each
    building its policies with this module's ``build`` (another script may replace it before calling)."""
    layout, names, episodes, seed = argv[1], argv[2].split(","), int(argv[3]), int(argv[4])
    presets = argv[5].split(",") if len(argv) > 5 else PRESETS
    tasks = [(layout, p, n, episodes, seed) for p in presets for n in names]
    with Pool(2) as pool:
        res = dict(pool.map(job, tasks))
    base = names[0]
    print(f"layout {layout}, {episodes} episodes, seed {seed}; each variant minus {base} (moves/h)")
    means = {n: [] for n in names}
    for p in presets:
        b = np.array([e for e, _ in res[(layout, p, base)]])
        row = [f"{p:10s} {base} {b.mean():.4f} ({np.mean([m for _, m in res[(layout,p,base)]]):.1f}/h)"]
        for n in names:
            e = np.array([x for x, _ in res[(layout, p, n)]])
            means[n].append(e.mean())
            if n != base:
                row.append(f"{n}: {e.mean()-b.mean():+.4f} ({np.mean([m for _, m in res[(layout,p,n)]]):.1f}/h)")
        print(" | ".join(row))
    print("mean " + " | ".join(f"{n}: {np.mean(v):.4f}" for n, v in means.items()))


if __name__ == "__main__":
    main(sys.argv)
