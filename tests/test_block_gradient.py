"""benchmarks/block_gradient.py compares a block's gain five ways; where the gradient entering the block is the loss's
own isotropic one (the block at the top of its stack) its weights cannot have shaped it, so the five agree."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
pytest.importorskip("torch")
from block_gradient import block_gains  # noqa: E402


@pytest.mark.parametrize("seed", [1, 2])
def test_top_block_gains_agree_five_ways(seed):
    """Post-LN 2.5 beta_c, T 64, d 64, one layer, 128 sequences: own, fresh, shuffled, isotropic and own-isotropic gains within 4
    combined standard errors of each other (checked at seeds 0-5), and each between 1.5 and 4 (the engine's 2.41).
    Feeding the block its own input gradient instead (gain 1) or inverting the ratio (about 0.4) fails."""
    (m, se, engine) = block_gains(("post", 2.5, 64, False), 128, 1, [0], 64, seed)[0]
    for i in range(5):
        assert 1.5 < m[i] < 4.0, m
        for j in range(i):
            assert abs(m[i] - m[j]) <= 4.0 * np.hypot(se[i], se[j]), (i, j, m, se)
    assert 1.5 < engine < 4.0
