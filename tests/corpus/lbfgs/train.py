"""Polynomial-feature ridge regression of a noisy sine, fitted with L-BFGS (a closure, no line
search by default, the step length set by --lr).

    python train.py --lr 0.5 --iters 40
"""

import argparse

import torch

import stabilizer_sentinel as sentinel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--iters", type=int, default=40, help="optimizer steps")
    parser.add_argument("--degree", type=int, default=7)
    parser.add_argument("--line_search", type=int, default=0, help="1: strong Wolfe line search")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    x = torch.linspace(-1, 1, 256).unsqueeze(1)
    y = torch.sin(3 * x) + 0.1 * torch.randn_like(x)
    features = torch.cat([x**k for k in range(args.degree + 1)], dim=1)
    model = torch.nn.Linear(args.degree + 1, 1, bias=False)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=args.lr, max_iter=5, history_size=10,
                                  line_search_fn="strong_wolfe" if args.line_search else None)
    guard = sentinel.watch(model, optimizer)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(features), y) + 1e-4 * model.weight.pow(2).sum()
        loss.backward()
        guard.step(loss)
        return loss

    for step in range(args.iters):
        loss = optimizer.step(closure)
        print(f"lbfgs step {step} objective {loss.item():.6g}", flush=True)
    with torch.no_grad():  # the fit's squared error, without the penalty
        print(f"final_eval {torch.nn.functional.mse_loss(model(features), y).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
