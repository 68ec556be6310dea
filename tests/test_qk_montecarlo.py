"""Q/K gradient laws and causal column moments against the numpy Monte-Carlo of the random network.

The judge is `initadvisor.simulate`: the actual random network of a spec, its hand-written backward and its
measured squared Frobenius norms |dL/dW_Q|^2, |dL/dW_K|^2, |dL/dW_V|^2 per block, for the loss
L = sum(h_L * G) (G ~ N(0, 1) per entry). No expected value comes from the code under test.

Most networks here are ONE block whose MLP branch is switched off (residual.mlp.block = 0, so h_1 = h_0 + attn(h_0)):
the gradient reaching the attention branch is then G itself, white across tokens, per-coordinate second moment
1 -- the setting in which Result 2 and Noci's eqs. 17/18 are derived. (In deeper blocks the gradient acquires a
token-shared part that neither law carries.)

The constant C of Result 2 (001 eq. 13) for this loss. Per attention row t with softmax Jacobian M_t, upstream
gradient do_t white with per-coordinate second moment g (at the value-path output, before W_O), and W_K, W_V
independent of M (leading order in d),
    E|dL/dW_Q|^2 = sum_t |u_t|^2 g tr(M_t V V^T M_t K K^T) scale^2
                 = T q g g_V (s_K^2 d scale^2 d_head) d^2 (q - p)^2 E tr(M^2),
with g_V = s_V^2 d, and s_K^2 d scale^2 d_head = beta sqrt(ln T) when s_Q = s_K (Result 2's parametrisation).
With g = g_O g_out (g_out: per-coordinate gradient moment at the attention branch output, after W_O),
    T / (d^2 sqrt(ln T)) E|dL/dW_Q|^2 = C * [E tr(M^2) (q - p)^2 beta g_V g_O q]   (= qk_laws(...)[0]),
    C = T^2 g_out.
Here g_out = block_a^2 E[G^2] = 1, so C = T^2 (a token-averaged loss, (1/T) sum_t, has g_out = 1/T^2 and C = 1:
the paper's "constant independent of T and d"). Neglected: the finite-d correction of the overlap matrix,
~(T + d)/d in the uniform phase (Noci's n + d), hence T << d below.

Every tolerance was checked with rng_seed 0..9 (the committed tests use SEED, default 0; set the environment
variable INITADVISOR_QK_SEED to rerun with another): the numbers in each test's comment are the ranges seen.
"""

from __future__ import annotations

import math
from dataclasses import replace
import os

import numpy as np
import pytest

from initadvisor import diagnose
from initadvisor.core import attention as att
from initadvisor.core.ops import moments_backward, moments_forward
from initadvisor.simulate import backward, forward, init_network, make_input, pair_moments, ratio_se, simulate
from initadvisor.spec import build_spec
from initadvisor.stack import from_spec, input_moments, run_spec

SEED = int(os.environ.get("INITADVISOR_QK_SEED", "0"))


def one_block(T, d, *, std=None, qk_beta=None, qk_std=None, v_gain=None, o_gain=None, rho=0.0, emb_std=1.0,
              causal=False, norm="none", layers=1, skip_a=1.0, qk_norm="none", scale=None):
    """Attention-only blocks (MLP branch off), heads 4, no biases; embeddings x_t = sqrt(rho) c + sqrt(1-rho) e_t
    with per-coordinate variance emb_std^2, so the first attention input has q = emb_std^2 and p = rho q."""
    init = {"std": std if std is not None else 1 / math.sqrt(d), "embedding": {"std": emb_std}}
    if qk_beta is not None:
        init["qk_beta"] = qk_beta
    if qk_std is not None:
        init["q"] = {"std": qk_std}
        init["k"] = {"std": qk_std}
    if v_gain is not None:
        init["v"] = {"gain": v_gain}
    if o_gain is not None:
        init["o"] = {"gain": o_gain}
    return build_spec({
        "model": {"layers": layers, "d_model": d, "heads": 4, "d_ff": d, "norm": norm, "causal": causal,
                  "activation": "relu", "qk_norm": qk_norm, "softmax_scale": scale},
        "sequence": {"length": T, "vocab": 100, "input_correlation": rho, "embeddings": ["token"]},
        "init": init,
        "residual": {"attention": {"skip": skip_a}, "mlp": {"block": 0.0}},
    })


