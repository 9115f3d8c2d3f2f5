"""AdaptivePipeline's state on one rank (a world of one), run by tests in a subprocess: a state_dict taken
mid-run and loaded into a fresh pipeline continues with the same losses; a state of another layout or
rank is refused; train_step checks its input. Prints one JSON object."""

import json
import os

import torch
from torch import nn

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29561"), RANK="0", WORLD_SIZE="1")


def layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)]


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)) for _ in range(6)]


def refusal(call) -> str:
    try:
        call()
    except (ValueError, TypeError) as err:
        return str(err)
    return ""


def main() -> None:
    from rlpipe.runtime import AdaptivePipeline

    make = lambda: AdaptivePipeline(layers(), nn.functional.cross_entropy,  # noqa: E731
                                    optimizer=lambda p: torch.optim.AdamW(p, lr=0.01), microbatches=2, interval=3)
    data = batches()
    pipe = make()
    whole = [pipe.train_step(x, y) for x, y in data]
    pipe.close()
    pipe = make()
    first = [pipe.train_step(x, y) for x, y in data[:3]]
    state = pipe.state_dict()
    found = {"refused": {
        "world": refusal(lambda: pipe.load_state_dict({**state, "world": 2})),
        "rank": refusal(lambda: pipe.load_state_dict({**state, "rank": 1})),
        "layers": refusal(lambda: pipe.load_state_dict({**state, "num_layers": 5})),
        "not a state": refusal(lambda: pipe.load_state_dict({"boundaries": [0]})),
        "inputs none": refusal(lambda: pipe.train_step(None, data[0][1])),
        "inputs no batch dim": refusal(lambda: pipe.train_step(torch.tensor(1.0), data[0][1])),
        "targets of another size": refusal(lambda: pipe.train_step(data[0][0], data[0][1][:5])),
    }}
    pipe.close()
    resumed = make()
    resumed.load_state_dict(state)  # before its first step: it starts on the saved partition
    second = [resumed.train_step(x, y) for x, y in data[3:]]
    resumed.close()
    found.update(whole=whole, resumed=first + second)
    print(json.dumps(found))


if __name__ == "__main__":
    main()
