"""A character-level language model: an Elman RNN (ReLU) over text from a small grammar, SGD with
gradient-norm clipping (`--clip`, 0 turns it off), truncated back-propagation through time.

    python train.py --lr 0.5 --clip 1.0 --steps 150
"""

import argparse
import random

import torch
from torch import nn

import stabilizer_sentinel as sentinel

SUBJECTS = ["the cat", "a dog", "my friend", "the old man", "she", "we"]
VERBS = ["sees", "likes", "finds", "walks past", "calls"]
OBJECTS = ["the river", "a red ball", "the house", "two birds", "her car"]


def text(seed: int, sentences: int = 400) -> str:
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(sentences))


class CharRNN(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.rnn = nn.RNN(hidden, hidden, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--bptt", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    corpus = text(args.seed)
    chars = sorted(set(corpus))
    data = torch.tensor([chars.index(c) for c in corpus])
    model = CharRNN(len(chars), args.hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    guard = sentinel.watch(model, optimizer)
    for step in range(args.steps):
        starts = torch.randint(len(data) - args.bptt - 1, (args.batch,))
        window = torch.stack([data[s:s + args.bptt + 1] for s in starts])
        logits = model(window[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, len(chars)), window[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        if args.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        guard.step(loss)
        optimizer.step()
        print(f"| step {step:4d} | loss {loss.item():8.4f} | ppl {loss.exp().item():10.2f}", flush=True)
    with torch.no_grad():  # the cross-entropy of the whole text, window by window
        window = data[:(len(data) - 1) // args.bptt * args.bptt + 1]
        inputs, targets = window[:-1].view(-1, args.bptt), window[1:].view(-1, args.bptt)
        entropy = nn.functional.cross_entropy(model(inputs).reshape(-1, len(chars)), targets.reshape(-1))
        print(f"final_eval {entropy.item():.6g}", flush=True)


if __name__ == "__main__":
    main()
