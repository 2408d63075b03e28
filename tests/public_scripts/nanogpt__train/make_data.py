"""Ours, not nanoGPT's: the character-level data nanoGPT's train.py reads, made offline.

nanoGPT's data/shakespeare_char/prepare.py downloads tiny Shakespeare; no download is possible here,
so this writes the same three files from English text that scikit-learn ships with it (the
descriptions of its bundled datasets, about 15,000 characters): `data/<dataset>/train.bin` and
`val.bin` (uint16 character ids, 90 % / 10 %) and `meta.pkl` (`vocab_size`, `itos`, `stoi`), in the
working directory, where train.py looks for them (`--dataset=<dataset>`).

    python make_data.py --dataset descr_char
"""

import argparse
import os
import pickle

import numpy as np
from sklearn import datasets

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dataset", default="descr_char", help="the folder under data/ (train.py's --dataset)")
args = parser.parse_args()

text = "".join(getattr(datasets, name)().DESCR for name in (
    "load_iris", "load_digits", "load_wine", "load_breast_cancer", "load_diabetes", "load_linnerud"))
chars = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(chars)}
itos = dict(enumerate(chars))
ids = np.array([stoi[c] for c in text], dtype=np.uint16)
split = int(len(ids) * 0.9)
out = os.path.join("data", args.dataset)
os.makedirs(out, exist_ok=True)
ids[:split].tofile(os.path.join(out, "train.bin"))
ids[split:].tofile(os.path.join(out, "val.bin"))
with open(os.path.join(out, "meta.pkl"), "wb") as f:
    pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
print(f"{out}: {split:,} training and {len(ids) - split:,} validation characters, vocabulary {len(chars)}")
