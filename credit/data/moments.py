"""Mean and standard deviation accumulated chunk by chunk, in float64, numerically stable.

Each chunk contributes its count, its mean and its sum of squared deviations from that mean
(two passes over the chunk, so no large sum of squares is ever subtracted from another);
chunks are merged with the pairwise update of Chan, Golub and LeVeque (1979). Memory is
one chunk, whatever the number of chunks. Hand-written: numpy and xarray have no
streaming variance.
"""

from __future__ import annotations

import numpy as np


class RunningMoments:
    """Per name: count, mean and M2 (sum of squared deviations), over the reduced axes."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.mean: dict[str, np.ndarray] = {}
        self.m2: dict[str, np.ndarray] = {}

    def add(self, name: str, x: np.ndarray, axes: tuple[int, ...]) -> None:
        """Fold `x` into `name`, reducing over `axes` (the other axes are kept, e.g. levels)."""
        x = np.asarray(x, dtype=np.float64)
        n_b = int(np.prod([x.shape[a] for a in axes]))
        if n_b == 0:
            return
        mean_b = x.mean(axis=axes)
        m2_b = ((x - np.expand_dims(mean_b, axes)) ** 2).sum(axis=axes)
        if name not in self.count:
            self.count[name], self.mean[name], self.m2[name] = n_b, mean_b, m2_b
            return
        n_a, mean_a = self.count[name], self.mean[name]
        delta, n = mean_b - mean_a, n_a + n_b
        self.mean[name] = mean_a + delta * n_b / n
        self.m2[name] = self.m2[name] + m2_b + delta**2 * n_a * n_b / n
        self.count[name] = n

    def std(self, name: str) -> np.ndarray:
        """Population standard deviation (divides by the count)."""
        return np.sqrt(self.m2[name] / self.count[name])
