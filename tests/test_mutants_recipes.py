"""Mutation-driven checks of the recipe and init formulas, each against an independent route: the papers'
stated formulas transcribed here (DeepNet, T-Fixup, Admin, DeepScaleLM), brute-force sums, or a small numpy
Monte-Carlo at several seeds. None of the expected numbers is read back from the code under test."""

import math
from dataclasses import replace

import numpy as np
import pytest

from initadvisor.core.ops import zipf_repeat_correlation
from initadvisor.stack import input_moments, spec_beta
from initadvisor.spec import load_spec

from conftest import ROOT


def _xavier(fan_in, fan_out):
    return math.sqrt(2.0 / (fan_in + fan_out))


def test_tfixup_decoder_rule_and_embeddings():
    """T-Fixup (Huang et al. 2020, Alg. 1), decoder: Xavier for V, O, FFN scaled by (9N)^(-1/4); input embeddings
    N(0, d^-1/2) (std d^-1/2, fairseq) scaled by (9N)^(-1/4); Q/K plain Xavier; no LayerNorm."""
    from initadvisor.recipes import recipe_tfixup

    spec = load_spec(ROOT / "model_specs" / "gpt2-small.yaml")
    assert spec.causal
    N, d, f = spec.layers, spec.d_model, spec.d_ff
    s = recipe_tfixup(spec).spec
    scale = (9 * N) ** -0.25
    assert s.init["v"].std == pytest.approx(scale * _xavier(d, d), rel=1e-9)
    assert s.init["o"].std == pytest.approx(scale * _xavier(d, d), rel=1e-9)
    assert s.init["ff_in"].std == pytest.approx(scale * _xavier(d, f), rel=1e-9)
    assert s.init["ff_out"].std == pytest.approx(scale * _xavier(f, d), rel=1e-9)
    assert s.init["q"].std == pytest.approx(_xavier(d, d), rel=1e-9)
    assert s.init["embedding"].std == pytest.approx(d**-0.5 * scale, rel=1e-9)
    assert s.norm == "none"


@pytest.mark.parametrize("name", ["bert-base", "gpt2-small"])
def test_deepnet_constants_all_matrices(name):
    """DeepNet (Wang et al. 2022, Fig. 2 / Table 1): x = LN(alpha x + f(x)), alpha = (2N)^(1/4), Xavier with gain
    beta = (8N)^(-1/4) on V, O and both FFN matrices, Q/K plain Xavier (numbers for N = 12 spelled out)."""
    from initadvisor.recipes import recipe_deepnorm

    spec = load_spec(ROOT / "model_specs" / f"{name}.yaml")
    N, d, f = spec.layers, spec.d_model, spec.d_ff
    assert N == 12
    s = recipe_deepnorm(spec).spec
    alpha, beta = 24 ** 0.25, 96 ** -0.25  # (2N)^(1/4) = 2.2134, (8N)^(-1/4) = 0.3195
    assert alpha == pytest.approx(2.2134, abs=1e-4) and beta == pytest.approx(0.31947, abs=1e-4)
    assert s.res_attention.skip == pytest.approx(alpha) and s.res_mlp.skip == pytest.approx(alpha)
    assert s.res_attention.block == 1.0 and s.res_mlp.block == 1.0
    for m, (fi, fo) in {"v": (d, d), "o": (d, d), "ff_in": (d, f), "ff_out": (f, d)}.items():
        assert s.init[m].std == pytest.approx(beta * _xavier(fi, fo), rel=1e-9), m
    assert s.init["q"].std == pytest.approx(_xavier(d, d)) and s.init["k"].std == pytest.approx(_xavier(d, d))
    assert s.norm == "post"


def test_zipf_repeat_correlation_brute_force():
    """sum_i p_i^2 with p_i = 1/(i H_V), summed term by term (both branches: V < 10^4 exact, V >= 10^4 asymptotic)."""
    for v in (5000, 30522, 50257):
        i = np.arange(1, v + 1, dtype=float)
        p = (1 / i) / np.sum(1 / i)
        assert zipf_repeat_correlation(v) == pytest.approx(float(np.sum(p * p)), rel=1e-6), v


@pytest.mark.parametrize("name", ["bert-base", "gpt2-small"])
def test_input_moments_closed_form(name):
    """Stream entering block 1: q = n_tables std_e^2 / (1 - p) (inverted dropout scales the second moment),
    p = rho_0 n_tables std_e^2 (dropout leaves cross-token products unchanged); embedding norm sets n std^2 -> 1."""
    spec = load_spec(ROOT / "model_specs" / f"{name}.yaml")
    n, s, drop = len(spec.embeddings), spec.init["embedding"].std, spec.dropout
    assert drop > 0
    i = np.arange(1, spec.vocab + 1, dtype=float)
    z = float(np.sum((1 / i / np.sum(1 / i)) ** 2))
    rho0 = sum({"token": z, "position": 0.0, "segment": 1.0}[t] for t in spec.embeddings) / n
    raw = 1.0 if spec.embedding_norm else n * s**2
    q, p = input_moments(spec)
    assert q == pytest.approx(raw / (1 - drop), rel=1e-6)
    assert p == pytest.approx(rho0 * raw, rel=1e-5)


