"""Activation kernels: second moments of phi and phi' on a Gaussian pair.

For (u, v) jointly Gaussian with E[u^2] = E[v^2] = q and E[uv] = p (rho = p/q):
    forward:  kq = E[phi(u)^2],   kp = E[phi(u) phi(v)]      (raw moments: the mean is kept)
    backward: dq = E[phi'(u)^2],  dp = E[phi'(u) phi'(v)]
kq and dq have q's shape, kp and dp q's and p's broadcast (one variance, many overlaps: the distance-resolved state).
Closed forms for relu and gelu; gelu_tanh uses gelu's (the two differ by < 5e-4 everywhere, the kernels by
< 0.1%); Mehler's series in rho for silu and tanh, its Hermite coefficients by 120-node Gauss-Hermite quadrature
(within 1e-7 of a dense 2-D quadrature to q 1, 1e-4 at q 3), one polynomial per distinct q, cached (a stack behind
a norm has one q). The causal engine's T x T kernels use the same series. All functions broadcast.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

SQRT2 = math.sqrt(2.0)


def _rho(q, p):
    return np.minimum(np.maximum(np.asarray(p, dtype=float) / q, -1.0), 1.0)


# --- ReLU: arc-cosine kernel (001 eq. 16; Cho & Saul 2009) -------------------------------------
def relu_forward(q, p):
    r = _rho(q, p)
    return q / 2.0, q / (2 * np.pi) * (np.sqrt(1 - r * r) + r * (np.pi - np.arccos(r)))  # 001 eq. 16


def relu_backward(q, p):
    r = _rho(q, p)
    return np.full_like(np.asarray(q, dtype=float), 0.5), 0.25 + np.arcsin(r) / (2 * np.pi)  # 004 A.4


# --- GeLU (exact x Phi(x)): closed forms of 004 A.5 (digest 1.5) --------------------------------
def gelu_forward(q, p):
    r = _rho(q, p)
    a = q / (q + 1)
    mean2 = q * q / (2 * np.pi * (q + 1))  # 004 A.5: mu = s^2 / sqrt(2 pi (s^2 + 1))
    kq = q / 4 + q / (2 * np.pi) * (np.arcsin(a) + 2 * q / (np.sqrt(2 * q + 1) * (q + 1)))  # 004 A.5 E[x_out^2]
    rq = r * q
    cov = q / (4 * np.pi) * (  # 004 A.5, Table 18 GeLU covariance
        np.pi * r + 2 * r * np.arcsin(rq / (q + 1))
        + 2 * q * (q * (1 - r * r) + 1 + r * r) / ((q + 1) * np.sqrt((q + 1) ** 2 - rq * rq))
        - 2 * a
    )
    return kq, cov + mean2


def gelu_backward(q, p):
    r = _rho(q, p)
    rq = r * q
    dq = 0.25 + np.arcsin(q / (q + 1)) / (2 * np.pi) + q * (5 * q + 3) / (
        2 * np.pi * (q + 1) * (2 * q + 1) ** 1.5)  # 004 A.5 backward variance
    dp = 0.25 + np.arcsin(rq / (q + 1)) / (2 * np.pi) + rq * ((2 * q + 3) * (q + 1) - 2 * rq * rq) / (
        2 * np.pi * (q + 1) * ((q + 1) ** 2 - rq * rq) ** 1.5)  # 004 A.5 backward covariance
    return dq, dp


# --- Quadrature for the others ------------------------------------------------------------------
def _erf(x):
    from scipy.special import erf

    return erf(x)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for any x


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _silu_derivative(x):
    s = _sigmoid(x)
    return s * (1 + x * (1 - s))


PHI = {
    "tanh": (np.tanh, lambda x: 1 - np.tanh(x) ** 2),
    "silu": (lambda x: x * _sigmoid(x), _silu_derivative),
    "gelu": (lambda x: 0.5 * x * (1 + _erf(x / SQRT2)),
             lambda x: 0.5 * (1 + _erf(x / SQRT2)) + x * np.exp(-x * x / 2) / math.sqrt(2 * np.pi)),
}


@lru_cache(maxsize=8)
def gauss_hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n nodes and weights of E f(Z), Z ~ N(0, 1) (probabilists' Hermite, weights summing to 1): the nodes are the
    eigenvalues of He's Jacobi matrix (Golub-Welsch), polished by one Newton step on the orthonormal He_n, the
    weights 1 / h_(n-1)(z)^2 (Christoffel-Darboux), symmetrised. numpy.polynomial's hermegauss does the same and
    costs 2.5 ms of `check`'s start-up to import."""
    k = np.sqrt(np.arange(1.0, n))
    z = np.linalg.eigvalsh(np.diag(k, 1) + np.diag(k, -1))
    h_n, h_n1 = _orthonormal_he(z, n)
    z = z - h_n / (math.sqrt(n) * h_n1)  # He_n' = n He_(n-1): orthonormal, h_n' = sqrt(n) h_(n-1)
    h_n1 = _orthonormal_he(z, n)[1]
    h_n1 = h_n1 / np.abs(h_n1).max()  # (no overflow at the outer nodes)
    w = 1.0 / (h_n1 * h_n1)
    z, w = (z - z[::-1]) / 2, (w + w[::-1]) / 2
    w = w / w.sum()
    z.flags.writeable = w.flags.writeable = False  # cached: shared by every caller
    return z, w


