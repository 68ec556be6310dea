"""Position-resolved propagation for causal models (core/causal.py) against the numpy Monte-Carlo.

The judge is `initadvisor.simulate` (the actual random causal network); expected values never come from
the code under test. Error = mean over layers 1..L of |prediction - MC| of rho (simulate's ratio of
averages), over all positions and over the first / middle / last third.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from initadvisor.core import kernels
from initadvisor.core.causal import pair_kernel, propagate_causal, propagate_overlaps
from initadvisor.core.model import block_params, run_spec
from initadvisor.simulate import _attn_fwd, _norm_fwd, init_layer, make_input, simulate
from initadvisor.spec import build_spec

TOL_MEAN = 0.03  # absolute, per layer: resolved rho (all positions) vs MC
TOL_THIRD = 0.045  # absolute, per layer and per third (MC se up to ~0.01 per third)


def causal_spec(norm="pre", act="gelu", beta=0.1, T=64, L=8, d=256, g_vo=1.0, rho0=0.0,
                emb=("token",), std=None, vocab=1000):
    init = {"std": std if std is not None else 1 / math.sqrt(d), "embedding": {"std": 1.0}}
    if beta is not None:
        init["qk_beta"] = beta
    if g_vo is not None:
        init["v"] = {"gain": g_vo}
        init["o"] = {"gain": g_vo}
    seq = {"length": T, "vocab": vocab, "embeddings": list(emb)}
    if rho0 is not None:
        seq["input_correlation"] = rho0
    return build_spec({
        "model": {"layers": L, "d_model": d, "heads": 4, "d_ff": 512, "norm": norm, "causal": True,
                  "activation": act},
        "sequence": seq, "init": init,
    })


# name -> spec kwargs. Strong value path (g_V g_O = 4) makes the causal structure visible above MC noise.
MODELS = {
    "post-LN ReLU beta=0.1 rho0=0": dict(norm="post", act="relu", beta=0.1, g_vo=2.0, rho0=0.0),
    "post-LN GeLU beta=0.8 rho0=0.1": dict(norm="post", act="gelu", beta=0.8, g_vo=2.0, rho0=0.1),
    "pre-LN GeLU beta=0.1 token+position": dict(norm="pre", act="gelu", beta=0.1, g_vo=2.0, rho0=None,
                                                emb=("token", "position")),
    "pre-LN ReLU beta=0.5 rho0=0.1": dict(norm="pre", act="relu", beta=0.5, g_vo=2.0, rho0=0.1),
    "pre-LN GeLU beta=0.1 T=96 L=6 rho0=0": dict(norm="pre", act="gelu", beta=0.1, g_vo=2.0, rho0=0.0, T=96, L=6),
}
SEEDS, BATCH = 10, 4


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, kw in MODELS.items():
        spec = causal_spec(**kw)
        mc = simulate(spec, seeds=SEEDS, batch=BATCH, weight_grads=False)
        res = propagate_causal(spec)
        single = run_spec(spec).rho
        out[name] = (spec, mc, res, single)
    return out


def _errors(mc, res, single):
    mae = lambda a, b: float(np.mean(np.abs(np.asarray(a) - np.asarray(b))[1:]))  # noqa: E731
    rows = {"mean": (mc.rho, res.rho_mean)}
    for j, lab in enumerate(("early", "middle", "late")):
        rows[lab] = (mc.rho_thirds[:, j], res.rho_thirds[:, j])
    return {k: (mae(single, m), mae(r, m), float(np.max(np.abs(r - m)[1:]))) for k, (m, r) in rows.items()}


def test_resolved_beats_single_pair(results):
    lines = [f"{'model':40s} " + "  ".join(f"{k:>19s}" for k in ("early", "middle", "late", "mean"))]
    for name, (spec, mc, res, single) in results.items():
        e = _errors(mc, res, single)
        lines.append(f"{name:40s} " + "  ".join(f"{e[k][0]:.4f} -> {e[k][1]:.4f}   " for k in
                                                 ("early", "middle", "late", "mean")))
    print("\nrho MAE over layers, single-pair -> position-resolved\n" + "\n".join(lines))
    for name, (spec, mc, res, single) in results.items():
        e = _errors(mc, res, single)
        assert e["mean"][1] < e["mean"][0], (name, e)
        assert e["early"][1] < e["early"][0], (name, e)
        # Late third: 001 C.6 built the single pair for late tokens, so the two predictions differ there by
        # little (mean |resolved - single| over layers ~ 0.005 here, comparable to finite-d / MC effects).
        # Measured: resolved strictly better on 2 of 5 models, tied on 1, worse on 2 (see the report);
        # asserted: never worse than the single pair by more than 0.01.
        sep = float(np.mean(np.abs(res.rho_thirds[1:, 2] - single[1:])))
        se = float(np.mean(mc.rho_thirds_se[1:, 2]))
        assert e["late"][1] < e["late"][0] + 0.01, (name, e, sep, se)
        print(f"{name}: late |resolved - single| {sep:.4f}, MC se {se:.4f}")


def test_resolved_within_tolerance_per_layer(results):
    for name, (spec, mc, res, single) in results.items():
        assert np.all(np.abs(res.rho_mean - mc.rho) < TOL_MEAN), (name, res.rho_mean, mc.rho)
        assert np.all(np.abs(res.rho_thirds - mc.rho_thirds) < TOL_THIRD), (name, res.rho_thirds, mc.rho_thirds)
        # per-position norms: pre-LN stream grows, post-LN is 1
        assert np.allclose(res.q_thirds, mc.q_thirds, rtol=0.08), (name, res.q_thirds, mc.q_thirds)


# ------------------------------------------------------------------------------------------------
# Chi et al. (003) Lemma 3: Var(o_m) = d^2 sigma^4 / m per coordinate, LayerNormed i.i.d. inputs, uniform attention


def _mc_attention_variance(spec, seeds=12, batch=8):
    acc = np.zeros(spec.seq_len)
    for s in range(seeds):
        rng = np.random.default_rng([7, s])
        w = init_layer(spec, rng)
        x = make_input(spec, batch, rng)
        u = _norm_fwd(x, spec.norm_type)[0] if spec.norm == "pre" else x
        o, _ = _attn_fwd(spec, w, u, rng)
        acc += (o * o).mean(axis=(0, 2))
    return acc / seeds


def test_lemma3_attention_variance_one_over_m():
    d, sigma, T = 256, 0.02, 128
    spec = causal_spec(norm="pre", act="gelu", beta=None, g_vo=None, T=T, L=1, d=d, std=sigma, rho0=0.0)
    # Property 1 (uniform attention) holds: sigma^4 << H / d^2
    assert sigma**4 < 0.01 * spec.heads / d**2
    m = np.arange(1, T + 1)
    lemma3 = d**2 * sigma**4 / m  # paper 003, Lemma 3
    pred = propagate_causal(spec).attention_output_variance_layer1
    np.testing.assert_allclose(pred, lemma3, rtol=0.02)
    mc = _mc_attention_variance(spec)
    # the MC follows 1/m: log-log slope -1, and the level of Lemma 3 within 15% in every octave of positions
    slope = np.polyfit(np.log(m), np.log(mc), 1)[0]
    assert abs(slope + 1) < 0.05, slope
    for lo in (1, 2, 4, 8, 16, 32, 64):
        sl = slice(lo - 1, 2 * lo - 1)
        assert abs(mc[sl].mean() / lemma3[sl].mean() - 1) < 0.15, (lo, mc[sl].mean(), lemma3[sl].mean())
        assert abs(mc[sl].mean() / pred[sl].mean() - 1) < 0.15


def test_lemma3_with_correlated_tokens():
    """With token correlation rho0 the variance tends to g_V g_O (p + (q - p)/m): a floor, not 1/m."""
    d, sigma, T = 256, 0.02, 128
    spec = causal_spec(norm="pre", act="gelu", beta=None, g_vo=None, T=T, L=1, d=d, std=sigma, rho0=0.3)
    m = np.arange(1, T + 1)
    g = (d * sigma**2) ** 2
    expect = g * (0.3 + 0.7 / m)
    pred = propagate_causal(spec).attention_output_variance_layer1
    np.testing.assert_allclose(pred, expect, rtol=0.02)
    mc = _mc_attention_variance(spec, seeds=8, batch=4)
    for lo in (1, 4, 16, 64):
        sl = slice(lo - 1, 2 * lo - 1)
        assert abs(mc[sl].mean() / expect[sl].mean() - 1) < 0.2


# ------------------------------------------------------------------------------------------------
# Pieces


@pytest.mark.parametrize("act", ["relu", "gelu", "tanh", "silu", "gelu_tanh"])
def test_pair_kernel_unequal_variances(act):
    """Unequal variances against a dense 2-D Gauss-Hermite quadrature of the bivariate Gaussian."""
    a, b, c = 0.7, 2.3, 0.9
    z, w = np.polynomial.hermite_e.hermegauss(200)
    w = w / w.sum()
    L = np.linalg.cholesky(np.array([[a, c], [c, b]]))
    Z1, Z2 = np.meshgrid(z, z, indexing="ij")
    W = np.outer(w, w)
    u, v = L[0, 0] * Z1, L[1, 0] * Z1 + L[1, 1] * Z2
    f = (lambda x: np.maximum(x, 0)) if act == "relu" else kernels.PHI[act][0]
    K = pair_kernel(act, np.array([[a, c], [c, b]]))
    tol = 2e-4 if act == "relu" else 1e-7  # the kink limits the quadrature reference for relu
    assert abs(K[0, 1] - (f(u) * f(v) * W).sum()) < tol
    assert abs(K[0, 0] - (f(u) ** 2 * W).sum()) < tol
    assert abs(K[1, 1] - (f(v) ** 2 * W).sum()) < tol


def test_uniform_attention_closed_form():
    """beta -> 0, linear MLP switched off: one block of causal averaging on the simplex, by hand.
    No norm, skip 0: output m = mean of the first m values, overlap g (p + (q - p)/max(m, n))."""
    spec = causal_spec(norm="none", act="linear", beta=0.1, T=32, L=1, g_vo=1.0, rho0=0.25)
    from dataclasses import replace

    P = replace(block_params(spec), beta=1e-9, skip_a=0.0, skip_m=1.0, block_m=0.0)
    tr = propagate_overlaps([P], 1.0, 0.25, 32, keep_overlap=True)
    m = np.arange(1, 33)
    expect = 0.25 + 0.75 / np.maximum.outer(m, m)
    np.testing.assert_allclose(tr.overlap, expect, atol=1e-6)


def test_late_tokens_match_single_pair_for_long_sequences():
    """001 C.6: the single pair describes late tokens; for long T the resolved last third approaches it."""
    spec = causal_spec(norm="post", act="relu", beta=0.3, T=2048, L=12, g_vo=1.0, rho0=0.1)
    res = propagate_causal(spec)
    single = run_spec(spec).rho
    assert np.max(np.abs(res.rho_thirds[:, 2] - single)) < 0.01
    assert res.q.shape == (13, 2048)
