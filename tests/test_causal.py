"""Position-resolved propagation for causal models (core/causal.py) against the numpy Monte-Carlo.

The judge is `initadvisor.simulate` (the actual random causal network); expected values never come from
the code under test. Error = mean over layers 1..L of |prediction - MC| of rho (simulate's ratio of
averages), over all positions and over the first / middle / last third.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from initadvisor.core import kernels, ops
from initadvisor.core.causal import coarser, group_edges, pair_kernel, propagate_overlaps
from initadvisor.core.ops import Attention, Norm, block, leaves
from initadvisor.core.softmax_rows import expected_overlap
from initadvisor.simulate import init_block, make_input, simulate
from initadvisor.stack import block_params, from_spec, run_causal, run_spec
from initadvisor.spec import build_spec

# Absolute, per layer: resolved rho vs MC over all positions, and per third; relative: per-position q. Basis:
# over 10 MC seeds the worst model's largest per-layer error had mean + 3 sd = 0.053 (all positions, post-LN
# GeLU beta = 0.8), 0.063 (per third, pre-LN ReLU beta = 0.5) and 0.089 (q, pre-LN ReLU): those two models
# carry a steady finite-d (d = 256) offset of about 0.025 / 0.04 / 6%, and the former bounds (0.03, 0.045,
# 8%) failed at 3 of 10 seeds.
TOL_MEAN = 0.055
TOL_THIRD = 0.065
TOL_Q = 0.10


def causal_spec(norm="pre", act="gelu", beta=0.1, T=64, L=8, d=256, g_vo=1.0, rho0=0.0,
                emb=("token",), std=None, vocab=1000, d_ff=512):
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
        "model": {"layers": L, "d_model": d, "heads": 4, "d_ff": d_ff, "norm": norm, "causal": True,
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
# One sequence per initialisation: the spread between initialisations dominates, and with 10 seeds x 4 sequences
# the late-third comparisons of test_resolved_beats_single_pair failed at 2 of 10 seeds (none in 9 with 40 x 1).
SEEDS, BATCH = 40, 1


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, kw in MODELS.items():
        spec = causal_spec(**kw)
        mc = simulate(spec, seeds=SEEDS, batch=BATCH, weight_grads=False)
        res = run_causal(spec)
        single = run_spec(spec).rho
        out[name] = (spec, mc, res, single)
    return out


def _errors(mc, res, single):
    mae = lambda a, b: float(np.mean(np.abs(np.asarray(a) - np.asarray(b))[1:]))  # noqa: E731
    rows = {"mean": (mc.rho, res.rho_mean)}
    for j, lab in enumerate(("early", "middle", "late")):
        rows[lab] = (mc.rho_thirds[:, j], res.rho_thirds[:, j])
    return {k: (mae(single, m), mae(r, m), float(np.max(np.abs(r - m)[1:]))) for k, (m, r) in rows.items()}


# Late third, resolved vs single pair, per model: "better" = asserted better up to one MC standard error (over 20
# seed sets the resolved error was typically 0.003 against 0.011, and lower in 37 of 40 comparisons; the other 3
# were within one standard error); "noise" = the two differ by less than the MC can resolve at d = 256, asserted
# within 2 MC standard errors + 0.002 (see the test's docstring).
LATE = {
    "post-LN ReLU beta=0.1 rho0=0": "noise",
    "post-LN GeLU beta=0.8 rho0=0.1": "noise",
    "pre-LN GeLU beta=0.1 token+position": "noise",
    "pre-LN ReLU beta=0.5 rho0=0.1": "better",
    "pre-LN GeLU beta=0.1 T=96 L=6 rho0=0": "better",
}


def test_resolved_beats_single_pair(results):
    """All positions and the early third: the resolved prediction is strictly better on every model.

    Late third (001 C.6 built the single pair for late tokens; the two predictions differ there by 0.002-0.015):
    better (up to one MC standard error) on the models marked "better" in LATE. On "post-LN ReLU beta=0.1" the
    single pair is closer to the d = 256 MC, but only by luck: the MC there is below its large-d limit by a finite-d bias (late rho of
    layer 2: 0.622 at d = 256, 0.640 at d = 512, 0.644 at d = 1024; resolved 0.641, single 0.615), and at d = 512
    the resolved prediction wins clearly (test_late_third_finite_d). On "pre-LN GeLU token+position" the two
    differ by less than 2 MC standard errors. For the "noise" models the assertion is the honest one:
    resolved late-third error <= single-pair error + 2 x (mean MC standard error of late rho) + 0.002."""
    lines = [f"{'model':40s} " + "  ".join(f"{k:>19s}" for k in ("early", "middle", "late", "mean")) + "   late MC se"]
    for name, (spec, mc, res, single) in results.items():
        e = _errors(mc, res, single)
        se = float(np.mean(mc.rho_thirds_se[1:, 2]))
        lines.append(f"{name:40s} " + "  ".join(f"{e[k][0]:.4f} -> {e[k][1]:.4f}   " for k in
                                                 ("early", "middle", "late", "mean")) + f"   {se:.4f}")
    print("\nrho MAE over layers, single-pair -> position-resolved\n" + "\n".join(lines))
    for name, (spec, mc, res, single) in results.items():
        e = _errors(mc, res, single)
        assert e["mean"][1] < e["mean"][0], (name, e)
        assert e["early"][1] < e["early"][0], (name, e)
        se = float(np.mean(mc.rho_thirds_se[1:, 2]))
        if LATE[name] == "better":
            assert e["late"][1] < e["late"][0] + se, (name, e, se)
        else:
            assert e["late"][1] <= e["late"][0] + 2 * se + 0.002, (name, e, se)


def test_late_third_finite_d():
    """post-LN ReLU beta=0.1 at d = 512 (d_ff = 2d: the same infinite-width model as d = 256): the finite-d bias
    of the d = 256 MC shrinks and the resolved late third beats the single pair (measured with 20 seeds: 0.0006
    against 0.0047, MC se 0.0008; at d = 1024: 0.0007 against 0.0058)."""
    kw = dict(MODELS["post-LN ReLU beta=0.1 rho0=0"])
    spec = causal_spec(d=512, d_ff=1024, **kw)
    mc = simulate(spec, seeds=16, batch=4, rng_seed=1, weight_grads=False)
    res = run_causal(spec)
    single = run_spec(spec).rho
    e_res = float(np.mean(np.abs(res.rho_thirds[1:, 2] - mc.rho_thirds[1:, 2])))
    e_single = float(np.mean(np.abs(single[1:] - mc.rho_thirds[1:, 2])))
    se = float(np.mean(mc.rho_thirds_se[1:, 2]))
    print(f"\nd=512 late third: single {e_single:.4f} resolved {e_res:.4f} MC se {se:.4f}")
    assert e_res < e_single, (e_res, e_single, se)


def test_resolved_within_tolerance_per_layer(results):
    for name, (spec, mc, res, single) in results.items():
        assert np.all(np.abs(res.rho_mean - mc.rho) < TOL_MEAN), (name, res.rho_mean, mc.rho)
        assert np.all(np.abs(res.rho_thirds - mc.rho_thirds) < TOL_THIRD), (name, res.rho_thirds, mc.rho_thirds)
        # per-position norms: pre-LN stream grows, post-LN is 1
        assert np.allclose(res.q_thirds, mc.q_thirds, rtol=TOL_Q), (name, res.q_thirds, mc.q_thirds)


# ------------------------------------------------------------------------------------------------
# Chi et al. (003) Lemma 3: Var(o_m) = d^2 sigma^4 / m per coordinate, LayerNormed i.i.d. inputs, uniform attention


def _mc_attention_variance(spec, seeds=12, batch=8):
    acc = np.zeros(spec.seq_len)
    for s in range(seeds):
        rng = np.random.default_rng([7, s])
        net = from_spec(spec)
        W = init_block(net.blocks[0], rng)
        x = make_input(net, batch, rng)
        u = Norm(spec.norm_type).forward(x, W, rng)[0] if spec.norm == "pre" else x
        attention = next(op for op in leaves(net.blocks[0]) if isinstance(op, Attention))
        o, _ = attention.forward(u, W, rng)
        acc += (o * o).mean(axis=(0, 2))
    return acc / seeds


def test_lemma3_attention_variance_one_over_m():
    d, sigma, T = 256, 0.02, 128
    spec = causal_spec(norm="pre", act="gelu", beta=None, g_vo=None, T=T, L=1, d=d, std=sigma, rho0=0.0)
    # Property 1 (uniform attention) holds: sigma^4 << H / d^2
    assert sigma**4 < 0.01 * spec.heads / d**2
    m = np.arange(1, T + 1)
    lemma3 = d**2 * sigma**4 / m  # paper 003, Lemma 3
    pred = run_causal(spec).attention_output_variance_layer1
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
    pred = run_causal(spec).attention_output_variance_layer1
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
    f = {"relu": lambda x: np.maximum(x, 0),
         "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))}.get(act)
    f = f or kernels.PHI[act][0]
    K = pair_kernel(act, np.array([[a, c], [c, b]]))
    # the kink limits the quadrature reference for relu; tanh-GeLU is computed by GeLU's closed form (kernels.py)
    tol = {"relu": 2e-4, "gelu_tanh": 2e-3}.get(act, 1e-7)
    assert abs(K[0, 1] - (f(u) * f(v) * W).sum()) < tol
    assert abs(K[0, 0] - (f(u) ** 2 * W).sum()) < tol
    assert abs(K[1, 1] - (f(v) ** 2 * W).sum()) < tol


def test_uniform_attention_closed_form():
    """beta -> 0, linear MLP switched off: one block of causal averaging on the simplex, by hand.
    No norm, skip 0: output m = mean of the first m values, overlap g (p + (q - p)/max(m, n))."""
    spec = causal_spec(norm="none", act="linear", beta=0.1, T=32, L=1, g_vo=1.0, rho0=0.25)
    from dataclasses import replace

    P = replace(block_params(spec), beta=1e-9, skip_a=0.0, skip_m=1.0, block_m=0.0)
    tr = propagate_overlaps([block(P)], 1.0, 0.25, 32, keep_overlap=True)
    m = np.arange(1, 33)
    expect = 0.25 + 0.75 / np.maximum.outer(m, m)
    np.testing.assert_allclose(tr.overlap, expect, atol=1e-6)


def test_late_tokens_match_single_pair_for_long_sequences():
    """001 C.6: the single pair describes late tokens; for long T the resolved last third approaches it."""
    spec = causal_spec(norm="post", act="relu", beta=0.3, T=2048, L=12, g_vo=1.0, rho0=0.1)
    res = run_causal(spec)
    single = run_spec(spec).rho
    assert np.max(np.abs(res.rho_thirds[:, 2] - single)) < 0.01
    assert res.q.shape == (13, 2048)


# ------------------------------------------------------------------------------------------------
# The reduced (position-group) form against the full T x T overlap matrix


def _ref_field(C, s):
    """The keys' structure on the engine's coarser groups of positions (ops._FIELD_GROUPS), summed from C directly:
    (n, F, own, ends, c, ok, Pv, qv) as Attention._coarse_field's and _coarse_values', or None where no row with two
    keys has a score std of 0.3."""
    from initadvisor.core.causal import coarser
    from initadvisor.core.ops import _FIELD_GROUPS

    T = C.shape[0]
    if not np.max(s[1:]) >= 0.3:
        return None
    M = coarser(np.arange(T + 1), *_FIELD_GROUPS)  # positions in coarser groups
    n = M.sum(axis=1)
    off = C - np.diag(np.diag(C))
    pairs = np.multiply.outer(n, n) - np.diag(n)
    F = np.where(pairs > 0, M @ off @ M.T / np.maximum(pairs, 1.0), 0.0)
    q = M @ np.diag(C) / n
    own = np.where(n == 1, 0.0, np.maximum(q - np.diag(F), 0.0))
    Pv = F.copy()  # (K = C: the values' overlaps are the keys')
    F[np.diag_indices(len(n))] = np.where(n == 1, q, np.diag(F))
    ends = np.cumsum(n).astype(int)
    S = np.cumsum(np.cumsum(C, axis=0), axis=1)
    tr = np.cumsum(np.diag(C))
    with np.errstate(invalid="ignore", divide="ignore"):  # the rows' mean centred key variance, from C
        spread = tr[ends - 1] / ends - (np.diag(S)[ends - 1] - tr[ends - 1]) / (ends * np.maximum(ends - 1.0, 1.0))
        c = s[ends - 1] ** 2 / spread
    ok = (ends > 1) & np.isfinite(c) & (c > 0)
    return n, F, own, ends, min(float(np.median(c[ok])), 1e6), ok, Pv, q


def _ref_field_factor(C, field):
    """Rows whose keys' scores correlate as the keys do (C), over i.i.d. rows: softmax_rows.field_rows_y2 on
    _ref_field's coarser groups; 1 without structure."""
    from initadvisor.core.ops import _FIELD_DRAWS, _FIELD_NEGLIGIBLE
    from initadvisor.core.softmax_rows import field_rows_y2

    if field is None:
        return 1.0
    n, F, own, ends, c, ok, _, _ = field
    y, ref = field_rows_y2(c, n, F, own, _FIELD_DRAWS, _FIELD_NEGLIGIBLE)
    f = np.where(ok & (ref > 0), y / ref, 1.0)
    return np.interp(np.log(np.arange(1.0, C.shape[0] + 1)), np.log(np.r_[1.0, ends]), np.r_[1.0, f])


