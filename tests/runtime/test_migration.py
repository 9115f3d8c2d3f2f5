import json

import pytest
import torch
from torch import nn

from rlpipe.runtime.migration import Received, describe_state, outgoing, transfer_plan


def test_plan_follows_the_boundaries():
    plan = transfer_plan((0, 3, 5), (0, 2, 6), 8)
    assert plan == {(0, 1): [2], (2, 1): [5]}
    assert transfer_plan((0, 3), (0, 3), 5) == {}


def trained_layers(optimizer_class, **options):
    torch.manual_seed(0)
    layers = [nn.Linear(4, 3), nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))]
    optimizer = optimizer_class([p for m in layers for p in m.parameters()], lr=0.1, **options)
    for _ in range(2):
        layers[1](layers[0](torch.randn(5, 4))).sum().backward()
        optimizer.step()
    return layers, optimizer


def send(layers, optimizer):
    """What the sender puts on the wire: the JSON header, then the tensors in order."""
    header = json.loads(json.dumps(describe_state(layers, optimizer)))  # as the receiver decodes it
    return header, outgoing(layers, optimizer, torch.device("cpu"))


@pytest.mark.parametrize("optimizer_class, options", [(torch.optim.Adam, {}), (torch.optim.AdamW, {}),
                                                      (torch.optim.SGD, {"momentum": 0.9})])
def test_what_is_sent_fills_the_receivers_storage_less_copies_exactly(optimizer_class, options):
    sender, optimizer = trained_layers(optimizer_class, **options)
    with torch.device("meta"):  # the receiver holds the structure only
        receiver = [nn.Linear(4, 3), nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))]
    header, sent = send(sender, optimizer)
    receipt = Received(receiver, header)
    targets = receipt.allocate(torch.device("cpu"))
    assert [t.shape for t in targets] == [t.shape for t in sent]
    for target, value in zip(targets, sent):  # what the point-to-point transfer does
        target.copy_(value)
    for a, b in zip(sender, receiver):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    states = receipt.optimizer_states()
    for p_sent, p_received in zip([p for m in sender for p in m.parameters()],
                                  [p for m in receiver for p in m.parameters()]):
        original = optimizer.state[p_sent]
        assert states[p_received].keys() == original.keys()
        for key, value in original.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(states[p_received][key], value) and states[p_received][key].device == value.device
            else:
                assert states[p_received][key] == value


def test_layers_without_optimizer_state_arrive_without_it():
    layer = nn.Linear(2, 2)
    header, sent = send([layer], torch.optim.Adam(layer.parameters()))
    receipt = Received([nn.Linear(2, 2)], header)
    for target, value in zip(receipt.allocate(torch.device("cpu")), sent):
        target.copy_(value)
    assert receipt.optimizer_states() == {}
