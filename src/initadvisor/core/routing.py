"""Top-k routing of a mixture-of-experts MLP at init: the router's weights, and the statistics its moment maps need.

The router's logits l = R u (R: E x d, entries N(0, sigma_r^2)) are, for a token whose coordinates have second
moment q, i.i.d. N(0, s^2) over the E experts with s^2 = g_r q (g_r = sigma_r^2 d); two tokens' logits for one
expert correlate as the tokens do (rho = p / q). The experts' weights are independent of the router's and of each
other's, so the branch y = sum_{j in S} w_j f_j(u) (S: the token's top k) has, with f's own moments (q_f, p_f),

    q_y = A q_f,  A = E sum_j w_j^2,        p_y = B p_f,  B = E sum_j w_j(a) w_j(b),

and its input gradient gets, besides the experts' path (A, B times the MLP's backward), the router's: through the
weights' Jacobian J = dw/dl and R^T, g_r q_f g_q F with F = E sum_{j,e} J_je^2 (F_x: the two tokens' product).
A, B, F and F_x have no closed form (top-k of a softmax): a Monte-Carlo with fixed draws (common random numbers),
tabulated over the angle arccos(rho) between the tokens' logits and over log s, and interpolated.
"""

from __future__ import annotations

from functools import lru_cache

import math

import numpy as np

_ANGLES = np.linspace(0.0, np.pi, 25)  # the overlap of two tokens' top-k sets is smooth in the angle, not in rho
_DRAWS = 1 << 14  # logits drawn per angle (E per token): A, B within about 1% at any E
_SEED = 20261124