def _ref_field_law(C, field):
    """softmax_rows.field_rows on _ref_field's groups, beyond uniform rows' (the values less their mean pair overlap, as
    the engine gives them): each row's own output over its keys' mean value overlap; two rows' overlap at independent
    queries and at one over 1 / max(m, n), and its slope at independent queries; their output overlap's means' part
    over uniform rows', and its weights' covariance on one key and on two at one query and in their slopes at
    independent queries: at every position (pair) by ln m (bilinear in the pair's ln m), the uniform parts summed from
    C directly; and that mean overlap."""
    from initadvisor.core.ops import _FIELD_LAW_DRAWS
    from initadvisor.core.softmax_rows import field_rows

    n, F, own, ends, c, _, Pv, qv = field
    T = C.shape[0]
    base = (C.sum() - np.trace(C)) / (T * (T - 1.0))
    law = field_rows(c, n, F, own, Pv - base, qv - base, _FIELD_LAW_DRAWS)
    uniform = 1.0 / np.maximum.outer(ends, ends)
    S = np.cumsum(np.cumsum(C - base, axis=0), axis=1)
    flat = S[ends - 1][:, ends - 1] / np.multiply.outer(ends, ends)
    lm, x = np.log(np.arange(1.0, T + 1)), np.log(ends)

    def at(V):
        return np.array([np.interp(lm, x, [np.interp(a, x, V[:, k]) for k in range(len(x))]) for a in lm])

    return (np.interp(lm, x, law.out - flat.diagonal()), at((law.ea * n) @ law.ea.T - uniform),
            at(law.y1 - uniform), at(law.slope), at(law.o0 - flat), at(law.s1 - law.s0), at(law.sslope),
            at((law.o1 - law.s1) - (law.o0 - law.s0)), at(law.oslope - law.sslope), base)


