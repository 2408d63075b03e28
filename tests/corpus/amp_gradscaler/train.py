"""Mixed precision on CPU: float16 autocast and a GradScaler, a digits MLP with Adam.

    python train.py --lr 0.003 --steps 150
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--init_scale", type=float, default=2.0**16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32)  # 0..16, not scaled: fp16 activations get large
    y = torch.tensor(digits.target)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=args.init_scale)
    for step in range(args.steps):
        batch = torch.randint(len(x), (args.batch_size,))
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(x[batch])
        loss = nn.functional.cross_entropy(logits.float(), y[batch])
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"[{step:04d}] loss: {loss.item():.5f} scale: {scaler.get_scale():.0f}", flush=True)
    with torch.no_grad():  # the trained network on every image, in float32
        print(f"final_eval {nn.functional.cross_entropy(model(x), y).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
