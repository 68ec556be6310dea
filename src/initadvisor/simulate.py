"""Monte-Carlo judge: build the random network of a `Spec` in numpy, run it, and measure.

The network (the contract the analytic theory is checked against):

* Stream index 0: the summed embedding tables (``spec.embeddings``; each entry N(0, std_e^2)), token ids
  drawn i.i.d. from a Zipf law p_i ~ 1/i over ``spec.vocab``, position row t for position t, ONE segment
  row shared by all tokens. With ``spec.input_correlation = rho`` instead x_t = sqrt(rho) c + sqrt(1-rho) e_t,
  c, e_t ~ N(0, n_tables std_e^2 I). Then the norm if ``spec.embedding_norm``, then dropout.
* Norms have no affine parameters (gain 1, bias 0), eps ``spec.norm_eps``.
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
from typing import Any

import numpy as np

from initadvisor.core.causal import thirds
from initadvisor.core.model import Stack
from initadvisor.core.ops import GATED, Attention, find, leaves, normal, numpy_backward, numpy_forward
from initadvisor.spec import Spec, SpecError
from initadvisor.stack import block_params, from_spec


# ------------------------------------------------------------------------------------------------
# Weights, input, and the network: the numpy side of each operation is in core/ops.py


def _check_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    return dt


def init_block(ops: tuple, rng: np.random.Generator, dtype: Any = np.float64) -> dict:
    """Draw one block's weights N(0, std^2) as its operations declare them (`draws`), phase by phase: every
    matrix, then every bias, then the gate's pair. Returns {id(op): {name: array}}."""
    dt = _check_dtype(dtype)
    W: dict = {}
    draws = [(op, d) for op in leaves(ops) for d in op.draws()]
    for phase in sorted({d[3] for _, d in draws}):
        for op, (name, shape, std, ph) in draws:
            if ph == phase:
                W.setdefault(id(op), {})[name] = normal(rng, shape, std, dt)
    return W


def init_network(stack: Stack, rng: np.random.Generator, dtype: Any = np.float64) -> list[dict]:
    return [init_block(ops, rng, dtype) for ops in stack.blocks]


MEMORY_SHARE = 0.5  # a verify may use at most this share of the machine's available memory