def _ref_attention(C, P, lnT):
    """The full-matrix causal attention of the first version (O(T^2) per layer), kept as the reference; row m's keys
    alike weighed together (attention.coweighting) and each key at its share of the row's weight (key_shares) from the
    direct sums over its keys 1..m (K = C: no QK-norm, no rotary embedding here); with the field law on (ops.FIELD_LAW)
    the rows' outputs from it instead."""
    from initadvisor.core import attention as att
    from initadvisor.core.causal import row_statistics, row_x
    from initadvisor.core.softmax_rows import key_shares

    T = C.shape[0]
    m = np.arange(1, T + 1, dtype=float)
    S = np.cumsum(np.cumsum(C, axis=0), axis=1)
    tr = np.cumsum(np.diag(C))
    qbar = tr / m
    pbar = np.where(m > 1, (np.diag(S) - tr) / (m * np.maximum(m - 1, 1)), qbar)
    qb = float(P.q_bias)
    qq = np.diag(C) + qb
    y2, v, _ = row_statistics(P.beta, att.beta_c(qbar, pbar, qq), lnT)
    s = P.beta * math.sqrt(2.0 * lnT) / att.beta_c(qbar, pbar, qq)
    field = _ref_field(C, s)
    y2 = y2 * _ref_field_factor(C, field)
    law = _ref_field_law(C, field) if ops.FIELD_LAW and field is not None and not P.centered else None
    i = np.arange(T)
    lo, hi = np.minimum.outer(i, i), np.maximum.outer(i, i)
    rho_q = (C + qb) / np.sqrt(np.multiply.outer(qq, qq))
    yp = np.exp(rho_q * np.sqrt(np.multiply.outer(v, v))) / (hi + 1.0)
    if law is not None:  # two rows between independent queries and one: the i.i.d. pair law's shape in rho_q, and
        step = 0.01  # lambda r (1 - r) taking its slope at independent queries to the law's
        ends = [expected_overlap(s[lo], lo + 1.0, x) for x in (0.0 * rho_q, 1.0 + 0.0 * rho_q, rho_q, step + 0.0 * rho_q)]
        with np.errstate(invalid="ignore", divide="ignore"):
            shape, at_step = ((e - ends[0]) / (ends[1] - ends[0]) for e in ends[2:])
        shape, at_step = (np.clip(np.where(np.isfinite(x), x, 1.0), 0.0, 1.0) for x in (shape, at_step))
        r = np.clip(rho_q, 0.0, 1.0)
        lam = law[3] - (law[2] - law[1]) * at_step / step
        yp = 1.0 / (hi + 1.0) + law[1] + (law[2] - law[1]) * shape + lam * r * (1.0 - r)
    yp = np.minimum(yp, np.sqrt(np.multiply.outer(y2, y2)))
    g_v, b_v2, keep = float(P.g_v), float(P.b_v2), 1.0 - float(P.attn_dropout)
    gap_v = g_v * np.maximum(qbar - pbar, 0.0)
    trcc = np.diag(np.cumsum(np.cumsum(C * C, axis=0), axis=1))  # sum over s, s' <= m of C^2
    rr = np.diag(np.cumsum(np.cumsum(C, axis=1) ** 2, axis=0))  # sum over s <= m of (sum over s' <= m of C)^2
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = (trcc - 2.0 * rr / m + np.diag(S) ** 2 / m**2) / ((m - 1.0) * (qbar - pbar) ** 2)  # tr(M C M C) / hom
        phi = 1.0 + np.clip(2.0 - 2.0 * row_x(P.beta, att.beta_c(qbar, pbar, qq), lnT, m), 0.0, 1.0) * (phi - 1.0)
    phi = np.where((m > 1) & np.isfinite(phi), np.maximum(phi, 0.0), 1.0)
    out = att.coweighted(yp - 1.0 / (hi + 1.0), phi[lo], lo + 1.0) * gap_v[lo]
    diag = att.coweighted(y2 - 1.0 / m, phi, m) * gap_v + (1.0 / keep - 1.0) * y2 * (g_v * qbar + b_v2)
    if not P.centered:
        out += g_v * S / np.multiply.outer(m, m) + b_v2
        diag += g_v * np.diag(S) / (m * m) + b_v2
        # the rows' means at their keys' shares of the weight: key s's spread about row t's keys' mean, from C directly
        seen = np.tril(np.ones((T, T), dtype=bool))
        cs = np.cumsum(C, axis=1) / m[None, :]  # [s, t]: key s's mean over row t's keys
        R = np.where(seen, np.diag(C)[None, :] - 2.0 * cs.T + (np.diag(S) / (m * m))[:, None], 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.where(seen, R / (R.sum(axis=1) / m)[:, None], 1.0)
            s_row = np.where(m > 1, np.minimum(P.beta * math.sqrt(2.0 * lnT) / att.beta_c(qbar, pbar, qq), 30.0), 0.0)
        rel = np.where(np.isfinite(rel), rel, 1.0)
        if np.max(2.0 * np.abs(s_row[:, None] ** 2 * (rel - 1.0))) >= 1e-3:
            W = key_shares(s_row, seen.astype(float), rel)[0] * seen / m[:, None]
            U1 = seen / m[:, None]
            D = W @ C @ W.T - U1 @ C @ U1.T
            out += g_v * D
            diag += g_v * np.diag(D)
    if law is not None:  # from the law: each row's own output, and two rows' output overlap as the means', the
        # weights' covariance on one key on the i.i.d. pair shape and on two quadratic in rho_q, beyond uniform rows'
        mean, same1, same_slope, cross1, cross_slope, base = law[4:]
        ref = pbar[lo] - base  # (the split about the earlier row's keys' mean overlap)
        same1, same_slope = same1 - ref * (law[2] - law[1]), same_slope - ref * law[3]
        cross1, cross_slope = cross1 + ref * (law[2] - law[1]), cross_slope + ref * law[3]
        same = same1 * shape + (same_slope - same1 * at_step / step) * r * (1.0 - r)
        out = g_v * (S / np.multiply.outer(m, m) + mean + same + cross1 * r + (cross_slope - cross1) * r * (1.0 - r))
        out += b_v2
        diag = g_v * (np.diag(S) / (m * m) + law[0]) + b_v2 + (1.0 / keep - 1.0) * y2 * (g_v * qbar + b_v2)
    np.fill_diagonal(out, diag)
    out = float(P.g_o) * out + float(P.b_o2)
    out[np.diag_indices(T)] /= 1.0 - float(P.dropout)
    return out


def _ref_propagate(blocks, q0, p0, T):
    """Full T x T propagation (reference): rho over all positions and per third, per layer."""
    from initadvisor.core.causal import summarize

    def norm(C):  # x / sqrt(mean x^2 + eps) per position
        s = 1.0 / np.sqrt(np.diag(C) + blocks[0].norm_eps)
        return C * np.multiply.outer(s, s)

    def drop(C, rate):
        C = C.copy()
        C[np.diag_indices(T)] /= 1.0 - float(rate)
        return C

    def mlp(C, P):
        C1 = float(P.g_1) * C + float(P.b_12)
        K = pair_kernel(P.activation, C1)
        if P.activation in ("swiglu", "geglu"):
            K *= C1
        return drop(float(P.g_2) * K + float(P.b_22), P.dropout)

    C = np.full((T, T), float(p0))
    np.fill_diagonal(C, float(q0))
    rows = [summarize(C)[:2]]
    for P in blocks:
        lnT = math.log(P.seq_len)
        pre, post = P.norm == "pre", P.norm == "post"
        A = _ref_attention(norm(C) if pre else C, P, lnT)
        C = float(P.skip_a) ** 2 * C + float(P.block_a) ** 2 * A
        C = norm(C) if post else C
        C = float(P.skip_m) ** 2 * C + float(P.block_m) ** 2 * mlp(norm(C) if pre else C, P)
        C = norm(C) if post else C
        rows.append(summarize(C)[:2])
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])


REDUCED_CASES = {
    **{name: (kw, (8, 1.1)) for name, kw in MODELS.items()},  # T = 64, 96 on a deliberately coarse grid
    "post-LN ReLU beta=0.3 T=768": (dict(norm="post", act="relu", beta=0.3, g_vo=1.0, rho0=0.1, T=768, L=4), None),
    "pre-LN GeLU beta=0.1 T=768": (dict(norm="pre", act="gelu", beta=0.1, g_vo=2.0, rho0=0.0, T=768, L=4), None),
    "pre-LN tanh beta=1.5 T=512": (dict(norm="pre", act="tanh", beta=1.5, g_vo=2.0, rho0=0.1, T=512, L=3), None),
}


@pytest.mark.parametrize("name,law", [(name, False) for name in REDUCED_CASES]
                         + [("post-LN GeLU beta=0.8 rho0=0.1", True), ("pre-LN ReLU beta=0.5 rho0=0.1", True)])
