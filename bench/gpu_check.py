"""``make gpu-check``: the CUDA path, proven on the GPUs of this host, one or more. With fewer GPUs than
stage processes the processes share them (the host-staged transport, rlpipe/runtime/transport.py).

Checks, each a row of one summary table:
- 2 and 4 stage processes, with and without live repartitions, and a 2 x 2 hybrid job with repartitions
  and a rebalance, under AdamW: every step's loss equals a single-process CUDA reference within 1e-4;
- each process's ``torch.cuda.memory_allocated`` holds its stage only: within 10% of its layers'
  parameter, gradient and AdamW state bytes, before and after a move (activations are freed by then);
- a repartition's stall against its floor (bytes moved over the measured bandwidth between compute
  devices, through the host when staged), reported (it fails only if a move did not commit);
- ``rlpipe run --policy ppo`` under an injected straggler moves layers and completes.

Exits 1 if any check fails. A host without a CUDA GPU gets one line saying so, and exit 0.

    python -m bench.gpu_check [--out FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LOOP = ROOT / "bench" / "gpu_loop.py"
# small cuBLAS workspaces: deterministic kernels, and memory_allocated that is the stage's own
ENV = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "128", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
LOSS_TOLERANCE, MEMORY_TOLERANCE = 1e-4, 0.10
# Even layers are the linears: every move carries parameters and AdamW state. Every stage keeps a
# 2048-wide linear (67 MB of state): a process also holds cuBLAS's workspaces (256 KiB as ENV sets
# them), which 10% of the 0.5 MB head alone could not absorb.
MOVES = {2: ["3:0,4", "6:0,12", "8:0,6"], 4: ["3:0,2,6,10", "6:0,6,10,12", "8:0,4,8,12"]}
HYBRID = ["dp=2", "3:0,4", "5:split=3,5", "8:0,10"]


def command(args: list[str], timeout_s: float = 90) -> subprocess.CompletedProcess:
    """Run ``args`` from the repository root; a run past ``timeout_s`` is killed with every process it
    started (torchrun's workers too) and counts as failed."""
    started = time.perf_counter()
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
                          start_new_session=True) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            stdout, stderr = child.communicate()
            stderr += f"\ngpu-check: killed after {timeout_s:.0f} s"
    result = subprocess.CompletedProcess(args, child.returncode, stdout, stderr)
    print(f"  {' '.join(args[1:6])} ... exit {result.returncode} in {time.perf_counter() - started:.0f} s", flush=True)
    if result.returncode != 0:
        print(result.stderr[-3000:], file=sys.stderr, flush=True)
    return result


def loop(out: Path, processes: int, *options: str) -> dict:
    """One run of bench/gpu_loop.py: its losses, each rank's held memory and its log."""
    result = command([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                      str(processes), str(LOOP), str(out), *options])
    if result.returncode != 0:
        return {}
    return {"losses": json.loads(out.read_text())["losses"],
            "ranks": [json.loads(Path(f"{out}.rank{r}.json").read_text())["held"] for r in range(processes)],
            "log": [json.loads(line) for line in Path(f"{out}.log.jsonl").read_text().splitlines()]}


