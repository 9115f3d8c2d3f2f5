"""Replay a live run's log through a fresh controller: at each decision, what `falcon` decides on the same
observation and the learned policy's probabilities for keep, re-plan, rebalance and both (issue #19,
2026-12-04; not part of the package, not tested).

Run from the repository root: `.venv/bin/python docs/experiments/live_replay.py RUN.jsonl [ppo:PATH]` on a log of
`rlpipe run --log` (one pipeline or a hybrid job).

Results (2026-12-04): `bench_live`'s hybrid job (2 replicas x 2 stages, `window`, a decision every 2
iterations, device time emulated at x6: 1-2.5 s iterations) with the shipped policy of 2026-12-04 (observation
v5, source 8acf0dd): the replay repeats every logged decision. When replica 1's device turns 3x slow (iteration
10), `falcon` rebalances at iteration 14, where the policy keeps with probability 0.983; it rebalances one decision
later (p = 0.976), and loses 0.06 of static's throughput to `falcon` in each of 3 repeats. Its state there is in
the sparse tail of what it trained on: a one-layer move's stall is 0.04-0.05 of an iteration (0.1 s of fixed
cost against 1-2.5 s iterations), where in the training jobs (`configs/ppo.yml`, 400 episodes' first states) it
is under 0.05 in 10% of the replicated ones (median 0.39, up to 60). In simulation (`window` at 2 x 2, 10
episodes, seed 4242), on this job's profile x6 with the same 0.1 s fixed cost, the policy trailed `falcon` by
0.0003 at a decision every 2 iterations (by 0.0076 in its worst episode) and by 0.0029 at every 10 (0.017), on the
shipped `transformer16` by 0.0003 (0.0025): mostly a tie, with single episodes lost where the clone hesitates.
A retrain that also drew profiles up to 8x slower (`profile_time_scale: [1, 8]`, runs/r44, not shipped), replayed
on the same log (`ppo:runs/r44/policy.pt`): keep 0.585, rebalance 0.378 at iteration 14: as late.
The cause is the decision interval: the policy waits for a count to have held 3 intervals (at iteration 14 it has
held 2: with the 3rd, keep 0.347, rebalance 0.629), and at a decision every 2 iterations what the observation
counts in iterations (how long the count has held, the one past slowdown of 4 iterations) takes values that
training at 10 never shows. The retrain that draws K among 2-10 per episode and profiles up to 8x slower
(`min_interval_iterations: 2`, `profile_time_scale: [1, 8]`, shipped 2026-12-04, source 747896f) rebalances
there: keep 0.092, rebalance 0.907.
"""

import json
import sys

import numpy as np
import torch

from rlpipe.agents import make_policy
from rlpipe.calibration import header_costs
from rlpipe.decision import DecisionContext
from rlpipe.planning import MigrationCost
from rlpipe.runtime.config import PipelineConfig
from rlpipe.runtime.controller import Controller
from rlpipe.stats import IntervalStats, StageStats

FIELDS = ("compute_ms", "comm_ms", "idle_ms", "num_layers", "memory_bytes", "device_load")
KINDS = ("keep", "re-plan", "rebalance", "both")


def interval_stats(record: dict) -> IntervalStats:
    """The statistics the run's controller decided on, from the interval's log record."""
    stages = tuple(StageStats(**{k: int(s[k]) if k == "num_layers" else s[k] for k in FIELDS})
                   for s in record["stages"])
    hybrid = {}
    if record.get("replicas"):
        hybrid = {"replica_load": np.array([[s["device_load"] for s in r["stages"]] for r in record["replicas"]]),
                  "split": tuple(record["microbatch_split"]), "sync_ms": np.array(record["sync_ms"])}
    return IntervalStats.from_stages(record["iteration"], len(record["losses"]), record["interval_s"],
                                     record.get("stall_s", 0.0), tuple(record["boundaries"]), stages,
                                     compute_cv=np.array([s["compute_cv"] for s in record["stages"]]), **hybrid)


def main(log: str, spec: str = "ppo") -> None:
    records = [json.loads(line) for line in open(log)]
    header = records[0]["run"]
    controller = Controller(spec, header_costs(header).profile, header["stages"], header["schedule"],
                            header["microbatches"], MigrationCost(bandwidth_gbps=header["p2p_gbps"],
                                                          overhead_s=PipelineConfig.migration_overhead_s),
                            "dynpipe", header.get("data_parallel", 1))
    falcon, encoder = make_policy("falcon"), controller.encoder
    for record in records:
        if "iteration" not in record:
            continue
        stats = interval_stats(record)
        observation = encoder.observe(stats)
        split = stats.split or encoder.planner.even
        mask = encoder.action_mask(stats.boundaries, split)
        rule = falcon.act(observation, mask, DecisionContext(encoder, stats.boundaries, split=split))
        with torch.no_grad():
            logits = controller.policy.actor(torch.as_tensor(observation, dtype=torch.float32).unsqueeze(0))[0]
        logits[~torch.as_tensor(mask, dtype=torch.bool)] = -torch.inf
        probabilities = torch.softmax(logits, 0)[:4].numpy()
        logged = record.get("decision", {}).get("action", "-")
        rule_kind = KINDS[rule] if rule < len(KINDS) else "move"
        print(f"iteration {record['iteration']:4d}: logged {logged:<10} falcon {rule_kind:<9} "
              "policy " + " ".join(f"{kind} {p:.3f}" for kind, p in zip(KINDS, probabilities)))


if __name__ == "__main__":
    main(*sys.argv[1:])
