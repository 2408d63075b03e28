"""Classify handwritten digits with a small Transformer encoder reading each image row by row.

A user's own SageMaker script-mode training script, with its own hyperparameter names (`lr`,
`epochs`, `d_model`, `batch`, `clip`, `seed`), its own data format (`.npz` in the `train` and `test`
channels) and a model family of its own: a two-layer pre-norm Transformer encoder over the 8 rows of each 8x8
image. Trained with SGD and momentum at lr 0.25 it diverges within the first epoch (lr 0.125
trains). stabilizer protects it through the three
lines marked `# stabilizer`, and a fourth (`guard.restore()`) resumes a relaunch from the checkpoint the
sentinel kept from a few steps before the explosion; the library reaches the job on PYTHONPATH (the
workflow supplies it).

    python prepare_data.py
    SM_CHANNEL_TRAIN=data/train SM_CHANNEL_TEST=data/test SM_MODEL_DIR=/tmp/tf PYTHONPATH=../../model \\
      python train.py --lr 0.125
"""

import argparse
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

import stabilizer_sentinel as sentinel  # stabilizer


class RowTransformer(nn.Module):
    """Each image row is a token: a linear embedding, learned positions, two encoder layers, a mean pool."""

    def __init__(self, d_model: int, rows: int = 8, row_width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(row_width, d_model)
        self.position = nn.Parameter(torch.zeros(rows, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=2 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x) + self.position).mean(dim=1))


def load(channel: str) -> tuple[torch.Tensor, torch.Tensor]:
    with np.load(Path(channel) / "digits.npz") as data:
        return torch.from_numpy(data["x"]), torch.from_numpy(data["y"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--d_model", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--clip", type=float, default=0.0, help="max gradient norm; 0 turns clipping off")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    x, y = load(os.environ.get("SM_CHANNEL_TRAIN", "data/train"))
    x_test, y_test = load(os.environ.get("SM_CHANNEL_TEST", "data/test"))
    model = RowTransformer(args.d_model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    guard = sentinel.watch(model, optimizer)  # stabilizer
    start = guard.restore()  # stabilizer
    step = 0
    for epoch in range(args.epochs):
        for batch in torch.randperm(len(x)).split(args.batch):
            if step < start:  # done before the checkpoint it resumed from; the permutations still advance
                step += 1
                continue
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            if args.clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            guard.step(loss)  # stabilizer
            optimizer.step()
            if step % 5 == 0:
                print(f"step={step} epoch={epoch} loss={loss.item():.6g}", flush=True)
            step += 1
        with torch.no_grad():
            accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
        print(f"epoch={epoch} test_accuracy={accuracy:.4f}", flush=True)

    model_dir = Path(os.environ.get("SM_MODEL_DIR", "model"))
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), model_dir / "model.pt")


if __name__ == "__main__":
    main()