def _orthonormal_he(z: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(h_n(z), h_(n-1)(z)) of the orthonormal probabilists' Hermite polynomials h_k = He_k / sqrt(k!)."""
    prev, cur = np.zeros_like(z), np.ones_like(z)
    for j in range(n):  # h_(j+1) = (z h_j - sqrt(j) h_(j-1)) / sqrt(j+1)
        prev, cur = cur, (z * cur - math.sqrt(j) * prev) / math.sqrt(j + 1)
    return cur, prev


@lru_cache(maxsize=4)
def hermite_basis(n: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quadrature nodes/weights (probabilists') and orthonormal Hermite He_k(z)/sqrt(k!) at the nodes, k <= K."""
    z, w = gauss_hermite(n)
    H = np.empty((K + 1, n))
    H[0] = 1.0
    if K >= 1:
        H[1] = z
    for k in range(1, K):  # He_{k+1} = z He_k - k He_{k-1}, normalised by sqrt(k!)
        H[k + 1] = (z * H[k] - math.sqrt(k) * H[k - 1]) / math.sqrt(k + 1)
    return z, w, H


def series_coeffs(f, a: np.ndarray, K: int = 40, n: int = 120) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h (len(a), K+1), E f^2, truncation tail) with h_k(a) = E[f(sqrt(a) z) He_k(z)]/sqrt(k!)."""
    z, w, H = hermite_basis(n, K)
    with np.errstate(over="ignore", invalid="ignore"):
        fz = f(np.sqrt(a)[:, None] * z[None, :])
        h = (fz * w) @ H.T
        ef2 = (fz * fz) @ w
        return h, ef2, np.maximum(ef2 - (h * h).sum(1), 0.0)


def _mehler(h: np.ndarray, ef2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mehler's series cut where its terms fall below 1e-10 of E f^2: (h[:, :K+1], the tail sqrt(t_a)) with
    t_a = E f^2 - sum_k h_k(a)^2, which the series carries at r^(K+1)."""
    big = np.nonzero(np.max(h * h, axis=0) > 1e-10 * max(float(np.max(ef2)), 1e-300))[0]
    K = int(big[-1]) if len(big) else 0
    h = h[:, :K + 1]
    with np.errstate(invalid="ignore"):
        return h, np.sqrt(np.maximum(ef2 - (h * h).sum(1), 0.0))


def series_pair(f, a: np.ndarray, C: np.ndarray, K: int = 40) -> np.ndarray:
    """E[f(u) f(v)] by Mehler's formula: sum_k h_k(a) h_k(b) r^k, plus the truncation tail
    sqrt(t_a t_b) r^(K+1) (a: the variances of rows and columns alike)."""
    h, ef2, _ = series_coeffs(f, a, K)
    h, tail = _mehler(h, ef2)
    s = np.sqrt(a)
    r = np.clip(C / np.multiply.outer(s, s), -1.0, 1.0)
    out = np.broadcast_to(np.multiply.outer(tail, tail), r.shape).copy()  # (C may be one row's: 1 x n)
    term = np.empty((a.size, a.size))
    for k in range(h.shape[1] - 1, -1, -1):  # Horner in r from the tail's r^(K+1)
        out *= r
        out += np.multiply.outer(h[:, k], h[:, k], out=term)
    return out


@lru_cache(maxsize=256)
def _mehler_at(f, q: float) -> tuple[np.ndarray, float]:
    """(the polynomial in r of E[f(u) f(v)] at Var u = Var v = q, highest power first; E f^2), one q: cached (a
    stack's layers behind a norm share it)."""
    h, ef2, _ = series_coeffs(f, np.array([q]))
    h, tail = _mehler(h, ef2)
    return np.concatenate([tail * tail, (h[0] * h[0])[::-1]]), float(ef2[0])


def series(f, q, p):
    """(E[f(u)^2], E[f(u) f(v)]) with Var u = Var v = q, Cov p, by Mehler's series (series_pair at equal
    variances): a polynomial of degree <= 41 in rho per distinct q. The first has q's shape, the second q's and p's
    broadcast."""
    q = np.asarray(q, dtype=float)
    r = _rho(q, p)
    with np.errstate(over="ignore", invalid="ignore"):  # |r| <= 1: its powers do not overflow
        if q.size == 1:
            c, ef2 = _mehler_at(f, float(q.ravel()[0]))
            kp = c @ float(r.ravel()[0]) ** np.arange(c.size - 1.0, -1.0, -1.0) if r.size == 1 else np.polyval(c, r)
            return np.full(q.shape, ef2), np.reshape(kp, r.shape)
        u, inv = np.unique(q.ravel(), return_inverse=True)
        h, ef2, _ = series_coeffs(f, u)
        h, tail = _mehler(h, ef2)
        at = np.broadcast_to(inv.reshape(q.shape), r.shape)
        out = (tail * tail)[at]
        for k in range(h.shape[1] - 1, -1, -1):
            out = out * r + (h[:, k] * h[:, k])[at]
    return ef2[inv].reshape(q.shape), out


def forward(act: str, q, p):
    """(E[phi(u)^2], E[phi(u)phi(v)]) for the named activation."""
    if act == "relu":
        return relu_forward(q, p)
    if act in ("gelu", "geglu", "gelu_tanh"):
        return gelu_forward(q, p)
    if act == "linear":
        return np.asarray(q, dtype=float), np.asarray(p, dtype=float)
    return series(PHI["silu" if act == "swiglu" else act][0], q, p)


def backward(act: str, q, p):
    """(E[phi'(u)^2], E[phi'(u)phi'(v)]) for the named activation."""
    if act == "relu":
        return relu_backward(q, p)
    if act in ("gelu", "geglu", "gelu_tanh"):
        return gelu_backward(q, p)
    if act == "linear":
        return np.ones(np.shape(q)), np.ones(np.broadcast(q, p).shape)
    return series(PHI["silu" if act == "swiglu" else act][1], q, p)


def square_spread(act: str, q, gated: bool = False, n: int = 48):
    """(E f, Var f / (E f)^2, the elasticity d ln E f / d ln q) of one hidden unit's square f = phi(z)^2, z ~ N(0, q)
    (gated: f = phi(a)^2 b^2, a and b independent N(0, q)), per entry of q, by Gauss-Hermite quadrature: what a
    token's mean square over the units averages, how much it varies between tokens at finite width, and how it
    follows the input's scale (E[f He_2] / 2 E f, He_2 = z^2 / q - 1). One q: cached (a stack's layers behind a norm
    share it)."""
    if np.ndim(q) == 0:
        return _square_spread_at(act, float(q), gated, n)
    q = np.asarray(q, dtype=float)
    _, first, inv = np.unique(np.round(np.log(np.maximum(q, 1e-300)).ravel() * 1e6), return_index=True,
                              return_inverse=True)  # behind a norm every position has one q (to 1 part in 1e6)
    if first.size > 8:  # positions of their own q (no norm before): one quadrature over all of them
        return _square_spread(act, q, gated, n)
    at = np.array([_square_spread_at(act, float(x), gated, n) for x in q.ravel()[first]])
    return tuple(at[inv, k].reshape(q.shape) for k in range(3))


@lru_cache(maxsize=256)
def _square_spread_at(act: str, q: float, gated: bool, n: int) -> tuple:
    return tuple(np.float64(x) for x in _square_spread(act, q, gated, n))  # (numpy scalars: overflow is inf)


def _square_spread(act: str, q, gated: bool, n: int):
    z, w = gauss_hermite(n)
    q = np.asarray(q, dtype=float)
    s = np.sqrt(q)[..., None]
    phi = (lambda x: np.maximum(x, 0.0)) if act == "relu" else (lambda x: x) if act == "linear" else \
        _gelu_tanh if act in ("gelu", "gelu_tanh") else PHI[act][0]  # (GeLU's tanh form: no scipy at start-up)
    f = phi(s * z) ** 2
    m1, m2, h2 = f @ w, (f * f) @ w, (f * (z * z - 1.0)) @ w
    with np.errstate(divide="ignore", invalid="ignore"):
        if gated:  # E b^2 = q, E b^4 = 3 q^2, E[b^2 He_2(b)] = 2 q
            return m1 * q, np.where(m1 > 0, 3.0 * m2 / (m1 * m1) - 1.0, 0.0), np.where(m1 > 0, h2 / (2 * m1), 0.0) + 1.0
        return m1, np.where(m1 > 0, m2 / (m1 * m1) - 1.0, 0.0), np.where(m1 > 0, h2 / (2 * m1), 0.0)
