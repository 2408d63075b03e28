"""A two-layer network on scikit-learn's two moons, written out by hand: parameters as tensors,
autograd for the gradients, the SGD update in a plain loop (no torch.optim).

    python train.py --lr 0.5 --epochs 300
"""

import argparse

import torch
from sklearn.datasets import make_moons


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=300, help="full-batch updates")
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--noise", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    points, labels = make_moons(n_samples=400, noise=args.noise, random_state=args.seed)
    x = torch.tensor(points, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.float32)
    w1 = (torch.randn(2, args.hidden) * 0.5).requires_grad_()
    b1 = torch.zeros(args.hidden, requires_grad=True)
    w2 = (torch.randn(args.hidden, 1) * 0.5).requires_grad_()
    b2 = torch.zeros(1, requires_grad=True)
    params = [w1, b1, w2, b2]
    for epoch in range(args.epochs):
        logits = (torch.tanh(x @ w1 + b1) @ w2 + b2).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.sub_(args.lr * p.grad)
        accuracy = ((logits > 0).float() == y).float().mean().item()
        print(f"epoch={epoch} loss={loss.item():.5f} acc={accuracy:.3f}", flush=True)
    with torch.no_grad():  # the loss of the weights the last update left
        logits = (torch.tanh(x @ w1 + b1) @ w2 + b2).squeeze(1)
        print(f"final_eval {torch.nn.functional.binary_cross_entropy_with_logits(logits, y).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
