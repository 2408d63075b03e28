"""Regression of scikit-learn's diabetes progression with an MLP, gradients accumulated over
several micro-batches before each optimizer step.

    python train.py --lr 0.02 --accum 4 --updates 80
"""

import argparse

import torch
from sklearn.datasets import load_diabetes
from torch import nn

import stabilizer_sentinel as sentinel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--micro_batch", type=int, default=16)
    parser.add_argument("--updates", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    y = torch.tensor(data.target, dtype=torch.float32)
    y = (y - y.mean()) / y.std()
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    guard = sentinel.watch(model, optimizer)
    for update in range(args.updates):
        optimizer.zero_grad()
        total = 0.0
        for _ in range(args.accum):
            batch = torch.randint(len(x), (args.micro_batch,))
            loss = nn.functional.mse_loss(model(x[batch]).squeeze(1), y[batch]) / args.accum
            loss.backward()
            total += loss.item()
        guard.step(total)
        optimizer.step()
        print(f"update {update} mse {total:.5f}", flush=True)
    with torch.no_grad():  # the squared error over every patient
        print(f"final_eval {nn.functional.mse_loss(model(x).squeeze(1), y).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
