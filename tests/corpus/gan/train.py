"""A GAN on a one-dimensional mixture of two Gaussians: a generator and a discriminator, each
with its own optimizer (SGD with momentum), alternating updates.

    python train.py --lr 0.02 --steps 200
"""

import argparse

import torch
from torch import nn


def real_batch(n: int) -> torch.Tensor:
    centres = torch.where(torch.rand(n, 1) < 0.5, -2.0, 2.0)
    return centres + 0.3 * torch.randn(n, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--d_lr", type=float, default=None, help="the discriminator's rate (default: --lr)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    discriminator = nn.Sequential(nn.Linear(1, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g = torch.optim.SGD(generator.parameters(), lr=args.lr, momentum=0.9)
    opt_d = torch.optim.SGD(discriminator.parameters(), lr=args.d_lr or args.lr, momentum=0.9)
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(args.batch, 1), torch.zeros(args.batch, 1)
    for step in range(args.steps):
        fake = generator(torch.randn(args.batch, 4))
        d_loss = bce(discriminator(real_batch(args.batch)), ones) + bce(discriminator(fake.detach()), zeros)
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()

        g_loss = bce(discriminator(fake), ones)
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        print(f"step {step} d_loss={d_loss.item():.4f} g_loss={g_loss.item():.4f} "
              f"fake_mean={fake.mean().item():.3f}", flush=True)
    # How far the generator's distribution is from the data's: the 1-Wasserstein distance between
    # 20,000 samples of each, the same noise for every run.
    torch.manual_seed(1000 + args.seed)
    with torch.no_grad():
        fake, real = generator(torch.randn(20_000, 4)).flatten().sort()[0], real_batch(20_000).flatten().sort()[0]
    print(f"final_eval {(fake - real).abs().mean().item():.6g}", flush=True)


if __name__ == "__main__":
    main()
