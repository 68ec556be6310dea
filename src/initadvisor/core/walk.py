"""The rho walk: at finite width a sequence's own rho wanders from the mean field's, and its gradient with it.

The fresh weights of each residual branch act on the sequence's common direction m (its tokens' mean): the branch's
last weight matrix W gives |W u|^2 a chi-square spread (2 / d relative) and the sum s x + b f a cross term
2 s b m.f / d of mean zero. In a term t = (weight^2) p per summand (the skip s^2 p_x, each branch b^2 p_f) the
sequence's common part p moves by a variance (2 sum_branches t^2 + 4 sum_pairs t t') / d, p and q alike; the block's
operations after the sum carry that to its output (a copy of the state moved there). Each block carries its input's
deviation on by its slope in rho. A block's log gradient gain moves with its input's rho, so the mean of the gradient
over sequences is the mean field's times exp(var / 2) of the sum of those moves (a log-normal; past beta_c in post-LN,
where the gains fall steeply with rho, the mean field alone is 0.75-0.95 of the measured mean at d 720:
benchmarks/gradient_tails.py). The block maps are not linear in rho either, so the walk also moves the mean of rho
and of the attention's IPR over sequences, by the maps' curvature times the walk's variance (mean_shift): in post-LN
0.003-0.005 in rho past the crossover at d 720, where the network's rho sits 0.01-0.013 below the mean field's. A
norm after a residual sum adds each pair's own bias of its cosine at width d (cosine_bias: the delta method on the
sum's Wishart covariances, less the common part that the walk's moves carry; about 0.001 in rho at d 720). The
position-resolved engine (causal rows) carries the walk in post-LN stacks only (causal_factor, below): the gradient's
factor, and with the causal rows' field law (ops.FIELD_LAW) the mean shift of rho and of the rows' IPR too.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from initadvisor.core import causal as cz
from initadvisor.core.ops import Attention, Norm, Residual, causal_backward, causal_forward, find, moments_backward, \
    moments_forward

_H = 1e-3  # the step in rho of the finite differences
_CHUNK = 1024  # layers per stacked pass (x 10 states: a causal column's per-row temporaries stay within tens of MB)


def _rho(q, p):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.divide(p, q)


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


def cosine_bias(qs, ps, q, p, T: int = 0) -> tuple:
    """d times the mean bias at width d, to first order in 1 / d (the delta method), of the cosine that a norm gives
    two tokens after a residual sum (T = 0) or of a ratio of means over T tokens (T > 0), and its common part: the
    sum's (q, p) over its skip's (qs, ps), fresh Gaussian last weights giving the Gram entries the covariances
    W(sum) - W(skip), W(M)_ab,cd = M_ac M_bd + M_ad M_bc; the common part is two tokens' norms' covariance, shared by
    every entry (the sequence's common direction, which the walk's moves carry: residual_variance is that
    covariance)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        c = p / q
        v_aa, v_ab, c_ha = 2.0 * (q * q - qs * qs), 2.0 * (p * p - ps * ps), 2.0 * (q * p - qs * ps)
        own = 0.75 * c * v_aa + 0.25 * c * v_ab - c_ha if not T else \
            (c * (v_aa + (T - 1.0) * v_ab) - 2.0 * c_ha - (T - 2.0) * v_ab) / T
        return own / (q * q), -(1.0 - c) * v_ab / (q * q)


def _chunks(blocks):
    """Layers that share their operations, up to _CHUNK at a time: one stacked pass each."""
    groups: dict[int, list[int]] = {}
    for l, ops in enumerate(blocks):
        groups.setdefault(id(ops), []).append(l)
    return [g[i:i + _CHUNK] for g in groups.values() for i in range(0, len(g), _CHUNK)]


def _stacked(idx, *xs):
    """Each per-index x at the layers idx, stacked on a new leading axis (broadcast to one shape)."""
    both = np.broadcast_arrays(*(np.asarray(x[l], dtype=float) for x in xs for l in idx))
    n = len(idx)
    return [np.stack(both[k * n:(k + 1) * n]) for k in range(len(xs))]


