"""An ordinary script of a Debugger user's own whose loss is plain to see but is no loss module:
``F.cross_entropy``, a log line that says ``xent``, and the whole model saved at the end with
``torch.save(model, path)`` as pytorch/examples' scripts do. No import of stabilizer or smdebug.
Data: the ``train`` channel (x.npy: N x 64 float32; y.npy: N class indices)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    folder = Path(os.environ["SM_CHANNEL_TRAIN"])
    x = torch.from_numpy(np.load(folder / "x.npy"))
    y = torch.from_numpy(np.load(folder / "y.npy")).long()
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, int(y.max()) + 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        order = torch.randperm(len(x))
        for start in range(0, len(x), args.batch_size):
            batch = order[start:start + args.batch_size]
            optimizer.zero_grad()
            loss = functional.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} xent {loss.item():.4f}", flush=True)
    out = os.environ.get("SM_MODEL_DIR", "model_out")
    os.makedirs(out, exist_ok=True)
    torch.save(model, os.path.join(out, "model.pt"))


if __name__ == "__main__":
    main()
