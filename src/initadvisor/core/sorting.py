"""np.median and np.unique for the engine's 1-d arrays without numpy.ma: numpy 2 imports numpy.ma (8 ms) the first
time either runs, a tenth of `check`'s start-up."""

from __future__ import annotations

import math

import numpy as np


def median(x) -> float:
    """np.median of the values; nan if one is."""
    x = np.sort(np.ravel(np.asarray(x, dtype=float)))
    if not x.size or np.isnan(x[-1]):
        return math.nan
    return float(0.5 * (x[(x.size - 1) // 2] + x[x.size // 2]))


def unique(x) -> np.ndarray:
    """np.unique of the values (sorted, each once) for values without nan."""
    x = np.sort(np.ravel(x))
    return x[np.concatenate(([True], x[1:] != x[:-1]))] if x.size else x