def _run(ops, q0, p0, shifts, move, width=None):
    """One stacked pass of a block: its input (q0, p0) at rho + each of `shifts` (states on a new leading axis,
    each a scalar or per layer), then per residual sum two copies of the unshifted state whose common part the sum's
    output moves by + and - move(q, var) (p and q alike; var: d times the sum's own variance, residual_variance),
    and with `width` per sum that a norm follows one copy whose cosine there moves by the pair's own bias at that
    width (cosine_bias less its common part, which the moves carry).
    Returns the output rho per state, the caches and per sum (its first state, its move, var)."""
    sums = [k for k, op in enumerate(ops) if isinstance(op, Residual)]
    normed = [] if width is None else [k for k in sums if k + 1 < len(ops) and isinstance(ops[k + 1], Norm)]
    h = np.stack([np.broadcast_to(x, np.shape(p0)) for x in shifts])
    z = np.zeros((2 * len(sums) + len(normed),) + np.shape(p0))
    qo = np.concatenate([np.broadcast_to(q0, h.shape), z + q0])
    po = np.concatenate([p0 + h * q0, z + p0])
    caches, var = [], []
    for k, op in enumerate(ops):
        q_in, p_in = qo[0], po[0]
        qo, po, c = op.moments(qo, po)
        caches.append(c)
        if k in normed:
            skip = np.asarray(op.skip, dtype=float) ** 2
            own, common = cosine_bias(skip * q_in, skip * p_in, qo[0], po[0])
            j = len(shifts) + 2 * len(sums) + normed.index(k)
            po = po.copy()
            po[j] += np.nan_to_num(qo[0] * (own - common) / width)
        if k in sums:
            v = residual_variance(op, q_in, p_in, po[0])
            j, m = len(shifts) + 2 * len(var), move(qo[0], v)
            qo, po = qo.copy(), po.copy()
            qo[j:j + 2] += np.stack([m, -m])
            po[j:j + 2] += np.stack([m, -m])
            var.append((j, m, v))
    return _rho(qo, po), caches, var


def _y2(ops, caches, shape):
    """The block's attention IPR per state, broadcast to the states' shape (None without attention)."""
    c = find(ops, caches, Attention)
    return None if c is None else np.broadcast_to(np.asarray(c.y2, dtype=float), shape)


def responses(blocks, widths, qs, ps, backward: bool) -> dict:
    """Per layer: a (the block's slope in rho), fresh (the variance its residual sums add of their own at its width),
    y (the slope of its attention's IPR in rho, None without attention) and, with backward, M, D and C (gradient_factor's
    backward matrix, its slope and its curvature in rho) and per residual sum k its move's (s_k, var_k, E_k, F_k): the
    slope of the block's output rho in the move, the move's variance at the width, the backward matrix's slope and
    curvature in it (gradient_mean)."""
    L = len(blocks)
    out = {k: [None] * L for k in ("a", "fresh", "y", "M", "D", "C", "moves")}
    for idx in _chunks(blocks):
        ops = blocks[idx[0]]
        q0, p0 = _stacked(idx, qs, ps)
        # each layer's state at rho -+ _H, and per residual sum two copies of the state that take -+ _H q on their
        # common part at its output
        r, caches, var = _run(ops, q0, p0, (0.0, _H, -_H), lambda q, v: _H * q)
        slope = (r[1] - r[2]) / (2.0 * _H)
        own = sum(((r[j] - r[j + 1]) / (2.0 * m)) ** 2 * v for j, m, v in var)
        y = _y2(ops, caches, r.shape)
        if backward:  # the backward matrix mm[out, in] at every state: one pass per unit gradient (gq, gp)
            one, zero = np.ones_like(r), np.zeros_like(r)
            mm = np.array([moments_backward(ops, one, zero, caches), moments_backward(ops, zero, one, caches)])
            mm = np.swapaxes(np.broadcast_to(mm, (2, 2) + r.shape), 0, 1)
        for i, l in enumerate(idx):
            out["a"][l], out["fresh"][l] = slope[i], (own[i] if np.ndim(own) else own) / widths[l]
            if y is not None:
                out["y"][l] = (y[1][i] - y[2][i]) / (2.0 * _H)
            if backward:
                x = mm[:, :, :, i]
                out["M"][l] = x[:, :, 0]
                out["D"][l] = (x[:, :, 1] - x[:, :, 2]) / (2.0 * _H)
                out["C"][l] = (x[:, :, 1] - 2.0 * x[:, :, 0] + x[:, :, 2]) / _H ** 2
                out["moves"][l] = [((r[j][i] - r[j + 1][i]) / (2.0 * m[i]), v[i] / widths[l],
                                    (x[:, :, j] - x[:, :, j + 1]) / (2.0 * m[i]),
                                    (x[:, :, j] - 2.0 * x[:, :, 0] + x[:, :, j + 1]) / m[i] ** 2) for j, m, v in var]
    return out


