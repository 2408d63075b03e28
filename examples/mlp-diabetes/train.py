"""Regress diabetes progression with a small MLP: an ordinary SageMaker script-mode training script.

Nothing in this file knows about stabilizer. It reads its hyperparameters from the command line,
its data from the `train` and `test` channels and writes the model to SM_MODEL_DIR, as any
SageMaker PyTorch script does. stabilizer runs it unchanged through its launcher, which hooks the
optimizer globally and reads the loss from the `iter=... mse=...` lines that the job's metric
definition already matches.

    python prepare_data.py
    SM_CHANNEL_TRAIN=data/train SM_CHANNEL_TEST=data/test SM_MODEL_DIR=/tmp/mlp python train.py --step_size 0.1
"""

import argparse
import csv
import os
from pathlib import Path

import torch
from torch import nn


def read_csv(directory: str) -> tuple[torch.Tensor, torch.Tensor]:
    with open(Path(directory) / "diabetes.csv") as handle:
        rows = list(csv.reader(handle))[1:]
    values = torch.tensor([[float(v) for v in row] for row in rows])
    return values[:, :-1], values[:, -1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step_size", type=float, default=1.2)
    parser.add_argument("--n_iters", type=int, default=150)
    parser.add_argument("--minibatch", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--random_state", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.random_state)
    x, y = read_csv(os.environ.get("SM_CHANNEL_TRAIN", "data/train"))
    x_test, y_test = read_csv(os.environ.get("SM_CHANNEL_TEST", "data/test"))
    # Standardise features and target with the training split's statistics.
    x_mean, x_std, y_mean, y_std = x.mean(0), x.std(0), y.mean(), y.std()
    x, x_test = (x - x_mean) / x_std, (x_test - x_mean) / x_std
    y, y_test = (y - y_mean) / y_std, (y_test - y_mean) / y_std

    model = nn.Sequential(nn.Linear(x.shape[1], args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.step_size)
    generator = torch.Generator().manual_seed(args.random_state)
    for iteration in range(args.n_iters):
        rows = torch.randint(0, len(x), (args.minibatch,), generator=generator)
        loss = nn.functional.mse_loss(model(x[rows]).squeeze(1), y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"iter={iteration} mse={loss.item():.6g}", flush=True)

    with torch.no_grad():
        test_mse = nn.functional.mse_loss(model(x_test).squeeze(1), y_test).item()
    print(f"test_mse={test_mse:.6g}", flush=True)
    model_dir = Path(os.environ.get("SM_MODEL_DIR", "model"))
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), model_dir / "model.pt")


if __name__ == "__main__":
    main()
