"""Logistic-regression-sized network on a synthetic classification set with noisy labels,
trained on batches of four: every step's loss is noisy, the trend is what counts.

    python train.py --lr 0.05 --batch_size 4 --steps 300

``--corrupt_step N``: the batch of step N holds one corrupt record (its features NaN), as a bad row
of a data file does; every other batch is clean.
``--loader 1``: the batches come from a shuffled ``DataLoader`` (seeded), pass after pass, where they are
otherwise drawn at random each step; ``--corrupt_record N`` makes record N of the data set NaN, so the
batch holding it is bad at every pass (another batch each pass: the order is shuffled).
"""

import argparse

import torch
from sklearn.datasets import make_classification
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--flip_y", type=float, default=0.1, help="share of labels assigned at random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corrupt_step", type=int, default=-1)
    parser.add_argument("--loader", type=int, default=0)
    parser.add_argument("--corrupt_record", type=int, default=-1)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    features, labels = make_classification(n_samples=1000, n_features=20, n_informative=8, n_classes=3,
                                           flip_y=args.flip_y, class_sep=1.5, random_state=args.seed)
    x = torch.tensor(features, dtype=torch.float32)
    y = torch.tensor(labels)
    if args.corrupt_record >= 0:
        x[args.corrupt_record] = float("nan")
    passes = None
    if args.loader:
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=args.batch_size,
                                             shuffle=True, generator=torch.Generator().manual_seed(args.seed))
        passes = (batch for _ in iter(int, 1) for batch in loader)
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        if passes is not None:
            inputs, targets = next(passes)
        else:
            batch = torch.randint(len(x), (args.batch_size,))
            inputs, targets = x[batch], y[batch]
        if step == args.corrupt_step:
            inputs[0] = float("nan")  # x[batch] is a copy: the data set itself stays clean
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step:{step} batch_loss:{loss.item():.5f}", flush=True)
    with torch.no_grad():
        finite = x.isfinite().all(1)
        print(f"final accuracy {(model(x[finite]).argmax(1) == y[finite]).float().mean().item():.3f}", flush=True)
        print(f"final_eval {nn.functional.cross_entropy(model(x[finite]), y[finite]).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
