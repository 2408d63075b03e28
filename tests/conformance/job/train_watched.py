"""The classifier of train_unchanged.py, changed the way Debugger's script-change examples change a
script, with stabilizer's library where smdebug's hook was:

    smdebug                                         stabilizer
    hook = smd.Hook.create_from_json_file()         guard = sentinel.watch(model, optimizer)
    hook.register_hook(model); hook.register_loss(criterion)
    hook.set_mode(smd.modes.EVAL) ... test loss     guard.eval_loss(test_loss, labels=y, outputs=logits)

The library reads the rules and collections the workflow sends (`sagemaker_stabilizer`).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import stabilizer_sentinel as sentinel
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
    guard = sentinel.watch(model, optimizer)
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x))
        for start in range(0, len(x), args.batch_size):
            batch = order[start : start + args.batch_size]
            optimizer.zero_grad()
            loss = criterion(model(x[batch]), y[batch])
            loss.backward()
            guard.step(loss, labels=y[batch], epoch=epoch)
            optimizer.step()
        model.eval()
        with torch.no_grad():
            logits = model(x_test)
            test_loss = criterion(logits, y_test)
        guard.eval_loss(test_loss, labels=y_test, outputs=logits)
        print(f"epoch={epoch} loss={loss.item():.4f} test_loss={test_loss.item():.4f}")
    guard.close()


if __name__ == "__main__":
    main()
