"""The README's quick-start block runs as written (from a folder that has the repository's configs)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

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
