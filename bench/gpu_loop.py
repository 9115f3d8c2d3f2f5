"""The GPU check's training loop (bench/gpu_check.py): a user's own loop over an MLP of 2048-wide layers
under AdamW, trained by AdaptivePipeline on as many stage processes as torchrun starts (sharing the
host's GPUs when they are fewer), or, with ``reference``, in one process on the GPU. It writes every
step's loss and, for each rank, what that rank held allocated on its GPU after each step and which
layers it owned.

    python -m torch.distributed.run --nproc-per-node N bench/gpu_loop.py OUT.json [dp=D]
        [STEP:BOUNDARIES ...] [STEP:split=M0,M1 ...]
    python bench/gpu_loop.py OUT.json reference
"""

import json
import sys

import torch
from torch import nn

WIDTH, HIDDEN_LINEARS, CLASSES, STEPS, BATCH, MICROBATCHES = 2048, 7, 16, 10, 64, 4


def model() -> list[nn.Module]:
    """15 layers: 7 x (2048 x 2048 linear, ReLU), then a linear to 16 classes (on the CPU, seeded)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(HIDDEN_LINEARS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return layers + [nn.Linear(WIDTH, CLASSES)]


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, WIDTH, generator=generator), torch.randint(0, CLASSES, (BATCH,), generator=generator))
            for _ in range(STEPS)]


def adamw(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)


def reference(out: str) -> None:
    """One process on the GPU (the CPU without one): the losses the pipelines must reproduce."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    layers = nn.Sequential(*model()).to(device)
    optimizer = adamw(list(layers.parameters()))
    losses = []
    for inputs, targets in batches():
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(layers(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    json.dump({"losses": losses}, open(out, "w"))


def pipelined(out: str, options: list[str]) -> None:
    from rlpipe.runtime import AdaptivePipeline

    data_parallel = next((int(o[3:]) for o in options if o.startswith("dp=")), 1)
    repartitions, rebalances = {}, {}
    for option in options:
        step, sep, what = option.partition(":")
        if sep and what.startswith("split="):
            rebalances[int(step)] = [int(m) for m in what[6:].split(",")]
        elif sep:
            repartitions[int(step)] = tuple(int(b) for b in what.split(","))
    pipe = AdaptivePipeline(model(), nn.functional.cross_entropy, optimizer=adamw, microbatches=MICROBATCHES,
                            interval=1, log=out + ".log.jsonl", data_parallel=data_parallel)
    losses, held = [], []
    for step, (inputs, targets) in enumerate(batches()):
        if step in repartitions:
            pipe.repartition(repartitions[step])
        if step in rebalances:
            pipe.rebalance(rebalances[step])
        losses.append(pipe.train_step(inputs, targets))
        assert pipe.stage is not None
        owned = pipe.stage.owned_layers()
        allocated = torch.cuda.memory_allocated(pipe.device) if pipe.device.type == "cuda" else -1
        held.append({"allocated_bytes": allocated, "layers": [owned.start, owned.stop],
                     "transport": pipe.transport.name, "device": str(pipe.device)})
    pipe.finish()
    json.dump({"held": held}, open(f"{out}.rank{pipe.rank}.json", "w"))
    if pipe.rank == 0:
        json.dump({"losses": losses}, open(out, "w"))
    pipe.close()


if __name__ == "__main__":
    if sys.argv[2:3] == ["reference"]:
        reference(sys.argv[1])
    else:
        pipelined(sys.argv[1], sys.argv[2:])