def test_reduced_form_matches_full_matrix(name, law, monkeypatch):
    """Position groups (default grid, or a coarse one) against the full T x T matrix: rho within 0.002 (measured:
    below 1e-4); with every position its own group the two are the same computation (1e-12). With the rows' field law
    on (ops.FIELD_LAW; the reference takes it on the coarser groups of positions): 3e-5 in rho and 2.4e-4 and 1.1e-4
    by thirds on the coarse grid (without the law in the reference 0.0024 and 0.0047), and at full resolution within
    1e-4 (measured 5e-13; rounding may turn the field factor's principal directions, and its QMC draws with them)."""
    monkeypatch.setattr(ops, "FIELD_LAW", law)
    kw, grid = REDUCED_CASES[name]
    spec = causal_spec(**kw)
    P = block_params(spec)
    from initadvisor.stack import input_moments

    q0, p0 = input_moments(spec)
    blocks, T = [P] * spec.layers, spec.seq_len
    rho_ref, r3_ref = _ref_propagate(blocks, q0, p0, T)
    extra = {} if grid is None else dict(single=grid[0], ratio=grid[1])
    red = propagate_overlaps([block(P) for P in blocks], q0, p0, T, **extra)
    assert np.max(np.abs(red.rho_mean - rho_ref)) < 0.002, (red.rho_mean, rho_ref)
    assert np.max(np.abs(red.rho_thirds - r3_ref)) < 0.002, (red.rho_thirds, r3_ref)
    full = propagate_overlaps([block(P) for P in blocks], q0, p0, T, single=T)
    np.testing.assert_allclose(full.rho_mean, rho_ref, atol=1e-4 if law else 1e-12)
    np.testing.assert_allclose(full.rho_thirds, r3_ref, atol=1e-4 if law else 1e-12)
    assert red.q.shape == (spec.layers + 1, T) and red.y2.shape == (spec.layers, T)


@pytest.mark.parametrize("ratio,T", [(1.5, 64), (2.5, 64), (2.5, 256)])
def test_field_key_half_of_exchangeable_keys_is_the_mean_fields(ratio, T, monkeypatch):
    """Attention._key_half (the field law's key half, ops.FIELD_LAW) on exchangeable keys, a causal stack's input
    (paper 001's encoder past beta_c): with C = (q - p) I + p 11^T and M 1 = 0 a row's sum_j E[(M C M)_jj] is exactly
    (q - p) E tr M^2, the engine's own, and every key's share is 1: the ratio and the shares within 2% of 1 (measured
    0.7% and 0.2%: the law's 64 draws and ln t lattice against the row tables). Planting a factor 2 in the total, the
    shares not normalised to the row's length, or the key groups beyond the lower coarse row read at its share there
    (which has them at 0) fails; so did reading each key's own value between two rows of different lengths (25%)."""
    import sys
    from pathlib import Path

    from initadvisor.core import causal as cz

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from phase_fidelity import spec_for

    monkeypatch.setattr(ops, "FIELD_LAW", True)
    stack = from_spec(build_spec(spec_for("post", ratio, T, True, 2, 720)))
    G = cz._grid(T, cz._SINGLE, cz._RATIO)
    S = cz.input_state(G, *stack.embeddings.moments())
    op = next(o for o in leaves(stack.blocks[0]) if isinstance(o, Attention))
    rows = op.causal(G, S)[1]
    assert rows.field is not None
    ratio_, share = op._key_half(G, *rows.field)
    keys = np.arange(len(G.n))[None, :] <= np.arange(len(G.n))[:, None]
    assert np.max(np.abs(ratio_[1:] - 1.0)) < 0.02, ratio_
    assert np.max(np.abs(share[keys] - 1.0)) < 0.02, share[keys]


@pytest.mark.parametrize("beta, layers", [(4.0, 30), (2.5, 40)])
def test_reduced_form_gradient_past_beta_c(beta, layers):
    """Position groups (the default grid) against the full T x T matrix for the gradient, post-LN past beta_c (paper
    001's encoder at T 128, beta_c 1.44; beta 2.5 and 4): within 2.5%. There a localized row weighs its keys
    unequally (_key_shares, at each group's last row), and a row before its group's last must spread all its gradient
    over the keys it has (causal.row_sums): without that, 5.3% and 5.4% low (measured 1.9% and 1.0% with it)."""
    spec = {"model": {"layers": layers, "d_model": 720, "heads": 1, "d_ff": 720, "norm": "post", "activation": "relu",
                      "causal": True, "out_proj": False},
            "sequence": {"length": 128, "vocab": 50000, "input_correlation": 0.03},
            "init": {"std": 0.02, "embedding": {"std": 1.0}, "qk_beta": beta, "v": {"gain": 0.2},
                     "ff_in": {"gain": 0.2, "bias_std": 0.02}, "ff_out": {"gain": 0.2, "bias_std": 0.02}}}
    net = from_spec(build_spec(spec))
    q0, p0 = net.embeddings.moments()
    grouped, full = (propagate_overlaps(net.blocks, q0, p0, 128, single=s, backward=True).grad_q for s in (32, 128))
    assert float(run_spec(build_spec(spec)).beta_c[0]) < beta / 1.5
    np.testing.assert_allclose(grouped / grouped[-1], full / full[-1], rtol=0.025)


def test_reduced_form_on_long_sequences():
    """T = 1024 x 12 and T = 2048 x 96 layers: full-shape, finite results. Their wall time (targets 0.1 s and 1 s)
    is reported by benchmarks/deep_stack.py, not asserted here."""
    for (T, L) in ((1024, 12), (2048, 96)):
        spec = causal_spec(norm="pre", act="gelu", beta=0.5, T=T, L=L, g_vo=1.0, rho0=0.1)
        tr = run_causal(spec)
        assert tr.q.shape == (L + 1, T) and np.all(np.isfinite(tr.rho_thirds))


# ------------------------------------------------------------------------------------------------
# The position-resolved backward (issue 13, deliverable 4)


@pytest.mark.parametrize("T, single, ratio", [(20, 4, 1.3), (60, 8, 1.2), (9, 32, 1.05)])
def test_row_transpose_exact_on_grouped_state(T, single, ratio):
    """mix_backward_rows against the T x T sum it reduces, sum_{t, t'} E[A_ts A_t's'] C[t, t'] with C the lifted
    gradient state (constant within group pairs, g_t on the diagonal), E A_ts^2 = d_t / t, E A_ts A_ts' =
    (s2_t - d_t) / (t (t - 1)) within a row and 1 / (t t') across rows: every position's diagonal and every group
    pair's mean over s != s', to 1e-12, with attention dropout and uneven IPRs."""
    from initadvisor.core import causal as cz

    rng = np.random.default_rng(T)
    G = cz._grid(T, single, ratio)
    g = rng.uniform(0.5, 2.0, T)
    P = rng.normal(0.0, 0.3, (len(G.n),) * 2)
    P = (P + P.T) / 2
    P[G.single, G.single] = 0.0
    y2 = np.minimum(1.0, rng.uniform(1.0, 3.0, T) / G.m)
    y2[0] = 1.0
    drop = 0.2
    d, s2 = y2 / (1 - drop), 1 + y2 * drop / (1 - drop)
    C = P[G.gid][:, G.gid]
    np.fill_diagonal(C, g)
    X = np.zeros((T, T))
    for t in range(T):
        k = t + 1
        E = np.full((k, k), (s2[t] - d[t]) / (k * (k - 1)) if k > 1 else 0.0)
        np.fill_diagonal(E, d[t] / k)
        X[:k, :k] += E * C[t, t]
        for u in range(T):
            if u != t:
                X[:k, :u + 1] += C[t, u] / (k * (u + 1))
    out = cz.mix_backward_rows(G, cz.State(g, P), y2, drop)
    off = X - np.diag(np.diag(X))
    onehot = np.eye(len(G.n))[G.gid]
    pairs = np.outer(G.n, G.n) - np.diag(G.n)
    mean = np.where(pairs > 0, onehot.T @ off @ onehot / np.maximum(pairs, 1), 0.0)
    assert np.abs(out.qf - np.diag(X)).max() < 1e-12
    assert np.abs(out.P - mean).max() < 1e-12




