"""Component maps of per-coordinate second moments, forward (q, p) and backward (gq, gp).

q = E[x_i^2] for one token, p = E[x_i y_i] for two distinct tokens (THEORY.md "One state for all").
Every function broadcasts over numpy arrays, so a whole grid of hyper-parameters runs at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from initadvisor.core import attention as att
from initadvisor.core import kernels


def linear(q, p, gain, bias2=0.0):
    """Zero-mean weights with gain = std^2 x fan-in, bias variance bias2 (THEORY.md; 001 sec. 4)."""
    return gain * q + bias2, gain * p + bias2


def norm(q, p):
    """LayerNorm / RMSNorm at init: q <- 1, p <- p / q (001 sec. 4 'LayerNorm'; 004 A.6)."""
    return np.ones_like(np.asarray(q, dtype=float)), p / q


def norm_backward(gq, gp, q_in):
    """Backward divides by the input's q (004 A.6, Xu et al. eq. 17 at large d)."""
    return gq / q_in, gp / q_in


def dropout(q, p, rate):
    """Training-mode dropout with 1/(1 - rate) scaling: q grows, p unchanged (004 A.3)."""
    return q / (1.0 - rate), p


def residual(qx, px, qf, pf, skip, block):
    """out = skip * x + block * f(x); cross terms vanish at init (001 eq. 15, B.5.1)."""
    return skip**2 * qx + block**2 * qf, skip**2 * px + block**2 * pf


@dataclass(frozen=True)
class BlockParams:
    """One block's parameters; any field may be a numpy array (a grid of configurations)."""

    beta: object  # Giorlandino-Goldt beta: score std for unit inputs / sqrt(ln T)
    seq_len: float  # T (np.inf for the asymptotic laws)
    g_v: object  # value gain, std^2 x d
    g_o: object  # output-projection gain (1 without one)
    g_1: object  # MLP input gain, std^2 x d
    g_1b: object  # its backward (fan-out) gain, std^2 x d_ff
    g_2: object  # MLP output gain, std^2 x d_ff
    g_2b: object  # its backward gain, std^2 x d
    b_v2: object = 0.0
    b_o2: object = 0.0
    b_12: object = 0.0
    b_22: object = 0.0
    q_bias: object = 0.0  # query bias share, b_Q^2 / (std_Q^2 d)
    activation: str = "relu"
    dropout: object = 0.0
    attn_dropout: object = 0.0
    skip_a: object = 1.0
    block_a: object = 1.0
    skip_m: object = 1.0
    block_m: object = 1.0
    norm: str = "post"  # post | pre | none
    centered: bool = False
    causal: bool = False  # forward: late-token rows (001 C.6); backward: causal column moments
    parallel: bool = False


@dataclass
class AttentionCache:
    q_in: object
    p_in: object
    beta_c: object
    y2: object
    yp: object
    y3: object
    mom: tuple


def attention_forward(q, p, P: BlockParams):
    """Attention branch: V projection, REM mixing, output projection, dropout (001 eq. 14, Result 1)."""
    qq = q + P.q_bias
    bc = att.beta_c(q, p, qq)
    y2, yp, y3 = att.participation(P.beta, bc, (p + P.q_bias) / qq, P.seq_len)
    mom = att.mixing(y2, yp, P.seq_len, P.centered, P.attn_dropout)
    qv, pv = linear(q, p, P.g_v, P.b_v2)
    qa, pa = att.mix_forward(qv, pv, mom)
    qo, po = linear(qa, pa, P.g_o, P.b_o2)
    qo, po = dropout(qo, po, P.dropout)
    return qo, po, AttentionCache(q, p, bc, y2, yp, y3, mom)


def attention_backward(gq, gp, c: AttentionCache, P: BlockParams):
    gq, gp = dropout(gq, gp, P.dropout)
    gq, gp = P.g_o * gq, P.g_o * gp
    gq, gp = att.mix_backward(gq, gp, c.mom, P.seq_len, P.causal)
    return P.g_v * gq, P.g_v * gp


def mlp_forward(q, p, P: BlockParams):
    """Two-layer MLP (001 eq. 16 generalised by kernels); gated (SwiGLU/GeGLU): act(gate) * up."""
    q1, p1 = linear(q, p, P.g_1, P.b_12)
    kq, kp = kernels.forward(P.activation, q1, p1)
    if P.activation in ("swiglu", "geglu"):
        kq, kp = kq * q1, kp * p1  # independent gate and up projections
    q2, p2 = linear(kq, kp, P.g_2, P.b_22)
    q2, p2 = dropout(q2, p2, P.dropout)
    return q2, p2, (q1, p1)


def mlp_backward(gq, gp, cache, P: BlockParams):
    q1, p1 = cache
    gq, gp = dropout(gq, gp, P.dropout)
    gq, gp = P.g_2b * gq, P.g_2b * gp
    dq, dp = kernels.backward(P.activation, q1, p1)
    if P.activation in ("swiglu", "geglu"):
        kq, kp = kernels.forward(P.activation, q1, p1)
        dq, dp = dq * q1 + kq, dp * p1 + kp  # gate path + up path
    return P.g_1b * dq * gq, P.g_1b * dp * gp