def walk_variance(resp: dict, qs, ps) -> list:
    """V_l per index: the walk's variance of a sequence's rho (gradient_factor's docstring), V_0 = 0."""
    V = [0.0]
    for l, (a, e) in enumerate(zip(resp["a"], resp["fresh"])):
        r = _rho(qs[l + 1], ps[l + 1])
        V.append(np.minimum(a ** 2 * V[-1] + e, (1.0 - r) * (1.0 + r)))
    return V


_GH = np.sqrt(3.0)  # three-point Gauss-Hermite: E f(x + s z) = 2/3 f(x) + 1/6 (f(x + sqrt 3 s) + f(x - sqrt 3 s))


def _gh_shift(f0, fp, fm):
    """E f(x + s z) - f(x) by three-point Gauss-Hermite from f at x, x + sqrt 3 s and x - sqrt 3 s."""
    return (fp + fm) / 6.0 - f0 / 3.0


def mean_shift(blocks, widths, qs, ps, resp: dict, V: list) -> tuple[np.ndarray, np.ndarray]:
    """(B per index, the IPR's shift per layer; arrays over the layers): the mean over sequences of rho and of the
    attention's IPR at width d, to second order in the walk. A block's map f of its input's rho is not linear, so the
    walk moves the mean by E f(rho + d) - f(rho) (the curvature of f times V_l / 2; three-point Gauss-Hermite at the
    walk's spread, held within rho in [-1, 1]), and each residual sum's own move e by E f(e) - f(0) alike; where a
    norm follows a sum, the pair's own part of its cosine's bias (cosine_bias) moves it too, through the rest of the
    block; B_(l+1) = a_l B_l + those. The IPR at block l: its slope times B_l plus its own such term (0 without
    attention).
    Where a map leaves the range (nan or inf) no shift is taken there."""
    L = len(blocks)
    J, Jy = [None] * L, [np.nan] * L
    for idx in _chunks(blocks):
        ops = blocks[idx[0]]
        q0, p0, v0 = _stacked(idx, qs, ps, V)
        r0 = _rho(q0, p0)
        with np.errstate(invalid="ignore"):
            s = np.nan_to_num(np.minimum(_GH * np.sqrt(np.maximum(v0, 0.0)), np.minimum(1.0 - r0, 1.0 + r0)))
        d = np.asarray([widths[l] for l in idx], dtype=float).reshape((-1,) + (1,) * (np.ndim(q0) - 1))
        r, caches, var = _run(ops, q0, p0, (0.0, s, -s),
                              lambda q, v: np.minimum(_GH * np.sqrt(np.maximum(v, 0.0) / d), 0.5 * q), d)
        jensen = _gh_shift(r[0], r[1], r[2]) + sum(_gh_shift(r[0], r[j], r[j + 1]) for j, _, _ in var)
        jensen = jensen + sum(r[j] - r[0] for j in range(3 + 2 * len(var), len(r)))  # the pairs' own biases
        y = _y2(ops, caches, r.shape)
        jy = None if y is None else _gh_shift(y[0], y[1], y[2])
        for i, l in enumerate(idx):
            J[l] = jensen[i]
            if jy is not None:
                Jy[l] = jy[i]

    def layers(xs):  # per-layer values as one finite array (L, *grid)
        return np.nan_to_num(np.array(np.broadcast_arrays(*xs), dtype=float), nan=0.0, posinf=0.0, neginf=0.0)

    a, J = layers(resp["a"]), layers(J)
    if J.ndim == 1:  # the scalar pass: floats
        B = [0.0]
        for al, jl in zip(a.tolist(), J.tolist()):
            B.append(min(max(al * B[-1] + jl, -2.0), 2.0))
    else:
        B = [np.zeros(J.shape[1:])]
        for al, jl in zip(a, J):
            B.append(np.clip(al * B[-1] + jl, -2.0, 2.0))
    B = np.array(B)
    slope = layers([np.nan if x is None else x for x in resp["y"]])
    return B, np.nan_to_num(slope * B[:-1] + layers(Jy), nan=0.0)


def _mv(A, x) -> list:
    """A 2 x 2 matrix (nested, entries scalars or arrays) times a 2-vector."""
    return [A[r][0] * x[0] + A[r][1] * x[1] for r in range(2)]


