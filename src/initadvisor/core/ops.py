"""The operations a transformer is built from, each defined once with every way it is computed.

An operation carries, side by side:

* ``moments(q, p) -> (q, p, cache)`` and ``moments_backward(gq, gp, cache)``: the map of per-coordinate second
  moments (q = E x_i^2 of one token, p = E x_i y_i of two tokens; THEORY.md "One state for all"), forward and
  backward, broadcasting over numpy arrays so a whole grid of hyper-parameters runs at once;
* ``causal(G, S) -> (S, cache)`` and ``causal_backward(G, S, cache)``: the same maps on the position-resolved state
  of causal models (causal.py);
* ``draws()``, ``forward(x, w, rng) -> (y, cache)``, ``backward(dy, w, cache, wgrads)``: the numpy network the
  Monte-Carlo measures (simulate.py), with the weights it draws;
* ``torch_build(make)`` and ``torch_forward(m, x)``: the PyTorch module (`verify --backend torch`; torch is
  imported only there).

A block is data: a tuple of operations, built from a layer's numbers by `block`. One interpreter per backend
runs it (model.propagate, causal.propagate_overlaps, simulate, initadvisor.torch.SpecModel); `Residual` runs
its branches with the same interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

import numpy as np

from initadvisor.core import attention as att
from initadvisor.core import causal as cz
from initadvisor.core import distances as dz
from initadvisor.core import gradients as gr
from initadvisor.core import kernels, routing
from initadvisor.core.repeats import SIGMA_MAX, at_lengths, query_token_share, token_rows
from initadvisor.core.softmax_rows import (expected_overlap, expected_y, field_key_half, field_rows, field_rows_y2, key_shares,
                                          power_sums, prefix_spread)
from initadvisor.core.sorting import median, unique

GATED = {"swiglu": "silu", "geglu": "gelu"}  # gated MLP -> the activation of its gate
EULER_GAMMA = 0.5772156649015329
_K_TANH = math.sqrt(2.0 / math.pi)
_FIELD_GROUPS = (4, 1.4)  # Attention._field_factor's coarser groups: 12-17 at T 64-512, within 1.2% of the engine's
_FIELD_DRAWS = (32, 256)  # its field draws (QMC): 256 hold the IPR within 0.7%, the gradient 0.6% of 1024 draws' on
# issue 13's grid; 32 first, to tell the layers where the keys' structure moves no row's IPR by _FIELD_NEGLIGIBLE
_FIELD_NEGLIGIBLE = 0.003
FIELD_LAW = False  # Attention.causal's rows from the keys' field law (_field_law, _key_half): exact at infinite width,
# off until the causal engine carries the width's pull (docs/phase-grid.md, "The field law in the engine")
_FIELD_LAW_DRAWS = 64  # their field draws (QMC)
_SLOPE_STEP = 0.01  # the i.i.d. pair shape's slope at independent queries, by this step (within 2% of 1e-3)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


@dataclass(frozen=True)
class BlockParams:
    """One layer's numbers; the moment fields may be numpy arrays (a grid of configurations).

    The moment maps read the gains (std^2 x fan-in) and beta; the numpy and PyTorch networks read the shapes
    and `init` ({matrix: (std, bias_std)}). The adapter (initadvisor.stack) fills both from one spec."""

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
    g_q: object = 1.0  # query and key gains, std^2 x d (the Q/K gradient laws)
    g_k: object = 1.0
    activation: str = "relu"
    dropout: object = 0.0
    attn_dropout: object = 0.0
    mlp_dropout: float = 0.0  # on the MLP's hidden units (T5): as a dropout on its output, the same moments both ways
    skip_a: object = 1.0
    block_a: object = 1.0
    skip_m: object = 1.0
    block_m: object = 1.0
    norm_eps: float = 0.0  # every norm's epsilon
    norm_gain: object = 1.0  # the gain of the norms before the branches (LayerNorm-Scaling: 1 / sqrt(layer))
    rope_theta: float = 0.0  # rotary position embedding's base (0: none) on a fraction of each head's coordinates
    rope_fraction: float = 1.0
    window: int = 0  # sliding-window attention: keys m - window + 1..m (causal) or |m - s| <= window // 2; 0: all
    alibi: float = 0.0  # ALiBi (causal): head h's logits minus m_h (t - s), attention.alibi_slopes times this; 0: none
    norm: str = "post"  # post | pre | sandwich (norm before and after each branch) | reordered (after only) | none
    qk_norm: str = "none"  # none | head | all: queries and keys normalised (norm_type, unit gain) before the scores
    centered: bool = False
    causal: bool = False  # forward: late-token rows (001 C.6); backward: causal column moments
    parallel: bool = False
    # the network (numpy Monte-Carlo and PyTorch)
    norm_type: str = "layernorm"
    d_model: int = 0
    heads: int = 1
    head_dim: int = 0  # 0: d_model // heads
    kv_heads: int = 1
    d_ff: int = 0
    softmax_scale: float = 1.0
    out_proj: bool = True
    init: Any = None  # {matrix: (std, bias_std)} for q, k, v, o, ff_in, ff_out (and router)
    # a mixture-of-experts MLP (experts > 0; the MLP's numbers are one expert's): routing.weights' router
    experts: int = 0
    top_k: int = 1
    router: str = "softmax"
    route_norm: bool = True
    route_scale: float = 1.0
    route_groups: int = 1  # group-limited routing (DeepSeek-V3): experts in this many groups, top k within the best
    route_top_groups: int = 1  # this many groups (routing.chosen_groups)
    shared_experts: int = 0  # always-on experts added unweighted (DeepSeek)
    g_r: object = 0.0  # router gain, std^2 x d
    repeat_vocab: int = 0  # token repeats (every block of a causal token-input model): ids i.i.d. Zipf over it
    repeat_rho: float = 0.0  # block 1: the correlation two positions holding one token share beyond the average pair's

    @property
    def d_head(self) -> int:
        return self.head_dim or self.d_model // self.heads


def block(P: BlockParams) -> tuple:
    """The block recipes as data: post-LN (001 Algorithm 1), pre-LN (Algorithm 2), no norm, the parallel
    pre-LN block of GPT-NeoX (h + attn(N h) + mlp(N h)), and the norms inside the branch: sandwich
    (h + N(f(N h)), Gemma 2/3) and reordered (h + N(f(h)), OLMo 2). Centered attention (Algorithm 3) is a flag of
    Attention."""
    norm, drop, attn, mlp = Norm(P.norm_type, P.norm_eps), Dropout(P.dropout), Attention(P), (MoE if P.experts else MLP)(P)
    entry = Norm(P.norm_type, P.norm_eps, P.norm_gain) if P.norm_gain != 1.0 else norm  # the norm before a branch
    if P.mlp_dropout:  # masks independent per token and unit: E (W (m h))^2 = E (m W h)^2, and so the gradients
        mlp = (mlp, Dropout(P.mlp_dropout))
    else:
        mlp = (mlp,)
    if P.parallel:
        return (Residual(P.skip_a, ((P.block_a, (attn, drop)), (P.block_m, (*mlp, drop))), shared=(entry,)),)
    if P.norm in ("pre", "sandwich", "reordered"):
        before = () if P.norm == "reordered" else (entry,)
        after = () if P.norm == "pre" else (norm,)
        return (Residual(P.skip_a, ((P.block_a, (*before, attn, *after, drop)),)),
                Residual(P.skip_m, ((P.block_m, (*before, *mlp, *after, drop)),)))
    ra, rm = Residual(P.skip_a, ((P.block_a, (attn, drop)),)), Residual(P.skip_m, ((P.block_m, (*mlp, drop)),))
    return (ra, norm, rm, norm) if P.norm == "post" else (ra, rm)


# ------------------------------------------------------------------------------------------------
# Interpreters of a sequence of operations (Residual runs its branches with them)


def moments_forward(ops, q, p) -> tuple[Any, Any, list]:
    caches = []
    for op in ops:
        q, p, c = op.moments(q, p)
        caches.append(c)
    return q, p, caches


def moments_backward(ops, gq, gp, caches):
    for op, c in zip(reversed(ops), reversed(caches)):
        gq, gp = op.moments_backward(gq, gp, c)
    return gq, gp


def spread_forward(ops, u, caches) -> tuple[Any, list]:
    """The variance u of a token's mean square between sequences through a block run by moments_forward or
    distance_forward (from their caches): attention's rows and a finite-width MLP add to it, residual sums add it
    up, a norm's backward reads it (its cache gains E[1 / (ms + eps)]); an operation without a `spread` drops it
    (None: not tracked). The position-resolved engine carries it in its State (causal.State.u)."""
    out = []
    for op, c in zip(ops, caches):
        f = getattr(op, "spread", None)
        u, c = f(u, c) if f is not None else (None, c)
        out.append(c)
    return u, out


def causal_forward(ops, G, S) -> tuple[Any, list]:
    caches = []
    for op in ops:
        S, c = op.causal(G, S) if S.R is None or isinstance(op, Residual) else _same_token_pairs(op, G, S)
        caches.append(c)
    return S, caches


def _same_token_pairs(op, G, S):
    """op's map of S with the pairs of positions that hold one token (S.R, a share S.w of all pairs) carried beside
    the mean pair: a position-wise operation maps them as any pair, and the mean pair as the mixture of them and the
    rest where the map is not affine in the overlap (MLP, MoE: a kernel of the mean pair is not the mean of the
    pairs' kernels; their backward then reads the rest's cache, the pairs' bulk); attention's rows weigh their keys
    alike whatever token the query holds (uniform rows), so such a pair's outputs overlap as the mean pair's."""
    if isinstance(op, (MLP, MoE)):
        rest, c = op.causal(G, cz.State(S.qf, (S.P - S.w * S.R) / (1.0 - S.w), u=S.u))
        R = op.causal(G, cz.State(S.qf, S.R))[0].P
        return cz.State(rest.qf, S.w * R + (1.0 - S.w) * rest.P, R, S.w, rest.u), c
    out, c = op.causal(G, S)
    if out.R is not None:  # attention: its own map of the pairs (where it has one, else its rows' mean pair's)
        return out, c
    R = out.P if isinstance(op, Attention) else op.causal(G, cz.State(S.qf, S.R))[0].P
    return cz.State(out.qf, out.P, R, S.w, out.u), c


def _add_spread(a, u, b, v):
    """a u + b v of two spreads (independent sums), None where neither is tracked."""
    if u is None and v is None:
        return None
    return (0.0 if u is None else a * u) + (0.0 if v is None else b * v)


def _token_share(G, S) -> float:
    """The token's share of a position's q: the same-token pairs' excess over the other pairs, (R - P) / (1 - w),
    over all pairs and over q."""
    return cz.pair_mean(G, (S.R - S.P) / (1.0 - S.w)) / float(np.mean(S.qf))


def causal_backward(ops, G, S, caches):
    for op, c in zip(reversed(ops), reversed(caches)):
        S = op.causal_backward(G, S, c)
    return S


def numpy_forward(ops, x, W: dict, rng) -> tuple[np.ndarray, list]:
    """W: the block's weights, {id(op): {name: array}} (`draws` says what each operation draws)."""
    caches = []
    for op in ops:
        x, c = op.forward(x, W, rng)
        caches.append(c)
    return x, caches


def numpy_backward(ops, dy, W: dict, caches, wgrads=None) -> np.ndarray:
    for op, c in zip(reversed(ops), reversed(caches)):
        dy = op.backward(dy, W, c, wgrads)
    return dy


def leaves(ops):
    """The operations of a block in execution order, Residual's branches unfolded."""
    for op in ops:
        if isinstance(op, Residual):
            yield from leaves(op.shared)
            for _, branch in op.branches:
                yield from leaves(branch)
        else:
            yield op


def walk(ops, caches):
    """(operation, cache) pairs of one run of a block (any backend), in execution order."""
    for op, c in zip(ops, caches):
        if isinstance(op, Residual):
            cs, bcs = c
            yield from walk(op.shared, cs)
            for (_, branch), bc in zip(op.branches, bcs):
                yield from walk(branch, bc)
        else:
            yield op, c


def find(ops, caches, kind):
    """The cache of the first operation of type `kind` in one run of a block (`walk`'s order, without its
    generators: the engine asks once per layer)."""
    for op, c in zip(ops, caches):
        if isinstance(op, kind):
            return c
        if isinstance(op, Residual):
            for sub, sc in zip((op.shared, *(branch for _, branch in op.branches)), (c[0], *c[1])):
                found = find(sub, sc, kind)
                if found is not None:
                    return found
    return None


# ------------------------------------------------------------------------------------------------
# Shared pieces of the moment maps


def linear(q, p, gain, bias2=0.0):
    """Zero-mean weights with gain = std^2 x fan-in, bias variance bias2 (THEORY.md; 001 sec. 4)."""
    return gain * q + bias2, gain * p + bias2


def normal(rng: np.random.Generator, shape: tuple[int, ...], std: float, dtype: np.dtype) -> np.ndarray:
    out = rng.standard_normal(shape, dtype=dtype)
    out *= std
    return out


def _lin(u: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    out = u @ w
    if b is not None:
        out += b
    return out


def _bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched matrix product over the leading axes, one 2-D BLAS call per slice (numpy's stacked matmul
    is slower for the small per-head products here)."""
    lead = a.shape[:-2]
    out = np.empty(lead + (a.shape[-2], b.shape[-1]), dtype=np.result_type(a, b))
    for i in np.ndindex(*lead):
        np.matmul(a[i], b[i], out=out[i])
    return out


def _torch_linear(d_in: int, d_out: int, std: float, bias_std: float):
    from torch import nn

    lin = nn.Linear(d_in, d_out)
    nn.init.normal_(lin.weight, 0.0, std)
    nn.init.normal_(lin.bias, 0.0, bias_std) if bias_std else nn.init.zeros_(lin.bias)
    return lin


# ------------------------------------------------------------------------------------------------
# Operations


@dataclass(frozen=True)
class Norm:
    """LayerNorm or RMSNorm, g x / sqrt(mean x^2 + eps) (centred for LayerNorm): the affine parameters at their init
    (weight 1, bias 0), or a fixed gain g (LayerNorm-Scaling's 1 / sqrt(layer))."""

    kind: str = "layernorm"  # layernorm | rmsnorm
    eps: float = 0.0
    gain: object = 1.0

    def moments(self, q, p):
        """q <- g^2 q / (q + eps), p <- g^2 p / (q + eps) (001 sec. 4 'LayerNorm'; 004 A.6): the mean square over d
        coordinates concentrates at q, so eps matters where a branch's output is as small as eps (OLMo 2 at init).
        The cache: (q + eps) / g^2 and the backward's Jensen factor (1 until `spread` sets it)."""
        r = (q + self.eps) / self.gain**2
        return q / r, p / r, (r, 1.0)

    def moments_backward(self, gq, gp, cache):
        """Divides by the input's (q + eps) / g^2 (004 A.6, Xu et al. eq. 17 at large d), the gradient's q by
        E[1 / (ms + eps)], j / (q + eps) (`spread`)."""
        r, j = cache
        return gq * j / r, gp / r

    def spread(self, u, cache):
        """A token's mean square ms varies between sequences by u (spread_forward): E[1 / (ms + eps)] = (1 + u / (q +
        eps)^2) / (q + eps) to second order, where the backward divides (E[1/x] > 1/E[x]: the cache's factor j), and
        the output g^2 ms / (ms + eps) keeps (g^2 eps / (q + eps)^2)^2 of u."""
        r = cache[0]
        if u is None:
            return None, (r, 1.0)
        qe = r * self.gain**2
        return u * (self.gain**2 * self.eps / (qe * qe)) ** 2, (r, 1.0 + u / (qe * qe))

    def causal(self, G, S):
        """Per position: g^2 C[m, n] / sqrt((q_m + eps) (q_n + eps)); the spread as `spread`."""
        g2 = float(self.gain) ** 2
        r = S.qf + self.eps
        w = cz.gmean(G, 1.0 / np.sqrt(r))
        u, c = self.spread(S.u, (r / g2, 1.0))
        return cz.State(g2 * S.qf / r, g2 * S.P * np.multiply.outer(w, w), u=u), (c, w)

    def causal_backward(self, G, S, cache):
        """Per position: as moments_backward (its cache from `spread`), the pairs by the groups' mean 1/sqrt(q + eps)."""
        c, w = cache
        g2 = float(self.gain) ** 2
        return cz.State(self.moments_backward(S.qf, 0.0, c)[0], g2 * S.P * np.multiply.outer(w, w))

    def draws(self):
        return ()

    def forward(self, x, W, rng):
        if self.kind == "layernorm":
            y = x - x.mean(-1, keepdims=True)
            r = 1.0 / np.sqrt((y * y).mean(-1, keepdims=True) + self.eps)
        else:  # rmsnorm
            y = x.copy()
            r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps)
        y *= r
        return y * self.gain if self.gain != 1.0 else y, (y, r)

    def backward(self, dy, W, cache, wgrads):
        y, r = cache
        dy = dy * self.gain if self.gain != 1.0 else dy
        dx = dy - y * (dy * y).mean(-1, keepdims=True)
        if self.kind == "layernorm":
            dx -= dy.mean(-1, keepdims=True)
        dx *= r
        return dx

    def torch_build(self, make, d: int):
        from torch import nn

        kind = nn.RMSNorm if self.kind == "rmsnorm" else nn.LayerNorm
        return {"norm": kind(d, eps=self.eps, elementwise_affine=False)}

    def torch_forward(self, m, x):
        return m.norm(x) * self.gain if self.gain != 1.0 else m.norm(x)


@dataclass(frozen=True)
class Dropout:
    """Training-mode dropout with 1/(1 - rate) scaling: q grows, p unchanged (004 A.3)."""

    rate: object = 0.0

    def moments(self, q, p):
        return q / (1.0 - self.rate), p, None

    def moments_backward(self, gq, gp, cache):
        return gq / (1.0 - self.rate), gp

    def spread(self, u, cache):
        """A token's mean square scales by 1 / keep, its spread by 1 / keep^2."""
        return (None if u is None else u / (1.0 - self.rate) ** 2), cache

    def causal(self, G, S):
        """Independent masks per position: only the diagonal grows."""
        if not self.rate:
            return S, None
        return cz.State(S.qf / (1.0 - float(self.rate)), S.P, u=self.spread(S.u, None)[0]), None

    def causal_backward(self, G, S, cache):
        return self.causal(G, S)[0]

    def draws(self):
        return ()

    def forward(self, x, W, rng):
        return dropout(x, self.rate, rng)

    def backward(self, dy, W, mask, wgrads):
        if mask is None:
            return dy
        return dy * mask * dy.dtype.type(1.0 / (1.0 - self.rate))

    def torch_build(self, make, d: int):
        from torch import nn

        return {"drop": nn.Dropout(self.rate)}

    def torch_forward(self, m, x):
        return m.drop(x)


def dropout(x: np.ndarray, p: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """Training-mode dropout: x * mask / (1 - p). Returns (output, boolean keep-mask or None)."""
    if p <= 0:
        return x, None
    mask = rng.random(x.shape, dtype=np.float32 if x.dtype == np.float32 else np.float64) >= p
    return x * mask * x.dtype.type(1.0 / (1.0 - p)), mask


@dataclass(frozen=True)
class Residual:
    """out = skip * x + sum_i block_i * branch_i(shared(x)); cross terms vanish at init (001 eq. 15, B.5.1).

    One branch is the sequential block's sublayer; two branches after one shared norm is the parallel block."""

    skip: object
    branches: tuple  # ((block scale, ops), ...)
    shared: tuple = ()

    def moments(self, q, p, run=moments_forward):
        qs, ps, cs = run(self.shared, q, p) if self.shared else (q, p, [])
        qo, po, caches = q, p, []
        for i, (b, ops) in enumerate(self.branches):
            qf, pf, c = run(ops, qs, ps)
            caches.append(c)
            if i == 0:
                qo, po = self.skip**2 * q + b**2 * qf, self.skip**2 * p + b**2 * pf
            else:
                qo, po = qo + b**2 * qf, po + b**2 * pf
        return qo, po, (cs, caches)

    def distances(self, q, c):
        """The distance-resolved state (distances.py): the same sum, its branches run by distance_forward."""
        return self.moments(q, c, dz.distance_forward)

    def spread(self, u, cache):
        """The pair and distance engines' spread (spread_forward): _sum_spread of the branches' own."""
        cs, caches = cache
        us, cs = spread_forward(self.shared, u, cs)
        runs = [spread_forward(ops, us, c) for (_, ops), c in zip(self.branches, caches)]
        return self._sum_spread(u, [ub for ub, _ in runs]), (cs, [c for _, c in runs])

    def _sum_spread(self, u, branches):
        """skip^4 u plus each branch's spread times block^4 (independent terms of a token's mean square)."""
        with np.errstate(over="ignore"):  # (a float's ** raises past 1e308; inf is the moments' own overflow)
            out = _add_spread(np.asarray(self.skip, dtype=float) ** 4, u, 0.0, None)  # (arrays on a grid)
            for (b, _), ub in zip(self.branches, branches):
                out = _add_spread(1.0, out, np.asarray(b, dtype=float) ** 4, ub)
        return out

    def distances_backward(self, gq, gp, cache):
        return self.moments_backward(gq, gp, cache, dz.distance_backward)

    def moments_backward(self, gq, gp, cache, run=moments_backward):
        cs, caches = cache
        sq = sp = None
        for (b, ops), c in zip(self.branches, caches):
            bq, bp = run(ops, b**2 * gq, b**2 * gp, c)
            sq, sp = (bq, bp) if sq is None else (sq + bq, sp + bp)
        if self.shared:
            sq, sp = run(self.shared, sq, sp, cs)
        return self.skip**2 * gq + sq, self.skip**2 * gp + sp

    def causal(self, G, S):
        Sn, cs = causal_forward(self.shared, G, S)
        out, caches, spreads = S, [], []
        s2 = float(self.skip) ** 2
        for i, (b, ops) in enumerate(self.branches):
            F, c = causal_forward(ops, G, Sn)
            caches.append(c)
            b2 = float(b) ** 2
            R = None if S.R is None else (s2 * S.R if i == 0 else out.R) + b2 * F.R
            spreads.append(F.u)
            out = cz.State(s2 * S.qf + b2 * F.qf, s2 * S.P + b2 * F.P, R, S.w) if i == 0 else \
                cz.State(out.qf + b2 * F.qf, out.P + b2 * F.P, R, S.w)
        return replace(out, u=self._sum_spread(S.u, spreads)), (cs, caches)

    def causal_backward(self, G, S, cache):
        cs, caches = cache
        acc = None
        for (b, ops), c in zip(self.branches, caches):
            b2 = float(b) ** 2
            B = causal_backward(ops, G, cz.State(b2 * S.qf, b2 * S.P), c)
            acc = B if acc is None else cz.State(acc.qf + B.qf, acc.P + B.P)
        acc = causal_backward(self.shared, G, acc, cs)
        s2 = float(self.skip) ** 2
        return cz.State(s2 * S.qf + acc.qf, s2 * S.P + acc.P)

    def draws(self):
        return ()

    def forward(self, x, W, rng):
        u, cs = numpy_forward(self.shared, x, W, rng)
        out, caches = None, []
        for i, (b, ops) in enumerate(self.branches):
            y, c = numpy_forward(ops, u, W, rng)
            caches.append(c)
            out = self.skip * x + b * y if i == 0 else out + b * y
        return out, (cs, caches)

    def backward(self, dy, W, cache, wgrads):
        cs, caches = cache
        du = None
        for (b, ops), c in zip(self.branches, caches):
            g = numpy_backward(ops, b * dy, W, c, wgrads)
            if du is None:
                du = g
            else:
                du += g
        return self.skip * dy + numpy_backward(self.shared, du, W, cs, wgrads)

    def torch_build(self, make, d: int):
        from torch import nn

        return {"shared": nn.ModuleList(make(op) for op in self.shared),
                "branches": nn.ModuleList(nn.ModuleList(make(op) for op in ops) for _, ops in self.branches)}

    def torch_forward(self, m, x):
        """skip * x first, then each branch with the shared operations applied on its own path (as GPT-NeoX
        and `skip * x + block * f(x)` do: the order in which autograd sums the gradient paths into x)."""
        out = self.skip * x
        for (b, _), mods in zip(self.branches, m.branches):
            y = x
            for mod in (*m.shared, *mods):
                y = mod(y)
            out = out + b * y
        return out


@dataclass
class AttentionCache:
    q_in: object
    p_in: object
    beta_c: object
    y2: object
    yp: object
    y3: object
    y22: object  # E[Y2^2]
    mom: tuple
    mom_b: tuple  # the backward's: a sliding window's rows overlap on their own keys
    kp: object  # the keys' common part as one row sees them (kappa p): the query/key path's (Attention._qk_gain)
    qk_share: object = 0.0  # set by the backward: the share of the gradient's q at the input through that path
    heads: tuple = ()  # ALiBi: per distinct head, (its window-equivalent operation, its cache, its share of the heads)
    qa: object = None  # the mixed values' q before W_O (the spread's finite-width term reads it)


@dataclass(frozen=True)
class Attention:
    """Softmax attention: Q, K, V projections (GQA: kv_heads K/V heads), an optional QK-norm, scaled scores, causal mask, softmax as a
    Random Energy Model at init (001 Result 1), attention dropout, A V (minus the attended keys' mean of V when
    centered, 001 Algorithm 3), output projection."""

    P: BlockParams

    def _kappa(self, m):
        """The share of the tokens' common component that a row's m keys keep under the rotary embedding
        (attention.rope_coherence); 1 without one."""
        P = self.P
        return att.rope_kappa(m, P.d_head, P.rope_theta, P.rope_fraction) if P.rope_theta else 1.0

    def moments(self, q, p):
        """V projection, REM mixing, output projection (001 eq. 14, Result 1); a rotary embedding turns the keys'
        common component into kappa p as one row sees them (beta_c; values are not turned). Two rows' overlap keeps
        the unturned query correlation: kappa there (its mean over pairs) put Qwen3's and OLMo 2's rho 0.01-0.02
        further from the real models."""
        P = self.P
        if P.alibi:
            return self._alibi_moments(q, p)
        T, n = P.seq_len, self._keys(P.seq_len)
        qq, kap = q + P.q_bias, self._kappa(n)
        bc = self._qk_normed_beta_c(q, kap * p, qq) if P.qk_norm != "none" else att.beta_c(q, kap * p, qq)
        if not P.window or np.all(n >= T):
            y2, yp, y3, y22 = att.participation(P.beta, bc, (p + P.q_bias) / qq, T)
            mom = mom_b = att.mixing(y2, yp, T, P.centered, P.attn_dropout)
        else:  # a REM at n keys (beta at n keys: beta sqrt(ln T / ln n)); two tokens share keys only when near:
            # over all pairs the overlap is n / T of two rows' at n keys (their Yp as without a window)
            with np.errstate(divide="ignore", invalid="ignore"):
                b_n = P.beta * np.sqrt(np.where(n > 1, np.log(T) / np.log(np.maximum(n, 2)), 1.0))
            y2, yp_n, y3, y22 = att.participation(b_n, bc, (p + P.q_bias) / qq, n)
            yp = np.minimum(y2, yp_n * n / T)
            mom, mom_b = (att.mixing(y2, x, n, False, P.attn_dropout) for x in (yp, yp_n))
        qv, pv = linear(q, p, P.g_v, P.b_v2)
        qa, pa = att.mix_forward(qv, pv, mom)
        qo, po = linear(qa, pa, P.g_o, P.b_o2)
        return qo, po, AttentionCache(q, p, bc, y2, yp, y3, y22, mom, mom_b, kap * p, qa=qa)

    @cached_property
    def _alibi_heads(self) -> list:
        """ALiBi's heads for the pair map, (operation, share of the heads): head h as a causal window of its effective
        keys coth(m_h / 2) (all keys where that reaches T: those heads are one), the late-token pair of a row whose
        weights fall off as e^(-m_h (t - s)). Once per operation (a stack's repeated layers share it)."""
        P = self.P
        wins, counts = att.alibi_windows(P.heads, float(P.alibi), P.seq_len)
        return [(Attention(replace(P, alibi=0.0, window=int(w))), n / P.heads) for w, n in zip(wins, counts)]

    def _alibi_moments(self, q, p):
        """The heads' mean: each head's output moments, and its share of the output projection's sum over heads."""
        heads = self._alibi_heads
        outs = [h.moments(q, p) for h, _ in heads]
        mean = lambda x: sum(w * v for (_, w), v in zip(heads, x))  # noqa: E731
        c = replace(outs[-1][2], y2=mean([o[2].y2 for o in outs]), yp=mean([o[2].yp for o in outs]),
                    heads=tuple((h, o[2], w) for (h, w), o in zip(heads, outs)))
        return mean([o[0] for o in outs]), mean([o[1] for o in outs]), c

    def _qk_gain(self, q, p, kp, qq, bc, y2, yp, y3, y22):
        """The query/key path of the backward: (a, a_key, b, x) with a gq + b gp its gradient q per coordinate of the
        attention input (a_key of a: through the keys) and x gp the queries' share of its p, gq and gp the gradient
        moments at the attention output (before W_O). The scores' gradient d_ts = A_ts G_t.(V_s - O_t) has
        E sum_s d_ts^2 = E tr(M^2) g_V (q - p) d_head gq, E tr(M^2) = Y2 - 2 Y3 + Y2^2 (the softmax Jacobian, exact at
        finite T). W_Q carries it back over the keys'
        spread q - kappa p; W_K over each query's whole norm q + b_Q^2 (its own row, t = t') and, through the queries'
        common part kappa p + b_Q^2 (rotary: its share over pairs), over the column sums of d: (T - 1) Yp E tr(M^2)
        / Y2 per row, times gp. With beta^2 ln T = (s_Q s_K d)^2 scale^2 d_head and the heads' H d_head / d:
        a = beta^2 ln T (q - kappa p + q + b_Q^2) g_V (q - p) E tr(M^2) H d_head / d, b = beta^2 ln T
        (q - kappa p) (kappa p + b_Q^2) g_V E tr(M^2) (T - 1) Yp / Y2 H d_head / d. Two queries' gradients correlate as
        their rows' Jacobians overlap, E tr(M_t M_t') ~ E tr(M^2) Yp / Y2: x = a_query Yp / Y2 (without it the
        operation's gp is 10-50% low past beta_c; the keys' part sums to zero over the keys: -1/(T - 1) of a_key gq
        + b gp). H d_head / d is already in gq: the backward's g_O gq is std_O^2 H d_head gq where the gradient at O
        is std_O^2 d gq. O(1/T) in the uniform phase when gp = 0, dominant once attention localises; 0 for T = inf and
        for causal rows over all keys (position-resolved: _qk_rows). A causal sliding window's rows, all of W keys past
        the first W positions, take it at W keys: the late-token pair is their prediction only where the stack is too
        long to resolve per position (diagnose.WINDOW_CELLS), and there, at the gains of d 4096 and std 0.02, the
        path carries 75% of the gradient (without it the gradient at index 1 was 40-50% low, at index 0 30-50x)."""
        P = self.P
        on = 1.0
        if P.causal:  # rows over all keys: left to the position-resolved backward (on the late-token pair the path
            if not P.window or np.all(P.window >= P.seq_len):  # overshoots deep causal stacks: 5x-6000x past beta_c)
                return 0.0, 0.0, 0.0, 0.0
            on = np.where(np.less(P.window, P.seq_len), 1.0, 0.0)  # (a grid of T: where the window bites)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            s2 = 2.0 * np.divide(P.beta, bc) ** 2 * np.log(P.seq_len)  # (a window's n keys: the same at beta_n, ln n)
            jt = gr.jacobian_trace(y2, y3, y22)
            base = s2 / qq * P.g_v * (q - p)  # beta^2 ln T (q - kappa p) g_V (q - p)
            a_key = s2 / np.maximum(q - kp, 1e-300) * P.g_v * (q - p) * jt  # beta^2 ln T qq g_V (q - p) E tr(M^2)
            a = base * jt + a_key
            b = base * (kp + P.q_bias) / np.maximum(q - p, 1e-300) * (P.seq_len - 1.0) * yp * jt / y2
            x = base * jt * yp / y2
        return tuple(np.where(np.isfinite(v), v, 0.0) * on for v in (a, a_key, b, x))

    def _keys(self, T):
        """Keys per row: T, or a sliding window's (window causal, 2 (window // 2) + 1 bidirectional)."""
        W = self.P.window
        if not W:
            return T
        return np.minimum(T, W if self.P.causal else 2 * (W // 2) + 1)

    def moments_backward(self, gq, gp, c: AttentionCache):
        """The value path (a sliding window's keys are each read by the window's rows, as bidirectional attention over
        its n keys) and the query/key path (`_qk_gain`; it adds to the gradient's q only: two tokens' scores'
        gradients carry back through W_Q and W_K with random signs)."""
        P = self.P
        if c.heads:  # ALiBi: the heads' mean
            grads = [h.moments_backward(gq, gp, hc) for h, hc, _ in c.heads]
            c.qk_share = sum(w * hc.qk_share for _, hc, w in c.heads)
            return sum(w * g[0] for (_, _, w), g in zip(c.heads, grads)), sum(w * g[1] for (_, _, w), g in
                                                                          zip(c.heads, grads))
        gq, gp = P.g_o * gq, P.g_o * gp
        a, a_key, b, x = self._qk_gain(c.q_in, c.p_in, c.kp, c.q_in + P.q_bias, c.beta_c, c.y2, c.yp, c.y3, c.y22)
        qk = a * gq + b * gp
        qk_p = x * gp - (a_key * gq + b * gp) / (self._keys(P.seq_len) - 1.0)
        if P.window and np.any(self._keys(P.seq_len) < P.seq_len):
            gq, gp = att.mix_backward(gq, gp, c.mom_b, self._keys(P.seq_len), False)
        else:
            col = None
            if P.causal:  # the late rows' IPR over the column average of all rows' (one T: causal_columns' too)
                col = att.causal_column_scale(np.divide(P.beta, c.beta_c) * math.sqrt(2.0 * math.log(P.seq_len)),
                                              P.seq_len)
            gq, gp = att.mix_backward(gq, gp, c.mom, P.seq_len, col)
        total = P.g_v * gq + qk
        c.qk_share = _path_share(qk, total)  # (the column term can be negative)
        return total, P.g_v * gp + np.where(np.isfinite(qk_p), qk_p, 0.0)

    def causal(self, G, S):
        """Row m attends to keys 1..m: a REM at m keys (causal.py's module docstring derives each term)."""
        P = self.P
        if P.alibi:
            return self._causal_alibi(G, S)
        if (P.window and P.window < G.T) or not P.causal:
            return self._causal_window(G, S)
        lnT = math.log(P.seq_len) if np.isfinite(P.seq_len) else math.log(G.T)
        qf, Pm = S.qf, S.P
        n, gid, m, i = G.n, G.gid, G.m, G.i
        K = len(n)
        qg = cz.gmean(G, qf)
        # group-pair totals sum_{s in g, s' in h} C[s, s'] and their exclusive 2-D prefix sums
        M = Pm * np.multiply.outer(n, n)
        M[np.diag_indices(K)] = n * qg + G.pairs * np.diag(Pm)
        SP = np.zeros((K + 1, K + 1))
        np.cumsum(np.cumsum(M, axis=0), axis=1, out=SP[1:, 1:])
        rc = np.zeros((K, K + 1))
        np.cumsum(M, axis=1, out=rc[:, 1:])
        r = rc[:, :K] / n[:, None]  # r[g, h] = row sum of one token of g over the groups before h
        SPd = np.diag(SP)[:K]
        rd = np.diag(r)
        pd = np.diag(Pm)

        # per row m (group g, i-th of its group): keys = groups before g + the first i tokens of g
        cq = G.cum_within(qf)
        g_ = gid
        tot = SPd[g_] + 2.0 * i * rd[g_] + cq + i * (i - 1.0) * pd[g_]  # sum_{s, s' <= m} C[s, s']
        trace = np.cumsum(qf)
        qbar = trace / m
        with np.errstate(invalid="ignore", divide="ignore"):
            pbar = np.where(m > 1, (tot - trace) / (m * np.maximum(m - 1.0, 1.0)), qbar)
        qb = float(P.q_bias)
        qq = qf + qb
        kbar = pbar * att.rope_rows(G.T, P.d_head, P.rope_theta, P.rope_fraction) if P.rope_theta else pbar
        bc = self._qk_normed_beta_c(qbar, kbar, qq) if P.qk_norm != "none" else att.beta_c(qbar, kbar, qq)
        y2, v, ys = cz.row_statistics(P.beta, bc, lnT, m)
        ends = G.edges[1:] - 1  # each group at its last row: keys the groups up to it
        s_row = cz.row_std(P.beta, bc, lnT)
        cf = self._coarse_field(G, qf, Pm, s_row[ends])
        ff = self._field_factor(G, cf)
        y2 = y2 * ff
        law = None  # the field law where the keys' structure moves the rows (not centred rows, token repeats)
        if FIELD_LAW and not (np.isscalar(ff) or P.centered or P.repeat_vocab):
            law = self._field_law(G, qf, Pm, cf)
        sums = self._structure_sums(G, qf, Pm)
        phi = att.coweighting(m[ends], cz.row_x(P.beta, bc, lnT, m)[ends], sums)
        shares = None  # (centered rows: the rows' means are taken off, and there is no position-resolved backward)
        if not P.centered:
            shares = self._key_shares(G, qf, Pm, cz.row_std(P.beta, bc[ends], lnT))

        g_v, b_v2 = float(P.g_v), float(P.b_v2)
        gap_v = g_v * np.maximum(qbar - pbar, 0.0)  # values are not turned
        keep = 1.0 - float(P.attn_dropout)
        diag = att.coweighted(y2 - 1.0 / m, phi[G.gid], m) * gap_v + (1.0 / keep - 1.0) * y2 * (g_v * qbar + b_v2)

        # off-diagonal fluctuations from group means: (Yp - 1/max(m, n)) gapV_min(m, n)
        qqg = qg + qb
        rho_q = (Pm + qb) / np.sqrt(np.multiply.outer(qqg, qqg))
        sv, sy, gv = cz.gmean(G, np.sqrt(v)), cz.gmean(G, np.sqrt(y2)), cz.gmean(G, gap_v)
        amax = G.A[G.hi]
        amax[np.diag_indices(K)] = G.Amax
        yp = np.exp(rho_q * np.multiply.outer(sv, sv)) * amax
        if law is not None:  # between one query and independent ones (_between)
            sg, mg = cz.gmean(G, s_row)[G.lo], cz.gmean(G, m)[G.lo]
            rc = np.clip(rho_q, 0.0, 1.0)
            shape = (self._pair_shape(sg, mg, rho_q), self._pair_shape(sg, mg, _SLOPE_STEP))
            yp = amax + law.y0 + _between(law.y1 - law.y0, law.slope, *shape, rc)
        yp = np.minimum(yp, np.multiply.outer(sy, sy))
        overlap = yp / np.multiply.outer(sy, sy)
        shared = yp - amax
        gm = cz.gmean(G, m)  # each group at its mean row length
        out = att.coweighted(shared, phi[G.lo], gm[G.lo]) * gv[G.lo]  # (the earlier row's keys' structure)

        if not P.centered:  # uniform part: (1/(m n)) sum_{s<=m, s'<=n} Cv[s, s'], averaged over the group pair
            A, B = G.A, G.B
            D = cz.gmean(G, (cq - i * qg[gid]) / m)  # within-group spread of the diagonal (0 for constant q)
            U = SP[:K, :K] * np.multiply.outer(A, A) + r * np.multiply.outer(B, A) + r.T * np.multiply.outer(A, B)
            U += Pm * np.multiply.outer(B, B)
            DA = np.multiply.outer(D, A)
            U += np.where(G.lo == np.arange(K)[:, None], DA, DA.T)  # D of the earlier group
            F = G.pair_min_sum(cq, 1.0 / m) / np.maximum(G.pairs, 1.0)
            U[np.diag_indices(K)] = SPd * G.A2 + 2.0 * rd * G.Bt + pd * G.E + F
            out += g_v * U + b_v2
            diag += g_v * tot / (m * m) + b_v2
            if shares is not None and law is None:  # the rows' means at their keys' shares of the weight, over
                # uniform ones (the law has its own, below)
                Ug = self._weighed_means(G, qg, Pm, shares[0])
                out += g_v * Ug
                diag += g_v * np.diag(Ug)[gid]
        if law is not None:  # the law's own output, and two rows' output overlap beyond uniform rows': the means
            # exact; the weights' covariance on one key on the i.i.d. pair shape, on two keys quadratic in rho (both
            # exact at independent queries, in their slope there, and at one query), split about the earlier row's
            # keys' mean overlap as the mean field's (q - p)(Y - 1/m)
            ref = cz.gmean(G, pbar)[G.lo] - law.base  # the split about the earlier row's keys' mean overlap
            y1, slope = law.y1 - law.y0, law.slope
            same = _between(law.same1 - ref * y1, law.same_slope - ref * slope, *shape, rc)
            c1, cs = law.cross1 + ref * y1, law.cross_slope + ref * slope
            cross = c1 * rc + (cs - c1) * rc * (1.0 - rc)
            out = g_v * (U + law.mean + same + cross) + b_v2
            diag = g_v * (tot / (m * m) + law.own) + b_v2 + (1.0 / keep - 1.0) * y2 * (g_v * qbar + b_v2)
        e = P.repeat_rho if S.R is None else _token_share(G, S)
        rep = self._repeats(bc, lnT, m, qbar, kbar, e)
        diag += rep
        R, qg = None, cz.gmean(G, qbar)
        if S.R is not None:  # two rows whose queries hold one token: their scores move together, as far as the
            turn = self._turn(np.subtract.outer(gm, gm), G.T)  # rotary embedding lets them (their distance)
            rho_r = (S.R + qb) / np.sqrt(np.multiply.outer(qqg, qqg)) * turn
            yp_r = np.minimum(np.exp(rho_r * np.multiply.outer(sv, sv)) * amax, np.multiply.outer(sy, sy))
            R = out + (yp_r - yp) * gv[G.lo] + g_v * self._own_keys(e, qg, np.minimum.outer(gm, gm),
                                                                       np.maximum.outer(gm, gm), 1.0)
        two = None if P.centered else self._two_rows(bc, lnT, m, qbar, kbar, e, gm)
        out, R = self._weigh_copies(two, qg, amax, e, out, R, None if R is None else rho_r)
        O = self._output(diag, out, R, (G.single, G.single), S.w, self._spread(ys, y2 * gap_v + rep, m, e, qbar, diag))
        qk = (lnT, m, qq, qbar - kbar, kbar + qb, g_v * np.maximum(qbar - pbar, 0.0), ys)
        field = None if law is None else (qf, Pm, cf, gr.jacobian_trace(*ys) * np.maximum(qbar - pbar, 0.0))
        return O, cz.AttentionRows(y2, bc, O.qf, qk, overlap=overlap, shared=shared,
                                   structure=(sums, qbar, kbar, pbar), shares=shares, field=field)

    def _key_overlaps(self, G, qf, Pm):
        """The keys' overlaps as the scores see them, per group (K_ss) and group pair (summed over its ordered position
        pairs s != s'): turned by the rotary coherence of the two keys' distance, normalised by a QK-norm."""
        P = self.P
        qg, g_k = cz.gmean(G, qf), float(P.g_k)
        kap = att.rope_group_pairs(tuple(G.edges.tolist()), P.d_head, P.rope_theta or 0.0, P.rope_fraction)
        if P.qk_norm != "none":  # normalised keys: a K_ss of g q / (g q + eps), their overlaps g P / sqrt(..)
            kq = g_k * qg + P.norm_eps
            return g_k * qg / kq, kap * g_k * Pm / np.sqrt(np.multiply.outer(kq, kq))
        return qg, kap * Pm

    def _structure_sums(self, G, qf, Pm):
        """Per row group, over its keys (the groups up to it): gradients.jacobian_form's sums of the keys' overlaps as
        the scores see them (_key_overlaps) and the values' (C: the input's, the value gain cancels where they are
        read)."""
        kd, Kp = self._key_overlaps(G, qf, Pm)
        return cz.prefix_pair_sums(G, kd, Kp, cz.gmean(G, qf), _ordered_pairs(G.n) * Pm, Kp * Pm)

    @staticmethod
    def _weighed_means(G, qg, Pm, W):
        """Two rows' means' overlap when row group r weighs key group g at W[r, g] of uniform, less uniform rows':
        sum_{g, h} a_rg a_r'h C_gh with a_rg = W n_g / m_r (the group's last row), C_gh the groups' mean overlap (a
        group with itself: its own keys' q too), on position groups."""
        n = G.n
        C = Pm.copy()
        C[np.diag_indices(len(n))] = (qg + (n - 1.0) * np.diag(Pm)) / n
        A1 = G.keys / G.edges[1:, None]
        A = A1 * W
        return A @ C @ A.T - A1 @ C @ A1.T

    def _coarse_field(self, G, qf, Pm, s):
        """The keys' structure on coarser groups (_FIELD_GROUPS): (M, n, F, own, m, c, ok), M the position groups each
        holds, n their keys, F two distinct keys' score overlaps (a one-key group's own q), own a key's own part, m the
        rows' keys at each one's last row, c the score scale there (s^2 over the row's keys' spread, s the rows' score
        std at each position group's last row) and ok the rows it is resolved for; None where no row's scores spread
        by 0.3 (uniform rows: the structure moves the IPR as s^4) or the structure is unresolved."""
        if not np.nanmax(np.where(G.edges[1:] > 1, s, 0.0), initial=0.0) >= 0.3:
            return None
        kd, Kp = self._key_overlaps(G, qf, Pm)
        M = cz.coarser(G.edges, *_FIELD_GROUPS)
        n = M @ G.n
        F, own = _field_of(n, M @ Kp @ M.T, (M @ (G.n * kd)) / n)
        m = np.cumsum(n)
        last = np.searchsorted(G.edges[1:], m)  # each coarser group's last group
        with np.errstate(invalid="ignore", divide="ignore"):
            c = s[last] ** 2 / prefix_spread(n, F, own)
        ok = (m > 1) & np.isfinite(c) & (c > 0)
        if not ok.any() or not np.all(np.isfinite(F)):
            return None
        return M, n, F, own, m, min(float(np.median(c[ok])), 1e6), ok

    def _field_factor(self, G, cf):
        """Per row: its IPR when its keys' scores correlate as the keys do, over i.i.d. scores' of the same spread
        (softmax_rows.field_rows_y2 on the coarser groups of _coarse_field `cf`, at their last rows; linear in ln m
        between them, 1 for one key). Past beta_c in post-LN a causal row's keys are positional clusters of alike
        tokens: a row that localizes spreads its weight over a cluster, so its IPR is lower than i.i.d. scores' (the
        numpy network's late rows at 2.5 beta_c, T 512: 28% at block 44). 1 without structure (cf None)."""
        if cf is None:
            return 1.0
        _, n, F, own, m, c, ok = cf
        y, ref = field_rows_y2(c, n, F, own, _FIELD_DRAWS, _FIELD_NEGLIGIBLE)
        with np.errstate(invalid="ignore", divide="ignore"):
            f = np.where(ok & (ref > 0), y / ref, 1.0)
        f = np.where(np.isfinite(f), f, 1.0)
        return np.interp(np.log(G.m), np.log(np.r_[1.0, m]), np.r_[1.0, f])

    def _field_law(self, G, qf, Pm, cf):
        """What the keys' field law adds to uniform rows' (_FieldLaw): per row, its own output E[a^T C a] beyond the
        values' mean overlap over its keys (C the values' overlaps); per pair of position groups at their mean rows,
        two rows' overlap E sum_j A_j B_j beyond 1 / max(m, n) at independent queries (Y0) and at one query (Y1) and
        its slope in the queries' correlation at independent queries, and their output overlap E sum_jk C_jk A_j B_k:
        the means' part (independent queries) beyond uniform rows', and the weights' covariance on one key and on two
        at one query and in its slope at independent queries (exact, Price's theorem). softmax_rows.field_rows on
        _coarse_field's groups `cf`, linear in ln m between their rows and bilinear in the two rows' ln m. Where a
        causal row localizes, its keys' positional clusters set them all: the i.i.d. laws give the late rows'
        overlaps 2.6-3.9x off at 2.5 beta_c, T 512."""
        M, n, F, own, m, c, _ = cf
        Pv, qv = self._coarse_values(G, qf, Pm, M, n)
        # the values less their mean pair overlap: the output overlap does not see a common shift (the weights sum to
        # 1, their covariances to 0), and near collapse (overlaps 0.99) the quadrature's error in a row's total
        # weight times the raw values took rho 0.0035 lower at the top of post-LN 1.5 beta_c, T 64
        pairs = _ordered_pairs(n)
        base = float((Pv * pairs).sum() / max(pairs.sum(), 1.0))
        Pv, qv = Pv - base, qv - base
        law = field_rows(c, n, F, own, Pv, qv, _FIELD_LAW_DRAWS)
        if law is None:
            return None
        idx = np.arange(len(n))
        shared = np.cumsum(n * (qv - np.diag(Pv)))[np.minimum.outer(idx, idx)]  # the two rows' shared keys' own parts
        flat = (np.cumsum(np.cumsum(Pv * np.multiply.outer(n, n), axis=0), axis=1) + shared) / np.multiply.outer(m, m)
        uniform = 1.0 / np.maximum.outer(m, m)  # (flat: uniform rows' output overlaps, a row's own on the diagonal)
        x, at = np.log(m), np.log(cz.gmean(G, G.m))
        pair = {k: _bilinear(x, v, at) for k, v in dict(
            y0=(law.ea * n) @ law.ea.T - uniform, y1=law.y1 - uniform, slope=law.slope, mean=law.o0 - flat,
            same1=law.s1 - law.s0, same_slope=law.sslope, cross1=(law.o1 - law.s1) - (law.o0 - law.s0),
            cross_slope=law.oslope - law.sslope).items()}
        return _FieldLaw(own=np.interp(np.log(G.m), x, law.out - flat.diagonal()), base=base, **pair)

    def _key_half(self, G, qf, Pm, cf, iid):
        """The query/key path's key half from the keys' field law (softmax_rows.field_key_half, every position group
        a key, at _coarse_field's rows; linear in ln m between them): per row, its total sum_j E[(M C M)_jj] over the
        engine's E tr M^2 (q - p) (`iid`, per row), and per row group and key group one key's share of it over the
        row's mean (each group at its last row). A localized row's recent keys carry its scores' gradient, and its
        early ones, alike and read by every row, less than their spread says."""
        _, _, _, _, m, c, _ = cf
        n = G.n
        F, own = _field_of(n, *self._key_overlaps(G, qf, Pm)[::-1])
        rows = np.searchsorted(G.edges[1:], m)  # the coarser groups' last position groups
        kh = field_key_half(c, n, F, own, Pm, cz.gmean(G, qf), rows.tolist(), _FIELD_LAW_DRAWS)
        if kh is None:
            return None
        tot = kh @ n  # each coarser row's sum over its keys
        ends = G.edges[1:].astype(float)
        u = np.clip(np.interp(np.log(ends), np.log(m), np.arange(len(m), dtype=float)), 0.0, len(m) - 1.0)
        i0 = np.minimum(u.astype(int), max(len(m) - 2, 0))
        i1 = np.minimum(i0 + 1, len(m) - 1)
        f = (u - i0)[:, None]
        K = len(n)
        keys = np.arange(K)[None, :] <= np.arange(K)[:, None]
        lower = np.arange(K)[None, :] <= rows[i0][:, None]  # key groups the lower coarse row has
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = kh * (m / tot)[:, None]  # a key's share at each coarser row (its mean over the row's keys 1)
            share = np.where(lower, rel[i0] * (1.0 - f) + rel[i1] * f, rel[i1]) * keys
            share = np.where(keys, share * (ends / (share @ n))[:, None], 1.0)  # (row group, key group), mean 1
            ratio = np.exp(np.interp(np.log(G.m), np.log(m), np.log(tot))) / iid
        ok = np.isfinite(share) & (share >= 0.0)
        return np.where(np.isfinite(ratio) & (ratio > 0.0), ratio, 1.0), np.where(ok, share, 1.0)

    @staticmethod
    def _coarse_values(G, qf, Pm, M, n):
        """The values' overlaps on coarser groups M (n keys each): two distinct keys' (Pv) and a key's own (qv)."""
        return _pair_means(n, M @ (_ordered_pairs(G.n) * Pm) @ M.T), (M @ (G.n * cz.gmean(G, qf))) / n

    @staticmethod
    def _pair_shape(s, m, rho):
        """Two i.i.d. rows' overlap at their queries' correlation rho, between independent queries (0) and one query
        (1): (Yp(rho) - 1/m) / (Y2 - 1/m) at the earlier row's score std s and keys m (softmax_rows' pair table)."""
        s, m, rho = np.broadcast_arrays(s, m, rho)
        lo, hi, at = expected_overlap(np.stack([s] * 3), np.stack([m] * 3), np.stack([0.0 * rho, 1.0 + 0.0 * rho, rho]))
        with np.errstate(invalid="ignore", divide="ignore"):
            f = (at - lo) / (hi - lo)
        return np.clip(np.where(np.isfinite(f), f, 1.0), 0.0, 1.0)

    def _key_shares(self, G, qf, Pm, s):
        """Per row group (at its last row: keys the groups up to it) and key group, one key's share of the row's E[A],
        E[A^2] and E[(M^2)_jj] over uniform rows' (softmax_rows.key_shares), from the spread of each key's score about
        the row's keys' mean: K_ss - 2 mean_s' K_ss' + mean K. Keys that look less like the row's others vary more and
        win a localized row more often (post-LN past beta_c: a causal row's recent keys; the early ones, read by every
        row, 0.7 of uniform at rho 0.5, in the numpy network's rows and in Gaussian rows of its overlaps). None where
        no share moves by 0.1% (uniform rows: e^(2 s^2 (r - 1)))."""
        kd, Kp = self._key_overlaps(G, qf, Pm)
        n, m, N = G.n, G.edges[1:], G.keys
        cs = (np.cumsum(Kp, axis=1) / n[:, None] + kd[:, None]) / m[None, :]  # [g, r]: a key's mean over r's keys
        kbar = (N * cs.T).sum(axis=1) / m
        R = np.maximum(kd[None, :] - 2.0 * cs.T + kbar[:, None], 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = R / ((N * R).sum(axis=1) / m)[:, None]
        rel = np.where((N > 0) & np.isfinite(rel), rel, 1.0)
        se = np.where(np.isfinite(s) & (m > 1), np.minimum(s, 30.0), 0.0)
        if np.max(2.0 * np.abs(se[:, None] ** 2 * (rel - 1.0)), initial=0.0) < 1e-3:
            return None
        return key_shares(se, N, rel)

    def _key_structure(self, G, s, sums, qbar, kbar, pbar):
        """Per causal row: the query half of the query/key path over its mean field, E tr(M K M C) for the keys'
        overlaps as the scores see them (K: turned by the rotary coherence of the two keys' distance, normalised by a
        QK-norm) and the values' (C) on the position groups (gradients.jacobian_form), over E tr(M^2) (q - kappa p)
        (q - p) of the row's means. A row's early keys carry most of the values' spread (their q is large) and see the
        later keys less than the mean pair does, so the scores' gradient spreads further than the mean field says
        (OLMo 2's block 2: 1.8x at the late rows of T 128, in the numpy network). s: each row's score std; the rows'
        moments at each group's last row, all four from one quadrature (softmax_rows.power_sums)."""
        P = self.P
        ends = G.edges[1:] - 1  # each group's rows at its last row's keys: the groups up to it
        qe, ke, pe = qbar[ends], kbar[ends], pbar[ends]
        if P.qk_norm != "none":  # normalised keys: a K_ss of g q / (g q + eps)
            spread_k = P.g_k * qe / (P.g_k * qe + P.norm_eps) * (1.0 - ke / qe)
        else:
            spread_k = qe - ke
        m = np.cumsum(G.n)
        y2, y3, y22, y4 = power_sums(s[ends], m)
        with np.errstate(invalid="ignore", divide="ignore"):
            phi = gr.jacobian_form(m, y2, y3, y22, y4, sums) / (gr.jacobian_trace(y2, y3, y22) * spread_k * (qe - pe))
        return np.where(np.isfinite(phi) & (m > 1), phi, 1.0)[G.gid]

    def _repeat_law(self, bc, lnT, m, qbar, kbar, e):
        """The token repeats' tables (repeats.token_rows: the rows' excess mass, their copy weights, the Zipf bins' sum
        p and sum p^2) and the 8 row lengths they are at, at the rows' median score std and same-token score
        correlation, e the token's share of a position's q (rotary: x kappa, as the common part); None where their
        effect, e sum_j p_j^2 (e^(c sigma^2) - 1) of q, is below 1e-4 (the annealed bound of both terms)."""
        P = self.P
        if not P.repeat_vocab or len(m) < 3 or not e:
            return None
        kap = att.rope_rows(len(m), P.d_head, P.rope_theta, P.rope_fraction)[m.astype(int) - 1] if P.rope_theta \
            else 1.0
        two = m >= 2
        with np.errstate(divide="ignore", invalid="ignore"):
            sig = median(cz.row_std(P.beta, bc, lnT)[two])
            c = median((e * qbar * kap / (qbar - kbar))[two])
        if not (np.isfinite(sig) and np.isfinite(c)):
            return None
        sig, c = min(float(sig), SIGMA_MAX), float(np.clip(c, 0.0, 1.0))
        if e * zipf_repeat_correlation(int(P.repeat_vocab)) * math.expm1(min(c * sig * sig, 700.0)) < 1e-4:
            return None
        lengths = unique(np.round(np.geomspace(2, m.max(), 8)))
        # the tables on a grid of 3% in sigma and 1/64 in c, so that a deep stack's layers share them (a 1682-layer
        # stack's recipes asked for 1000-3300 tables each, 10-17 s; the terms move by under 1e-4 of q within a step)
        sig, c = math.exp(round(math.log(max(sig, 1e-300)) * 32.0) / 32.0), round(c * 64.0) / 64.0
        return token_rows(int(P.repeat_vocab), tuple(lengths.tolist()), sig, c), lengths

    def _repeats(self, bc, lnT, m, qbar, kbar, e=None):
        """What token repeats add to the output variance of each row of m keys: the value gain times the repeated pairs'
        shared part (e qbar; block 1: repeat_rho, the token table's share) times the mass they carry beyond the
        mean-field law's (repeats.repeat_excess); 0 without repeats."""
        e = self.P.repeat_rho if e is None else e
        law = self._repeat_law(bc, lnT, m, qbar, kbar, e)
        if law is None:
            return 0.0
        (ex, *_), lengths = law
        mass = np.where(m >= 2, np.interp(np.log(np.maximum(m, 1.0)), np.log(lengths), ex), 0.0)
        return float(self.P.g_v) * e * qbar * mass

    def _two_rows(self, bc, lnT, m, qbar, kbar, e, rows):
        """What token repeats change in two rows' overlap, per pair of the row lengths `rows` (None without repeats):
        (a, b, x). Two rows of independent scores weigh a key by its token's copy weight f / m (repeats.copy_weights),
        not 1 / m, so their shared keys give qbar a / max(m, n), a = sum_j p_j f_j f'_j - 1, and their same-token key
        pairs e qbar b, b = sum_j p_j^2 (f_j f'_j - 1), beyond the uniform part (without it block 1's overlap under
        QK-norm's scores was 5% high: rho 0.34 against the numpy network's 0.325; Qwen3-MoE's block 2 0.05 above the
        real model's). Two rows whose queries hold one token score a token's copies alike, shared or not: x =
        sum_j p_j^2 (E_z[f_j(z) f'_j(z)] - f_j f'_j) more, at their queries' correlation."""
        law = self._repeat_law(bc, lnT, m, qbar, kbar, e)
        if law is None:
            return None
        (_, f, fz, wz, ps, ps2), lengths = law
        fg, fzg = at_lengths(rows, lengths, f), at_lengths(rows, lengths, fz)
        a = (fg * ps) @ fg.T - 1.0
        same = (fg * ps2) @ fg.T
        A = (fzg * np.sqrt(wz)[:, None] * np.sqrt(ps2)).reshape(len(fzg), -1)
        return a, same - ps2.sum(), A @ A.T - same

    def _weigh_copies(self, two, qa, near, e, out, R, rho_r):
        """Two rows' overlaps (and the same-token pairs' R) with their keys weighed by copy weight (_two_rows' a, b,
        x; `near`: the rows' shared keys over m n, qa the rows' mean q, e the token's share of it)."""
        if two is None:
            return out, R
        a, b, x = two
        qq2 = np.sqrt(np.multiply.outer(qa, qa))
        extra = float(self.P.g_v) * (np.minimum.outer(qa, qa) * a * near + e * qq2 * b)
        if R is not None:
            R = R + extra + float(self.P.g_v) * e * qq2 * np.clip(rho_r, 0.0, 1.0) * x
        return out + extra, R

    def _output(self, diag, out, R, own, w, u):
        """The branch output after W_O: per-row variance diag, pair overlaps out (and the same-token pairs' R, at
        share w), each row's pair with itself (`own`) taken off; u its spread (_spread)."""
        P = self.P
        out[own] = 0.0
        O = cz.State(*linear(diag, out, float(P.g_o), float(P.b_o2)), u=u)
        if R is None:
            return O
        R[own] = 0.0
        return cz.State(O.qf, O.P, linear(diag, R, float(P.g_o), float(P.b_o2))[1], w, u)

    def _spread(self, ys, scored, m, e, qbar, diag):
        """The variance of a token's output mean square between sequences (after W_O; `diag` its mean before), every
        engine's: the part the scores weigh (`scored`: Y2 gap_v and the repeated keys' excess mass) varies with them
        as the IPR Y2 does (relative variance E[Y2^2] / E[Y2]^2 - 1, softmax_rows), independently between heads
        (1 / heads of it); the row's same-token key pairs N vary with the Zipf draws, each adding 2 g_v e qbar / m^2
        (e: the token's share of q), alike in every head: Var N = C(m, 2) a (1 - a) + 6 C(m, 3) (b - a^2) for N =
        sum_j C(n_j, 2) of m multinomial draws, a = sum p^2, b = sum p^3 (uniform rows); at finite width W_V's
        quadratic form on an input of given norm adds 2 / (kv_heads d_head) of diag^2, and W_O's 2 / d. The keys'
        own spread is left out (a row averages it)."""
        heads, (a, b), width, g_v, g_o2 = self._spread_constants
        y2, _, y22 = ys  # (Y2 >= 1 / m > 0)
        u = np.maximum(y22 / (y2 * y2) - 1.0, 0.0) * scored * scored / heads + width * diag * diag
        if a and e:
            var_n = m * (m - 1.0) / 2.0 * a * (1.0 - a) + m * (m - 1.0) * (m - 2.0) * (b - a * a)
            u = u + 4.0 * var_n / m**4 * (g_v * e * qbar) ** 2
        return g_o2 * u

    @cached_property
    def _spread_constants(self) -> tuple:
        """_spread's numbers of this operation: heads, the Zipf law's (sum p^2, sum p^3) (0 without repeats), the
        finite-width share, g_V and g_O^2 (once per operation: a deep stack's layers share them)."""
        P = self.P
        V = int(P.repeat_vocab)
        a = zipf_repeat_correlation(V) if V else 0.0
        width = 2.0 / (P.kv_heads * P.d_head) + 2.0 / P.d_model if P.d_model else 0.0
        return max(int(P.heads), 1), (a, a * query_token_share(V) if V else 0.0), width, float(P.g_v), float(P.g_o) ** 2

    def spread(self, u, c):
        """The pair and distance engines' spread (spread_forward): the rows' own (the distance state's forward keeps
        its late rows'; ALiBi: the heads' mean), from the cache."""
        if isinstance(c, dz.LateRows):
            return c.spread, c
        if c.heads:
            return sum(w * h.spread(None, hc)[0] for h, hc, w in c.heads), c
        P = self.P
        q, p = c.q_in, c.p_in
        return self._spread((c.y2, c.y3, c.y22), c.y2 * P.g_v * np.maximum(q - p, 0.0), self._keys(P.seq_len),
                            P.repeat_rho, q, c.qa), c

    def _turn(self, delta, T: int):
        """The rotary embedding's coherence of two queries |delta| < T positions apart (attention.rope_distances; 1
        without a rotary embedding), linear between whole distances."""
        P = self.P
        if not P.rope_theta:
            return 1.0
        table = att.rope_distances(int(T), P.d_head, float(P.rope_theta), float(P.rope_fraction))
        return np.interp(np.abs(delta), np.arange(len(table)), table)

    def _own_keys(self, e, qbar, m, n, inside):
        """Two rows whose queries hold one token t have it at their own positions, keys of theirs (the earlier one of
        the later row's too, where `inside`): beyond the mean pair's uniform part, that key pair overlaps e qbar
        (1 - w) more, and each of those keys with the other row's keys e qbar (p_t - w) more, p_t the queries' token's
        probability (repeats.query_token_share), w = sum p^2; rows of m <= n keys, m n key pairs."""
        P = self.P
        if not P.repeat_vocab or not e:
            return 0.0
        w, pt = zipf_repeat_correlation(int(P.repeat_vocab)), query_token_share(int(P.repeat_vocab))
        X = (1.0 - w) + (pt - w) * ((n - 1.0 - inside) + (m - 1.0) * (1.0 + inside))
        return e * np.sqrt(np.multiply.outer(qbar, qbar)) * X / (m * n)

    def _qk_rows(self, bc, lnT, m, qq, spread_k, common_q, spread_v, ys=None):
        """The query/key path's gains per causal row t (t keys), as _qk_gain's (query half a, key half a_key, and the
        root of the column term b per row: two rows t, t' send h_t h_t' Yp / sqrt(Y2 Y2') P_tt' / (t t') to each key
        they share, 1 / (t t') being uniform rows' Jacobian overlap per key) with the row's own geometry and its exact
        E tr(M^2) at t keys (softmax_rows; ys: the rows' moments when the forward kept them)."""
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            s2 = 2.0 * np.divide(self.P.beta, bc) ** 2 * lnT
            jt = gr.jacobian_trace(*(expected_y(np.sqrt(s2), m) if ys is None else ys))
            lam = s2 / np.maximum(spread_k, 1e-300)  # beta^2 ln T qq
            a_q = s2 / qq * spread_v * jt
            a_k = lam * spread_v * jt
            h = np.sqrt(np.maximum(lam / qq * common_q * spread_v * jt * m, 0.0))
        return tuple(np.where(np.isfinite(x), x, 0.0) for x in (a_q, a_k, h))

    def causal_backward(self, G, S, rows):
        """W_O, the causal rows' transpose (causal.mix_backward_rows: row t's moments at its t keys, each key at its
        share of the row's E[A^2], _key_shares), W_V, and the query/key path (_qk_rows, from the rows' geometry the
        forward kept): row t's scores' gradient back through W_Q to its query (a g_t) and through W_K to its keys
        (a_key g_t / t each at the key's share of E[(M^2)_jj] = E[A^2 (1 - 2 A + Y2)], summing to zero over them:
        -1/(t - 1) of it between two keys) and two rows' scores' gradients through the queries' common part (h, as
        often as the rows overlap). The bidirectional map's cross-moment terms of the path (_qk_gain's x and the column term's -b gp /
        (T - 1)) are left out here: one causal operation's gp is within 4% of the numpy network without them, 7-46%
        high with both, 7-25% low with x alone (test_causal)."""
        P = self.P
        if P.centered:
            raise ValueError("the position-resolved backward has no centered rows")
        g_o, g_v, drop = float(P.g_o), float(P.g_v), float(P.attn_dropout)
        g = g_o * S.qf
        if rows.weights is not None:
            return self._alibi_backward(S, rows, g, g_o * S.P)
        a, a_key, h = self._qk_rows(rows.beta_c, *rows.qk)
        if rows.field is not None and rows.key_half is None:  # (the first backward: every later one reads it)
            rows.key_half = self._key_half(G, *rows.field) or ()
        if rows.key_half:
            a_key = a_key * rows.key_half[0]
        e, ek = a * g, a_key * g  # row t's query half, and its key half over its keys
        Pg = g_o * S.P
        if rows.keys is None:  # causal rows over all keys, on position groups
            m, hc = G.m, cz.gmean(G, h)
            v_share, k_share = (None, None) if rows.shares is None else rows.shares[1:]
            if rows.key_half:
                k_share = rows.key_half[1]
            B = cz.mix_backward_rows(G, cz.State(g, Pg), rows.y2, drop, rows.shared, v_share)
            Zh = Pg * np.multiply.outer(hc, hc) * rows.overlap * ~np.diag(G.single)
            cols = cz.pair_suffix(G, Zh, 1.0 / m)[0]
            with np.errstate(invalid="ignore", divide="ignore"):
                kd, kp = cz.row_sums(G, ek / m, np.where(m > 1, -ek / (m * (m - 1.0)), 0.0), k_share)
        else:  # windows and bidirectional rows, position by position
            lo, hi, w = rows.keys
            hc = h
            n = cz.shared_keys(lo, hi)
            sy = np.sqrt(rows.y2)
            fl = rows.overlap * np.multiply.outer(sy, sy) - n / np.multiply.outer(w, w)  # Yp beyond uniform rows'
            B = cz.mix_backward_window(cz.State(g, Pg), rows.y2, drop, *rows.keys, (fl, n))
            cols = cz.window_column_sums(Pg * np.multiply.outer(hc, hc) * rows.overlap, *rows.keys)
            with np.errstate(invalid="ignore", divide="ignore"):
                kd, kp = cz.window_sums(ek / w, np.where(w > 1, -ek / (w * (w - 1.0)), 0.0), *rows.keys[:2])
        if rows.structure is not None:  # the query half over the keys' structure (skipped where it cannot show)
            if rows.phi is None:
                rows.phi = 1.0
                if e.sum() > 1e-5 * g_v * B.qf.sum():
                    rows.phi = self._key_structure(G, cz.row_std(P.beta, rows.beta_c, rows.qk[0]), *rows.structure)
            e = e * rows.phi
        qk = e + kd + cols
        total = g_v * B.qf + qk
        rows.qk_share = float(_path_share(qk.sum(), total.sum()))
        return cz.State(total, g_v * B.P + kp)

    def _causal_alibi(self, G, S):
        """ALiBi's rows at full resolution: head h's row t weighs key s by W_ts ~ e^(-m_h (t - s)) (attention.alibi_rows)
        times the logits' random part, a REM at the row's effective keys n_t = 1 / sum_s W_ts^2 (Y2 = e^v / n_t in the
        uniform phase). Row t's mixing moments E A_ts A_ts' are W_ts W_ts' c_t off the diagonal, c_t = (E (sum A)^2 -
        E sum A^2) / (1 - 1 / n_t), and W_ts^2 d_t n_t on it (d_t = E sum_s A_ts^2): `_alibi_mixing`; two rows' weights
        are taken as deterministic (the random parts' overlap beyond them left out: the uniform phase's). The output is
        the heads' mean; the query/key path as _qk_rows' at n_t keys, its key half spread over the keys by W^2."""
        P, T = self.P, G.T
        if not G.single.all():
            raise ValueError("ALiBi rows need the full-resolution state (single=T)")
        lnT = math.log(P.seq_len) if np.isfinite(P.seq_len) else math.log(T)
        W = att.alibi_rows(T, P.heads, float(P.alibi))
        C = S.P.copy()
        C[np.diag_indices(T)] = S.qf
        w2 = np.einsum("hts,hts->ht", W, W)
        n = 1.0 / w2
        U = np.matmul(np.matmul(W, C), W.transpose(0, 2, 1))  # sum_{s, s'} W_ts W_t's' C_ss'
        own = (W * W) @ S.qf  # sum_s W_ts^2 q_s
        qbar, tot = W @ S.qf, np.einsum("htt->ht", U)
        with np.errstate(invalid="ignore", divide="ignore"):
            pbar = np.where(w2 < 1.0, (tot - own) / (1.0 - w2), qbar)
        qb = float(P.q_bias)
        qq = S.qf + qb
        bc = self._qk_normed_beta_c(qbar, pbar, qq) if P.qk_norm != "none" else att.beta_c(qbar, pbar, qq)
        y2, v = (x.reshape(n.shape) for x in cz.row_statistics(P.beta, bc.ravel(), lnT, n.ravel())[:2])
        d, c = _alibi_mixing(y2, w2, float(P.attn_dropout))
        g_v, b_v2 = float(P.g_v), float(P.b_v2)
        gap = g_v * np.maximum(qbar - pbar, 0.0)
        # two rows' random parts overlap on the keys they share as the windows' (Yp = e^(rho_q v) x the shared weight)
        sh = np.matmul(W, W.transpose(0, 2, 1))  # sum_s W_ts W_t's
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            rho_q = np.clip(np.nan_to_num((S.P + qb) / np.sqrt(np.multiply.outer(qq, qq))), -1.0, 1.0)
            sv, sy = np.sqrt(v), np.sqrt(y2)
            beyond = np.minimum(np.exp(rho_q * sv[:, :, None] * sv[:, None, :]) * sh,
                                sy[:, :, None] * sy[:, None, :]) - sh
        beyond[:, np.arange(T), np.arange(T)] = 0.0
        t = np.arange(T)
        out = (g_v * U + b_v2 + beyond * gap[:, np.minimum.outer(t, t)]).mean(0)
        rep = self._repeats(bc.ravel(), lnT, n.ravel(), qbar.ravel(), pbar.ravel())  # at each row's effective keys
        if np.ndim(rep):
            rep = rep.reshape(n.shape)
        diag = (c * (g_v * tot + b_v2) + (d * n - c) * (g_v * own + b_v2 * w2) + rep).mean(0)
        out[np.diag_indices(T)] = 0.0
        O = cz.State(*linear(diag, out, float(P.g_o), float(P.b_o2)))
        with np.errstate(invalid="ignore", divide="ignore"):
            F = np.where(sh > 0, beyond / sh, 0.0)
        qk = (lnT, n, qq, qbar - pbar, pbar + qb, gap)
        return O, cz.AttentionRows(y2.mean(0), bc.mean(0), O.qf, qk, weights=(W, d, c, w2, F))

    def _alibi_backward(self, S, rows, g, Pg):
        """The transpose of _causal_alibi's rows, per head, then the heads' mean: key s, s' get sum_{t, t'} W_ts W_t's'
        of the gradient's moments, row t's own with c_t g_t (and W_ts^2 (d_t n_t - c_t) g_t on the diagonal); the
        query half a g_t, the key half a_key g_t over the keys by W_ts^2 / sum W_t^2."""
        W, d, c, w2, F = rows.weights
        T = len(g)
        Gm = np.broadcast_to(Pg, (W.shape[0], T, T)).copy()
        idx = np.arange(T)
        Gm[:, idx, idx] = c * g
        B = np.matmul(np.matmul(W.transpose(0, 2, 1), Gm), W)
        Bd = np.einsum("hss->hs", B) + np.einsum("hts,ht->hs", W * W, (d / w2 - c) * g)
        Bd += (W * np.matmul(Pg * F, W)).sum(1)  # the rows' overlap beyond their weights, on the keys they share
        a, a_key, _ = self._qk_rows(rows.beta_c, *(x.mean(0) if np.ndim(x) == 2 else x for x in rows.qk))
        kd = np.einsum("hts,t->s", W * W / w2[:, :, None], a_key * g) / W.shape[0]
        qk = a * g + kd
        g_v = float(self.P.g_v)
        Bp = B.mean(0)
        Bp[idx, idx] = 0.0
        total = g_v * Bd.mean(0) + qk
        rows.qk_share = float(_path_share(qk.sum(), total.sum()))
        return cz.State(total, g_v * Bp)

    def _causal_window(self, G, S):
        """Row m attends to the keys K_m = [lo_m, hi_m] (w_m of them): [m - window + 1, m] causal, within window // 2
        both ways (or all keys) bidirectional; at full resolution (every position its own group,
        causal.propagate_overlaps(single=T)): the terms of `causal` with box sums of the overlap matrix over
        K_m x K_n in place of prefix sums, and the shared keys |K_m & K_n| in place of min(m, n)."""
        P, T = self.P, G.T
        if not G.single.all():
            raise ValueError("windowed or bidirectional rows need the full-resolution state (single=T)")
        lnT = math.log(P.seq_len) if np.isfinite(P.seq_len) else math.log(T)
        qf = S.qf
        C = S.P.copy()
        C[np.diag_indices(T)] = qf
        box = np.zeros((T + 1, T + 1))
        np.cumsum(np.cumsum(C, axis=0), axis=1, out=box[1:, 1:])
        t = np.arange(T)
        if P.causal:
            lo, hi = np.maximum(t - P.window + 1, 0), t
        else:
            half = P.window // 2 if P.window else T
            lo, hi = np.maximum(t - half, 0), np.minimum(t + half, T - 1)
        w = (hi - lo + 1).astype(float)

        def boxed(B):  # sum of B's prefix-summed matrix over K_m x K_n
            return B[hi + 1][:, hi + 1] - B[lo][:, hi + 1] - B[hi + 1][:, lo] + B[lo][:, lo]

        tot = boxed(box)  # sum_{s in K_m, s' in K_n} C[s, s']
        csum = np.concatenate([[0.0], np.cumsum(qf)])
        trace = csum[hi + 1] - csum[lo]
        qbar = trace / w
        with np.errstate(invalid="ignore", divide="ignore"):
            pbar = np.where(w > 1, (np.diag(tot) - trace) / (w * np.maximum(w - 1.0, 1.0)), qbar)
        qb = float(P.q_bias)
        qq = qf + qb
        kbar = pbar  # consecutive keys, w_m of them
        if P.rope_theta:
            kbar = pbar * att.rope_rows(T, P.d_head, P.rope_theta, P.rope_fraction)[w.astype(int) - 1]
        bc = self._qk_normed_beta_c(qbar, kbar, qq) if P.qk_norm != "none" else att.beta_c(qbar, kbar, qq)
        y2, v, ys = cz.row_statistics(P.beta, bc, lnT, w)
        g_v, b_v2 = float(P.g_v), float(P.b_v2)
        gap_v = g_v * np.maximum(qbar - pbar, 0.0)  # values are not turned
        keep = 1.0 - float(P.attn_dropout)
        shared = cz.shared_keys(lo, hi) / np.multiply.outer(w, w)
        rho_q = (S.P + qb) / np.sqrt(np.multiply.outer(qq, qq))
        sv, sy = np.sqrt(v), np.sqrt(y2)
        yp = np.minimum(np.exp(rho_q * np.multiply.outer(sv, sv)) * shared, np.multiply.outer(sy, sy))
        gap_mn = gap_v[np.minimum.outer(t, t)] if P.causal else 0.5 * np.add.outer(gap_v, gap_v)
        out = (yp - shared) * gap_mn + (g_v * tot + b_v2 * np.multiply.outer(w, w)) / np.multiply.outer(w, w)
        diag = np.diag(out) + (y2 - 1.0 / w) * gap_v - (np.diag(yp) - 1.0 / w) * gap_v \
            + (1.0 / keep - 1.0) * y2 * (g_v * qbar + b_v2)
        rep = self._repeats(bc, lnT, w, qbar, kbar)
        diag += rep
        R = None
        if S.R is not None:  # two rows whose queries hold one token, as causal()'s
            delta = np.subtract.outer(t, t)
            rho_r = (S.R + qb) / np.sqrt(np.multiply.outer(qq, qq)) * self._turn(delta, T)
            yp_r = np.minimum(np.exp(rho_r * np.multiply.outer(sv, sv)) * shared, np.multiply.outer(sy, sy))
            lo_w, hi_w = np.minimum.outer(w, w), np.maximum.outer(w, w)
            R = out + (yp_r - yp) * gap_mn + g_v * self._own_keys(_token_share(G, S), qbar, lo_w, hi_w,
                                                                  (np.abs(delta) < hi_w).astype(float))
        two = None if P.centered else self._two_rows(bc, lnT, w, qbar, kbar, P.repeat_rho, w)
        out, R = self._weigh_copies(two, qbar, shared, P.repeat_rho, out, R, None if R is None else rho_r)
        e = P.repeat_rho if S.R is None else _token_share(G, S)
        O = self._output(diag, out, R, np.diag_indices(T), S.w, self._spread(ys, y2 * gap_v + rep, w, e, qbar, diag))
        qk = (lnT, w, qq, qbar - kbar, kbar + qb, g_v * np.maximum(qbar - pbar, 0.0), ys)
        return O, cz.AttentionRows(y2, bc, O.qf, qk, overlap=yp / np.multiply.outer(sy, sy), keys=(lo, hi, w))

    def distances(self, q, c):
        """Late rows on the distance-resolved state (distances.py): _causal_window's terms with C[m, n] = c(|m - n|).
        A window's rows (n keys) overlap on the n x n key pairs of two rows delta apart (a triangle kernel) and share
        n - delta keys; rows over all keys (a global layer; causal ones as the late rows, all T keys) see the same
        sum and share every key. Rows of fewer keys (the first positions) get their own Y2, beta_c and output
        variance from the same profile (reported per position; the state keeps the late rows')."""
        P = self.P
        if P.alibi:  # the heads' mean, each as a window of its effective keys (_alibi_heads)
            heads = self._alibi_heads
            outs = [h.distances(q, c) for h, _ in heads]
            mean = lambda x: sum(w * v for (_, w), v in zip(heads, x))  # noqa: E731
            rows = dz.LateRows(*(mean([getattr(o[2], k) for o in outs]) for k in ("y2", "beta_c", "var")),
                               heads=tuple((h, o[2], w) for (h, w), o in zip(heads, outs)))
            return mean([o[0] for o in outs]), mean([o[1] for o in outs]), rows
        T = c.size + 1
        lnT = math.log(P.seq_len) if np.isfinite(P.seq_len) else math.log(T)
        t = np.arange(T)
        if P.causal:
            n = int(min(P.window, T)) if P.window else T
            w = np.minimum(t + 1, n)
        else:
            h = P.window // 2 if P.window else T
            n = min(2 * h + 1, T)
            w = np.minimum(t, h) + np.minimum(T - 1 - t, h) + 1
        ms, at = np.unique(w, return_inverse=True)  # row sizes; the last is the late rows' (n keys)
        pbar = np.where(ms > 1, dz.pair_means(c, ms), q)
        kbar = pbar * att.rope_rows(T, P.d_head, P.rope_theta, P.rope_fraction)[ms - 1] if P.rope_theta else pbar
        qb = float(P.q_bias)
        qq = q + qb
        bc = self._qk_normed_beta_c(q, kbar, qq) if P.qk_norm != "none" else att.beta_c(q, kbar, qq)
        y2, v, ys = cz.row_statistics(P.beta, bc, lnT, ms.astype(float))
        g_v, b_v2, keep = float(P.g_v), float(P.b_v2), 1.0 - float(P.attn_dropout)
        gap = g_v * np.maximum(q - pbar, 0.0)
        rep = self._repeats(bc[at], lnT, w.astype(float), np.full(T, q), kbar[at]) + np.zeros(T)  # per position
        var = (g_v * (ms * q + ms * (ms - 1.0) * pbar) / ms**2 + b_v2 + (y2 - 1.0 / ms) * gap
               + (1.0 / keep - 1.0) * y2 * (g_v * q + b_v2))[at] + rep
        d = np.arange(1, T)
        if n < T:
            tot = dz.triangle_sums(q, c, n)
            shared = np.maximum(n - d, 0) / float(n * n)
        else:
            tot = np.full(T, T * q + T * (T - 1.0) * pbar[-1])
            shared = np.full(T - 1, 1.0 / T)
        yp = np.minimum(np.exp((c + qb) / qq * v[-1]) * shared, y2[-1])
        out = (yp - shared) * gap[-1] + g_v * tot[1:] / float(n * n) + b_v2
        two = None if P.centered else self._two_rows(bc[at], lnT, w.astype(float), np.full(T, q), kbar[at],
                                                     P.repeat_rho, n)  # the late rows' (n keys)
        if two is not None:
            a, b, _ = (float(y[0, 0]) for y in two)
            out += g_v * (q * a * shared + P.repeat_rho * q * b)
        late = float(var[np.argmax(w)])
        qo, po = linear(late, out, float(P.g_o), float(P.b_o2))
        qk = (lnT, float(n), qq, q - kbar[-1], kbar[-1] + qb, g_v * max(q - pbar[-1], 0.0), tuple(y[-1] for y in ys))
        u = self._spread(qk[6], qk[6][0] * qk[5], float(n), P.repeat_rho, q, late)
        return qo, po, dz.LateRows(y2[at], bc[at], linear(var, 0.0, float(P.g_o), float(P.b_o2))[0], n, n < T,
                                   float(y2[-1]), float(bc[-1]), yp - shared, yp / y2[-1], qk, spread=u)

    def distances_backward(self, gq, gp, rows):
        """causal_backward's window branch on the distance-resolved state: every late key is read by n late rows
        (a global layer: by all T), so the rows' transpose (cz.mix_backward_window) and the query/key path's
        window sums become sums over distances: two keys delta apart have n - delta common readers, and the
        readers of two keys form two n-blocks delta apart (the forward's triangle kernel)."""
        P = self.P
        if rows.heads:  # ALiBi: the heads' mean
            grads = [h.distances_backward(gq, gp, hr) for h, hr, _ in rows.heads]
            rows.qk_share = sum(w * hr.qk_share for _, hr, w in rows.heads)
            return (sum(w * g[0] for (_, _, w), g in zip(rows.heads, grads)),
                    sum(w * g[1] for (_, _, w), g in zip(rows.heads, grads)))
        g_o, g_v, drop = float(P.g_o), float(P.g_v), float(P.attn_dropout)
        g, Pg = g_o * gq, g_o * gp
        n, T = rows.n, gp.size + 1
        blocks = dz.BlockSums(n, T, rows.local)
        dd, _, s2, _ = att.mixing(rows.y2_late, 0.0, 1.0, False, drop)
        a, a_key, h = (float(x) for x in self._qk_rows(rows.bc_late, *rows.qk))
        # the value path: the late rows' transpose (mix_backward_window), its shared-key part (Z, Z2)
        d = np.arange(1, T)
        common = blocks.common(d)  # readers two keys delta apart share
        with np.errstate(divide="ignore", invalid="ignore"):
            Z = np.where(common > 0, Pg * rows.fl / common, 0.0)
            Z2 = np.where(common > 1, Z / (common - 1.0), 0.0)
        X = blocks.pairs(Pg) / float(n * n)
        diag = dd * g + X[0] + blocks.pairs(Z)[0]
        out = common * (s2 - dd) * g / (n * (n - 1.0)) + X[1:] - blocks.within(Z2, common)
        if P.causal and not rows.local:  # causal rows over all keys: key s is read by rows t >= s of t keys each,
            # the late-token pair's column moments (att.mix_backward) on the pairs' mean, as no key is a late one
            mom = att.mixing(rows.y2_late, rows.y2_late * float(dz.pair_means(rows.overlap, [T])[0]), T, False, drop)
            col = att.causal_column_scale(P.beta / rows.bc_late * math.sqrt(2.0 * rows.qk[0]), T)
            diag, out = att.mix_backward(g, float(dz.pair_means(Pg, [T])[0]), mom, T, col)
            out = np.full(T - 1, out)
        # the query/key path: the query half, the key half over the row's keys, the queries' common part
        ek = a_key * g
        qk = a * g + ek + blocks.pairs(Pg * h * h * rows.overlap)[0] / float(n * n)
        total = g_v * diag + qk
        rows.qk_share = float(_path_share(qk, total))
        return total, g_v * out - common * ek / (n * (n - 1.0))

    def draws(self):
        """(name, shape, std, phase): matrices, then biases (phase 1); a zero bias std draws no bias."""
        P, d = self.P, self.P.d_model
        qw, kvw = P.heads * P.d_head, P.kv_heads * P.d_head
        mats = ("q", (d, qw)), ("k", (d, kvw)), ("v", (d, kvw))
        mats += (("o", (qw, d)),) if P.out_proj else ()
        out = [("w" + m, shape, P.init[m][0], 0) for m, shape in mats]
        return out + [("b" + m, shape[1:], P.init[m][1], 1) for m, shape in mats if P.init[m][1] > 0]

    def forward(self, u, W, rng):
        P, w = self.P, W[id(self)]
        B, T, d = u.shape
        H, KV, dh = P.heads, P.kv_heads, P.d_head
        G = H // KV
        # head h = kv * G + g uses K/V head kv (consecutive heads share, like repeat_interleave)
        q, qn = self._qk_norm(_lin(u, w["wq"], w.get("bq")))
        k, kn = self._qk_norm(_lin(u, w["wk"], w.get("bk")))
        q, k = self._rope(q), self._rope(k)
        q = q.reshape(B, T, KV, G, dh).transpose(0, 2, 3, 1, 4).reshape(B, KV, G * T, dh)
        k = k.reshape(B, T, KV, dh).transpose(0, 2, 1, 3)
        v = _lin(u, w["wv"], w.get("bv")).reshape(B, T, KV, dh).transpose(0, 2, 1, 3)
        s = _bmm(q, k.transpose(0, 1, 3, 2))  # (B, KV, G*T, T)
        s *= s.dtype.type(P.softmax_scale)
        s = s.reshape(B, KV, G, T, T)
        if P.causal or P.window:
            s += _mask_bias(T, P.causal, P.window, s.dtype)
        if P.alibi:  # head kv * G + g: minus m_h (t - s)
            s += _alibi_bias(T, H, s.dtype, P.alibi).reshape(KV, G, T, T)
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(-1, keepdims=True)
        a = s.reshape(B, KV, G * T, T)
        y2 = np.einsum("bkrt,bkrt->b", a, a, dtype=np.float64) / (H * T)
        ad, mask = dropout(a, P.attn_dropout, rng)
        o = _bmm(ad, v)  # (B, KV, G*T, dh)
        del ad
        if P.centered:
            o = o.reshape(B, KV, G, T, dh)
            if P.causal:
                o -= (np.cumsum(v, axis=2) / _counts(T, v.dtype)[:, None])[:, :, None]
            else:
                o -= v.mean(axis=2, keepdims=True)[:, :, None]
        o = o.reshape(B, KV, G, T, dh).transpose(0, 3, 1, 2, 4).reshape(B, T, H * dh)
        y = _lin(o, w["wo"], w.get("bo")) if P.out_proj else o
        return y, {"u": u, "q": q, "k": k, "v": v, "a": a, "mask": mask, "y2": y2, "qn": qn, "kn": kn}

    def _qk_normed_beta_c(self, q, p, qq):
        """beta_c after a QK-norm: queries and keys of per-coordinate variance a = g q / (g q + eps) (1 when the
        projection's variance g q dwarfs eps), keys at the input's correlation p / q."""
        P = self.P
        a_k = P.g_k * q / (P.g_k * q + P.norm_eps)
        return att.beta_c(a_k, a_k * p / q, P.g_q * qq / (P.g_q * qq + P.norm_eps))

    def _rope(self, x, inverse: bool = False):
        """Rotary embedding of projected queries or keys (B, T, heads x d_head), position t = 0..T-1: rotate_half on
        each head's first rope_dims coordinates; `inverse` turns back (the backward of an orthogonal map)."""
        P = self.P
        if not P.rope_theta:
            return x
        B, T, width = x.shape
        cos, sin = att.rope_angles(T, P.d_head, P.rope_theta, P.rope_fraction)
        h = cos.shape[1]
        if h == 0:
            return x
        cos, sin = cos.astype(x.dtype)[:, None], (-sin if inverse else sin).astype(x.dtype)[:, None]
        y = x.reshape(B, T, width // P.d_head, P.d_head).copy()
        x1, x2 = y[..., :h].copy(), y[..., h:2 * h].copy()
        y[..., :h] = x1 * cos - x2 * sin
        y[..., h:2 * h] = x2 * cos + x1 * sin
        return y.reshape(x.shape)

    def _qk_norm(self, x):
        """The QK-norm of projected queries or keys (B, T, width): per head of d_head, or over the whole width."""
        P = self.P
        if P.qk_norm == "none":
            return x, None
        shape = (*x.shape[:2], -1, P.d_head) if P.qk_norm == "head" else x.shape
        y, c = Norm(P.norm_type, P.norm_eps).forward(x.reshape(shape), None, None)
        return y.reshape(x.shape), (shape, c)

    def _qk_norm_backward(self, dy, cache):
        if cache is None:
            return dy
        shape, c = cache
        return Norm(self.P.norm_type, self.P.norm_eps).backward(dy.reshape(shape), None, c, None).reshape(dy.shape)

    def backward(self, dy, W, c, wgrads):
        P, w = self.P, W[id(self)]
        B, T, d = dy.shape
        H, KV, dh = P.heads, P.kv_heads, P.d_head
        G = H // KV
        do = dy @ w["wo"].T if P.out_proj else dy
        do = do.reshape(B, T, KV, G, dh).transpose(0, 2, 3, 1, 4).reshape(B, KV, G * T, dh)
        q, k, v, a, mask = c["q"], c["k"], c["v"], c["a"], c["mask"]
        pa = P.attn_dropout
        ad = a if mask is None else a * mask * a.dtype.type(1.0 / (1.0 - pa))
        dv = _bmm(ad.transpose(0, 1, 3, 2), do)  # (B, KV, T, dh)
        del ad
        if P.centered:
            rows = do.reshape(B, KV, G, T, dh).sum(2)  # (B, KV, T, dh)
            if P.causal:
                rows /= _counts(T, rows.dtype)[:, None]
                dv -= np.cumsum(rows[:, :, ::-1], axis=2)[:, :, ::-1]
            else:
                dv -= rows.sum(2, keepdims=True) / T
        da = _bmm(do, v.transpose(0, 1, 3, 2))  # (B, KV, G*T, T)
        if mask is not None:
            da *= mask
            da *= da.dtype.type(1.0 / (1.0 - pa))
        da -= (da * a).sum(-1, keepdims=True)
        da *= a
        da *= da.dtype.type(P.softmax_scale)  # dS
        dq = _bmm(da, k)  # (B, KV, G*T, dh)
        dk = _bmm(da.transpose(0, 1, 3, 2), q)  # (B, KV, T, dh)
        del da
        dq = dq.reshape(B, KV, G, T, dh).transpose(0, 3, 1, 2, 4).reshape(B, T, H * dh)
        dk = dk.transpose(0, 2, 1, 3).reshape(B, T, KV * dh)
        dq, dk = self._rope(dq, inverse=True), self._rope(dk, inverse=True)
        dq, dk = self._qk_norm_backward(dq, c["qn"]), self._qk_norm_backward(dk, c["kn"])
        dv = dv.transpose(0, 2, 1, 3).reshape(B, T, KV * dh)
        if wgrads is not None:
            ut = c["u"].transpose(0, 2, 1)
            for name, g in (("wq", dq), ("wk", dk), ("wv", dv)):
                gw = _bmm(ut, g)  # per-sequence weight gradient (B, d, width)
                wgrads[name].append(np.einsum("bij,bij->b", gw, gw, dtype=np.float64))
        return dq @ w["wq"].T + dk @ w["wk"].T + dv @ w["wv"].T

    def torch_build(self, make, d: int):
        from torch import nn

        P, kv, qw = self.P, self.P.kv_heads * self.P.d_head, self.P.heads * self.P.d_head
        mods = {m: _torch_linear(d, width, *P.init[m]) for m, width in (("q", qw), ("k", kv), ("v", kv))}
        mods["o"] = _torch_linear(qw, d, *P.init["o"]) if P.out_proj else nn.Identity()
        mods["attn_drop"] = nn.Dropout(P.attn_dropout)
        if P.qk_norm != "none":
            kind = nn.RMSNorm if P.norm_type == "rmsnorm" else nn.LayerNorm
            mods.update({f"{m}_norm": kind(P.d_head if P.qk_norm == "head" else width, eps=P.norm_eps,
                                            elementwise_affine=False) for m, width in (("q", qw), ("k", kv))})
        return mods

    def torch_forward(self, m, u):
        import torch

        P, (B, T, d) = self.P, u.shape
        h, g = P.heads, P.heads // P.kv_heads
        q, k = m.q(u), m.k(u)
        if P.qk_norm == "all":
            q, k = m.q_norm(q), m.k_norm(k)
        q, k = q.view(B, T, h, P.d_head), k.view(B, T, P.kv_heads, P.d_head)
        if P.qk_norm == "head":
            q, k = m.q_norm(q), m.k_norm(k)
        if P.rope_theta:
            q, k = _torch_rope(q, P), _torch_rope(k, P)
        q = q.transpose(1, 2)
        k = k.transpose(1, 2).repeat_interleave(g, dim=1)
        v = m.v(u).view(B, T, P.kv_heads, P.d_head).transpose(1, 2).repeat_interleave(g, dim=1)
        scores = (q @ k.transpose(-1, -2)) * P.softmax_scale
        mask = torch.from_numpy(np.isfinite(_mask_bias(T, P.causal, P.window, np.float64))).to(u.device) \
            if P.causal or P.window else None
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        if P.alibi:
            scores = scores + torch.as_tensor(_alibi_bias(T, h, np.float64, P.alibi), dtype=scores.dtype,
                                              device=u.device)
        out = m.attn_drop(scores.softmax(-1)) @ v
        if P.centered:  # subtract the values' mean over the attended keys
            w = mask.to(v.dtype) if mask is not None else torch.ones(T, T, dtype=v.dtype, device=u.device)
            out = out - (w / w.sum(-1, keepdim=True)) @ v
        return m.o(out.transpose(1, 2).reshape(B, T, h * P.d_head))


def _ordered_pairs(n: np.ndarray) -> np.ndarray:
    """Per pair of groups of n keys: their ordered pairs of distinct keys (n_g n_h; n (n - 1) within a group)."""
    pairs = np.multiply.outer(n, n)
    pairs[np.diag_indices(len(n))] = n * (n - 1.0)
    return pairs


def _pair_means(n: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Two distinct keys' mean overlap per pair of groups of n keys from its ordered pairs' summed overlaps (0 where
    there are none)."""
    pairs = _ordered_pairs(n)
    return np.where(pairs > 0, sums / np.maximum(pairs, 1.0), 0.0)


def _field_of(n: np.ndarray, sums: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys' field over groups of n keys, as softmax_rows.field_rows_y2 takes it: two distinct keys' mean score
    overlap per pair of groups (a one-key group's own q on the diagonal) and a key's own part beyond its group's common
    one, from the ordered pairs' summed overlaps and a key's q per group."""
    F = _pair_means(n, sums)
    single = n == 1
    own = np.where(single, 0.0, np.maximum(q - np.diag(F), 0.0))
    F[np.diag_indices(len(n))] = np.where(single, q, np.diag(F))
    return F, own


class _FieldLaw(NamedTuple):
    """Attention._field_law's statistics: per row (own) and per pair of position groups (the rest)."""
    own: np.ndarray  # a row's own output beyond uniform rows'
    y0: np.ndarray  # two rows' overlap sum_j A_j B_j beyond uniform rows', independent queries
    y1: np.ndarray  # ... one query
    slope: np.ndarray  # its slope in the queries' correlation at independent queries
    mean: np.ndarray  # their output overlap's means' part beyond uniform rows'
    same1: np.ndarray  # the weights' covariance on one key, sum_j C_jj Cov(A_j, B_j), at one query
    same_slope: np.ndarray  # ... its slope at independent queries
    cross1: np.ndarray  # on two keys, sum_(j != k) C_jk Cov(A_j, B_k), at one query
    cross_slope: np.ndarray  # ... its slope at independent queries
    base: float  # the values' reference in these: their mean pair overlap


def _between(top, slope, shape, shape_step, rc):
    """A two-row statistic beyond its value at independent queries, at the queries' correlation rc: `top` at one
    query along the i.i.d. pair shape, plus lambda rc (1 - rc) that makes its slope at independent queries `slope`
    (shape_step: the shape at _SLOPE_STEP)."""
    return top * shape + (slope - top * shape_step / _SLOPE_STEP) * rc * (1.0 - rc)


def _bilinear(x: np.ndarray, V: np.ndarray, at: np.ndarray) -> np.ndarray:
    """V (values at x x x, x increasing) at every pair of points of `at`, bilinear (held beyond x's ends)."""
    u = np.clip(np.interp(at, x, np.arange(len(x), dtype=float)), 0.0, len(x) - 1.0)
    i = np.minimum(u.astype(int), max(len(x) - 2, 0))
    f = u - i
    j = np.minimum(i + 1, len(x) - 1)
    rows = V[i] * (1.0 - f)[:, None] + V[j] * f[:, None]
    return rows[:, i] * (1.0 - f)[None, :] + rows[:, j] * f[None, :]


def _path_share(qk, total):
    """The query/key path's share of a gradient's total, in [0, 1]; 0 where there is no gradient, or where it reached the
    overflow clamp (inf / inf: no share to report)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.divide(qk, total)
    return np.where((np.asarray(total) > 0) & np.isfinite(share), np.clip(share, 0.0, 1.0), 0.0)


def _alibi_mixing(y2, w2, drop: float):
    """A weighted row's (d, c): E sum_s A_ts^2 (with attention dropout) and the factor of W_ts W_ts' in E A_ts A_ts'
    (s != s'), (E (sum_s A_ts)^2 - d) / (1 - sum_s W_ts^2); 0 for a row of one key."""
    d, _, s2, _ = att.mixing(y2, 0.0, 1.0, False, drop)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(w2 < 1.0, (s2 - d) / (1.0 - w2), 0.0)
    return d, c


def _torch_rope(x, P: BlockParams):
    """Attention._rope on (B, T, heads, d_head) in PyTorch."""
    import torch

    cos, sin = att.rope_angles(x.shape[1], P.d_head, P.rope_theta, P.rope_fraction)
    h = cos.shape[1]
    cos, sin = (torch.as_tensor(a, dtype=x.dtype, device=x.device)[:, None] for a in (cos, sin))
    x1, x2 = x[..., :h], x[..., h:2 * h]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * h:]], dim=-1)


@lru_cache(maxsize=16)
def _alibi_bias(T: int, heads: int, dtype, scale: float = 1.0) -> np.ndarray:
    """(heads, T, T): ALiBi's -m_h (t - s) on every logit (the causal mask removes s > t)."""
    t = np.arange(T, dtype=float)
    return (-att.alibi_slopes(heads, scale)[:, None, None] * (t[:, None] - t[None, :])).astype(dtype)


def _mask_bias_cached(T: int, causal: bool, window: int, dtype: str) -> np.ndarray:
    t = np.arange(T)
    d = t[:, None] - t[None, :]  # query - key
    keep = (d >= 0) if causal else np.ones((T, T), dtype=bool)
    if window:
        keep &= (d < window) if causal else (np.abs(d) <= window // 2)
    return np.where(keep, 0.0, -np.inf).astype(dtype)


def _mask_bias(T: int, causal: bool, window: int, dtype) -> np.ndarray:
    """0 where a query sees a key (causal: keys up to it; a sliding window: its last `window`, or within window // 2
    both ways), -inf elsewhere."""
    return _mask_bias_cached(T, bool(causal), int(window), np.dtype(dtype).str)


def _counts(T: int, dtype: np.dtype) -> np.ndarray:
    return np.arange(1, T + 1, dtype=dtype)


@dataclass(frozen=True)
class MLP:
    """act(u W1 + b1) W2 + b2; gated (SwiGLU / GeGLU): (act(u W_gate + b_gate) * (u W_up + b_up)) W_down + b_down."""

    P: BlockParams

    def moments(self, q, p):
        """001 eq. 16 generalised by kernels; gated: independent gate and up projections."""
        P = self.P
        q1, p1 = linear(q, p, P.g_1, P.b_12)
        kq, kp = kernels.forward(P.activation, q1, p1)
        if P.activation in GATED:
            kq, kp = kq * q1, kp * p1
        q2, p2 = linear(kq, kp, P.g_2, P.b_22)
        return q2, p2, (q1, p1)

    def distances(self, q, c):
        """The distance-resolved state: one variance, T - 1 overlaps."""
        return self.moments(q, c)

    def distances_backward(self, gq, gp, cache):
        return self.moments_backward(gq, gp, cache)

    def moments_backward(self, gq, gp, cache):
        P = self.P
        q1, p1 = cache
        gq, gp = P.g_2b * gq, P.g_2b * gp
        dq, dp = kernels.backward(P.activation, q1, p1)
        if P.activation in GATED:
            kq, kp = kernels.forward(P.activation, q1, p1)
            dq, dp = dq * q1 + kq, dp * p1 + kp  # gate path + up path
        return P.g_1b * dq * gq, P.g_1b * dp * gp

    def causal(self, G, S):
        P = self.P
        C1 = cz.State(*linear(S.qf, S.P, float(P.g_1), float(P.b_12)))
        kd = cz.self_kernel(P.activation, C1.qf)
        ko = cz.cross_kernel(P.activation, cz.gmean(G, C1.qf), C1.P)
        out = kd, ko
        if P.activation in GATED:
            out = kd * C1.qf, ko * C1.P
        O = cz.State(*linear(*out, float(P.g_2), float(P.b_22)))
        cache = C1, kd, None if len(G.n) == G.T else ko  # (at full resolution the backward computes ko again)
        if not P.d_ff:
            return O, cache
        rel = None if S.u is None else S.u / (S.qf * S.qf)  # (q > 0: floored at 1 / HUGE)
        qg = cz.gmean(G, C1.qf)  # per group: the spread's law at its mean q (positions of a group alike)
        a, b = (x[G.gid] for x in self._unit_spread(qg))
        return replace(O, u=a + (0.0 if rel is None else b * rel)), cache

    def _unit_spread(self, q1):
        """(a, b): the variance of a token's output mean square between sequences is a + b (u / q^2) for an input of
        spread u, every engine's: at finite width the d_ff units' squares average with relative variance Var f /
        (d_ff (E f)^2) (on a normalised input the units' cross terms cancel to leading order) and W_2 adds 2 / d; the
        input's relative spread passes with the kernel's elasticity squared (kernels.square_spread at the hidden
        units' q1)."""
        P = self.P
        m1, vf, e = kernels.square_spread(GATED.get(P.activation, P.activation), q1, P.activation in GATED)
        out2 = (float(P.g_2) * m1) ** 2
        return out2 * (vf / P.d_ff + (2.0 / P.d_model if P.d_model else 0.0)), out2 * e * e

    def spread(self, u, cache):
        """The pair and distance engines' spread (spread_forward), from the cache's hidden q1 (None at infinite
        width: d_ff unset)."""
        P = self.P
        if not P.d_ff:
            return None, cache
        q1 = np.asarray(cache[0], dtype=float)
        a, b = self._unit_spread(q1)
        if u is None or not float(P.g_1):
            return a, cache
        q = (q1 - float(P.b_12)) / float(P.g_1)  # the input's q (> 0: the engines floor it at 1 / HUGE)
        return a + b * u / (q * q), cache

    def causal_backward(self, G, S, cache):
        """As moments_backward per position (g_m by E phi'^2 at q1_m) and per group pair (E phi' phi' at the groups'
        mean q1 and their overlap); at full resolution a gated unit's output kernel again (not kept there: a T x T
        array a block would make a long stack's backward run its forward twice)."""
        P = self.P
        C1, kd, ko = cache
        dd = cz.self_dkernel(P.activation, C1.qf)
        do = cz.cross_dkernel(P.activation, cz.gmean(G, C1.qf), C1.P)
        if P.activation in GATED:  # gate path + up path
            ko = cz.cross_kernel(P.activation, cz.gmean(G, C1.qf), C1.P) if ko is None else ko
            dd, do = dd * C1.qf + kd, do * C1.P + ko
        gain = float(P.g_1b) * float(P.g_2b)
        return cz.State(gain * dd * S.qf, gain * do * S.P)

    def draws(self):
        """W1 (W_up when gated) and W2 with the matrices, biases in phase 1, the gate's pair in phase 2."""
        P, d, f = self.P, self.P.d_model, self.P.d_ff
        (s1, b1), (s2, b2) = P.init["ff_in"], P.init["ff_out"]
        out = [("w_in", (d, f), s1, 0), ("w_out", (f, d), s2, 0)]
        out += [("b_in", (f,), b1, 1)] if b1 > 0 else []
        out += [("b_out", (d,), b2, 1)] if b2 > 0 else []
        if P.activation in GATED:
            out += [("w_gate", (d, f), s1, 2)] + ([("b_gate", (f,), b1, 2)] if b1 > 0 else [])
        return out

    def forward(self, u, W, rng):
        return self.apply(u, W[id(self)])

    def backward(self, dy, W, cache, wgrads):
        return self.apply_backward(dy, W[id(self)], cache)

    def apply(self, u, w: dict):
        """The MLP with weights w (`draws`' names)."""
        act = self.P.activation
        z = _lin(u, w["w_in"], w.get("b_in"))
        if act in GATED:
            zg = _lin(u, w["w_gate"], w.get("b_gate"))
            a = activation(GATED[act], zg) * z
            return _lin(a, w["w_out"], w.get("b_out")), {"z": z, "zg": zg}
        return _lin(activation(act, z), w["w_out"], w.get("b_out")), {"z": z}

    def apply_backward(self, dy, w: dict, cache):
        act = self.P.activation
        da = dy @ w["w_out"].T
        z = cache["z"]
        if act in GATED:
            name, zg = GATED[act], cache["zg"]
            dz = da * activation(name, zg)
            dzg = da * z * activation_grad(name, zg)
            return dz @ w["w_in"].T + dzg @ w["w_gate"].T
        return (da * activation_grad(act, z)) @ w["w_in"].T

    def torch_build(self, make, d: int):
        P = self.P
        mods = {"ff_in": _torch_linear(d, P.d_ff, *P.init["ff_in"])}
        if P.activation in GATED:
            mods["ff_up"] = _torch_linear(d, P.d_ff, *P.init["ff_in"])
        mods["ff_out"] = _torch_linear(P.d_ff, d, *P.init["ff_out"])
        return mods

    def torch_forward(self, m, u):
        from torch import nn

        act = {"relu": nn.functional.relu, "gelu": nn.functional.gelu, "silu": nn.functional.silu,
               "gelu_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"), "tanh": lambda x: x.tanh(),
               "linear": lambda x: x}[GATED.get(self.P.activation, self.P.activation)]
        a = act(m.ff_in(u))
        return m.ff_out(a * m.ff_up(u) if hasattr(m, "ff_up") else a)


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts MLP (Mixtral, Qwen3-MoE, DeepSeek-V3): y = sum_{j in top k} w_j f_j(u) + the shared
    experts' f(u), each f an MLP of P's numbers with its own weights, the weights w from the router's logits R u
    (routing.weights)."""

    P: BlockParams

    @property
    def expert(self) -> MLP:
        return MLP(self.P)

    def _stats(self, q, p):
        P = self.P
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = p / q
        return routing.statistics(P.experts, P.top_k, P.router, P.route_norm, P.route_scale, P.g_r * q, rho,
                                  P.route_groups, P.route_top_groups)

    def moments(self, q, p):
        """routing's q_y = A q_f, p_y = B p_f; a shared expert adds its own (q_f, p_f)."""
        q2, p2, c = self.expert.moments(q, p)
        A, B, F, Fx = self._stats(q, p)
        n = self.P.shared_experts
        return (A + n) * q2, (B + n) * p2, (c, q2, p2, F, Fx, A, B)

    def distances(self, q, c):
        """The distance-resolved state: A and F at the one variance q (as `causal`), B and F_x per distance."""
        q2, c2, cache = self.expert.moments(q, c)
        A, _, F, _ = self._stats(q, q)
        _, B, _, Fx = self._stats(q, c)
        n = self.P.shared_experts
        return (A + n) * q2, (B + n) * c2, (cache, q2, c2, F, Fx, A, B)

    def distances_backward(self, gq, gp, cache):
        return self.moments_backward(gq, gp, cache)

    def moments_backward(self, gq, gp, cache):
        """The experts' path (A, B times the MLP's backward) plus the router's, g_r q_f gq F (routing)."""
        c, q2, p2, F, Fx, A, B = cache
        dq, dp = self.expert.moments_backward(gq, gp, c)
        n, g_r = self.P.shared_experts, self.P.g_r
        return (A + n) * dq + g_r * q2 * gq * F, (B + n) * dp + g_r * p2 * gp * Fx

    def causal(self, G, S):
        """Per position A at q_m; per group pair B at the pair's correlation (s from the pair's mean q)."""
        C, c = self.expert.causal(G, S)
        qg = cz.gmean(G, S.qf)
        qq = np.sqrt(np.multiply.outer(qg, qg))
        A, _, F, _ = self._stats(S.qf, S.qf)
        _, B, _, Fx = self._stats(qq, S.P)
        n = self.P.shared_experts
        return cz.State((A + n) * C.qf, (B + n) * C.P), (c, C, A, B, F, Fx)

    def causal_backward(self, G, S, cache):
        """As moments_backward: the experts' path per position and group pair, and the router's."""
        c, C, A, B, F, Fx = cache
        D = self.expert.causal_backward(G, S, c)
        n, g_r = self.P.shared_experts, float(self.P.g_r)
        return cz.State((A + n) * D.qf + g_r * C.qf * S.qf * F, (B + n) * D.P + g_r * C.P * S.P * Fx)

    def _members(self) -> list[tuple[str, MLP]]:
        P = self.P
        out = [(f"e{j}.", self.expert) for j in range(P.experts)]
        if P.shared_experts:  # the shared experts as one MLP of their summed width (DeepSeek)
            out.append(("shared.", MLP(replace(P, d_ff=P.shared_experts * P.d_ff))))
        return out

    def draws(self):
        P = self.P
        out = [("w_router", (P.d_model, P.experts), P.init["router"][0], 0)]
        return out + [(pre + name, *rest) for pre, mlp in self._members() for name, *rest in mlp.draws()]

    def forward(self, u, W, rng):
        P, w = self.P, W[id(self)]
        r = routing.weights(u @ w["w_router"], P.top_k, P.router, P.route_norm, P.route_scale, P.route_groups,
                            P.route_top_groups)
        y, caches, outs = 0.0, [], []
        for j, (pre, mlp) in enumerate(self._members()):
            f, c = mlp.apply(u, {k[len(pre):]: v for k, v in w.items() if k.startswith(pre)})
            y = y + (r[0][..., j:j + 1] * f if j < P.experts else f)
            caches.append(c)
            outs.append(f)
        return y, (r, caches, outs)

    def backward(self, dy, W, cache, wgrads):
        P, w = self.P, W[id(self)]
        (wt, a, b, c), caches, outs = cache
        dx, dw = 0.0, np.empty(wt.shape)
        for j, ((pre, mlp), cj, f) in enumerate(zip(self._members(), caches, outs)):
            sub = {k[len(pre):]: v for k, v in w.items() if k.startswith(pre)}
            if j < P.experts:
                dw[..., j] = (f * dy).sum(axis=-1)
                dx = dx + mlp.apply_backward(wt[..., j:j + 1] * dy, sub, cj)
            else:
                dx = dx + mlp.apply_backward(dy, sub, cj)
        return dx + routing.logit_gradient(dw, a, b, c) @ w["w_router"].T

    def torch_build(self, make, d: int):
        from torch import nn

        P = self.P
        router = nn.Linear(d, P.experts, bias=False)
        nn.init.normal_(router.weight, 0.0, P.init["router"][0])
        mods = {"router": router, "experts": nn.ModuleList(nn.ModuleDict(self.expert.torch_build(make, d))
                                                            for _ in range(P.experts))}
        if P.shared_experts:
            mods["shared"] = nn.ModuleDict(self._members()[-1][1].torch_build(make, d))
        return mods

    def torch_forward(self, m, u):
        import torch

        P, logits = self.P, m.router(u)
        pick = logits
        if P.route_groups > 1:  # routing.chosen_groups
            prob = logits.softmax(-1) if P.router == "softmax" else torch.sigmoid(logits)
            score = prob.unflatten(-1, (P.route_groups, -1)).topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(score, dtype=torch.bool).scatter(-1, score.topk(P.route_top_groups, -1).indices,
                                                                       True)
            pick = logits.masked_fill(~keep.repeat_interleave(P.experts // P.route_groups, -1), -torch.inf)
        mask = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, pick.topk(P.top_k, dim=-1).indices, True)
        if P.router == "softmax":
            w = (logits.masked_fill(~mask, -torch.inf).softmax(-1) if P.route_norm
                 else logits.softmax(-1) * mask)
        else:
            w = torch.sigmoid(logits) * mask
            w = w / w.sum(-1, keepdim=True) if P.route_norm else w
        w = P.route_scale * w
        y = sum(w[..., j:j + 1] * self.expert.torch_forward(e, u) for j, e in enumerate(m.experts))
        if P.shared_experts:
            y = y + self._members()[-1][1].torch_forward(m.shared, u)
        return y


def erf(x):
    from scipy.special import erf  # imported on use: `check` never needs it

    return erf(x)


def activation(name: str, z: np.ndarray) -> np.ndarray:
    if name == "relu":
        return np.maximum(z, 0)
    if name == "gelu":
        return 0.5 * z * (1.0 + erf(z * _INV_SQRT2))
    if name == "gelu_tanh":
        return 0.5 * z * (1.0 + np.tanh(_K_TANH * (z + 0.044715 * z**3)))
    if name == "silu":
        with np.errstate(over="ignore"):
            return z / (1.0 + np.exp(-z))
    if name == "tanh":
        return np.tanh(z)
    if name == "linear":
        return z.copy()
    raise ValueError(f"unknown activation {name!r}")


def activation_grad(name: str, z: np.ndarray) -> np.ndarray:
    if name == "relu":
        return (z > 0).astype(z.dtype)
    if name == "gelu":
        return 0.5 * (1.0 + erf(z * _INV_SQRT2)) + z * _INV_SQRT2PI * np.exp(-0.5 * z * z)
    if name == "gelu_tanh":
        t = np.tanh(_K_TANH * (z + 0.044715 * z**3))
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _K_TANH * (1.0 + 3 * 0.044715 * z * z)
    if name == "silu":
        with np.errstate(over="ignore"):
            s = 1.0 / (1.0 + np.exp(-z))
        return s * (1.0 + z * (1.0 - s))
    if name == "tanh":
        t = np.tanh(z)
        return 1.0 - t * t
    if name == "linear":
        return np.ones_like(z)
    raise ValueError(f"unknown activation {name!r}")


# ------------------------------------------------------------------------------------------------
# The input: stream index 0


ZIPF_TABLE = 1 << 16  # ranks sampled from the exact cumulative law; beyond, H(i) ~ ln i + gamma is inverted


@lru_cache(maxsize=8)
def _harmonic(n: int) -> np.ndarray:
    return np.cumsum(1.0 / np.arange(1, n + 1))


def zipf_ids(vocab: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Ids i.i.d. Zipf p_i ~ 1/i (rank i -> id i - 1), in memory bounded by ZIPF_TABLE whatever the vocabulary."""
    head = _harmonic(min(vocab, ZIPF_TABLE))
    total = head[-1] if vocab <= ZIPF_TABLE else math.log(vocab) + EULER_GAMMA + 1 / (2 * vocab)
    u = rng.random(shape) * total
    ids = np.searchsorted(head, u, side="right").astype(np.int64)  # rank i + 1 for H(i) <= u < H(i + 1)
    tail = u >= head[-1]
    ids[tail] = np.floor(np.exp(u[tail] - EULER_GAMMA))  # the rank whose H(rank) first exceeds u
    return np.minimum(ids, vocab - 1)


@lru_cache(maxsize=16)
def zipf_repeat_correlation(vocab: int) -> float:
    """Probability that two positions hold the same word, tokens i.i.d. Zipf: sum_i p_i^2, p_i = c / i.

    004 A.1 (digest 5) writes (L sum p_i^2 - 1)/(L - 1), which takes the counts N_i = p_i L as exact; for
    i.i.d. draws E[sum_i N_i (N_i - 1)] / (L (L - 1)) = sum_i p_i^2 exactly (0.0137 against 0.0099 at V = 32000).
    """
    if vocab < 10_000:
        i = np.arange(1, vocab + 1, dtype=float)
        h1, h2 = float(np.sum(1 / i)), float(np.sum(1 / i**2))
    else:
        h1 = math.log(vocab) + EULER_GAMMA + 1 / (2 * vocab)
        h2 = math.pi**2 / 6 - 1 / vocab
    return h2 / h1**2


@dataclass(frozen=True)
class Embeddings:
    """Summed embedding tables N(0, std^2) (token ids i.i.d. Zipf, position row t, one segment row for all
    tokens), or x_t = sqrt(rho) c + sqrt(1 - rho) e_t when the correlation is given; then a norm and dropout; tables
    of another width (ELECTRA's embedding_size) then a linear map to d_model, N(0, std^2) without bias."""

    tables: tuple[str, ...]
    vocab: int
    d_model: int
    seq_len: int
    std: float
    input_correlation: float | None = None  # None: from the tables
    norm: str | None = None  # the embedding norm's kind, or None
    dropout: float = 0.0
    norm_eps: float = 0.0
    scale: float = 1.0  # the summed tables times this before the norm (Gemma: sqrt(d)); a tied head reads them unscaled
    width: int = 0  # the tables' width, projected to d_model after the dropout; 0: d_model, no projection

    @property
    def rho0(self) -> float:
        """rho_0 of the summed tables (THEORY.md 'Inputs'), or the given correlation."""
        if self.input_correlation is not None:
            return self.input_correlation
        share = {"token": zipf_repeat_correlation(self.vocab), "position": 0.0, "segment": 1.0}
        return sum(share[t] for t in self.tables) / len(self.tables)

    def moments(self) -> tuple[float, float]:
        """(q, p) of the stream entering block 1."""
        rho0 = self.rho0
        q = len(self.tables) * (self.scale * self.std) ** 2
        if self.norm:
            q = Norm(self.norm, self.norm_eps).moments(q, 0.0)[0]
        g = self.width * self.std**2 if self.width else 1.0  # the projection's gain: E |W x|^2 / d = std^2 width q
        return g * q / (1 - self.dropout), g * rho0 * q

    def repeats(self) -> tuple[float, float]:
        """(w, r): the share of position pairs that hold one token (Zipf ids: sum_i p_i^2) and such a pair's
        overlap entering block 1 (its token row and a segment row in common); (0, 0) without token ids."""
        if self.input_correlation is not None or "token" not in self.tables:
            return 0.0, 0.0
        q, p = self.moments()
        w = zipf_repeat_correlation(self.vocab)
        return w, p * sum(t in ("token", "segment") for t in self.tables) / len(self.tables) / self.rho0

    def forward(self, batch: int, rng: np.random.Generator, dt: np.dtype) -> np.ndarray:
        """Stream index 0 (batch, T, d) of the numpy network."""
        T, d, std = self.seq_len, self.width or self.d_model, self.std
        if self.input_correlation is not None:
            rho = self.input_correlation
            sigma = math.sqrt(len(self.tables)) * std
            c = normal(rng, (batch, 1, d), sigma, dt)
            e = normal(rng, (batch, T, d), sigma, dt)
            x = dt.type(math.sqrt(rho)) * c + dt.type(math.sqrt(1.0 - rho)) * e
        else:
            x = np.zeros((batch, T, d), dtype=dt)
            for table in self.tables:
                if table == "token":
                    ids = zipf_ids(self.vocab, (batch, T), rng)
                    uniq, inv = np.unique(ids, return_inverse=True)
                    rows = normal(rng, (len(uniq), d), std, dt)  # only the rows used: i.i.d. like the full table
                    x += rows[inv.reshape(batch, T)]
                elif table == "position":
                    x += normal(rng, (T, d), std, dt)[None]
                elif table == "segment":
                    x += normal(rng, (d,), std, dt)[None, None]
        if self.scale != 1.0:
            x *= dt.type(self.scale)
        if self.norm:
            x = Norm(self.norm, self.norm_eps).forward(x, {}, rng)[0]
        x = dropout(x, self.dropout, rng)[0]
        return x @ normal(rng, (d, self.d_model), std, dt) if self.width else x

    def torch_build(self, make, d: int):
        from torch import nn

        sizes = {"token": self.vocab, "position": self.seq_len, "segment": 1}
        w = self.width or d
        tables = nn.ModuleDict({t: nn.Embedding(sizes[t], w) for t in self.tables})
        for table in tables.values():
            nn.init.normal_(table.weight, 0.0, self.std)
        norm = make(Norm(self.norm, self.norm_eps), w) if self.norm else nn.Identity()
        proj = nn.Linear(w, d, bias=False) if self.width else nn.Identity()
        if self.width:
            nn.init.normal_(proj.weight, 0.0, self.std)
        return {"tables": tables, "emb_norm": norm, "drop": nn.Dropout(self.dropout), "emb_proj": proj}

    def torch_forward(self, m, input_ids):
        import torch

        B, T = input_ids.shape
        if self.input_correlation is not None:  # x_t = sqrt(rho) c + sqrt(1 - rho) e_t (as the numpy network)
            sd, w = math.sqrt(len(self.tables)) * self.std, self.width or self.d_model
            c = torch.randn(B, 1, w, device=input_ids.device) * sd
            x = math.sqrt(self.input_correlation) * c + math.sqrt(1 - self.input_correlation) * sd * torch.randn(
                B, T, w, device=input_ids.device)
            x.requires_grad_()  # no parameter feeds it: the stream's gradient is still measured from here
        else:
            idx = {"token": input_ids, "position": torch.arange(T, device=input_ids.device).expand(B, T),
                   "segment": torch.zeros_like(input_ids)}
            x = sum(table(idx[name]) for name, table in m.tables.items())
        if self.scale != 1.0:
            x = x * self.scale
        return m.emb_proj(m.drop(m.emb_norm(x)))
