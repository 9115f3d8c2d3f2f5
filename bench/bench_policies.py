"""The simulated acceptance of the learned policy: every rule, the shipped PPO policy and the oracle on
every training preset, on held-out seeds, every policy on the same episodes, for one pipeline of 2, 4 and
8 stages and for 4-stage jobs of 2 and 4 replicas. With best = the best of static, greedy, dynpipe,
threshold and falcon on that preset and layout (the published rules; `falcon-early`, ours and the policy's
teacher, is shown beside them), the bars are:

- everywhere: ppo >= best - 0.003;
- the envelope: ppo's mean over the presets >= the mean of the per-preset best rule;
- where slowdowns last (heavy, drift, persistent, mixed): ppo closes at least half the gap from best
  to the oracle;
- holding on noise (none, seqlen): ppo makes at most one repartition per simulated hour and stays
  within 0.002 of static.

Each layout is one ``rlpipe evaluate`` command (printed with its table); the layouts run side by side,
one process per core.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from rlpipe.envs import EnvConfig
from rlpipe.evaluate import evaluate
from rlpipe.observation import DEFAULT_D_MAX, DEFAULT_S_MAX

RULES = ["static", "greedy", "dynpipe", "threshold", "falcon"]  # the "best rule": the published rules
POLICIES = [*RULES, "falcon-early", "ppo", "oracle"]  # falcon-early, ours and the policy's teacher: shown, not in best
PRESETS = ["none", "light", "heavy", "bursty", "drift", "periodic", "jitter", "persistent", "seqlen", "network",
           "mixed"]
LAYOUTS = [(2, 1), (4, 1), (8, 1), (4, 2), (4, 4)]  # (stages, replicas)
HALF_GAP = ("heavy", "drift", "persistent", "mixed")
HOLD = ("none", "seqlen")
EPISODES, SEED = 6, 4242


def command(stages: int, replicas: int, episodes: int, seed: int) -> str:
    return (f"rlpipe evaluate --policies {','.join(POLICIES)} --scenarios {','.join(PRESETS)} --episodes {episodes} "
            f"--seed {seed} --stages {stages} --data-parallel {replicas} --out OUT")


def checks(scenario: str, table: dict[str, dict[str, float]]) -> dict:
    """The bars one preset is held to."""
    efficiency = {p: m["efficiency_mean"] for p, m in table.items()}
    best_name = max(RULES, key=lambda p: efficiency[p])
    best, ppo, oracle = efficiency[best_name], efficiency["ppo"], efficiency["oracle"]
    row = {"best_rule": best_name, "best": best, "ppo": ppo, "oracle": oracle, "ppo_minus_best": ppo - best,
           "within_0_003": bool(ppo >= best - 0.003), "efficiency": efficiency,
           "repartitions_per_hour": {p: m["repartitions_per_hour"] for p, m in table.items()},
           "rebalances_per_hour": {p: m["rebalances_per_hour"] for p, m in table.items()}}
    if scenario in HALF_GAP:
        row["half_gap_target"] = best + (oracle - best) / 2
        row["closes_half_the_gap"] = bool(ppo >= row["half_gap_target"])
    if scenario in HOLD:
        row["holds"] = bool(table["ppo"]["repartitions_per_hour"] <= 1.0 and ppo >= efficiency["static"] - 0.002)
    return row


def layout(stages: int, replicas: int, episodes: int = EPISODES, seed: int = SEED) -> dict:
    """One layout's evaluation and its bars."""
    config = EnvConfig(min_stages=stages, max_stages=stages, s_max=max(DEFAULT_S_MAX, stages),
                       data_parallel=(replicas, replicas), d_max=max(DEFAULT_D_MAX, replicas)).validate()
    found = evaluate(POLICIES, PRESETS, episodes=episodes, seed=seed, config=config, progress=False)
    rows = {scenario: checks(scenario, table) for scenario, table in found["scenarios"].items()}
    envelope = float(np.mean([r["best"] for r in rows.values()]))
    ppo_mean = float(np.mean([r["ppo"] for r in rows.values()]))
    return {"stages": stages, "replicas": replicas, "command": command(stages, replicas, episodes, seed),
            "presets": rows, "envelope": envelope, "ppo_mean": ppo_mean, "envelope_met": bool(ppo_mean >= envelope),
            "all_met": bool(ppo_mean >= envelope and all(
                r["within_0_003"] and r.get("closes_half_the_gap", True) and r.get("holds", True)
                for r in rows.values()))}


def layout_markdown(found: dict) -> str:
    lines = [f"**{found['stages']} stages x {found['replicas']} replica(s)** (`{found['command']}`):", "",
             "| preset | " + " | ".join(POLICIES) + " | ppo - best rule | bars |", "|---" * (len(POLICIES) + 3) + "|"]
    for scenario, r in found["presets"].items():
        best = max(r["efficiency"][p] for p in RULES)
        cells = [f"**{r['efficiency'][p]:.4f}**" if p in RULES and r["efficiency"][p] == best
                 else f"{r['efficiency'][p]:.4f}" for p in POLICIES]
        bars = [f"within 0.003: {'yes' if r['within_0_003'] else 'NO'}"]
        if "closes_half_the_gap" in r:
            bars.append(f"half the gap ({r['half_gap_target']:.4f}): {'yes' if r['closes_half_the_gap'] else 'NO'}")
        if "holds" in r:
            bars.append(f"holds ({r['repartitions_per_hour']['ppo']:.1f}/h): {'yes' if r['holds'] else 'NO'}")
        lines.append(f"| {scenario} | " + " | ".join(cells) + f" | {r['ppo_minus_best']:+.4f} | {'; '.join(bars)} |")
    lines += ["", f"Mean over the presets: ppo {found['ppo_mean']:.4f}, the per-preset best rule "
              f"{found['envelope']:.4f} (the envelope): {'met' if found['envelope_met'] else 'NOT met'}. "
              "Bold: the best rule."]
    return "\n".join(lines)


def run(episodes: int = EPISODES, seed: int = SEED) -> dict:
    with ProcessPoolExecutor(max_workers=max(1, min(len(LAYOUTS), len(os.sched_getaffinity(0))))) as pool:
        futures = [pool.submit(layout, stages, replicas, episodes, seed) for stages, replicas in LAYOUTS]
        layouts = [future.result() for future in futures]
    figures: dict = {"episodes": episodes, "seed": seed,
                     "layouts": {f"{f['stages']}x{f['replicas']}": f for f in layouts},
                     "all_met": all(f["all_met"] for f in layouts)}
    figures["markdown"] = "\n\n".join(layout_markdown(f) for f in layouts)
    return figures

