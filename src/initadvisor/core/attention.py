"""Softmax attention at initialisation as a Random Energy Model (Giorlandino & Goldt, paper 001).

One attention row is a REM: the key-dependent parts of its scores are Gaussian with variance
V = beta^2 q_eff (q - p) ln T. Condensation (entropy collapse) sets in at beta_c = sqrt(2 / (q_eff (q - p))),
i.e. x = beta / beta_c = 1; the Gaussian (CLT) regime ends at x = 1/2 (001 B.3).

Finite T: Y2 = E sum_s A_ts^2 and Y3 are the exact expectations for T i.i.d. Gaussian scores of variance V
(softmax_rows): e^V / T to leading order for x <= 1/2 (annealed), tending to the REM's 1 - 1/x (001 eq. 12)
for x > 1 as T grows, and through the crossover between. The cross-row overlap Yp = E sum_s A_ts A_t's
(sub-leading in 001 B.2.2) is exact too, for two rows whose scores correlate as their queries (softmax_rows):
e^(rho V) / T in the uniform phase, how often the two rows pick the same keys once they localise (the annealed law
held at x = 1/2 was 2-7x low there, and rho grew too slowly past beta_c); causal rows of the position-resolved
engine keep that annealed law (Attention.causal). T = inf gives 001's asymptotic laws exactly
(Y2 = max(0, 1 - beta_c/beta), Yp = 0).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from initadvisor.core.softmax_rows import expected_overlap, expected_y, log_y2_table, s_node
from initadvisor.core.sorting import unique

HUGE = 1e250  # the engine's cap on every moment and derived quantity: extreme stacks stay finite


def rope_dims(d_head: int, fraction: float) -> int:
    """How many of a head's coordinates the rotary embedding turns (pairs of them; HF: int(d_head x fraction),
    even)."""
    return (int(d_head * fraction) // 2) * 2


def rope_frequencies(d_head: int, theta: float, fraction: float) -> np.ndarray:
    """The rotary frequencies theta^(-2i/r), i < r/2 (r = rope_dims; none without a rotary embedding)."""
    r = rope_dims(d_head, fraction) if theta else 0
    return theta ** (-np.arange(0, r, 2, dtype=float) / r) if r else np.zeros(0)


def rope_angles(T: int, d_head: int, theta: float, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of the rotary angles t theta^(-2i/r), positions t = 0..T-1, i < r/2 (r = rope_dims): HF's
    rotate_half convention turns coordinate i with i + r/2."""
    a = np.outer(np.arange(T, dtype=float), rope_frequencies(d_head, theta, fraction))
    return np.cos(a), np.sin(a)


_ROPE_FREQS = 256  # frequencies averaged at most: beyond, midpoints of the mean over i / (r/2) (a smooth quadrature)


def rope_coherence(m, d_head: int, theta: float, fraction: float):
    """kappa(m): the mean over a row's ordered key pairs s != s' (keys 1..m) and over a head's coordinates of
    cos((s - s') w_i), w_i the rotary frequencies (1 on coordinates left unturned). Rotating keys by their
    positions turns the tokens' common component p into kappa p as the keys see it: the logits' key-dependent
    variance is q - kappa p in place of q - p. Exact by the Fejer kernel: sum_{s, s'} cos((s - s') w) =
    sin^2(m w / 2) / sin^2(w / 2) (up to _ROPE_FREQS frequencies); m = inf: the unturned share only."""
    r = rope_dims(d_head, fraction)
    m = np.asarray(m, dtype=float)
    if r == 0 or theta <= 0:
        return np.ones_like(m)[()]
    n = r // 2
    i = np.arange(n, dtype=float) if n <= _ROPE_FREQS else (np.arange(_ROPE_FREQS) + 0.5) * n / _ROPE_FREQS
    w = theta ** (-2.0 * i / r)
    mm = np.where(np.isfinite(m), m, 2.0)
    k = np.zeros(mm.shape)
    for wi in w:  # one frequency at a time: memory O(len(m))
        s2 = math.sin(wi / 2) ** 2
        fejer = np.sin(mm * wi / 2) ** 2 / s2 if s2 > 1e-30 else mm * mm
        with np.errstate(divide="ignore", invalid="ignore"):
            k += np.where(mm > 1, (fejer - mm) / (mm * (mm - 1)), 1.0)
    k = np.where(np.isfinite(m), k / w.size, 0.0)
    return (1.0 - r / d_head + r / d_head * k)[()]