def _score_std_mc(d, d_head, s_q, s_k, scale, seed, n=4000):
    """Std of one head's score scale * (x W_Q) . (y W_K) for unit Gaussian tokens x, y, by Monte-Carlo."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n // 200):
        wq, wk = rng.normal(0, s_q, (d, d_head)), rng.normal(0, s_k, (d, d_head))
        x, y = rng.normal(size=(200, d)), rng.normal(size=(200, d))
        out.append(scale * np.sum((x @ wq) * (y @ wk), axis=1))
    return float(np.std(np.concatenate(out)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spec_beta_and_qk_std_against_monte_carlo(seed):
    """Giorlandino-Goldt beta = (score std for unit inputs) / sqrt(ln T); qk_std_for_beta must realise it."""
    spec = load_spec(ROOT / "model_specs" / "bert-base.yaml")
    spec = replace(spec, d_model=64, heads=4, seq_len=128)
    d, dh, sc = spec.d_model, spec.d_head, spec.softmax_scale
    assert dh > 1 and sc != 1
    std = spec.qk_std_for_beta(0.7)
    mc = _score_std_mc(d, dh, std, std, sc, seed) / math.sqrt(math.log(spec.seq_len))
    assert mc == pytest.approx(0.7, rel=0.08)
    s_q, s_k = spec.init["q"].std, spec.init["k"].std
    mc2 = _score_std_mc(d, dh, s_q, s_k, sc, seed + 10) / math.sqrt(math.log(spec.seq_len))
    assert spec_beta(spec) == pytest.approx(mc2, rel=0.08)


@pytest.fixture(scope="module")
def bert_report():
    from initadvisor.recipes import recommend

    return load_spec(ROOT / "model_specs" / "bert-base.yaml"), recommend(
        load_spec(ROOT / "model_specs" / "bert-base.yaml"))


def test_beta_recommended_is_point_eight_of_half_beta_c(bert_report):
    """README: beta_recommended = 0.8 x min_l beta_c / 2 (beta_c re-evaluated at the recommended beta, so the
    fixed point is only approximate: 2%)."""
    _, rep = bert_report
    assert rep["beta_margin"] == 0.8
    assert rep["beta_recommended"] == pytest.approx(0.8 * rep["beta_c"] / 2, rel=0.02)


def test_tau_in_beta_units(bert_report):
    """Noci's tau multiplies the raw score; Giorlandino-Goldt's beta divides the score std by sqrt(ln T)."""
    spec, rep = bert_report
    assert rep["tau_beta"] == pytest.approx(rep["tau"] / math.sqrt(math.log(spec.seq_len)), rel=1e-4)


def test_deepscalelm_numbers_in_report(bert_report):
    """DeepScaleLM (Kedia et al. 2024, sec. 3.5, App. M) with k = 2: lambda^2 = 1 - k/N, beta^2 = k/N,
    sigma_e^2 = (1-p)/n_emb, sigma_qk^2 = 1/d, sigma_f^2 = sqrt((1-p)/2)/d (d_ff = 4d),
    sigma_vo,l^2 = sqrt((1-p)/r_l)/d; Post-LN caveat: the bound is beta^2 <= k/N^2."""
    spec, rep = bert_report
    ds = rep["deepscalelm"]
    N, d, p, n = spec.layers, spec.d_model, spec.dropout, len(spec.embeddings)
    assert spec.d_ff == 4 * d and spec.norm == "post" and ds["k"] == 2
    assert ds["lambda2"] == pytest.approx(1 - 2 / N, rel=1e-5)
    assert ds["beta2"] == pytest.approx(2 / N, rel=1e-5)
    assert ds["sigma_e2"] == pytest.approx((1 - p) / n, rel=1e-5)
    assert ds["sigma_qk2"] == pytest.approx(1 / d, rel=1e-5)
    assert ds["sigma_f2"] == pytest.approx(math.sqrt((1 - p) / 2) / d, rel=1e-5)
    assert ds["simplified"]["sigma_vo2"] == pytest.approx(math.sqrt((1 - p) / 2) / d, rel=1e-5)
    r = np.array(ds["corr_per_layer"][:-1])
    assert np.allclose(ds["sigma_vo2_per_layer"], np.sqrt((1 - p) / r) / d, rtol=1e-5)
    assert any(f"k/N^2 = {2 / N**2:.4g}" in c for c in ds["caveats"])


def test_deepscalelm_correlation_recurrence_first_step():
    """App. M Fig. 15 by hand for one layer: r_0 (1-p) after embedding dropout; the attention block emits
    correlation 1-p, mixed with weights lambda^2 s, beta^2; then the full ReLU FFN correlation
    (1-p)(r + (sqrt(1-r^2) - r acos r)/pi)."""
    from initadvisor.core.deepscalelm import dslm_init

    N, p, r0, k = 12, 0.1, 0.221, 2.0
    lam2, bet2 = 1 - k / N, k / N
    r, s = r0 * (1 - p), 1.0
    r = (lam2 * r * s + bet2 * (1 - p)) / (lam2 * s + bet2)
    s = lam2 * s + bet2
    rf = (1 - p) * (r + (math.sqrt(1 - r * r) - r * math.acos(r)) / math.pi)
    r = (lam2 * r * s + bet2 * rf) / (lam2 * s + bet2)
    ds = dslm_init(N, 768, p, k=k, r0=r0)
    assert ds.corr_in[0] == pytest.approx(r0 * (1 - p), rel=1e-9)
    assert ds.corr_in[1] == pytest.approx(r, rel=1e-9)
    assert not dslm_init(N, 768, p, k=k, r0=r0, post_ln=True, beta2=k / N**2).caveats
    assert dslm_init(N, 768, p, k=k, r0=r0, post_ln=True, beta2=1.5 * k / N**2).caveats


def test_critical_recipe_skip_margin():
    """Critical recipe: the attention skip is the given one if above alpha_c, else 1.1 alpha_c."""
    from initadvisor.recipes import recipe_critical

    spec = load_spec(ROOT / "model_specs" / "bert-base.yaml")
    given = spec.res_attention.skip
    assert recipe_critical(spec, 0.3, 2.0 * given).spec.res_attention.skip == pytest.approx(2.2 * given)
    assert recipe_critical(spec, 0.3, 0.5 * given).spec.res_attention.skip == pytest.approx(given)


def test_admin_first_skip_is_input_std():
    """Admin (Liu et al. 2020, sec. 4.2): omega_1^2 = Var(x_0), the stream entering block 1: after BERT's
    embedding LayerNorm (variance 1) and inverted dropout p, Var = 1/(1-p)."""
    from initadvisor.recipes import recipe_admin

    spec = load_spec(ROOT / "model_specs" / "bert-base.yaml")
    r = recipe_admin(spec)
    assert r.per_layer["skip_a"][0] == pytest.approx(math.sqrt(1 / (1 - spec.dropout)), rel=1e-9)
    # omega grows: every sublayer adds a positive variance
    om = np.column_stack([r.per_layer["skip_a"], r.per_layer["skip_m"]]).ravel()
    assert np.all(np.diff(om) > 0)


@pytest.mark.parametrize("sx2,rho,n,d", [(0.5, 0.2, 64, 32), (2.0, 0.0, 128, 64), (3.0, 0.5, 16, 256)])
def test_balancing_tau_noci_eq47(sx2, rho, n, d):
    """Noci et al. eq. 47: tau^2 = d n (1 + rho (n-1)) / (sigma_x^4 (1-rho)^2 (n+d)(n-1)) (sigma_x enters to the
    fourth power: the Q/K gradient carries sigma_x^2 twice, eq. 18), transcribed here; sigma_x^2 != 1 matters."""
    from initadvisor.core.gradients import balancing_tau

    tau = math.sqrt(d * n * (1 + rho * (n - 1)) / (sx2**2 * (1 - rho) ** 2 * (n + d) * (n - 1)))
    assert float(balancing_tau(sx2, rho, n, d)) == pytest.approx(tau, rel=1e-9)


@pytest.mark.parametrize("q,p", [(1.0, 0.2), (2.0, 0.5), (0.5, 0.0)])
def test_qk_grad_corrected_eq13_uniform_phase(q, p):
    """001 eq. 13 with the exact softmax-Jacobian trace (module docstring): beta sigma_v^2 q (q-p)^2
    [Y2 - 2 Y3 + E Y2^2]."""
    from initadvisor.core.gradients import qk_grad

    beta, sv2, y2, y3, y22 = 0.3, 0.7, 0.05, 0.004, 0.0026
    want = beta * sv2 * q * (q - p) ** 2 * (y2 - 2 * y3 + y22)
    assert float(qk_grad(beta, sv2, q, p, y2, y3, y22)) == pytest.approx(want, rel=1e-9)