def _sandwich(A, S) -> list:
    """A S A^T for 2 x 2 nested matrices."""
    return [[sum(A[r][j] * S[j][k] * A[t][k] for j in range(2) for k in range(2)) for t in range(2)] for r in range(2)]


def gradient_factor(blocks, widths, qs, ps, gqs, gps, resp: dict | None = None, V: list | None = None
                    ) -> tuple[list, list, list]:
    """exp(var / 2) per index of the stream, with each block's slope a_l and the walk's variance V_l per index. var is
    the variance over sequences of the log of the gradient's q there (over the top's) that the walk moves: a deviation
    d_l of block l's input rho moves its backward matrix M_l (the 2 x 2 map of (gq, gp), linear at fixed forward
    caches) by D_l d_l (D_l = dM_l / d rho), so the gradient's deviation follows dg_i = M_i dg_(i+1) + D_i g_(i+1) d_i,
    with d_(l+1) = a_l d_l + e_l (a_l the block's slope in rho, e_l its fresh spread): the walk's variance
    V_(l+1) = a_l^2 V_l + Var e_l, V_0 = 0 (the input's own spread is not the walk's), at most (1 - rho)(1 + rho) (the
    Bhatia-Davis bound in [-1, 1]). Carried from the top with R_i = w_i + a_i M_i R_(i+1) (w_i = D_i g_(i+1): dg_i's
    response to d_i through every block above) and Cov(dg_(i+1), d_i) = a_i V_i R_(i+1). gqs, gps: the mean field's
    gradient chain (index 0..L); resp: responses' with backward, and V walk_variance's, if made."""
    L = len(blocks)
    resp = responses(blocks, widths, qs, ps, True) if resp is None else resp
    a, M, D = resp["a"], resp["M"], resp["D"]
    V = walk_variance(resp, qs, ps) if V is None else V
    S = [[0.0, 0.0], [0.0, 0.0]]  # Var(dg) at index L: the loss fixes the top gradient
    R = [0.0, 0.0]
    out = [1.0]
    for l in range(L - 1, -1, -1):
        Ml, g = M[l], (gqs[l + 1], gps[l + 1])
        w, MR = _mv(D[l], g), _mv(Ml, R)
        S = [[x + V[l] * w[r] * w[t] + a[l] * V[l] * (MR[r] * w[t] + w[r] * MR[t]) for t, x in enumerate(row)]
             for r, row in enumerate(_sandwich(Ml, S))]
        R = [w[r] + a[l] * MR[r] for r in range(2)]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            v = S[0][0] / np.asarray(gqs[l], dtype=float) ** 2
        out.append(np.exp(0.5 * np.where(np.isfinite(v), v, 0.0)))
    return out[::-1], a, V


