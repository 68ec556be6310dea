"""Finite-T statistics of one softmax row over T i.i.d. Gaussian logits of std s: E[Y_k], Y_k = sum_j A_j^k.

Exact at every T (issue 13; 001's REM laws are the T -> infinity limit, attention.participation): with
1/Z^k = int_0^inf t^(k-1) e^(-t Z) dt / Gamma(k) and E e^(-t Z) factorising over the keys,

    E[Y_k] = T / Gamma(k) int t^(k-1) psi_k(t) phi(t)^(T-1) dt,
    phi(t) = E exp(-t e^a),  psi_k(t) = E e^(k a) exp(-t e^a),

a one-dimensional integral (over ln t) of one-dimensional Gaussian integrals. Both are trapezoid sums over
uniform grids of smooth, fast-decaying integrands, so they converge geometrically (1e-13 at the grids below).
The engine reads E[Y2], E[Y3] and E[Y2^2] from a table of this quadrature over (s, ln T), shipped as softmax_rows.npz
(`python -m initadvisor.core.softmax_rows` rebuilds it; `... pairs` the two-row table, `... field` the field's
draws), bilinear in log Y between its nodes: within 0.3% (Y2), 1.1% (Y3) and 3% (Y2^2, largest where Y2^2 << Y2) of
the quadrature.

Causal rows past beta_c read keys that are not exchangeable: alike positions form clusters, and early keys stand
apart (field_rows_y2). Given the scores' shared part per group of keys (the field) the keys are independent again, so
the same quadrature with the keys' product over groups gives E[Y2 | field] exactly; the field alone is drawn.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from initadvisor.core.sorting import unique

TABLE = Path(__file__).with_name("softmax_rows.npz")
S_STEP, S_MAX = 0.1, 30.0  # the table's logit stds: 0, 0.1, ..., 30
L_STEP, L_MAX = 0.25, 17.0  # its ln T: 0 (one key, Y = 1), 0.25, ..., 17 (T = 2.4e7)
_Z_MAX = 9.0  # the Gaussian integrals over |z| <= 9 (the tail beyond carries 2e-19)


def _gauss(scale: float, logit_step: float, least: int = 41) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of E f(z), z ~ N(0, 1), over |z| <= 9, the logits scale z at most logit_step apart."""
    z = np.linspace(-_Z_MAX, _Z_MAX, max(least, int(2 * _Z_MAX * scale / logit_step) | 1))
    w = np.exp(-0.5 * z * z)
    return z, w / w.sum()


def row_moments(s: float, T, ks=(2, 3)) -> dict[int, np.ndarray]:
    """{k: E[Y_k]} for one logit std s at each T (array): the quadrature of the module docstring; k = 22 gives
    E[Y2^2] = T / 6 int t^3 psi_4 phi^(T-1) dt + T (T - 1) / 6 int t^3 psi_2^2 phi^(T-2) dt."""
    T = np.atleast_1d(np.asarray(T, dtype=float))
    z, wz = _gauss(max(s, 1.0), 0.4, least=201)
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
    np.savez(path, log_y=logs.astype(np.float32), s_step=S_STEP, l_step=L_STEP)  # (uncompressed: loads 5x faster)


_CHUNK = 1 << 16  # expected_y evaluates at most this many points at once


@lru_cache(maxsize=1)
def _table() -> np.ndarray:
    with np.load(TABLE) as f:
        return f["log_y"].astype(float)


def expected_y(s, T, first: int = 3) -> tuple[np.ndarray, ...]:
    """(E[Y2], E[Y3], E[Y2^2]) of a softmax row over T keys (T >= 1, at most e^17) with i.i.d. N(0, s^2) logits,
    from the table; beyond s = 30, 1 - Y falls as 1/s (the REM's (1 - Y) ~ 1/x). `first`: only the first of them
    (1: E[Y2] alone, a third of the work on a long causal sequence's rows)."""
    if np.ndim(T) == 0 and not math.isnan(T):  # one T (every stack's pair map): its slice of the table, cached
        return _at_one_T(_row_slice(float(T)), s, first)
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


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _at_ln_T(tab: np.ndarray, T: float, axis: int) -> np.ndarray:
    """A table (ln T along `axis`) at one T, linear in ln T between its nodes."""
    u = min(max(math.log(max(T, 1.0)), 0.0), L_MAX) / L_STEP
    j = min(int(u), tab.shape[axis] - 2)
    lo, hi = np.take(tab, j, axis), np.take(tab, j + 1, axis)
    return lo + (hi - lo) * (u - j)


@lru_cache(maxsize=512)
def _row_slice(T: float) -> np.ndarray:
    """The row table at one T: log E[Y2], log E[Y3], log E[Y2^2] over s (cached: read-only)."""
    return _read_only(_at_ln_T(_table(), T, 2))


def log_y2_table(T: float) -> np.ndarray:
    """log E[Y2] over the row table's logit stds (0, S_STEP, ..., S_MAX) at T keys, linear in ln T between the table's
    nodes as expected_y reads it (a fresh array: callers that keep one per T cache their own)."""
    return _at_ln_T(_table()[0], T, 1)


def s_node(s: float, n: int) -> tuple[int, float, float]:
    """(i, f, far) for one finite logit std s >= 0 on a row table of n s nodes: log Y at s is node i's plus f of the
    step to node i + 1 (s held at S_MAX beyond it), and Y = 1 - (1 - that) far (the REM's 1 - Y ~ 1/s past S_MAX)."""
    x = min(s, S_MAX) / S_STEP
    i = min(int(x), n - 2)
    return i, x - i, S_MAX / max(s, S_MAX)


def _at_one_T(tab: np.ndarray, s, first: int) -> tuple:
    """expected_y from one T's slice, linear in log Y over s; floats at one point (a stack's scalar pass calls it
    once a layer)."""
    n = tab.shape[1]
    if np.ndim(s) == 0:
        if math.isnan(s):
            return (np.float64(math.nan),) * first
        i, f, far = s_node(max(float(s), 0.0), n)
        return tuple(np.float64(1.0 - (1.0 - math.exp(a + (b - a) * f)) * far)
                     for a, b in tab[:first, i:i + 2].tolist())
    s = np.asarray(s, dtype=float)
    bad = np.isnan(s)
    s = np.where(bad, 0.0, np.maximum(s, 0.0))
    x = np.minimum(s, S_MAX) / S_STEP
    i = np.minimum(x.astype(int), n - 2)
    lo, hi = np.take(tab[:first], i, axis=1), np.take(tab[:first], i + 1, axis=1)  # (30x a mixed fancy index)
    y = np.exp(lo + (hi - lo) * (x - i))
    y = np.where(bad, np.nan, 1.0 - (1.0 - y) * (S_MAX / np.maximum(s, S_MAX)))
    return tuple(y[k][()] for k in range(first))


# ---------------------------------------------------------------------------------------------
# Two rows: their overlap E sum_j A_j B_j when their logits correlate (two tokens' queries on the same keys)

PAIRS = Path(__file__).with_name("softmax_pairs.npz")
P_S_STEP, P_S_MAX = 0.25, 30.0  # the overlap table's logit stds: 0, 0.25, ..., 30 (the row table's range)
P_U_STEP = 0.05  # its u = sqrt(1 - c): 0 (c = 1, Yp = Y2), 0.05, ..., 1 (c = 0, Yp = 1/T)


