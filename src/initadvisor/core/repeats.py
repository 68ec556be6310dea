"""Token repeats: positions that hold the same token share its embedding, so a row's scores on them correlate.

A softmax row over m keys whose tokens are i.i.d. Zipf (p_j ~ 1/j) and whose scores are a = b z_token + e eps,
b = sigma sqrt(c), e = sigma sqrt(1 - c) (c: the score correlation of two keys holding one token), puts on the
same-token key pairs s != s' the mass R = E sum A_s A_s'. The mean-field law takes every pair at the average
correlation, i.e. independent scores (c = 0); where the scores correlate a row weighs a repeated pair up to
e^(c sigma^2) times more (the annealed value, which a class of n copies cannot exceed: it holds at most its row's
mass). Exact at Poisson token counts (n_j ~ Poisson(m p_j), independent) with 1/Z^2 = int t e^(-t Z) dt:

    R = int dln t  Pi(t) sum_j (m p_j)^2 E_z[(t psi)^2 e^(m p_j (phi - 1))] / Phi_j(t),
    phi(t, z) = E_eps exp(-t e^a),  t psi(t, z) = E_eps t e^a exp(-t e^a),
    Phi_j(t) = E_z e^(m p_j (phi - 1)),  Pi(t) = prod_j Phi_j(t),

Gauss-Hermite over z and eps, the vocabulary's tail in logarithmic bins of j (exact to first order in m p_j).

Two rows with independent scores (different queries) weigh a key by its token's mean copy weight E[A_s] (the same
integral's first moment, `copy_weights`): a frequent token's copies share a score and its class's mass is concave in
it, so each copy gets less than 1/m, and two rows overlap on a token's copies less than the uniform law says.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from initadvisor.core.kernels import gauss_hermite
from initadvisor.core.sorting import unique

_HEAD = 16  # the most frequent tokens one by one, the rest in _BINS logarithmic bins of their rank
_BINS = 24
_NODES = 12  # Gauss-Hermite nodes over z and over eps
_DU = 0.5  # step of the ln t grid (the integrands are smooth in ln t)
# within 0.2% of 64 ranks, 96 bins, 16 nodes and step 0.125 (m 2-4096, sigma 0.3-3, c 0.5-1, vocabularies 100-152k)
SIGMA_MAX = 30.0  # beyond, a row sits on its top key or its top token's copies: the score std is held here


@lru_cache(maxsize=8)
def _zipf_bins(vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, sum p, sum p^2) per rank bin of the Zipf law over `vocab` tokens: the first _HEAD ranks exactly,
    the bins [a, b) beyond by the midpoint sums ln((b - 1/2) / (a - 1/2)) and 1/(a - 1/2) - 1/(b - 1/2) (relative
    error below 1e-3 from rank 16 on), in memory independent of the vocabulary."""
    head = min(_HEAD, vocab)
    edges = unique(np.round(np.geomspace(head + 1, vocab + 1, _BINS + 1))) if vocab > head else np.array([])
    a, b = edges[:-1] - 0.5, edges[1:] - 0.5
    j = np.arange(1, head + 1, dtype=float)
    s1 = np.concatenate([1.0 / j, np.log(b / a)])
    s2 = np.concatenate([1.0 / j**2, 1.0 / a - 1.0 / b])
    count = np.concatenate([np.ones(head), np.diff(edges)])
    total = s1.sum()
    return count, s1 / total, s2 / total**2


def _rows(vocab: int, m, sigma: float, c: float):
    """The quadrature's pieces for rows of lengths m (array, each >= 2), vectorised over m: (Pi(t) du over the ln t
    grid (m, u), t psi (m, u, z), e^(m p_j (phi - 1)) / Phi_j (m, u, z, bin), the z weights, and the Zipf bins'
    count, sum p, sum p^2)."""
    sigma = min(float(sigma), SIGMA_MAX)
    count, ps, ps2 = _zipf_bins(int(vocab))
    x, w = gauss_hermite(_NODES)
    xz, wz = (x, w) if c > 0 else (np.zeros(1), np.ones(1))  # independent scores: nothing shared to integrate
    b, e = sigma * math.sqrt(c), sigma * math.sqrt(1.0 - c)
    lo = -np.log(m) - 0.5 * sigma * sigma - 6.0 * sigma - 12.0  # ln t: every row's own window, one length
    u = lo[:, None] + _DU * np.arange(math.ceil((12.0 * sigma + 18.0 + 0.5 * sigma * sigma) / _DU))
    X = np.exp(np.minimum(u[:, :, None, None] + b * xz[:, None] + e * x, 700.0))  # t e^a: (m, u, z, eps)
    phi = np.exp(-X) @ w  # (m, u, z)
    tpsi = (X * np.exp(-X)) @ w
    lam = m[:, None] * ps / count  # a bin's mean m p_j: (m, bin)
    log_f = lam[:, None, None, :] * (phi[..., None] - 1.0)  # ln e^(m p_j (phi - 1)): (m, u, z, bin)
    top = log_f.max(axis=2)
    log_phi = np.log(np.einsum("z,muzk->muk", wz, np.exp(log_f - top[:, :, None, :]))) + top  # ln Phi_j
    return np.exp(log_phi @ count) * _DU, tpsi, np.exp(log_f - log_phi[:, :, None, :]), wz, (count, ps, ps2)


