"""Write this example's data: scikit-learn's diabetes regression set as CSV files.

442 patients, 10 features, one target (disease progression a year later). The first 350 rows
train, the other 92 test. scikit-learn ships the data, so this runs offline:

    python prepare_data.py            # writes data/train/diabetes.csv and data/test/diabetes.csv
"""

import csv
from pathlib import Path

from sklearn.datasets import load_diabetes

TRAIN_SIZE = 350


def main() -> None:
    data = load_diabetes()
    header = [*data.feature_names, "target"]
    rows = [[*features, target] for features, target in zip(data.data.tolist(), data.target.tolist(), strict=True)]
    here = Path(__file__).resolve().parent / "data"
    for split, part in (("train", rows[:TRAIN_SIZE]), ("test", rows[TRAIN_SIZE:])):
        (here / split).mkdir(parents=True, exist_ok=True)
        with open(here / split / "diabetes.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows([[f"{value:.6g}" for value in row] for row in part])
        print(f"{split}: {len(part)} rows -> {here / split / 'diabetes.csv'}")


if __name__ == "__main__":
    main()
