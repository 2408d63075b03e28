"""Linear regression on scikit-learn's make_regression with plain SGD: the loss falls slowly and
flattens out at the noise floor.

    python train.py --lr 0.003 --steps 250
"""

import argparse

import torch
from sklearn.datasets import make_regression

import stabilizer_sentinel as sentinel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--noise", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    features, target = make_regression(n_samples=1000, n_features=12, n_informative=6, noise=args.noise,
                                       random_state=args.seed)
    x = torch.tensor(features, dtype=torch.float32)
    y = torch.tensor(target, dtype=torch.float32).unsqueeze(1) / 50.0
    model = torch.nn.Linear(12, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    guard = sentinel.watch(model, optimizer)
    for step in range(args.steps):
        batch = torch.randint(len(x), (args.batch_size,))
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        guard.step(loss)
        optimizer.step()
        if step % 10 == 0:
            with torch.no_grad():
                full = torch.nn.functional.mse_loss(model(x), y).item()
            guard.eval_loss(full)
            print(f"step {step} full_mse {full:.5f}", flush=True)
        print(f"step {step} loss {loss.item():.5f}", flush=True)
    with torch.no_grad():  # the squared error over every sample
        print(f"final_eval {torch.nn.functional.mse_loss(model(x), y).item():.6g}", flush=True)


if __name__ == "__main__":
    main()
