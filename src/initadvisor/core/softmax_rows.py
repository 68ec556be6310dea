"""Finite-T statistics of one softmax row over T i.i.d. Gaussian logits of std s: E[Y_k], Y_k = sum_j A_j^k.

Exact at every T (issue 13; 001's REM laws are the T -> infinity limit, attention.participation): with
1/Z^k = int_0^inf t^(k-1) e^(-t Z) dt / Gamma(k) and E e^(-t Z) factorising over the keys,

    E[Y_k] = T / Gamma(k) int t^(k-1) psi_k(t) phi(t)^(T-1) dt,
    phi(t) = E exp(-t e^a),  psi_k(t) = E e^(k a) exp(-t e^a),

a one-dimensional integral (over ln t) of one-dimensional Gaussian integrals. Both are trapezoid sums over
uniform grids of smooth, fast-decaying integrands, so they converge geometrically (1e-13 at the grids below).
The engine reads E[Y2], E[Y3] and E[Y2^2] from a table of this quadrature over (s, ln T), shipped as softmax_rows.npz
(`python -m initadvisor.core.softmax_rows` rebuilds it), bilinear in log Y between its nodes: within 0.3%
(Y2), 1.1% (Y3) and 3% (Y2^2, largest where Y2^2 << Y2) of the quadrature.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

TABLE = Path(__file__).with_name("softmax_rows.npz")
S_STEP, S_MAX = 0.1, 30.0  # the table's logit stds: 0, 0.1, ..., 30
L_STEP, L_MAX = 0.25, 17.0  # its ln T: 0 (one key, Y = 1), 0.25, ..., 17 (T = 2.4e7)
_Z_MAX = 9.0  # the Gaussian integrals over |z| <= 9 (the tail beyond carries 2e-19)


def row_moments(s: float, T, ks=(2, 3)) -> dict[int, np.ndarray]:
    """{k: E[Y_k]} for one logit std s at each T (array): the quadrature of the module docstring; k = 22 gives
    E[Y2^2] = T / 6 int t^3 psi_4 phi^(T-1) dt + T (T - 1) / 6 int t^3 psi_2^2 phi^(T-2) dt."""
    T = np.atleast_1d(np.asarray(T, dtype=float))
    z = np.linspace(-_Z_MAX, _Z_MAX, max(201, int(2 * _Z_MAX * max(s, 1.0) / 0.4) | 1))  # logit step <= 0.4
    wz = np.exp(-0.5 * z * z)
    wz /= wz.sum()
    g = s * z
    w = np.arange(-_Z_MAX * s - math.log(T.max()) - 30.0, _Z_MAX * s + 30.0, 0.2)  # ln t
    y = w[:, None] + g[None, :]  # ln(t e^a): every term below is bounded in it, so nothing overflows
    ey = np.exp(np.minimum(y, 700.0))
    Tc = T[:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # log 0 where phi underflows; T = 1 below
        log_phi = np.log1p(-np.minimum((-np.expm1(-ey)) @ wz, 1.0))[None, :]

        def log_tk_psi(k):  # ln(t^k psi_k(t))
            return np.log(np.exp(k * y - ey) @ wz)[None, :]

        out = {}
        for k in ks:
            if k == 22:
                f = np.exp(log_tk_psi(4) + (Tc - 1.0) * log_phi) / 6 + \
                    (Tc - 1.0) * np.exp(2 * log_tk_psi(2) + (Tc - 2.0) * log_phi) / 6
            else:
                f = np.exp(log_tk_psi(k) + (Tc - 1.0) * log_phi) / math.gamma(k)
            out[k] = np.where(T <= 1.0, 1.0, np.minimum(T * np.nan_to_num(f).sum(axis=1) * 0.2, 1.0))
    return out


def build_table(path: Path = TABLE) -> None:
    """Tabulate log E[Y2], log E[Y3], log E[Y2^2] over the (s, ln T) grid (about 30 s) and save it."""
    s = np.arange(0.0, S_MAX + S_STEP / 2, S_STEP)
    lnT = np.arange(0.0, L_MAX + L_STEP / 2, L_STEP)
    logs = np.empty((3, s.size, lnT.size))
    few = lnT < math.log(2.0)  # between one key (Y = 1) and two: linear in ln T (keys come in whole numbers)
    for i, si in enumerate(s):
        m = row_moments(si, np.concatenate([[2.0], np.exp(lnT[~few])]), ks=(2, 3, 22))
        two, rest = np.log([m[2][0], m[3][0], m[22][0]]), np.log([m[2][1:], m[3][1:], m[22][1:]])
        logs[:, i, ~few] = rest
        logs[:, i, few] = two[:, None] * lnT[few] / math.log(2.0)
    np.savez_compressed(path, log_y=logs.astype(np.float32), s_step=S_STEP, l_step=L_STEP)


_CHUNK = 1 << 16  # expected_y evaluates at most this many points at once


@lru_cache(maxsize=1)
def _table() -> np.ndarray:
    with np.load(TABLE) as f:
        return f["log_y"].astype(float)


def expected_y(s, T, first: int = 3) -> tuple[np.ndarray, ...]:
    """(E[Y2], E[Y3], E[Y2^2]) of a softmax row over T keys (T >= 1, at most e^17) with i.i.d. N(0, s^2) logits,
    from the table; beyond s = 30, 1 - Y falls as 1/s (the REM's (1 - Y) ~ 1/x). `first`: only the first of them
    (1: E[Y2] alone, a third of the work on a long causal sequence's rows)."""
    if np.ndim(s) == 0 and np.ndim(T) == 0 and not (math.isnan(s) or math.isnan(T)):
        return _one_point(float(s), float(T), first)
    s = np.asarray(s, dtype=float)
    if s.size > _CHUNK:  # a long causal sequence's rows: bounded temporaries
        s, T = np.broadcast_arrays(s, np.asarray(T, dtype=float))
        parts = [expected_y(a, b, first) for a, b in zip(np.array_split(s.ravel(), s.size // _CHUNK + 1),
                                                         np.array_split(T.ravel(), s.size // _CHUNK + 1))]
        return tuple(np.concatenate([p[k] for p in parts]).reshape(s.shape) for k in range(first))
    tab = _table()[:first]
    n1, n2 = tab.shape[1:]
    flat = tab.reshape(first, -1)
    bad = np.isnan(s) | np.isnan(T)  # an unresolved state (the engine reports it as such): nan, not an index
    s = np.where(bad, 0.0, np.maximum(s, 0.0))
    x = np.minimum(s, S_MAX) / S_STEP
    u = np.clip(np.log(np.maximum(np.where(bad, 1.0, T), 1.0)), 0.0, L_MAX) / L_STEP
    i = np.minimum(x.astype(int), n1 - 2)
    j = np.minimum(np.asarray(u).astype(int), n2 - 2)
    fx, fu = x - i, u - j
    shape = np.broadcast_shapes(np.shape(i), np.shape(j))
    k = np.broadcast_to(i * n2 + j, shape).ravel()  # the corners in the flattened table: + n2 (next s), + 1 (ln T)
    corner = [np.take(flat, k + o, axis=1).reshape((first,) + shape) for o in (0, n2, 1, n2 + 1)]
    log_y = (corner[0] * (1 - fx) + corner[1] * fx) * (1 - fu) + (corner[2] * (1 - fx) + corner[3] * fx) * fu
    y = np.exp(log_y)
    far = S_MAX / np.maximum(s, S_MAX)  # 1 beyond the table's range of s
    y = np.where(bad, np.nan, 1.0 - (1.0 - y) * far)
    return tuple(y[k][()] for k in range(first))


def _one_point(s: float, T: float, first: int) -> tuple[np.float64, ...]:
    """expected_y at one (s, T): the same bilinear interpolation in floats (a stack's scalar pass calls it once a
    layer; the array route costs 5x more there)."""
    tab = _table()
    s = max(s, 0.0)
    x = min(s, S_MAX) / S_STEP
    u = min(max(math.log(max(T, 1.0)), 0.0), L_MAX) / L_STEP
    i, j = min(int(x), tab.shape[1] - 2), min(int(u), tab.shape[2] - 2)
    fx, fu = x - i, u - j
    c = tab[:first, i:i + 2, j:j + 2]
    log_y = (c[:, 0, 0] * (1 - fx) + c[:, 1, 0] * fx) * (1 - fu) + (c[:, 0, 1] * (1 - fx) + c[:, 1, 1] * fx) * fu
    far = S_MAX / max(s, S_MAX)
    return tuple(np.float64(1.0 - (1.0 - math.exp(v)) * far) for v in log_y.tolist())


if __name__ == "__main__":
    build_table()
