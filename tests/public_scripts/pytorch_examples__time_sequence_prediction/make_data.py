"""Ours, not pytorch/examples': `traindata.pt`, the sine waves train.py reads, made offline.

Runs upstream's `generate_sine_wave.py` as it is (100 waves of 1,000 points, period 2 pi x 20, each
shifted by a random phase, numpy seed 2), then, with `--length N`, keeps the first N points of each wave
and saves the array the same way (a numpy array through torch.save). A step of train.py costs about its
length: at upstream's 1,000 points one LBFGS step (20 forward and backward passes) takes about 40 s on
one thread, at 200 about 9 s.

    python make_data.py --length 200
"""

import argparse
import runpy

import numpy as np
import torch

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--length", type=int, default=0, help="points kept of each wave (0: all 1,000)")
args = parser.parse_args()

runpy.run_path("generate_sine_wave.py", run_name="__main__")
if args.length:
    data = torch.load("traindata.pt", weights_only=False)  # upstream's own file, written just now
    with open("traindata.pt", "wb") as f:
        torch.save(np.ascontiguousarray(data[:, : args.length]), f)
    print(f"traindata.pt: {data.shape[0]} waves of {args.length} points (of {data.shape[1]})")