# ------------------------------------------------------------------------------------------------
# 1. Result 2 (001 eq. 13): absolute query-gradient norm with C = T^2 for simulate's loss

D1 = 128
RESULT2 = {  # name -> one_block kwargs (d = 128); x = beta / beta_c from the engine's trace
    "uniform T=8 x=0.21": dict(T=8, qk_beta=0.3),
    "uniform T=16 x=0.25": dict(T=16, qk_beta=0.35),
    "localized T=8 x=2.1": dict(T=8, qk_beta=3.0),
    "localized T=16 x=2.1": dict(T=16, qk_beta=3.0),
    "uniform q=2 rho=0.5 gV=2 gO=0.5 x=0.30": dict(T=16, qk_beta=0.3, rho=0.5, emb_std=math.sqrt(2), v_gain=2.0,
                                                   o_gain=0.5),
    "localized q=2 rho=0.5 gV=2 gO=0.5 x=2.5": dict(T=16, qk_beta=2.5, rho=0.5, emb_std=math.sqrt(2),
                                                    v_gain=2.0, o_gain=0.5),
    # QK-norm: the Q std (0.03 or 0.2, g_Q 0.115 or 5.1) enters only through the norm's Jacobian 1 / (g_Q q)
    "qk-norm uniform q=2 rho=0.5 gQ=0.115 x=0.17": dict(T=16, qk_norm="all", scale=0.1, qk_std=0.03, rho=0.5,
                                                      emb_std=math.sqrt(2)),
    "qk-norm localized q=2 gQ=5.1 x=2.2": dict(T=16, qk_norm="all", scale=0.9, qk_std=0.2, emb_std=math.sqrt(2)),
}


@pytest.mark.parametrize("name", list(RESULT2))
def test_result2_query_gradient_absolute(name):
    """Measured E|dL/dW_Q|^2 over (d^2 sqrt(ln T) / T) C qk_laws(...)[0], C = T^2 g_out = T^2 (module docstring).

    Tolerance: 20% relative. Measured / predicted over rng_seed 0..9 (240 sequences each, MC se 1.1-2.9%):
    uniform T=8 1.03-1.08, uniform T=16 1.06-1.11, localized T=8 0.95-1.07, localized T=16 0.99-1.05,
    uniform q=2 1.07-1.11, localized q=2 0.89-0.97. The uniform excess is the neglected finite-d term
    (~(T + d)/d: 1.06 at T=8, 1.125 at T=16). A doubled (or halved) product is 2x off: caught in every case.
    QK-norm (rng_seed 0..5): uniform 1.09-1.14, localized 0.99-1.04; without the norm's Jacobian 1 / (g_Q q) the
    prediction is 17x (g_Q q = 0.058) or 10x (10.2) off."""
    spec = one_block(d=D1, **RESULT2[name])
    T = spec.seq_len
    trace = run_spec(spec)
    qk = float(diagnose.qk_laws(from_spec(spec), trace)[0][0])
    g_out = spec.res_attention.block ** 2  # E[G^2] = 1 reaches the attention branch unchanged (MLP off, 1 block)
    C = T**2 * g_out
    predicted = D1**2 * math.sqrt(math.log(T)) / T * C * qk
    mc = simulate(spec, seeds=60, batch=4, rng_seed=SEED)
    r, se = mc.grad_wq[0] / predicted, mc.grad_wq_se[0] / predicted
    print(f"\n{name}: x={float(trace.beta[0] / trace.beta_c[0]):.2f} |dW_Q|^2 MC {mc.grad_wq[0]:.4g} "
          f"predicted {predicted:.4g} ratio {r:.3f} +- {se:.3f}")
    assert abs(r - 1) <= 0.20, (name, r, se)


