"""Query/key gradient laws and the depth-growth laws of the forward and backward moments.

Result 2 of Giorlandino & Goldt (001 eq. 13, B.4) is evaluated with the exact trace of the softmax
Jacobian M = diag(A) - A A^T: since M 1 = 0, tr(M Q M Q) = (q - p)^2 tr(M^2) and
E tr(M^2) = Y2 - 2 Y3 + E[Y2^2]. The printed eq. 13 carries p Y2^2 in place of (q - p) E[Y2^2]
(term (4) of B.4 keeps a p that M 1 = 0 removes); in the localized phase E[Y2^2] = (1 - m)(3 - 2m)/3
(Poisson-Dirichlet(m)), so the bracket is m (1 - m) / 3 >= 0, where the printed form can go negative.
"""

from __future__ import annotations

import numpy as np

from initadvisor.core.attention import HUGE  # the engine's cap: overflowing products stop there, never inf


def _product(*factors):
    """Product with the possibly-zero factors first (so 0 x overflow is never inf x 0), capped at HUGE."""
    with np.errstate(over="ignore"):
        out = np.float64(1.0)
        for f in factors:
            out = out * f
    return np.minimum(out, HUGE)


def jacobian_trace(y2, y3, y22):
    """E tr(M^2) per attention row, M = diag(A) - A A^T the softmax Jacobian: E[Y2] - 2 E[Y3] + E[Y2^2]."""
    return np.maximum(y2 - 2.0 * y3 + y22, 0.0)


