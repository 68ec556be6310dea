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


def repeat_mass(vocab: int, m, sigma: float, c: float) -> np.ndarray:
    """R(m) of the module docstring for each row length m (array; 0 for m < 2); sigma at most SIGMA_MAX."""
    m = np.atleast_1d(np.asarray(m, dtype=float))
    sigma = min(float(sigma), SIGMA_MAX)
    count, ps, ps2 = _zipf_bins(int(vocab))
    x, w = gauss_hermite(_NODES)
    xz, wz = (x, w) if c > 0 else (np.zeros(1), np.ones(1))  # independent scores: nothing shared to integrate
    b, e = sigma * math.sqrt(c), sigma * math.sqrt(1.0 - c)
    out = np.zeros(m.shape)
    for k, mk in enumerate(m):
        if mk < 2:
            continue
        lo = -math.log(mk) - 0.5 * sigma * sigma - 6.0 * sigma - 12.0
        hi = -math.log(mk) + 6.0 * sigma + 6.0
        u = np.arange(lo, hi, _DU)
        y = u[:, None, None] + b * xz[None, :, None] + e * x[None, None, :]  # ln(t e^a): (u, z, eps)
        X = np.exp(np.minimum(y, 700.0))
        phi = np.exp(-X) @ w  # (u, z)
        tpsi = (X * np.exp(-X)) @ w
        lam = mk * ps / count  # a bin's mean m p_j
        log_f = lam[None, None, :] * (phi[:, :, None] - 1.0)  # ln e^(m p_j (phi - 1)): (u, z, bin)
        top = log_f.max(axis=1)
        log_phi = np.log(np.einsum("z,uzk->uk", wz, np.exp(log_f - top[:, None, :]))) + top  # ln Phi_j, (u, bin)
        S = np.einsum("z,uz,uzk->uk", wz, tpsi**2, np.exp(log_f - log_phi[:, None, :])) @ (mk * mk * ps2)
        out[k] = float(np.sum(np.exp(log_phi @ count) * S) * _DU)
    return out


def repeat_excess(vocab: int, m, sigma: float, c: float) -> np.ndarray:
    """R(m) at the same-token correlation c minus the mean-field law's (c = 0): the same-token pairs' extra mass."""
    return repeat_mass(vocab, m, sigma, c) - repeat_mass(vocab, m, sigma, 0.0)