def pair_overlap(s: float, c: float, T, h: float = 0.4) -> np.ndarray:
    """E sum_j A_j B_j of two softmax rows over T keys (array) whose N(0, s^2) logits correlate c in [0, 1]: with
    1 / (Z_A Z_B) = int int e^(-t Z_A - u Z_B) dt du, the logits' shared part a x_j (a = s sqrt(c)) and own parts
    b y_j, b y'_j (b = s sqrt(1 - c)), the keys' expectation factorises into one over x of products of functions
    of ln t + a x and of ln u + a x alone (each an expectation over y): a matrix product over the x nodes, then
    Yp = T int int E_x[chi chi'] Phi^(T-1) d ln t d ln u. Trapezoid sums at step h in ln t (4e-4 at 0.4)."""
    T = np.atleast_1d(np.asarray(T, dtype=float))
    a, b = s * math.sqrt(c), s * math.sqrt(max(1.0 - c, 0.0))
    lam = np.arange(-_Z_MAX * s - math.log(T.max()) - 30.0, _Z_MAX * s + 30.0, h)  # ln t
    y, wy = _gauss(b, 1.5 * h)
    x, wx = _gauss(a, 1.5 * h)
    fine = np.arange(lam[0] - _Z_MAX * a - 1.0, lam[-1] + _Z_MAX * a + 1.0, h / 4)
    e = fine[:, None] + b * y[None, :]
    ee = np.exp(np.minimum(e, 700.0))
    omega = (-np.expm1(-ee)) @ wy  # 1 - E exp(-t e^(b y)) at ln t = fine
    chi = np.exp(e - ee) @ wy  # E t e^(b y) exp(-t e^(b y)), bounded by 1/e
    at = lam[None, :] + a * x[:, None]
    om, ch = np.interp(at, fine, omega), np.interp(at, fine, chi)
    om_mean = wx @ om
    one_minus_phi = om_mean[:, None] + om_mean[None, :] - (om * wx[:, None]).T @ om  # 1 - Phi(t, u), accurately
    num = (ch * wx[:, None]).T @ ch
    with np.errstate(divide="ignore"):
        log_phi = np.log1p(-np.minimum(one_minus_phi, 1.0))
    out = [1.0 if Ti <= 1.0 else min(Ti * float((num * np.exp((Ti - 1.0) * log_phi)).sum()) * h * h, 1.0)
           for Ti in T]
    return np.array(out)


def build_pair_table(path: Path = PAIRS) -> None:
    """Tabulate log E sum_j A_j B_j over (s, ln T, u = sqrt(1 - c)) (a few minutes) and save it."""
    s = np.arange(0.0, P_S_MAX + P_S_STEP / 2, P_S_STEP)
    lnT = np.arange(0.0, L_MAX + L_STEP / 2, L_STEP)
    u = np.arange(0.0, 1.0 + P_U_STEP / 2, P_U_STEP)
    logs = np.empty((s.size, lnT.size, u.size))
    few = lnT < math.log(2.0)  # between one key and two: linear in ln T, as the row table
    for i, si in enumerate(s):
        for k, uk in enumerate(u):
            m = np.log(pair_overlap(si, 1.0 - uk * uk, np.concatenate([[2.0], np.exp(lnT[~few])])))
            logs[i, ~few, k] = m[1:]
            logs[i, few, k] = m[0] * lnT[few] / math.log(2.0)
    np.savez(path, log_yp=logs.astype(np.float32), s_step=P_S_STEP, l_step=L_STEP, u_step=P_U_STEP)


@lru_cache(maxsize=1)
def _pair_table() -> np.ndarray:
    with np.load(PAIRS) as f:
        return f["log_yp"].astype(float)


def expected_overlap(s, T, c):
    """E sum_j A_j B_j of two softmax rows over T keys whose N(0, s^2) logits correlate c (clipped to [0, 1]), from
    the table, trilinear in log Yp over (s, ln T, sqrt(1 - c)); beyond s = 30 held there (rows all but one-hot:
    their overlap is how often they pick the same key)."""
    if np.ndim(T) == 0:  # the pair map's case: one T for every layer and grid point
        return _overlap_at(_pair_slice(float(T)), s, c)
    s, T, c = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (s, T, c)))
    out = np.full(s.shape, np.nan)
    for t in unique(T[~np.isnan(T)]):
        at = T == t
        out[at] = _overlap_at(_pair_slice(float(t)), s[at], c[at])
    return out


@lru_cache(maxsize=512)
def _pair_slice(T: float) -> np.ndarray:
    """The overlap table at one T: log Yp over (s, sqrt(1 - c))."""
    tab = _pair_table()
    if math.isnan(T):
        return _read_only(np.full((tab.shape[0], tab.shape[2]), np.nan))
    return _read_only(_at_ln_T(tab, T, 1))


def _overlap_at(tab: np.ndarray, s, c):
    """Bilinear in log Yp over one T's (s, sqrt(1 - c)) table; floats at one point (once a layer in a scalar pass)."""
    n1, n2 = tab.shape
    if np.ndim(s) == 0 and np.ndim(c) == 0:
        if math.isnan(s) or math.isnan(c):
            return np.float64(math.nan)
        x = min(max(float(s), 0.0), P_S_MAX) / P_S_STEP
        w = math.sqrt(min(max(1.0 - float(c), 0.0), 1.0)) / P_U_STEP
        i, k = min(int(x), n1 - 2), min(int(w), n2 - 2)
        fx, fw = x - i, w - k
        (a, b), (d, e) = tab[i:i + 2, k:k + 2].tolist()
        return np.float64(math.exp((a * (1 - fw) + b * fw) * (1 - fx) + (d * (1 - fw) + e * fw) * fx))
    s, c = np.broadcast_arrays(np.asarray(s, dtype=float), np.asarray(c, dtype=float))
    bad = np.isnan(s) | np.isnan(c)
    x = np.minimum(np.maximum(np.where(bad, 0.0, s), 0.0), P_S_MAX) / P_S_STEP
    w = np.sqrt(np.minimum(np.maximum(1.0 - np.where(bad, 0.0, c), 0.0), 1.0)) / P_U_STEP
    i, k = np.minimum(x.astype(int), n1 - 2), np.minimum(w.astype(int), n2 - 2)
    fx, fw = x - i, w - k
    flat, at = tab.ravel(), i * n2 + k  # the corners: + n2 (next s), + 1 (next u)
    lo = np.take(flat, at) * (1 - fw) + np.take(flat, at + 1) * fw
    hi = np.take(flat, at + n2) * (1 - fw) + np.take(flat, at + n2 + 1) * fw
    return np.where(bad, np.nan, np.exp(lo * (1 - fx) + hi * fx))[()]


if __name__ == "__main__":
    import sys

    {"pairs": build_pair_table, "field": build_field_table}.get(" ".join(sys.argv[1:]), build_table)()


# ------------------------------------------------------------------------------------------------
# Keys of unequal score variance: which keys a row's weight goes to


_KS_H, _KS_STEP = 0.5, 0.04  # the key shares' step in ln t, and their stds' in u = ln(1 + 2 s): 0.02 apart near 0, 4% far
_KS_W = np.arange(-_Z_MAX * 30.0 - 17.0 - 30.0, _Z_MAX * 30.0 + 30.0, _KS_H)  # ln t for every s <= 30, T <= e^17


def _key_node(j: int, stride: int) -> np.ndarray:
    """ln phi, ln(t^k psi_k) (k = 1, 2, 3, 4) over every stride-th point of _KS_W at the std s of u = j _KS_STEP
    (5, w): a view of the whole grid's, computed once per std."""
    return _key_node_all(j)[:, ::stride]


_KEY_MAX = 100.0  # a key's largest score std: its scores within 3 stds of 0 reach ln t = +-300, _KS_W's ends


@lru_cache(maxsize=256)  # j <= ln(1 + 2 _KEY_MAX) / _KS_STEP: 133 stds
def _key_node_all(j: int) -> np.ndarray:
    sig = math.expm1(j * _KS_STEP) / 2.0
    return _read_only(_wide_node(sig) if sig > S_MAX else _narrow_node(sig))


