"""Live-run logs: JSONL, one record per interval (what ``rlpipe run --log`` writes), read back
with every problem named by file and line.

The first record a run writes (and the first after each resume) carries a ``run`` header: the
schedule, micro-batches, stages, the device-time mode and scale, whether stage processes outnumbered
cores, and each layer's device time (``forward_ms`` / ``backward_ms``), which is what the simulator
needs to predict the run again (``rlpipe calibrate``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlpipe.errors import InputError
from rlpipe.fields import describe, fits
from rlpipe.files import read_text

INVALID_OVERRUN_FRACTION = 0.05
"""With emulated device time, a run where more than this fraction of compute chunks overran their
emulated time measured the host rather than the profile: its emulation did not hold."""

REQUIRED_FIELDS = ("iteration", "wall_s", "boundaries", "throughput_samples_s", "stages")


Number = float  # a finite number (an integer is one too)
RECORD_FIELDS: dict[str, Any] = {
    "iteration": int, "wall_s": Number, "interval_s": Number, "iteration_ms": Number, "warmup_s": Number,
    "warmup_iterations": int, "boundaries": list[int], "throughput_samples_s": Number, "loss": Number | None,
    "losses": list[Number], "stages": list[dict], "stall_s": Number, "p2p_gbps": Number,
    "predicted_iteration_ms": Number, "predicted_compute_ms": list[Number], "run": dict, "emulation": dict,
    "injected_slowdown": list[Number],
    "trace_time_s": Number, "decision": dict, "fallbacks": dict, "repartition": dict, "repartitions": list[dict],
    "replicas": list[dict], "microbatch_split": list[int], "sync_ms": list[Number], "rebalance": dict,
    "device_time_scale": Number,
}
STAGE_FIELDS: dict[str, Any] = {
    "compute_ms": Number, "comm_ms": Number, "idle_ms": Number, "num_layers": int, "memory_bytes": Number,
    "device_load": Number, "resident_param_bytes": int, "rss_bytes": int, "gpu_utilization": Number,
    "gpu_memory_bytes": int, "compute_cv": Number, "sync_ms": Number, "device_allocated_bytes": int,
    "tail_load": Number,
}
MEBIBYTE = 2**20  # the unit of a header's optimizer_ms_per_mb (ms per MiB of a stage's parameters)
HEADER_FIELDS: dict[str, Any] = {
    "stages": int, "schedule": str, "microbatches": int, "interval": int, "policy": str | None,
    "interference": str | None, "inject": str | None, "time_scale": Number, "device_time": str,
    "device_time_scale": Number, "oversubscribed": bool, "processes": int, "cores": int, "p2p_gbps": Number,
    "op_overhead_ms": Number, "sync_gbps": Number | None, "optimizer_ms_per_mb": Number,
    "forward_ms": list[Number], "backward_ms": list[Number],
    "activation_bytes": list[Number], "param_bytes": list[Number], "data_parallel": int,
    "microbatch_split": list[int], "profile_id": str, "profile_source": str, "first_iteration": int,
    "transport": str, "device": str,
}
PART_FIELDS: dict[str, dict[str, Any]] = {
    "emulation": {"chunks": int, "overran": int},
    "decision": {"action": str, "latency_ms": Number, "reason": str, "fallback": str},
    "repartition": {"iteration": int, "from": list[int], "to": list[int], "committed": bool, "bytes_moved": int,
                    "stall_s": Number},
    "rebalance": {"iteration": int, "from": list[int], "to": list[int]},
}
PART_REQUIRED = {"emulation": ("chunks", "overran"), "decision": ("action", "latency_ms"),
                 "repartition": ("from", "to", "bytes_moved", "stall_s"), "rebalance": ("from", "to")}
RECORD_REQUIRES = {"predicted_iteration_ms": ("iteration_ms", "predicted_compute_ms"),
                   "predicted_compute_ms": ("iteration_ms", "predicted_iteration_ms"), "repartition": ("p2p_gbps",)}


def load_run(path: str | Path) -> list[dict[str, Any]]:
    """The records of one run log; a malformed line is an error naming the file, line and field."""
    path = Path(path)
    lines = read_text(path, "run log").splitlines()
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if not records and _is_json_document("\n".join(lines)):
                raise InputError(f"{path}: a JSON document, not a run log (one JSON record per line, as "
                                 f"'rlpipe run --log' writes)") from None
            raise InputError(f"{where}: not JSON ({err.msg})") from None
        except RecursionError:
            raise InputError(f"{where}: not JSON (nested too deeply)") from None
        if not isinstance(record, dict):
            raise InputError(f"{where}: expected a JSON object (one interval's record)")
        missing = [k for k in REQUIRED_FIELDS if k not in record]
        if missing:
            raise InputError(f"{where}: missing field(s) {', '.join(missing)}")
        check_record(record, where)
        records.append(record)
    if not records:
        raise InputError(f"{path}: no records")
    return records


def _is_json_document(text: str) -> bool:
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


def check_record(record: dict[str, Any], where: str) -> None:
    """Types, signs and shapes of one record's fields (unknown fields pass: newer logs may add some)."""
    _check_fields(record, RECORD_FIELDS, where)
    boundaries = record["boundaries"]
    if not boundaries or boundaries[0] != 0 or any(b <= a for a, b in zip(boundaries, boundaries[1:])):
        raise InputError(f"{where}: boundaries: expected increasing first layers from 0, got {boundaries}")
    if len(record["stages"]) != len(boundaries):
        raise InputError(f"{where}: stages: {len(record['stages'])} entries for {len(boundaries)} boundaries")
    for i, stage in enumerate(record["stages"]):
        _check_fields(stage, STAGE_FIELDS, f"{where}: stages[{i}]", required=("compute_ms", "num_layers"))
        if stage.get("num_layers", 1) < 1:
            raise InputError(f"{where}: stages[{i}].num_layers: must be >= 1")
    if "run" in record:
        _check_header(record["run"], boundaries, f"{where}: run")
    for key, spec in PART_FIELDS.items():
        if key in record:
            _check_fields(record[key], spec, f"{where}: {key}", required=PART_REQUIRED[key])
    for i, part in enumerate(record.get("repartitions", [])):
        _check_fields(part, PART_FIELDS["repartition"], f"{where}: repartitions[{i}]",
                      required=PART_REQUIRED["repartition"])
    for key, needed in RECORD_REQUIRES.items():
        lacking = [other for other in needed if other not in record]
        if key in record and lacking:
            raise InputError(f"{where}: {key} without {', '.join(lacking)}")
    _check_replicas(record, where)
    if record["iteration"] < 0:
        raise InputError(f"{where}: iteration: must be >= 0")


