"""The simulated efficiency table: heuristics and the shipped PPO policy on the standard scenarios,
held-out seeds, every policy on the same episodes."""

from __future__ import annotations

from rlpipe.evaluate import evaluate, to_markdown, write_report

SCENARIOS = ["bursty", "heavy", "drift", "none", "light", "periodic"]
POLICIES = ["static", "greedy", "dynpipe", "ppo", "oracle"]


def run(episodes: int = 10, seed: int = 20261129) -> dict:
    results = evaluate(POLICIES, SCENARIOS, episodes=episodes, seed=seed, progress=True)
    write_report(results, "bench/policies")
    figures: dict = {"episodes": episodes, "seed": seed, "markdown": to_markdown(results)}
    for scenario, table in results["scenarios"].items():
        for policy, metrics in table.items():
            figures[f"{scenario}/{policy}/efficiency"] = metrics["efficiency_mean"]
    return figures