def _narrow_node(sig: float) -> np.ndarray:
    """_key_node_all's rows as Gaussian sums over z, the logits sig z at most _KS_H apart."""
    z, wz = _gauss(max(sig, 1.0), _KS_H, least=81)
    y = _KS_W[:, None] + sig * z[None, :]
    ey = np.exp(np.minimum(y, 700.0))
    with np.errstate(divide="ignore", over="ignore", under="ignore"):  # log 0 -> -1e6: e^-1e6 = 0, no nan from 0 x inf
        rows = [np.log1p(-np.minimum((-np.expm1(-ey)) @ wz, 1.0))] + [np.log(np.exp(k * y - ey) @ wz) for k in (1, 2, 3, 4)]
    return np.maximum(np.array(rows), -1e6)


def _wide_node(sig: float) -> np.ndarray:
    """_key_node_all's rows at a std past S_MAX, where the sum over z needs 36 sig nodes: the same Gaussian integrals
    over y = ln t + a instead, numerically where the integrands turn (-40 <= y <= 6, step 1/4) and in closed form
    beyond (e^-e^y = 1, 1 - e^-e^y = e^y below -40; 0 and 1 above 6), all in logs (within 2e-6 of step 1/10)."""
    from scipy.special import log_ndtr, logsumexp  # imported on use: `check` rarely needs it

    y = np.arange(-40.0, 6.125, 0.25)
    tw = np.full(y.size, 0.25)
    tw[[0, -1]] = 0.125
    w = _KS_W  # ln t
    ln_n = -0.5 * ((y[None, :] - w[:, None]) / sig) ** 2 + np.log(tw / (sig * math.sqrt(2.0 * math.pi)))[None, :]
    ey = np.exp(y)
    with np.errstate(divide="ignore"):
        above = np.logaddexp(logsumexp(ln_n + np.log(-np.expm1(-ey)), axis=1), log_ndtr((w - 6.0) / sig))
        one_minus = np.logaddexp(above, w + 0.5 * sig * sig + log_ndtr((-40.0 - w - sig * sig) / sig))  # ln(1 - phi)
        direct = np.logaddexp(logsumexp(ln_n - ey, axis=1), log_ndtr((-40.0 - w) / sig))  # ln phi
        rows = [np.where(one_minus < -math.log(2.0), np.log1p(-np.exp(np.minimum(one_minus, 0.0))), direct)]
    for k in (1, 2, 3, 4):  # below y = -40: int e^(k y) N(y; ln t, sig) dy
        tail = k * w + 0.5 * (k * sig) ** 2 + log_ndtr((-40.0 - w - k * sig * sig) / sig)
        rows.append(np.logaddexp(logsumexp(ln_n + k * y - ey, axis=1), tail))
    return np.maximum(np.array(rows), -1e6)


def key_shares(s, n, r) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows whose keys' scores vary unequally: row i has n[i, g] keys whose logits are i.i.d. N(0, s_i^2 r[i, g]) (the
    relative variances r averaging 1 over the row's keys, s_i <= 30; a key's std s_i r^(1/2) is taken at most 100, the
    ln t grid's reach). Per row and group, one key's E[A], E[A^2] and E[(M^2)_jj] = E[A^2 (1 - 2 A + Y2)] (M = diag A -
    A A^T, the softmax's Jacobian: the key's part of E tr M^2) over the row's mean of them (so sum_g n W = m): where a
    localized row's weight, and its scores' gradient, go. Uniform rows (s r alike) give 1; a key of larger variance wins
    a localized row more often. The quadrature of the module docstring with the keys' product over groups, E[A^k] = int
    t^k psi_k(t; s_g) prod_h phi(t; s_h)^n_h / phi(t; s_g) d ln t / Gamma(k) (E[A_j^2 A_k^2]: t^4 psi_2(s_g) psi_2(s_h)
    / Gamma(4) over both phis), its Gaussian integrals at stds 0.02 apart near 0 and 4% apart far (_key_node),
    log-linear in ln(1 + 2 s) between them: within 1% of sampled rows (test_softmax_rows)."""
    s, n, r = (np.asarray(a, dtype=float) for a in (s, n, r))
    on = n > 0
    sig = np.where(on, np.minimum(s[:, None] * np.sqrt(np.maximum(r, 0.0)), _KEY_MAX), 0.0)
    out = tuple(np.ones_like(sig) for _ in range(3))
    moves = np.any(on & (2.0 * s[:, None] ** 2 * np.abs(r - 1.0) >= 1e-4), axis=1)  # rows whose shares move (e^(2 s^2 (r - 1)))
    lo = np.where(on, sig, np.inf).min(axis=1, initial=np.inf)
    hi = sig.max(axis=1, initial=0.0)
    # rows deep in the uniform phase (x = s / sqrt(2 ln m) <= 1/4, m >= 500): the annealed shares e^(k^2 s_g^2 / 2),
    # within 2% of the quadrature there (0.3-0.5% at x 0.23, m 2000)
    m = n.sum(axis=1)
    annealed = moves & (m >= 500) & (hi <= 0.25 * np.sqrt(2.0 * np.log(np.maximum(m, 2.0))))
    for o, k in zip(out, (1.0, 2.0, 2.0)):
        e = np.where(on, np.exp(0.5 * k * k * np.where(annealed[:, None], sig, 0.0) ** 2), 0.0)
        o[annealed] = (e * (m / (n * e).sum(axis=1))[:, None])[annealed] + np.where(on, 0.0, 1.0)[annealed]
    moves &= ~annealed
    # the integrands in ln t are Gaussian smoothings of bumps of width 1 at the keys' stds: steps of a quarter of a
    # row's smallest (at least _KS_H; 1 where every std is below 1), rows of one step together
    stride = np.where(hi < 1.0, 2, np.maximum(1, np.where(moves, lo / (4.0 * _KS_H), 1.0).astype(int)))
    for st in np.unique(stride[moves]):
        rows = np.flatnonzero(moves & (stride == st))
        for o, x in zip(out, _key_moments(sig[rows], n[rows], int(st))):
            o[rows] = x
    return out


def _key_moments(sig, n, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """key_shares on rows of key stds sig (rows, groups), the ln t grid at stride x _KS_H: each row's moments at the std
    nodes around its keys' (one matrix product over ln t), log-linear between them."""
    on = n > 0
    hi = float(sig.max())
    u = np.log1p(2.0 * sig) / _KS_STEP
    j_lo = math.floor(float(u[on].min()))
    j_hi = max(math.ceil(float(u.max())), j_lo + 1)
    # below e^-15 of their peak 15 beyond the keys' extremes (t^k, k >= 1, on the left, a product of phis falling
    # faster than exponentially on the right)
    w = _KS_W[::stride]
    keep = (w > -_Z_MAX * hi - math.log(max(n.sum(axis=1).max(), 1.0)) - 15.0) & (w < _Z_MAX * hi + 15.0)
    lp, *lk = np.stack([_key_node(j, stride)[:, keep] for j in range(j_lo, j_hi + 1)], axis=1)  # (5, nodes, w)
    row, grp = np.nonzero(on)  # the rows' keys, row by row
    pos = np.clip(u[row, grp] - j_lo, 0.0, j_hi - j_lo)
    i0 = np.minimum(pos.astype(int), j_hi - j_lo - 1)
    f = pos - i0
    nk = n[row, grp]
    c = np.zeros((len(sig), j_hi - j_lo + 1))  # each row's keys on the nodes: ln prod_h phi_h^n_h = c @ ln phi
    np.add.at(c, (row, i0), nk * (1.0 - f))
    np.add.at(c, (row, i0 + 1), nk * f)
    back = c @ lp
    prod = np.exp(back - back.max(axis=1, keepdims=True))  # (a row's scale cancels in its shares)
    starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    at = np.cumsum(np.r_[False, row[1:] != row[:-1]])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        r1, r2, r3, r4 = (np.exp(np.minimum(t - lp, 300.0)) for t in lk)  # t^k psi_k / phi per node (nodes, w)
        nodes = (prod @ r1.T, prod @ r2.T, prod @ r3.T / 2.0, prod @ r4.T / 6.0,  # / Gamma(k)
                 ((prod * (c @ r2)) @ r2.T - prod @ (r2 * r2).T) / 6.0)  # E[A_j^2 A_k^2] over the row's other keys
        m1, m2, m3, m4, mx = (np.exp(np.log(L[row, i0]) * (1.0 - f) + np.log(L[row, i0 + 1]) * f) for L in nodes)
        out = []
        for x in (m1, m2, m2 - 2.0 * m3 + m4 + mx):  # E[A], E[A^2], E[(M^2)_jj] = E[A^2 (1 - 2 A + Y2)]
            mean = np.add.reduceat(nk * x, starts) / np.add.reduceat(nk, starts)  # the row's mean over its keys
            full = np.ones_like(sig)
            full[row, grp] = x / mean[at]
            out.append(full)
    return tuple(np.where(np.isfinite(x), x, 1.0) for x in out)


