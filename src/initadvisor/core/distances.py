"""Distance-resolved propagation: the late tokens of a sliding-window (or ALiBi) stack too long to resolve per position.

Past its first W positions every row of a sliding window sees W keys, and the overlap matrix of late tokens is
stationary: C[m, n] = c(|m - n|). The state is q (one token) and the profile c(delta), delta = 1..T-1 (one token
pair per distance), so a layer costs O(T), not the full-resolution engine's O(T^2). Position-wise operations map
each distance as the engine's pair (their `moments`, vectorised over delta); attention (Attention.distances) sums
two rows' value overlaps over their keys - a triangle kernel of the window's width - and adds the REM's fluctuation
terms on the keys the rows share: _causal_window's terms with c(|m - n|) in place of C. Where the single pair gives
every pair the correlation near tokens gain by sharing keys (rho 0.1-0.4 too high), this keeps each distance's own.
Early rows (fewer keys) are left out of the state: their own row statistics are reported per position.

The gradient runs backward on the same state, (g, g(delta)): every late key is read by n late rows, so two keys
delta apart have n - delta common readers and the readers of two keys are two n-blocks delta apart (BlockSums);
position-wise operations by their pair maps (MLPs by the causal engine's series kernels, as forward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from initadvisor.core import attention as att
from initadvisor.core import causal as cz


def triangle_sums(q: float, c: np.ndarray, n: int) -> np.ndarray:
    """tot(delta) = sum of C[s, s'] over the n x n keys of two rows delta apart (keys i..i+n-1 and delta+i..), for
    delta = 0..T-1: sum_{|k| < n} (n - |k|) C(|delta + k|), with C(0) = q and c held beyond T - 1 (two box sums)."""
    T = c.size + 1
    ext = np.concatenate([c[n - 2::-1] if n > 1 else [], [q], c, np.full(n - 1, c[-1] if c.size else q)])
    cs = np.concatenate([[0.0], np.cumsum(ext)])
    g = cs[n:n + T + n - 1] - cs[:T + n - 1]  # g[u] = sum_{j < n} f(u - n + 1 + j)
    cg = np.concatenate([[0.0], np.cumsum(g)])
    return cg[n:n + T] - cg[:T]


def pair_means(c: np.ndarray, sizes) -> np.ndarray:
    """Mean of C over ordered pairs m != n of `sizes` consecutive positions: sum_k 2 (n - k) c(k) / (n (n - 1))
    (the sizes' own value where n = 1: no pair)."""
    n = np.asarray(sizes)
    s1 = np.concatenate([[0.0], np.cumsum(c)])  # s1[j] = sum_{k <= j} c(k)
    s2 = np.concatenate([[0.0], np.cumsum(np.arange(1, c.size + 1) * c)])
    j = np.maximum(n - 1, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 1, 2.0 * (n * s1[j] - s2[j]) / (n * np.maximum(n - 1.0, 1.0)), np.nan)


@dataclass
class LateRows:
    """What Attention.distances keeps: per position (reported) Y2, beta_c and the branch's output q; for the late rows
    (n keys; local: a window shorter than T) their Y2 and beta_c, the overlap beyond uniform rows' on the keys two
    rows delta apart share (fl) and over their IPRs (overlap), _qk_rows' geometry; ALiBi: the heads'."""

    y2: np.ndarray
    beta_c: np.ndarray
    var: np.ndarray
    n: int = 0
    local: bool = False
    y2_late: float = 0.0
    bc_late: float = 0.0
    fl: np.ndarray | None = None
    overlap: np.ndarray | None = None
    qk: tuple = ()
    heads: tuple = ()  # ALiBi: (window-equivalent operation, its rows, its share of the heads)
    qk_share: float = 0.0  # set by the backward
    spread: object = None  # the late rows' output spread (ops.Attention._spread; None for ALiBi's heads)


@dataclass(frozen=True)
class BlockSums:
    """Sums over late rows on the distance-resolved state: the readers of a key are the n rows whose windows hold it
    (consecutive positions), or all T rows (a global layer)."""

    n: int
    T: int
    local: bool

    def common(self, d: np.ndarray) -> np.ndarray:
        """Readers two keys d apart share: n - d, or T."""
        return np.maximum(self.n - d, 0) if self.local else np.full(d.shape, self.T)

    def pairs(self, f: np.ndarray) -> np.ndarray:
        """For two keys delta = 0..T-1 apart, the sum over their readers t, t' (t != t') of f(|t - t'|)."""
        if self.local:
            return triangle_sums(0.0, f, self.n)
        return np.full(self.T, 2.0 * float(np.dot(self.T - np.arange(1, self.T), f)))

    def within(self, f: np.ndarray, m: np.ndarray) -> np.ndarray:
        """Per key pair, the sum over ordered pairs of their m common readers (consecutive) of f(|t - t'|)."""
        with np.errstate(invalid="ignore"):
            return np.where(m > 1, m * (m - 1.0) * pair_means(f, m), 0.0)


def distance_backward(ops, gq, gp, caches) -> tuple:
    """One block's gradient on the distance-resolved state (distance_forward's caches), as distance_forward."""
    for op, c in zip(reversed(ops), reversed(caches)):
        f = getattr(op, "distances_backward", None)
        gq, gp = f(gq, gp, c) if f is not None else op.moments_backward(gq, gp, c)
    return gq, gp


def distance_forward(ops, q, c) -> tuple:
    """One block on the distance-resolved state: Attention and Residual by their `distances`, every other
    (position-wise) operation by its pair map over the distances. q is taken as a numpy float, so that an overflow
    within the block is inf (caught by the clamp after it), not Python's OverflowError."""
    caches, q = [], np.float64(q)
    for op in ops:
        f = getattr(op, "distances", None)
        q, c, cache = f(q, c) if f is not None else op.moments(q, c)
        caches.append(cache)
    return q, c, caches


def block_forward(ops, q, c, u=None) -> tuple:
    """distance_forward, the state clamped as the pair engine's (q into [1/HUGE, HUGE], overlaps within +-q), and
    a token's mean-square spread u through it (ops.spread_forward: the caches the backward reads)."""
    from initadvisor.core.ops import spread_forward

    with np.errstate(over="ignore", invalid="ignore"):
        q, c, caches = distance_forward(ops, q, c)
        u, caches = spread_forward(ops, u, caches)
    q = float(min(max(q, 1.0 / att.HUGE), att.HUGE)) if math.isfinite(q) else att.HUGE
    u = None if u is None else float(min(max(np.nan_to_num(u, nan=0.0, posinf=0.0), 0.0), q * q))
    return q, np.clip(np.nan_to_num(c, nan=0.0), -q, q), caches, u


def propagate_distances(blocks, q0: float, p0: float, T: int, backward: bool = False):
    """Run a stack on the distance-resolved state from the simplex input (c = p0 at every distance); a CausalTrace
    whose q is the late tokens' at every position, rho over all pairs and thirds from the profile weighted by the
    pairs at each distance, and y2, beta_c per row at its own keys. backward: the late tokens' gradient of
    sum_m x_m . G_m (G i.i.d. per position, as simulate.py) too, its grad_p the mean over pairs of positions (each
    block's caches kept, or recomputed from its input state on a long stack)."""
    from initadvisor.core.causal import CausalTrace, thirds
    from initadvisor.core.ops import Attention, find

    T = int(T)
    L = len(blocks)
    q, c = float(q0), np.full(T - 1, float(p0))
    qs, rho, r3, q3 = np.empty(L + 1), np.empty(L + 1), np.empty((L + 1, 3)), np.empty((L + 1, 3))
    y2, bcs, var1 = np.empty((L, T)), np.empty((L, T)), np.full(T, np.nan)
    sizes = [hi - lo for lo, hi in thirds(T)]
    keep = L * T <= _KEEP_CELLS
    states, kept = [], []

    def record(k: int) -> None:
        qs[k], q3[k] = q, q
        rho[k] = pair_means(c, T) / q
        r3[k] = np.where(np.array(sizes) > 1, pair_means(c, sizes) / q, rho[k])

    record(0)
    u = None
    for k, ops in enumerate(blocks):
        if backward:
            states.append((q, c, u))
        q, c, caches, u = block_forward(ops, q, c, u)
        record(k + 1)
        rows = find(ops, caches, Attention)
        y2[k], bcs[k] = rows.y2, rows.beta_c
        if k == 0:
            var1 = rows.var
        if backward and keep:
            kept.append(caches)
    gq_out = gp_out = share = None
    if backward:
        gq_out, gp_out, share = np.empty(L + 1), np.empty(L + 1), np.empty(L)
        gq, gp = 1.0, np.zeros(T - 1)
        gq_out[L], gp_out[L] = 1.0, 0.0
        for k in range(L - 1, -1, -1):
            caches = kept[k] if keep else block_forward(blocks[k], *states[k])[2]
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                gq, gp = distance_backward(blocks[k], gq, gp, caches)
            gq = float(min(max(gq, 0.0), att.HUGE)) if not math.isnan(gq) else att.HUGE
            gp = np.clip(np.nan_to_num(gp, nan=0.0), -gq, gq)
            gq_out[k], gp_out[k] = gq, pair_means(gp, T)
            share[k] = find(blocks[k], caches, Attention).qk_share
            if keep:
                kept[k] = None
    return CausalTrace(q=np.repeat(qs[:, None], T, axis=1), rho_mean=rho, rho_thirds=r3, q_thirds=q3, y2=y2,
                       beta_c=bcs, attention_output_variance_layer1=var1, grad_q=gq_out, grad_p=gp_out,
                       qk_share=share, stationary=True)


_KEEP_CELLS = 10**6  # the backward keeps every block's caches (about 20 arrays of T) up to layers x T this large
