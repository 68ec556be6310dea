"""Position-resolved propagation for causal (autoregressive) models.

The engine's single (q, p) pair is the simplex geometry of 001 ("Autoregressive Models", sec. 5, and C.6,
Fig. 12): exact for late tokens of a long causal sequence, wrong for early ones, which attend to few keys
(003, Lemma 3: under uniform causal attention the attention output at position m has variance ~ 1/m).
The exact state of one layer is the overlap matrix

    C[m, n] = E[x_m . x_n] / d        (m, n = 1..T; C[m, m] = q_m, C[m, n] = p_mn for m != n),

pushed through the same operations as the engine (each operation's `causal` map in ops.py), each written for a matrix:

* embeddings: the simplex, C = p0 11^T + (q0 - p0) I (ops.Embeddings.moments; position rows are independent, so
  position embeddings only lower p0);
* LayerNorm / RMSNorm per position: C[m, n] / sqrt(q_m q_n);
* linear: gain C + bias^2;  dropout: the diagonal / (1 - rate);  residual: skip^2 C + block^2 F;
* activations on Gaussian pairs with unequal variances (q_m, q_n, covariance p_mn): ReLU by the (homogeneous)
  arc-cosine kernel, GeLU (and tanh-GeLU, as kernels.py) by the closed form derived below (it reduces to 004 A.5 for q_m = q_n), linear
  exactly, the rest (tanh, SiLU, the gates of SwiGLU / GeGLU) by a Mehler (Hermite) series whose
  truncation tail is added back so the diagonal is exact;
* causal softmax attention, row m attending to keys 1..m: a REM at m keys (001 Result 1 / eq. 12, B.3) with
  beta_c from row m's own key geometry (mean q and mean p over keys 1..m, query bias included), and the output
  overlaps  O[m, n] = sum_{s<=m, s'<=n} E[A_ms A_ns'] Cv[s, s']  written as a uniform part plus fluctuations:

      A_ms = 1/m + delta_ms,  sum_s delta_ms = 0,
      O[m, n] = Sv[m, n] / (m n)                                   (uniform part: 2-D prefix sums)
              + (Y2_m - 1/m) gapV_m psi_m                 (m = n:  the finite-T IPR at m keys, exact for
                                                             keys' scores correlated as the keys are)
              + (Yp_mn - 1/max(m, n)) gapV_k psi_k         (m != n: shared keys, k = min(m, n))
              + (1/keep - 1) Y2_m qbarV_m                   (m = n:  attention dropout),

  where Sv is the prefix-sum matrix of the value overlaps Cv = g_V C + b_V^2, gapV_k = (mean diagonal) -
  (mean off-diagonal) of Cv over positions 1..k, qbarV_k its mean diagonal, and Yp_mn the annealed cross-row
  overlap exp(rho^Q_mn v) / max(m, n) capped by sqrt(Y2_m Y2_n) (Cauchy-Schwarz), as the engine's Yp at T keys, and
  psi_k how much more row k's weights move with its keys' structure (keys alike weighed together:
  attention.coweighting; 1 for keys alike).
  For Cv = p 11^T + (q - p) I and m = n = T this is the engine's mix_forward exactly. Centered attention
  (A - 1/m: the MC subtracts the causal mean of V) keeps only the fluctuation terms. Block 1 of a token-input model
  adds to the diagonal the mass its rows put on repeated tokens' key pairs beyond this law's (repeats.py).

Reduced form (what runs). The T x T matrix costs O(T^2) per layer (0.85 s at T = 2048). Everything above
varies slowly in log m, so positions are grouped: singletons for the first `_SINGLE` positions, then groups
growing geometrically by `_RATIO` (78 groups at T = 2048), with edges at T//3 and 2T//3 so the thirds
are unions of groups. Tokens of one group are treated as exchangeable. The state is

    qf (T,)   the diagonal q_m at full resolution (every component's diagonal depends on q_m and on row m's
              key statistics only, so it is propagated per position),
    P (K, K)  the mean overlap between two distinct tokens of groups g, h (P[g, g]: within group g),
    R (K, K)  the same for the pairs whose two positions hold one token (Zipf ids: a share w = sum_i p_i^2 of all
              pairs, whose P is the mean over them all).

Same-token pairs. A kernel of the mean pair is not the mean of the pairs' kernels: where the attention branch is
small, the stream keeps its tokens, and the MLP maps the pairs that hold one token (overlap near q) apart from
the rest (near 0). Every position-wise operation maps R as any pair; MLP and MoE map P as the mixture
w K(R) + (1 - w) K((P - w R) / (1 - w)) (ops._same_token_pairs); attention's rows weigh their keys alike whatever
token the query holds (the uniform rows' law: their query overlap beyond the mean pair's is left out), so R
leaves attention as P. Without it the rho of a causal SwiGLU stack with a small value path grew 20-30% too slowly
(DeepSeek-V3 at T 512: 0.05 all pairs, 0.07 in the late third, now 0.027 and 0.035). The backward reads
the mean pair, and at MLP and MoE the rest's (the pairs' bulk: they run the rest and R, not P).

Row m's key statistics (qbar_m, pbar_m, hence beta_c, Y2_m, v_m) and the diagonal Sv[m, m] are exact per
position: the keys of row m are the full groups before its own plus the first i tokens of its group, whose
sums follow from (qf, P). The off-diagonal uniform part, averaged over m in g and n in h, is exact too: Sv is
bilinear in the within-group indices (i, j) (plus the within-group cumulative diagonal), so its average over
the group pair needs only the group moments mean(1/m), mean(i/m) and their pair versions, precomputed once.
Only the nonlinear pieces use group means: the fluctuation term (exp(rho v), the cap, gapV), the norm
(mean of q_m^(-1/2)) and the activation kernels (at the group's mean q). With all groups singletons the
reduced form is the full matrix form exactly. Cost O(K^2 + T) per layer.

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
from initadvisor.core.softmax_rows import expected_y

__all__ = ["CausalTrace", "propagate_overlaps", "pair_kernel", "thirds", "summarize",
           "row_statistics", "group_edges"]

_GELU = ("gelu", "geglu", "gelu_tanh")  # tanh-GeLU by GeLU's closed form, as kernels.forward (< 0.1% apart)
_SINGLE = 32  # positions 1.._SINGLE are their own group
_RATIO = 1.1  # then each group ends at about _RATIO x the previous edge (K = 78 groups at T = 2048; 1.05, 120 groups, took
# 35-40% longer and moved rho, q and the gradient by at most 2.5e-3 relative, 5e-5 typically: against the full T x T
# resolution, 1.3e-5 / 4.8e-5 (1.05 / 1.1) for GPT-2 small, 1.2e-3 / 2.5e-3 for OLMo 2 at T 2048, 1.7e-4 / 6.3e-4
# for a 24-layer rotary SwiGLU stack at T 4096). Past beta_c in post-LN, where rows weigh their keys unequally
# (Attention._key_shares at each group's last row), the gradient moves more: paper 001's encoder at T 512 is 2.7% / 6.4%
# below full resolution at 1.5 / 2.5 beta_c (1.4% / 3.3% at 1.05), rho within 6e-4
_KEEP_CELLS = 4 * 10**7  # the backward keeps every block's forward caches up to this many numbers (320 MB)


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
    overlap: (T, T) the final layer's overlap matrix C (None unless asked for; from the reduced form, constant
        off the diagonal within each pair of position groups).
    """

    q: np.ndarray
    rho_mean: np.ndarray
    rho_thirds: np.ndarray
    q_thirds: np.ndarray
    y2: np.ndarray
    beta_c: np.ndarray
    attention_output_variance_layer1: np.ndarray
    overlap: np.ndarray | None = field(default=None, repr=False)
    grad_q: np.ndarray | None = None  # (L+1,) mean over positions of the gradient's q, 1 at index L (backward=True)
    grad_p: np.ndarray | None = None  # (L+1,) its mean over pairs of positions m != n, over index L's q
    qk_share: np.ndarray | None = None  # (L,) the share of the gradient's q at each attention input through its
    # query/key path, over all positions
    stationary: bool = False  # the late tokens' distance-resolved state (distances.py): every position as a late one

    @property
    def rho_last(self) -> np.ndarray:
        return self.rho_thirds[:, 2]


