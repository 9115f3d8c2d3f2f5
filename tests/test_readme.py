"""The README's quick-start block runs as written (from a folder that has the repository's configs)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("# quick-start\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    assert len(quick_start_commands()) >= 6


@pytest.mark.slow
def test_quick_start_runs_as_written(tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for command in quick_start_commands():
        result = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, f"{command}\n{result.stderr[-2000:]}"
    out = tmp_path / "out"
    assert (out / "eval" / "results.md").exists() and (out / "report" / "timeline.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configs", "out"]  # nothing lands beside out/
    assert "out/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.slow
def test_own_script_runs_under_torchrun(tmp_path):
    text = (ROOT / "README.md").read_text()
    script = text.split("# own-script\n", 1)[1].split("```", 1)[0]
    (tmp_path / "own_script.py").write_text(script)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    result = subprocess.run([torchrun, "--nproc-per-node", "2", "own_script.py"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    saved = [torch.load(tmp_path / f"pipeline-rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert sum(len(s["layers"]) for s in saved) == 6  # three Linear layers' weights and biases, split over the ranks