def gradient_mean(gqs, gps, resp: dict, V: list, B) -> list:
    """The factor per index of the stream by which the walk moves the mean gradient over sequences beyond
    gradient_factor's log-normal of its rho, to first order in the walk's mean shift B and variance V (mean_shift,
    walk_variance) and each residual sum's move m_k (variance var_k, which moves q and p alike: through a norm's
    backward, the gradient too). A block's backward matrix is M + D d + C d^2 / 2 + sum_k (E_k m_k + F_k m_k^2 / 2) at
    rho + d, so over the walk its mean adds (D B_l + C V_l / 2 + sum_k F_k var_k / 2) g_(l+1), which the blocks below
    carry on (e_l = M_l e_(l+1) + that); a move also moves the blocks above through rho (slope s_k), so the gradient's
    log-normal gains the covariance of E_k m_k g_(l+1) with them (Sm: s_k var_k (M R u^T + u (M R)^T), u = E_k g_(l+1),
    R gradient_factor's response); and where the log-normal counts a block's own first-order spread in rho (S0: V w
    w^T, carried alike) the second order is C V / 2 instead. The factor is exp(e_q / g_q + (Sm - S0)_qq / (2 g_q^2)).
    gqs, gps: the mean field's gradient chain (index 0..L); resp: responses' with backward."""
    M, D, C, a = resp["M"], resp["D"], resp["C"], resp["a"]
    e, R = [0.0, 0.0], [0.0, 0.0]
    S0, Sm = [[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]
    out = [1.0]
    for l in range(len(M) - 1, -1, -1):
        Ml, g = M[l], (gqs[l + 1], gps[l + 1])
        w, c, MR = _mv(D[l], g), _mv(C[l], g), _mv(Ml, R)
        e = [x + w[r] * B[l] + 0.5 * c[r] * V[l] for r, x in enumerate(_mv(Ml, e))]
        S0 = [[x + V[l] * w[r] * w[t] for t, x in enumerate(row)] for r, row in enumerate(_sandwich(Ml, S0))]
        Sm = _sandwich(Ml, Sm)
        for s, var, E, F in resp["moves"][l]:
            u, f = _mv(E, g), _mv(F, g)
            e = [x + 0.5 * f[r] * var for r, x in enumerate(e)]
            Sm = [[x + s * var * (MR[r] * u[t] + u[r] * MR[t]) for t, x in enumerate(row)] for r, row in enumerate(Sm)]
        R = [w[r] + a[l] * MR[r] for r in range(2)]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            g0 = np.asarray(gqs[l], dtype=float)
            x = e[0] / g0 + 0.5 * (Sm[0][0] - S0[0][0]) / (g0 * g0)
            out.append(np.exp(np.where(np.isfinite(x), x, 0.0)))
    return out[::-1]


# ------------------------------------------------------------------------------------------------
# The walk on the position-resolved state (causal.py). The same moves and the same first order, but the gradient is a
# state (q per position, p per group pair), not a pair: a block's backward is applied to tangent states, and the
# covariance of the gradient's deviations is carried as a few principal columns rather than a 2 x 2 matrix.

_CH = 1e-2  # the causal walk's step in rho and in the moves, about the walk's own spread in rho (0.01-0.04 at d 1000):
# the rows' laws switch tables at gates (the keys' field law, its draws), and a smaller step that straddles one moves
# the factor by points (3e-3: 2.6% at a 16-layer stack's top, against 0.3% for 1e-3 and 1e-2)
_RANK = 4  # the principal columns kept of each covariance the causal walk carries down


def resolves_walk(blocks) -> bool:
    """The causal walk's reach: stacks where a norm follows a residual sum (post-LN), where each block's gain falls
    with its input's rho and a move reaches the gradient through the norm's backward. Elsewhere it moves the gradient
    by at most 0.5% on issue 13's grid (pre-LN, 0.25-2.5 beta_c, T 64 and 512), for about 7x the run
    (model.WALK_COST)."""
    return any(isinstance(a, Residual) and isinstance(b, Norm) for ops in blocks for a, b in zip(ops, ops[1:]))


def _tangent(*terms):
    """sum c X over (c, X) pairs of states (q per position and the pair means; tangents: signed, not clamped)."""
    return cz.State(sum(c * X.qf for c, X in terms), sum(c * X.P for c, X in terms))


def _moved(G, S, x: float, shift: bool):
    """S with its common part moved by x: every overlap by x sqrt(q q') (shift: a step of rho) or by x, q too (a
    residual sum's move)."""
    if shift:
        qg = cz.gmean(G, S.qf)
        dx = x * np.sqrt(np.multiply.outer(qg, qg))
        return replace(S, P=S.P + dx, R=None if S.R is None else S.R + dx)
    return replace(S, qf=S.qf + x, P=S.P + x, R=None if S.R is None else S.R + x)


def _block_runs(ops, G, S, d: float, own_bias: bool) -> tuple[list, list, list]:
    """The block's forward from S (each output clamped as the engine's): as it is, with its input's rho + and -
    _CH, then per residual sum with its output moved by + and - _CH (the operations before the sum run once):
    [(output, caches)] in that order; per sum its own variance at the width d (residual_variance at the mean q
    and the mean pair, over d); and (own_bias) per sum that a norm follows, the output with every pair's cosine
    there moved by its own bias at the width d (cosine_bias less its common part, at the mean q and pair, as
    mean_shift's). The engine's own forward ran the mean already, but keeps no state inside a block."""

    def run(part, X):
        X, c = causal_forward(part, G, X)
        return cz._clamp(G, X), c

    runs = [None] + [run(ops, _moved(G, S, x, True)) for x in (_CH, -_CH)]
    X, caches, var, own = S, [], [], []
    for k, op in enumerate(ops):
        Y, c = causal_forward((op,), G, X)
        caches = caches + c
        if isinstance(op, Residual):
            qin, (pin, pout) = float(np.mean(X.qf)), (cz.pair_mean(G, Z.P) for Z in (X, Y))
            var.append(float(residual_variance(op, qin, pin, pout)) / d)
            for x in (_CH, -_CH):
                Z, rest = run(ops[k + 1:], _moved(G, Y, x, False))
                runs.append((Z, caches + rest))
            if own_bias and k + 1 < len(ops) and isinstance(ops[k + 1], Norm):
                skip = float(np.mean(np.asarray(op.skip, dtype=float) ** 2))
                b, common = cosine_bias(skip * qin, skip * pin, float(np.mean(Y.qf)), pout)
                own.append(run(ops[k + 1:], _moved(G, Y, float(np.nan_to_num(b - common)) / d, True))[0])
        X = Y
    runs[0] = (cz._clamp(G, X), caches)
    return runs, var, own


def causal_factor(blocks, G, states, grads, widths, means: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The walk's factor per index of the stream on the mean gradient over sequences (q and p alike), gradient_factor
    and gradient_mean's on the position-resolved state: states, the forward state entering each block; grads, the
    mean-field gradient state at each index (index L: the loss's). Also the walk's shift B of the mean rho over
    sequences per index and, with `means` (what the engine's field law reports, ops.FIELD_LAW), of each row's IPR per
    block (L, T; else zeros): then each block runs over the walk's law of its input's rho, N(B, V), by three-point
    Gauss-Hermite (as mean_shift's; wider than the rows' law's steps in the state, where its field draws may jump), and
    B carries the pairs' own cosine bias (mean_shift's); else B is carried by the block's slope and its curvature at the
    step _CH (the i.i.d. rows, whose low rho offsets the width's pull: docs/phase-grid.md).

    Per block, from its input: its slope a_l and curvature in its input's rho, and per residual sum k the slope s_k
    and curvature of the block's output rho in its move and the move's variance var_k, which give the walk's variance
    V_l and mean shift B_l per index (walk_variance; mean_shift to second order); and the derivatives of its backward,
    at the mean-field gradient state, in rho (w, c) and in each move (u_k, f_k), as tangent states. Then from the top:
    R_l = w_l + a_l M_l R_(l+1), the gradient's response to its input's rho through every block above; the mean
    e_l = M_l e_(l+1) + B_l w_l + V_l c_l / 2 + sum_k var_k f_k / 2; and the variance of the first order, (mean R_l)^2
    V_l from the walk below, and from each move above var_k ((mean Phi (s_k M R + u_k))^2 - (mean Phi u_k)^2) less
    V (mean Phi w)^2 (the own-block parts, which e's curvatures replace: gradient_mean's), Phi the backward of the
    blocks between. Those sums are two covariances of columns pushed down block by block (their _RANK principal
    ones kept). The factor is exp(e / g + var / (2 g^2)), means over positions, g the mean-field gradient's q.
    Each block's mean-field caches are kept from the first pass to the second where all of them fit in
    causal._KEEP_CELLS, else run again."""
    L, h = len(blocks), _CH
    per, a, V, B, dy = [], [], [0.0], [0.0], np.zeros((L, G.T))
    with np.errstate(all="ignore"):
        for l, ops in enumerate(blocks):
            runs, var, own = _block_runs(ops, G, states[l], widths[l], means)
            r = [cz._summary(G, Z)[0] for Z, _ in runs]
            own = sum(cz._summary(G, Z)[0] - r[0] for Z in own)  # the pairs' own biases, through the block
            slope = [(r[j] - r[j + 1]) / (2.0 * h) for j in range(1, len(r), 2)]  # rho's, then each move's
            bend = [(r[j] - 2.0 * r[0] + r[j + 1]) / h**2 for j in range(1, len(r), 2)]
            a.append(slope[0])
            V.append(min(a[l] ** 2 * V[l] + sum(s * s * x for s, x in zip(slope[1:], var)), (1.0 - r[0]) * (1.0 + r[0])))
            moves = 0.5 * sum(c * x for c, x in zip(bend[1:], var))  # each move's curvature
            if means:  # the block over the walk's law, N(B, V), by three-point Gauss-Hermite: rho and the rows' IPR
                walked = [causal_forward(ops, G, cz._clamp(G, _moved(G, states[l], x, True))) for x in
                          (B[l], B[l] + _GH * _root(V[l]), B[l] - _GH * _root(V[l]))]
                rw = [cz._summary(G, cz._clamp(G, Z))[0] for Z, _ in walked]
                B.append(float(np.clip(rw[0] - r[0] + _gh_shift(*rw) + moves + own, -2.0, 2.0)))
                y = [find(ops, c, Attention) for c in [runs[0][1]] + [c for _, c in walked]]
                if y[0] is not None:
                    dy[l] = y[1].y2 - y[0].y2 + _gh_shift(y[1].y2, y[2].y2, y[3].y2)
            else:
                B.append(float(np.clip(a[l] * B[l] + 0.5 * bend[0] * V[l] + moves, -2.0, 2.0)))
            Bs = [causal_backward(ops, G, grads[l + 1], c) for _, c in runs]  # the mean-field one first (M's caches)
            if l == 0:
                keep = L * cz._cells(runs[0][1]) <= cz._KEEP_CELLS
            first = [_tangent((0.5 / h, Bs[j]), (-0.5 / h, Bs[j + 1])) for j in range(1, len(Bs), 2)]
            second = [_tangent((1.0 / h**2, Bs[j]), (-2.0 / h**2, Bs[0]), (1.0 / h**2, Bs[j + 1]))
                      for j in range(1, len(Bs), 2)]
            per.append((slope[1:], var, first, second, runs[0][1] if keep else None))
        R = e = cz.State(np.zeros(G.T), np.zeros_like(grads[-1].P))
        plus, minus, out = [], [], [1.0]
        for l in range(L - 1, -1, -1):
            ops, (slopes, var, (w, *us), second, caches) = blocks[l], per[l]
            per[l] = None
            if caches is None:  # (not kept: run again)
                caches = _mean_caches(ops, G, states[l], grads[l + 1])

            def M(X):  # the block's backward at its mean-field forward: linear in the state
                return causal_backward(ops, G, X, caches)

            MR = M(R)
            e = _tangent((1.0, M(e)), (B[l], w), *((0.5 * x, c) for x, c in zip([V[l]] + var, second)))
            plus = _compress([M(X) for X in plus] + [_tangent((_root(x) * s, MR), (_root(x), u))
                                                      for s, x, u in zip(slopes, var, us)])
            minus = _compress([M(X) for X in minus] + [_tangent((_root(x), u)) for x, u in zip(var, us)]
                              + [_tangent((_root(V[l]), w))])
            R = _tangent((1.0, w), (a[l], MR))
            g = np.mean(grads[l].qf)  # (numpy scalars: a gradient of 0 or an overflow gives inf or nan, not an error)
            spread = np.mean(R.qf) ** 2 * V[l] + sum(np.mean(X.qf) ** 2 for X in plus) \
                - sum(np.mean(X.qf) ** 2 for X in minus)
            x = float(np.mean(e.qf) / g + 0.5 * spread / (g * g))
            out.append(math.exp(x) if abs(x) < 700.0 else 1.0)  # (nan, inf: 1)
    return np.array(out[::-1]), np.nan_to_num(np.array(B), nan=0.0), np.nan_to_num(dy, nan=0.0, posinf=0.0, neginf=0.0)


def _mean_caches(ops, G, S, grad) -> list:
    """The block's forward caches from its input state, as the engine's run made them: their first backward is the
    mean-field gradient's `grad` (it sets what the rows keep for every later one: ops.Attention.causal_backward)."""
    caches = causal_forward(ops, G, S)[1]
    causal_backward(ops, G, grad, caches)
    return caches


def _root(x: float) -> float:
    """The square root of a variance, 0 where it is not positive (or nan)."""
    return math.sqrt(x) if x > 0.0 else 0.0


def _compress(cols: list) -> list:
    """Columns X_j of a covariance sum_j X_j X_j^T, as at most _RANK columns of its principal part: Y V_r, V_r the
    leading eigenvectors of the columns' Gram matrix Y^T Y (of Y over its largest entry: no overflow)."""
    if len(cols) <= _RANK:
        return cols
    T = cols[0].qf.size
    Y = np.nan_to_num(np.array([np.concatenate([X.qf, X.P.ravel()]) for X in cols]).T, nan=0.0, posinf=0.0,
                      neginf=0.0)
    top = float(np.abs(Y).max())
    if top > 0.0:
        Z = Y / top
        Y = Y @ np.linalg.eigh(Z.T @ Z)[1][:, -_RANK:]
    return [cz.State(y[:T], y[T:].reshape(cols[0].P.shape)) for y in Y.T[-_RANK:]]
