"""Ours, not nanoGPT's: the SageMaker entry point that runs nanoGPT's unchanged train.py.

SageMaker's training toolkit passes hyperparameters as `--name value`; nanoGPT's configurator takes
`--name=value` only (it asserts so). This joins each pair and runs train.py in this process with
runpy, as `python train.py --name=value ...` would run it (train.py reads configurator.py from the
working directory, which is this folder).
"""

import runpy
import sys

args = sys.argv[1:]
sys.argv = ["train.py", *(f"{name}={value}" for name, value in zip(args[::2], args[1::2]))]
runpy.run_path("train.py", run_name="__main__")
