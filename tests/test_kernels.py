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


@pytest.mark.parametrize("name", ["silu", "tanh"])
def test_series_kernels_against_dense_quadrature(name):
    """SiLU's and tanh's kernels (Mehler's series, kernels.series) against a dense 2-D Gauss-Hermite quadrature of the
    test's own activation and central-difference derivative (numpy's hermegauss, 240 nodes a side), rho up to 1:
    within 1e-7 of E[phi^2] to q 1 and 1e-4 at q 3, where the series' 41st power carries a tail (the former 40-node
    quadrature: 1e-6 and 1e-2). Each q alone and all at once (the vectorised path) agree to 1e-10. SwiGLU's gate is
    SiLU's."""
    z, w = np.polynomial.hermite_e.hermegauss(240)
    w = w / w.sum()
    qs, rhos = np.array([0.01, 0.3, 1.0, 3.0]), np.array([-0.9, 0.0, 0.5, 0.9, 0.99, 0.999, 1.0])
    Q, R = np.meshgrid(qs, rhos, indexing="ij")
    for kind, f in (("forward", ACTS[name]), ("backward", lambda x: deriv(name, x))):
        got = getattr(kernels, kind)(name, Q, Q * R)
        for i, q in enumerate(qs):
            u = np.sqrt(q) * z
            kq = (f(u) ** 2 * w).sum()
            tol = 1e-7 if q <= 1.0 else 1e-4
            assert abs(got[0][i, 0] - kq) <= tol * kq
            for j, r in enumerate(rhos):
                v = np.sqrt(q) * (r * z[:, None] + np.sqrt(1 - r * r) * z[None, :])
                kp = (f(u)[:, None] * f(v) * w[:, None] * w[None, :]).sum()
                assert abs(got[1][i, j] - kp) <= tol * kq, (kind, q, r)
                one = getattr(kernels, kind)(name, q, q * r)
                assert abs(one[1] - got[1][i, j]) <= 1e-10 * kq and abs(one[0] - got[0][i, j]) <= 1e-10 * kq
    assert np.array_equal(kernels.forward("swiglu", Q, Q * R), kernels.forward("silu", Q, Q * R))