def repeat_mass(vocab: int, m, sigma: float, c: float) -> np.ndarray:
    """R(m) of the module docstring for each row length m (array; 0 for m < 2); sigma at most SIGMA_MAX."""
    return _mass(vocab, np.atleast_1d(np.asarray(m, dtype=float)), sigma, c)[0]


def copy_weights(vocab: int, m, sigma: float, c: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(f, sum p, sum p^2): f[row, bin] = m E[A_s] for a key s holding a token of the bin (1 under uniform rows),
    per row length m (array; 1 for m < 2), with its bins' sum p and sum p^2. A token's copies share its score, so
    a frequent token's class weighs less than its count (its mass n X / (n X + rest) is concave in its score
    X): f < 1 for the Zipf head, > 1 for rare tokens. E[A_s] = int dln t Pi(t) E_z[t psi e^(m p_j (phi - 1))] /
    Phi_j(t), normalised so that sum_j p_j f_j = 1 (a row's weights sum to 1; the Poisson counts' empty rows
    otherwise take e^(-m) of it)."""
    f = _mass(vocab, np.atleast_1d(np.asarray(m, dtype=float)), sigma, c)[1]
    _, ps, ps2 = _zipf_bins(int(vocab))
    return f, ps, ps2


def _mass(vocab: int, m: np.ndarray, sigma: float, c: float) -> tuple[np.ndarray, ...]:
    """(R(m), f(m), f per shared-score node (m, z, bin), the z weights) of repeat_mass and copy_weights from one
    quadrature: f is the z-nodes' weighted mean of the per-node copy weights."""
    count, ps, ps2 = _zipf_bins(int(vocab))
    nz = _NODES if c > 0 else 1
    R, fz = np.zeros(m.shape), np.ones((m.size, nz, count.size))
    wz = gauss_hermite(_NODES)[1] if c > 0 else np.ones(1)
    two = m >= 2
    if two.any():
        pi, tpsi, E, wz, _ = _rows(vocab, m[two], sigma, c)
        R[two] = np.sum(pi * (np.einsum("z,muz,muzk->muk", wz, tpsi**2, E) @ ps2), axis=1) * m[two] ** 2
        g = np.einsum("mu,muz,muzk->mzk", pi, tpsi, E)
        fz[two] = g / ((wz @ g) @ ps)[:, None, None]
    return R, np.where(two[:, None], wz @ fz, 1.0), fz, wz  # (one key: 1 exactly, not the z weights' rounded sum)


def repeat_excess(vocab: int, m, sigma: float, c: float) -> np.ndarray:
    """R(m) at the same-token correlation c minus the mean-field law's (c = 0): the same-token pairs' extra mass."""
    return repeat_mass(vocab, m, sigma, c) - repeat_mass(vocab, m, sigma, 0.0)


@lru_cache(maxsize=64)
def token_rows(vocab: int, lengths: tuple, sigma: float, c: float) -> tuple[np.ndarray, ...]:
    """(repeat_excess, copy_weights' f, f per shared-score node, its weights, sum p, sum p^2) at row lengths
    `lengths` from one quadrature (and the c = 0 one's mass), cached: a layer's own rows and its two rows' overlap
    ask for the same."""
    m = np.array(lengths, dtype=float)
    R, f, fz, wz = _mass(vocab, m, sigma, c)
    ex = R - _mass(vocab, m, sigma, 0.0)[0]
    for a in (ex, f, fz):
        a.flags.writeable = False
    return (ex, f, fz, wz, *_zipf_bins(int(vocab))[1:])


def at_lengths(rows, lengths: np.ndarray, table: np.ndarray) -> np.ndarray:
    """A table over row lengths (its first axis, at `lengths`) at other row lengths, linear in ln m; 1 (a lone key's
    copy weight) below the first length."""
    x, xp = np.log(np.atleast_1d(rows)), np.log(lengths)
    if xp.size == 1:
        t, i = np.zeros(x.shape), np.zeros(x.shape, dtype=int)
    else:
        i = np.clip(np.searchsorted(xp, x) - 1, 0, xp.size - 2)
        t = np.clip((x - xp[i]) / (xp[i + 1] - xp[i]), 0.0, 1.0)
    t = t.reshape(t.shape + (1,) * (table.ndim - 1))
    out = table[i] * (1.0 - t) + table[np.minimum(i + 1, xp.size - 1)] * t
    return np.where((x < xp[0]).reshape(t.shape), 1.0, out)


@lru_cache(maxsize=16)
def query_token_share(vocab: int) -> float:
    """sum p^3 / sum p^2: the probability of a token at a random position, for the token two positions that hold one
    token share (size-biased to the Zipf head); a bin's sum p^3 as (sum p^2)^2 / sum p (exact for the head's single
    tokens)."""
    _, ps, ps2 = _zipf_bins(int(vocab))
    return float(np.sum(ps2 * ps2 / ps) / ps2.sum())