def power_sums(s, m) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(E[Y2], E[Y3], E[Y2^2], E[Y4]) of rows of m i.i.d. N(0, s^2) logits (s <= 30), one quadrature for all four so
    that gradients.jacobian_form's differences of them stay consistent: m E[A^k] = m / Gamma(k) int t^k psi_k
    phi^(m - 1) d ln t and E[sum_(i != j) A_i^2 A_j^2] = m (m - 1) / Gamma(4) int (t^2 psi_2)^2 phi^(m - 2) d ln t, at
    the key shares' std nodes (_key_node), log-linear in ln(1 + 2 s) between them: a whole array of rows at once, where
    row_moments is the direct quadrature at one s. One key: all 1; an unresolved row (s nan): nan."""
    s0, m = np.broadcast_arrays(np.asarray(s, dtype=float), np.maximum(np.asarray(m, dtype=float), 1.0))
    s = np.clip(np.nan_to_num(s0), 0.0, 30.0)
    u = np.log1p(2.0 * s) / _KS_STEP
    j = u.astype(int)
    out = np.empty((4,) + s.shape)
    for node in np.unique(j):  # each row at its two nodes (a deep stack's rows: a few nodes each)
        at = j == node
        mm = m[at][:, None]
        hi = math.expm1((node + 1) * _KS_STEP) / 2.0  # the integrands' reach in ln t, as in _key_moments
        keep = (_KS_W > -_Z_MAX * hi - math.log(float(mm.max())) - 15.0) & (_KS_W < _Z_MAX * hi + 15.0)
        y = []
        for n in (node, node + 1):
            lp, _, l2, l3, l4 = _key_node(int(n), 1)[:, keep]
            e2, e3, e4 = (np.exp(lk[None, :] + (mm - 1.0) * lp[None, :]).sum(axis=1) for lk in (l2, l3, l4))
            pair = np.exp(2.0 * l2[None, :] + np.maximum(mm - 2.0, 0.0) * lp[None, :]).sum(axis=1)
            m1 = m[at] * _KS_H
            y.append(np.array([m1 * e2, m1 * e3 / 2.0, m1 * (e4 + (m[at] - 1.0) * pair) / 6.0, m1 * e4 / 6.0]))
        f = u[at] - node
        with np.errstate(divide="ignore"):
            out[:, at] = np.exp(np.log(y[0]) * (1.0 - f) + np.log(y[1]) * f)
    return tuple(np.where(np.isnan(s0), np.nan, np.where(m <= 1.0, 1.0, x)) for x in out)


# ------------------------------------------------------------------------------------------------
# Keys whose scores share a positional structure: causal rows past beta_c


FIELD = Path(__file__).with_name("softmax_field.npz")
FIELD_DRAWS, FIELD_DIMS = 1024, 48  # the shipped field draws: scrambled Sobol normals (48 groups: T to 1e7 on
# Attention._field_factor's groups)
_FIELD_MAX = 60.0  # the largest field or own score std field_rows_y2 takes (twice the row tables' range)
_FIELD_H = 1.0  # the structured rows' least step in ln t (trapezoid on bumps of width 1: 4e-3 at worst, 1e-5 for std 1)
# field_rows' and field_key_half's least step: at 1 their keys of small own std (e^-t e^y: width 1 in ln t) made the
# key half 1% off and rippled it 0.5% with the field draws' phase on the lattice (post-LN 2.5 beta_c, T 64, block 18);
# at 0.5 within 0.03% of 0.35's, the ripple 1e-4
_FIELD_LAW_H = 0.5


def _field_step(sig: np.ndarray, m: float, least: float = _FIELD_H) -> float:
    """The ln t step of rows of up to m keys whose own scores have stds sig: a key's functions are Gaussian smoothings
    of width sig, and a product of m of them turns over within sig / sqrt(2 ln m) (the scale of the largest of m
    scores), so a step of half that (and `least` at least): the i.i.d. rows of std 4-50 within 0.2% of row_moments."""
    return max(least, float(np.min(sig)) / (2.0 * max(1.0, math.sqrt(2.0 * math.log(max(m, 1.0))))))


def build_field_table(path: Path = FIELD) -> None:
    """Save FIELD_DRAWS scrambled Sobol points in FIELD_DIMS dimensions as standard normals (scipy, once)."""
    from scipy.special import ndtri
    from scipy.stats import qmc

    z = ndtri(qmc.Sobol(FIELD_DIMS, scramble=True, seed=20261130).random(FIELD_DRAWS))
    np.savez(path, z=z.astype(np.float32))


@lru_cache(maxsize=1)
def _field_normals() -> np.ndarray:
    with np.load(FIELD) as f:
        return _read_only(f["z"].astype(float))


_FINE = 8  # the field functions' points per unit of ln t (cubic from the key nodes' 2 per unit: within 1e-4)
_FINE_N = int(round((_KS_W[-1] - _KS_W[0]) * _FINE)) + 1  # their points over _KS_W


@lru_cache(maxsize=1024)
def _field_node(j: int, k: int) -> np.ndarray:
    """At the key shares' std node j, over _KS_W: ln(-ln phi) (k 0) or ln(t^k psi_k) - ln phi (k 1..4), near-linear in
    ln t where phi is near 1 and smooth where it falls. Where ln phi < -30 the key takes e^-30 off every row's
    integrand (and the node's phi, 1 - (1 - phi) in float64, has lost its digits): held there (k 0) or marked -1e30."""
    lp, *lk = _key_node_all(j)
    dead = lp < -30.0
    if k == 0:
        with np.errstate(divide="ignore"):
            return _read_only(np.where(dead, math.log(30.0), np.log(np.maximum(-lp, 1e-300))))
    return _read_only(np.where(dead, -1e30, lk[k - 1] - lp))


def _catmull_rom(t):
    """The Catmull-Rom cubic's weights at nodes i - 1 .. i + 2 for the point i + t (0 <= t <= 1): exact for quadratics,
    continuous in value and slope from one interval to the next."""
    return (((-t + 2.0) * t - 1.0) * t / 2.0, ((3.0 * t - 5.0) * t * t + 2.0) / 2.0,
            ((-3.0 * t + 4.0) * t + 1.0) * t / 2.0, (t - 1.0) * t * t / 2.0)


@lru_cache(maxsize=1024)
def _fine_node(j: int, k: int) -> np.ndarray:
    """_field_node's row on ln t = _KS_W[0] + i / _FINE over all of _KS_W, cubic (Catmull-Rom) between the node's
    points; -1e30 (k >= 1) wherever the stencil touches a point past ln phi = -30."""
    v0 = _field_node(j, k)
    x = np.arange(_FINE_N) / (_FINE * _KS_H)  # in the node grid's index
    i = np.clip(x.astype(np.int64), 1, _KS_W.size - 3)
    wts = _catmull_rom(x - i)  # at i - 1 .. i + 2
    dead = np.zeros(i.shape, dtype=bool)
    for o in range(4):
        dead |= v0[i + o - 1] < -1e29
    V = sum(w * np.maximum(v0, -1e4)[i + o - 1] for o, w in enumerate(wts))
    return _read_only(np.where(dead, -1e30, V))


def _field_functions(sig: float, lo: float, hi: float, ks=(0, 2)) -> tuple[list, float]:
    """([one table per k], y0): _field_node's rows k at std sig on ln t = y0 + i / _FINE over [lo, hi] (held at
    _KS_W's ends), cubic (Catmull-Rom) in u = ln(1 + 2 sig) over the four nodes' fine tables (_fine_node) around it:
    smooth in sig, as the walk's second differences of the field law need; sig 0: exactly y (k 0) and k y (k >= 1)."""
    a = max(math.floor((lo - _KS_W[0]) * _FINE) - 1, 0)
    b = min(math.ceil((hi - _KS_W[0]) * _FINE) + 2, _FINE_N)
    b = max(b, a + 2)
    y0 = _KS_W[0] + a / _FINE
    if not sig > 0.0:
        y = y0 + np.arange(b - a) / _FINE
        return [y if k == 0 else k * y for k in ks], y0
    u = math.log1p(2.0 * min(sig, _KEY_MAX)) / _KS_STEP
    j = int(u)
    wts = _catmull_rom(u - j)
    out = []
    for k in ks:
        v = [_fine_node(max(j + o - 1, 0), k)[a:b] for o in range(4)]  # (below node 1 the first one twice)
        V = sum(w * x for w, x in zip(wts, v))
        out.append(V if k == 0 else np.where(np.min(v, axis=0) < -1e29, -1e30, V))
    return out, y0


def _own_variances(Fc: np.ndarray, J: np.ndarray, single: np.ndarray) -> np.ndarray:
    """How much of each one-key group's field variance can be its key's own (integrated exactly, not drawn): theta
    times its variance unique of the other groups (1 / (Fc^+)_gg), theta the largest that keeps the field positive
    semi-definite on the centred subspace (the law of a row does not see a shift common to its keys)."""
    G = len(single)
    if single.sum() < 1 or G < 2:
        return np.zeros(G)
    # (the symmetric pseudo-inverse, whose diagonal is >= 0: the SVD's went negative where groups nearly repeat, and
    # at most the group's whole variance: one in the field's null space, (Fc^+)_gg = 0, has none to move)
    inv = np.diag(np.linalg.pinv(Fc, rcond=1e-10, hermitian=True))
    u = np.where(single, np.minimum(1.0 / np.maximum(inv, 1e-300), np.maximum(np.diag(Fc), 0.0)), 0.0)
    Q = np.linalg.qr(np.eye(G)[:, :G - 1] - 1.0 / G)[0]  # an orthonormal basis of the centred subspace
    M = Q.T @ Fc @ Q
    B = Q.T @ (J * u) @ J.T @ Q
    L = np.linalg.cholesky(M + (1e-10 * max(np.trace(M), 1e-300)) * np.eye(G - 1))
    X = np.linalg.solve(L, np.linalg.solve(L, B).T)
    top = float(np.linalg.eigvalsh(X).max())
    return np.zeros(G) if not top > 0 else 0.999 * u / top


def _on_fine(tables, y0: float, y: np.ndarray) -> list[np.ndarray]:
    """e^table at y for each table, linear in the table between the fine points (held beyond them); tables of several
    rows (2-D) are read row by row with y's rows."""
    width = tables[0].shape[-1]
    x = np.clip((y - y0) * _FINE, 0.0, width - 1.0)
    i = np.minimum(x.astype(np.int64), width - 2)
    f = x - i
    if tables[0].ndim > 1:
        i = i + width * np.arange(tables[0].shape[0])[:, None]
    out = []
    for T in tables:
        T = T.ravel()
        out.append(np.exp(np.minimum(T[i] + (T[i + 1] - T[i]) * f, 600.0)))
    return out


def _prefix_rows(n: np.ndarray, a: np.ndarray, sig: np.ndarray) -> np.ndarray:
    """Mean over the draws (rows of a) of H sum over ln t of t^2 sum_k psi_2(k) / phi(k) prod_k phi(k): E[Y2 | a] of
    the rows over groups 0..r, a key of group g shifted by a[:, g] with own std sig[g]. t Z = u: the integrand is at
    most u^2 e^-u of the row, below e^-25 left of u = e^-12.5 and right of u = 35; Z between its keys' scores at -4.5
    and +4.5 stds (each side's tail: 3e-6)."""
    D, G = a.shape
    big = np.logaddexp.accumulate(np.log(n) + a + 4.5 * sig, axis=1)
    small = np.maximum.accumulate(a - 4.5 * sig, axis=1)
    h = _field_step(sig, float(n.sum()))
    left = np.floor((-big.max(axis=1) - 12.5) / h) * h  # on one lattice in ln t with _iid_rows
    nw = int(math.ceil(float((3.6 - small.min(axis=1) - left).max()) / h)) + 1
    w = left[:, None] + h * np.arange(nw)  # (D, nw)
    S = np.zeros((D, nw))
    num = np.zeros((D, nw))
    out = np.empty(G)
    for g in range(G):
        y = w + a[:, g:g + 1]
        tabs, y0 = _field_functions(float(sig[g]), float(y.min()), float(y.max()))
        eu, ev = _on_fine(tabs, y0, y)
        S += n[g] * eu
        num += n[g] * ev
        out[g] = float((np.exp(-S) * num).sum())
    return np.minimum(out * h / D, 1.0)


def _iid_rows(m: np.ndarray, sig: np.ndarray) -> np.ndarray:
    """E[Y2] of rows of m[r] i.i.d. keys of score std sig[r] by _prefix_rows' quadrature (each row on its own ln t
    grid), so that exchangeable keys give _prefix_rows' own numbers."""
    h = _field_step(sig[m > 1], float(m.max())) if np.any(m > 1) else _FIELD_H
    left = np.floor((-(np.log(m) + 4.5 * sig) - 12.5) / h) * h
    nw = int(math.ceil(float((3.6 + 4.5 * sig - left).max()) / h)) + 1  # (a row's own right end, or past it)
    w = left[:, None] + h * np.arange(nw)
    tabs = [_field_functions(float(s), float(w.min()), float(w.max())) for s in sig]  # one range: equal lengths
    eu, ev = _on_fine([np.stack([t[0][k] for t in tabs]) for k in (0, 1)], tabs[0][1], w)
    return np.minimum((np.exp(-m[:, None] * eu) * m[:, None] * ev).sum(axis=1) * h, 1.0)


def prefix_spread(n: np.ndarray, F: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Per prefix of key groups 0..r: its keys' mean centred variance, mean q less the mean overlap of two distinct
    keys (tr J K J / (m - 1)), for keys of groups n with overlaps F (F[g, g]: two of group g's keys) and own parts own
    (a key's q: F[g, g] + own[g]); 0 for one key."""
    n = np.asarray(n, dtype=float)
    m = np.cumsum(n)
    tot = np.cumsum(np.cumsum(F * np.multiply.outer(n, n), axis=0), axis=1).diagonal() + np.cumsum(n * own)
    trace = np.cumsum(n * (np.diag(F) + own))
    return np.where(m > 1, trace / m - (tot - trace) / (m * np.maximum(m - 1.0, 1.0)), 0.0)


def _field_basis(c: float, n: np.ndarray, F: np.ndarray, own: np.ndarray):
    """(c ev, vec, sig): the field's principal variances and directions as the scores see them (centred: a row does
    not see a shift common to its keys), after one-key groups' variance unique of the rest moved to their own parts
    (_own_variances: less to draw), and the keys' own score stds sig."""
    G = n.size
    m = np.cumsum(n)
    J = np.eye(G) - np.outer(np.ones(G), n / m[-1])
    ev, vec = np.linalg.eigh(J @ F @ J.T)
    Fc = (vec * np.maximum(ev, 0.0)) @ vec.T
    moved = _own_variances(Fc, J, n == 1)
    ev, vec = np.linalg.eigh(Fc - (J * moved) @ J.T)
    order = np.argsort(ev)[::-1]
    return c * np.maximum(ev[order], 0.0), vec[:, order], np.sqrt(c * np.maximum(own + moved, 0.0))


def _field_shifts(cev: np.ndarray, vec: np.ndarray, draws: int, smooth: bool = False) -> np.ndarray:
    """(draws, G): the keys' shifts by group, the first `draws` of the shipped QMC normals in the field's principal
    directions, largest first (pseudo-random normals beyond the table's dimensions: the smallest); one draw at 0 where
    no field is left. `smooth`: times the field's symmetric square root instead, a smooth map of the field where the
    principal directions swap and turn as two of their variances cross (the engine's maps stay smooth in their state,
    which the walk differentiates: 64 draws in the principal directions moved its factor by 1.2%), at some of the
    principal order's convergence (field_rows_y2's IPR at 256 draws, 2.5 beta_c, T 512: 4 points)."""
    G = len(cev)
    if cev[0] < 1e-8:
        return np.zeros((1, G))
    z = _field_normals()[:int(draws)]
    if G > z.shape[1]:
        z = np.concatenate([z, np.random.default_rng(G).standard_normal((z.shape[0], G - z.shape[1]))], axis=1)
    if smooth:
        return z[:, :G] @ ((vec * np.sqrt(cev)) @ vec.T)
    vec = vec * np.sign(vec[np.argmax(np.abs(vec), axis=0), np.arange(G)])  # one sign per direction, whatever eigh's
    return (z[:, :G] * np.sqrt(cev)) @ vec.T


def field_rows_y2(c: float, n: np.ndarray, F: np.ndarray, own: np.ndarray, draws=FIELD_DRAWS, negligible: float = 0.0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """E[Y2] of the rows over key groups 0..r, for every r, and of i.i.d. rows of each one's spread (the same
    quadrature, so that their ratio is exactly 1 for exchangeable keys): a key of group g (n[g] keys) scores
    sqrt(c) (f_g + e_k), the field f ~ N(0, F) shared by the group's keys (F[g, g] their common part), e_k ~ N(0,
    own[g]) its own. Given the field the keys are independent, so E[Y2 | f] is the module docstring's quadrature with
    the keys' product over groups, int t^2 sum psi_2 / phi prod phi d ln t at each key's shift (every prefix at once:
    cumulative sums); the field is drawn (the first `draws` of the shipped QMC normals, _field_shifts). One-key
    groups' variance unique of the rest moves to their own parts first (_own_variances): less
    to draw. `draws` may be increasing counts tried in turn: after each, where no row is `negligible` (relative) off
    the i.i.d. rows, they are the answer (both results i.i.d.)."""
    n = np.asarray(n, dtype=float)
    own = np.asarray(own, dtype=float)
    G = n.size
    m = np.cumsum(n)
    cev, vec, sig = _field_basis(c, n, F, own)
    s_iid = np.sqrt(c * np.maximum(prefix_spread(n, F, own), 0.0))  # i.i.d. rows of each prefix's spread
    if not (cev[0] <= _FIELD_MAX**2 and max(sig.max(), s_iid.max()) <= _FIELD_MAX):  # all but one-hot, or unresolved
        return np.ones(G), np.ones(G)
    iid = np.where(m > 1, _iid_rows(m, s_iid), 1.0)
    y = iid
    for d in np.atleast_1d(draws):
        y = np.where(m > 1, _prefix_rows(n, _field_shifts(cev, vec, d), sig), 1.0)
        if not np.max(np.abs(y / iid - 1.0)) >= negligible:
            return iid, iid
    return y, iid


def _field_integrands(c: float, n: np.ndarray, F: np.ndarray, own: np.ndarray, draws: int, ks: int):
    """The field law's integrands on one ln t lattice per draw: (h, S, [T_1 .. T_(ks - 1)]), h the lattice's step, S
    (G, D, nw) the rows' -ln prod phi over groups 0..r, T_k (G, D, nw) a key of group g's t^k psi_k / phi (field_rows'
    X, W); None where the rows are all but one-hot or unresolved (as field_rows_y2)."""
    cev, vec, sig = _field_basis(c, n, F, np.asarray(own, dtype=float))
    if not (cev[0] <= _FIELD_MAX**2 and sig.max() <= _FIELD_MAX):
        return None
    a = _field_shifts(cev, vec, draws, smooth=True)
    G, D = n.size, a.shape[0]
    big = np.logaddexp.accumulate(np.log(n) + a + 4.5 * sig, axis=1)
    small = np.maximum.accumulate(a - 4.5 * sig, axis=1)
    h = _field_step(sig, float(n.sum()), _FIELD_LAW_H)
    left = np.floor((-big.max(axis=1) - 20.0) / h) * h  # E[A]'s integrand, u e^-u: e^-20 of its peak at the left
    nw = int(math.ceil(float((3.6 - small.min(axis=1) - left).max()) / h)) + 1
    w = left[:, None] + h * np.arange(nw)  # (D, nw)
    y = w[None, :, :] + a.T[:, :, None]  # (G, D, nw): each group's keys at their shifts
    tabs = [_field_functions(float(x), float(y.min()), float(y.max()), tuple(range(ks))) for x in sig]  # one range
    eu, *T = (t.reshape(G, D, nw) for t in _on_fine([np.stack([t[0][k] for t in tabs]) for k in range(ks)],
                                                     tabs[0][1], y.reshape(G, -1)))
    return h, np.cumsum(n[:, None, None] * eu, axis=0), T


class FieldRows(NamedTuple):
    """field_rows' statistics per prefix r of the key groups (rows over groups 0..r) and per pair of prefixes."""
    y2: np.ndarray  # (G,) E[Y2]
    ea: np.ndarray  # (G, G) E[A_j] of one key of group g in row r
    out: np.ndarray  # (G,) a row's own output E[a^T C a]
    y1: np.ndarray  # (G, G) two rows' overlap E sum_j A_j B_j at one query
    slope: np.ndarray  # (G, G) its slope in the queries' correlation at independent queries
    o0: np.ndarray  # (G, G) two rows' output overlap E sum_jk C_jk A_j B_k at independent queries
    o1: np.ndarray  # (G, G) ... at one query
    oslope: np.ndarray  # (G, G) ... its slope at independent queries
    s0: np.ndarray  # (G, G) its same-key part E sum_j C_jj A_j B_j at independent queries
    s1: np.ndarray  # (G, G) ... at one query
    sslope: np.ndarray  # (G, G) ... its slope at independent queries


_CUMULATIVE = 4  # field_rows' points per ln t step in two rows' cumulative integral (within 0.5% of 32)


def field_rows(c: float, n: np.ndarray, F: np.ndarray, own: np.ndarray, Pv: np.ndarray, qv: np.ndarray,
               draws: int = 64):
    """Every one- and two-row statistic of field_rows_y2's rows (keys of group g scoring sqrt(c) (f_g + e_k)), exact
    given the field and averaged over its draws; the values of two distinct keys of groups g, h overlap Pv[g, h], a
    key's own qv[g]. Per prefix r (the rows over groups 0..r), with X = t psi_1 / phi, W = t^2 psi_2 / phi and e^-S
    the row's prod phi (1/Z^k = int t^k e^-tZ d ln t / Gamma(k)):
      y2[r] = E[Y2] = int e^-S sum n W;
      ea[r, g] = E[A_j] of one key of group g <= r = int e^-S X_g;
      out[r] = E[a^T C a] = int e^-S (sum_gh n_g n_h Pv_gh X_g X_h - sum_g n_g Pv_gg X_g^2 + sum_g n_g qv_g W_g);
      y1[r, r'] = E sum_j A_j B_j of rows r <= r' at one query: with Z' = Z + R and v = t + u, 1 / (Z Z') =
        int dv e^-vZ int_0^v e^-uR du, so y1 = int e^-S sum n W K, K(v) = int_0^v e^-S_R(u) du / v (cumulative,
        ln S_R linear in ln u between the ln t points, _CUMULATIVE points a step);
      slope[r, r'] = d/dx E sum_j A_j B_j at independent queries, x their correlation (the scores' cross-covariance
        x c K): Price's theorem gives c sum_i (a K b^T)_ii over row r's keys, a_ij = delta_ij E[A_i] - E[A_i A_j] of
        row r and b of row r' (E[A_j A_k] = int e^-S X_g X_h, E[A_j^2] = int e^-S W_g);
      o0, o1, oslope: the same three for two rows' output overlap E sum_jk C_jk A_j B_k: at independent queries the
        means' sum_jk C_jk E[A_j] E[B_k]; at one query y1's integral with the values' quadratic form for row r's keys,
        and for the later row's others int du e^-S_R X_k int_u^inf e^-S_r sum_j C_jk X_j d ln v (_cross_keys); the
        slope c tr(a K b^T C) (_pair_slopes);
      s0, s1, sslope: its same-key part E sum_j C_jj A_j B_j, the same three ways.
    None where the rows are all but one-hot or unresolved (as field_rows_y2)."""
    n = np.asarray(n, dtype=float)
    G = n.size
    field = _field_integrands(c, n, F, own, draws, 3)
    if field is None:
        return None
    h, S, (X, W) = field
    D = S.shape[1]
    E = np.exp(-S)
    nW = np.cumsum(n[:, None, None] * W, axis=0)
    scale = h / D
    y2 = np.einsum("rdw,rdw->r", E, nW) * scale
    ea = np.tril(np.einsum("rdw,gdw->rg", E, X)) * scale
    vs = _value_sums(n, X, W, Pv, qv)
    out = np.einsum("rdw,rdw->r", E, vs) * scale
    y1 = np.diag(y2).copy()
    Cd = np.asarray(qv, dtype=float) - np.diag(Pv)  # the values' overlaps: Pv by group pair plus Cd on a key's own
    nWq = np.cumsum((n * np.asarray(qv, dtype=float))[:, None, None] * W, axis=0)
    s1 = np.diag(np.einsum("rdw,rdw->r", E, nWq) * scale)
    sub = h / _CUMULATIVE  # a point's step: int over it of e^(ln u - ln v) g for g linear in ln u between its ends
    wa = -math.expm1(-sub)
    wb = 1.0 - wa / sub
    tw = np.exp(-h + sub * np.arange(_CUMULATIVE + 1)) * np.r_[0.0, np.full(_CUMULATIVE, wb)]
    tw[:-1] += np.exp(-h + sub * np.arange(1, _CUMULATIVE + 1)) * (wa - wb)
    decay = math.exp(-h)
    nX = n[:, None, None] * X
    o1 = np.diag(out)
    for r in range(G - 1):  # one query: the later rows' keys' integral K, under row r's integrands
        lo, hi, K = _later_keys(r, S, E[r] * nX[: r + 1].sum(axis=0), tw, decay)
        at = (slice(None), slice(lo, hi))
        y1[r, r + 1:], s1[r, r + 1:], o1[r, r + 1:] = (
            np.einsum("dw,pdw->p", (E[r] * I)[at], K) * scale for I in (nW[r], nWq[r], vs[r]))
        o1[r, r + 1:] += _cross_keys(r, h, S, nX, E, Pv) * scale
    y1 = np.triu(y1) + np.triu(y1, 1).T
    o1 = np.triu(o1) + np.triu(o1, 1).T
    s1 = np.triu(s1) + np.triu(s1, 1).T
    o0 = (ea * n) @ Pv @ (ea * n).T + (ea * n * Cd) @ ea.T
    slope, oslope, sslope = _pair_slopes(c, n, F, own, Pv, Cd, qv, E, X, W, ea, scale)
    return FieldRows(np.minimum(y2, 1.0), ea, out, np.minimum(y1, 1.0), slope, o0, o1, oslope,
                     (ea * n * np.asarray(qv, dtype=float)) @ ea.T, s1, sslope)


def _tail_integral(S: np.ndarray, Y: np.ndarray, h: float, sub: int = 4) -> np.ndarray:
    """int_(ln u)^inf e^-S Y d ln v at every lattice point (last axis, step h; S one row over the draws, Y one per
    group): on `sub` points a step with S and Y log-linear between the lattice points (S grows as v^k, Y as v on the
    left) and e^-S Y log-linear between those (the log-mean: a step of 1 in ln v, log-linear at the lattice points
    alone, takes 2-4% off a row's bump; 4 points within 0.1%)."""
    f = np.arange(sub + 1) / sub
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        lS, lY = np.log(np.maximum(S, 1e-300)), np.log(np.maximum(Y, 1e-300))
        Ss = np.exp(lS[..., :-1, None] + np.diff(lS)[..., None] * f)  # (1, D, w - 1, sub + 1)
        F = np.exp(-Ss) * np.exp(lY[..., :-1, None] + np.diff(lY)[..., None] * f)  # (G, D, w - 1, sub + 1)
        d = (Ss[..., :-1] - Ss[..., 1:]) + (np.diff(lY) / sub)[..., None]  # ln F's step between the points
        piece = np.where(np.abs(d) > 1e-9, (F[..., 1:] - F[..., :-1]) / d, F[..., :-1])
    step = np.nan_to_num(piece, nan=0.0, posinf=0.0).sum(axis=-1) * (h / sub)
    return np.concatenate([np.cumsum(step[..., ::-1], axis=-1)[..., ::-1], np.zeros(step.shape[:-1] + (1,))], axis=-1)


def _later_keys(r, S, I, tw, decay) -> tuple[int, int, np.ndarray]:
    """(lo, hi, K): K(v) = int_0^v e^-S_R(u) du / v for every later prefix r' > r (P, D, hi - lo), S_R = S_r' - S_r
    the later row's keys beyond row r's, on the lattice points lo:hi where row r's integrand I (D, w) is above 1e-12
    of its peak (and 5 points before): ln S_R linear between the points (len(tw) - 1 sub-steps a step, weights tw),
    a running sum decaying by e^-h a step (1 / (Z Z') = int dv e^-vZ v K(v), Z' = Z + R: field_rows' y1)."""
    from scipy.signal import lfilter

    on = np.flatnonzero(I.max(axis=0) > 1e-12 * I.max())
    lo, hi = max(int(on[0]) - 5, 0), int(on[-1]) + 1
    R = np.maximum(S[r + 1:, :, lo:hi] - S[r, :, lo:hi], 1e-300)
    eR = np.exp(-R)  # e^-S_R at the points, and within each step (ln S_R linear: S_R = R0 (R1 / R0)^f)
    sub = len(tw) - 1
    ratio = np.power(R[..., 1:] / R[..., :-1], 1.0 / sub)
    x, inner = R[..., :-1], []
    for _ in range(sub - 1):
        x = x * ratio
        inner.append(np.exp(-x))
    step = eR[..., :-1] * tw[0] + eR[..., 1:] * tw[-1] + sum(v * t for v, t in zip(inner, tw[1:-1]))
    first = -np.expm1(-R[..., :1]) / R[..., :1]  # K where S_R grows as u below: exact for S_R ~ u
    return lo, hi, lfilter([1.0], [1.0, -decay], np.concatenate([first, step], axis=-1), axis=-1)


def _cross_keys(r, h, S, nX, E, Pv) -> np.ndarray:
    """Per later prefix r' > r (before h / D): E sum_(j <= r, k in r' beyond r) C_jk A_j B_k of two rows at one query,
    j among row r's keys and k among the later row's others. 1 / (Z Z') = int dv e^-vZ int_0^v e^-uR du with the
    order of the integrals turned: int du e^-S_R X_k Lambda_k, Lambda_k(u) = int_u^inf e^-S_r sum_j C_jk X_j d ln v
    (_tail_integral of each group's X_j, C taken after: the values may be of either sign)."""
    Ix = E[r] * nX[: r + 1].sum(axis=0)  # row r's E[A] integrand: the tail integral's support (constant left of it,
    on = np.flatnonzero(Ix.max(axis=0) > 1e-12 * Ix.max())  # 0 right of it)
    a, b = max(int(on[0]) - 1, 0), int(on[-1]) + 2
    tail = np.zeros(nX[: r + 1].shape)
    tail[..., a:b] = _tail_integral(S[r][None, :, a:b], nX[: r + 1, :, a:b], h)
    tail[..., :a] = tail[..., a:a + 1]
    Lam = np.einsum("gk,gdw->kdw", Pv[: r + 1, r + 1:], tail)  # per later group k
    Z = np.einsum("pdw,kdw->pk", np.exp(-(S[r + 1:] - S[r])), nX[r + 1:] * Lam)
    return np.tril(Z).sum(axis=1)  # (the groups k up to r')


def _pair_slopes(c, n, F, own, Pv, Cd, qv, E, X, W, ea, scale) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """field_rows' slopes (G, G) per pair of prefixes r <= r' at independent queries (Price's theorem): c tr(a K b^T
    Q) with Q = I for the overlap sum_j A_j B_j and Q = C, the values' overlaps, for the output overlap sum_jk C_jk A_j
    B_k, and Q = diag(C) for its same-key part. Every matrix over keys here is block-constant by key group plus a diagonal per group, (P, d): a's P = -M, M_gh
    = E[A_j A_k] of two distinct keys, and d = E[A_i] - E[A_i^2] + M_gg; K's (F, own); C's (Pv, Cd). Such matrices
    multiply as (P N P' + P diag(d') + diag(d) P', d d'), N = diag(n), and tr = sum_g n_g (P_gg + d_g)."""
    G = n.size
    Ef, Xf = E.reshape(G, -1), X.reshape(G, -1)
    M = np.zeros((G, G, G))
    for r in range(G):  # (groups up to r: row r's keys)
        M[r, : r + 1, : r + 1] = (Xf[: r + 1] * Ef[r]) @ Xf[: r + 1].T * scale
    d = np.tril(ea - np.tril(Ef @ W.reshape(G, -1).T) * scale + np.diagonal(M, axis1=1, axis2=2))
    Pa = -M
    Pk = Pa @ (n[:, None] * F) + Pa * own[None, None, :] + d[:, :, None] * F[None]  # a K, per row
    dk = d * own

    def trace(Q, Dq):  # c tr((a K) (b Q)) for every pair of rows, b Q = (Pa N Q + Pa diag(Dq) + diag(d) Q, d Dq)
        Pb = Pa @ (n[:, None] * Q) + Pa * Dq[None, None, :] + d[:, :, None] * Q[None]
        db = d * Dq
        t = np.einsum("rgl,l,slg,g->rs", Pk, n, Pb, n) + np.einsum("rgg,sg,g->rs", Pk, db, n) \
            + np.einsum("rg,sgg,g->rs", dk, Pb, n) + (dk * n) @ db.T
        return c * (t + t.T) / 2.0  # (symmetric; this makes it so to the last bit)

    zero = np.zeros((G, G))
    return trace(zero, np.ones(G)), trace(np.asarray(Pv, dtype=float), Cd), trace(zero, np.asarray(qv, dtype=float))


def field_key_half(c: float, n: np.ndarray, F: np.ndarray, own: np.ndarray, Pv: np.ndarray, qv: np.ndarray,
                   rows, draws: int = 64):
    """Per row of `rows` (prefixes of field_rows' key groups) and key group g up to it: one key's E[(M C M)_jj] =
    E[A_j^2 (C_jj - 2 (C A)_j + A^T C A)] (M = diag A - A A^T, the softmax's Jacobian; C the values' overlaps, Pv and
    qv as field_rows'), the key's part of the query/key path's key half. With T_k = t^k psi_k / phi (T_1 = X, T_2 = W)
    and 1/Z^k = int t^k e^-tZ d ln t / Gamma(k), per key of group g in row r (sums over the row's other keys):
      q_g (W_g - T3_g + T4_g / 6) - W_g PX + T3_g PX / 3 + W_g (QW - q_g W_g + Q - 2 X_g PX) / 6
    under int e^-S, PX = sum_(k != j) P_gk X_k, QW = sum_k q_k W_k and Q = sum_(k != l) P_kl X_k X_l over the row's
    keys (PX's sums one matrix product a row). None where field_rows is."""
    n = np.asarray(n, dtype=float)
    G = n.size
    field = _field_integrands(c, n, F, own, draws, 5)
    if field is None:
        return None
    h, S, (X, W, T3, T4) = field
    D = S.shape[1]
    Pv, qv = np.asarray(Pv, dtype=float), np.asarray(qv, dtype=float)
    sums = _value_sums(n, X, W, Pv, qv)  # QW + Q per row
    # f = q (W - T3 + T4 / 6 - W^2 / 6) + W (QW + Q) / 6 + PX B, B = T3 / 3 - W - W X / 3, PX = V - Pv_gg X; each
    # a row per group over the draws' lattice points
    base = (qv[:, None, None] * (W - T3 + T4 / 6.0 - W * W / 6.0)).reshape(G, -1)
    B = (T3 / 3.0 - W - W * X / 3.0).reshape(G, -1)
    XB = X.reshape(G, -1) * B
    W, nX = W.reshape(G, -1), (n[:, None, None] * X).reshape(G, -1)
    out = np.zeros((len(rows), G))
    for i, r in enumerate(rows):
        k = r + 1
        E = np.exp(-S[r]).ravel()
        V = (Pv[:k, :k] * ((B[:k] * E) @ nX[:k].T)).sum(axis=1)  # sum_dw e^-S B_g sum_h Pv_gh n_h X_h
        out[i, :k] = base[:k] @ E + W[:k] @ (E * sums[r].ravel()) / 6.0 + V - np.diag(Pv)[:k] * (XB[:k] @ E)
    return out * h / D


def _value_sums(n, X, W, Pv, qv) -> np.ndarray:
    """(G, D, nw): per row over groups 0..r, sum_(k != l) Pv_kl X_k X_l + sum_k qv_k W_k over its keys (the values'
    quadratic form in the weights' integrands: field_rows' own output, field_key_half's Q + QW)."""
    Pv, qv = np.asarray(Pv, dtype=float), np.asarray(qv, dtype=float)
    nX = n[:, None, None] * X
    earlier = np.tensordot(np.tril(Pv, -1), nX, axes=(1, 0))  # sum over earlier groups h of Pv_gh n_h X_h
    inc = 2.0 * nX * earlier + np.diag(Pv)[:, None, None] * (nX * nX - n[:, None, None] * X * X) \
        + (n * qv)[:, None, None] * W
    return np.cumsum(inc, axis=0)