def chosen_groups(logits: np.ndarray, router: str, groups: int, top_groups: int) -> np.ndarray:
    """DeepSeek-V3's group-limited routing: the experts in consecutive groups of E / groups, each group scored by the
    sum of its two best router probabilities (sigmoid, or softmax over all experts), the top_groups best kept; a
    mask (..., E) of the experts the top k is taken from."""
    E = logits.shape[-1]
    if router == "softmax":
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        prob = e / e.sum(axis=-1, keepdims=True)
    else:
        with np.errstate(over="ignore"):
            prob = 1.0 / (1.0 + np.exp(-logits))
    g = prob.reshape(*prob.shape[:-1], groups, E // groups)
    score = -np.partition(-g, 1, axis=-1)[..., :2].sum(axis=-1)
    best = np.argpartition(-score, top_groups - 1, axis=-1)[..., :top_groups]
    keep = np.zeros(score.shape, dtype=bool)
    np.put_along_axis(keep, best, True, axis=-1)
    return np.repeat(keep, E // groups, axis=-1)


def weights(logits: np.ndarray, k: int, router: str, normalize: bool, scale: float, groups: int = 1,
            top_groups: int = 1):
    """(w, a, b, c) for logits (..., E): the routing weights (zero off each token's top k) and the factors of their
    Jacobian dw_j/dl_e = a_j [j = e] - b_j c_e. softmax: w = softmax(l) on the top k (renormalised there when
    `normalize`, Mixtral; else the full softmax's values, Qwen3-MoE's default); sigmoid (DeepSeek-V3): sigmoid(l) on
    the top k, divided by their sum when `normalize`. Both times `scale`. The top k of the probabilities are the top
    k of the logits (monotone maps); with groups > 1, within the chosen groups (chosen_groups)."""
    if groups > 1:
        pick = np.where(chosen_groups(logits, router, groups, top_groups), logits, -np.inf)
        top = np.argpartition(-pick, k - 1, axis=-1)[..., :k]
    else:
        top = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
    m = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(m, top, True, axis=-1)
    if router == "softmax":
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        if normalize:
            e = np.where(m, e, 0.0)
            w = e / e.sum(axis=-1, keepdims=True)
            a, b, c = w, w, w
        else:
            pi = e / e.sum(axis=-1, keepdims=True)
            w = np.where(m, pi, 0.0)
            a, b, c = w, w, pi
    else:
        with np.errstate(over="ignore"):
            sg = 1.0 / (1.0 + np.exp(-logits))
        ds = np.where(m, sg * (1.0 - sg), 0.0)
        sg = np.where(m, sg, 0.0)
        if normalize:
            tot = sg.sum(axis=-1, keepdims=True)
            w, a, b, c = sg / tot, ds / tot, sg / tot, ds / tot
        else:
            w, a, b, c = sg, ds, np.zeros_like(sg), np.zeros_like(sg)
    return scale * w, scale * a, scale * b, c


def logit_gradient(dw: np.ndarray, a, b, c) -> np.ndarray:
    """dL/dl from dL/dw through the Jacobian diag(a) - b c^T (each token's last axis)."""
    return a * dw - c * (b * dw).sum(axis=-1, keepdims=True)


@lru_cache(maxsize=256)
def _table(E: int, k: int, router: str, normalize: bool, scale: float, s: float, groups: int = 1,
           top_groups: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(B, F_x) at each of _ANGLES; angle 0 gives A and F."""
    n = max(_DRAWS // E, 32)
    rng = np.random.default_rng(_SEED)
    z1, z2 = rng.standard_normal((2, n, E))
    wa, aa, ba, ca = weights(s * z1, k, router, normalize, scale, groups, top_groups)
    B, F = np.empty(_ANGLES.size), np.empty(_ANGLES.size)
    for i, t in enumerate(_ANGLES):
        wb, ab, bb, cb = weights(s * (np.cos(t) * z1 + np.sin(t) * z2), k, router, normalize, scale, groups,
                                 top_groups)
        B[i] = (wa * wb).sum(axis=-1).mean()
        F[i] = ((aa * ab).sum(-1) - (aa * bb * cb).sum(-1) - (ba * ca * ab).sum(-1)
                + (ba * bb).sum(-1) * (ca * cb).sum(-1)).mean()
    return B, F


_STEPS = 8  # tables at s = 10^(i / _STEPS), interpolated linearly in log s between the two around each s
_LOG_S = (-3.0, 3.0)  # s clipped to [1e-3, 1e3]: uniform weights (to 0.1%) below, one-hot above


_CHUNK = 1 << 16  # statistics evaluates at most this many points at once


def statistics(E: int, k: int, router: str, normalize: bool, scale: float, s2, rho, groups: int = 1,
               top_groups: int = 1):
    """(A, B, F, F_x) at logit variance s2 = g_r q and token correlation rho (arrays broadcast)."""
    if np.ndim(s2) == 0 and np.ndim(rho) == 0:  # one point (a stack's scalar pass asks once a layer): floats
        return _statistics_at(E, k, router, normalize, scale, float(s2), float(rho), groups, top_groups)
    s2, rho = np.broadcast_arrays(np.asarray(s2, dtype=float), np.asarray(rho, dtype=float))
    shape = s2.shape
    if s2.size > _CHUNK:  # a long causal sequence's positions: bounded temporaries
        n = s2.size // _CHUNK + 1
        parts = [statistics(E, k, router, normalize, scale, a, b, groups, top_groups)
                 for a, b in zip(np.array_split(s2.ravel(), n), np.array_split(rho.ravel(), n))]
        return tuple(np.concatenate([p[i] for p in parts]).reshape(shape) for i in range(4))
    with np.errstate(divide="ignore"):
        x = _STEPS * np.clip(0.5 * np.log10(np.nan_to_num(s2.ravel(), nan=1.0)), *_LOG_S)
    lo = np.floor(x)
    frac = x - lo
    t = np.arccos(np.clip(np.nan_to_num(rho.ravel(), nan=0.0), -1.0, 1.0))
    out = np.zeros((4, x.size))
    for i in np.unique(np.concatenate([lo, lo + 1])):
        B, F = _table(E, k, router, normalize, float(scale), float(10 ** (i / _STEPS)), groups, top_groups)
        w = np.where(lo == i, 1.0 - frac, 0.0) + np.where(lo + 1 == i, frac, 0.0)
        out += w * np.array([np.full(x.size, B[0]), np.interp(t, _ANGLES, B), np.full(x.size, F[0]),
                             np.interp(t, _ANGLES, F)])
    return tuple(v.reshape(shape)[()] for v in out)


def _statistics_at(E, k, router, normalize, scale, s2: float, rho: float, groups, top_groups) -> tuple:
    """statistics at one point, as its array path computes it."""
    s2 = 1.0 if math.isnan(s2) else s2
    x = _STEPS * min(max(0.5 * math.log10(s2) if s2 > 0 else -math.inf, _LOG_S[0]), _LOG_S[1])
    lo = math.floor(x)
    t = math.acos(min(max(0.0 if math.isnan(rho) else rho, -1.0), 1.0))
    out = np.zeros(4)
    for i, w in ((lo, 1.0 - (x - lo)), (lo + 1, x - lo)):
        B, F = _table(E, k, router, normalize, float(scale), float(10 ** (i / _STEPS)), groups, top_groups)
        out += w * np.array([B[0], np.interp(t, _ANGLES, B), F[0], np.interp(t, _ANGLES, F)])
    return tuple(out)
