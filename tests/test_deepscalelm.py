"""DeepScaleLM moments (initadvisor.core.deepscalelm) against Monte-Carlo runs of the real operations.

Each component is run in numpy (float64, fixed seeds) on Gaussian inputs equicorrelated along the
sequence (x = mu + sigma (sqrt(r) eps + sqrt(1-r) delta), eps shared by the tokens), with random
Gaussian weights, and backpropagated by hand from an upstream gradient G of the same kind (the
gradient of sum(out * G)), over a grid of settings like 004 Table 22 / digest §10, scaled to a CPU.

Error per setting, as in the authors' `calc_err`: variances |a - p| / |a|; means and covariances
min(|a - p| / |a|, |a - p| / scale), scale = predicted std (mean) or predicted variance (covariance),
i.e. a covariance error is at most its error in correlation units. We report 50/90/99th percentiles
and assert the 90th is within 10% (attention entries: see below); `pytest -s` prints the table.

The exception is the attention input gradient, whose formula ignores the Q/K path (004 A.8, App. L.2;
the paper's own SHA gradient error is [2.2, 13.3, 44.5] %). Measured here (fixed seeds, this grid):
    Single-head attention  grad_var         p50 3.4%  p90 13.8%  p99 33.9%
    Single-head attention  grad_var V-path  p50 2.6%  p90  6.5%  p99 13.3%
    Attention block        grad_var         p50 4.4%  p90  9.6%  p99 14.6%
    Attention block        grad_var V-path  p50 4.2%  p90  8.2%  p99 10.9%
With the Q/K contribution removed from the simulated backward ("V-path") the same formula is within
10% at p90, so the excess is the omitted Q/K path; it matters most when r_g is small (the value-path
gradient is then O(1/L)). We assert p50 <= 10% and p90 <= 30% for the full gradient (about twice the paper's
p90; our L is 128-256, not 300-1000).
Seed robustness (the grid and the Monte-Carlo draws both follow the seed): over 10 seeds the p90 of every
Linear/activation/LayerNorm/dropout/softmax/FFN/embedding entry stayed below 4%, so their 10% bound is safe.
The attention entries' p90 moves more (sd 1-2 points; the full gradient's 4-5): their bounds are about the
mean + 3 sd of the p90 over those 10 seeds (ATTN_P90, and 30% for the full gradient), where 10% and 25%
failed at 4 of 10 seeds (p90 up to 10.4%, 11.8% and 22.5%).
At DeepScaleLM's own Q/K init (var 1/d, logit variance ~1), outside the paper's range, the forward
still holds but the backward is off even on the value path (grad_var p90 ~71%, V-path ~43%): the
attention is no longer near-uniform, which the backward formula assumes. Those rows are reported only.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.special import ndtr  # noqa: E402

from initadvisor.core import deepscalelm as ds  # noqa: E402
from initadvisor.core.deepscalelm import Moments  # noqa: E402

RESULTS: list[tuple[str, str, float, float, float]] = []
ATTN_P90 = 0.12  # attention forward / covariance / value-path p90 bound: mean + 3 sd over 10 seeds is 8.1-12.3%
ATTN_V_PATH_P90 = 0.14  # the attention block's value-path gradient: p90 mean 9.4%, sd 1.6% over 10 seeds
GRAD_P90 = 0.30  # the full attention gradient (Q/K path omitted by the formula): p90 mean 12-14%, sd 4-5%


@pytest.fixture(scope="module", autouse=True)
def _print_table():
    yield
    if RESULTS:
        print("\n\nDeepScaleLM closed forms vs Monte-Carlo: relative error (%) over the grid")
        print(f"{'component':<22} {'quantity':<30} {'p50':>6} {'p90':>6} {'p99':>6}")
        for comp, q, p50, p90, p99 in RESULTS:
            print(f"{comp:<22} {q:<30} {p50:6.1f} {p90:6.1f} {p99:6.1f}")


# ---------------------------------------------------------------------------------------------
# Monte-Carlo helpers


def _grid(seed, n, **axes):
    """n settings drawn without replacement from the product of the axes (all if fewer)."""
    rows = list(itertools.product(*axes.values()))
    rng = np.random.default_rng(seed)
    if n < len(rows):
        rows = [rows[i] for i in rng.choice(len(rows), n, replace=False)]
    return [dict(zip(axes, row)) for row in rows]


def _eqcorr(rng, shape, axis, mean, var, corr):
    """Gaussian array, equicorrelated (corr) along `axis`, independent elsewhere."""
    shared_shape = list(shape)
    shared_shape[axis] = 1
    eps = rng.standard_normal(shared_shape)
    own = rng.standard_normal(shape)
    return mean + np.sqrt(var) * (np.sqrt(corr) * eps + np.sqrt(1 - corr) * own)


def _stats(y, axis):
    """Pooled mean, variance and mean cross-token covariance (tokens along `axis`)."""
    y = np.moveaxis(y, axis, -1)
    L = y.shape[-1]
    y = y.reshape(-1, L)
    m = y.mean()
    sq = (y * y).sum(-1)
    s = y.sum(-1)
    off = ((s * s - sq) / (L * (L - 1))).mean()
    return m, sq.mean() / L - m * m, off - m * m


def _bmm(x, w):
    """(K, B, L, m) @ (K, m, n) -> (K, B, L, n): one weight draw per leading index."""
    K, B, L, m = x.shape
    return (x.reshape(K, B * L, m) @ w).reshape(K, B, L, w.shape[-1])


def _rel(a, p):
    return abs(a - p) / abs(a)


def _scaled(a, p, scale):
    return min(abs(a - p) / abs(a), abs(a - p) / abs(scale))


class _Errors:
    def __init__(self):
        self.e: dict[str, list[float]] = {}

    def add(self, q, err):
        self.e.setdefault(q, []).append(float(err))

    def add_all(self, pred: Moments, x=None, g=None, mean=True):
        """x = (mean, var, cov) of the simulated output, g = (mean, var, cov) of the input gradient."""
        if x is not None:
            if mean:
                self.add("mean", _scaled(x[0], float(pred.mean), np.sqrt(float(pred.var))))
            self.add("var", _rel(x[1], float(pred.var)))
            if not np.isnan(pred.corr):
                self.add("cov", _scaled(x[2], float(pred.cov), float(pred.var)))
        if g is not None:
            self.add("grad_var", _rel(g[1], float(pred.grad_var)))
            if not np.isnan(pred.grad_corr):
                self.add("grad_cov", _scaled(g[2], float(pred.grad_cov), float(pred.grad_var)))

    def check(self, component, bound=0.10, loose=None, record_only=()):
        """Record percentiles; assert p90 <= bound (quantities in `loose`: p50 <= bound, p90 <= loose[q];
        quantities in `record_only`: reported, not asserted)."""
        loose = loose or {}
        failures = []
        for q, errs in self.e.items():
            p50, p90, p99 = np.percentile(errs, [50, 90, 99])
            RESULTS.append((component, q + (" (not asserted)" if q in record_only else ""),
                            100 * p50, 100 * p90, 100 * p99))
            if q in record_only:
                continue
            if q in loose:
                if p50 > bound or p90 > loose[q]:
                    failures.append(f"{q}: p50 {p50:.3f}, p90 {p90:.3f} (bound {bound}, {loose[q]})")
            elif p90 > bound:
                failures.append(f"{q}: p90 {p90:.3f} > {bound}")
        assert not failures, f"{component}: " + "; ".join(failures)


def _layernorm(x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    s = np.sqrt(x.var(-1, keepdims=True) + eps)
    return (x - mu) / s, s


def _layernorm_back(xhat, s, g):
    """Exact LayerNorm input gradient (gain 1): (g - mean(g) - xhat mean(g xhat)) / s."""
    return (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)) / s


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attention(rng, x, wq, wk, wv, heads, p, g):
    """Multi-head attention forward, and backward of sum(out * g): (out, dx, dx via V only).

    x: (B, L, d_in); wq, wk, wv: (d_in, d_v); g: (B, L, d_v). Dropout p on the probabilities.
    """
    B, L, _ = x.shape
    dv = wv.shape[1]
    dh = dv // heads

    def split(t):
        return t.reshape(B, L, heads, dh).transpose(0, 2, 1, 3)

    def merge(t):
        return t.transpose(0, 2, 1, 3).reshape(B, L, dv)

    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
    prob = _softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh))
    mask = (rng.random(prob.shape) >= p) / (1 - p)
    a = prob * mask
    out = merge(a @ v)
    gh = split(g)
    dv_ = a.transpose(0, 1, 3, 2) @ gh
    dprob = (gh @ v.transpose(0, 1, 3, 2)) * mask
    ds_ = prob * (dprob - (dprob * prob).sum(-1, keepdims=True)) / np.sqrt(dh)
    dq, dk = ds_ @ k, ds_.transpose(0, 1, 3, 2) @ q
    dx_v = merge(dv_) @ wv.T
    dx = merge(dq) @ wq.T + merge(dk) @ wk.T + dx_v
    return out, dx, dx_v


# ---------------------------------------------------------------------------------------------
# Harness self-check: the hand-written attention backward against finite differences


def test_attention_backward_matches_finite_differences():
    rng = np.random.default_rng(1)
    B, L, d, dv, heads = 2, 5, 6, 4, 2
    x = rng.standard_normal((B, L, d))
    wq, wk, wv = (rng.standard_normal((d, dv)) for _ in range(3))
    g = rng.standard_normal((B, L, dv))
    _, dx, _ = _attention(np.random.default_rng(2), x, wq, wk, wv, heads, 0.0, g)
    num = np.zeros_like(x)
    h = 1e-6
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        fp = np.sum(_attention(np.random.default_rng(2), xp, wq, wk, wv, heads, 0.0, g)[0] * g)
        fm = np.sum(_attention(np.random.default_rng(2), xm, wq, wk, wv, heads, 0.0, g)[0] * g)
        num[idx] = (fp - fm) / (2 * h)
    np.testing.assert_allclose(dx, num, rtol=1e-6, atol=1e-8)
    xhat, s = _layernorm(x)
    gl = rng.standard_normal(x.shape)
    num = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        num[idx] = (np.sum(_layernorm(xp)[0] * gl) - np.sum(_layernorm(xm)[0] * gl)) / (2 * h)
    np.testing.assert_allclose(_layernorm_back(xhat, s, gl), num, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------------
# Components vs Monte-Carlo

_SIG2 = (0.1, 1.0, 10.0)


def test_linear_mc():
    rng = np.random.default_rng(10)
    errs = _Errors()
    for c in _grid(10, 60, mu=(0.0, 1.0, 10.0), s2=_SIG2, r=(0.0, 0.4, 0.8), gain=(0.1, 1.0, 10.0),
                   g2=_SIG2, rg=(0.0, 0.4, 0.8), d_in=(64, 256), d_out=(64, 256)):
        K, B, L = 4096 // c["d_out"], 16, 4  # K weight draws
        var_w = c["gain"] / c["d_in"]
        x = _eqcorr(rng, (K, B, L, c["d_in"]), 2, c["mu"], c["s2"], c["r"])
        w = rng.normal(0, np.sqrt(var_w), (K, c["d_in"], c["d_out"]))
        g = _eqcorr(rng, (K, B, L, c["d_out"]), 2, 0.0, c["g2"], c["rg"])
        pred = ds.linear(Moments(c["mu"], c["s2"], c["r"]), c["d_in"], c["d_out"], var_w,
                         grad_var_out=c["g2"], grad_corr_out=c["rg"])
        y = _bmm(x, w)
        errs.add_all(pred, _stats(y, 2), _stats(_bmm(g, w.swapaxes(-1, -2)), 2))
    errs.check("Linear")


def _pairs_grid(seed, n=60):
    return _grid(seed, n, s2=_SIG2, r=(0.0, 0.2, 0.4, 0.6, 0.8), g2=_SIG2, rg=(0.0, 0.4, 0.8))


def test_relu_mc():
    rng = np.random.default_rng(11)
    errs = _Errors()
    for c in _pairs_grid(11):
        x = _eqcorr(rng, (50_000, 2), 1, 0.0, c["s2"], c["r"])
        g = _eqcorr(rng, (50_000, 2), 1, 0.0, c["g2"], c["rg"])
        pred = ds.relu(Moments(0.0, c["s2"], c["r"]), grad_var_out=c["g2"], grad_corr_out=c["rg"])
        errs.add_all(pred, _stats(np.maximum(x, 0), 1), _stats(g * (x > 0), 1))
    errs.check("ReLU")


def test_gelu_mc():
    rng = np.random.default_rng(12)
    errs = _Errors()
    for c in _pairs_grid(12):
        x = _eqcorr(rng, (50_000, 2), 1, 0.0, c["s2"], c["r"])
        g = _eqcorr(rng, (50_000, 2), 1, 0.0, c["g2"], c["rg"])
        deriv = ndtr(x) + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi)
        pred = ds.gelu(Moments(0.0, c["s2"], c["r"]), grad_var_out=c["g2"], grad_corr_out=c["rg"])
        errs.add_all(pred, _stats(x * ndtr(x), 1), _stats(g * deriv, 1))
    errs.check("GeLU")


def test_layernorm_mc():
    rng = np.random.default_rng(13)
    errs = _Errors()
    for c in _grid(13, 60, mu=(-10.0, 0.0, 3.0), s2=_SIG2, r=(0.0, 0.2, 0.4, 0.6, 0.8), g2=_SIG2,
                   rg=(0.0, 0.4, 0.8), d=(64, 256, 1024)):
        B, L, d = 16384 // c["d"], 8, c["d"]
        x = _eqcorr(rng, (B, L, d), 1, c["mu"], c["s2"], c["r"])
        g = _eqcorr(rng, (B, L, d), 1, 0.0, c["g2"], c["rg"])
        xhat, s = _layernorm(x)
        pred = ds.layernorm(Moments(c["mu"], c["s2"], c["r"]), d, grad_var_out=c["g2"], grad_corr_out=c["rg"])
        errs.add_all(pred, _stats(xhat, 1), _stats(_layernorm_back(xhat, s, g), 1))
    errs.check("LayerNorm")


def test_dropout_mc():
    rng = np.random.default_rng(14)
    errs = _Errors()
    for c in _grid(14, 60, mu=(-10.0, 0.0, 10.0), s2=_SIG2, r=(0.0, 0.4, 0.8), p=(0.0, 1 / 3, 2 / 3),
                   g2=_SIG2, rg=(0.0, 0.4, 0.8)):
        x = _eqcorr(rng, (50_000, 2), 1, c["mu"], c["s2"], c["r"])
        g = _eqcorr(rng, (50_000, 2), 1, 0.0, c["g2"], c["rg"])
        mask = (rng.random(x.shape) >= c["p"]) / (1 - c["p"])
        pred = ds.dropout(Moments(c["mu"], c["s2"], c["r"]), c["p"], grad_var_out=c["g2"], grad_corr_out=c["rg"])
        errs.add_all(pred, _stats(x * mask, 1), _stats(g * mask, 1))
    errs.check("Dropout")


def test_softmax_mc():
    rng = np.random.default_rng(15)
    errs = _Errors()
    for c in _grid(15, 60, s2=(1e-4, 1e-3, 1e-2, 0.1, 1.0), r=(0.0, 0.2, 0.4, 0.6, 0.8), g2=_SIG2,
                   rg=(0.0, 0.5), L=(300, 1000, 3000)):
        L = c["L"]
        rows = 300_000 // L
        x = _eqcorr(rng, (rows, L), 1, 0.0, c["s2"], c["r"])
        g = _eqcorr(rng, (rows, L), 1, 0.0, c["g2"], c["rg"])
        y = _softmax(x)
        gin = y * (g - (g * y).sum(-1, keepdims=True))
        pred = ds.softmax(Moments(0.0, c["s2"], c["r"]), L, grad_var_out=c["g2"], grad_corr_out=c["rg"])
        errs.add("mean", _rel(y.mean(), float(pred.mean)))
        errs.add("var", _rel(y.var(), float(pred.var)))
        errs.add("grad_var", _rel((gin * gin).mean() - gin.mean() ** 2, float(pred.grad_var)))
    errs.check("Softmax")


def test_single_head_attention_mc():
    rng = np.random.default_rng(16)
    errs = _Errors()
    for c in _grid(16, 48, r=(0.0, 1 / 3, 2 / 3), gain_v=(0.1, 1.0, 10.0), qk=(0.1, 0.245, 0.6),
                   p=(0.0, 1 / 3, 2 / 3), g2=_SIG2, rg=(0.0, 1 / 3, 2 / 3), d_in=(64, 256),
                   d_k=(64, 128), L=(128, 256)):
        d_in, d_k, L = c["d_in"], c["d_k"], c["L"]
        B = 4096 // d_k
        var_q = var_k = c["qk"] ** 2 / d_in  # sigma_q sqrt(d_in) = qk, as in SHA.py
        var_v = c["gain_v"] / d_in
        x = _eqcorr(rng, (B, L, d_in), 1, 0.0, 1.0, c["r"])
        g = _eqcorr(rng, (B, L, d_k), 1, 0.0, c["g2"], c["rg"])
        wq, wk, wv = (rng.normal(0, np.sqrt(v), (d_in, d_k)) for v in (var_q, var_k, var_v))
        ch = max(1, 2**19 // L**2)  # batch chunks keep the (B, L, L) arrays small
        out, dx, dx_v = (np.concatenate(t) for t in zip(*(
            _attention(rng, x[i:i + ch], wq, wk, wv, 1, c["p"], g[i:i + ch]) for i in range(0, B, ch))))
        pred = ds.single_head_attention(Moments(0.0, 1.0, c["r"]), d_in, d_k, var_q, var_k, var_v, L, c["p"],
                                        grad_var_out=c["g2"], grad_corr_out=c["rg"])
        errs.add_all(pred, _stats(out, 1), _stats(dx, 1))
        gv = _stats(dx_v, 1)
        errs.add("grad_var V-path", _rel(gv[1], float(pred.grad_var)))
    errs.check("Single-head attention", bound=ATTN_P90, loose={"grad_var": GRAD_P90})


def _attention_block_errors(seed, n, qk):
    rng = np.random.default_rng(seed)
    errs = _Errors()
    d, heads = 128, 4
    for c in _grid(seed, n, mu=(0.0, 2.0), s2=(0.5, 4.0), r=(0.2, 0.5, 0.8), p=(0.0, 0.1, 0.3), qk=qk,
                   init=("xavier", "dslm"), g2=(0.3, 3.0), rg=(0.0, 0.5, 0.9), L=(64, 128)):
        L, B = c["L"], 16
        var_q = var_k = c["qk"] ** 2 / d
        if c["init"] == "xavier":
            var_v, var_o = 2 / (d + d // heads), 1 / d
        else:
            var_v = var_o = np.sqrt((1 - c["p"]) / c["r"]) / d
        x = _eqcorr(rng, (B, L, d), 1, c["mu"], c["s2"], c["r"])
        g = _eqcorr(rng, (B, L, d), 1, 0.0, c["g2"], c["rg"])
        wq, wk, wv, wo = (rng.normal(0, np.sqrt(v), (d, d)) for v in (var_q, var_k, var_v, var_o))
        xhat, s = _layernorm(x)
        mask = (rng.random((B, L, d)) >= c["p"]) / (1 - c["p"])
        dy = (g * mask) @ wo.T
        att, dxhat, dxhat_v = _attention(rng, xhat, wq, wk, wv, heads, c["p"], dy)
        out = (att @ wo) * mask
        pred = ds.attention_block(Moments(c["mu"], c["s2"], c["r"]), d, var_q, var_k, var_v, var_o, L, c["p"],
                                  grad_var_out=c["g2"], grad_corr_out=c["rg"])
        errs.add_all(pred, _stats(out, 1), _stats(_layernorm_back(xhat, s, dxhat), 1))
        errs.add("grad_var V-path", _rel(_stats(_layernorm_back(xhat, s, dxhat_v), 1)[1], float(pred.grad_var)))
    return errs


def test_attention_block_mc():
    """Pre-LN attention block, 4 heads, Q/K std * sqrt(d) in the SHA.py range."""
    _attention_block_errors(17, 30, (0.1, 0.245, 0.6)).check(
        "Attention block", bound=ATTN_P90, loose={"grad_var": GRAD_P90, "grad_var V-path": ATTN_V_PATH_P90})


def test_attention_block_dslm_qk_mc():
    """Same at DeepScaleLM's Q/K init (var 1/d, logit variance ~1), outside the paper's validated range:
    the forward holds; the backward does not (attention is no longer uniform and the Q/K path is
    large, digest §12), so the gradient errors are only reported."""
    errs = _attention_block_errors(21, 16, (1.0,))
    errs.check("Attn block, DSLM QK", bound=ATTN_P90, record_only=("grad_var", "grad_cov", "grad_var V-path"))


def test_ffn_block_mc():
    rng = np.random.default_rng(18)
    errs = _Errors()
    for c in _grid(18, 40, mu=(0.0, 3.0), s2=(0.3, 3.0), r=(0.0, 0.4, 0.8), p=(0.0, 0.1, 0.5),
                   gain1=(0.5, 2.0), gain2=(0.5, 2.0), act=("relu", "gelu"), pre=(True, False),
                   g2=(0.3, 3.0), rg=(0.0, 0.5, 0.9), d=(64, 128)):
        d, L = c["d"], 8
        K, B = 8, 32
        mu, s2 = (c["mu"], c["s2"]) if c["pre"] else (0.0, 1.0)  # Post-LN block input is normalised
        var_w1, var_w2 = c["gain1"] / d, c["gain2"] / (4 * d)
        x = _eqcorr(rng, (K, B, L, d), 2, mu, s2, c["r"])
        g = _eqcorr(rng, (K, B, L, d), 2, 0.0, c["g2"], c["rg"])
        w1 = rng.normal(0, np.sqrt(var_w1), (K, d, 4 * d))
        w2 = rng.normal(0, np.sqrt(var_w2), (K, 4 * d, d))
        mask = (rng.random(x.shape) >= c["p"]) / (1 - c["p"])
        xhat, s = _layernorm(x) if c["pre"] else (x, None)
        h = _bmm(xhat, w1)
        if c["act"] == "relu":
            a, da = np.maximum(h, 0), (h > 0).astype(float)
        else:
            a, da = h * ndtr(h), ndtr(h) + h * np.exp(-h * h / 2) / np.sqrt(2 * np.pi)
        out = _bmm(a, w2) * mask
        dxhat = _bmm(_bmm(g * mask, w2.swapaxes(-1, -2)) * da, w1.swapaxes(-1, -2))
        dx = _layernorm_back(xhat, s, dxhat) if c["pre"] else dxhat
        pred = ds.ffn_block(Moments(mu, s2, c["r"]), d, var_w1, var_w2, c["p"], activation=c["act"],
                            norm_first=c["pre"], grad_var_out=c["g2"], grad_corr_out=c["rg"])
        errs.add_all(pred, _stats(out, 2), _stats(dx, 2))
    errs.check("FFN block")


def _zipf(vocab):
    p = 1.0 / np.arange(1, vocab + 1)
    return p / p.sum()


def test_embeddings_mc():
    rng = np.random.default_rng(19)
    errs = _Errors()
    for vocab, L, var_e in itertools.product((1000, 4000), (64, 256), (0.3, 1.0)):
        K, B, d = 32, 16, 64
        ids = rng.choice(vocab, size=(K, B, L), p=_zipf(vocab))
        n1 = np.rint(rng.uniform(0, L, (K, B, 1))).astype(int)  # segment 0 for positions < n1
        seg = (np.arange(L) >= n1).astype(int)
        tok = rng.normal(0, np.sqrt(var_e), (K, vocab, d))
        segt = rng.normal(0, np.sqrt(var_e), (K, 2, d))
        post = rng.normal(0, np.sqrt(var_e), (K, L, d))
        kk = np.arange(K)[:, None, None]
        out = tok[kk, ids] + segt[kk, seg] + post[:, None, :, :]
        pred = ds.embeddings(vocab, L, var_e, exact=True)
        errs.add_all(pred, _stats(out, 2))
    errs.check("Embeddings")


def test_token_corr_exact_mc():
    """r^l of token lookups = P(two tokens of a sequence share an id) = sum p_i^2 for i.i.d. Zipf ids."""
    rng = np.random.default_rng(20)
    for vocab in (1000, 32000):
        rows, L = 4000, 256
        ids = rng.choice(vocab, size=(rows, L), p=_zipf(vocab))
        _, counts = np.unique(ids + vocab * np.arange(rows)[:, None], return_counts=True)
        match = np.sum(counts * (counts - 1.0)) / (rows * L * (L - 1))  # mean of sum N_i(N_i-1)/(L(L-1))
        assert abs(match - float(ds.token_corr(vocab, exact=True))) < 0.03 * match


# ---------------------------------------------------------------------------------------------
# Closed forms against numbers quoted in the digest (computed there independently)


def test_gelu_digest_values():
    # digest §12: sigma^2 = 2, r = 0.7 -> mean 0.46066, var 0.70988, cov 0.44672, E[g'^2] 0.48951, E[g'g'] 0.39519
    m = ds.gelu(Moments(0.0, 2.0, 0.7), grad_var_out=1.0, grad_corr_out=1.0)
    assert float(m.mean) == pytest.approx(0.46066, abs=1e-5)
    assert float(m.var) == pytest.approx(0.70988, abs=1e-5)
    assert float(m.cov) == pytest.approx(0.44672, abs=1e-5)
    assert float(m.grad_var) == pytest.approx(0.48951, abs=1e-5)
    assert float(m.grad_cov) == pytest.approx(0.39519, abs=1e-5)


def test_relu_and_ffn_corr_digest_values():
    # digest §1.4: full vs 0.7r + 0.3r^2 at r = 0.2, 0.5, 0.9
    r = np.array([0.2, 0.5, 0.9])
    np.testing.assert_allclose(ds.relu(Moments(0.0, 1.0, r)).corr, [0.1561, 0.4264, 0.8673], atol=5e-5)
    np.testing.assert_allclose(ds.relu(Moments(0.0, 1.0, r), approx=True).corr, [0.1520, 0.4250, 0.8730], atol=5e-5)
    # digest §2.1: FFN block correlation (p = 0) at r = 0, 0.5, 0.9: 0.31831, 0.60900, 0.90954
    r = np.array([0.0, 0.5, 0.9])
    m = ds.ffn_block(Moments(0.0, 1.0, r), 512, 1 / 512, 1 / 512, 0.0, norm_first=False)
    np.testing.assert_allclose(m.corr, [0.31831, 0.60900, 0.90954], atol=5e-5)
    np.testing.assert_allclose(m.var, 2.0)  # 2 d^2 var_w1 var_w2 sigma^2 (004 Table 2)


def test_embeddings_digest_values():
    # digest §1.1 / §5: |V| = 32000, L = 256 -> 0.22732 (paper 0.227); segment exact 0.66536
    assert float(ds.embeddings(32000, 256, 1.0).corr) == pytest.approx(0.22732, abs=5e-6)
    assert float(ds.embeddings(30522, 256, 1.0).corr) == pytest.approx(0.22736, abs=5e-6)
    assert float(ds.segment_corr(256, exact=True)) == pytest.approx(0.66536, abs=5e-6)
    assert float(ds.embeddings(32000, 256, 0.3).var) == pytest.approx(0.9)


def test_sha_gradient_uses_one_power_of_keep_prob():
    # digest §1.8: the code form /(L(1-p)), not Table 17's /(L(1-p)^2); d_v var_v = 1, g^2 = 1
    L, p, rg = 256, 0.5, 0.3
    m = ds.single_head_attention(Moments(0.0, 1.0, 0.5), 128, 128, 1e-6, 1e-6, 1 / 128, L, p,
                                 grad_var_out=1.0, grad_corr_out=rg)
    assert float(m.grad_var) == pytest.approx((1 + (L - 1) * rg * (1 - p)) / (L * (1 - p)))
    assert float(m.grad_cov) == pytest.approx((1 + (L - 1) * rg) / L)


def test_vectorised_and_zero_mean_guard():
    s2 = np.array([0.5, 1.0, 2.0])
    m = ds.gelu(Moments(0.0, s2, 0.3))
    assert m.var.shape == (3,)
    with pytest.raises(ValueError):
        ds.relu(Moments(1.0, 1.0, 0.0))


# ---------------------------------------------------------------------------------------------
# DeepScaleLM init: digest §4.3 vectors


@pytest.mark.parametrize("n, expected", [(12, 0.7948), (48, 0.7907), (192, 0.7896), (768, 0.7894)])
def test_corr_recurrence_pseudocode_vectors(n, expected):
    r = ds.corr_input_layerwise(0.227, n, 0.1, 1 - 2 / n, 2 / n)
    assert r[0] == pytest.approx(0.2043, abs=5e-5)
    assert r[-1] == pytest.approx(expected, abs=5e-5)
    assert r.max() < 1 - np.exp(-2)  # 004 §3.5 rank-collapse bound


def test_dslm_init_code_vectors_n192():
    init = ds.dslm_init(192, 1024, 0.1)  # r0 = 0.221 (authors' code), beta2 = 2/N
    assert init.lambda2 == pytest.approx(1 - 2 / 192) and init.beta2 == pytest.approx(2 / 192)
    assert init.corr_in[0] == pytest.approx(0.1989, abs=5e-5)
    assert np.sqrt(init.var_vo[0]) == pytest.approx(0.04558, abs=5e-6)
    assert 1024 * init.var_vo[0] == pytest.approx(2.127, abs=5e-4)
    assert init.corr_in[191] == pytest.approx(0.7887, abs=5e-5)
    assert np.sqrt(init.var_vo[191]) == pytest.approx(0.03230, abs=5e-6)
    assert 1024 * init.var_vo[191] == pytest.approx(1.068, abs=5e-4)
    assert init.corr_in[-1] == pytest.approx(0.7893, abs=5e-5)
    default = ds.dslm_init(192, 1024, 0.1, beta2=0.005)  # repo defaults lambda^2 = 0.995, beta^2 = 0.005
    assert default.corr_in[-1] == pytest.approx(0.6597, abs=5e-5)
    assert 1024 * default.var_vo[-1] == pytest.approx(1.169, abs=5e-4)


def test_dslm_init_layer_table_n12():
    init = ds.dslm_init(12, 256, 0.1, r0=0.227)
    layers = [1, 2, 3, 4, 6, 8, 12]
    r = [0.20430, 0.34111, 0.44678, 0.52886, 0.64310, 0.71361, 0.78513]
    dvar = [2.09888, 1.62433, 1.41931, 1.30453, 1.18299, 1.12303, 1.07066]
    std = [0.09055, 0.07966, 0.07446, 0.07138, 0.06798, 0.06623, 0.06467]
    idx = np.array(layers) - 1
    np.testing.assert_allclose(init.corr_in[idx], r, atol=5e-6)
    np.testing.assert_allclose(256 * init.var_vo[idx], dvar, atol=5e-6)
    np.testing.assert_allclose(np.sqrt(init.var_vo[idx]), std, atol=5e-6)


def test_dslm_init_variances_and_variants():
    init = ds.dslm_init(48, 512, 0.1)
    assert init.var_embd == pytest.approx(0.3)  # (1-p)/3
    assert np.sqrt(init.var_qk) == pytest.approx(0.0442, abs=5e-5)  # code comment "0.044"
    assert np.sqrt(init.var_ffn) == pytest.approx(0.0362, abs=5e-5)  # code comment "#0.036"
    # FFN trap: C2 = 2 d^2 var_f^2 / (1-p) = 1, i.e. the FFN block keeps unit variance
    ffn = ds.ffn_block(Moments(0.0, 1.0, 0.5), 512, init.var_ffn, init.var_ffn, 0.1)
    assert float(ffn.var) == pytest.approx(1.0)
    # attention block variance d^2 var_v var_o r / (1-p) = 1 at small QK, per layer
    n = 10
    r_in = init.corr_in[n - 1]
    att = ds.attention_block(Moments(0.0, 1.0, r_in / (1 - 1 / 512)), 512, 1e-9, 1e-9, init.var_vo[n - 1],
                             init.var_vo[n - 1], 10**6, 0.1)
    assert float(att.var) == pytest.approx(1.0, rel=1e-4)
    simple = ds.dslm_init(48, 512, 0.1, simplified=True)
    np.testing.assert_allclose(simple.var_vo, simple.var_ffn)
    assert init.gradient_bound_proven and not init.caveats
    post = ds.dslm_init(48, 512, 0.1, post_ln=True)
    assert not post.gradient_bound_proven and "k/N^2" in post.caveats[0]
    assert ds.dslm_init(48, 512, 0.1, post_ln=True, beta2=2 / 48**2).gradient_bound_proven
