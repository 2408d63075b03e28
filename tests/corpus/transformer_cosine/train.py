"""A tiny Transformer language model on sequences from a random Markov chain, AdamW with a
linear warm-up and a cosine decay (the usual LambdaLR recipe).

    python train.py --lr 3e-3 --steps 150 --warmup_steps 20
"""

import argparse
import math

import torch
from torch import nn

VOCAB, LENGTH = 16, 24


class TinyLM(nn.Module):
    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.position = nn.Parameter(torch.randn(LENGTH, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, nhead=2, dim_feedforward=2 * d_model, dropout=0.0,
                                           batch_first=True)
        self.body = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LENGTH))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens) + self.position, mask=self.mask, is_causal=True))


def sample(transitions: torch.Tensor, batch: int, generator: torch.Generator) -> torch.Tensor:
    tokens = torch.empty(batch, LENGTH + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB, (batch,), generator=generator)
    for t in range(LENGTH):
        tokens[:, t + 1] = torch.multinomial(transitions[tokens[:, t]], 1, generator=generator).squeeze(1)
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup_steps", type=int, default=20)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--d_model", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(1234)
    # A sparse chain: each token has three likely successors, so there is a lot to learn.
    transitions = torch.full((VOCAB, VOCAB), 0.01)
    for token in range(VOCAB):
        transitions[token, torch.randperm(VOCAB, generator=generator)[:3]] = 1.0
    transitions /= transitions.sum(1, keepdim=True)

    model = TinyLM(args.d_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    def schedule(step: int) -> float:
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    for step in range(args.steps):
        tokens = sample(transitions, args.batch, generator)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"iter {step}: loss {loss.item():.4f}, lr {scheduler.get_last_lr()[0]:.2e}", flush=True)
    with torch.no_grad():  # the cross-entropy of 512 sequences, the same for every run
        tokens = sample(transitions, 512, torch.Generator().manual_seed(4321))
        entropy = nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        print(f"final_eval {entropy.item():.6g}", flush=True)


if __name__ == "__main__":
    main()
