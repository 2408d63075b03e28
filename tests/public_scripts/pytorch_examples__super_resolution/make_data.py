"""Ours, not pytorch/examples': the BSDS300 folder data.py would download, made offline.

data.py downloads BSDS300 into `dataset/BSDS300/images/{train,test}` unless that folder exists.
This writes it from the two photographs scikit-learn ships with it (`load_sample_images`, 427 x 640):
square crops of 256 x 256 at fixed offsets, as JPEG files, in the working directory.

    python make_data.py --train 12 --test 4
"""

import argparse
import os

import numpy as np
from PIL import Image
from sklearn.datasets import load_sample_images

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--train", type=int, default=12, help="training images")
parser.add_argument("--test", type=int, default=4, help="test images")
args = parser.parse_args()

photos = load_sample_images().images
rng = np.random.default_rng(0)
root = os.path.join("dataset", "BSDS300", "images")
for split, count in (("train", args.train), ("test", args.test)):
    os.makedirs(os.path.join(root, split), exist_ok=True)
    for index in range(count):
        photo = photos[index % len(photos)]
        top = int(rng.integers(0, photo.shape[0] - 256))
        left = int(rng.integers(0, photo.shape[1] - 256))
        crop = Image.fromarray(photo[top:top + 256, left:left + 256])
        crop.save(os.path.join(root, split, f"{split}_{index:03d}.jpg"), quality=95)
print(f"{root}: {args.train} training and {args.test} test images of 256 x 256")