@pytest.mark.parametrize("T, single, ratio", [(20, 4, 1.3), (60, 8, 1.2)])
def test_row_sums_weigh_keys_by_their_shares(T, single, ratio):
    """row_sums with key shares W (per row group and key group) against the direct sum over rows t >= s of
    f_t w_ts, w_ts = W[group t, group s] over its mean over row t's keys s' <= t (a row before its group's last reads
    only part of its group's keys and still sends all of f_t), to 1e-12; the pair sums are the unweighted ones."""
    from initadvisor.core import causal as cz

    rng = np.random.default_rng(T)
    G = cz._grid(T, single, ratio)
    f, fp = rng.uniform(0.5, 2.0, T), rng.uniform(-1.0, 1.0, T)
    W = rng.uniform(0.3, 3.0, (len(G.n),) * 2)
    diag, out = cz.row_sums(G, f, fp, W)
    w = [np.array([W[G.gid[t], G.gid[s]] for s in range(t + 1)]) for t in range(T)]
    want = [sum(f[t] * w[t][s] / w[t].mean() for t in range(s, T)) for s in range(T)]
    np.testing.assert_allclose(diag, want, rtol=1e-12)
    np.testing.assert_array_equal(out, cz.row_sums(G, f, fp)[1])



def test_weighed_means_are_the_direct_sum():
    """Attention._weighed_means at full resolution against the direct sum over two rows' keys, sum_{s <= t, s' <= t'}
    (W_ts W_t's' - 1) C_ss' / (t t') (C with q on its diagonal), to 1e-12; on position groups its rows are the groups'
    last ones."""
    from initadvisor.core import causal as cz

    rng = np.random.default_rng(5)
    T = 12
    G = cz._grid(T, T, 1.1)
    q = rng.uniform(0.5, 2.0, T)
    P = rng.uniform(-0.3, 0.6, (T, T))
    P = (P + P.T) / 2
    np.fill_diagonal(P, 0.0)
    W = np.tril(rng.uniform(0.2, 3.0, (T, T)))
    C = P + np.diag(q)
    t = np.arange(1, T + 1)
    want = np.array([[sum((W[a, i] * W[b, j] - 1.0) * C[i, j] for i in range(a + 1) for j in range(b + 1))
                      for b in range(T)] for a in range(T)]) / np.outer(t, t)
    np.testing.assert_allclose(Attention._weighed_means(G, q, P, W), want, rtol=1e-12, atol=1e-12)

def test_key_shares_follow_the_keys_overlaps():
    """Attention._key_shares on a post-LN causal stream past beta_c (paper 001's encoder at 2.5 beta_c, T 64, 18
    blocks, where keys read by every row look like the row's others more than recent ones): against softmax rows of
    Gaussian scores with the state's full key covariance (its correlations kept, where the shares take each key's
    spread about the row's mean as independent): the last row's shares of E[A] and E[A^2] over eight keys at a time
    within 13% on position groups and at full resolution (measured 0.3-5% but the first eight keys, which correlate
    among themselves: E[A] 10.4% and E[A^2] 8.3% high; the early keys' E[A^2] 0.54-0.84 of uniform, the recent ones'
    1.2-1.5). Planting equal spreads (shares 1) misses by up to 70%."""
    import sys
    from pathlib import Path

    from initadvisor.core import causal as cz
    from initadvisor.core.ops import causal_forward, find

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from phase_fidelity import spec_for

    T, L = 64, 18
    spec = build_spec(spec_for("post", 2.5, T, True, 50, 720))
    stack = from_spec(spec)
    P = block_params(spec)
    for single in (32, T):
        G = cz._grid(T, single, cz._RATIO)
        S = cz.input_state(G, *stack.embeddings.moments(), stack.embeddings.repeats())
        for k in range(L):
            S = cz._clamp(G, causal_forward(stack.blocks[k], G, S)[0])
        rows = find(stack.blocks[L], causal_forward(stack.blocks[L], G, S)[1], Attention)  # post-LN: S is its input
        C = S.P[G.gid][:, G.gid]
        np.fill_diagonal(C, S.qf)
        s = P.beta * math.sqrt(2.0 * math.log(T)) / rows.beta_c[-1]  # the last row's score std about its mean
        R = C - C.mean(axis=0)[None, :] - C.mean(axis=1)[:, None] + C.mean()  # the scores' covariance about it
        z = np.random.default_rng(3).standard_normal((200000, T)) @ np.linalg.cholesky(
            R * s * s / np.trace(R) * T + 1e-9 * np.eye(T)).T
        A = np.exp(z - z.max(axis=1, keepdims=True))
        A /= A.sum(axis=1, keepdims=True)
        for share, x in ((rows.shares[0], A.mean(axis=0)), (rows.shares[1], (A * A).mean(axis=0))):
            got, want = share[-1][G.gid], T * x / x.sum()
            blocks = np.arange(T) // 8  # eight keys at a time (one sampled key's share is noisy)
            err = np.bincount(blocks, got) / np.bincount(blocks, want) - 1.0
            assert np.abs(err).max() < 0.13, err

def test_position_resolved_gradient_matches_monte_carlo(results):
    """The gradient of every position, carried back row by row: grad_q_i / grad_q_L within 10% (+3 standard
    errors) of the numpy network at every layer of the five causal models (the late-token pair: up to 19% off,
    at the first layers, where the early positions carry the gradient)."""
    from initadvisor.core.model import propagate_causal

    for name, (spec, mc, _, _) in results.items():
        g = propagate_causal(from_spec(spec), backward=True).grad_q
        err = np.abs(g - mc.grad_q_norm)
        assert np.all(err <= 0.10 * mc.grad_q_norm + 3 * mc.grad_q_norm_se), (name, g, mc.grad_q_norm)


@pytest.mark.parametrize("rows", ["causal", "window", "bidirectional-window", "bidirectional"])
def test_window_transpose_exact(rows):
    """mix_backward_window (full resolution, row t over keys lo_t..hi_t) against the T x T sum
    sum_{t, t'} E[A_ts A_t's'] C[t, t'] (the moments of test_row_transpose_exact_on_grouped_state), to 1e-12."""
    from initadvisor.core import causal as cz

    T, t = 30, np.arange(30)
    lo, hi = {"causal": (0 * t, t), "window": (np.maximum(t - 6, 0), t),
              "bidirectional-window": (np.maximum(t - 4, 0), np.minimum(t + 4, T - 1)),
              "bidirectional": (0 * t, np.full(T, T - 1))}[rows]
    w = (hi - lo + 1).astype(float)
    rng = np.random.default_rng(len(rows))
    g = rng.uniform(0.5, 2.0, T)
    P = rng.normal(0.0, 0.3, (T, T))
    P = (P + P.T) / 2
    np.fill_diagonal(P, 0.0)
    y2 = np.minimum(1.0, rng.uniform(1.0, 3.0, T) / w)
    drop = 0.2
    d, s2 = y2 / (1 - drop), 1 + y2 * drop / (1 - drop)
    C = P + np.diag(g)
    X = np.zeros((T, T))
    for a in range(T):
        k, n = slice(lo[a], hi[a] + 1), w[a]
        E = np.full((int(n), int(n)), (s2[a] - d[a]) / (n * (n - 1)) if n > 1 else 0.0)
        np.fill_diagonal(E, d[a] / n)
        X[k, k] += E * C[a, a]
        for b in range(T):
            if b != a:
                X[k, lo[b]:hi[b] + 1] += C[a, b] / (n * w[b])
    out = cz.mix_backward_window(cz.State(g, P), y2, drop, lo, hi, w)
    assert np.abs(out.qf - np.diag(X)).max() < 1e-12
    assert np.abs(out.P - (X - np.diag(np.diag(X)))).max() < 1e-12