def jacobian_form(m, y2, y3, y22, y4, sums):
    """E tr(M K M C) per row of m keys, M = diag(A) - A A^T, for weights exchangeable over the keys (E[Y2], E[Y3],
    E[Y2^2], E[Y4]) and two symmetric key matrices (the keys' overlaps K as the scores see them, the values' C): the
    query half of the query/key path (001 B.4's tr(M Q M Q) with K != C). Exact for any K and C: a monomial's
    expectation depends only on how its indices coincide (E A_i^2 A_j A_k = (Y2 - 2 Y3 - Y2^2 + 2 Y4) / (m (m - 1)
    (m - 2)), ...), and each coincidence pattern's sum of K_ij C_kl is one of the eight sums (by Moebius inversion
    over the patterns). sums: per row, sum of K_ss, of C_ss, of K_ss C_ss, of K, of C, of K o C, of
    C_ss rK_s + K_ss rC_s and of rK_s rC_s (rK, rC the row sums)."""
    dK, dC, dKC, R, Ct, KC, Sdr, T3 = sums
    m = np.asarray(m, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        m2, m3, m4 = m * (m - 1.0), m * (m - 1.0) * (m - 2.0), m * (m - 1.0) * (m - 2.0) * (m - 3.0)
        # E of a monomial by its indices' pattern: a^2 b, a b c; a^3 b, a^2 b^2, a^2 b c, a b c d
        e21, e111 = (y2 - y3) / m2, np.where(m > 2, (1.0 - 3.0 * y2 + 2.0 * y3) / m3, 0.0)
        e31, e22 = (y3 - y4) / m2, (y22 - y4) / m2
        e211 = np.where(m > 2, (y2 - 2.0 * y3 - y22 + 2.0 * y4) / m3, 0.0)
        e1111 = np.where(m > 3, (1.0 - 6.0 * y2 + 3.0 * y22 + 8.0 * y3 - 6.0 * y4) / m4, 0.0)
        t1 = y2 / m * dKC + (1.0 - y2) / m2 * (KC - dKC)  # sum A_i A_j K_ij C_ij
        # sum A_i A_j A_k K_ij C_ik
        t2 = e111 * T3 + (e21 - e111) * (Sdr + KC) + (y3 / m - 3.0 * e21 + 2.0 * e111) * dKC
        t4 = (e1111 * R * Ct + (e211 - e1111) * (dK * Ct + R * dC + 4.0 * T3)  # (A^T K A)(A^T C A)
              + (e22 - 2.0 * e211 + e1111) * (dK * dC + 2.0 * KC) + 2.0 * (e31 - 3.0 * e211 + 2.0 * e1111) * Sdr
              + (y4 / m - 4.0 * e31 - 3.0 * e22 + 12.0 * e211 - 6.0 * e1111) * dKC)
        out = t1 - 2.0 * t2 + t4
    return np.where((m > 1) & np.isfinite(out), np.maximum(out, 0.0), 0.0)


def qk_grad(beta, sigma_v2, q, p, y2, y3, y22):
    """Scaled query-gradient norm T/(d^2 sqrt(ln T)) E||dL/dW_Q||^2 up to C (001 eq. 13, corrected trace)."""
    return _product(jacobian_trace(y2, y3, y22), q - p, q - p, beta, sigma_v2, q)


def qk_to_v_grad_ratio(tau2, sigma_x2, rho, n, d):
    """E||dS/dW_Q||^2 / E||dS/dW_V||^2 under uniform attention (Noci eqs. 18 / 17, with eq. 46's tau)."""
    return _product((1 - rho) ** 2, tau2, sigma_x2, sigma_x2, (n - 1) * (n + d) / (d * n * (1 + rho * (n - 1))))


def balancing_tau(sigma_x2, rho, n, d):
    """Softmax inverse temperature that equalises Q/K and V gradient norms (Noci eq. 47); nan where a layer overflowed
    (inf x 0)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return np.minimum(np.sqrt(d * n * (1 + rho * (n - 1)) / (sigma_x2**2 * (1 - rho) ** 2 * (n + d) * (n - 1))),
                          HUGE)


# ---------------------------------------------------------------------------------------------
# Depth-growth laws (Kedia et al. 004 App. E.1, E.2; digest 3.2-3.4)


def _fit(x, y):
    """Least-squares line y = a + b x and its R^2 (y rescaled first, so huge moments cannot overflow)."""
    scale = float(np.max(np.abs(y))) or 1.0
    b, a = np.polyfit(x, y / scale, 1)
    resid = y / scale - (a + b * x)
    ss = float(np.sum((y / scale - np.mean(y / scale)) ** 2))
    return float(a * scale), float(b * scale), 1.0 - float(np.sum(resid**2)) / ss if ss > 0 else 1.0


def forward_growth(q: np.ndarray) -> dict:
    """Forward variance against depth over blocks 1..L: Pre-LN grows linearly, q_l ~ q_0 + C3 l (004 E.1.1)."""
    ends = {"end_to_end": float(q[-1] / q[0]), "blocks": float(q[-1] / q[1])}
    if len(q) < 4:
        return {"law": "too-shallow", **ends}
    a, b, r2 = _fit(np.arange(1, len(q), dtype=float), q[1:])
    law = "constant" if abs(ends["blocks"] - 1) < 0.05 else ("linear" if r2 > 0.98 else "nonlinear")
    return {"law": law, "per_layer": b, "intercept": a, "fit_r2": r2, **ends}


def gradient_growth(grad_q: np.ndarray, q: np.ndarray, norm: str) -> dict:
    """Gradient second moment from the top (index L) to the input: `blocks` (index 1, the gate's measure)
    and `end_to_end` (index 0, which adds the embedding stage: a first norm divides by the embedding q).

    Pre-LN (and norms inside the branches): hyperbolic, grad_l ~ (q_L / q_l)^C (004 E.1.2: (N/n)^C_g); post-LN
    and no norm: exponential with a per-layer factor C5, grad_l ~ C5^(L - l) (004 E.2, eq. 3). The fit is over
    layers 1..L.
    """
    L = len(grad_q) - 1
    ends = {"end_to_end": float(grad_q[0] / grad_q[-1]), "blocks": float(grad_q[1] / grad_q[-1])}
    if L < 3:
        return {"law": "too-shallow", **ends}
    g = np.log(np.maximum(grad_q[1:], 1e-300))
    if norm in ("pre", "sandwich", "reordered") and q[-1] > 1.05 * q[1]:  # the stream grows by the branches
        a, c, r2 = _fit(np.log(q[-1] / q[1:]), g)
        return {"law": "hyperbolic", "exponent": c, "fit_r2": r2, **ends}
    a, s, r2 = _fit(np.arange(1, L + 1, dtype=float), g)
    return {"law": "exponential", "per_layer_factor": float(np.exp(-s)), "fit_r2": r2, **ends}
