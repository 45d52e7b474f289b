"""A GAN: two optimizers stepped once each per iteration (the discriminator's, then the generator's),
each after its own forward and backward. One iteration is one training step: `pitstop profile` counts
one step per batch and plots the discriminator's loss (the step's first backward), not the two losses
alternating.

    python examples/gan_two_optimizers.py [--steps 60] [--batch-size 64]
"""

import argparse

import torch
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--latent", type=int, default=16)
    args = ap.parse_args()

    torch.manual_seed(0)
    # the "real" data: points on a ring in 2-D
    angle = torch.rand(args.batch_size * args.steps) * 6.2832
    real_all = torch.stack([angle.cos(), angle.sin()], 1) + 0.05 * torch.randn(len(angle), 2)
    loader = torch.utils.data.DataLoader(real_all, batch_size=args.batch_size, shuffle=True, drop_last=True)

    gen = nn.Sequential(
        nn.Linear(args.latent, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2)
    )
    disc = nn.Sequential(
        nn.Linear(2, 128), nn.LeakyReLU(0.2), nn.Linear(128, 128), nn.LeakyReLU(0.2), nn.Linear(128, 1)
    )
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999), foreach=True)
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999), foreach=True)
    bce = nn.BCEWithLogitsLoss()
    ones = torch.ones(args.batch_size, 1)
    zeros = torch.zeros(args.batch_size, 1)

    for step, real in enumerate(loader):
        # discriminator: real vs generated
        fake = gen(torch.randn(args.batch_size, args.latent))
        loss_d = bce(disc(real), ones) + bce(disc(fake.detach()), zeros)
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        # generator: fool the discriminator
        loss_g = bce(disc(fake), ones)
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        if (step + 1) % 20 == 0:
            print(f"step {step + 1}: loss_d {loss_d.item():.3f} loss_g {loss_g.item():.3f}")


if __name__ == "__main__":
    main()