def thirds(T: int) -> list[tuple[int, int]]:
    """Position ranges [lo, hi) of the three thirds (the split simulate and torch measure with)."""
    e = [0, T // 3, (2 * T) // 3, T]
    return [(e[i], e[i + 1]) for i in range(3)]


def _pair_moments(C: np.ndarray, lo: int = 0, hi: int | None = None) -> tuple[float, float]:
    """(mean q, mean over ordered pairs m != n of p) within positions lo..hi-1 (simulate.pair_moments)."""
    B = C[lo:hi, lo:hi]
    n = B.shape[0]
    if n == 0:
        return math.nan, math.nan
    tr = float(np.trace(B))
    tot = float(B.sum())
    q = tr / n
    p = (tot - tr) / (n * (n - 1)) if n > 1 else math.nan
    return q, p


def summarize(C: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(rho over all positions, rho per third (3,), q per third (3,)) of a full overlap matrix."""
    q, p = _pair_moments(C)
    r3, q3 = np.empty(3), np.empty(3)
    for j, (lo, hi) in enumerate(thirds(C.shape[0])):
        qj, pj = _pair_moments(C, lo, hi)
        r3[j], q3[j] = pj / qj, qj
    return p / q, r3, q3


# ------------------------------------------------------------------------------------------------
# Position groups


def group_edges(T: int, single: int = _SINGLE, ratio: float = _RATIO) -> np.ndarray:
    """Group edges 0 = e_0 < ... < e_K = T: singletons up to `single`, then geometric (edge x ratio), plus the
    thirds' edges T//3, 2T//3. single >= T gives the full (all singletons) resolution."""
    e = list(range(min(single, T) + 1))
    while e[-1] < T:
        e.append(min(T, max(e[-1] + 1, int(round(e[-1] * ratio)))))
    return np.array(sorted(set(e) | {T // 3, (2 * T) // 3}), dtype=np.int64)


def coarser(edges: np.ndarray, single: int, ratio: float) -> np.ndarray:
    """(K', K): which of the groups between `edges` each coarser group holds, the coarser edges a subset of them: the
    first `single` positions alone, then each group ends at the first edge at least `ratio` x the previous end."""
    keep, last = [], 0
    for g, e in enumerate(edges[1:]):
        if e <= single or e >= ratio * last or g == len(edges) - 2:
            keep.append(g)
            last = e
    label = np.searchsorted(np.array(keep), np.arange(len(edges) - 1))
    out = np.zeros((len(keep), len(edges) - 1))
    out[label, np.arange(len(edges) - 1)] = 1.0
    return out


@dataclass(frozen=True)
class _Grid:
    T: int
    edges: np.ndarray  # (K+1,)
    start: np.ndarray  # (K,) first position index (0-based) of each group
    n: np.ndarray  # (K,) group sizes (float)
    gid: np.ndarray  # (T,) group of each position
    m: np.ndarray  # (T,) 1-based position
    i: np.ndarray  # (T,) 1-based index within the group
    A: np.ndarray  # (K,) mean over the group of 1/m
    B: np.ndarray  # (K,) mean of i/m
    A2: np.ndarray  # (K,) mean over ordered pairs i != j of u_i u_j (u = 1/m); 0 for singletons
    Bt: np.ndarray  # (K,) mean over pairs of i u_i u_j
    E: np.ndarray  # (K,) mean over pairs of (i j - min(i, j)) u_i u_j
    Amax: np.ndarray  # (K,) mean over pairs of 1/max(m, n)
    pairs: np.ndarray  # (K,) n (n - 1)
    lo: np.ndarray  # (K, K) min(g, h)
    hi: np.ndarray  # (K, K) max(g, h)
    third_groups: tuple  # group index ranges of the three thirds
    single: np.ndarray  # (K,) bool: singleton groups
    # the backward's column sums of uniform causal rows (mix_backward_rows)
    J: np.ndarray  # (K,) sum of i/m^2 / n
    J2: np.ndarray  # (K,) sum of i^2/m^2 / n^2
    Wc: np.ndarray  # (K, K) Wc[a, g] = sum over rows m of a of the mean over keys s of g of W_ms (W_ms = 1/m, s <= m)
    keys: np.ndarray  # (K, K) keys[r, g]: group g's keys in group r's last row (n_g for g <= r, else 0)

    def segsum(self, x: np.ndarray) -> np.ndarray:
        return np.add.reduceat(x, self.start)

    def cum_within(self, x: np.ndarray) -> np.ndarray:
        """Inclusive cumulative sum within each group."""
        c = np.cumsum(x)
        off = np.concatenate(([0.0], c))[self.start]
        return c - off[self.gid]

    def pair_min_sum(self, c: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Per group: sum over ordered pairs i != j of c_min(i, j) u_i u_j = 2 sum_j u_j sum_{i<j} c_i u_i."""
        cu = c * u
        return 2.0 * self.segsum(u * (self.cum_within(cu) - cu))


@lru_cache(maxsize=16)
def _grid(T: int, single: int, ratio: float) -> _Grid:
    edges = group_edges(T, single, ratio)
    start = edges[:-1]
    n_int = np.diff(edges)
    K = len(n_int)
    gid = np.repeat(np.arange(K), n_int)
    m = np.arange(1, T + 1, dtype=float)
    i = m - start[gid]
    n = n_int.astype(float)
    u = 1.0 / m
    pairs = n * (n - 1)

    def seg(x):
        return np.add.reduceat(x, start)

    with np.errstate(invalid="ignore", divide="ignore"):
        inv_pairs = np.where(pairs > 0, 1.0 / np.maximum(pairs, 1.0), 0.0)
    su, siu = seg(u), seg(i * u)
    A2 = (su * su - seg(u * u)) * inv_pairs
    Bt = (siu * su - seg(i * u * u)) * inv_pairs
    # sum_{i<j} i u_i u_j, within groups
    c = np.cumsum(i * u)
    off = np.concatenate(([0.0], c))[start]
    excl = c - off[gid] - i * u
    lower = seg(u * excl)
    E = (siu * siu - seg(i * i * u * u) - 2.0 * lower) * inv_pairs
    Amax = 2.0 * seg((i - 1.0) * u) * inv_pairs  # position n is the later one of i - 1 pairs (each ordered twice)
    idx = np.arange(K)
    k1, k2 = int(np.searchsorted(edges, T // 3)), int(np.searchsorted(edges, (2 * T) // 3))
    Wc = np.where(np.greater.outer(idx, idx), su[:, None], 0.0)
    Wc[idx, idx] = siu / n
    return _Grid(T=T, edges=edges, start=start, n=n, gid=gid, m=m, i=i, A=su / n, B=siu / n, A2=A2, Bt=Bt,
                 E=E, Amax=Amax, pairs=pairs, lo=np.minimum.outer(idx, idx), hi=np.maximum.outer(idx, idx),
                 third_groups=((0, k1), (k1, k2), (k2, K)), single=n_int == 1,
                 J=seg(i * u * u) / n, J2=seg(i * i * u * u) / (n * n), Wc=Wc,
                 keys=np.where(np.less_equal.outer(idx, idx).T, n[None, :], 0.0))


# ------------------------------------------------------------------------------------------------
# Activation kernels for unequal variances: (a, b) the two variances, c the covariance (broadcasting)


def _relu_pair(a, b, c):
    """E[relu(u) relu(v)] = sqrt(ab)/(2 pi) (sqrt(1 - r^2) + r (pi - arccos r)): the arc-cosine kernel
    (001 eq. 16; Cho & Saul 2009) is positively homogeneous, so unequal variances a, b only rescale it."""
    ss = np.sqrt(a * b)
    r = np.clip(c / ss, -1.0, 1.0)
    return ss / (2 * np.pi) * (np.sqrt(1 - r * r) + r * (np.pi - np.arccos(r)))


def _gelu_pair(a, b, c):
    """E[u Phi(u) v Phi(v)] for (u, v) ~ N(0, [[a, c], [c, b]]), exact.

    Write Phi(u) = P(Z1 <= u), s = u - Z1, t = v - Z2 (Z independent N(0, 1)) and apply Gaussian integration by
    parts twice to E[u v 1{s>0} 1{t>0}] (Var s = 1 + a, Var t = 1 + b, Cov(s, t) = c, D = (1+a)(1+b) - c^2):

        c/4 + c/(2 pi) arcsin(c / sqrt((1+a)(1+b))) + (ab + c^2 - c^2 a/(1+a) - c^2 b/(1+b)) / (2 pi sqrt D).

    For a = b = q, c = r q it is 004 A.5's covariance plus the squared mean (kernels.gelu_forward)."""
    AB = (1.0 + a) * (1.0 + b)
    c2 = c * c
    D = np.maximum(AB - c2, 1e-300)
    brack = a * b + c2 - c2 * (a / (1.0 + a) + b / (1.0 + b))
    return c / 4 + c / (2 * np.pi) * np.arcsin(np.clip(c / np.sqrt(AB), -1, 1)) + brack / (2 * np.pi * np.sqrt(D))


def self_kernel(act: str, q: np.ndarray) -> np.ndarray:
    """E[phi(u)^2], u ~ N(0, q), per entry of q."""
    if act == "relu":
        return q / 2.0
    if act in _GELU:
        return _gelu_pair(q, q, q)
    if act == "linear":
        return q.copy()
    # after a norm every position has the same q up to eps / q: one series per q to 1 part in 1e6
    key = np.round(np.log(np.maximum(q, 1e-300)).ravel() * 1e6)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    u = q.ravel()[first]
    return kernels.series_coeffs(kernels.PHI["silu" if act == "swiglu" else act][0], u)[1][inv.reshape(q.shape)]


def cross_kernel(act: str, a: np.ndarray, C: np.ndarray) -> np.ndarray:
    """E[phi(u) phi(v)] for every entry of C: Var u = a[row], Var v = a[col], Cov = C (diagonal not special)."""
    if act == "relu":
        return _relu_pair(a[:, None], a[None, :], C)
    if act in _GELU:
        return _gelu_pair(a[:, None], a[None, :], C)
    if act == "linear":
        return C.copy()
    return kernels.series_pair(kernels.PHI["silu" if act == "swiglu" else act][0], a, C)


def pair_kernel(act: str, C: np.ndarray) -> np.ndarray:
    """E[phi(u_m) phi(u_n)] for the Gaussian field with covariance C (raw moments: the mean is kept)."""
    q = np.diag(C).copy()
    out = cross_kernel(act, q, C)
    np.fill_diagonal(out, self_kernel(act, q))
    return out


# ------------------------------------------------------------------------------------------------
# Causal attention rows


def row_std(beta, bc, lnT: float):
    """A row's score std beta sqrt(2 ln T) / bc (beta is defined with the spec's ln T; inf where bc is 0)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return float(beta) * math.sqrt(2.0 * lnT) / bc


def row_x(beta, bc: np.ndarray, lnT: float, m: np.ndarray) -> np.ndarray:
    """x = beta_m / bc_m of rows of m keys, beta_m = beta sqrt(ln T / ln m) (inf or nan for one key)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return row_std(beta, bc, lnT) / np.sqrt(2.0 * np.log(m))


def row_statistics(beta, bc: np.ndarray, lnT: float, m: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(Y2_m, v_m, (E[Y2], E[Y3], E[Y2^2])_m) of attention row m with m keys, vectorised over rows: the moments exact
    at m keys (softmax_rows; the query/key path's E tr(M^2) reads them too) for the
    row's score variance beta^2 ln T q_query (qbar_m - pbar_m) = 2 ln T (beta/bc_m)^2 (beta is defined with the
    spec's ln T); v_m the annealed variance 2 x^2 ln m at x = beta_m / bc_m, beta_m = beta sqrt(ln T / ln m), frozen
    at x = 1/2 beyond, which two rows' overlap e^(rho v) / max(m, n) reads. A row with one key has Y2 = 1."""
    if m is None:
        m = np.arange(1, bc.shape[0] + 1, dtype=float)
    lnm = np.log(m)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = row_std(beta, bc, lnT)
        x = row_x(beta, bc, lnT, m)
    one = m <= 1
    v = np.where(one, 0.0, 2.0 * np.minimum(np.where(one, 0.0, x), 0.5) ** 2 * lnm)
    ys = tuple(np.where(one, 1.0, y) for y in expected_y(np.where(np.isnan(s), np.nan, np.minimum(s, 1e300)), m))
    return ys[0], v, ys


# ------------------------------------------------------------------------------------------------
# The reduced state (qf: per-position q, P: group-pair overlaps); each operation's map on it is in ops.py


@dataclass
class State:
    qf: np.ndarray  # (T,)
    P: np.ndarray  # (K, K)
    R: np.ndarray | None = None  # (K, K): the pairs of positions that hold one token (ops.causal_forward carries it)
    w: float = 0.0  # their share of all pairs (P is the mean over all pairs, R's included)
    u: np.ndarray | None = None  # (T,): the variance of a token's mean square at its position between sequences
    # (ops.spread_forward's; None where no operation set it): the norms' backward reads it


@dataclass
class AttentionRows:
    """What an attention operation reports per row: Y2_m, beta_c of row m, and the branch output q_m."""

    y2: np.ndarray
    beta_c: np.ndarray
    var: np.ndarray  # per-position attention branch output q (after W_O, before dropout)
    qk: tuple = ()  # per row, what the query/key path's gains are computed from (Attention._qk_rows)
    overlap: np.ndarray | float = 0.0  # (K, K): two rows' overlap Yp over their IPRs' geometric mean
    shared: np.ndarray | None = None  # (K, K): Yp - 1 / max(t, t'), the overlap beyond uniform rows'
    keys: tuple | None = None  # windows and bidirectional rows (full resolution): row m's keys lo_m..hi_m, w_m of them
    weights: tuple | None = None  # ALiBi rows (full resolution): (W, d, c, sum W^2, overlap), Attention._causal_alibi
    structure: tuple | None = None  # rows over all keys: what Attention._key_structure reads (sums, qbar, kbar, pbar)
    shares: tuple | None = None  # rows over all keys: (K, K) [row group, key group] a key's share of E[A], of E[A^2]
    # and of the scores' gradient over uniform rows' (Attention._key_shares), None where uniform
    field: tuple | None = None  # rows over all keys with the keys' field law on: what Attention._key_half reads
    key_half: tuple | None = None  # set by the first backward from `field`: per row the query/key path's key half over
    # the engine's, and per row and key group a key's share of it (Attention._key_half)
    qk_share: float = 0.0  # set by the backward: the share of the gradient's q at the input through that path
    phi: np.ndarray | float | None = None  # set by the first backward: the query half's factor over the keys'
    # structure (Attention._key_structure; 1 where it cannot show), so that every later one is the same linear map


def gmean(G: _Grid, x: np.ndarray) -> np.ndarray:
    return G.segsum(x) / G.n


def _clamp(G: _Grid, S: State) -> State:
    """As the single-pair engine: q into [1/HUGE, HUGE], overlaps within +-sqrt(q_a q_b) of their groups."""
    qf = np.clip(np.nan_to_num(S.qf, nan=att.HUGE, posinf=att.HUGE), 1.0 / att.HUGE, att.HUGE)
    qg = gmean(G, qf)
    bound = np.multiply.outer(np.sqrt(qg), np.sqrt(qg))
    R = None if S.R is None else np.clip(np.nan_to_num(S.R, nan=0.0), -bound, bound)
    with np.errstate(over="ignore"):  # (q up to HUGE: its square's bound is inf)
        u = None if S.u is None else np.clip(np.nan_to_num(S.u, nan=0.0, posinf=0.0), 0.0, qf * qf)  # as clamp_spread
    return State(qf, np.clip(np.nan_to_num(S.P, nan=0.0), -bound, bound), R, S.w, u)


def _summary(G: _Grid, S: State) -> tuple[float, np.ndarray, np.ndarray]:
    """(rho over all positions, rho per third, q per third) of the reduced state."""
    n = G.n
    M = S.P * np.multiply.outer(n, n)
    M[np.diag_indices(len(n))] = G.pairs * np.diag(S.P)  # off-diagonal totals only
    tr = G.segsum(S.qf)

    def ratio(a: int, b: int) -> tuple[float, float]:
        cnt = float(n[a:b].sum())
        if cnt < 1:
            return math.nan, math.nan
        q = float(tr[a:b].sum()) / cnt
        p = float(M[a:b, a:b].sum()) / (cnt * (cnt - 1)) if cnt > 1 else math.nan
        return p / q, q

    rho = ratio(0, len(n))[0]
    r3, q3 = np.empty(3), np.empty(3)
    for j, (a, b) in enumerate(G.third_groups):
        r3[j], q3[j] = ratio(a, b)
    return rho, r3, q3


# ------------------------------------------------------------------------------------------------
# The model


def input_state(G: _Grid, q0: float, p0: float, repeats: tuple[float, float] = (0.0, 0.0)) -> State:
    """The simplex input C = p0 11^T + (q0 - p0) I on the grid; repeats = (w, r0): the share of pairs that hold
    one token and their overlap (Embeddings.repeats), carried as R where 0 < w < 1 (w = 1, a vocabulary of one:
    every pair is such a pair, P is R)."""
    K = len(G.n)

    def overlaps(x: float) -> np.ndarray:
        M = np.full((K, K), float(x))
        M[G.single, G.single] = 0.0  # (a single position's group has no pair within it)
        return M

    w, r0 = repeats
    return State(np.full(G.T, float(q0)), overlaps(p0), overlaps(r0) if 0 < w < 1 else None, float(w))


def _cells(cache) -> int:
    """The numbers a block's forward caches hold (arrays inside tuples, lists and dataclasses)."""
    if isinstance(cache, np.ndarray):
        return cache.size
    if isinstance(cache, (tuple, list)):
        return sum(_cells(c) for c in cache)
    if hasattr(cache, "__dataclass_fields__"):
        return sum(_cells(getattr(cache, f)) for f in cache.__dataclass_fields__)
    return 0


def propagate_overlaps(blocks: Sequence[tuple], q0: float, p0: float, T: int, keep_overlap: bool = False,
                       single: int = _SINGLE, ratio: float = _RATIO, backward: bool = False,
                       repeats: tuple[float, float] = (0.0, 0.0), widths: Sequence[int] | None = None) -> CausalTrace:
    """Run a causal stack (blocks: tuples of ops.py operations) from the simplex input C = p0 11^T + (q0 - p0) I
    (`input_state`; repeats: its same-token pairs) on the grouped state; backward: then the gradient of sum_m x_m . G_m (G i.i.d. per position, as simulate.py)
    back through it on the same state.

    single / ratio set the position groups (group_edges); single >= T is the full T x T resolution. widths: each
    block's d_model; with the backward, the gradient is then the mean over sequences at that width where the rho walk
    reaches it (walk.causal_factor, walk.resolves_walk), else the mean field's; with ops.FIELD_LAW rho and the IPR
    too."""
    from initadvisor.core import ops, walk  # (ops.py and walk.py build on this module)
    from initadvisor.core.ops import Attention, causal_backward, causal_forward, find

    T = int(T)
    if T < 2:
        raise ValueError("a causal sequence needs T >= 2")
    G = _grid(T, int(single), float(ratio))
    K = len(G.n)
    S = input_state(G, q0, p0, repeats)
    L = len(blocks)
    qs = np.empty((L + 1, T))
    rho = np.empty(L + 1)
    r3 = np.empty((L + 1, 3))
    q3 = np.empty((L + 1, 3))
    y2 = np.empty((L, T))
    bcs = np.empty((L, T))
    var1 = np.full(T, np.nan)

    def record(k: int, S: State) -> None:
        qs[k] = S.qf
        rho[k], r3[k], q3[k] = _summary(G, S)

    def step(k: int, S: State) -> tuple[State, list]:
        with np.errstate(over="ignore", invalid="ignore"):
            S, caches = causal_forward(blocks[k], G, S)
        return _clamp(G, S), caches

    # the backward needs every block's caches: kept when the first block's, L times over, fit in _KEEP_CELLS, else the
    # forward keeps the state entering every stride-th block and runs each segment again (one more forward pass)
    stride, kept, starts = L, [], {}
    walks = backward and widths is not None and all(widths) and walk.resolves_walk(blocks)
    ins, grads = [], [None] * (L + 1)  # the walk's: the state entering each block, the gradient's at each index
    record(0, S)
    for k in range(L):
        if backward and k % stride == 0:
            starts[k] = S
        if walks:
            ins.append(S)
        S, caches = step(k, S)
        if backward and k == 0 and L * _cells(caches) > _KEEP_CELLS:
            stride = max(1, math.isqrt(L))
        record(k + 1, S)
        rows = find(blocks[k], caches, Attention)
        y2[k], bcs[k] = rows.y2, rows.beta_c
        if k == 0:
            var1 = rows.var.copy()
        if backward and stride == L:
            kept.append(caches)
    gq = gp = share = None
    if backward:
        gq, gp, share = np.empty(L + 1), np.empty(L + 1), np.empty(L)
        D = grads[L] = State(np.ones(T), np.zeros((K, K)))
        gq[L], gp[L] = 1.0, 0.0
        for a in sorted(starts, reverse=True):
            b = min(a + stride, L)
            if stride < L:
                kept, Sa = [], starts.pop(a)
                for k in range(a, b):
                    Sa, caches = step(k, Sa)
                    kept.append(caches)
            for k in range(b - 1, a - 1, -1):
                with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                    D = clamp_grad(G, causal_backward(blocks[k], G, D, kept[k - a]))
                share[k] = find(blocks[k], kept[k - a], Attention).qk_share
                kept[k - a] = None
                gq[k], gp[k] = float(D.qf.mean()), pair_mean(G, D.P)
                grads[k] = D
        if walks:  # the mean gradient over sequences at the blocks' width; with the field law rho and the IPR too
            f, B, dy = walk.causal_factor(blocks, G, ins, grads, widths, means=ops.FIELD_LAW)
            gq, gp = gq * f, gp * f
            if ops.FIELD_LAW:  # (the i.i.d. rows' low rho offsets the width's pull: docs/phase-grid.md)
                rho, r3 = np.clip(rho + B, -1.0, 1.0), np.clip(r3 + B[:, None], -1.0, 1.0)
                y2 = np.clip(y2 + dy, 0.0, 1.0)
    overlap = None
    if keep_overlap:
        overlap = S.P[G.gid][:, G.gid]
        np.fill_diagonal(overlap, S.qf)
    for j, (lo, hi) in enumerate(thirds(T)):  # a third with fewer than two positions has no pairs
        if hi - lo < 2:
            r3[:, j] = rho
            q3[:, j] = qs[:, lo:hi].mean(axis=1) if hi > lo else qs.mean(axis=1)
    return CausalTrace(q=qs, rho_mean=rho, rho_thirds=r3, q_thirds=q3, y2=y2, beta_c=bcs,
                       attention_output_variance_layer1=var1, overlap=overlap, grad_q=gq, grad_p=gp, qk_share=share)


# ------------------------------------------------------------------------------------------------
# The backward on the same reduced state: qf the gradient's per-position second moment g_m = E|dL/dx_m|^2 / d,
# P the group-pair means of E[dL/dx_m . dL/dx_n] / d (m != n). Position-wise operations scale g_m by their
# position's factor and P by the groups' (ops.py `causal_backward`); causal attention sums over its rows.


def suffix_within(G: _Grid, x: np.ndarray) -> np.ndarray:
    """Inclusive suffix sum within each group: sum of x over positions of m's group at or after m."""
    return G.segsum(x)[G.gid] - G.cum_within(x) + x


def mix_backward_rows(G: _Grid, S: State, y2: np.ndarray, drop: float = 0.0, shared=None,
                      shares: np.ndarray | None = None) -> State:
    """The gradient at the values from the gradient at the attention output (value path, uniform causal rows):
    dv_s = sum_{t >= s} A_ts do_t with E A_ts^2 = d_t / t, E A_ts A_ts' = (s2_t - d_t) / (t (t - 1)) within a row
    (d_t = Y2_t / keep, s2_t = 1 + Y2_t drop / keep: the moments of mixing()) and E A_ts A_t's' = 1 / (t t') across
    rows, plus their overlap beyond uniform (`shared`).

    Per position s:  g_s' = sum_{t >= s} d_t g_t / t + sum_{t != t' >= s} P_tt' / (t t');
    per group pair:  the mean over s in g, s' in h (s != s') of sum_{t >= max(s, s')} (s2_t - d_t) g_t / (t (t - 1))
                     + sum_{t != t'} W_ts W_t's' P_tt',
    the second one as Wc^T P Wc (Wc: grid column sums) less the lift's t = t' terms, exact for a state constant
    within groups. shared: the rows' overlap beyond uniform, Yp - 1 / max(t, t') per group pair (the forward's):
    spread over the min(t, t') keys the two rows share, and -1 / (min - 1) of it between two of them (rows whose
    queries correlate attend to the same keys: e^(rho v) - 1 of uniform, Qwen3's gradient 17% -> 1% at block 1).
    shares: a key's share of a row's E[A^2] where the rows weigh keys unequally (row_sums)."""
    K, n, m = len(G.n), G.n, G.m
    d, _, s2, _ = att.mixing(y2, 0.0, 1.0, False, drop)
    g = S.qf
    Pm = S.P.copy()
    Pm[G.single, G.single] = 0.0
    c = np.diag(Pm).copy()  # the within-group pair mean, lifted onto the diagonal and taken off again
    idx = np.arange(K)
    with np.errstate(divide="ignore", invalid="ignore"):
        diag, out = row_sums(G, d * g / m, np.where(m > 1, (s2 - d) * g / (m * (m - 1.0)), 0.0), shares)

    # from the pairs P_tt'
    diag_p, sufS = pair_suffix(G, Pm, 1.0 / m)
    X = G.Wc.T @ Pm @ G.Wc
    X -= sufS[G.hi] + c[G.hi] * G.J[G.hi]
    X[idx, idx] += G.J[idx] * c - G.J2 * c  # the diagonal: J2 in place of J
    with np.errstate(divide="ignore", invalid="ignore"):
        within = (n * n * np.diag(X) - G.segsum(diag_p)) / np.maximum(G.pairs, 1.0)
    X[idx, idx] = within
    out += X
    if shared is not None:
        a = G.A[G.lo]  # 1 / min(t, t')
        Z = Pm * shared * a  # per shared key
        diag_p = diag_p + pair_suffix(G, Z, np.ones(G.T))[0]
        with np.errstate(divide="ignore", invalid="ignore"):  # -Z / (min(t, t') - 1) between two shared keys
            F = pair_suffix(G, np.where(a < 1.0, Z * a / (1.0 - a), 0.0), np.ones(G.T))[0]
        out -= gmean(G, F)[G.hi]
    out[G.single, G.single] = 0.0
    return State(diag + diag_p, out)


def prefix_pair_sums(G: _Grid, kd: np.ndarray, Kp: np.ndarray, cd: np.ndarray, Cp: np.ndarray, KCp: np.ndarray
                     ) -> tuple[np.ndarray, ...]:
    """Per row group r, its keys the groups up to r: the eight sums of gradients.jacobian_form. kd, cd (K,): each
    group's diagonal K_ss, C_ss; Kp, Cp, KCp (K, K): per group pair the sums over ordered position pairs s != s' of
    K, C and K o C."""
    n = G.n

    def box(X):  # sum over g, h <= r
        return np.diag(np.cumsum(np.cumsum(X, axis=0), axis=1))

    dK, dC, dKC = np.cumsum(n * kd), np.cumsum(n * cd), np.cumsum(n * kd * cd)
    rK = kd[:, None] + np.cumsum(Kp, axis=1) / n[:, None]  # [g, r]: one key of g's row sum over the groups up to r
    rC = cd[:, None] + np.cumsum(Cp, axis=1) / n[:, None]
    up = np.less_equal.outer(np.arange(len(n)), np.arange(len(n)))  # g <= r
    Sdr = np.sum(np.where(up, (n * cd)[:, None] * rK + (n * kd)[:, None] * rC, 0.0), axis=0)
    T3 = np.sum(np.where(up, n[:, None] * rK * rC, 0.0), axis=0)
    return dK, dC, dKC, dK + box(Kp), dC + box(Cp), dKC + box(KCp), Sdr, T3


def pair_suffix(G: _Grid, Pm: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position s: sum over t != t' >= s of Pm[group t, group t'] u_t u_t' (Pm symmetric, its diagonal the mean
    within a group, 0 for singletons), and per group a: the sum over groups after it of Pm[b, b] sum_{t in b} u_t^2
    (the lifted diagonal taken off)."""
    gid = G.gid
    c = np.diag(Pm)
    Hs, S2 = G.segsum(u), G.segsum(u * u)
    sufS = (c * S2).sum() - np.cumsum(c * S2)
    M = Pm * np.multiply.outer(Hs, Hs)
    rs = np.triu(M, 1).sum(axis=1)  # sum over b > a of M[a, b]
    v = np.diag(M) + 2.0 * rs
    Q = v.sum() - np.cumsum(v)  # sum over a, b > g of M[a, b]
    with np.errstate(divide="ignore", invalid="ignore"):
        R = np.where(Hs > 0, rs / Hs, 0.0)  # sum over b > g of P[g, b] Hs_b
    U, V = suffix_within(G, u), suffix_within(G, u * u)
    return Q[gid] + 2.0 * U * R[gid] + c[gid] * (U * U - V) - sufS[gid], sufS


def row_sums(G: _Grid, f_diag: np.ndarray, f_pair: np.ndarray, shares: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """What rows t send back to their keys s <= t: per position sum_{t >= s} f_diag_t (times key s's share of row t,
    shares[group t, group s] over its mean over row t's keys, where rows weigh their keys unequally: shares are
    normalised at each group's last row, and a row before it reads only part of its group's keys), and per group
    pair the mean over keys s in g, s' in h (s != s') of sum_{t >= max(s, s')} f_pair_t (the later group's share
    i / n)."""
    idx, i, n = np.arange(len(G.n)), G.i, G.n
    if shares is None:
        diag = np.cumsum(f_diag[::-1])[::-1]
    else:  # the later groups' rows at their share, the key's own group's at its diagonal one
        earlier = np.sum(np.tril(shares, -1) * G.keys, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            c = G.m / (earlier[G.gid] + G.i * np.diag(shares)[G.gid])
        f_diag = f_diag * np.where(np.isfinite(c) & (c > 0), c, 1.0)
        later = np.tril(shares, -1).T @ G.segsum(f_diag)
        diag = later[G.gid] + np.diag(shares)[G.gid] * suffix_within(G, f_diag)
    seg = G.segsum(f_pair)
    after = seg.sum() - np.cumsum(seg)  # positions after group a
    out = (after + G.segsum(f_pair * i) / n)[G.hi]
    with np.errstate(divide="ignore", invalid="ignore"):
        out[idx, idx] = after + G.segsum(f_pair * i * (i - 1.0)) / np.maximum(G.pairs, 1.0)
    return diag, out


def readers(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows that read key s, an interval [a_s, b_s] when every row's keys are one ([lo_t, hi_t], both
    non-decreasing in t): causal windows, bidirectional windows, all keys."""
    s = np.arange(len(lo))
    return np.searchsorted(hi, s, side="left"), np.searchsorted(lo, s, side="right") - 1


def shared_keys(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """|K_m & K_n|: the keys two rows over the intervals [lo_m, hi_m] and [lo_n, hi_n] share."""
    return np.maximum(np.minimum.outer(hi, hi) - np.maximum.outer(lo, lo) + 1, 0).astype(float)


def window_sums(f_diag: np.ndarray, f_pair: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """row_sums at full resolution for rows over key intervals: per key sum over its readers of f_diag, per key
    pair (s != s') the sum over their common readers of f_pair."""
    a, b = readers(lo, hi)
    c1 = np.concatenate([[0.0], np.cumsum(f_diag)])
    c2 = np.concatenate([[0.0], np.cumsum(f_pair)])
    first, last = np.maximum.outer(a, a), np.minimum.outer(b, b)
    out = np.where(last >= first, c2[np.maximum(last, first - 1) + 1] - c2[first], 0.0)
    out[np.diag_indices(len(lo))] = 0.0
    return c1[b + 1] - c1[a], out


def _reader_box(P: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The 2-D prefix sums of P_tt' / (w_t w_t') with its diagonal (t = t') out: a box over two keys' readers sums
    the cross-row part of the rows' transpose."""
    Pt = P / np.multiply.outer(w, w)
    np.fill_diagonal(Pt, 0.0)
    T = len(w)
    box = np.zeros((T + 1, T + 1))
    np.cumsum(np.cumsum(Pt, axis=0), axis=1, out=box[1:, 1:])
    return box


def window_column_sums(P: np.ndarray, lo: np.ndarray, hi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per key s, the sum over its readers t != t' of P_tt' / (w_t w_t'): mix_backward_window's cross-row part on the
    diagonal alone (one box a key, no T x T gathers)."""
    box = _reader_box(P, w)
    a, b = readers(lo, hi)
    return box[b + 1, b + 1] - box[a, b + 1] - box[b + 1, a] + box[a, a]


def mix_backward_window(S: State, y2: np.ndarray, drop: float, lo: np.ndarray, hi: np.ndarray,
                        w: np.ndarray, shared=None) -> State:
    """mix_backward_rows at full resolution for rows over key intervals (row t: keys lo_t..hi_t, w_t of them):
    the cross-row part sum_{t in R_s, t' in R_s'} P_tt' / (w_t w_t') as box sums of the prefix-summed matrix over
    the readers R_s x R_s' (t != t': P's diagonal is 0); shared = (Yp - uniform overlap, number of shared keys)."""
    d, _, s2, _ = att.mixing(y2, 0.0, 1.0, False, drop)
    g = S.qf
    with np.errstate(invalid="ignore", divide="ignore"):
        diag, out = window_sums(d * g / w, np.where(w > 1, (s2 - d) * g / (w * (w - 1.0)), 0.0), lo, hi)
    box = _reader_box(S.P, w)
    a, b = readers(lo, hi)
    X = box[b + 1][:, b + 1] - box[a][:, b + 1] - box[b + 1][:, a] + box[a][:, a]
    diag = diag + np.diag(X)
    out += X
    if shared is not None:  # over the keys two rows share, and -1 / (n - 1) of it between two of them
        fl, n = shared
        with np.errstate(divide="ignore", invalid="ignore"):
            Z = np.where(n > 0, S.P * fl / n, 0.0)
            Z2 = np.where(n > 1, Z / (n - 1.0), 0.0)
        np.fill_diagonal(Z, 0.0)
        np.fill_diagonal(Z2, 0.0)
        np.cumsum(np.cumsum(Z, axis=0), axis=1, out=box[1:, 1:])
        diag = diag + box[b + 1, b + 1] - box[a, b + 1] - box[b + 1, a] + box[a, a]
        np.cumsum(np.cumsum(Z2, axis=0), axis=1, out=box[1:, 1:])
        A, B = np.maximum.outer(a, a), np.minimum.outer(b, b)
        out -= np.where(B >= A, box[B + 1, B + 1] - box[A, B + 1] - box[B + 1, A] + box[A, A], 0.0)
    np.fill_diagonal(out, 0.0)
    return State(diag, out)


def self_dkernel(act: str, q: np.ndarray) -> np.ndarray:
    """E[phi'(u)^2], u ~ N(0, q), per entry of q (gated: the gate's activation)."""
    if act == "relu":
        return np.full_like(q, 0.5)
    if act == "linear":
        return np.ones_like(q)
    if act in _GELU:  # 004 A.5's closed form
        return kernels.gelu_backward(q, q)[0]
    key = np.round(np.log(np.maximum(q, 1e-300)).ravel() * 1e6)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    f = kernels.PHI[{"swiglu": "silu", "geglu": "gelu", "gelu_tanh": "gelu"}.get(act, act)][1]
    return kernels.series_coeffs(f, q.ravel()[first])[1][inv.reshape(q.shape)]


def cross_dkernel(act: str, a: np.ndarray, C: np.ndarray) -> np.ndarray:
    """E[phi'(u) phi'(v)] for every entry of C: Var u = a[row], Var v = a[col], Cov = C (004 A.4 for ReLU)."""
    if act == "relu":
        r = np.clip(C / np.sqrt(np.multiply.outer(a, a)), -1.0, 1.0)
        return 0.25 + np.arcsin(r) / (2 * np.pi)
    if act == "linear":
        return np.ones_like(C)
    if act in _GELU:  # 004 A.5 at the pair's geometric-mean variance (after a norm the groups' q agree to eps / q)
        return kernels.gelu_backward(np.sqrt(np.multiply.outer(a, a)), C)[1]
    return kernels.series_pair(kernels.PHI[{"swiglu": "silu", "geglu": "gelu", "gelu_tanh": "gelu"}.get(act, act)][1], a, C)


def clamp_grad(G: _Grid, S: State) -> State:
    """g into [0, HUGE] (overflow and NaN become HUGE), pair means within +-sqrt(g_a g_b) of their groups."""
    g = np.clip(np.nan_to_num(S.qf, nan=att.HUGE, posinf=att.HUGE), 0.0, att.HUGE)
    gg = gmean(G, g)
    bound = np.sqrt(np.multiply.outer(gg, gg))
    return State(g, np.clip(np.nan_to_num(S.P, nan=0.0), -bound, bound))


def pair_mean(G: _Grid, P: np.ndarray) -> float:
    """Mean over ordered pairs m != n of all positions of a group-pair state."""
    M = P * np.multiply.outer(G.n, G.n)
    M[np.diag_indices(len(G.n))] = G.pairs * np.diag(P)
    return float(M.sum()) / (G.T * (G.T - 1.0))
