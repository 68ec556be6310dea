"""The attention row law (paper 001 Result 1, B.3) against Monte-Carlo softmax rows.

Rows of T i.i.d. Gaussian scores of variance V = 2 x^2 ln T, x = beta / beta_c. participation's Y2 and Y3 are the
exact finite-T expectations (core.softmax_rows, tested in depth in test_softmax_rows.py) in every phase; the REM's
1 - 1/x is their T -> infinity limit.
"""

import numpy as np
import pytest

from initadvisor.core.attention import beta_c, participation, phase


def mc_rows(T, x, rng, rows=3000):
    a = rng.standard_normal((rows, T)) * np.sqrt(2 * x * x * np.log(T))
    A = np.exp(a - a.max(1, keepdims=True))
    A /= A.sum(1, keepdims=True)
    y2, y3 = (A**2).sum(1), (A**3).sum(1)
    return y2.mean(), y3.mean(), y2.std() / np.sqrt(rows), y3.std() / np.sqrt(rows)


@pytest.mark.parametrize("T", [128, 512, 2048])
@pytest.mark.parametrize("x", [0.05, 0.3, 0.6, 0.8, 1.5, 3.0])
def test_every_phase_matches_monte_carlo(T, x, rng):
    """Within 4 standard errors plus 1.5% (the table's interpolation) in the uniform phase, the crossover and the
    localized phase. The former laws (annealed, frozen at x = 1/2, or the REM) miss by 30-80% past x = 1/2."""
    y2_mc, y3_mc, s2, s3 = mc_rows(T, x, rng, rows=1500)
    y2, _, y3, _ = participation(np.array(x), np.array(1.0), 0.0, float(T))
    assert float(y2) == pytest.approx(y2_mc, abs=4 * s2 + 0.015 * y2_mc)
    assert float(y3) == pytest.approx(y3_mc, abs=4 * s3 + 0.015 * y3_mc)
    assert float(y2) >= 1.0 / T  # the 1/T floor


def test_localized_phase_approaches_rem_law():
    """Past beta_c the finite-T IPR lies above the REM's 1 - 1/x and approaches it as T grows."""
    for x in (2.0, 3.0):
        gaps = [float(participation(np.array(x), np.array(1.0), 0.0, float(T))[0]) - (1 - 1 / x)
                for T in (128, 2048, 1e6)]
        assert 0 < gaps[2] < gaps[1] < gaps[0] < 0.2


def test_beta_c_and_phases():
    assert beta_c(1.0, 0.0) == pytest.approx(np.sqrt(2))  # 001 A.1: beta_c(rho = 0) = sqrt(2)
    assert beta_c(1.0, 0.5) == pytest.approx(2.0)  # post-LN: sqrt(2 / (1 - rho))
    assert list(phase(np.array([0.3, 0.8, 1.6]), np.sqrt(2))) == ["uniform", "crossover", "localized"]


def test_asymptotic_limit_is_paper_law():
    x = np.linspace(0.1, 4, 50)
    y2, yp, _, _ = participation(x, 1.0, 0.3, np.inf)
    assert np.allclose(y2, np.maximum(0, 1 - 1 / x)) and np.all(yp == 0)


def _sums(K, C):
    """gradients.jacobian_form's eight sums over all keys of K and C, directly."""
    rK, rC = K.sum(1), C.sum(1)
    return (np.trace(K), np.trace(C), np.sum(np.diag(K) * np.diag(C)), K.sum(), C.sum(), (K * C).sum(),
            np.sum(np.diag(C) * rK + np.diag(K) * rC), np.sum(rK * rC))


@pytest.mark.parametrize("s2", [0.2, 0.5, 1.0, 2.0])
def test_coweighting_against_sampled_rows(s2):
    """A row of 48 keys, the first 6 alike and with large values (q 3, overlap 1.6 among them, 0.5 among the rest, 0.3
    across: a causal stream without an input norm), its scores Gaussian with covariance s2 K (K the keys' normalised
    overlaps): the output's fluctuation about its uniform part within 12% of 100k sampled rows (measured over rng seeds
    5-6: -4.4% .. -8.0%, the saturation's share growing with s2), where the mean field (Y2 - 1/m)(C_d - C_o) is
    2.4-2.6x low."""
    from initadvisor.core.attention import coweighted, coweighting

    m, k = 48, 6
    C = np.full((m, m), 0.3)
    C[:k, :k], C[k:, k:] = 1.6, 0.5
    C[np.diag_indices(m)] = np.where(np.arange(m) < k, 3.0, 1.0)
    K = C / np.sqrt(np.outer(np.diag(C), np.diag(C)))
    rng = np.random.default_rng(5)
    z = rng.standard_normal((100_000, m)) @ np.linalg.cholesky(K).T * np.sqrt(s2)
    a = np.exp(z - z.max(1, keepdims=True))
    a /= a.sum(1, keepdims=True)
    fluct = np.einsum("bi,ij,bj->b", a, C, a).mean() - C.sum() / m**2
    y2 = (a * a).sum(1).mean()
    gap = np.trace(C) / m - (C.sum() - np.trace(C)) / (m * (m - 1))
    x = np.sqrt(s2 * (1.0 - (K.sum() - m) / (m * (m - 1))) / (2.0 * np.log(m)))  # the scores' independent part
    assert coweighted(y2 - 1.0 / m, coweighting(m, x, _sums(K, C)), m) * gap == pytest.approx(fluct, rel=0.12)
    assert (y2 - 1.0 / m) * gap < 0.5 * fluct


def test_coweighting_is_one_for_keys_alike():
    """Keys alike (K and C constant off the diagonal) make tr(M K M C) the mean field's (phi = 1), and a row's
    fluctuation is its mean field's at every Y2."""
    from initadvisor.core.attention import coweighted, coweighting

    m = 40
    K, C = np.full((m, m), 0.4), np.full((m, m), 0.7)
    np.fill_diagonal(K, 1.0)
    np.fill_diagonal(C, 2.0)
    phi = coweighting(m, 0.3, _sums(K, C))
    assert phi == pytest.approx(1.0, rel=1e-12)
    for f in (0.5 / m, 0.3, 0.9):
        assert coweighted(f, phi, m) == pytest.approx(f, rel=1e-12)


def test_coweighted_rows_stay_below_a_one_key_row():
    """Whatever the keys' structure phi, a row's fluctuation share stays below a one-key row's 1 - 1/m (its output
    is then its key's) and reaches it at Y2 = 1; at small Y2 it is phi times the mean field's."""
    from initadvisor.core.attention import coweighted

    m = 64.0
    f = np.linspace(1e-4, 1.0 - 1.0 / m, 50)
    for phi in (0.3, 1.0, 4.0, 60.0):
        out = coweighted(f, phi, m)
        assert np.all(out <= 1.0 - 1.0 / m + 1e-12) and np.all(np.diff(out) > 0)
        assert out[-1] == pytest.approx(1.0 - 1.0 / m, rel=1e-12)
        assert out[0] == pytest.approx(phi * f[0], rel=0.01 * max(phi, 1.0))
