"""Write the `points` channel: 256 points with 4 unit-variance features and a noisy linear target."""

from pathlib import Path

import numpy as np

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 4)).astype(np.float32)
y = (x @ np.array([1.5, -2.0, 0.5, 1.0], dtype=np.float32) + 0.1 * rng.standard_normal(256)).astype(np.float32)
out = Path(__file__).resolve().parent / "data" / "points"
out.mkdir(parents=True, exist_ok=True)
np.save(out / "x.npy", x)
np.save(out / "y.npy", y)
