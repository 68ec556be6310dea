"""benchmarks/two_row_shape.py: the slope of two softmax rows' overlap in their queries' correlation at independent
queries, by Price's theorem from one row's moments, against the sampled overlap's central difference."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from two_row_shape import LAYOUTS, overlaps, positional, price_slope  # noqa: E402


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
@pytest.mark.parametrize("seed", [0, 1])
def test_price_slope_is_the_overlaps_slope_at_independent_queries(layout, seed):
    """(Y(e) - Y(-e)) / 2e at e = 0.05 over 40000 row pairs (common normals) within 8% of c sum_i (a K a^T)_ii
    (measured 0.7-3.6% over seeds 0-2); with E[A] E[A]^T for E[A A^T], or K left out, it is 2-7x off."""
    n, structure, c = LAYOUTS[layout]
    K = positional(n, *structure)
    Y, A = overlaps(K, c, (-0.05, 0.05), 40000, np.random.default_rng(seed))
    assert price_slope(A, K, c) == pytest.approx((Y[1] - Y[0]) / 0.1, rel=0.08)