# ------------------------------------------------------------------------------------------------
# 2. Noci's Q/K-to-V gradient ratio (eqs. 18/17 with eq. 46's tau) and tau^2 = beta^2 ln T

D2 = 64
NOCI = {  # one std for Q, K, V and O (g = std^2 d for each): the setting in which the mapping holds (see report)
    "g=0.15 rho=0 q=1": dict(g=0.15, rho=0.0, emb_std=1.0),
    "g=0.1 rho=0.2 q=2": dict(g=0.1, rho=0.2, emb_std=math.sqrt(2)),
    "qk-norm g=0.1 rho=0.2 q=2": dict(g=0.1, rho=0.2, emb_std=math.sqrt(2), qk_norm="all", scale=0.05),
}


@pytest.mark.parametrize("T", [8, 16, 32, 64])
@pytest.mark.parametrize("name", list(NOCI))
def test_noci_ratio_with_tau_mapping(name, T):
    """Uniform phase (score variance beta^2 ln T q (q - p) = 0.02-0.04): measured (|dW_Q|^2 + |dW_K|^2) / 2 over
    |dW_V|^2 against qk_laws(...)[1]. The Q/K stds are fixed, so beta varies with T as 1/sqrt(ln T) and only
    beta^2 ln T is T-independent: dropping ln T changes the prediction by 1/ln T = 0.48 (T=8) to 0.24 (T=64).

    Tolerance: 10% relative. Measured / predicted over rng_seed 0..9 (200 sequences, MC se 1.9-2.7%):
    g=0.15 q=1: 0.98-1.04 (T=8), 0.95-1.02 (16), 0.93-1.04 (32), 0.93-1.03 (64);
    g=0.1 q=2 rho=0.2: 0.99-1.05 at every T; with a QK-norm over all heads (rng_seed 0..5): 0.97-1.04."""
    c = NOCI[name]
    spec = one_block(T, D2, std=math.sqrt(c["g"] / D2), rho=c["rho"], emb_std=c["emb_std"],
                     qk_norm=c.get("qk_norm", "none"), scale=c.get("scale"))
    trace = run_spec(spec)
    predicted = float(diagnose.qk_laws(from_spec(spec), trace)[1][0])
    mc = simulate(spec, seeds=50, batch=4, rng_seed=SEED)
    r, se = mc.grad_qk_over_v[0] / predicted, mc.grad_qk_over_v_se[0] / predicted
    print(f"\n{name} T={T}: Q/K-to-V MC {mc.grad_qk_over_v[0]:.4g} predicted {predicted:.4g} ratio {r:.3f} +- {se:.3f}")
    assert abs(r - 1) <= 0.10, (name, T, r, se)


# ------------------------------------------------------------------------------------------------
# 3. Causal backward column moments (core/attention.py causal_columns, used by mix_backward)


def test_causal_columns_closed_form():
    """Uniform causal attention A_ts = 1/t (s <= t): column sum c_s = H_T - H_{s-1}, and
    sum_s c_s^2 = sum_{t,t'} min(t, t') / (t t') = sum_{t,t'} 1 / max(t, t') = sum_m (2m - 1)/m = 2T - H_T,
    so K2 = 2 - H_T / T exactly; the key-averaged sum_s sum_{t>=s} 1/t^2 = sum_t 1/t = H_T, i.e. H_T / T."""
    for T in (2, 7, 64, 1000):
        H = float(np.sum(1.0 / np.arange(1, T + 1)))
        k1, k2 = att.causal_columns(T)
        assert k1 == pytest.approx(H / T, rel=1e-12)
        assert k2 == pytest.approx(2 - H / T, rel=1e-12)


def _engine_input_gradient(spec, gp_top):
    """Engine: (gq, gp) at stream 0, from (1, gp_top) at the top (propagate() starts from gp = 0)."""
    net = from_spec(spec)
    q, p = input_moments(spec)
    caches = []
    for ops in net.blocks:
        q, p, cache = moments_forward(ops, q, p)
        caches.append(cache)
    gq, gp = 1.0, gp_top
    for ops, cache in zip(reversed(net.blocks), reversed(caches)):
        gq, gp = moments_backward(ops, gq, gp, cache)
    return float(gq), float(gp)