def layer_state_bytes() -> list[int]:
    """Per layer of the loop's model: parameters, gradients and AdamW's two moments, bytes."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_loop

    return [4 * sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in gpu_loop.model()]


def check_losses(name: str, found: dict, reference: list[float]) -> tuple[str, str, bool]:
    if not found:
        return name, "the run failed", False
    worst = max(abs(a - b) for a, b in zip(found["losses"], reference, strict=True))
    transport = found["log"][0]["run"]["transport"]
    return name, f"max |loss - reference| {worst:.2e} ({transport})", worst <= LOSS_TOLERANCE


def check_memory(name: str, found: dict, per_layer: list[int], move_step: int) -> tuple[str, str, bool]:
    if not found:
        return name, "the run failed", False
    ratios, excess_bytes = [], []
    for held in found["ranks"]:
        for step in (move_step - 1, move_step):  # the step before the move, and the step after it
            start, stop = held[step]["layers"]
            own_bytes = sum(per_layer[start:stop])
            ratios.append(held[step]["allocated_bytes"] / max(own_bytes, 1))
            excess_bytes.append(held[step]["allocated_bytes"] - own_bytes)
    worst = max(abs(r - 1) for r in ratios)
    return (name, f"allocated / own layers' state {min(ratios):.3f}..{max(ratios):.3f} over "
            f"{len(found['ranks'])} ranks, before and after the move (allocated - own state "
            f"{min(excess_bytes) / 2**20:+.2f}..{max(excess_bytes) / 2**20:+.2f} MiB)", worst <= MEMORY_TOLERANCE)


def check_stall(found: dict) -> tuple[str, str, bool]:
    name = "repartition stall vs floor (4 processes)"
    if not found:
        return name, "the run failed", False
    gbps = found["log"][0]["run"]["p2p_gbps"]
    moves = [r["repartition"] for r in found["log"] if "repartition" in r]
    rows = []
    for move in moves:
        # the bytes at the start-up probe's rate between one pair of ranks; a move's concurrent transfers
        # between several pairs can beat it (on an H200 host they did: 0.4-0.7x)
        floor_s = move["bytes_moved"] * 8 / (gbps * 1e9)
        moved_gbps = move["bytes_moved"] * 8 / max(move["stall_s"], 1e-9) / 1e9
        rows.append(f"{move['bytes_moved'] / 2**20:.0f} MiB in {move['stall_s'] * 1e3:.0f} ms = {moved_gbps:.1f} "
                    f"Gbit/s ({move['stall_s'] / floor_s:.1f}x its one-pair floor of {floor_s * 1e3:.0f} ms)")
    committed = bool(moves) and all(move["committed"] for move in moves)
    return name, f"probe {gbps:.1f} Gbit/s between two ranks' devices; " + "; ".join(rows), committed


def check_ppo(folder: Path) -> tuple[str, str, bool]:
    name = "rlpipe run --policy ppo, a 3x straggler"
    trace, log = folder / "straggler.csv", folder / "ppo.jsonl"
    trace.write_text("time_s,device,slowdown\n0,1,3.0\n")
    result = command([sys.executable, "-m", "rlpipe.cli", "run", "--model", "mlp", "--layers", "16", "--stages", "4",
                      "--microbatches", "8", "--batch", "64", "--iterations", "60", "--interval", "5", "--policy",
                      "ppo", "--interference", f"trace:{trace}", "--device-time", "emulated", "--log", str(log)])
    if result.returncode != 0:
        return name, "the run failed", False
    records = [json.loads(line) for line in log.read_text().splitlines()]
    moves = [r["repartition"] for r in records if "repartition" in r and r["repartition"]["committed"]]
    return (name, f"{records[-1]['iteration']} iterations, {len(moves)} repartition(s), boundaries "
            f"{records[0]['boundaries']} -> {records[-1]['boundaries']} ({records[0]['run']['transport']})",
            records[-1]["iteration"] == 60 and bool(moves))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="keep the runs' files here (default: a temporary folder)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA GPU on this host (torch {torch.__version__}); nothing to check")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.out or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"gpu-check: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}",
              flush=True)
        if command([sys.executable, str(LOOP), str(folder / "reference.json"), "reference"]).returncode != 0:
            print("gpu-check: the single-process CUDA reference failed")
            return 1
        reference = json.loads((folder / "reference.json").read_text())["losses"]
        per_layer = layer_state_bytes()
        rows, moving = [], {}
        for stages in (2, 4):
            still = loop(folder / f"still{stages}.json", stages)
            moving[stages] = loop(folder / f"moving{stages}.json", stages, *MOVES[stages])
            rows += [check_losses(f"{stages} processes, no repartition", still, reference),
                     check_losses(f"{stages} processes, 3 repartitions", moving[stages], reference),
                     check_memory(f"{stages} processes, memory per rank", moving[stages], per_layer, 8)]
        hybrid = loop(folder / "hybrid.json", 4, *HYBRID)
        rows += [check_losses("2 x 2 hybrid, repartitions and a rebalance", hybrid, reference),
                 check_memory("2 x 2 hybrid, memory per rank", hybrid, per_layer, 8),
                 check_stall(moving[4]), check_ppo(folder)]
    print("\n| check | found | result |\n|---|---|---|")
    for name, found, ok in rows:
        print(f"| {name} | {found} | {'pass' if ok else 'FAIL'} |")
    failed = sum(not ok for *_, ok in rows)
    print(f"\ngpu-check: {len(rows) - failed} of {len(rows)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
