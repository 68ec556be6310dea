"""Position-resolved propagation for causal (autoregressive) models.

The engine's single (q, p) pair is the simplex geometry of 001 ("Autoregressive Models", sec. 5, and C.6,
Fig. 12): exact for late tokens of a long causal sequence, wrong for early ones, which attend to few keys
(003, Lemma 3: under uniform causal attention the attention output at position m has variance ~ 1/m).
Here the state of one layer is the full overlap matrix

    C[m, n] = E[x_m . x_n] / d        (m, n = 1..T; C[m, m] = q_m, C[m, n] = p_mn for m != n),

pushed through the same components as the engine (components.py / blocks.py), each written for a matrix:

* embeddings: the simplex, C = p0 11^T + (q0 - p0) I (model.input_moments; position rows are independent, so
  position embeddings only lower p0);
* LayerNorm / RMSNorm per position: C[m, n] / sqrt(q_m q_n);
* linear: gain C + bias^2;  dropout: the diagonal / (1 - rate);  residual: skip^2 C + block^2 F;
* activations on Gaussian pairs with unequal variances (q_m, q_n, covariance p_mn): ReLU by the (homogeneous)
  arc-cosine kernel, GeLU by the closed form derived below (it reduces to 004 A.5 for q_m = q_n), linear
  exactly, the rest (tanh, SiLU, tanh-GeLU, the gates of SwiGLU / GeGLU) by a Mehler (Hermite) series whose
  truncation tail is added back so the diagonal is exact;
* causal softmax attention, row m attending to keys 1..m: a REM at m keys (001 Result 1 / eq. 12, B.3) with
  beta_c from row m's own key geometry (mean q and mean p over keys 1..m, query bias included), and the output
  overlaps  O[m, n] = sum_{s<=m, s'<=n} E[A_ms A_ns'] Cv[s, s']  written as a uniform part plus fluctuations:

      A_ms = 1/m + delta_ms,  sum_s delta_ms = 0,
      O[m, n] = Sv[m, n] / (m n)                                   (uniform part: 2-D prefix sums, O(T^2))
              + (Y2_m - 1/m) gapV_m                        (m = n:  REM inverse participation at m keys)
              + (Yp_mn - 1/max(m, n)) gapV_min(m,n)         (m != n: cross-row overlap on the shared keys)
              + (1/keep - 1) Y2_m qbarV_m                   (m = n:  attention dropout),

  where Sv is the prefix-sum matrix of the value overlaps Cv = g_V C + b_V^2, gapV_k = (mean diagonal) -
  (mean off-diagonal) of Cv over positions 1..k, qbarV_k its mean diagonal, and Yp_mn the annealed cross-row
  overlap exp(rho^Q_mn v) / max(m, n) capped by sqrt(Y2_m Y2_n) (Cauchy-Schwarz), as the engine's Yp at T keys.
  For Cv = p 11^T + (q - p) I and m = n = T this is the engine's mix_forward exactly. Centered attention
  (A - 1/m: the MC subtracts the causal mean of V) keeps only the fluctuation terms.

Everything is O(T^2) per layer (no O(T^3)): T = 2048 and tens of layers run in seconds.

Measured quantities follow simulate.py: rho = (mean over ordered pairs m != n of p_mn) / (mean over m of q_m),
a ratio of averages, over all positions and over the first / middle / last third (edges T//3, 2T//3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

from initadvisor.core import attention as att
from initadvisor.core import kernels
from initadvisor.core.components import BlockParams

__all__ = ["CausalTrace", "propagate_causal", "propagate_overlaps", "pair_kernel", "thirds", "summarize"]


# ------------------------------------------------------------------------------------------------
# Result


@dataclass
class CausalTrace:
    """Position-resolved prediction. Index 0 of the (L+1, ...) arrays is the stream entering block 1.

    q: (L+1, T) per-position second moment q_m.
    rho_mean: (L+1,) mean_{m != n} p_mn / mean_m q_m (simulate.py's ratio of averages).
    rho_thirds: (L+1, 3) the same within the first, middle and last third of positions.
    q_thirds: (L+1, 3) mean q_m within each third.
    y2: (L, T) REM inverse participation ratio of attention row m (m keys) in each block.
    beta_c: (L, T) row m's critical beta, from its own key geometry.
    attention_output_variance_layer1: (T,) per-coordinate second moment E|o_m|^2 / d of block 1's attention
        branch output at position m: after the output projection (and its bias), before the residual's dropout
        and block scale. Chi et al. (003) Lemma 3 predicts d^2 sigma^4 / m for LayerNormed inputs, W_V, W_O
        entries N(0, sigma^2), uniform attention, uncorrelated tokens: here g_V g_O (p + (q - p) Y2_m) + ...
    overlap: (T, T) the final layer's overlap matrix C (None unless asked for).
    """

    q: np.ndarray
    rho_mean: np.ndarray
    rho_thirds: np.ndarray
    q_thirds: np.ndarray
    y2: np.ndarray
    beta_c: np.ndarray
    attention_output_variance_layer1: np.ndarray
    overlap: np.ndarray | None = field(default=None, repr=False)

    @property
    def rho_last(self) -> np.ndarray:
        return self.rho_thirds[:, 2]


def thirds(T: int) -> list[tuple[int, int]]:
    """Position ranges [lo, hi) of the three thirds, as simulate._thirds."""
    e = [0, T // 3, (2 * T) // 3, T]
    return [(e[i], e[i + 1]) for i in range(3)]


def _pair_moments(C: np.ndarray, lo: int = 0, hi: int | None = None) -> tuple[float, float]:
    """(mean q, mean over ordered pairs m != n of p) within positions lo..hi-1 (simulate.pair_moments)."""
    B = C[lo:hi, lo:hi]
    n = B.shape[0]
    tr = float(np.trace(B))
    tot = float(B.sum())
    q = tr / n
    p = (tot - tr) / (n * (n - 1)) if n > 1 else math.nan
    return q, p


def summarize(C: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(rho over all positions, rho per third (3,), q per third (3,)) of an overlap matrix."""
    q, p = _pair_moments(C)
    r3, q3 = np.empty(3), np.empty(3)
    for j, (lo, hi) in enumerate(thirds(C.shape[0])):
        qj, pj = _pair_moments(C, lo, hi)
        r3[j], q3[j] = pj / qj, qj
    return p / q, r3, q3


# ------------------------------------------------------------------------------------------------
# Components on the overlap matrix


def _norm(C: np.ndarray) -> np.ndarray:
    """LayerNorm / RMSNorm per position: C[m, n] / sqrt(q_m q_n) (components.norm, per pair)."""
    s = 1.0 / np.sqrt(np.diag(C))
    out = C * s[:, None]
    out *= s[None, :]
    np.fill_diagonal(out, 1.0)
    return out


def _linear(C: np.ndarray, gain, bias2=0.0) -> np.ndarray:
    out = C * float(gain)
    if bias2:
        out += float(bias2)
    return out


def _dropout(C: np.ndarray, rate) -> np.ndarray:
    """Training-mode dropout: independent masks per position, so only the diagonal grows by 1/(1 - rate)."""
    if not rate:
        return C
    out = C.copy()
    idx = np.diag_indices_from(out)
    out[idx] /= 1.0 - float(rate)
    return out


def _residual(C: np.ndarray, F: np.ndarray, skip, block) -> np.ndarray:
    return float(skip) ** 2 * C + float(block) ** 2 * F


# --- activation kernels for unequal variances -------------------------------------------------------


def _relu_pair(C: np.ndarray) -> np.ndarray:
    """E[relu(u) relu(v)] = sqrt(ab)/(2 pi) (sqrt(1 - r^2) + r (pi - arccos r)): the arc-cosine kernel
    (001 eq. 16; Cho & Saul 2009) is positively homogeneous, so unequal variances a, b only rescale it."""
    s = np.sqrt(np.diag(C))
    ss = np.multiply.outer(s, s)
    r = np.clip(C / ss, -1.0, 1.0)
    return ss / (2 * np.pi) * (np.sqrt(1 - r * r) + r * (np.pi - np.arccos(r)))


def _gelu_pair(C: np.ndarray) -> np.ndarray:
    """E[u Phi(u) v Phi(v)] for (u, v) ~ N(0, [[a, c], [c, b]]), exact.

    Write Phi(u) = P(Z1 <= u), s = u - Z1, t = v - Z2 (Z independent N(0, 1)) and apply Gaussian integration by
    parts twice to E[u v 1{s>0} 1{t>0}] (Var s = 1 + a, Var t = 1 + b, Cov(s, t) = c, D = (1+a)(1+b) - c^2):

        c/4 + c/(2 pi) arcsin(c / sqrt((1+a)(1+b))) + (ab + c^2 - c^2 a/(1+a) - c^2 b/(1+b)) / (2 pi sqrt D).

    For a = b = q, c = r q it is 004 A.5's covariance plus the squared mean (kernels.gelu_forward)."""
    a = np.diag(C)
    A = 1.0 + a
    AB = np.multiply.outer(A, A)
    ab = np.multiply.outer(a, a)
    c2 = C * C
    D = np.maximum(AB - c2, 1e-300)
    fa = a / A
    brack = ab + c2 - c2 * (fa[:, None] + fa[None, :])
    return C / 4 + C / (2 * np.pi) * np.arcsin(np.clip(C / np.sqrt(AB), -1, 1)) + brack / (2 * np.pi * np.sqrt(D))


@lru_cache(maxsize=4)
def _hermite_basis(n: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quadrature nodes/weights (probabilists') and orthonormal Hermite He_k(z)/sqrt(k!) at the nodes, k <= K."""
    z, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    H = np.empty((K + 1, n))
    H[0] = 1.0
    if K >= 1:
        H[1] = z
    for k in range(1, K):  # He_{k+1} = z He_k - k He_{k-1}, normalised by sqrt(k!)
        H[k + 1] = (z * H[k] - math.sqrt(k) * H[k - 1]) / math.sqrt(k + 1)
    return z, w, H


def _series_pair(f, C: np.ndarray, K: int = 40, n: int = 120) -> np.ndarray:
    """E[f(u) f(v)] by Mehler's formula: sum_k h_k(a) h_k(b) r^k, h_k(a) = E[f(sqrt(a) z) He_k(z)]/sqrt(k!),
    plus the truncation tail sqrt(t_a t_b) r^(K+1) with t_a = E f^2 - sum_k h_k(a)^2 (exact on the diagonal)."""
    z, w, H = _hermite_basis(n, K)
    a = np.diag(C)
    fz = f(np.sqrt(a)[:, None] * z[None, :])  # (T, n)
    h = (fz * w) @ H.T  # (T, K+1)
    ef2 = (fz * fz) @ w
    tail = np.maximum(ef2 - (h * h).sum(1), 0.0)
    s = np.sqrt(a)
    r = np.clip(C / np.multiply.outer(s, s), -1.0, 1.0)
    out = np.multiply.outer(h[:, 0], h[:, 0])
    rk = np.ones_like(r)
    for k in range(1, K + 1):
        rk *= r
        out += rk * np.multiply.outer(h[:, k], h[:, k])
    rk *= r
    out += rk * np.sqrt(np.multiply.outer(tail, tail))
    np.fill_diagonal(out, ef2)
    return out


def pair_kernel(act: str, C: np.ndarray) -> np.ndarray:
    """E[phi(u_m) phi(u_n)] for the Gaussian field with covariance C (raw moments: the mean is kept)."""
    if act == "relu":
        return _relu_pair(C)
    if act in ("gelu", "geglu"):
        return _gelu_pair(C)
    if act == "linear":
        return C.copy()
    f = kernels.PHI["silu" if act == "swiglu" else act][0]
    return _series_pair(f, C)


# --- causal attention ------------------------------------------------------------------------------


@lru_cache(maxsize=4)
def _index_grids(T: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(T)
    return np.minimum.outer(i, i), np.maximum.outer(i, i)


def _prefix2(C: np.ndarray) -> np.ndarray:
    """S[m, n] = sum_{s <= m, s' <= n} C[s, s'] (0-based, inclusive)."""
    return np.cumsum(np.cumsum(C, axis=0), axis=1)


def _key_geometry(C: np.ndarray, S: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Mean diagonal and mean off-diagonal of C over positions 1..m, for every m (prefix sums)."""
    if S is None:
        S = _prefix2(C)
    m = np.arange(1, C.shape[0] + 1, dtype=float)
    tr = np.cumsum(np.diag(C))
    tot = np.diag(S)
    qbar = tr / m
    with np.errstate(invalid="ignore", divide="ignore"):
        pbar = np.where(m > 1, (tot - tr) / (m * np.maximum(m - 1, 1)), qbar)
    return qbar, pbar


def rem_rows(beta, bc: np.ndarray, lnT: float) -> tuple[np.ndarray, np.ndarray]:
    """(Y2_m, v_m) of attention row m with m keys: attention.participation at T = m, vectorised over rows.

    The row's score variance is beta^2 ln T q_query (qbar_m - pbar_m) = 2 ln T (beta/bc_m)^2 (beta is defined
    with the spec's ln T), i.e. Giorlandino-Goldt's beta at m keys is beta_m = beta sqrt(ln T / ln m).
    Annealed e^v / m for x = beta_m / bc_m <= 1/2 (v frozen at x = 1/2 beyond), REM 1 - 1/x (001 eq. 12),
    the larger of the two, at most 1; a row with one key has Y2 = 1."""
    T = bc.shape[0]
    m = np.arange(1, T + 1, dtype=float)
    lnm = np.log(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = float(beta) * math.sqrt(lnT) / (bc * np.sqrt(lnm))
    x = np.where(m > 1, x, np.inf)
    xc = np.minimum(x, 0.5)
    v = np.where(m > 1, 2.0 * xc**2 * lnm, 0.0)
    loc = np.maximum(1.0 - 1.0 / np.maximum(x, 1e-300), 0.0)
    y2 = np.minimum(np.maximum(np.exp(v) / m, loc), 1.0)
    y2[0] = 1.0
    return y2, v


@dataclass
class _AttCache:
    y2: np.ndarray
    beta_c: np.ndarray
    out: np.ndarray  # attention branch output overlaps (after W_O, before dropout)


def _attention(C: np.ndarray, P: BlockParams, lnT: float) -> tuple[np.ndarray, _AttCache]:
    T = C.shape[0]
    m = np.arange(1, T + 1, dtype=float)
    qb = float(P.q_bias)
    S = _prefix2(C)
    qbar, pbar = _key_geometry(C, S)
    qq = np.diag(C) + qb  # query second moment of row m (with the query bias share)
    bc = att.beta_c(qbar, pbar, qq)
    y2, v = rem_rows(P.beta, bc, lnT)

    lo, hi = _index_grids(T)
    # cross-row overlap on the shared keys: annealed exp(rho^Q v) / max(m, n), capped by sqrt(Y2_m Y2_n)
    sq = np.sqrt(qq)
    rho_q = (C + qb) / np.multiply.outer(sq, sq)
    yp = np.exp(rho_q * np.sqrt(np.multiply.outer(v, v))) / (hi + 1.0)
    np.minimum(yp, np.sqrt(np.multiply.outer(y2, y2)), out=yp)

    g_v, b_v2 = float(P.g_v), float(P.b_v2)
    gap_v = g_v * np.maximum(qbar - pbar, 0.0)
    qbar_v = g_v * qbar + b_v2
    keep = 1.0 - float(P.attn_dropout)

    out = (yp - 1.0 / (hi + 1.0)) * gap_v[lo]  # fluctuations, off-diagonal
    diag = (y2 - 1.0 / m) * gap_v + (1.0 / keep - 1.0) * y2 * qbar_v
    if not P.centered:  # uniform part: (1/(m n)) sum_{s<=m, s'<=n} Cv[s, s'], Cv = g_V C + b_V^2
        out += (g_v / np.multiply.outer(m, m)) * S + b_v2
        diag += g_v * np.diag(S) / (m * m) + b_v2
    np.fill_diagonal(out, diag)
    out = _linear(out, P.g_o, P.b_o2)
    return _dropout(out, P.dropout), _AttCache(y2, bc, out)


def _mlp(C: np.ndarray, P: BlockParams) -> np.ndarray:
    C1 = _linear(C, P.g_1, P.b_12)
    K = pair_kernel(P.activation, C1)
    if P.activation in ("swiglu", "geglu"):
        K *= C1  # independent gate and up projections
    return _dropout(_linear(K, P.g_2, P.b_22), P.dropout)


def _block(C: np.ndarray, P: BlockParams, lnT: float) -> tuple[np.ndarray, _AttCache]:
    """One block on the overlap matrix; the same recipes as blocks.block_forward."""
    if P.parallel:
        Cn = _norm(C)
        A, cache = _attention(Cn, P, lnT)
        M = _mlp(Cn, P)
        return _residual(C, A, P.skip_a, P.block_a) + float(P.block_m) ** 2 * M, cache
    pre, post = P.norm == "pre", P.norm == "post"
    A, cache = _attention(_norm(C) if pre else C, P, lnT)
    C = _residual(C, A, P.skip_a, P.block_a)
    if post:
        C = _norm(C)
    M = _mlp(_norm(C) if pre else C, P)
    C = _residual(C, M, P.skip_m, P.block_m)
    if post:
        C = _norm(C)
    return C, cache


# ------------------------------------------------------------------------------------------------
# The model


def propagate_overlaps(blocks: Sequence[BlockParams], q0: float, p0: float, T: int,
                       keep_overlap: bool = False) -> CausalTrace:
    """Run a causal stack on the overlap matrix from the simplex input C = p0 11^T + (q0 - p0) I."""
    T = int(T)
    if T < 2:
        raise ValueError("a causal sequence needs T >= 2")
    C = np.full((T, T), float(p0))
    np.fill_diagonal(C, float(q0))
    L = len(blocks)
    qs = np.empty((L + 1, T))
    rho = np.empty(L + 1)
    r3 = np.empty((L + 1, 3))
    q3 = np.empty((L + 1, 3))
    y2 = np.empty((L, T))
    bcs = np.empty((L, T))
    var1 = np.full(T, np.nan)

    def record(i: int, C: np.ndarray) -> None:
        qs[i] = np.diag(C)
        rho[i], r3[i], q3[i] = summarize(C)

    record(0, C)
    for i, P in enumerate(blocks):
        lnT = math.log(P.seq_len) if np.isfinite(P.seq_len) else math.log(T)
        C, cache = _block(C, P, lnT)
        record(i + 1, C)
        y2[i], bcs[i] = cache.y2, cache.beta_c
        if i == 0:
            var1 = np.diag(cache.out).copy()
    return CausalTrace(q=qs, rho_mean=rho, rho_thirds=r3, q_thirds=q3, y2=y2, beta_c=bcs,
                       attention_output_variance_layer1=var1, overlap=C if keep_overlap else None)


def propagate_causal(spec, keep_overlap: bool = False, **overrides) -> CausalTrace:
    """Position-resolved forward prediction of a spec (meant for `causal: true`; runs for any spec, treating
    attention as causal). Keyword overrides replace BlockParams fields (scalars only)."""
    from dataclasses import replace

    from initadvisor.core.model import block_params, input_moments

    P = block_params(spec)
    if overrides:
        P = replace(P, **overrides)
    q0, p0 = input_moments(spec)
    return propagate_overlaps([P] * spec.layers, q0, p0, spec.seq_len, keep_overlap=keep_overlap)
