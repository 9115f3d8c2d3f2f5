"""The README's results table from the five `rlpipe evaluate` runs printed above it (not part of the package,
not tested).

Each cell: the policy's efficiency (the scenario's best rule, its efficiency, the policy minus it episode by
episode and that difference's 95% bootstrap interval, from `results.json`'s `vs_best_rule_*`). **below**
marks a mean more than 0.003 under the best rule. The last row compares the mean over the presets with the
envelope (the mean of the per-preset best rule); its interval combines the presets' as independent, each
preset's standard error taken as its interval's width over 3.92.

Run from the repository root: `.venv/bin/python docs/experiments/readme_table.py DIR [POLICY]`, where DIR holds
any of `2x1/`, `4x1/`, `8x1/`, `4x2/` and `4x4/`, each one `rlpipe evaluate --out` (POLICY: `ppo` by default;
the table has a column for each layout found).
"""

import json
import math
import sys
from pathlib import Path

LAYOUTS = [("2x1", "2 st x 1"), ("4x1", "4 st x 1"), ("8x1", "8 st x 1"), ("4x2", "4 st x 2"), ("4x4", "4 st x 4")]
BAR = 0.003


def cell(metrics: dict, best: dict) -> str:
    low, high = metrics["vs_best_rule_low"], metrics["vs_best_rule_high"]
    below = " **below**" if metrics["vs_best_rule_mean"] < -BAR else ""
    return (f"{metrics['efficiency_mean']:.4f} ({metrics['best_rule']} {best['efficiency_mean']:.4f}, "
            f"{metrics['vs_best_rule_mean']:+.4f} [{low:+.4f}, {high:+.4f}]){below}")


def envelope(scenarios: dict, policy: str) -> str:
    rows = [table[policy] for table in scenarios.values()]
    mean = sum(r["efficiency_mean"] for r in rows) / len(rows)
    best = sum(table[r["best_rule"]]["efficiency_mean"] for table, r in zip(scenarios.values(), rows)) / len(rows)
    error = math.sqrt(sum(((r["vs_best_rule_high"] - r["vs_best_rule_low"]) / 3.92) ** 2 for r in rows)) / len(rows)
    return f"{mean:.4f} (envelope {best:.4f}, {mean - best:+.4f} [{mean - best - 1.96 * error:+.4f}, " \
           f"{mean - best + 1.96 * error:+.4f}])"


if __name__ == "__main__":
    root, policy = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ppo"
    found = [(key, title) for key, title in LAYOUTS if (root / key / "results.json").exists()]
    runs = {key: json.loads((root / key / "results.json").read_text())["scenarios"] for key, _ in found}
    presets = list(runs[found[0][0]])
    print("| preset | " + " | ".join(title for _, title in found) + " |")
    print("|---" * (len(found) + 1) + "|")
    for preset in presets:
        cells = [cell(runs[key][preset][policy], runs[key][preset][runs[key][preset][policy]["best_rule"]])
                 for key, _ in found]
        print(f"| {preset} | " + " | ".join(cells) + " |")
    print("| mean | " + " | ".join(envelope(runs[key], policy) for key, _ in found) + " |")
