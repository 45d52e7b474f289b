"""Loop shapes beyond one optimizer and ``model(x)``: several optimizers per iteration (a GAN, a WGAN
critic loop), optimizers stepped rarely, closure optimizers in what steps the script's optimizer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pitstop.profile.capture.stepclock import MAX_CYCLE, PHASES

torch.set_num_threads(1)


def _gan(iters: int, n_critic: int = 1, loader: bool = True, extra_every: int | None = None):
    """D (``n_critic`` times, each on its own batch) then G, every iteration; an extra optimizer steps
    at iteration 0 and every ``extra_every`` iterations (0: only at iteration 0; None: never)."""
    gen = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    disc = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt_g, opt_d = torch.optim.Adam(gen.parameters()), torch.optim.Adam(disc.parameters())
    probe = nn.Linear(2, 1)
    opt_x = torch.optim.SGD(probe.parameters(), lr=0.1)
    data = iter(torch.utils.data.DataLoader(torch.randn(iters * n_critic * 8, 4), batch_size=8))
    losses = []
    for i in range(iters):
        for _ in range(n_critic):
            real = next(data) if loader else torch.randn(8, 4)
            fake = gen(torch.randn(8, 4))
            loss_d = disc(real).mean() - disc(fake.detach()).mean()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
        loss_g = -disc(fake).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        losses.append(loss_d.item())
        if extra_every is not None and (i == 0 or (extra_every and i % extra_every == 0)):
            probe(torch.randn(1, 2)).sum().backward()
            opt_x.step()
    return opt_g


def _whole(records) -> None:
    assert records
    for r in records:
        assert r["forward_s"] > 0 and r["backward_s"] > 0 and r["optimizer_s"] > 0
        assert sum(r[p] for p in PHASES) <= r["total_s"] + 1e-9, r


@pytest.mark.parametrize("loader", [True, False])
def test_a_gan_counts_one_step_per_iteration(instrument, loader):
    inst = instrument()
    opt_g = _gan(12, loader=loader)
    inst.close_pending()
    # the first two iterations are cut anew once the cycle (D then G) is known; the rest, one each
    assert len(inst.records) == 10, [r["total_s"] for r in inst.records]
    assert inst.clock.cycle.closer == id(opt_g)
    assert inst.counts["optimizer_steps"] == 12 * 2
    _whole(inst.records)
    # each step's loss is the discriminator's (its first backward): the curve does not alternate
    assert all(loss is not None for loss in inst.losses)


def test_a_wgan_critic_loop_is_one_step_per_generator_step(instrument):
    inst = instrument()
    opt_g = _gan(8, n_critic=5)
    inst.close_pending()
    assert inst.clock.cycle.closer == id(opt_g)
    assert 5 <= len(inst.records) <= 7  # one per iteration, less the first ones cut anew
    assert all(r["data_wait_s"] > 0 for r in inst.records)
    _whole(inst.records)


def test_an_optimizer_stepped_once_long_ago_does_not_hold_steps_open(instrument):
    inst = instrument()
    gen = nn.Linear(4, 4)
    opt = torch.optim.SGD(gen.parameters(), lr=0.01)
    once = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.01)
    once.param_groups[0]["params"][0].grad = torch.zeros(2, 2)
    once.step()
    for _ in range(MAX_CYCLE + 10):
        gen(torch.randn(2, 4)).sum().backward()
        opt.step()
    inst.close_pending()
    assert inst.clock.cycle.closer == id(opt)  # the lone step made no cycle
    assert len(inst.records) >= 10  # one per iteration (the first ones may be cut anew)
    # (a first step may hold the lone step alone: it began before the loop)
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in inst.records[1:])


@pytest.mark.parametrize("every", [3, MAX_CYCLE])
def test_an_optimizer_stepped_every_k_iterations(instrument, every):
    """Every 3 iterations (6 optimizer steps apart): the cycle is 3 iterations. Every ``MAX_CYCLE``
    iterations: too rare to delimit steps, one step per iteration."""
    inst = instrument()
    iters = 4 * every + 2
    _gan(iters, extra_every=every)
    inst.close_pending()
    if every == 3:
        assert iters // every - 2 <= len(inst.records) <= iters // every
    else:  # the first steps may be cut anew (within the first MAX_CYCLE records), the rest are one each
        assert iters - MAX_CYCLE - 4 <= len(inst.records) <= iters
        assert inst.clock.cycle.closer != id(inst.captured.optimizers[-1])
    _whole(inst.records)


def test_two_optimizers_stepped_back_to_back_are_one_step_from_the_start(instrument):
    inst = instrument()
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.SGD(model[2].parameters(), lr=0.1)]
    for _ in range(6):
        model(torch.randn(4, 4)).sum().backward()
        for o in opts:
            o.step()
    inst.close_pending()
    assert len(inst.records) == 6  # no step was cut anew: every one held both optimizers


def test_a_closure_optimizer_is_stepped_with_a_closure_by_train_step():
    from pitstop.train.optim import needs_closure
    from pitstop.tune.steps import default_loss, train_step

    model = nn.Linear(4, 1)
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=3)
    assert needs_closure(lbfgs) and not needs_closure(torch.optim.SGD(model.parameters(), lr=0.1))
    before = model.weight.detach().clone()
    loss = train_step(model, lbfgs, (torch.randn(16, 4), torch.randn(16, 1)), default_loss)
    assert torch.isfinite(loss) and not torch.equal(before, model.weight)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) * scale


class FlatNet(Net):
    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1)  # the argument reassigned before the first submodule call
        return self.fc2(torch.relu(self.fc1(x))) * scale


@pytest.mark.parametrize("flatten", [False, True])
def test_a_direct_forward_call_is_a_forward_of_its_model(instrument, flatten):
    inst = instrument()
    model = FlatNet() if flatten else Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    keys = sorted(vars(model))
    for _ in range(6):
        loss = model.forward(torch.randn(8, 16), scale=0.5).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        model(torch.randn(2, 16))  # then called as model(x): one forward, not two
    inst.close_pending()
    assert [type(m) for m in inst.captured.models] == [type(model)]  # the model, not its first Linear
    assert inst.counts["forwards"] == 7 and len(inst.records) == 6
    assert all(r["forward_s"] > 0 for r in inst.records)
    _whole(inst.records)
    if flatten:  # its inputs are not known: the probes that need them do not run
        assert inst.captured.last_inputs is None
    else:
        args, kwargs = inst.captured.last_inputs
        assert args[0].shape == (8, 16) and args[1] == 0.5 and kwargs == {}
    # nothing was stored on the model
    assert sorted(vars(model)) == keys and not model._forward_hooks and not model._forward_pre_hooks


def test_a_model_first_called_as_model_x_then_directly(instrument):
    inst = instrument()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(6):
        out = model(torch.randn(8, 16)) if i < 2 else model.forward(torch.randn(8, 16))
        out.pow(2).mean().backward()
        opt.step()
    inst.close_pending()
    assert [type(m) for m in inst.captured.models] == [Net]
    assert inst.counts["forwards"] == 6 and all(r["forward_s"] > 0 for r in inst.records)


def test_direct_forwards_of_two_models_in_one_iteration(instrument):
    """A GAN written with ``.forward``: D called directly twice, G as G(z): each forward is its own."""
    inst = instrument()
    gen, disc = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 16)), Net()
    opt_g, opt_d = torch.optim.Adam(gen.parameters()), torch.optim.Adam(disc.parameters())
    for _ in range(8):
        fake = gen(torch.randn(8, 4))
        loss_d = disc.forward(torch.randn(8, 16)).mean() - disc.forward(fake.detach()).mean()
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        loss_g = -disc.forward(fake).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
    inst.close_pending()
    assert [type(m) for m in inst.captured.models] == [nn.Sequential, Net]
    assert inst.counts["forwards"] == 8 * 4
    assert 5 <= len(inst.records) <= 7  # one per iteration, less the first ones cut anew
    _whole(inst.records)