def _mc_input_gradient(spec, c, seeds, batch, seed):
    """simulate's network and backward, loss sum(h_L * G) with a token-shared part in G:
    G_t = sqrt(c) g + sqrt(1 - c) e_t (per-coordinate moments gq = 1, gp = c). Returns gq_0 / gq_L and its se."""
    q0, qL = [], []
    for k in range(seeds):
        rng = np.random.default_rng([seed, k])
        net = from_spec(spec)
        layers = init_network(net, rng)
        h0 = make_input(net, batch, rng)
        _, caches = forward(net, layers, h0, rng)
        shared = rng.standard_normal((batch, 1, spec.d_model))
        G = math.sqrt(c) * shared + math.sqrt(1 - c) * rng.standard_normal(h0.shape)
        gs = backward(net, layers, caches, G)
        q0.append(pair_moments(gs[0])[0])
        qL.append(pair_moments(gs[-1])[0])
    return ratio_se(np.concatenate(q0), np.concatenate(qL))


CAUSAL = {  # one causal block, uniform attention (Q/K std 0.02: beta ~ 0.03), g_V = g_O = 1, MLP off
    "no norm T=64": dict(T=64),
    "no norm T=128": dict(T=128),
    "pre-LN rho0=0.8 T=64": dict(T=64, norm="pre", rho=0.8),
}


@pytest.mark.parametrize("name", list(CAUSAL))
def test_causal_column_moment_k2(name, monkeypatch):
    """The K2 term of mix_backward multiplies the token-shared gradient gp (E col_s^2 = K2 ~ 2 for causal rows,
    1 for bidirectional ones). simulate's white G has gp = 0 at the top, where K2 is invisible, so the loss here
    gives G a token-shared part, c = 0.9 (as a cross-entropy gradient through a shared unembedding has at init).
    Exact for a single uniform causal block: gq_0 = 1 + g_V g_O (c K2 + (1 - c) H_T / T).

    Tolerance: engine (K2 = 2 - H_T/T) within 6% of the MC; the engine with K2 := 1 (monkeypatched) at least
    8 MC standard errors and 15% away. Over rng_seed 0..9 (200 sequences, se ~1.4%): MC / engine
    no norm T=64 0.98-1.01, T=128 0.98-1.03, pre-LN 0.99-1.03; the K2 = 1 engine (1.91 against 2.74-2.77) is
    18-23 standard errors from the MC."""
    spec = one_block(d=64, qk_std=0.02, v_gain=1.0, o_gain=1.0, causal=True, **CAUSAL[name])
    c = 0.9
    mc, se = _mc_input_gradient(spec, c, seeds=50, batch=4, seed=SEED)
    engine = _engine_input_gradient(spec, c)[0]
    true_columns = att.causal_columns
    monkeypatch.setattr(att, "causal_columns", lambda T: (true_columns(T)[0], 1.0))
    k2_one = _engine_input_gradient(spec, c)[0]
    monkeypatch.undo()
    print(f"\n{name}: gq_0/gq_L MC {mc:.4f} +- {se:.4f}, engine {engine:.4f}, engine with K2=1 {k2_one:.4f}")
    assert abs(mc / engine - 1) <= 0.06, (name, mc, se, engine)
    assert abs(mc - k2_one) >= 8 * se and abs(k2_one / mc - 1) >= 0.15, (name, mc, se, k2_one)


# ------------------------------------------------------------------------------------------------
# Known gaps of the engine found by this Monte-Carlo (strict xfail: remove the marker once fixed).


