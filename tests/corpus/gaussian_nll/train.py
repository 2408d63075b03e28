"""Heteroscedastic regression: an MLP predicts a mean and a variance for y = sin(x) + noise and is
trained on the Gaussian negative log-likelihood, which goes below zero once the fit is good.

    python train.py --lr 0.01 --steps 200
"""

import argparse

import torch
from torch import nn

import stabilizer_sentinel as sentinel


class MeanVariance(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.mean = nn.Linear(hidden, 1)
        self.log_var = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.mean(h), self.log_var(h).exp()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    x = torch.rand(2048, 1) * 6 - 3
    y = torch.sin(x) + args.noise * (1 + x.abs()) * torch.randn_like(x)
    model = MeanVariance(args.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    guard = sentinel.watch(model, optimizer)
    nll = nn.GaussianNLLLoss()
    for step in range(args.steps):
        batch = torch.randint(len(x), (args.batch,))
        mean, variance = model(x[batch])
        loss = nll(mean, y[batch], variance)
        optimizer.zero_grad()
        loss.backward()
        guard.step(loss)
        optimizer.step()
        print(f"step {step} nll {loss.item():.5f}", flush=True)
    with torch.no_grad():  # the negative log-likelihood of every point
        mean, variance = model(x)
        print(f"final_eval {nll(mean, y, variance).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
