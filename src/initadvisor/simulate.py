"""Monte-Carlo judge: build the random network of a `Spec` in numpy, run it, and measure.

The network (the contract the analytic theory is checked against):

* Stream index 0: the summed embedding tables (``spec.embeddings``; each entry N(0, std_e^2)), token ids
  drawn i.i.d. from a Zipf law p_i ~ 1/i over ``spec.vocab``, position row t for position t, ONE segment
  row shared by all tokens. With ``spec.input_correlation = rho`` instead x_t = sqrt(rho) c + sqrt(1-rho) e_t,
  c, e_t ~ N(0, n_tables std_e^2 I). Then the norm if ``spec.embedding_norm``, then dropout.
* Norms have no affine parameters (gain 1, bias 0), eps 1e-5.
* Attention: Q, K, V projections (with biases), ``heads`` heads (``kv_heads`` K/V heads shared by consecutive
  groups of heads), scores scaled by ``softmax_scale``, causal mask, softmax, attention dropout, A V (minus the
  mean of V over the attended keys for ``attention: centered``), concatenated, output projection if ``out_proj``.
* MLP: act(u W1 + b1) W2 + b2; gated (swiglu / geglu): (act(u W_gate + b_gate) * (u W_up + b_up)) W_down + b_down.
* Residual: skip * x + block * dropout(branch). Recipes post / pre / none and the parallel (pre) block.
* Stream index i = residual stream after block i.

Measured per stream index: q (mean square), p (mean over ordered pairs t != s of x_t . x_s / d),
rho = p / q; the same over the first, middle and last third of positions; per block the mean inverse
participation ratio Y2 of attention rows; backward (hand-written, numpy) the gradient of
loss = sum(h_L * G), G ~ N(0, 1), with respect to every stream index: grad_q, grad_p; and the squared
Frobenius norms of the gradients of W_Q, W_K, W_V per block (Noci et al.'s Q/K vs V comparison).

No torch here: the tests check this backward against torch autograd.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.special import erf

from initadvisor.core.causal import thirds
from initadvisor.core.model import EULER_GAMMA
from initadvisor.spec import Spec, SpecError

EPS = 1e-5
GATED = {"swiglu": "silu", "geglu": "gelu"}
_K_TANH = math.sqrt(2.0 / math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


# ------------------------------------------------------------------------------------------------
# Weights


@dataclass
class LayerWeights:
    """One block's weights (biases are None when their bias_std is 0)."""

    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray | None
    w_in: np.ndarray  # ungated: W1; gated: W_up
    w_out: np.ndarray  # W2 / W_down
    w_gate: np.ndarray | None = None  # gated only
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    b_in: np.ndarray | None = None
    b_out: np.ndarray | None = None
    b_gate: np.ndarray | None = None


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float, dtype: np.dtype) -> np.ndarray:
    out = rng.standard_normal(shape, dtype=dtype)
    out *= std
    return out


def _check_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    return dt


def init_layer(spec: Spec, rng: np.random.Generator, dtype: Any = np.float64) -> LayerWeights:
    """Draw one block's weights: entries N(0, std^2), biases N(0, bias_std^2) from ``spec.init``."""
    dt = _check_dtype(dtype)
    d, dff, kvw = spec.d_model, spec.d_ff, spec.kv_heads * spec.d_head

    def mat(name: str, shape: tuple[int, int]) -> np.ndarray:
        return _normal(rng, shape, spec.init[name].std, dt)

    def bias(name: str, n: int) -> np.ndarray | None:
        s = spec.init[name].bias_std
        return _normal(rng, (n,), s, dt) if s > 0 else None

    w = LayerWeights(
        wq=mat("q", (d, d)), wk=mat("k", (d, kvw)), wv=mat("v", (d, kvw)),
        wo=mat("o", (d, d)) if spec.out_proj else None,
        w_in=mat("ff_in", (d, dff)), w_out=mat("ff_out", (dff, d)),
    )
    w.bq, w.bk, w.bv = bias("q", d), bias("k", kvw), bias("v", kvw)
    w.bo = bias("o", d) if spec.out_proj else None
    w.b_in, w.b_out = bias("ff_in", dff), bias("ff_out", d)
    if spec.activation in GATED:
        w.w_gate, w.b_gate = mat("ff_in", (d, dff)), bias("ff_in", dff)
    return w


