"""A user's own training script (the library API), run by tests under torchrun: it trains with its own
DataLoader and optimizer, optionally moves layers live or changes the micro-batch split at given steps,
and writes every step's loss, the resident parameter bytes rank 0 logged and the public partition and
split. Its twin below trains the same model in one process.

    torchrun --nproc-per-node D*S own_loop.py OUT.json OPTIMIZER SCHEDULE [dp=D] [short] [staged]
             [STEP:BOUNDARIES ...] [STEP:split=M0,M1 ...]

``short`` adds a last batch of 41 samples, which does not divide into the micro-batches; ``staged``
sends everything between ranks through host copies, as the host-staged transport does on a GPU.
"""

import json
import sys
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCHES, BATCH, MICROBATCHES, SHORT = 12, 16, 4, 41


def model() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
            nn.Linear(32, 4)]


def loader(short: bool = False) -> list:
    """12 batches of 16 samples; with ``short``, then a last batch of 41 samples, which does not divide
    into the micro-batches (a DataLoader over 41 samples in batches of 64)."""
    generator = torch.Generator().manual_seed(1)
    rows = BATCHES * BATCH
    data = TensorDataset(torch.randn(rows, 16, generator=generator), torch.randint(0, 4, (rows,), generator=generator))
    batches = list(DataLoader(data, batch_size=BATCH))
    if short:  # a DataLoader over 41 samples in batches of 64: its one batch is short
        extra = TensorDataset(torch.randn(SHORT, 16, generator=generator),
                              torch.randint(0, 4, (SHORT,), generator=generator))
        batches += list(DataLoader(extra, batch_size=64))
    return batches


OPTIMIZERS = {"adamw": lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01),
              "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)}


def single_process(optimizer: str, short: bool = False) -> list[float]:
    """The reference: one process, the batch's mean loss over its samples."""
    layers = nn.Sequential(*model())
    opt = OPTIMIZERS[optimizer](list(layers.parameters()))
    losses = []
    for inputs, targets in loader(short):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(layers(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def main() -> None:
    from rlpipe.runtime import AdaptivePipeline

    out, optimizer, schedule, *options = sys.argv[1:]
    data_parallel = next((int(o[3:]) for o in options if o.startswith("dp=")), 1)
    short = "short" in options
    transport = "host-staged-on-cpu" if "staged" in options else "auto"
    repartitions, rebalances = {}, {}
    for option in options:
        step, sep, what = option.partition(":")
        if not sep:
            continue
        if what.startswith("split="):
            rebalances[int(step)] = [int(m) for m in what[6:].split(",")]
        else:
            repartitions[int(step)] = tuple(int(b) for b in what.split(","))
    log = out + ".log.jsonl"
    pipe = AdaptivePipeline(model(), nn.functional.cross_entropy, optimizer=OPTIMIZERS[optimizer],
                            microbatches=MICROBATCHES, schedule=schedule, interval=3, log=log,
                            data_parallel=data_parallel, transport=transport)
    losses, seen = [], []
    for step, (inputs, targets) in enumerate(loader(short)):
        if step in repartitions:
            pipe.repartition(repartitions[step])
        if step in rebalances:
            pipe.rebalance(rebalances[step])
        losses.append(pipe.train_step(inputs, targets))
        seen.append({"boundaries": list(pipe.boundaries), "split": list(pipe.microbatch_split)})
    pipe.finish()
    # weak references: a process group alive after close() is destroyed only at the interpreter's exit,
    # where a gloo worker thread releasing a tensor aborts the process
    groups = [weakref.ref(g) for g in (pipe.mesh.pp_group, pipe.mesh.dp_group, dist.group.WORLD)]
    pipe.close()
    if pipe.rank == 0:
        records = [json.loads(line) for line in open(log)]
        resident = [[s["resident_param_bytes"] for replica in r["replicas"] for s in replica["stages"]]
                    for r in records]
        json.dump({"losses": losses, "resident": resident, "boundaries": [r["boundaries"] for r in records],
                   "splits": [r["microbatch_split"] for r in records], "seen": seen,
                   "transport": records[0]["run"]["transport"],
                   "comm_ms": [[s["comm_ms"] for replica in r["replicas"] for s in replica["stages"]]
                               for r in records],
                   "groups_alive_after_close": sum(g() is not None for g in groups)}, open(out, "w"))


if __name__ == "__main__":
    main()