def memory_needed(spec: Spec, batch: int, itemsize: int, tables: bool = False) -> int:
    """Bytes one initialisation of ``batch`` sequences holds at its peak: weights, the stream at every layer,
    and the per-block caches the backward needs (attention matrices, projections, MLP activations); `tables`:
    the full embedding tables too (the PyTorch model builds them; numpy draws only the rows it uses)."""
    d, f, T, H, L = spec.d_model, spec.d_ff, spec.seq_len, spec.heads, spec.layers
    if spec.moe is not None:  # every expert (and the shared ones) runs on every token in the numpy network
        f = max(f, (spec.moe.experts + spec.moe.shared) * spec.moe.d_ff)
    gates = 2 if spec.activation in GATED else 1
    P = block_params(spec)  # the projections' widths as built: head_dim, GQA, latent attention's equivalent heads
    att = (P.heads + P.kv_heads) * P.d_head  # queries and outputs, keys and values
    weights = 2 * d * att + (1 + gates) * d * f
    per_block = (2 + (spec.attention_dropout > 0)) * H * T * T + 4 * T * d + 2 * T * att + (1 + 2 * gates) * T * f
    w = spec.embedding_width or d  # the tables' width, projected to d by a w x d matrix where it differs
    table = spec.vocab * w + (T if "position" in spec.embeddings else 0) * w if tables else 0
    proj = w * d + batch * 2 * T * w if spec.embedding_width else 0
    return int(itemsize * (L * weights + table + proj + batch * (L * per_block + (L + 2) * T * d)))


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (else the physical memory), at most the address space this process may still
    take (a soft RLIMIT_AS, as a CI runner or a job scheduler sets, less what it holds)."""
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            have = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                held = int(f.read().split()[0]) * resource.getpagesize()
            have = min(have, max(soft - held, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return have


def check_memory(spec: Spec, batch: int, itemsize: int, tables: bool = False) -> None:
    """Refuse, before allocating, a measurement that would not fit in memory."""
    need, have = memory_needed(spec, batch, itemsize, tables), available_memory()
    if need > MEMORY_SHARE * have:
        raise SpecError(f"measuring this network needs about {need / 2**30:.3g} GiB, over {MEMORY_SHARE:g} of the "
                        f"{have / 2**30:.3g} GiB available: fewer layers, a smaller d_model, d_ff, vocab or sequence "
                        "length (--seq-len) or --batch", spec.source or "<spec>")


def make_input(stack: Stack, batch: int, rng: np.random.Generator, dtype: Any = np.float64) -> np.ndarray:
    """Stream index 0: embeddings, embedding norm (if any), dropout (training mode)."""
    return stack.embeddings.forward(batch, rng, _check_dtype(dtype))


def block_forward(ops: tuple, W: dict, h: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list]:
    """One block; the caches hold what the backward needs, the dropout keep-masks included."""
    return numpy_forward(ops, h, W, rng)


def forward(stack: Stack, weights: list[dict], h0: np.ndarray, rng: np.random.Generator
            ) -> tuple[list[np.ndarray], list[list]]:
    """Run all blocks from stream 0. Returns the streams h_0..h_L and the per-block caches."""
    hs, caches = [h0], []
    for ops, W in zip(stack.blocks, weights):
        h, c = block_forward(ops, W, hs[-1], rng)
        hs.append(h)
        caches.append(c)
    return hs, caches


def backward(stack: Stack, weights: list[dict], caches: list[list], G: np.ndarray,
             wgrads: dict[str, list] | None = None) -> list[np.ndarray]:
    """Gradients g_0..g_L of loss = sum(h_L * G) with respect to every stream index.

    If ``wgrads`` is a dict with lists under 'wq', 'wk', 'wv', the per-sequence squared Frobenius norms of
    the gradients of W_Q, W_K, W_V are appended to them, last block first."""
    gs = [G]
    for ops, W, c in zip(reversed(stack.blocks), reversed(weights), reversed(caches)):
        gs.append(numpy_backward(ops, gs[-1], W, c, wgrads))
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
    stack: Stack, batch: int, rng: np.random.Generator, dtype: Any = np.float64, weight_grads: bool = True
) -> dict[str, np.ndarray]:
    """One initialisation, ``batch`` sequences: per-sequence raw moments (arrays with leading axis batch)."""
    dt = _check_dtype(dtype)
    layers = init_network(stack, rng, dt)
    h0 = make_input(stack, batch, rng, dt)
    hs, caches = forward(stack, layers, h0, rng)
    spans = thirds(stack.embeddings.seq_len)
    L = len(stack.layers)
    q = np.empty((batch, L + 1))
    p = np.empty((batch, L + 1))
    q3 = np.empty((batch, L + 1, 3))
    p3 = np.empty((batch, L + 1, 3))
    for i, h in enumerate(hs):
        q[:, i], p[:, i] = pair_moments(h)
        for j, (lo, hi) in enumerate(spans):
            q3[:, i, j], p3[:, i, j] = pair_moments(h, lo, hi)
    y2 = np.stack([find(ops, c, Attention)["y2"] for ops, c in zip(stack.blocks, caches)], axis=1)
    del hs
    G = rng.standard_normal(h0.shape, dtype=dt)
    wg: dict[str, list] | None = {"wq": [], "wk": [], "wv": []} if weight_grads else None
    gs = backward(stack, layers, caches, G, wg)
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
    net = from_spec(spec)
    runs = []
    t0 = time.perf_counter()
    for s in range(seeds):
        rng = np.random.default_rng([rng_seed, s])
        runs.append(run_one(net, batch, rng, dt, weight_grads))
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
