"""Fine-tuning: pre-train an MLP on digits 0-4, save it, then load that checkpoint and fine-tune
a new head (and the body) on digits 5-9. Only the fine-tuning is watched.

    python train.py --ft_lr 0.05 --ft_steps 120
"""

import argparse
import os
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn

import stabilizer_sentinel as sentinel


def body() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 32), nn.Tanh())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pretrain_steps", type=int, default=60)
    parser.add_argument("--ft_lr", type=float, default=0.05)
    parser.add_argument("--ft_steps", type=int, default=120)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    low, high = y < 5, y >= 5

    # 1. Pre-training, saved as a checkpoint the way a separate job would leave it.
    features = body()
    model = nn.Sequential(features, nn.Linear(32, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xs, ys = x[low], y[low]
    for _ in range(args.pretrain_steps):
        batch = torch.randint(len(xs), (args.batch_size,))
        loss = nn.functional.cross_entropy(model(xs[batch]), ys[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"pretrained {args.pretrain_steps} steps, last loss {loss.item():.4f}", flush=True)
    out = Path(os.environ.get("SM_MODEL_DIR", "model"))
    out.mkdir(parents=True, exist_ok=True)
    torch.save(features.state_dict(), out / "pretrained.pt")

    # 2. Fine-tuning from the checkpoint.
    features = body()
    features.load_state_dict(torch.load(out / "pretrained.pt", weights_only=True))
    model = nn.Sequential(features, nn.Linear(32, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.ft_lr, momentum=0.9)
    guard = sentinel.watch(model, optimizer)
    xs, ys = x[high], y[high] - 5
    for step in range(args.ft_steps):
        batch = torch.randint(len(xs), (args.batch_size,))
        loss = nn.functional.cross_entropy(model(xs[batch]), ys[batch])
        optimizer.zero_grad()
        loss.backward()
        guard.step(loss)
        optimizer.step()
        print(f"finetune step={step} loss={loss.item():.5f}", flush=True)
    with torch.no_grad():  # the fine-tuned network on every image of digits 5-9
        print(f"final_eval {nn.functional.cross_entropy(model(xs), ys).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
