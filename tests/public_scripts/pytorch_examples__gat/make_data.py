"""Ours, not pytorch/examples': the Cora files main.py reads from ./cora, made offline.

main.py downloads Cora unless `cora/cora.content` and `cora/cora.cites` exist. This writes both in
Cora's format (a paper id, binary word features and a class name per line; citing pairs of ids) for
a synthetic citation graph: each node's class decides which words it tends to use and, mostly, which
nodes it cites, so that a graph network can learn the classes from words and neighbours.

    python make_data.py --nodes 1800 --words 64 --classes 7
"""

import argparse
import os

import numpy as np

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--nodes", type=int, default=1800, help="papers (main.py keeps 1600 for test and validation)")
parser.add_argument("--words", type=int, default=64, help="binary word features per paper")
parser.add_argument("--classes", type=int, default=7, help="classes, as Cora's seven")
parser.add_argument("--cites", type=int, default=3, help="citations per paper")
args = parser.parse_args()

rng = np.random.default_rng(0)
labels = rng.integers(0, args.classes, args.nodes)
word_rates = rng.uniform(0.02, 0.1, (args.classes, args.words))
word_rates[np.arange(args.classes)[:, None], rng.integers(0, args.words, (args.classes, 6))] = 0.5
features = (rng.random((args.nodes, args.words)) < word_rates[labels]).astype(np.int32)
ids = rng.permutation(np.arange(10_000, 10_000 + 10 * args.nodes))[: args.nodes]
os.makedirs("cora", exist_ok=True)
with open(os.path.join("cora", "cora.content"), "w") as f:
    for paper, row, label in zip(ids, features, labels, strict=True):
        f.write("\t".join([str(paper), *map(str, row), f"class_{label}"]) + "\n")
with open(os.path.join("cora", "cora.cites"), "w") as f:
    for index in range(args.nodes):
        for _ in range(args.cites):
            same = rng.random() < 0.8
            pool = np.flatnonzero(labels == labels[index]) if same else np.arange(args.nodes)
            f.write(f"{ids[rng.choice(pool)]}\t{ids[index]}\n")
print(f"cora: {args.nodes} papers, {args.words} words, {args.classes} classes, {args.nodes * args.cites} citations")
