"""Activation kernels against Monte-Carlo: forward E[phi^2], E[phi phi] and backward E[phi'^2], E[phi' phi'].

The test's own activations and derivatives (scipy's normal CDF; central differences for the smooth ones)
are independent of the engine's closed forms and quadrature. Tolerance: 1% relative.
"""

import math

import numpy as np
import pytest
from scipy.stats import norm

from initadvisor.core import kernels

ACTS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: x * norm.cdf(x),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "linear": lambda x: x,
}


def deriv(name, x):
    if name == "relu":
        return (x > 0).astype(float)
    h = 1e-4
    return (ACTS[name](x + h) - ACTS[name](x - h)) / (2 * h)


@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("q,rho", [(0.5, 0.3), (1.0, 0.7), (3.0, 0.95), (1.0, 0.0)])
def test_kernel_matches_monte_carlo(name, q, rho, rng):
    n = 2_000_000
    z1, z2 = rng.standard_normal((2, n))
    u = np.sqrt(q) * z1
    v = np.sqrt(q) * (rho * z1 + np.sqrt(1 - rho**2) * z2)
    fu, fv, du, dv = ACTS[name](u), ACTS[name](v), deriv(name, u), deriv(name, v)
    samples = {"kq": fu**2, "kp": fu * fv, "dq": du**2, "dp": du * dv}
    kq, kp = kernels.forward(name, q, q * rho)
    dq, dp = kernels.backward(name, q, q * rho)
    got = {"kq": kq, "kp": kp, "dq": dq, "dp": dp}
    for key, x in samples.items():
        mc, se = x.mean(), x.std() / np.sqrt(n)
        # 1% relative; a cross moment that is ~0 (rho = 0, odd phi) is held to 4 Monte-Carlo standard errors
        assert abs(float(got[key]) - mc) <= max(0.01 * abs(mc), 4 * se), (key, got[key], mc)


def test_kernels_broadcast_over_grids():
    q = np.linspace(0.5, 2.0, 6)[:, None]
    p = q * np.linspace(0.0, 0.9, 4)[None, :]
    for name in ACTS:
        kq, kp = kernels.forward(name, q, p)
        assert np.shape(kp) == (6, 4)
        assert np.all(kp <= kq + 1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 12, 40, 96, 120, 200])
def test_gauss_hermite_nodes_and_weights(n):
    """Against numpy.polynomial's hermegauss (an independent implementation: companion matrix, its own recurrence),
    to 1e-12 in every node and weight (relative, the 1e-163 outer ones included), and exact on the even moments
    (2k - 1)!! that an n-node rule integrates (degree < 2n)."""
    z, w = kernels.gauss_hermite(n)
    zr, wr = np.polynomial.hermite_e.hermegauss(n)
    wr = wr / wr.sum()
    assert np.abs(z - zr).max() < 1e-12 * max(1.0, np.abs(zr).max())
    assert np.abs(w / wr - 1.0).max() < 1e-12
    for k in range(0, min(2 * n, 40), 2):
        assert (w * z**k).sum() == pytest.approx(math.prod(range(k - 1, 0, -2)), rel=1e-10)
