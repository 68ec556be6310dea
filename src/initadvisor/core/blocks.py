"""Block recipes: post-LN (001 Algorithm 1), pre-LN (Algorithm 2), no norm, parallel pre-LN (GPT-NeoX).

`block_forward` maps (q, p) of the residual stream through one block and returns a cache;
`block_backward` maps the gradient moments (gq, gp) back through it with that cache.
Centered attention (Algorithm 3) is a flag of the attention branch, not a recipe of its own.
"""

from __future__ import annotations

from initadvisor.core import components as C
from initadvisor.core.components import BlockParams


def block_forward(q, p, P: BlockParams):
    cache: dict = {"q_in": q}
    if P.parallel:  # h + attn(N1 h) + mlp(N2 h): both branches see the same normed moments
        qn, pn = C.norm(q, p)
        qa, pa, cache["att"] = C.attention_forward(qn, pn, P)
        qm, pm, cache["mlp"] = C.mlp_forward(qn, pn, P)
        qo, po = C.residual(q, p, qa, pa, P.skip_a, P.block_a)
        return qo + P.block_m**2 * qm, po + P.block_m**2 * pm, cache
    pre, post = P.norm == "pre", P.norm == "post"
    qi, pi = C.norm(q, p) if pre else (q, p)
    qa, pa, cache["att"] = C.attention_forward(qi, pi, P)
    q, p = C.residual(q, p, qa, pa, P.skip_a, P.block_a)
    cache["q_mid"] = q
    if post:
        q, p = C.norm(q, p)
    qi, pi = C.norm(q, p) if pre else (q, p)
    cache["q_mid_in"] = q
    qm, pm, cache["mlp"] = C.mlp_forward(qi, pi, P)
    q, p = C.residual(q, p, qm, pm, P.skip_m, P.block_m)
    cache["q_out"] = q
    if post:
        q, p = C.norm(q, p)
    return q, p, cache


def block_backward(gq, gp, cache: dict, P: BlockParams):
    if P.parallel:
        ga = C.attention_backward(P.block_a**2 * gq, P.block_a**2 * gp, cache["att"], P)
        gm = C.mlp_backward(P.block_m**2 * gq, P.block_m**2 * gp, cache["mlp"], P)
        gbq, gbp = C.norm_backward(ga[0] + gm[0], ga[1] + gm[1], cache["q_in"])
        return P.skip_a**2 * gq + gbq, P.skip_a**2 * gp + gbp
    pre, post = P.norm == "pre", P.norm == "post"
    if post:
        gq, gp = C.norm_backward(gq, gp, cache["q_out"])
    gmq, gmp = C.mlp_backward(P.block_m**2 * gq, P.block_m**2 * gp, cache["mlp"], P)
    if pre:
        gmq, gmp = C.norm_backward(gmq, gmp, cache["q_mid_in"])
    gq, gp = P.skip_m**2 * gq + gmq, P.skip_m**2 * gp + gmp
    if post:
        gq, gp = C.norm_backward(gq, gp, cache["q_mid"])
    gaq, gap = C.attention_backward(P.block_a**2 * gq, P.block_a**2 * gp, cache["att"], P)
    if pre:
        gaq, gap = C.norm_backward(gaq, gap, cache["q_in"])
    return P.skip_a**2 * gq + gaq, P.skip_a**2 * gp + gap
