"""Plot conventions shared by every figure rlpipe writes (evaluate, report, demo).

One colour per policy in every figure (categorical), one colour per pipeline stage (a sequential
palette, so never mistaken for a policy); partitions drawn as stacked stage sizes over time (which
stage holds how many layers); repartitions marked by dashed vertical lines with a legend entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    from matplotlib.figure import Figure

POLICY_COLOURS = {"static": "#7f7f7f", "greedy": "#ff7f0e", "dynpipe": "#1f77b4", "threshold": "#9467bd",
                  "ppo": "#d62728", "oracle": "#2ca02c"}
OTHER_COLOURS = ["#8c564b", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#637939"]
REPARTITION_STYLE = {"color": "black", "lw": 0.8, "ls": "--", "alpha": 0.7}


def use_agg() -> Any:
    """pyplot on the file-only backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: Path, dpi: int = 100) -> None:
    """Lay out, write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def policy_colour(name: str, index: int = 0) -> str:
    """The colour of a policy (or a run named after one: ``ppo``, ``ppo-2``, ``ppo:PATH``)."""
    key = name.split(":")[0].split("-")[0].split("_")[0]
    return POLICY_COLOURS.get(key, OTHER_COLOURS[index % len(OTHER_COLOURS)])


def stage_colours(num_stages: int) -> list:
    """One colour per stage, from a sequential palette (distinct from the policies' colours)."""
    import matplotlib

    palette = matplotlib.colormaps["viridis"]
    return [palette(x) for x in np.linspace(0.15, 0.9, max(num_stages, 1))]


def plot_partitions(ax: Any, starts: ArrayLike, end: float, boundaries: Sequence[Sequence[int]],
                    num_layers: int, colours: list) -> None:
    """Stacked stage sizes: from ``starts[i]`` (to the next start, the last to ``end``) the pipeline ran
    ``boundaries[i]``; stage s is the band of its layers, bottom to top."""
    from matplotlib.ticker import MaxNLocator

    x = np.append(np.asarray(starts, dtype=float), end)
    edges = np.array([list(b) + [num_layers] for b in boundaries], dtype=float)
    edges = np.vstack([edges, edges[-1]])  # the last partition holds until the end
    for stage in range(edges.shape[1] - 1):
        ax.fill_between(x, edges[:, stage], edges[:, stage + 1], step="post", color=colours[stage],
                        label=f"stage {stage}", lw=0)
    ax.set_ylim(0, num_layers)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # layers come whole
    ax.set_ylabel("layers held\n(stacked by stage)")


def mark_repartitions(ax: Any, times: Sequence[float]) -> None:
    """Dashed vertical lines at repartitions, with one legend entry."""
    for k, time in enumerate(times):
        ax.axvline(time, label="repartition" if k == 0 else None, **REPARTITION_STYLE)


def plot_slowdowns(ax: Any, starts: ArrayLike, end: float, slowdowns: np.ndarray, stages: int, what: str) -> None:
    """Each device's slowdown, one line per device: ``slowdowns[i]`` (sampled at the end of interval i, device
    r x ``stages`` + s is replica r's stage s) drawn from ``starts[i]`` to the next start (the last to ``end``)."""
    x = np.append(np.asarray(starts, dtype=float), end)
    values = np.asarray(slowdowns, dtype=float)
    values = np.vstack([values, values[-1]])
    devices = values.shape[1]
    colours = stage_colours(devices)
    for device in range(devices):
        label = f"stage {device}" if devices <= stages else f"replica {device // stages}, stage {device % stages}"
        ax.step(x, values[:, device], where="post", color=colours[device], lw=1.2, label=label)
    ax.set_ylabel(f"{what} slowdown\n(x, 1 = undisturbed)")
    ax.set_ylim(bottom=min(0.95, float(values.min()) - 0.05))
