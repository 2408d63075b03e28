"""Ours, not pytorch/examples': the word-level corpus main.py reads (`--data`), made offline.

The example reads `train.txt`, `valid.txt` and `test.txt` from its `--data` folder (Wikitext-2 by
default). This writes those three files from English text that scikit-learn ships with it (the
descriptions of its bundled datasets: about 2,000 words, 1,000 distinct), split by line 80 / 10 / 10,
in the working directory.

    python make_data.py --out data/descr
"""

import argparse
import os

from sklearn import datasets

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", default="data/descr", help="the folder to write (main.py's --data)")
args = parser.parse_args()

text = "".join(getattr(datasets, name)().DESCR for name in (
    "load_iris", "load_digits", "load_wine", "load_breast_cancer", "load_diabetes", "load_linnerud"))
lines = [line for line in text.splitlines() if line.split()]
first, second = int(len(lines) * 0.8), int(len(lines) * 0.9)
os.makedirs(args.out, exist_ok=True)
for name, part in (("train.txt", lines[:first]), ("valid.txt", lines[first:second]), ("test.txt", lines[second:])):
    with open(os.path.join(args.out, name), "w", encoding="utf8") as f:
        f.write("\n".join(part) + "\n")
print(f"{args.out}: {first} / {second - first} / {len(lines) - second} lines")
