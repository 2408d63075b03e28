"""Write this example's data: scikit-learn's handwritten digits, each image read as a sequence of rows.

Each 8x8 image becomes 8 time steps of 8 pixel values in [0, 1]; the first 1,500 images train,
the other 297 test. scikit-learn ships the data, so this runs offline:

    python prepare_data.py            # writes data/train/digits.npz and data/test/digits.npz
"""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

TRAIN_SIZE = 1500


def main() -> None:
    digits = load_digits()
    sequences = (digits.data.reshape(-1, 8, 8) / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    here = Path(__file__).resolve().parent / "data"
    for split, rows in (("train", slice(0, TRAIN_SIZE)), ("test", slice(TRAIN_SIZE, None))):
        (here / split).mkdir(parents=True, exist_ok=True)
        np.savez_compressed(here / split / "digits.npz", x=sequences[rows], y=labels[rows])
        print(f"{split}: {len(labels[rows])} sequences -> {here / split / 'digits.npz'}")


if __name__ == "__main__":
    main()
