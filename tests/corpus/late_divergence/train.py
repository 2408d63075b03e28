"""Diabetes regression (a linear model, or an MLP with --hidden) with SGD and momentum whose
learning rate ramps up linearly over a long warm-up to --lr and then stays there. Too high a
target rate trains well for a while and only diverges once the ramp passes what the model
tolerates, late in the run.

    python train.py --lr 0.05 --warmup_steps 200 --steps 240
"""

import argparse

import torch
from sklearn.datasets import load_diabetes
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--warmup_steps", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=0, help="0: a linear model")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    y = torch.tensor(data.target, dtype=torch.float32).unsqueeze(1) / 100.0
    if args.hidden:
        model = nn.Sequential(nn.Linear(10, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))
    else:
        model = nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / args.warmup_steps))
    loss_fn = nn.MSELoss()
    for step in range(args.steps):
        batch = torch.randint(len(x), (args.batch_size,))
        loss = loss_fn(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"Step {step}/{args.steps} - loss: {loss.item():.5f}", flush=True)
    with torch.no_grad():  # the squared error over every patient
        print(f"final_eval {loss_fn(model(x), y).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
