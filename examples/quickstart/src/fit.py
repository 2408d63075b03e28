"""Linear regression by full-batch gradient descent: an ordinary script that knows nothing of stabilizer.

Its hyperparameters are `--lr`, `--steps` and `--clip`; its data is the `points` channel
(`x.npy`, `y.npy`); it logs `iteration=<n> mse=<value>`. With inputs of unit variance the loss's
curvature is about 2, so gradient descent diverges for `lr` above 1 (1.6 overflows within a few
dozen steps) and converges below it.

    python prepare_data.py
    SM_CHANNEL_POINTS=data/points SM_MODEL_DIR=/tmp/quickstart-model python src/fit.py --lr 0.4
"""

import argparse
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--clip", type=float, default=0.0)
    args = parser.parse_args()

    points = Path(os.environ.get("SM_CHANNEL_POINTS", "data/points"))
    x = torch.from_numpy(np.load(points / "x.npy")).float()
    y = torch.from_numpy(np.load(points / "y.npy")).float()

    torch.manual_seed(0)
    model = nn.Linear(x.shape[1], 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    for iteration in range(args.steps):
        optimizer.zero_grad()
        loss = loss_fn(model(x).squeeze(-1), y)
        loss.backward()
        if args.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        print(f"iteration={iteration} mse={loss.item():.6g}", flush=True)

    model_dir = Path(os.environ.get("SM_MODEL_DIR", "model"))
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), model_dir / "model.pt")


if __name__ == "__main__":
    main()