@lru_cache(maxsize=256)
def _rope_scalar(m: float, d_head: int, theta: float, fraction: float) -> float:
    return float(rope_coherence(m, d_head, theta, fraction))


def rope_kappa(m, d_head: int, theta: float, fraction: float):
    """rope_coherence, cached for a scalar m (every layer of a stack asks at the same T)."""
    if np.ndim(m) == 0:
        return _rope_scalar(float(m), int(d_head), float(theta), float(fraction))
    return rope_coherence(m, d_head, theta, fraction)


@lru_cache(maxsize=32)
def rope_distances(T: int, d_head: int, theta: float, fraction: float) -> np.ndarray:
    """The rotary embedding's coherence of two queries delta = 0..T-1 positions apart: the mean over a head's
    coordinates of cos(delta w_i), 1 on coordinates left unturned (read-only, cached per T)."""
    w, delta = rope_frequencies(d_head, theta, fraction), np.arange(T, dtype=float)
    out = np.full(T, d_head - 2.0 * w.size)
    for wi in w:  # one frequency at a time: memory O(T) (a causal stack runs up to 2^20 positions)
        out += 2.0 * np.cos(wi * delta)
    out /= d_head
    out.flags.writeable = False
    return out


@lru_cache(maxsize=16)
def rope_group_pairs(edges: tuple, d_head: int, theta: float, fraction: float) -> np.ndarray:
    """(K, K): per pair of position groups [e_g, e_g+1) x [e_h, e_h+1), the sum over ordered position pairs s != s' of
    the rotary coherence of their distance (rope_distances; the pairs' count without a rotary embedding). A row's
    scores see two keys' overlap turned by it, its values do not (Attention._key_structure). Per frequency w the
    block sum of cos((s - s') w) is Re(G_g conj(G_h)), G_g = sum over s in g of e^(i s w) (a geometric series), so it
    costs K^2 per frequency, whatever T."""
    e = np.asarray(edges, dtype=float)
    a, n = e[:-1], np.diff(e)
    out = np.multiply.outer(n, n)
    freqs = rope_frequencies(d_head, theta, fraction)
    if freqs.size:
        turned = np.zeros_like(out)
        for w in freqs:
            g = np.exp(1j * w * a) * (np.expm1(1j * w * n) / np.expm1(1j * w))
            turned += np.real(np.multiply.outer(g, g.conj()))
        out = (2.0 * turned + (d_head - 2.0 * freqs.size) * out) / d_head
    out[np.diag_indices(len(n))] -= n  # s = s' (coherence 1)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=32)
def rope_rows(T: int, d_head: int, theta: float, fraction: float) -> np.ndarray:
    """rope_coherence of causal rows m = 1..T (row m's keys 1..m): exact up to m = 64 and on a geometric grid of
    1024 rows beyond, linear in log m between (kappa is smooth in log m)."""
    grid = unique(np.concatenate([np.arange(1, min(T, 64) + 1), np.geomspace(64, T, 1024).round()])) \
        if T > 64 else np.arange(1, T + 1, dtype=float)
    k = rope_coherence(grid, d_head, theta, fraction)
    return np.interp(np.log(np.arange(1, T + 1)), np.log(grid), k)


