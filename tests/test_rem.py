"""The REM law of one attention row (paper 001 Result 1, B.3) against Monte-Carlo softmax rows.

Rows of T i.i.d. Gaussian scores of variance V = 2 x^2 ln T, x = beta / beta_c. Where the theory is
sharp (x <= 0.3: annealed, CLT regime) Y2 matches to 5% and Y3 to 25%; deep in the localized phase
the asymptotic 1 - 1/x is approached as T grows. The crossover (1/2 < x < 1) is only bracketed.
"""

import numpy as np
import pytest

from initadvisor.core.attention import beta_c, participation, phase


def mc_rows(T, x, rng, rows=3000):
    a = rng.standard_normal((rows, T)) * np.sqrt(2 * x * x * np.log(T))
    A = np.exp(a - a.max(1, keepdims=True))
    A /= A.sum(1, keepdims=True)
    return (A**2).sum(1).mean(), (A**3).sum(1).mean()


@pytest.mark.parametrize("T", [128, 512, 2048])
@pytest.mark.parametrize("x", [0.05, 0.2, 0.3])
def test_uniform_phase_matches_monte_carlo(T, x, rng):
    y2_mc, y3_mc = mc_rows(T, x, rng)
    y2, _, y3 = participation(np.array(x), np.array(1.0), 0.0, float(T))
    assert float(y2) == pytest.approx(y2_mc, rel=0.05)
    assert float(y3) == pytest.approx(y3_mc, rel=0.25)  # annealed Y3 is cruder: +23% at x = 0.3, T = 128
    assert float(y2) >= 1.0 / T  # the 1/T floor


def test_localized_phase_approaches_rem_law(rng):
    for x in (2.0, 3.0):
        errs = []
        for T in (128, 2048):
            y2_mc, y3_mc = mc_rows(T, x, rng, rows=1500)
            y2, _, y3 = participation(np.array(x), np.array(1.0), 0.0, float(T))
            assert float(y2) == pytest.approx(1 - 1 / x)
            assert float(y3) == pytest.approx((1 - 1 / x) * (2 - 1 / x) / 2)
            errs.append(abs(float(y2) - y2_mc) / y2_mc)
        assert errs[1] < errs[0] < 0.2  # finite-T error shrinks with T


def test_crossover_is_bracketed(rng):
    """Between beta_c/2 and beta_c the prediction lies between the annealed and the measured IPR."""
    T = 512
    for x in (0.6, 0.8):
        y2_mc, _ = mc_rows(T, x, rng, rows=1000)
        y2, _, _ = participation(np.array(x), np.array(1.0), 0.0, float(T))
        assert 1.0 / T < float(y2) <= y2_mc


def test_beta_c_and_phases():
    assert beta_c(1.0, 0.0) == pytest.approx(np.sqrt(2))  # 001 A.1: beta_c(rho = 0) = sqrt(2)
    assert beta_c(1.0, 0.5) == pytest.approx(2.0)  # post-LN: sqrt(2 / (1 - rho))
    assert list(phase(np.array([0.3, 0.8, 1.6]), np.sqrt(2))) == ["uniform", "crossover", "localized"]


def test_asymptotic_limit_is_paper_law():
    x = np.linspace(0.1, 4, 50)
    y2, yp, _ = participation(x, 1.0, 0.3, np.inf)
    assert np.allclose(y2, np.maximum(0, 1 - 1 / x)) and np.all(yp == 0)