@pytest.mark.parametrize("v_gain, q_ratio", [(4.0, 1.0), (0.25, 1.0), (1.0, 4.0), (1.0, 0.25)])
def test_qk_laws_unequal_gains(v_gain, q_ratio):
    """The laws beyond one std for every matrix: a value gain g_V != g_Q enters Noci's tau^2 as
    g_V (g_Q + g_K) / 2 scale^2 d_head, and unequal Q/K stds (same product) scale the Q gradient by s_K / s_Q.
    Before the fix the ratio was 3.8-4.0x off at g_V = 4 g_Q and Result 2 0.27x / 4.3x off at s_Q / s_K = 4, 1/4.
    Tolerance: 10% (Noci) and 20% (Result 2, as above)."""
    g, T = 0.15, 16
    std = math.sqrt(g / D1)
    spec = one_block(T, D1, std=std, v_gain=v_gain * g, o_gain=g)
    if q_ratio != 1.0:  # s_Q / s_K = q_ratio at the same product s_Q s_K = std^2
        init = {**spec.init, "q": replace(spec.init["q"], std=std * math.sqrt(q_ratio)),
                "k": replace(spec.init["k"], std=std / math.sqrt(q_ratio))}
        spec = replace(spec, init=init)
    trace = run_spec(spec)
    qk, ratio = (float(x[0]) for x in diagnose.qk_laws(from_spec(spec), trace))
    mc = simulate(spec, seeds=50, batch=4, rng_seed=SEED)
    assert abs(mc.grad_qk_over_v[0] / ratio - 1) <= 0.10 or q_ratio != 1.0, (mc.grad_qk_over_v[0], ratio)
    predicted = D1**2 * math.sqrt(math.log(T)) / T * T**2 * qk
    assert abs(mc.grad_wq[0] / predicted - 1) <= 0.20, (mc.grad_wq[0], predicted)


def test_result2_crossover_matches_monte_carlo():
    """The crossover, beta = 0.71 beta_c at T = 16: with the exact finite-T E[Y2], E[Y3], E[Y2^2] the softmax Jacobian's
    trace is 0.1, not the 0 that the frozen annealed Y3 (= Y2 = T^-1/2) clipped it to; the measured |dW_Q|^2
    (4.9e4-5.1e4 over seeds 0..4) within 20%."""
    spec = one_block(16, D1, qk_beta=1.0)
    qk = float(diagnose.qk_laws(from_spec(spec), run_spec(spec))[0][0])
    predicted = D1**2 * math.sqrt(math.log(16)) / 16 * 16**2 * qk
    mc = simulate(spec, seeds=30, batch=4, rng_seed=SEED)
    assert predicted > 0 and abs(mc.grad_wq[0] / predicted - 1) <= 0.20


def _uniform_causal_chain_spec():
    """Two skip-less causal blocks, uniform attention, g_V = g_O = 1, MLP off: dL/dh_0 = G (A^T)^2 W-products."""
    return one_block(64, 64, qk_std=0.02, v_gain=1.0, o_gain=1.0, causal=True, layers=2, skip_a=0.0)


def test_causal_chain_monte_carlo_is_exact():
    """The judge on stacked causal attention: with A_ts = 1/t (s <= t) and white G, E gq_0 = |A^2|_F^2 / T exactly
    (0.1121 at T = 64). MC 0.1094-0.1139 over seeds 0..4 (se 0.0027); tolerance 5 se."""
    T = 64
    A = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    exact = float(np.sum((A @ A) ** 2) / T)
    mc = simulate(_uniform_causal_chain_spec(), seeds=50, batch=4, rng_seed=SEED, weight_grads=False)
    assert abs(mc.grad_q_norm[0] - exact) <= 5 * mc.grad_q_norm_se[0], (mc.grad_q_norm[0], exact)


@pytest.mark.xfail(strict=True, reason="key-averaged causal column moments miss the position dependence of a "
                   "gradient that a causal block has already mixed (early keys collect it): two skip-less uniform "
                   "causal blocks give 0.0327 against 0.1121 exact / 0.109-0.114 MC; three blocks with skips, "
                   "g_V = g_O = 1: 1.352 against MC 1.75-1.79 (bidirectional: within 1%)")
def test_causal_stacked_engine_known_gap():
    spec = _uniform_causal_chain_spec()
    mc = simulate(spec, seeds=50, batch=4, rng_seed=SEED, weight_grads=False)
    assert abs(run_spec(spec).grad_q[0] / mc.grad_q_norm[0] - 1) <= 0.10