def alibi_slopes(heads: int, scale: float = 1.0) -> np.ndarray:
    """ALiBi's per-head slopes m_h (Press et al. 2022, as BLOOM's _get_alibi_slopes): 2^(-8 h / n) for h = 1..n, n the
    largest power of 2 up to heads, then 2^(-4 h / n) for odd h, one per remaining head; times `scale` (Falcon scales
    the biases with the logits: 1 / sqrt(head_dim))."""
    n = 2 ** int(math.floor(math.log2(heads)))
    extra = [2.0 ** (-4.0 * h / n) for h in range(1, 2 * (heads - n), 2)]
    return scale * np.array([2.0 ** (-8.0 * h / n) for h in range(1, n + 1)] + extra)


@lru_cache(maxsize=4)
def alibi_rows(T: int, heads: int, scale: float = 1.0) -> np.ndarray:
    """(heads, T, T): each head's causal attention rows at init without the logits' random part, row t's weights
    over keys s <= t proportional to e^(-m_h (t - s)) (ALiBi's bias on the logits)."""
    t = np.arange(T, dtype=float)
    dist = t[:, None] - t[None, :]
    w = np.where(dist >= 0, np.exp(-alibi_slopes(heads, scale)[:, None, None] * np.maximum(dist, 0.0)), 0.0)
    w /= w.sum(-1, keepdims=True)
    w.flags.writeable = False
    return w


def alibi_keys(heads: int, scale: float = 1.0) -> np.ndarray:
    """Each head's effective keys at a late row, 1 / sum_s w_s^2 = coth(m_h / 2) (the weights e^(-m_h k), k >= 0)."""
    return 1.0 / np.tanh(alibi_slopes(heads, scale) / 2.0)


def alibi_windows(heads: int, scale: float, T) -> tuple[np.ndarray, np.ndarray]:
    """ALiBi's heads as windows of their effective keys, rounded: (the distinct windows, heads per window); 0 for the
    heads whose effective keys reach T (one global head; a grid of T keeps every head)."""
    keys = np.minimum(np.round(alibi_keys(heads, scale)), 2.0**62)
    if np.ndim(T) == 0:
        keys = np.where(keys >= T, 0.0, keys)
    return np.unique(keys, return_counts=True)


def beta_c(q, p, q_query=None):
    """Critical beta (001 Result 1): sqrt(2 / (q (q - p))); q_query adds the query bias's share."""
    qq = q if q_query is None else q_query
    with np.errstate(divide="ignore", over="ignore"):
        bc = np.sqrt(2.0 / (qq * np.maximum(q - p, 1e-300)))
    return np.minimum(np.maximum(bc, 1.0 / HUGE), HUGE)  # collapsed tokens: no condensation; overflow: never 0


def participation(beta, bc, rho, T):
    """(Y2, Yp, Y3, Y2^2): the expected IPR of an attention row, two rows' overlap, third participation ratio and
    squared IPR. At finite T exact for i.i.d. Gaussian scores of std s = (beta / bc) sqrt(2 ln T), two rows' scores
    correlated as their queries, rho (softmax_rows); T = inf: the REM (001 eq. 12, Poisson-Dirichlet moments)."""
    x = np.divide(beta, bc)
    if np.ndim(T) == 0 and math.isfinite(T):  # one finite T (every stack's case): without the stand-ins below
        s = x * math.sqrt(2.0 * math.log(T))
        y2, y3, y22 = expected_y(s, T)
        return y2, np.minimum(y2, expected_overlap(s, T, rho)), y3, y22
    inf = np.isinf(T)
    rem = _rem(x)
    if np.all(inf):
        return rem[0], np.zeros_like(rem[0]), rem[1], rem[2]
    Tf = np.where(inf, 2.0, T)  # finite stand-in where T = inf (those points take the asymptotic laws)
    s = x * np.sqrt(2.0 * np.log(Tf))
    y2, y3, y22 = expected_y(s, Tf)
    yp = np.where(inf, 0.0, np.minimum(y2, expected_overlap(s, Tf, rho)))
    return np.where(inf, rem[0], y2), yp, np.where(inf, rem[1], y3), np.where(inf, rem[2], y22)