@pytest.mark.parametrize("grouped", [True, False])
def test_rows_overlap_beyond_uniform_in_the_transpose(grouped):
    """The rows' overlap beyond uniform, c_tt' = Yp_tt' - |K_t & K_t'| / (w_t w_t'), spread over the n_tt' keys
    the two rows share (c / n each, -c / (n (n - 1)) between two of them): mix_backward_rows (full resolution) and
    mix_backward_window against the T x T sum, to 1e-12."""
    from initadvisor.core import causal as cz

    T = 24
    t = np.arange(T)
    lo, hi = 0 * t, t
    w = (hi - lo + 1).astype(float)
    rng = np.random.default_rng(5)
    g = np.zeros(T)
    P = rng.normal(0.0, 0.3, (T, T))
    P = (P + P.T) / 2
    np.fill_diagonal(P, 0.0)
    c = rng.uniform(0.0, 0.02, (T, T))
    c = (c + c.T) / 2
    n = np.minimum.outer(w, w)  # causal rows share the first min(t, t') keys
    X = np.zeros((T, T))
    for a in range(T):
        for b in range(T):
            if a != b:
                k = int(n[a, b])
                E = np.full((k, k), -c[a, b] / (k * (k - 1)) if k > 1 else 0.0)
                np.fill_diagonal(E, c[a, b] / k)
                X[:k, :k] += E * P[a, b]
    y2 = np.zeros(T)
    if grouped:
        G = cz._grid(T, T, 1.05)
        base = cz.mix_backward_rows(G, cz.State(g, P), y2)
        out = cz.mix_backward_rows(G, cz.State(g, P), y2, shared=c)
    else:
        base = cz.mix_backward_window(cz.State(g, P), y2, 0.0, lo, hi, w)
        out = cz.mix_backward_window(cz.State(g, P), y2, 0.0, lo, hi, w, shared=(c, n))
    assert np.abs(out.qf - base.qf - np.diag(X)).max() < 1e-12
    assert np.abs(out.P - base.P - (X - np.diag(np.diag(X)))).max() < 1e-12


def test_backward_beyond_its_reach_says_so(monkeypatch):
    """Beyond BACKWARD_T positions the position-resolved engine is skipped (forward and gradient: the late-token
    pair), and check's notes say so."""
    import initadvisor.core.model as model
    import initadvisor.diagnose as diagnose

    spec = causal_spec(T=128, L=4)
    resolved = diagnose.check(spec)
    monkeypatch.setattr(model, "BACKWARD_T", 64)
    monkeypatch.setattr(diagnose, "BACKWARD_T", 64)
    pair = diagnose.check(spec)
    assert any("late-token pair" in n for n in pair["notes"]) and not resolved["notes"]
    assert [r["grad_q"] for r in pair["layers"]] == pytest.approx(list(run_spec(spec).grad_q), rel=1e-5)
    assert [r["grad_q"] for r in resolved["layers"]] != pytest.approx(list(run_spec(spec).grad_q), rel=1e-3)


@pytest.mark.parametrize("inputs", [{"q": 1.7, "p": 0.6, "gq": 1.3, "gp": 0.4},
                                    {"q": 1.0, "p": 0.3, "gq": 1.0, "gp": 0.0}],
                         ids=["correlated-gradient", "independent-gradient"])
@pytest.mark.parametrize("name, qk_beta", [("attention-causal", None), ("attention-rotary", None),
                                           ("attention-qk-norm-all-causal", None), ("one-head", 1.0),
                                           ("one-head", 2.0), ("one-head", 3.5)])
def test_causal_attention_backward_against_the_numpy_operation(name, qk_beta, inputs, monkeypatch):
    """One causal attention operation at full resolution (test_operations' harness: d 96, T 24, 48 weight draws),
    exchangeable inputs and upstream gradients: the position-resolved backward's gradient q averaged over the
    positions within 10% of the numpy network's (QK-norm over all heads: 15%), uniform to beta / beta_c 2.4, with the
    gradients of two tokens correlated (gp / gq 0.3) or not. Measured: 0.5-9% (QK-norm 7-12%); without the rows'
    Jacobian overlap in the column term 18-62% high, without the key half's whole query norm 15-30% low. The mean
    cross moment gp within 10% (+4 standard errors): measured within 4%; with the bidirectional map's cross terms
    (the queries' Jacobian overlap x, the column term's -1 / (min - 1)) 7-46% high, with x alone 7-25% low (gated
    with correlated upstream gradients)."""
    import test_operations as H
    from initadvisor.core import causal as cz

    monkeypatch.setattr(H, "INPUTS", inputs)
    op = H.OPERATIONS[name]() if qk_beta is None else Attention(
        H.params(model={"heads": 1, "causal": True}, init={"std": 0.05, "v": {"std": 0.1}, "qk_beta": qk_beta}))
    (_, _, mgq, mgp), (_, _, _, sgp) = H._numpy_moments(op, H._numpy)
    G = cz._grid(H.T, H.T, 1.05)
    K = len(G.n)

    def state(a, b):
        P = np.full((K, K), b)
        np.fill_diagonal(P, 0.0)
        return cz.State(np.full(G.T, a), P)

    _, rows = op.causal(G, state(inputs["q"], inputs["p"]))
    D = op.causal_backward(G, state(inputs["gq"], inputs["gp"]), rows)
    gq, gp = D.qf.mean(), cz.pair_mean(G, D.P)
    assert abs(gq / mgq - 1) <= (0.15 if "qk-norm" in name else 0.10), (gq, mgq)
    if inputs["gp"]:  # with uncorrelated upstream gradients gp is the keys' small negative moment (-0.004 at
        assert abs(gp - mgp) <= 0.10 * abs(mgp) + 4 * sgp, (gp, mgp, sgp)  # beta_c 1.5, -0.002 predicted): not gated


@pytest.mark.parametrize("heads, T", [(4, 64), (8, 128), (16, 256)])
def test_alibi_pair_map_stands_in_for_the_resolved_rows(heads, T):
    """Beyond the full-resolution budget ALiBi's heads are windows of their effective keys coth(m_h / 2) in the
    late-token pair: within 0.12 of the position-resolved late third at every layer (0.07 lower at block 1, up to 0.1
    higher beyond); with the biases left out the pair is 0.32-0.56 higher after block 1."""
    from dataclasses import replace as dreplace

    from initadvisor.core.model import propagate, propagate_causal

    spec = build_spec({"model": {"layers": 8, "d_model": 128, "heads": heads, "norm": "pre", "causal": True,
                                 "alibi": True},
                       "sequence": {"length": T, "vocab": 500}, "init": {"std": 0.05, "v": {"gain": 4.0}}})
    stack = from_spec(spec)
    late = propagate_causal(stack).rho_thirds[:, 2]
    pair = propagate(stack, backward=False).rho
    assert np.max(np.abs(pair - late)) <= 0.12, (pair, late)
    plain = propagate(from_spec(dreplace(spec, alibi=False)), backward=False).rho
    assert plain[1] - late[1] > 0.2


def test_window_fallback_carries_the_query_key_path(monkeypatch):
    """Beyond diagnose.WINDOW_CELLS (every real sliding-window config: Mistral-7B's 4096 keys at T 32768) `check` runs
    a causal window on the distance-resolved state (test_distances), its gradient too. At the gains of d 4096 and std
    0.02 (here d 512, std 0.0566) the query/key path carries ~75% of the gradient: the fallback's gradient within 5% of
    the per-position engine at every index (measured 1.1%; the late-token pair, the fallback until 2026-11-25, was
    20-25% low at indices 0-1, and 0.02x at index 0 without the path)."""
    import initadvisor.diagnose as D

    spec = build_spec({"model": {"layers": 8, "d_model": 512, "heads": 8, "kv_heads": 2, "d_ff": 1376, "norm": "pre",
                                 "norm_type": "rmsnorm", "activation": "swiglu", "causal": True, "rope_theta": 1e4,
                                 "sliding_window": 64},
                       "sequence": {"length": 512, "vocab": 5000, "embeddings": ["token"]}, "init": {"std": 0.0566}})

    def grads() -> np.ndarray:
        return np.array([r["grad_q"] for r in D.check(spec)["layers"]])

    full = grads()
    monkeypatch.setattr(D, "WINDOW_CELLS", 10)
    fallback = D.causal_trace(from_spec(spec), backward=True)  # late tokens by distance, forward and backward
    assert fallback.stationary and fallback.grad_q is not None
    ratio = grads() / full
    assert np.all(np.abs(ratio - 1) < 0.05), ratio


