"""Where the shipped policy parts from `falcon` (issue #19, 2026-12-03; not part of the package, not tested).

The README's table has the shipped policy more than 0.003 under the best rule in one cell, mixed at 4 stages
x 4 replicas (-0.0031 against `falcon`). This replays that cell's episodes (seed 4242, 3 episodes, as
`rlpipe evaluate` runs them) with the policy driving, and asks `falcon`, at each of the policy's states, what
it would do there.

Run from the repository root: `.venv/bin/python docs/experiments/clone_divergence.py [D] [SCENARIO] [EPISODES]`
(default 4 mixed 3; about a minute for three episodes).

Results (2026-12-03, the policy shipped then, cloned from `falcon` before its round-trip test):

4 x 4, mixed: 11 of 1,298 decisions differ from `falcon`'s (0.85%). The policy rebalanced and re-planned together
("both") 6 times where `falcon` kept, rebalanced twice where `falcon` re-planned, and once each kept or re-planned
where `falcon` rebalanced, or rebalanced where it kept. The two episodes that lost part early: at decision 13 (of
403) and at decision 9 (of 410), the others later (26 to 352). Per episode, policy minus `falcon`: +0.0002 (one
divergence), -0.0044 (five), -0.0051 (five) (mean -0.0031). The observation holds everything `falcon` decides on
(the rule reads it), so a policy that repeats `falcon` exactly exists: the gap is the clone's error on a few
states, not something it cannot see. More imitation of `falcon` on hybrid runs could close it; it needs a retrain.

4 x 2, mixed: 2 of 1,670 decisions differ; the policy ties `falcon` (+0.0006). There `threshold`, which never
rebalances, beats `falcon` by 0.0033, and the policy, a copy of `falcon`, trails it by 0.0027. Beating that
cell needs a policy that learns when a rebalance does not pay, beyond its teacher.

Results (2026-12-04, the policy retrained on `falcon` with its round-trip test), 4 x 2, seqlen, ten episodes
(`2 seqlen 10`, 4 minutes): 156 of 43,740 decisions differ (0.36%), every one in the two episodes of the `mlp16`
profile (13 ms iterations: 21,092 and 17,510 decisions, against 204-752 in the others, which the policy plays
exactly as `falcon`). There the policy re-planned or re-planned and rebalanced ("both") 67 times where `falcon`
kept or only rebalanced, and lost 0.0032 and 0.0041 to it. The README's 8.8 repartitions an hour on seqlen at
2 replicas are these: a clone's error rate per decision becomes a rate per hour, and short iterations make the
decisions many.
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np

from rlpipe.agents import make_policy
from rlpipe.decision import DecisionContext
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.observation import BOTH, KEEP, REBALANCE, REPLAN
from rlpipe.seeds import EPISODE_SEED_STRIDE

KINDS = {KEEP: "keep", REPLAN: "replan", REBALANCE: "rebalance", BOTH: "both"}  # other actions: one boundary's move


def main(replicas: int, scenario: str, seed: int = 4242, episodes: int = 3) -> None:
    config = EnvConfig(min_stages=4, max_stages=4, s_max=8, data_parallel=(replicas, replicas), d_max=8)
    policy, teacher = make_policy("ppo"), make_policy("falcon")
    pairs: Counter[tuple[str, str]] = Counter()
    for episode in range(episodes):
        episode_seed = seed * EPISODE_SEED_STRIDE + episode
        teachers = run_episode(RepartitionEnv(config), make_policy("falcon"), episode_seed, scenario).efficiency
        env = RepartitionEnv(config)
        observation, _ = env.reset(seed=episode_seed, options={"scenario": scenario})
        policy.reset()
        teacher.reset()
        efficiencies: list[float] = []
        first_divergence = None
        done = False
        while not done:
            mask = env.action_masks()
            context = DecisionContext(env.encoder, env.boundaries, env.future(), env.split)
            mine, theirs = int(policy.act(observation, mask, context)), int(teacher.act(observation, mask, context))
            pairs[(KINDS.get(theirs, "move"), KINDS.get(mine, "move"))] += 1
            if mine != theirs and first_divergence is None:
                first_divergence = (len(efficiencies), KINDS.get(theirs, "move"), KINDS.get(mine, "move"))
            observation, _, terminated, truncated, info = env.step(mine)
            efficiencies.append(info["efficiency"])
            done = terminated or truncated
        mean = float(np.mean(efficiencies))
        print(f"episode {episode}: falcon {teachers:.4f}, policy {mean:.4f} ({mean - teachers:+.4f}); "
              f"{len(efficiencies)} decisions; first divergence (decision, falcon's, the policy's): {first_divergence}")
    print("falcon's decision -> the policy's, on the policy's states:")
    for (theirs, mine), count in pairs.most_common():
        print(f"  {theirs:>9} -> {mine:<9} {count}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4, sys.argv[2] if len(sys.argv) > 2 else "mixed",
         episodes=int(sys.argv[3]) if len(sys.argv) > 3 else 3)
