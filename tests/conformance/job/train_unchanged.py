"""A Debugger user's zero-code-change script: no import of stabilizer (nor of smdebug), a `torch.nn`
loss module, an evaluation after each epoch. It runs under the launcher unchanged."""

from __future__ import annotations

import argparse

import torch
from torch import nn

from model import SmallNet, load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    x, y = load("train")
    x_test, y_test = load("test")
    model = SmallNet(int(y.max()) + 1)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x))
        for start in range(0, len(x), args.batch_size):
            batch = order[start : start + args.batch_size]
            optimizer.zero_grad()
            loss = criterion(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            logits = model(x_test)
            test_loss = criterion(logits, y_test).item()
            accuracy = (logits.argmax(1) == y_test).float().mean().item()
        print(f"epoch={epoch} loss={loss.item():.4f} test_loss={test_loss:.4f} test_accuracy={accuracy:.3f}")


if __name__ == "__main__":
    main()