@pytest.mark.parametrize("window", [None, 24])
def test_backward_keeping_every_cache_equals_running_the_forward_again(window, monkeypatch):
    """The position-resolved backward keeps every block's forward caches while they fit in causal._KEEP_CELLS, else
    runs each segment's forward again; both give one gradient (SwiGLU: at full resolution, windowed rows, the MLP
    does not keep its output kernel and the backward computes it again; on position groups it keeps it)."""
    import initadvisor.core.causal as cz

    model = {"layers": 6, "d_model": 128, "heads": 4, "d_ff": 344, "norm": "pre", "norm_type": "rmsnorm",
             "activation": "swiglu", "causal": True, "rope_theta": 1e4}
    spec = build_spec({"model": {**model, **({"sliding_window": window} if window else {})},
                       "sequence": {"length": 96, "vocab": 500, "embeddings": ["token"]}, "init": {"std": 0.05}})
    from initadvisor.core.model import propagate_causal

    import initadvisor.core.ops as ops

    runs = []
    forward = ops.causal_forward
    monkeypatch.setattr(ops, "causal_forward", lambda *a: runs.append(1) or forward(*a))
    propagate_causal(from_spec(spec))
    one_pass = len(runs)  # the forward's calls (blocks and their branches)
    kept = propagate_causal(from_spec(spec), backward=True)
    assert len(runs) == 2 * one_pass  # within the budget every block's forward runs once
    monkeypatch.setattr(cz, "_KEEP_CELLS", 0)
    again = propagate_causal(from_spec(spec), backward=True)
    assert len(runs) == 4 * one_pass  # beyond it (the first block's caches measured) the forward runs twice
    assert kept.grad_q is not None
    np.testing.assert_allclose(again.grad_q, kept.grad_q, rtol=1e-12)
    np.testing.assert_allclose(again.grad_p, kept.grad_p, rtol=1e-12, atol=1e-300)
    from initadvisor.core.ops import MLP

    mlp = next(op for op in leaves(from_spec(spec).blocks[0]) if isinstance(op, MLP))
    G = cz._grid(96, 8, 1.1)
    S = cz.input_state(G, 1.0, 0.3)
    _, (C1, kd, ko) = mlp.causal(G, S)
    assert ko is not None  # position groups keep the output kernel; the backward's own is the same one
    D = cz.State(np.linspace(1.0, 2.0, 96), np.full((len(G.n), len(G.n)), 0.1))
    for a, b in zip(mlp.causal_backward(G, D, (C1, kd, None)).__dict__.values(),
                    mlp.causal_backward(G, D, (C1, kd, ko)).__dict__.values()):
        if isinstance(a, np.ndarray):
            np.testing.assert_allclose(a, b, rtol=1e-12)


def test_window_query_key_path_only_where_the_window_bites():
    """The late-token query/key path of a causal window is on where the window is shorter than T, off where it covers
    the sequence: there the stack is causal attention over all keys, gradient for gradient (their path is the
    position-resolved engine's)."""
    from dataclasses import replace

    from initadvisor.core.model import propagate

    spec = build_spec({"model": {"layers": 4, "d_model": 512, "heads": 8, "norm": "pre", "causal": True,
                                 "sliding_window": 64}, "sequence": {"length": 32}, "init": {"std": 0.0566}})
    covered = propagate(from_spec(spec)).grad_q
    np.testing.assert_allclose(covered, propagate(from_spec(replace(spec, sliding_window=None))).grad_q, rtol=1e-12)
    bites = propagate(from_spec(replace(spec, seq_len=512))).grad_q
    assert propagate(from_spec(replace(spec, seq_len=512))).qk_share.min() > 0.5  # (d 4096's gains: most of it)
    assert bites[0] > 1.5 * propagate(from_spec(replace(spec, seq_len=512, sliding_window=None))).grad_q[0]


def test_rope_group_pairs_are_the_position_sums():
    """attention.rope_group_pairs: per pair of position groups, the sum of the rotary coherence of every ordered pair of
    distinct positions, against the direct T x T sum (the pairs' count without a rotary embedding)."""
    from initadvisor.core import attention as att
    from initadvisor.core import causal as cz

    T = 150
    edges = cz.group_edges(T, 12, 1.2)
    gid = np.repeat(np.arange(len(edges) - 1), np.diff(edges))
    dist = np.abs(np.subtract.outer(np.arange(T), np.arange(T)))
    for theta, kap in ((100.0, att.rope_distances(T, 16, 100.0, 1.0)[dist]), (0.0, np.ones((T, T)))):
        np.fill_diagonal(kap, 0.0)
        direct = np.zeros((len(edges) - 1,) * 2)
        np.add.at(direct, (gid[:, None], gid[None, :]), kap)
        assert np.allclose(att.rope_group_pairs(tuple(edges.tolist()), 16, theta, 1.0), direct, rtol=1e-12, atol=1e-9)


def test_prefix_pair_sums_on_groups():
    """causal.prefix_pair_sums on a grid of groups, for matrices constant on each group pair: the eight sums of
    jacobian_form over the keys of the groups up to each row group, against the direct sums over positions."""
    from initadvisor.core import causal as cz

    T = 80
    G = cz._grid(T, 8, 1.3)
    K_ = len(G.n)
    rng = np.random.default_rng(3)
    kd, cd = rng.uniform(0.5, 2.0, K_), rng.uniform(0.5, 2.0, K_)
    kb, cb = rng.uniform(-0.3, 0.6, (K_, K_)), rng.uniform(-0.3, 0.6, (K_, K_))
    kb, cb = kb + kb.T, cb + cb.T
    Kf, Cf = kb[np.ix_(G.gid, G.gid)], cb[np.ix_(G.gid, G.gid)]
    Kf[np.diag_indices(T)], Cf[np.diag_indices(T)] = kd[G.gid], cd[G.gid]
    pairs = np.multiply.outer(G.n, G.n)
    pairs[np.diag_indices(K_)] = G.pairs
    sums = cz.prefix_pair_sums(G, kd, pairs * kb, cd, pairs * cb, pairs * kb * cb)
    for r, end in enumerate(G.edges[1:]):
        K, C = Kf[:end, :end], Cf[:end, :end]
        rK, rC = K.sum(1), C.sum(1)
        direct = (np.trace(K), np.trace(C), np.sum(np.diag(K) * np.diag(C)), K.sum(), C.sum(), (K * C).sum(),
                  np.sum(np.diag(C) * rK + np.diag(K) * rC), np.sum(rK * rC))
        assert np.allclose([s[r] for s in sums], direct, rtol=1e-10)


@pytest.mark.parametrize("name, model, init", [
    ("one-head", {"heads": 1}, {"qk_beta": 1.0}),
    ("qk-norm", {"heads": 2, "head_dim": 48, "rope_theta": 10000.0, "qk_norm": "all", "norm": "reordered"}, {}),
    ("qk-norm-heads", {"heads": 4, "head_dim": 24, "kv_heads": 2, "rope_theta": 10000.0, "qk_norm": "head",
                       "norm": "reordered"}, {})])
