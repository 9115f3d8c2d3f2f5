import torch
from torch import nn

from rlpipe.runtime.migration import Received, outgoing, transfer_plan


def test_plan_follows_the_boundaries():
    plan = transfer_plan((0, 3, 5), (0, 2, 6), 8)
    assert plan == {(0, 1): [2], (2, 1): [5]}
    assert transfer_plan((0, 3), (0, 3), 5) == {}


def test_what_is_sent_fills_exactly_what_is_received():
    torch.manual_seed(0)
    sender = [nn.Linear(4, 3), nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))]
    optimizer = torch.optim.Adam([p for m in sender for p in m.parameters()])
    sender[1](sender[0](torch.randn(5, 4))).sum().backward()
    optimizer.step()
    receiver = [nn.Linear(4, 3), nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))]
    receipt, targets = Received.buffers_for(receiver)
    sent = outgoing(sender, optimizer)
    assert [t.shape for t in sent] == [t.shape for t in targets]
    for target, value in zip(targets, sent):  # what the point-to-point transfer does
        target.copy_(value)
    for a, b in zip(sender, receiver):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    states = receipt.adam_states()
    first = next(iter(receiver[0].parameters()))
    original = optimizer.state[next(iter(sender[0].parameters()))]
    assert torch.equal(states[first]["exp_avg"], original["exp_avg"]) and float(states[first]["step"]) == 1.0


def test_layers_without_optimizer_state_arrive_without_it():
    layer = nn.Linear(2, 2)
    receipt, targets = Received.buffers_for([nn.Linear(2, 2)])
    for target, value in zip(targets, outgoing([layer], torch.optim.Adam(layer.parameters()))):
        target.copy_(value)
    assert receipt.adam_states() == {}
