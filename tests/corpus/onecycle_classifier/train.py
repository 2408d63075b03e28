"""Digits classifier (scikit-learn's bundled 8x8 digits), an MLP trained with SGD and a one-cycle schedule.

    python train.py --max_lr 0.5 --epochs 6
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn

import stabilizer_sentinel as sentinel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_lr", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.max_lr, momentum=0.9)
    steps_per_epoch = (len(x) + args.batch_size - 1) // args.batch_size
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.max_lr,
                                                    total_steps=args.epochs * steps_per_epoch)
    guard = sentinel.watch(model, optimizer)
    step = 0
    for epoch in range(args.epochs):
        for batch in torch.randperm(len(x)).split(args.batch_size):
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            guard.step(loss)
            optimizer.step()
            scheduler.step()
            print(f"epoch {epoch} step {step} lr {scheduler.get_last_lr()[0]:.4g} train_loss {loss.item():.5f}",
                  flush=True)
            step += 1
        with torch.no_grad():
            accuracy = (model(x).argmax(1) == y).float().mean().item()
        print(f"epoch {epoch} accuracy {accuracy:.3f}", flush=True)
    with torch.no_grad():  # the trained network on every image
        print(f"final_eval {nn.functional.cross_entropy(model(x), y).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