def test_query_half_over_a_causal_stream_without_input_norm(name, model, init):
    """One causal attention over the stream a causal block leaves without an input norm: position t holds the mean of
    t i.i.d. vectors plus its own noise (q_t = 1/t + 0.02, two positions' overlap 1 / max), so a row's early keys
    carry most of the values' spread and see the later keys less than the mean pair does. The position-resolved
    backward (query half over the keys' structure, Attention._key_structure) within 20% of the numpy network at the
    late half of the rows (four seed sets: 1-14%); the mean field alone is 25-51% low there (OLMo 2's block 2: 1.8x at
    T 128)."""
    from initadvisor.core import causal as cz
    from initadvisor.core.ops import numpy_backward, numpy_forward

    T, d, seeds, batch = 96, 96, 32, 4
    op = Attention(block_params(build_spec({"model": {"layers": 1, "d_model": d, "d_ff": 128, "causal": True,
                                                      **model},
                                            "sequence": {"length": T, "vocab": 101},
                                            "init": {"std": 0.05, "v": {"std": 0.05}, **init}})))
    t = np.arange(1, T + 1.0)
    meas = []
    for s in range(seeds):
        rng = np.random.default_rng([29, s])
        x = np.cumsum(rng.standard_normal((batch, T, d)), 1) / t[:, None] + np.sqrt(0.02) * rng.standard_normal(
            (batch, T, d))
        W = init_block((op,), rng)
        _, caches = numpy_forward((op,), x, W, rng)
        meas.append((numpy_backward((op,), rng.standard_normal((batch, T, d)), W, caches) ** 2).mean((0, 2)))
    meas = np.mean(meas, 0)
    G = cz._grid(T, T, 1.05)
    P = 1.0 / np.maximum.outer(t, t)
    np.fill_diagonal(P, 0.0)
    S, up = cz.State(1.0 / t + 0.02, P), cz.State(np.ones(T), np.zeros((T, T)))

    def late_errors():
        D = op.causal_backward(G, up, op.causal(G, S)[1]).qf
        return [D[lo:hi].mean() / meas[lo:hi].mean() - 1 for lo, hi in ((T // 4, T // 2), (T // 2, T))]

    err = late_errors()
    assert max(map(abs, err)) <= 0.20, err
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Attention, "_key_structure", lambda self, G, *a: np.ones(G.T))
        assert min(late_errors()) < -0.25


@pytest.mark.parametrize("name, model", [
    ("qk-norm", {"heads": 2, "head_dim": 48, "rope_theta": 10000.0, "qk_norm": "all", "norm": "reordered"}),
    ("qk-norm-heads", {"heads": 4, "head_dim": 24, "kv_heads": 2, "rope_theta": 10000.0, "qk_norm": "head",
                       "norm": "reordered"})])
def test_rows_weigh_keys_alike_together(name, model):
    """One causal attention under a QK-norm over the stream a causal block leaves without an input norm (as
    test_query_half_over_a_causal_stream_without_input_norm): a row's early keys are alike and carry the large
    values, so its weights on them move together and its output varies more than the mean field says
    (attention.coweighting). Over the late half of the rows the position-resolved forward's q within 4% and rho
    within 0.015 of the numpy network (two seed sets: q -0.9% .. +2.5%, rho -0.007 .. -0.008); the mean field is
    5-8% low in q and 0.04 high in rho (OLMo 2's block 2, whose late third it put 0.03-0.05 above the real model's)."""
    from initadvisor.core import attention as att
    from initadvisor.core import causal as cz
    from initadvisor.core.ops import numpy_forward

    T, d, seeds, batch = 96, 96, 32, 4
    op = Attention(block_params(build_spec({"model": {"layers": 1, "d_model": d, "d_ff": 128, "causal": True,
                                                      **model},
                                            "sequence": {"length": T, "vocab": 101},
                                            "init": {"std": 0.05, "v": {"std": 0.05}}})))
    t = np.arange(1, T + 1.0)
    q, C = np.zeros(T), np.zeros((T, T))
    for s in range(seeds):
        rng = np.random.default_rng([29, s])
        x = np.cumsum(rng.standard_normal((batch, T, d)), 1) / t[:, None] + np.sqrt(0.02) * rng.standard_normal(
            (batch, T, d))
        y, _ = numpy_forward((op,), x, init_block((op,), rng), rng)
        q += (y**2).mean((0, 2)) / seeds
        C += np.einsum("btd,bsd->ts", y, y) / (batch * d * seeds)
    G = cz._grid(T, T, 1.05)
    P = 1.0 / np.maximum.outer(t, t)
    np.fill_diagonal(P, 0.0)
    S = cz.State(1.0 / t + 0.02, P)
    h = slice(T // 2, T)

    def late(qf, M):  # (q, rho) over the late half: mean q, mean overlap of two distinct tokens over it
        return qf[h].mean(), (M[h, h].sum() - np.trace(M[h, h])) / ((T // 2) * (T // 2 - 1)) / qf[h].mean()

    q_m, rho_m = late(q, C)
    out = op.causal(G, S)[0]
    q_e, rho_e = late(out.qf, out.P)
    assert abs(q_e / q_m - 1) <= 0.04 and abs(rho_e - rho_m) <= 0.015, (q_e / q_m - 1, rho_e - rho_m)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(att, "coweighting", lambda m, x, sums: np.ones(len(m)))
        out = op.causal(G, S)[0]
        assert late(out.qf, out.P)[1] - rho_m > 0.03


@pytest.mark.parametrize("qk_beta", [1.0, 1.5])
def test_rotary_rows_turn_the_keys_not_the_values(qk_beta):
    """One causal attention with a rotary embedding over correlated exchangeable tokens (p / q = 0.6): the per-position
    output q of the position-resolved forward within 5% of the numpy network at the late half of the rows (four seed
    sets: -2.0% .. +1.3%). A row's weights fluctuate over its keys' values at their own spread q - p; taking the keys'
    turned mean pair kappa p there (as the code did from 11-25 to 11-28) put it 7% (beta 1) and 16-17% (beta 1.5)
    high."""
    from initadvisor.core import causal as cz
    from initadvisor.core.ops import numpy_forward

    T, d, seeds, batch = 96, 96, 96, 4
    op = Attention(block_params(build_spec({"model": {"layers": 1, "d_model": d, "d_ff": 128, "causal": True,
                                                      "heads": 2, "head_dim": 48, "rope_theta": 100.0},
                                            "sequence": {"length": T, "vocab": 101},
                                            "init": {"std": 0.05, "v": {"std": 0.1}, "qk_beta": qk_beta}})))
    meas = []
    for s in range(seeds):
        rng = np.random.default_rng([31, s])
        c = rng.standard_normal((batch, 1, d))
        c /= np.sqrt((c**2).mean(-1, keepdims=True))  # the common part at its mean size (its spread is not at issue)
        x = np.sqrt(0.6) * c + np.sqrt(0.4) * rng.standard_normal((batch, T, d))
        y, _ = numpy_forward((op,), x, init_block((op,), rng), rng)
        meas.append((y**2).mean((0, 2)))
    meas = np.mean(meas, 0)
    G = cz._grid(T, T, 1.05)
    P = np.full((T, T), 0.6)
    np.fill_diagonal(P, 0.0)
    out = op.causal(G, cz.State(np.ones(T), P))[0].qf
    assert abs(out[T // 2:].mean() / meas[T // 2:].mean() - 1) <= 0.05


def test_coarser_groups():
    """The field law's groups: the first 4 positions alone, then each ends at the first edge at least 1.4x the last
    end (by hand at full resolution); on the engine's grid every group lands in exactly one, edges kept."""
    M = coarser(np.arange(65), 4, 1.4)
    assert np.cumsum(M.sum(axis=1)).astype(int).tolist() == [1, 2, 3, 4, 6, 9, 13, 19, 27, 38, 54, 64]
    e = group_edges(512)
    M = coarser(e, 4, 1.4)
    assert np.all(M.sum(axis=0) == 1) and np.all(np.diff(np.nonzero(M)[0]) >= 0)
    assert set(np.cumsum(M @ np.diff(e)).astype(int)) <= set(e[1:].tolist())


def test_field_law_keeps_the_state_positive_near_collapse(monkeypatch):
    """With the rows' field law on (ops.FIELD_LAW), post-LN 2.5 beta_c, T 64, 50 layers (paper 001's encoder at d 720,
    rho to 0.97): every causal attention output the engine forms is a Gram matrix, positive semi-definite on its
    position groups (each group's within contrasts, q - P_gg, and the groups' sqrt(n_g n_h) P_gh + diag(q - P_gg)) to
    1e-6 (measured: 5e-6 and above). Near collapse the overlaps are 0.99 and two rows' output must meet a row's own
    to 1e-4 as their queries align: with the cross-key covariance on the i.i.d. pair shape (0.004-0.015 low near one
    query for a row with itself) instead of quadratic, the least eigenvalue reaches -0.0095 at layer 30 and -4.9 at
    the top."""
    import sys
    from pathlib import Path

    from initadvisor.core import causal as cz
    from initadvisor.diagnose import causal_trace

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from phase_fidelity import spec_for

    monkeypatch.setattr(ops, "FIELD_LAW", True)
    engine, least = Attention.causal, []

    def causal(self, G, S):
        O, rows = engine(self, G, S)
        q = cz.gmean(G, O.qf)
        within = np.where(G.n > 1, q - np.diag(O.P), np.inf)
        groups = np.sqrt(np.multiply.outer(G.n, G.n)) * O.P + np.diag(q - np.diag(O.P))
        least.append(min(within.min(), np.linalg.eigvalsh(groups)[0]))
        return O, rows

    monkeypatch.setattr(Attention, "causal", causal)
    causal_trace(from_spec(build_spec(spec_for("post", 2.5, 64, True, 50, 720))))
    assert len(least) >= 50 and min(least) > -1e-6, np.round(least, 4)
