"""Spectrum of a random softmax attention matrix and rank collapse in width.

Implements the single-layer results of Naderi, Nait Saada & Tanner, *Mind the Gap* (paper 002 in
``/work/shared/papers``) for the engine's attention model: every row of the T x T attention matrix
``A`` is the softmax of T iid Gaussian scores of variance ``V`` (``V = beta^2 q (q - p) ln T`` in
Giorlandino & Goldt's units; the key-independent part of a score cancels in the softmax).  Such an
``A`` is an "i.i.d. Markov matrix" (002, Definition 3.1, with lognormal entries), so

* its largest singular value is ~1 (the outlier along the all-ones direction, 002 Theorem 1 /
  Theorem 8 quoting Bordenave-Caputo-Chafai [BCC11]),
* its bulk has radius O(T^-1/2) (002 Theorem 1, Lemma 2; 001 Appendix C.2), and
* removing the outlier, ``A - 11^T/T`` ("centered" attention, 002 eq. (8)), leaves a matrix whose
  singular values follow the quarter-circular law (002 Lemma 3) with no gap.

Notation used throughout (all derived here, checked against Monte-Carlo in tests/test_spectral.py):

``s`` (fluctuation strength) = E sum_s (A_ts - 1/T)^2 = Y2 - 1/T, with Y2 the expected inverse
participation ratio of a row.  Write ``A = 11^T/T + F`` with ``F 1 = 0``; the entries of F have
variance s/T, so ``sqrt(T) F`` is the centred i.i.d. Markov matrix of [BCC11] with variance s T.  For
large T, Y2 -> e^V / T and s -> (e^V - 1)/T, i.e. sigma^2 = Var(e^g)/E(e^g)^2 = e^V - 1 in [BCC11].

All functions are pure numpy, accept scalars or arrays (broadcast), and do no I/O.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from initadvisor.core.softmax_rows import row_moments

__all__ = [
    "AttentionSpectrum",
    "WidthCollapse",
    "softmax_row_ipr",
    "fluctuation_strength",
    "attention_spectrum",
    "product_mp_edge",
    "stable_rank_attention_output",
    "width_collapse",
    "WIDTH_COLLAPSE_FRACTION",
]

# Euler-Mascheroni constant: the mean of a Gumbel variable (location of the expected maximum).
_EULER_GAMMA = 0.5772156649015329

# Mean of the real (beta = 1) Tracy-Widom law; finite-T shift of the top eigenvalue of a square
# Wishart matrix, E lambda_max = 4T (1 + 2^(4/3) E[TW1] / (4 T^(2/3))) (Johnstone 2001 centring/scaling).
_TW1_MEAN = -1.2065335745820


def _edge_finite_T(T):
    """Relative finite-T shift of the largest eigenvalue below the asymptotic bulk edge."""
    return np.clip(1.0 + 2.0 ** (4.0 / 3.0) * _TW1_MEAN / (4.0 * np.asarray(T, float) ** (2.0 / 3.0)), 0.5, 1.0)


# Default criterion for "rank collapse in width": the stable rank of the attention output is below
# this fraction of the stable rank the same layer has with centered attention (the paper's fix).
WIDTH_COLLAPSE_FRACTION = 0.1


class AttentionSpectrum(NamedTuple):
    """Predicted top of the singular spectrum of a T x T softmax attention matrix."""

    sigma1: np.ndarray  # largest singular value (the outlier, ~1)
    sigma2: np.ndarray  # second singular value: max(bulk edge, largest-entry spike)
    bulk_edge: np.ndarray  # quarter-circle edge 2 sqrt(s) of the fluctuation F = A - 11^T/T
    extreme_spike: np.ndarray  # singular value carried by the largest entry of F (0 if none)
    gap_ratio: np.ndarray  # sigma1 / sigma2 (> 1; the spectral gap as a ratio)
    gap_difference: np.ndarray  # sigma1 - sigma2 (the spectral gap as a difference)
    has_outlier: np.ndarray  # bool: the all-ones outlier stands above the rest (s < 1/2, sigma2 < sigma1)
    s: np.ndarray  # fluctuation strength Y2 - 1/T


class WidthCollapse(NamedTuple):
    """Verdict on rank collapse in width for one attention layer."""

    collapsed: np.ndarray  # bool: stable_rank < fraction * stable_rank_centered
    stable_rank: np.ndarray  # predicted stable rank of A X
    stable_rank_centered: np.ndarray  # predicted stable rank of (A - 11^T/T) X
    ratio: np.ndarray  # stable_rank / stable_rank_centered
    fraction: float  # the threshold used


# --------------------------------------------------------------------------------------------
# Row statistics of a softmax of iid Gaussians
# --------------------------------------------------------------------------------------------

def softmax_row_ipr(T, V):
    """Expected inverse participation ratio Y2 = E sum_s A_ts^2 of softmax(T iid N(0, V)).

    Exact for every T (softmax_rows' quadrature; 002 Def. 3.1 lognormal i.i.d. Markov rows);
    tends to e^V / T for large T at fixed V. Vectorised by broadcasting (loop over elements).
    """
    T_b, V_b = np.broadcast_arrays(np.asarray(T, dtype=float), np.asarray(V, dtype=float))
    out = np.empty(T_b.shape)
    for idx in np.ndindex(T_b.shape):
        t = float(T_b[idx])
        out[idx] = np.clip(row_moments(math.sqrt(max(float(V_b[idx]), 0.0)), [t], ks=(2,))[2][0], 1.0 / t, 1.0) \
            if t > 1 else 1.0
    return out[()] if out.ndim == 0 else out


def fluctuation_strength(T, V, exact=True):
    """s = E ||row of (A - 11^T/T)||^2 = Y2 - 1/T; large-T form (e^V - 1)/T when exact=False.

    # 002 Lemma 2 / [BCC11]: sqrt(T) (A - 11^T/T) is a centred i.i.d. Markov matrix, variance s*T.
    """
    T = np.asarray(T, dtype=float)
    V = np.asarray(V, dtype=float)
    if exact:
        return np.maximum(softmax_row_ipr(T, V) - 1.0 / T, 0.0)
    return np.expm1(V) / T


def _inv_normal_cdf(u):
    """Standard normal quantile of 0 < u < 1: Newton's method on ln Phi(x) = ln u (concave, so it climbs to the
    root from the left without overshooting), Phi(x) = erfc(-x / sqrt 2) / 2, to 1e-13 (scipy.special would
    cost 0.2-0.4 s of start-up, statistics 10 ms)."""
    erfc = np.frompyfunc(math.erfc, 1, 1)
    shape, u = np.shape(u), np.atleast_1d(np.asarray(u, dtype=float))
    lower = np.minimum(u, 1.0 - u)  # solved in the lower tail and mirrored
    x = -np.sqrt(-2.0 * np.log(lower))  # left of the root: Phi(x) < pdf(x) / |x| = lower / (|x| sqrt(2 pi))
    for _ in range(100):
        cdf = 0.5 * erfc(-x / math.sqrt(2.0)).astype(float)
        step = (np.log(cdf) - np.log(lower)) * cdf * math.sqrt(2.0 * math.pi) * np.exp(0.5 * x * x)
        x = x - step
        if np.all(np.abs(step) <= 1e-13 * np.maximum(1.0, np.abs(x))):
            break
    return np.where(u < 0.5, x, -x).reshape(shape)


def _expected_max_entry(T, V):
    """Typical largest entry of A (over all T^2 entries): Gumbel-centred extreme of the scores
    divided by the rest of its row, T-1 lognormals of mean e^{V/2} each."""
    N = T * T
    gstar = -np.sqrt(V) * _inv_normal_cdf(np.exp(-_EULER_GAMMA) / N)  # upper quantile, exact for huge N
    log_rest = np.log(T - 1.0) + 0.5 * V
    # e^g / (e^g + rest), computed stably
    return 1.0 / (1.0 + np.exp(log_rest - gstar))


# --------------------------------------------------------------------------------------------
# 1. Spectrum of the attention matrix
# --------------------------------------------------------------------------------------------


def attention_spectrum(T, V, exact=True) -> AttentionSpectrum:
    """Predicted sigma1, sigma2 and spectral gap of A = softmax(T x T iid N(0, V) scores), rowwise.

    sigma1: A A^T = 11^T/T + F F^T exactly (rows of A sum to 1, F 1 = 0); F F^T is a Marchenko-
    Pastur (ratio 1) matrix of mean eigenvalue s, so the unit spike along 1/sqrt(T) sits at
    1/(1 - s) (additive BBP formula, needs s < 1/2, else the outlier merges with the bulk):
    sigma1 = (1 - s)^(-1/2) -> 1.
    sigma2: the larger of the quarter-circle edge 2 sqrt(s) (-> 2 sqrt(e^V - 1)/sqrt(T); times
    sqrt(1 - 0.76 T^(-2/3)), the mean Tracy-Widom shift of a square Gaussian matrix) and,
    for heavy lognormal tails (V >~ 1), the largest entry a of F acting as a rank-one spike,
    a + s/a (rectangular BBP, valid for a > sqrt(s)).
    Gap: reported both as the ratio sigma1/sigma2 and the difference sigma1 - sigma2.
    """
    T = np.asarray(T, dtype=float)
    V = np.asarray(V, dtype=float)
    T, V = np.broadcast_arrays(T, V)
    s = fluctuation_strength(T, V, exact=exact)
    # 002 Thm 1 / Thm 8 [BCC11]: sigma1 -> 1; finite-T spike location 1/sqrt(1 - s) (this module).
    has_outlier = s < 0.5
    # 002 Thm 1 & Lemma 3 / [BCC11]: sqrt(T) sigma2 -> 2 sigma, sigma^2 = sT (+ Tracy-Widom shift)
    bulk = 2.0 * np.sqrt(s * _edge_finite_T(T))
    sigma1 = np.where(has_outlier, 1.0 / np.sqrt(np.maximum(1.0 - s, 1e-12)), bulk)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.maximum(_expected_max_entry(T, V) - 1.0 / T, 0.0)
        spike = np.where(a > np.sqrt(s), a + s / np.where(a > 0, a, 1.0), 0.0)
    sigma2 = np.maximum(bulk, spike)
    has_outlier = has_outlier & (sigma2 < sigma1)
    sigma2 = np.minimum(sigma2, sigma1)
    with np.errstate(divide="ignore"):
        ratio = np.where(sigma2 > 0, sigma1 / np.where(sigma2 > 0, sigma2, 1.0), np.inf)
    res = AttentionSpectrum(sigma1, sigma2, bulk, spike, ratio, sigma1 - sigma2, has_outlier, s)
    return AttentionSpectrum(*(x[()] if np.ndim(x) == 0 else x for x in res))


# --------------------------------------------------------------------------------------------
# 2. Stable rank of one attention layer's output
# --------------------------------------------------------------------------------------------


def product_mp_edge(c):
    """Upper edge of the eigenvalues of F Z Z^T F^T / (s d), F: T x T iid (variance s/T), Z: T x d
    standard Gaussian, c = T/d. Free multiplicative convolution MP(1) x MP(c) (002 Prop. 6 proof,
    S-transform 1/((1+z)(1+cz))): edge = min_z (1+z)^2 (1+cz)/z at z* = (sqrt(1+8c) - 1)/(4c).
    Equals 4 at c=0 (quarter circle) and 27/4 at c=1.
    """
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(c > 1e-12, (np.sqrt(1.0 + 8.0 * c) - 1.0) / (4.0 * np.where(c > 1e-12, c, 1.0)), 1.0)
    return (1.0 + z) ** 2 * (1.0 + c * z) / z


def stable_rank_attention_output(T, V, rho, d=None, centered=False, exact=True):
    """Predicted stable rank ||A X||_F^2 / ||A X||_2^2 of one attention layer's output.

    X: T tokens x d, rows x_t = sqrt(rho) m + sqrt(1 - rho) z_t with m, z_t iid N(0, I_d): per-
    coordinate second moment 1, mean token cosine rho.  Regime: T, d large with c = T/d fixed
    (d = None means d >> T, c = 0); rows of A as in attention_spectrum.  A value matrix W_V with
    iid entries rescales X but (for d_out ~ d large) leaves these stable ranks unchanged to leading
    order.

    Standard attention (002 Thm 2, rank collapse in width): A X = 1 w^T + sqrt(1-rho) F Z with
    |w|^2 ~ d(rho + (1-rho)/T).  With theta = rho T + 1 - rho:
      ||A X||_F^2 = d [theta + (1 - rho) T s]                          (exact in expectation)
      ||A X||_2^2 = d [theta + (1 - rho) s (1 + T/d)]    (rectangular spike of strength d theta
                     plus first-order BBP shift m1 + m1' of the noise; never below the noise edge)
    so the stable rank -> 1 + (1-rho)(e^V - 1)/(rho T) -> 1 for rho > 0 and -> ~e^V (an O(1)
    constant, not growing with T) for rho = 0.
    Centered attention (002 eq. (8), Prop. 3): (A - 11^T/T) X = sqrt(1-rho) F Z, rho drops out,
      stable rank = T / (product_mp_edge(T/d) (1 - 0.76 T^(-2/3)))  -> T/4 for d >> T, T/6.75 at
      d = T, -> d for T >> d (the bracket: mean Tracy-Widom shift of the top eigenvalue at finite T):
    linear in width, as 002 Prop. 3 states.
    """
    T = np.asarray(T, dtype=float)
    V = np.asarray(V, dtype=float)
    rho = np.asarray(rho, dtype=float)
    c = 0.0 if d is None else T / np.asarray(d, dtype=float)
    T, V, rho, c = np.broadcast_arrays(T, V, rho, c)
    s = fluctuation_strength(T, V, exact=exact)
    # top eigenvalue of F Z Z^T F^T in units of d, with the finite-T Tracy-Widom shift of the F factor
    edge = product_mp_edge(c) * _edge_finite_T(T)
    noise_edge = s * edge
    if centered:
        # 002 Prop. 3 / Lemma 3: no outlier; Frobenius d T s over top eigenvalue d s * edge(c).
        out = T / edge
        out = np.where(s > 0, out, np.nan)
    else:
        theta = rho * T + (1.0 - rho)
        fro = theta + (1.0 - rho) * T * s
        top = np.maximum(theta + (1.0 - rho) * s * (1.0 + c), (1.0 - rho) * noise_edge)
        out = fro / top  # 002 Thm 2: -> 1 (rho > 0) as T grows
    return out[()] if out.ndim == 0 else out


# --------------------------------------------------------------------------------------------
# 3. Does rank collapse in width happen?
# --------------------------------------------------------------------------------------------


def width_collapse(T, V, rho, d=None, fraction=WIDTH_COLLAPSE_FRACTION, exact=True) -> WidthCollapse:
    """Rank collapse in width (002 Thm 2 vs Prop. 3): collapsed when the predicted stable rank of
    A X is below ``fraction`` (default 0.1) of that of the centered layer (A - 11^T/T) X.

    The centered stable rank grows linearly in T (T/4 for d >> T), the standard one stays O(1), so
    the verdict flips to True once T exceeds ~ 40 x (stable rank of A X), i.e. T >~ 40 e^V for
    orthogonal tokens and T >~ 40 for correlated ones (rho T >> e^V).  Advice when True: centre the
    attention (replace A by A - 11^T/T, 002 eq. (8)).
    """
    sr = stable_rank_attention_output(T, V, rho, d=d, centered=False, exact=exact)
    src = stable_rank_attention_output(T, V, rho, d=d, centered=True, exact=exact)
    ratio = sr / src
    collapsed = ratio < fraction
    res = WidthCollapse(collapsed, sr, src, ratio, float(fraction))
    return WidthCollapse(*(x[()] if np.ndim(x) == 0 else x for x in res[:4]), res[4])