def init_network(spec: Spec, rng: np.random.Generator, dtype: Any = np.float64) -> list[LayerWeights]:
    return [init_layer(spec, rng, dtype) for _ in range(spec.layers)]


# ------------------------------------------------------------------------------------------------
# Input (stream index 0)


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


def sample_tokens(spec: Spec, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Token ids (batch, T), i.i.d. Zipf over the vocabulary."""
    return zipf_ids(spec.vocab, (batch, spec.seq_len), rng)


MEMORY_SHARE = 0.5  # a verify may use at most this share of the machine's available memory


def memory_needed(spec: Spec, batch: int, itemsize: int, tables: bool = False) -> int:
    """Bytes one initialisation of ``batch`` sequences holds at its peak: weights, the stream at every layer,
    and the per-block caches the backward needs (attention matrices, projections, MLP activations); `tables`:
    the full embedding tables too (the PyTorch model builds them; numpy draws only the rows it uses)."""
    d, f, T, H, L = spec.d_model, spec.d_ff, spec.seq_len, spec.heads, spec.layers
    gates = 2 if spec.activation in GATED else 1
    weights = 4 * d * d + (1 + gates) * d * f
    per_block = (2 + (spec.attention_dropout > 0)) * H * T * T + 8 * T * d + (1 + 2 * gates) * T * f
    table = spec.vocab * d + (T if "position" in spec.embeddings else 0) * d if tables else 0
    return int(itemsize * (L * weights + table + batch * (L * per_block + (L + 2) * T * d)))


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, else the physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(spec: Spec, batch: int, itemsize: int, tables: bool = False) -> None:
    """Refuse, before allocating, a measurement that would not fit in memory."""
    need, have = memory_needed(spec, batch, itemsize, tables), available_memory()
    if need > MEMORY_SHARE * have:
        raise SpecError(f"measuring this network needs about {need / 2**30:.3g} GiB, over {MEMORY_SHARE:g} of the "
                        f"{have / 2**30:.3g} GiB available: fewer layers, a smaller d_model, d_ff, vocab or sequence "
                        "length (--seq-len) or --batch", spec.source or "<spec>")


def embed(spec: Spec, batch: int, rng: np.random.Generator, dtype: Any = np.float64) -> np.ndarray:
    """Summed embeddings (batch, T, d) before the embedding norm and dropout."""
    dt = _check_dtype(dtype)
    T, d = spec.seq_len, spec.d_model
    std = spec.init["embedding"].std
    if spec.input_correlation is not None:
        rho = spec.input_correlation
        sigma = math.sqrt(len(spec.embeddings)) * std
        c = _normal(rng, (batch, 1, d), sigma, dt)
        e = _normal(rng, (batch, T, d), sigma, dt)
        return dt.type(math.sqrt(rho)) * c + dt.type(math.sqrt(1.0 - rho)) * e
    x = np.zeros((batch, T, d), dtype=dt)
    for table in spec.embeddings:
        if table == "token":
            ids = sample_tokens(spec, batch, rng)
            uniq, inv = np.unique(ids, return_inverse=True)
            rows = _normal(rng, (len(uniq), d), std, dt)  # only the rows used: i.i.d. like the full table
            x += rows[inv.reshape(batch, T)]
        elif table == "position":
            x += _normal(rng, (T, d), std, dt)[None]
        elif table == "segment":
            x += _normal(rng, (d,), std, dt)[None, None]
    return x


def make_input(spec: Spec, batch: int, rng: np.random.Generator, dtype: Any = np.float64) -> np.ndarray:
    """Stream index 0: embeddings, embedding norm (if any), dropout (training mode)."""
    x = embed(spec, batch, rng, dtype)
    if spec.embedding_norm:
        x = _norm_fwd(x, spec.norm_type)[0]
    return _dropout(x, spec.dropout, rng)[0]


# ------------------------------------------------------------------------------------------------
# Components: forward returns (output, cache); backward maps the output gradient to the input gradient.


def _norm_fwd(x: np.ndarray, kind: str) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    if kind == "layernorm":
        y = x - x.mean(-1, keepdims=True)
        r = 1.0 / np.sqrt((y * y).mean(-1, keepdims=True) + EPS)
    else:  # rmsnorm
        y = x.copy()
        r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    y *= r
    return y, (y, r)


def _norm_bwd(dy: np.ndarray, cache: tuple[np.ndarray, np.ndarray], kind: str) -> np.ndarray:
    y, r = cache
    dx = dy - y * (dy * y).mean(-1, keepdims=True)
    if kind == "layernorm":
        dx -= dy.mean(-1, keepdims=True)
    dx *= r
    return dx


def _dropout(x: np.ndarray, p: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """Training-mode dropout: x * mask / (1 - p). Returns (output, boolean keep-mask or None)."""
    if p <= 0:
        return x, None
    mask = rng.random(x.shape, dtype=np.float32 if x.dtype == np.float32 else np.float64) >= p
    return x * mask * x.dtype.type(1.0 / (1.0 - p)), mask


def _dropout_bwd(dy: np.ndarray, mask: np.ndarray | None, p: float) -> np.ndarray:
    if mask is None:
        return dy
    return dy * mask * dy.dtype.type(1.0 / (1.0 - p))


def _act(name: str, z: np.ndarray) -> np.ndarray:
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


def _act_grad(name: str, z: np.ndarray) -> np.ndarray:
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


def _bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched matrix product over the leading axes, one 2-D BLAS call per slice (numpy's stacked matmul
    is slower for the small per-head products here)."""
    lead = a.shape[:-2]
    out = np.empty(lead + (a.shape[-2], b.shape[-1]), dtype=np.result_type(a, b))
    for i in np.ndindex(*lead):
        np.matmul(a[i], b[i], out=out[i])
    return out


def _lin(u: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    out = u @ w
    if b is not None:
        out += b
    return out


def _mlp_fwd(spec: Spec, w: LayerWeights, u: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    z = _lin(u, w.w_in, w.b_in)
    if spec.activation in GATED:
        zg = _lin(u, w.w_gate, w.b_gate)
        a = _act(GATED[spec.activation], zg) * z
        return _lin(a, w.w_out, w.b_out), {"z": z, "zg": zg}
    return _lin(_act(spec.activation, z), w.w_out, w.b_out), {"z": z}


def _mlp_bwd(spec: Spec, w: LayerWeights, cache: dict[str, Any], dy: np.ndarray) -> np.ndarray:
    da = dy @ w.w_out.T
    z = cache["z"]
    if spec.activation in GATED:
        name, zg = GATED[spec.activation], cache["zg"]
        dz = da * _act(name, zg)
        dzg = da * z * _act_grad(name, zg)
        return dz @ w.w_in.T + dzg @ w.w_gate.T
    return (da * _act_grad(spec.activation, z)) @ w.w_in.T


def _attn_fwd(
    spec: Spec, w: LayerWeights, u: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, Any]]:
    B, T, d = u.shape
    H, KV, dh = spec.heads, spec.kv_heads, spec.d_head
    G = H // KV
    # head h = kv * G + g uses K/V head kv (consecutive heads share, like repeat_interleave)
    q = _lin(u, w.wq, w.bq).reshape(B, T, KV, G, dh).transpose(0, 2, 3, 1, 4).reshape(B, KV, G * T, dh)
    k = _lin(u, w.wk, w.bk).reshape(B, T, KV, dh).transpose(0, 2, 1, 3)
    v = _lin(u, w.wv, w.bv).reshape(B, T, KV, dh).transpose(0, 2, 1, 3)
    s = _bmm(q, k.transpose(0, 1, 3, 2))  # (B, KV, G*T, T)
    s *= s.dtype.type(spec.softmax_scale)
    s = s.reshape(B, KV, G, T, T)
    if spec.causal:
        s += _causal_bias(T, s.dtype)
    s -= s.max(-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(-1, keepdims=True)
    a = s.reshape(B, KV, G * T, T)
    y2 = np.einsum("bkrt,bkrt->b", a, a, dtype=np.float64) / (H * T)
    ad, mask = _dropout(a, spec.attention_dropout, rng)
    o = _bmm(ad, v)  # (B, KV, G*T, dh)
    del ad
    if spec.attention == "centered":
        o = o.reshape(B, KV, G, T, dh)
        if spec.causal:
            o -= (np.cumsum(v, axis=2) / _counts(T, v.dtype)[:, None])[:, :, None]
        else:
            o -= v.mean(axis=2, keepdims=True)[:, :, None]
    o = o.reshape(B, KV, G, T, dh).transpose(0, 3, 1, 2, 4).reshape(B, T, d)
    y = _lin(o, w.wo, w.bo) if spec.out_proj else o
    return y, {"u": u, "q": q, "k": k, "v": v, "a": a, "mask": mask, "y2": y2}


def _attn_bwd(
    spec: Spec, w: LayerWeights, c: dict[str, Any], dy: np.ndarray, wgrads: dict[str, list] | None
) -> np.ndarray:
    B, T, d = dy.shape
    H, KV, dh = spec.heads, spec.kv_heads, spec.d_head
    G = H // KV
    do = dy @ w.wo.T if spec.out_proj else dy
    do = do.reshape(B, T, KV, G, dh).transpose(0, 2, 3, 1, 4).reshape(B, KV, G * T, dh)
    q, k, v, a, mask = c["q"], c["k"], c["v"], c["a"], c["mask"]
    pa = spec.attention_dropout
    ad = a if mask is None else a * mask * a.dtype.type(1.0 / (1.0 - pa))
    dv = _bmm(ad.transpose(0, 1, 3, 2), do)  # (B, KV, T, dh)
    del ad
    if spec.attention == "centered":
        rows = do.reshape(B, KV, G, T, dh).sum(2)  # (B, KV, T, dh)
        if spec.causal:
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
    da *= da.dtype.type(spec.softmax_scale)  # dS
    dq = _bmm(da, k)  # (B, KV, G*T, dh)
    dk = _bmm(da.transpose(0, 1, 3, 2), q)  # (B, KV, T, dh)
    del da
    dq = dq.reshape(B, KV, G, T, dh).transpose(0, 3, 1, 2, 4).reshape(B, T, d)
    dk = dk.transpose(0, 2, 1, 3).reshape(B, T, KV * dh)
    dv = dv.transpose(0, 2, 1, 3).reshape(B, T, KV * dh)
    if wgrads is not None:
        ut = c["u"].transpose(0, 2, 1)
        for name, g in (("wq", dq), ("wk", dk), ("wv", dv)):
            gw = _bmm(ut, g)  # per-sequence weight gradient (B, d, width)
            wgrads[name].append(np.einsum("bij,bij->b", gw, gw, dtype=np.float64))
    return dq @ w.wq.T + dk @ w.wk.T + dv @ w.wv.T


@lru_cache(maxsize=16)
def _causal_bias_cached(T: int, dtype: str) -> np.ndarray:
    out = np.zeros((T, T), dtype=dtype)
    out[np.triu_indices(T, 1)] = -np.inf
    return out


def _causal_bias(T: int, dtype: np.dtype) -> np.ndarray:
    return _causal_bias_cached(T, np.dtype(dtype).str)


def _counts(T: int, dtype: np.dtype) -> np.ndarray:
    return np.arange(1, T + 1, dtype=dtype)


# ------------------------------------------------------------------------------------------------
# Blocks and the network


def block_forward(
    spec: Spec, w: LayerWeights, h: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, Any]]:
    """One block. The cache holds what the backward needs, including the dropout keep-masks:
    ``m_att`` / ``m_mlp`` on the branch outputs and ``attn['mask']`` on the attention matrix
    (shape (B, kv_heads, G*T, T); reshape to (B, heads, T, T))."""
    sa, ba = spec.res_attention.skip, spec.res_attention.block
    sm, bm = spec.res_mlp.skip, spec.res_mlp.block
    p, kind = spec.dropout, spec.norm_type
    c: dict[str, Any] = {}
    if spec.parallel_residual:
        n, c["n1"] = _norm_fwd(h, kind)
        att, c["attn"] = _attn_fwd(spec, w, n, rng)
        mlp, c["mlp"] = _mlp_fwd(spec, w, n)
        att, c["m_att"] = _dropout(att, p, rng)
        mlp, c["m_mlp"] = _dropout(mlp, p, rng)
        return sa * h + ba * att + bm * mlp, c
    pre, post = spec.norm == "pre", spec.norm == "post"
    u = h
    if pre:
        u, c["n1"] = _norm_fwd(h, kind)
    att, c["attn"] = _attn_fwd(spec, w, u, rng)
    att, c["m_att"] = _dropout(att, p, rng)
    h1 = sa * h + ba * att
    if post:
        h1, c["n1"] = _norm_fwd(h1, kind)
    u = h1
    if pre:
        u, c["n2"] = _norm_fwd(h1, kind)
    mlp, c["mlp"] = _mlp_fwd(spec, w, u)
    mlp, c["m_mlp"] = _dropout(mlp, p, rng)
    out = sm * h1 + bm * mlp
    if post:
        out, c["n2"] = _norm_fwd(out, kind)
    return out, c


def block_backward(
    spec: Spec, w: LayerWeights, c: dict[str, Any], dout: np.ndarray, wgrads: dict[str, list] | None = None
) -> np.ndarray:
    """Gradient with respect to the block's input, given the gradient with respect to its output."""
    sa, ba = spec.res_attention.skip, spec.res_attention.block
    sm, bm = spec.res_mlp.skip, spec.res_mlp.block
    p, kind = spec.dropout, spec.norm_type
    if spec.parallel_residual:
        dn = _attn_bwd(spec, w, c["attn"], _dropout_bwd(ba * dout, c["m_att"], p), wgrads)
        dn += _mlp_bwd(spec, w, c["mlp"], _dropout_bwd(bm * dout, c["m_mlp"], p))
        return sa * dout + _norm_bwd(dn, c["n1"], kind)
    pre, post = spec.norm == "pre", spec.norm == "post"
    if post:
        dout = _norm_bwd(dout, c["n2"], kind)
    du = _mlp_bwd(spec, w, c["mlp"], _dropout_bwd(bm * dout, c["m_mlp"], p))
    if pre:
        du = _norm_bwd(du, c["n2"], kind)
    dh1 = sm * dout + du
    if post:
        dh1 = _norm_bwd(dh1, c["n1"], kind)
    du = _attn_bwd(spec, w, c["attn"], _dropout_bwd(ba * dh1, c["m_att"], p), wgrads)
    if pre:
        du = _norm_bwd(du, c["n1"], kind)
    return sa * dh1 + du


def forward(
    spec: Spec, layers: list[LayerWeights], h0: np.ndarray, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """Run all blocks from stream 0. Returns the streams h_0..h_L and the per-block caches."""
    hs, caches = [h0], []
    for w in layers:
        h, c = block_forward(spec, w, hs[-1], rng)
        hs.append(h)
        caches.append(c)
    return hs, caches


def backward(
    spec: Spec, layers: list[LayerWeights], caches: list[dict[str, Any]], G: np.ndarray,
    wgrads: dict[str, list] | None = None,
) -> list[np.ndarray]:
    """Gradients g_0..g_L of loss = sum(h_L * G) with respect to every stream index.

    If ``wgrads`` is a dict with lists under 'wq', 'wk', 'wv', the per-sequence squared Frobenius norms of
    the gradients of W_Q, W_K, W_V are appended to them, last block first."""
    gs = [G]
    for w, c in zip(reversed(layers), reversed(caches)):
        gs.append(block_backward(spec, w, c, gs[-1], wgrads))
    return gs[::-1]


# ------------------------------------------------------------------------------------------------
# Measurements


def pair_moments(x: np.ndarray, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence: q = mean over tokens and coordinates of x^2; p = mean over ordered pairs t != s of
    x_t . x_s / d (positions lo..hi-1). x: (B, T, d). Returns float64 arrays (B,), (B,)."""
    x = x[:, lo:hi]
    B, T, d = x.shape
    if T == 0:
        return np.full(B, np.nan), np.full(B, np.nan)
    sq = np.einsum("btd,btd->bt", x, x, dtype=np.float64).sum(1)
    tot = x.sum(1, dtype=np.float64)
    q = sq / (T * d)
    p = ((tot * tot).sum(-1) - sq) / (d * T * (T - 1)) if T > 1 else np.full(B, np.nan)
    return q, p


@dataclass
class Measurement:
    """Monte-Carlo measurement: means and standard errors over n = seeds x batch sequences.

    Per stream index i = 0..L (arrays of length L+1): q, p, rho (= mean p / mean q, a ratio of averages,
    standard error by the delta method), q_thirds / rho_thirds (shape (L+1, 3): first, middle and last third
    of positions), grad_q, grad_p (raw gradient moments of loss = sum(h_L * G)), grad_q_norm, grad_p_norm
    (divided by mean grad_q at index L), grad_rho = grad_p / grad_q.
    Per block (length L): y2 (mean inverse participation ratio of attention rows, before attention dropout),
    grad_wq, grad_wk, grad_wv (squared Frobenius norms of the weight gradients) and grad_qk_over_v
    (mean of (|dW_Q|^2 + |dW_K|^2) / 2 over mean |dW_V|^2). Every quantity X has its standard error in X_se.
    """

    q: np.ndarray
    q_se: np.ndarray
    p: np.ndarray
    p_se: np.ndarray
    rho: np.ndarray
    rho_se: np.ndarray
    q_thirds: np.ndarray
    q_thirds_se: np.ndarray
    rho_thirds: np.ndarray
    rho_thirds_se: np.ndarray
    y2: np.ndarray
    y2_se: np.ndarray
    grad_q: np.ndarray
    grad_q_se: np.ndarray
    grad_p: np.ndarray
    grad_p_se: np.ndarray
    grad_q_norm: np.ndarray
    grad_q_norm_se: np.ndarray
    grad_p_norm: np.ndarray
    grad_p_norm_se: np.ndarray
    grad_rho: np.ndarray
    grad_rho_se: np.ndarray
    grad_wq: np.ndarray
    grad_wq_se: np.ndarray
    grad_wk: np.ndarray
    grad_wk_se: np.ndarray
    grad_wv: np.ndarray
    grad_wv_se: np.ndarray
    grad_qk_over_v: np.ndarray
    grad_qk_over_v_se: np.ndarray
    n: int = 0
    seeds: int = 0
    batch: int = 0
    dtype: str = "float64"
    seconds_per_seed: float = 0.0
    name: str = ""

    @property
    def layers(self) -> int:
        return len(self.y2)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (lists of floats; NaN becomes None)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray):
                v = np.where(np.isfinite(v), v, np.nan).tolist()
                v = _nan_to_none(v)
            out[f.name] = v
        return out


def _nan_to_none(v: Any) -> Any:
    if isinstance(v, list):
        return [_nan_to_none(x) for x in v]
    return None if isinstance(v, float) and math.isnan(v) else v


def mean_se(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = x.shape[0]
    m = x.mean(0)
    se = x.std(0, ddof=1) / math.sqrt(n) if n > 1 else np.full_like(m, np.nan)
    return m, se


def ratio_se(num: np.ndarray, den: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mean(num) / mean(den) with its delta-method standard error."""
    n = num.shape[0]
    md = den.mean(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = num.mean(0) / md
        se = (num - r * den).std(0, ddof=1) / math.sqrt(n) / np.abs(md) if n > 1 else np.full_like(r, np.nan)
    return r, se


def run_one(
    spec: Spec, batch: int, rng: np.random.Generator, dtype: Any = np.float64, weight_grads: bool = True
) -> dict[str, np.ndarray]:
    """One initialisation, ``batch`` sequences: per-sequence raw moments (arrays with leading axis batch)."""
    dt = _check_dtype(dtype)
    layers = init_network(spec, rng, dt)
    h0 = make_input(spec, batch, rng, dt)
    hs, caches = forward(spec, layers, h0, rng)
    spans = thirds(spec.seq_len)
    L = spec.layers
    q = np.empty((batch, L + 1))
    p = np.empty((batch, L + 1))
    q3 = np.empty((batch, L + 1, 3))
    p3 = np.empty((batch, L + 1, 3))
    for i, h in enumerate(hs):
        q[:, i], p[:, i] = pair_moments(h)
        for j, (lo, hi) in enumerate(spans):
            q3[:, i, j], p3[:, i, j] = pair_moments(h, lo, hi)
    y2 = np.stack([c["attn"]["y2"] for c in caches], axis=1)
    del hs
    G = rng.standard_normal(h0.shape, dtype=dt)
    wg: dict[str, list] | None = {"wq": [], "wk": [], "wv": []} if weight_grads else None
    gs = backward(spec, layers, caches, G, wg)
    del caches
    gq = np.empty((batch, L + 1))
    gp = np.empty((batch, L + 1))
    for i, g in enumerate(gs):
        gq[:, i], gp[:, i] = pair_moments(g)
    out = {"q": q, "p": p, "q3": q3, "p3": p3, "y2": y2, "gq": gq, "gp": gp}
    for name in ("wq", "wk", "wv"):
        out[name] = np.stack(wg[name][::-1], axis=1) if wg is not None else np.full((batch, L), np.nan)
    return out


def simulate(
    spec: Spec, seeds: int = 4, batch: int = 2, rng_seed: int = 0, dtype: Any = np.float64,
    weight_grads: bool = True,
) -> Measurement:
    """Measure the random network of ``spec`` over ``seeds`` independent initialisations of ``batch``
    sequences each (training-mode dropout). ``dtype`` float32 is about twice as fast for big models."""
    if seeds < 1 or batch < 1:
        raise ValueError("seeds and batch must be >= 1")
    dt = _check_dtype(dtype)
    check_memory(spec, batch, dt.itemsize)
    runs = []
    t0 = time.perf_counter()
    for s in range(seeds):
        rng = np.random.default_rng([rng_seed, s])
        runs.append(run_one(spec, batch, rng, dt, weight_grads))
    elapsed = time.perf_counter() - t0
    cat = {k: np.concatenate([r[k] for r in runs], axis=0) for k in runs[0]}
    L = spec.layers
    q, q_se = mean_se(cat["q"])
    p, p_se = mean_se(cat["p"])
    rho, rho_se = ratio_se(cat["p"], cat["q"])
    q3, q3_se = mean_se(cat["q3"])
    rho3, rho3_se = ratio_se(cat["p3"], cat["q3"])
    y2, y2_se = mean_se(cat["y2"])
    gq, gq_se = mean_se(cat["gq"])
    gp, gp_se = mean_se(cat["gp"])
    ref = np.repeat(cat["gq"][:, L:L + 1], L + 1, axis=1)
    gqn, gqn_se = ratio_se(cat["gq"], ref)
    gpn, gpn_se = ratio_se(cat["gp"], ref)
    grho, grho_se = ratio_se(cat["gp"], cat["gq"])
    wq, wq_se = mean_se(cat["wq"])
    wk, wk_se = mean_se(cat["wk"])
    wv, wv_se = mean_se(cat["wv"])
    qkv, qkv_se = ratio_se(0.5 * (cat["wq"] + cat["wk"]), cat["wv"])
    return Measurement(
        q=q, q_se=q_se, p=p, p_se=p_se, rho=rho, rho_se=rho_se,
        q_thirds=q3, q_thirds_se=q3_se, rho_thirds=rho3, rho_thirds_se=rho3_se, y2=y2, y2_se=y2_se,
        grad_q=gq, grad_q_se=gq_se, grad_p=gp, grad_p_se=gp_se,
        grad_q_norm=gqn, grad_q_norm_se=gqn_se, grad_p_norm=gpn, grad_p_norm_se=gpn_se,
        grad_rho=grho, grad_rho_se=grho_se,
        grad_wq=wq, grad_wq_se=wq_se, grad_wk=wk, grad_wk_se=wk_se, grad_wv=wv, grad_wv_se=wv_se,
        grad_qk_over_v=qkv, grad_qk_over_v_se=qkv_se,
        n=seeds * batch, seeds=seeds, batch=batch, dtype=dt.name, seconds_per_seed=elapsed / seeds, name=spec.name,
    )