def coweighting(m, x, sums):
    """phi: how much more a row of m keys with structure varies about its uniform part than the mean field's
    (Y2 - 1/m)(C_d - C_o) says, at small Y2. To first order in the scores (a = (1 + M z) / m, M = I - 11^T / m,
    Cov z proportional to K) E a^T C a - 1^T C 1 / m^2 is proportional to tr(M K M C), which is (m - 1)(K_d - K_o)
    (C_d - C_o) for keys alike (K: the keys' overlaps as the scores see them, C: the values'; _d, _o their mean
    diagonal and off-diagonal): keys that look alike are weighed together, so where they also hold the large values
    the output varies more. phi is their ratio; the law is the Gaussian regime's and fades out between x = beta /
    beta_c of 1/2, where that regime ends (001 B.3), and 1. sums: gradients.jacobian_form's."""
    dK, dC, _, R, Ct, KC, _, T3 = sums
    m = np.asarray(m, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        hom = (m - 1.0) * (dK / m - (R - dK) / (m * (m - 1.0))) * (dC / m - (Ct - dC) / (m * (m - 1.0)))
        phi = 1.0 + np.clip(2.0 - 2.0 * x, 0.0, 1.0) * ((KC - 2.0 * T3 / m + R * Ct / (m * m)) / hom - 1.0)
    return np.where((m > 1) & np.isfinite(phi), np.maximum(phi, 0.0), 1.0)


def coweighted(f, phi, m):
    """A row's fluctuation share f (Y2 - 1/m; two rows': Yp - 1/max(m, n)) with its keys' structure phi (coweighting):
    f phi where small, saturating at a one-key row's 1 - 1/m, whose output is its key's whatever the structure."""
    top = 1.0 - 1.0 / np.asarray(m, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        out = f * phi / (1.0 + np.maximum(f, 0.0) * (phi - 1.0) / top)
    return np.where((f > 0) & np.isfinite(out), out, f)


def _rem(x):
    """(Y2, Y3, Y2^2) of the REM as T -> inf: 0 for x <= 1, else the Poisson-Dirichlet(m) moments at m = 1/x:
    1 - m (001 eq. 12), (1 - m)(2 - m)/2 and (1 - m)(3 - 2m)/3."""
    m = np.minimum(1.0 / np.maximum(x, 1e-300), 1.0)
    return 1.0 - m, (1.0 - m) * (2.0 - m) / 2.0, (1.0 - m) * (3.0 - 2.0 * m) / 3.0


def phase(beta, bc):
    """'uniform' below beta_c/2, 'crossover' in [beta_c/2, beta_c), 'localized' at and above beta_c (001 B.3)."""
    x = np.asarray(beta / bc)
    return np.where(x >= 1.0, "localized", np.where(x >= 0.5, "crossover", "uniform"))


def mixing(y2, yp, T, centered: bool, attn_dropout: float = 0.0):
    """Moments of the mixing matrix W (A, or A - 1/T when centered), with attention dropout on A.

    Returns (d_row, x_row, s2, sx): E sum_s W_ts^2, E sum_s W_ts W_t's (t != t'),
    E (sum_s W_ts)^2, E (sum_s W_ts)(sum_s W_t's).
    """
    keep = 1.0 - attn_dropout
    d_row = y2 / keep
    s2 = 1.0 + y2 * attn_dropout / keep
    if centered:  # rows of A - 1/T sum to zero (001 Algorithm 3)
        inv_t = 1.0 / np.asarray(T, dtype=float)  # 0 for T = inf
        return d_row - inv_t, yp - inv_t, s2 - 1.0, 0.0
    return d_row, yp, s2, 1.0


def mix_forward(qv, pv, mom):
    """Value-path second moments after mixing by W (001 eq. 14 generalised): q, p."""
    d_row, x_row, s2, sx = mom
    return pv * s2 + (qv - pv) * d_row, pv * sx + (qv - pv) * x_row


@lru_cache(maxsize=64)
def causal_columns(T: float) -> tuple[float, float]:
    """(H_T / T, K2) for causal attention over a prefix: the key-averaged sum_t 1/t^2 over rows t >= s, and
    K2 = (1/T) sum_s (H_T - H_{s-1})^2, the key-averaged squared column sum of uniform causal attention
    (-> 2 as T grows; 1 for bidirectional attention)."""
    t = np.arange(1, int(T) + 1, dtype=float)
    h = np.cumsum(1.0 / t)
    col = h[-1] - np.concatenate([[0.0], h[:-1]])
    return float(h[-1] / T), float(np.mean(col**2))


@lru_cache(maxsize=64)
def _column_rows(T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """causal_column_scale's rows at T: their keys t (1..64 one by one, beyond on 64 geometric bins: Y2 is smooth in
    ln t), weights (the rows a bin holds) and log E[Y2] over the row table's s nodes at each (read-only)."""
    t = np.arange(1.0, min(T, 64) + 1)
    w = np.ones_like(t)
    if T > 64:
        edges = unique(np.round(np.geomspace(64.5, T + 0.5, 65)))
        t = np.concatenate([t, np.sqrt(edges[:-1] * edges[1:])])
        w = np.concatenate([w, np.diff(edges)])
    tab = np.stack([log_y2_table(float(x)) for x in t])
    for a in (t, w, tab):
        a.flags.writeable = False
    return t, w, tab


def causal_column_scale(s, T: float):
    """(1/T) sum_t E[Y2](s, t) / E[Y2](s, T): how much more a key-averaged column of causal attention (rows t >= s
    with t keys each) collects than the late, full-length rows (H_T for uniform rows, Y2(t) = 1/t; at most T).
    One s (a stack's pair pass, once a layer): from the rows' E[Y2] table at T (_column_rows), linear in log Y2 over
    s as expected_y is (8x fewer operations: 100000 causal layers spent a third of `check` here)."""
    T = int(T)
    t, w, tab = _column_rows(T)
    if np.ndim(s) == 0 and math.isfinite(s):
        s = max(float(s), 0.0)
        i, f, far = s_node(s, tab.shape[1])
        y2 = 1.0 - (1.0 - np.exp(tab[:, i] + (tab[:, i + 1] - tab[:, i]) * f)) * far
        return float(y2 @ w / T) / expected_y(s, float(T), 1)[0]
    s = np.asarray(s, dtype=float)
    y2 = expected_y(s[..., None], t, 1)[0]
    return (y2 @ w / T) / expected_y(s, float(T), 1)[0]


def mix_backward(gq, gp, mom, T, col_scale=None):
    """Mirror of mix_forward for the gradient (transpose of W; the query/key path is Attention's).

    Bidirectional (col_scale None): every column collects T rows. Causal: key s is read by rows t >= s, each
    spreading over t keys, so the key-averaged column moments carry H_T / T and K2 in place of 1/T and 1; the row
    moments of `mom` describe late, full-length rows, so their IPR part is rescaled by col_scale
    (causal_column_scale: H_T for uniform rows).
    """
    d_row, x_row, s2, sx = mom
    if np.isinf(T):
        c2, cx, x_col = d_row + sx, sx, 0.0
        return gp * c2 + (gq - gp) * d_row, gp * cx + (gq - gp) * x_col
    if col_scale is not None:
        k1, k2 = causal_columns(T)
        d_row = d_row * col_scale  # (1/T) sum_t Y2(t)
        c2 = d_row + T * x_row * (k2 - k1)  # reduces to d_row + (T - 1) x_row for bidirectional rows
    else:
        c2 = d_row + (T - 1) * x_row  # E (column sum)^2
    cx = (s2 - c2) / (T - 1) + sx  # E col_s col_s'
    x_col = (s2 - d_row) / (T - 1)  # E sum_t W_ts W_ts'
    return gp * c2 + (gq - gp) * d_row, gp * cx + (gq - gp) * x_col
