"""Live-run logs: JSONL, one record per interval (what ``rlpipe run --log`` writes), read back
with every problem named by file and line.

The first record a run writes (and the first after each resume) carries a ``run`` header: the
schedule, micro-batches, stages, the device-time mode and scale, whether stage processes outnumbered
cores, and each layer's device time (``forward_ms`` / ``backward_ms``), which is what the simulator
needs to predict the run again (``rlpipe calibrate``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlpipe.errors import InputError

INVALID_OVERRUN_FRACTION = 0.05
"""With emulated device time, a run where more than this fraction of compute chunks overran their
emulated time measured the host rather than the profile: its emulation did not hold."""

REQUIRED_FIELDS = ("iteration", "wall_s", "boundaries", "throughput_samples_s", "stages")


def load_run(path: str | Path) -> list[dict[str, Any]]:
    """The records of one run log; a malformed line is an error naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such run log") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: line {number}: not JSON ({err.msg})") from None
        missing = [k for k in REQUIRED_FIELDS if k not in record]
        if missing:
            raise InputError(f"{path}: line {number}: missing field(s) {', '.join(missing)}")
        records.append(record)
    if not records:
        raise InputError(f"{path}: no records")
    return records


def run_headers(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``run`` header of every record, from the latest one at or before it (``{}`` if none)."""
    headers: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for record in records:
        current = record.get("run", current)
        headers.append(current)
    return headers
