"""The rho walk: at finite width a sequence's own rho wanders from the mean field's, and its gradient with it.

The fresh weights of each residual branch act on the sequence's common direction m (its tokens' mean): the branch's
last weight matrix W gives |W u|^2 a chi-square spread (2 / d relative) and the sum s x + b f a cross term
2 s b m.f / d of mean zero. In a term t = (weight^2) p per summand (the skip s^2 p_x, each branch b^2 p_f) the
sequence's common part p moves by a variance (2 sum_branches t^2 + 4 sum_pairs t t') / d, p and q alike; the block's
operations after the sum carry that to its output (a copy of the state moved there). Each block carries its input's
deviation on by its slope in rho. A block's log gradient gain moves with its input's rho, so the mean of the gradient
over sequences is the mean field's times exp(var / 2) of the sum of those moves (a log-normal; past beta_c in post-LN,
where the gains fall steeply with rho, the mean field alone is 0.75-0.95 of the measured mean at d 720:
benchmarks/gradient_tails.py). The pair engine only: the position-resolved backward does not carry it.
"""

from __future__ import annotations

import numpy as np

from initadvisor.core.ops import Residual, moments_backward, moments_forward

_H = 1e-3  # the step in rho of the finite differences
_CHUNK = 1024  # layers per stacked pass (x 10 states: a causal column's per-row temporaries stay within tens of MB)


def _rho(q, p):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.divide(p, q)


def _shifted(q, p, shifts):
    """(q, p) at rho + each shift (a new leading axis), q alike."""
    h = np.asarray(shifts, dtype=float).reshape((-1,) + (1,) * np.ndim(p))
    return np.broadcast_to(q, np.shape(h * q)).copy(), p + h * q


def residual_variance(op: Residual, q_in, p_in, p):
    """d times the variance of the common part's p that a residual sum (input (q_in, p_in), output p) adds of its own at
    width d (module docstring)."""
    skip = np.asarray(op.skip, dtype=float) ** 2
    if len(op.branches) == 1:  # its branch's term is the sum less the skip's
        terms = [p - skip * p_in]
    else:
        qs, ps, _ = moments_forward(op.shared, q_in, p_in)
        terms = [np.asarray(b, dtype=float) ** 2 * moments_forward(f, qs, ps)[1] for b, f in op.branches]
    terms = [np.maximum(t, 0.0) for t in terms]
    var = 2.0 * sum(t * t for t in terms) + 4.0 * skip * np.maximum(p_in, 0.0) * sum(terms)
    for i, t in enumerate(terms):
        var = var + 4.0 * t * sum(terms[i + 1:])
    return var


def gradient_factor(blocks, widths, qs, ps, gqs, gps) -> tuple[list, list, list]:
    """exp(var / 2) per index of the stream, with each block's slope a_l and the walk's variance V_l per index. var is
    the variance over sequences of the log of the gradient's q there (over the top's) that the walk moves: a deviation
    d_l of block l's input rho moves its backward matrix M_l (the 2 x 2 map of (gq, gp), linear at fixed forward
    caches) by D_l d_l (D_l = dM_l / d rho), so the gradient's deviation follows dg_i = M_i dg_(i+1) + D_i g_(i+1) d_i,
    with d_(l+1) = a_l d_l + e_l (a_l the block's slope in rho, e_l its fresh spread): the walk's variance
    V_(l+1) = a_l^2 V_l + Var e_l, V_0 = 0 (the input's own spread is not the walk's), at most (1 - rho)(1 + rho) (the
    Bhatia-Davis bound in [-1, 1]). Carried from the top with R_i = w_i + a_i M_i R_(i+1) (w_i = D_i g_(i+1): dg_i's
    response to d_i through every block above) and Cov(dg_(i+1), d_i) = a_i V_i R_(i+1). gqs, gps: the mean field's
    gradient chain (index 0..L)."""
    L = len(blocks)
    a, M, D, fresh = [None] * L, [None] * L, [None] * L, [None] * L
    groups: dict[int, list[int]] = {}  # layers that share their operations: one pass for up to _CHUNK of them
    for l, ops in enumerate(blocks):
        groups.setdefault(id(ops), []).append(l)
    for idx in (g[i:i + _CHUNK] for g in groups.values() for i in range(0, len(g), _CHUNK)):
        ops, n = blocks[idx[0]], len(idx)
        both = np.broadcast_arrays(*(np.asarray(x[l], dtype=float) for x in (qs, ps) for l in idx))  # (grids)
        q0, p0 = np.stack(both[:n]), np.stack(both[n:])
        # one pass: each layer's state, its rho -+ _H (twice: one per unit gradient of the backward), and per residual
        # sum two copies of the state that take -+ _H q on their common part at its output (p and q alike)
        sums = [k for k, op in enumerate(ops) if isinstance(op, Residual)]
        qo, po = _shifted(q0, p0, (0.0, _H, -_H) * 2 + (0.0,) * (2 * len(sums)))
        caches, var = [], []
        for k, op in enumerate(ops):
            q_in, p_in = qo[0], po[0]
            qo, po, c = op.moments(qo, po)
            caches.append(c)
            if k in sums:
                j, h = 6 + 2 * len(var), _H * qo[0]
                qo, po = qo.copy(), po.copy()
                qo[j:j + 2] += np.stack([h, -h])
                po[j:j + 2] += np.stack([h, -h])
                var.append((j, h, residual_variance(op, q_in, p_in, po[0])))
        r = _rho(qo, po)
        slope = (r[1] - r[2]) / (2.0 * _H)
        own = sum(((r[j] - r[j + 1]) / (2.0 * h)) ** 2 * v for j, h, v in var)
        one, zero, pad = np.ones_like(qo[:3]), np.zeros_like(qo[:3]), np.zeros_like(qo[6:])
        bq, bp = moments_backward(ops, np.concatenate([one, zero, pad]), np.concatenate([zero, one, pad]), caches)
        m = [[bq[:3], bq[3:6]], [bp[:3], bp[3:6]]]  # m[out][in] at the three states
        for i, l in enumerate(idx):
            a[l], fresh[l] = slope[i], own[i] / widths[l] if np.ndim(own) else own / widths[l]
            M[l] = [[x[0][i] for x in row] for row in m]
            D[l] = [[(x[1][i] - x[2][i]) / (2.0 * _H) for x in row] for row in m]
    V = [0.0]
    for l in range(L):
        r = _rho(qs[l + 1], ps[l + 1])
        V.append(np.minimum(a[l] ** 2 * V[-1] + fresh[l], (1.0 - r) * (1.0 + r)))
    S = [[0.0, 0.0], [0.0, 0.0]]  # Var(dg) at index L: the loss fixes the top gradient
    R = [0.0, 0.0]
    out = [1.0]
    for l in range(L - 1, -1, -1):
        Ml, g = M[l], (gqs[l + 1], gps[l + 1])
        w = [D[l][r][0] * g[0] + D[l][r][1] * g[1] for r in range(2)]
        MR = [Ml[r][0] * R[0] + Ml[r][1] * R[1] for r in range(2)]
        S = [[sum(Ml[r][j] * S[j][k] * Ml[t][k] for j in range(2) for k in range(2)) + V[l] * w[r] * w[t]
              + a[l] * V[l] * (MR[r] * w[t] + w[r] * MR[t]) for t in range(2)] for r in range(2)]
        R = [w[r] + a[l] * MR[r] for r in range(2)]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            v = S[0][0] / np.asarray(gqs[l], dtype=float) ** 2
        out.append(np.exp(0.5 * np.where(np.isfinite(v), v, 0.0)))
    return out[::-1], a, V
