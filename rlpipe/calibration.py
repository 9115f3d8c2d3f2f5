"""Calibration: what the simulator should assume, fitted from live run logs (``rlpipe calibrate``).

From the logs of live runs it fits the measurement model (how measured stage compute scatters
around the prediction: a global bias, each stage's persistent bias, lognormal noise and its outliers),
the overheads the simulator does not see (per operation and per iteration), the migration overhead
beyond bytes / bandwidth, and the point-to-point bandwidth. ``rlpipe train --calibration`` and
``rlpipe evaluate --calibration`` simulate with the fit; a live prediction can use it too
(:func:`calibrated_iteration_ms`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from rlpipe.errors import InputError
from rlpipe.fields import is_number
from rlpipe.files import read_json
from rlpipe.profile import LayerCost, LayerProfile
from rlpipe.runlog import MEBIBYTE, device_time_factors, run_headers, warmup_extra_s
from rlpipe.simulator import Overheads, PipelineCosts

OUTLIER_SIGMAS = 4.0  # a log ratio this many robust sigmas from its stage's bias is an outlier
MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma over its median absolute deviation


LIMITS = {"compute_bias": 100.0, "stage_bias_spread": 3.0, "noise_sigma": 3.0, "outlier_probability": 1.0,
          "outlier_scale": 100.0, "op_overhead_ms": 60_000.0, "op_overhead_fraction": 100.0,
          "iteration_overhead_ms": 3_600_000.0, "iteration_overhead_fraction": 100.0, "migration_overhead_s": 3600.0,
          "p2p_gbps": 1e6, "runs": 1e6, "intervals": 1e9, "measured_op_overhead_ms": 60_000.0,
          "measured_iteration_overhead_ms": 3_600_000.0}
"""The largest value a fit may hold (a file beyond one is damaged, and would overflow the simulator)."""
OPTIONAL = ("measured_op_overhead_ms", "measured_iteration_overhead_ms")  # absent from files written before them
NONE_ALLOWED = ("migration_overhead_s", *OPTIONAL)


@dataclass(frozen=True)
class Calibration:
    """The fit. Every figure is a plain number, so the JSON is readable and any tool can use it.

    Attributes:
        compute_bias: measured over predicted stage compute, minus 1: the median over every stage and
            interval (timer and sleep overshoot, or real compute that runs slower than its profile).
        stage_bias_spread: the standard deviation of the stages' persistent biases (each stage's median
            log ratio): how much stages differ for good, what training draws per episode.
        noise_sigma: lognormal sigma of an interval's measurement around its stage's bias (robust).
        outlier_probability: the fraction of measurements beyond ``OUTLIER_SIGMAS`` sigmas.
        outlier_scale: the median size of those outliers, as measured / expected - 1.
        op_overhead_ms: per forward or backward operation, beside compute (the schedule's Python,
            point-to-point calls), ms.
        op_overhead_fraction: ``op_overhead_ms`` over the mean operation's device time in the fitted
            runs (how training applies it to other models).
        iteration_overhead_ms: per iteration (optimizer step, gradient reset), ms.
        iteration_overhead_fraction: ``iteration_overhead_ms`` over the mean predicted iteration time.
        migration_overhead_s: a repartition's stall beyond its bytes over the bandwidth, median, s
            (``None``: no repartition in the logs).
        p2p_gbps: the median measured point-to-point bandwidth, Gbit/s.
        runs: logs fitted.
        intervals: intervals fitted.
        measured_op_overhead_ms: the part of ``op_overhead_ms`` the fitted runs measured at start-up (their
            headers' ``op_overhead_ms``, the mean over the intervals fitted), ms. A prediction for a run that
            measured its own adds to it only the rest, which the fit found beyond the measurement.
        measured_iteration_overhead_ms: the same for ``iteration_overhead_ms``: the optimizer step of the
            stage holding the most parameters, from the headers' ``optimizer_ms_per_mb``, ms. Both ``None``
            where the fitted logs measured nothing (runs of an rlpipe before the start-up measurements, or
            a file written then): the overheads are then used whole.
    """

    compute_bias: float
    stage_bias_spread: float
    noise_sigma: float
    outlier_probability: float
    outlier_scale: float
    op_overhead_ms: float
    op_overhead_fraction: float
    iteration_overhead_ms: float
    iteration_overhead_fraction: float
    migration_overhead_s: float | None
    p2p_gbps: float
    runs: int
    intervals: int
    measured_op_overhead_ms: float | None = None
    measured_iteration_overhead_ms: float | None = None

    @property
    def overheads(self) -> Overheads:
        return Overheads(self.op_overhead_ms, self.iteration_overhead_ms)

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """Read a calibration JSON; every problem is one :class:`InputError` naming the file and field."""
        data = read_json(path, "calibration file")
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a JSON object written by rlpipe calibrate")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data and f.name not in OPTIONAL:
                raise InputError(f"{path}: missing field '{f.name}'")
            value: Any = data.get(f.name)
            if value is None and f.name in NONE_ALLOWED:
                values[f.name] = None
                continue
            if not is_number(value):
                raise InputError(f"{path}: {f.name}: must be a finite number, got {value!r}")
            if value < 0 and f.name != "compute_bias":
                raise InputError(f"{path}: {f.name}: must be >= 0, got {value!r}")
            values[f.name] = value
        for name, limit in LIMITS.items():
            if values[name] is not None and values[name] > limit:
                raise InputError(f"{path}: {name}: {values[name]!r} is beyond any plausible fit (at most {limit:g})")
        if values["compute_bias"] <= -1:
            raise InputError(f"{path}: compute_bias: must be > -1, got {values['compute_bias']!r}")
        return cls(**values)


def header_costs(header: dict[str, Any], device_time_factor: float = 1.0) -> PipelineCosts:
    """The simulator's model of a logged run, from its header's per-layer device times (times
    ``device_time_factor``), activations and parameters (what a hybrid job's gradient sync moves)."""
    count = len(header["forward_ms"])
    activations = header.get("activation_bytes") or [0] * count
    params = header.get("param_bytes") or [0] * count
    layers = tuple(LayerCost(f"{i}", f, b, int(a), int(w), 0) for i, (f, b, a, w) in
                   enumerate(zip(header["forward_ms"], header["backward_ms"], activations, params, strict=True)))
    profile = LayerProfile("logged run", 1, layers)
    return PipelineCosts(profile if device_time_factor == 1.0 else profile.scaled(device_time_factor))


def measured_overheads(record: dict[str, Any], header: dict[str, Any], costs: PipelineCosts) -> Overheads:
    """What the run measured at start-up and its live prediction included, for this record's partition:
    the per-operation overhead, and per iteration the optimizer step of the stage holding the most
    parameters (zeros in a log from before these measurements)."""
    stage_mib = float(costs.stage_param_bytes(record["boundaries"]).max()) / MEBIBYTE
    return Overheads(header.get("op_overhead_ms") or 0.0, (header.get("optimizer_ms_per_mb") or 0.0) * stage_mib)


def simulate_record(record: dict[str, Any], header: dict[str, Any], compute_bias: float = 0.0,
                    overheads: Overheads | None = None, measured: bool = True,
                    device_time_factor: float = 1.0) -> float:
    """A logged interval's iteration time as the simulator sees it (its partition, micro-batch split, mean
    injected slowdowns, links at the measured bandwidth, a hybrid job's gradient sync), with a compute
    bias, ms. Overheads: ``overheads`` on top of what the run measured at start-up (``measured``: its
    :func:`measured_overheads` and its gradient sync's bandwidth, as its live prediction did).
    ``device_time_factor``: the record's device times over its header's (:func:`runlog.device_time_factors`)."""
    costs = header_costs(header, device_time_factor)
    split = record.get("microbatch_split") or [header["microbatches"]]
    devices = len(split) * header["stages"]
    slowdown = np.asarray(record.get("injected_slowdown") or np.ones(devices), dtype=float)
    base = measured_overheads(record, header, costs) if measured else Overheads()
    extra = overheads or Overheads()
    p2p_gbps = header.get("p2p_gbps") or math.inf
    return costs.simulate_hybrid(record["boundaries"], header["schedule"], split,
                                 (slowdown * (1 + compute_bias)).reshape(len(split), header["stages"]), p2p_gbps,
                                 overheads=Overheads(base.op_ms + extra.op_ms, base.iteration_ms + extra.iteration_ms),
                                 dp_bandwidth_gbps=(header.get("sync_gbps") if measured else None) or p2p_gbps
                                 ).iteration_ms


def replayed_iteration_ms(records: list[dict[str, Any]], compute_bias: float = 0.0, overheads: Overheads | None = None,
                          measured: bool = True) -> list[float | None]:
    """:func:`simulate_record` for every record of a log (``None`` for one without a header to predict from)."""
    return [simulate_record(record, header, compute_bias, overheads, measured, factor) if header else None
            for record, header, factor in zip(records, run_headers(records), device_time_factors(records), strict=True)]


@dataclass
class _Interval:
    """One logged interval, as the fit needs it."""

    run: int
    record: dict[str, Any]
    header: dict[str, Any]
    device_time_factor: float
    log_ratios: np.ndarray  # per stage: log(measured / predicted compute)

    def simulate(self, compute_bias: float = 0.0, overheads: Overheads | None = None, measured: bool = True) -> float:
        return simulate_record(self.record, self.header, compute_bias, overheads, measured, self.device_time_factor)

    @property
    def measured(self) -> Overheads:
        return measured_overheads(self.record, self.header, header_costs(self.header, self.device_time_factor))


def _intervals(runs: list[list[dict[str, Any]]], names: list[str]) -> list[_Interval]:
    """The intervals a fit can use: those logged with a prediction (their ``iteration_ms`` and the
    prediction both leave warm-up steps out)."""
    found = []
    for index, records in enumerate(runs):
        for record, header, factor in zip(records, run_headers(records), device_time_factors(records), strict=True):
            if "predicted_iteration_ms" not in record or not header:
                continue
            measured = np.array([s["compute_ms"] for s in record["stages"]], dtype=np.float64)
            predicted = np.array(record["predicted_compute_ms"], dtype=np.float64)  # (an int past int64 is no object)
            with np.errstate(all="ignore"):
                interval = _Interval(index, record, header, factor, np.log(measured / predicted))
            figures = [record["iteration_ms"], interval.simulate(), *interval.log_ratios]
            # a field past what any run produces (1e308 ms, a zero prediction) would poison the fit with inf
            if not (np.all(np.isfinite(figures)) and 0 < record["iteration_ms"] < 1e9):
                raise InputError(f"{names[index]}: iteration {record['iteration']}: times no run produces "
                                 f"(iteration_ms, compute_ms, predicted_compute_ms or the header's layer times)")
            found.append(interval)
    return found


def fit(runs: list[list[dict[str, Any]]], sources: list[str] | None = None) -> Calibration:
    """Fit a :class:`Calibration` to the records of one or more live runs (``runlog.load_run``).

    The overheads are fitted on what each interval's simulation, with the overheads its run measured at
    start-up, leaves unexplained: the fit finds what lies beyond those measurements, and the calibration
    holds the whole (measured mean plus the rest) for models and runs that measured nothing."""
    names = sources or [f"run {i}" for i in range(len(runs))]
    if any("run" not in records[0] for records in runs):
        missing = next(n for n, records in zip(names, runs, strict=True) if "run" not in records[0])
        raise InputError(f"{missing}: no run header in its first record (a log of an older rlpipe run?)")
    intervals = _intervals(runs, names)
    if len(intervals) < 3:
        raise InputError(f"{', '.join(names)}: {len(intervals)} usable intervals (need at least 3 with a "
                         f"prediction and no repartition, after each run's first)")
    log_ratios = np.concatenate([i.log_ratios for i in intervals])
    compute_bias = float(np.exp(np.median(log_ratios)) - 1)
    stage_bias, residuals = _stage_biases(intervals)
    noise_sigma = float(MAD_TO_SIGMA * np.median(np.abs(residuals)))
    outliers = np.abs(residuals) > OUTLIER_SIGMAS * max(noise_sigma, 1e-6)
    outlier_scale = float(np.median(np.expm1(np.abs(residuals[outliers])))) if outliers.any() else 0.0
    extra_op_ms, extra_iteration_ms = _overheads(intervals, compute_bias)
    measured = [i.measured for i in intervals]
    measured_op_ms = float(np.mean([m.op_ms for m in measured]))
    measured_iteration_ms = float(np.mean([m.iteration_ms for m in measured]))
    op_ms, iteration_ms = measured_op_ms + extra_op_ms, measured_iteration_ms + extra_iteration_ms
    bare = np.array([i.simulate(measured=False) for i in intervals])  # the pipeline alone
    all_records = [record for records in runs for record in records]
    headers = [record["run"] for record in all_records if "run" in record]
    # a stage's forward or backward operation, on average: the model's device time over 2 x stages
    op_time_ms = float(np.mean([(sum(h["forward_ms"]) + sum(h["backward_ms"])) / (2 * h["stages"]) for h in headers]))
    measured_any = any(m.op_ms or m.iteration_ms for m in measured)
    return Calibration(
        compute_bias=compute_bias, stage_bias_spread=float(np.std(stage_bias)), noise_sigma=noise_sigma,
        outlier_probability=float(outliers.mean()), outlier_scale=outlier_scale,
        op_overhead_ms=op_ms, op_overhead_fraction=op_ms / max(op_time_ms, 1e-9),
        iteration_overhead_ms=iteration_ms, iteration_overhead_fraction=iteration_ms / float(np.mean(bare)),
        migration_overhead_s=_migration_overhead_s(all_records),
        p2p_gbps=float(np.median([r["p2p_gbps"] for r in all_records if r.get("p2p_gbps")] or [0.0])),
        runs=len(runs), intervals=len(intervals),
        measured_op_overhead_ms=measured_op_ms if measured_any else None,
        measured_iteration_overhead_ms=measured_iteration_ms if measured_any else None)


def _stage_biases(intervals: list[_Interval]) -> tuple[np.ndarray, np.ndarray]:
    """Each (run, stage)'s persistent bias (its median log ratio) and every measurement's residual from it."""
    by_stage: dict[tuple[int, int], list[float]] = {}
    for interval in intervals:
        for stage, value in enumerate(interval.log_ratios):
            by_stage.setdefault((interval.run, stage), []).append(float(value))
    biases = {key: float(np.median(values)) for key, values in by_stage.items()}
    residuals = [value - biases[key] for key, values in by_stage.items() for value in values]
    return np.array(list(biases.values())), np.array(residuals)


def _overheads(intervals: list[_Interval], compute_bias: float) -> tuple[float, float]:
    """Least squares for (per-operation, per-iteration) overhead beyond what the runs measured, both >= 0,
    on what the biased prediction with those measurements leaves unexplained:
    live - predicted = op_ms x slope + iteration_ms."""
    predicted = np.array([i.simulate(compute_bias) for i in intervals])
    unexplained = np.array([i.record["iteration_ms"] for i in intervals]) - predicted
    slopes = np.array([i.simulate(compute_bias, Overheads(op_ms=1.0)) for i in intervals]) - predicted
    keep = np.ones(len(intervals), dtype=bool)
    for _ in range(2):  # refit once without the intervals the first fit explains worst (> 3 MADs)
        design = np.column_stack([slopes[keep], np.ones(keep.sum())])
        (op_ms, iteration_ms), *_ = np.linalg.lstsq(design, unexplained[keep], rcond=None)
        if op_ms < 0 or iteration_ms < 0:  # one of them explains nothing: fit the other alone
            op_ms = max(float(np.sum(slopes[keep] * unexplained[keep]) / np.sum(slopes[keep] ** 2)), 0.0)
            iteration_ms = 0.0
            if op_ms == 0.0:
                iteration_ms = max(float(np.mean(unexplained[keep])), 0.0)
        residual = unexplained - (op_ms * slopes + iteration_ms)
        mad = np.median(np.abs(residual - np.median(residual))) + 1e-12
        keep = np.abs(residual - np.median(residual)) <= 3 * MAD_TO_SIGMA * mad
    return float(op_ms), float(iteration_ms)


def _migration_overhead_s(records: list[dict[str, Any]]) -> float | None:
    """What a repartition costs beyond moving its bytes at the measured bandwidth: the rest of its
    stall, plus its new stage's warm-up step beyond an ordinary iteration (shape inference)."""
    extra = []
    for record in records:
        moved = record.get("repartition")
        if not moved or not moved.get("committed") or not record.get("p2p_gbps") or "repartitions" in record:
            continue
        extra.append(moved["stall_s"] + warmup_extra_s(record) - moved["bytes_moved"] * 8 / (record["p2p_gbps"] * 1e9))
    return max(float(np.median(extra)), 0.0) if extra else None


def calibrated_iteration_ms(records: list[dict[str, Any]], calibration: Calibration) -> list[float | None]:
    """Each record's iteration time as the calibrated simulator predicts it: device times x (1 + the
    fitted compute bias), for the record's partition and mean injected slowdowns, with the overheads its
    run measured at start-up plus what the fit found beyond such measurements (the fitted overheads
    whole where the fit or the run measured none); ``None`` for a record without a header."""
    c = calibration
    beyond = None
    if c.measured_op_overhead_ms is not None and c.measured_iteration_overhead_ms is not None:
        beyond = Overheads(c.op_overhead_ms - c.measured_op_overhead_ms,
                           c.iteration_overhead_ms - c.measured_iteration_overhead_ms)
    predicted: list[float | None] = []
    for record, header, factor in zip(records, run_headers(records), device_time_factors(records), strict=True):
        if not header:
            predicted.append(None)
        elif beyond is not None and "op_overhead_ms" in header:  # the run measured its own
            predicted.append(simulate_record(record, header, c.compute_bias, beyond, True, factor))
        else:
            predicted.append(simulate_record(record, header, c.compute_bias, c.overheads, False, factor))
    return predicted