# ------------------------------------------------------------------------------------------------
# 4. The query/key path of the attention backward (ops.Attention._qk_gain) across the phases


@pytest.mark.parametrize("model", [{"heads": 1}, {"heads": 2, "head_dim": 24}, {"heads": 4, "head_dim": 48}],
                         ids=["one-head", "narrow-heads", "wide-heads"])
@pytest.mark.parametrize("qk_beta", [1.0, 1.4, 2.0, 3.5])
def test_qk_path_carries_the_gradient_past_the_uniform_phase(qk_beta, model, monkeypatch):
    """One bidirectional attention operation (test_operations' harness: d 96, T 24, 48 weight draws, upstream
    gradients with gp / gq = 0.3) at beta / beta_c = 0.68 .. 2.4, one head of 96, two of 24 or four of 48
    (H d_head / d = 1/2, 2):
    the backward's gradient q is within 30% of the numpy network's (measured 3-16% low: the cross-row overlap Yp
    is still annealed), where the value path alone is 55-89% low; the query/key path's share of it is at least 25%.
    Its gp within 10% (+4 standard errors): the key half's -1/(T - 1) cross-token moment (without it gp is 55% high
    at 2.4) and the queries' overlapping Jacobians (without them 20-50% low past beta_c). The narrow and wide heads
    fail with H d_head / d counted twice (the output projection's gain carries it): 47-55% low and 30% high."""
    import test_operations as H
    from initadvisor.core.ops import Attention

    op = Attention(H.params(model=model, init={"std": 0.05, "v": {"std": 0.1}, "qk_beta": qk_beta}))
    (_, _, mgq, mgp), (_, _, _, sgp) = H._numpy_moments(op, H._numpy)
    cache = op.moments(H.INPUTS["q"], H.INPUTS["p"])[2]
    predicted, predicted_p = op.moments_backward(H.INPUTS["gq"], H.INPUTS["gp"], cache)
    share = float(cache.qk_share)
    monkeypatch.setattr(Attention, "_qk_gain", lambda self, *_: (0.0, 0.0, 0.0, 0.0))
    value_only = op.moments_backward(H.INPUTS["gq"], H.INPUTS["gp"], cache)[0]
    assert abs(predicted / mgq - 1) <= 0.30, (predicted, mgq)
    assert abs(predicted_p - mgp) <= 0.10 * abs(mgp) + 4 * sgp, (predicted_p, mgp, sgp)
    assert value_only / mgq < 0.5, (value_only, mgq)
    assert share >= 0.25


@pytest.mark.parametrize("p", [0.1, 0.3])
@pytest.mark.parametrize("qk_beta", [2.5, 3.5])
def test_qk_path_keys_carry_the_whole_query(qk_beta, p, monkeypatch):
    """The key half through W_K carries each query's whole norm q + b_Q^2 (its own row), not only its spread q - p:
    one bidirectional attention operation with uncorrelated upstream gradients (gp = 0) at beta / beta_c 1.5-2.4,
    input correlation 0.1 and 0.3: the gradient q within 7% of the numpy network (measured within 2%; with the
    spread only 4-15% low) and its gp within 15% (+4 standard errors)."""
    import test_operations as H
    from initadvisor.core.ops import Attention

    monkeypatch.setattr(H, "INPUTS", {"q": 1.0, "p": p, "gq": 1.0, "gp": 0.0})
    op = Attention(H.params(model={"heads": 1}, init={"std": 0.05, "v": {"std": 0.1}, "qk_beta": qk_beta}))
    (_, _, mgq, mgp), (_, _, _, sgp) = H._numpy_moments(op, H._numpy)
    gq, gp = op.moments_backward(1.0, 0.0, op.moments(1.0, p)[2])
    assert abs(gq / mgq - 1) <= 0.07, (gq, mgq)
    assert abs(gp - mgp) <= 0.15 * abs(mgp) + 4 * sgp, (gp, mgp, sgp)