def _check_replicas(record: dict[str, Any], where: str) -> None:
    """Every replica's per-stage figures, and the fields sized by stages or devices."""
    boundaries = record["boundaries"]
    replicas = record.get("replicas", [{"stages": record["stages"]}])
    for r, replica in enumerate(replicas):
        _check_fields(replica, {"microbatches": int, "stages": list[dict]}, f"{where}: replicas[{r}]",
                      required=("stages",))
        if len(replica["stages"]) != len(boundaries):
            raise InputError(f"{where}: replicas[{r}].stages: {len(replica['stages'])} entries for "
                             f"{len(boundaries)} boundaries")
        for i, stage in enumerate(replica["stages"]):
            _check_fields(stage, STAGE_FIELDS, f"{where}: replicas[{r}].stages[{i}]", required=("compute_ms",))
    # the prediction a calibration divides by has an entry per stage, always; the others may be logged empty
    for key, count, may_be_empty in (("predicted_compute_ms", len(boundaries), False),
                                     ("sync_ms", len(boundaries), True),
                                     ("injected_slowdown", len(boundaries) * len(replicas), True),
                                     ("microbatch_split", len(replicas), True)):
        if key in record and (record[key] or not may_be_empty) and len(record[key]) != count:
            raise InputError(f"{where}: {key}: {len(record[key])} entries, expected {count}")


def _check_header(header: dict[str, Any], boundaries: list[int], where: str) -> None:
    _check_fields(header, HEADER_FIELDS, where, required=("stages", "schedule", "microbatches", "forward_ms",
                                                          "backward_ms"))
    lengths = {len(header[key]) for key in ("forward_ms", "backward_ms", "activation_bytes", "param_bytes")
               if key in header}
    if len(lengths) > 1 or any(n < boundaries[-1] + 1 for n in lengths):
        raise InputError(f"{where}: forward_ms, backward_ms, activation_bytes and param_bytes need one entry per layer")
    if header["stages"] != len(boundaries) or header["microbatches"] < 1:
        raise InputError(f"{where}: stages must match the boundaries and microbatches be >= 1")


def _check_fields(values: Any, spec: dict[str, Any], where: str, required: tuple[str, ...] = ()) -> None:
    if not isinstance(values, dict):
        raise InputError(f"{where}: expected a JSON object")
    missing = [key for key in required if key not in values]
    if missing:
        raise InputError(f"{where}: missing field(s) {', '.join(missing)}")
    for key, hint in spec.items():
        if key in values and not fits(values[key], hint):
            raise InputError(f"{where}: {key}: expected {describe(hint)}, got {str(values[key])[:60]}")
        if key in values and hint in (Number, int) and values[key] < 0:
            raise InputError(f"{where}: {key}: must be >= 0, got {values[key]}")
    for key, value in values.items():  # the values of unknown fields: no NaN or infinity either
        if key not in spec and isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{where}: {key}: must be finite, got {value}")


def run_headers(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``run`` header of every record, from the latest one at or before it (``{}`` if none)."""
    headers: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for record in records:
        current = record.get("run", current)
        headers.append(current)
    return headers


def device_time_factors(records: list[dict[str, Any]]) -> list[float]:
    """Each record's device times over its header's: 1.0 unless the run emulated slower devices on a busy
    host (a record that says a new ``device_time_scale`` was itself run at the old one; those after it at
    the new one, until the next header)."""
    factors: list[float] = []
    header_scale = scale = 1.0
    for record in records:
        if "run" in record:
            header_scale = scale = record["run"].get("device_time_scale") or 1.0
        factors.append(scale / header_scale)
        scale = record.get("device_time_scale", scale)
    return factors


def warmup_extra_s(record: dict[str, Any]) -> float:
    """What an interval's warm-up steps (a new stage's first, which infers shapes) took beyond as many
    ordinary iterations, s: the part of the interval no simulated iteration accounts for. A log from
    before ``warmup_iterations`` was recorded counts one step when it has warm-up time."""
    steps = record.get("warmup_iterations", 1 if record.get("warmup_s", 0.0) > 0 else 0)
    return max(record.get("warmup_s", 0.0) - steps * record.get("iteration_ms", 0.0) / 1e3, 0.0)
