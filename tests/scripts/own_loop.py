"""A user's own training script (the library API), run by tests under torchrun: it trains with its own
DataLoader and optimizer, optionally moves layers live at given steps, and writes every step's loss
and the resident parameter bytes rank 0 logged. Its twin below trains the same model in one process.

    torchrun --nproc-per-node S own_loop.py OUT.json OPTIMIZER SCHEDULE [STEP:BOUNDARIES ...]
"""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCHES, BATCH, MICROBATCHES = 12, 16, 4


def model() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
            nn.Linear(32, 4)]


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(BATCHES * BATCH, 16, generator=generator),
                         torch.randint(0, 4, (BATCHES * BATCH,), generator=generator))
    return DataLoader(data, batch_size=BATCH)


OPTIMIZERS = {"adamw": lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01),
              "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)}


def single_process(optimizer: str) -> list[float]:
    """The reference: one process, the batch's loss averaged over its micro-batches."""
    layers = nn.Sequential(*model())
    opt = OPTIMIZERS[optimizer](list(layers.parameters()))
    losses = []
    for inputs, targets in loader():
        opt.zero_grad()
        parts = [nn.functional.cross_entropy(layers(x), y) for x, y in
                 zip(inputs.chunk(MICROBATCHES), targets.chunk(MICROBATCHES), strict=True)]
        loss = torch.stack(parts).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def main() -> None:
    from rlpipe.runtime import AdaptivePipeline

    out, optimizer, schedule, *moves = sys.argv[1:]
    repartitions = {int(step): tuple(int(b) for b in bounds.split(",")) for step, bounds in
                    (move.split(":") for move in moves)}
    log = out + ".log.jsonl"
    pipe = AdaptivePipeline(model(), nn.functional.cross_entropy, optimizer=OPTIMIZERS[optimizer],
                            microbatches=MICROBATCHES, schedule=schedule, interval=3, log=log)
    losses = []
    for step, (inputs, targets) in enumerate(loader()):
        if step in repartitions:
            pipe.repartition(repartitions[step])
        losses.append(pipe.train_step(inputs, targets))
    pipe.finish()
    if pipe.rank == 0:
        records = [json.loads(line) for line in open(log)]
        resident = [[s["resident_param_bytes"] for s in r["stages"]] for r in records]
        json.dump({"losses": losses, "resident": resident, "boundaries": [r["boundaries"] for r in records]},
                  open(out, "w"))
    pipe.close()


if __name__ == "__main__":
    main()
