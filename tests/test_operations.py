"""Every operation of core/ops.py against itself: its moment map (forward and backward) against a Monte-Carlo of
its own numpy forward/backward on random Gaussian inputs, and its numpy code against its PyTorch module (same
weights: equal to float64 rounding; own init: the same moments).

A new operation is one definition in ops.py plus an entry in OPERATIONS (and, if it has weights, in TORCH_NAMES).

Inputs: tokens x_t = sqrt(p) c + sqrt(q - p) e_t (c, e_t ~ N(0, I_d)), so E x_ti^2 = q, E x_ti x_si = p;
gradients G likewise with (gq, gp), independent of x (the mean-field assumption of every backward map).
Tolerance: 3% of q (second moments; cross moments: 0.03 q) plus 4 standard errors over the seeds (the seed is
the unit: one weight draw); seeds x batch x T x d = 48 x 4 x 24 x 96 puts the standard errors near 1%, and a
planted 10% gain error fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from initadvisor.core.ops import MLP, Attention, Dropout, MoE, Norm, Residual, leaves, numpy_backward, numpy_forward, \
    spread_forward
from initadvisor.simulate import init_block, pair_moments
from initadvisor.spec import build_spec
from initadvisor.stack import block_params, embeddings

D, T, B, SEEDS = 96, 24, 4, 48
TOL = 0.03  # model error allowed, as a share of the second moment, on top of 4 standard errors of the MC


def params(**kw):
    """A layer's numbers from a small spec (the adapter keeps gains and stds consistent)."""
    model = {"layers": 1, "d_model": D, "heads": 4, "d_ff": 128, **kw.pop("model", {})}
    return block_params(build_spec({"model": model, "sequence": {"length": T, "vocab": 101}, **kw}))


def _attention(**kw):
    """Attention in its uniform phase (Q/K std 0.01: beta ~ 0.005), where the value path is the whole backward;
    the query/key path and finite-T statistics beyond it are issue 13's."""
    init = kw.pop("init", {})
    return Attention(params(init={"std": 0.05, "q": {"std": 0.01}, "k": {"std": 0.01}, **init}, **kw))


def _mlp(act, **kw):
    return MLP(params(model={"activation": act}, **kw))


def _moe(**moe):
    """A mixture of experts whose router's logits have std near 1.3 at q 1.7 (routing far from uniform)."""
    model = {"layers": 1, "d_model": D, "heads": 4, "d_ff": 128, "activation": "swiglu"}
    spec = build_spec({"model": model, "sequence": {"length": T, "vocab": 101}, "init": {"std": 0.09},
                       "moe": {"experts": 4, "top_k": 2, "d_ff": 48, "router_std": 0.1, **moe}})
    return MoE(block_params(spec, moe=True))


OPERATIONS = {
    "norm-layernorm": lambda: Norm("layernorm"),
    "norm-rmsnorm": lambda: Norm("rmsnorm"),
    "norm-layernorm-eps": lambda: Norm("layernorm", 0.8),  # an input as small as eps: q / (q + eps)
    "norm-rmsnorm-eps": lambda: Norm("rmsnorm", 1.5),
    "norm-layernorm-gain": lambda: Norm("layernorm", 0.3, 0.5),  # LayerNorm-Scaling's 1 / sqrt(4)
    "dropout": lambda: Dropout(0.2),
    "attention": lambda: _attention(init={"v": {"std": 0.1, "bias_std": 0.05}}),
    "attention-causal": lambda: _attention(model={"causal": True}, init={"v": {"std": 0.12}}),
    "attention-gqa-bias": lambda: _attention(model={"kv_heads": 2}, init={"q": {"std": 0.01, "bias_std": 0.02},
                                                                        "o": {"std": 0.08, "bias_std": 0.1}}),
    "attention-centered": lambda: _attention(model={"attention": "centered"}, init={"v": {"bias_std": 0.05}}),
    "attention-no-out-proj": lambda: _attention(model={"out_proj": False}),
    "attention-dropout": lambda: _attention(attention_dropout=0.25),
    # rotary: the keys' common component turned by position (kappa p); T 24 rows, half the coordinates turned
    "attention-rotary": lambda: _attention(model={"rope_theta": 100.0, "rotary_fraction": 0.5, "causal": True}),
    "attention-rotary-qk-norm": lambda: _attention(model={"rope_theta": 10.0, "qk_norm": "head",
                                                          "norm_type": "rmsnorm", "softmax_scale": 0.1}),
    # sliding windows: 6 keys per causal row (late tokens), 9 bidirectional (|m - s| <= 4), T 24
    "attention-window-causal": lambda: _attention(model={"sliding_window": 6, "causal": True}, init={"v": {"std": 0.12}}),
    "attention-window": lambda: _attention(model={"sliding_window": 8}, init={"v": {"std": 0.12}}),
    "attention-head-dim": lambda: _attention(model={"head_dim": 40, "kv_heads": 2}),  # 4 x 40 != d 96 (Qwen3)
    # QK-norm: unit-variance queries and keys whatever the Q/K stds (0.01 here): the softmax scale sets beta
    "attention-qk-norm-head": lambda: _attention(model={"qk_norm": "head", "norm_type": "rmsnorm", "kv_heads": 2,
                                                        "softmax_scale": 0.1}),
    "attention-qk-norm-all-causal": lambda: _attention(model={"qk_norm": "all", "causal": True,
                                                              "softmax_scale": 0.2}),
    **{f"mlp-{act}": (lambda act=act: _mlp(act, init={"std": 0.09, "ff_in": {"bias_std": 0.1}}))
       for act in ("relu", "gelu", "gelu_tanh", "silu", "tanh", "linear", "swiglu", "geglu")},
    "moe-softmax": lambda: _moe(),  # Mixtral: top-k renormalised
    "moe-softmax-unnormalised": lambda: _moe(experts=6, top_k=3, normalize=False),  # Qwen3-MoE's default
    "moe-sigmoid-shared": lambda: _moe(router="sigmoid", scale=2.5, shared_experts=1),  # DeepSeek-V3
    "moe-sigmoid-groups": lambda: _moe(experts=8, top_k=2, router="sigmoid", scale=2.5, groups=4, top_groups=2),
    "residual-mlp": lambda: Residual(0.8, ((0.6, (_mlp("relu", init={"std": 0.09}),)),)),
    "residual-pre-norm": lambda: Residual(1.0, ((1.0, (Norm(), _mlp("gelu", init={"std": 0.09}), Dropout(0.1))),)),
    "residual-sandwich": lambda: Residual(1.0, ((1.0, (Norm("rmsnorm"), _mlp("swiglu", init={"std": 0.09}),
                                                       Norm("rmsnorm"))),)),
    "residual-reordered": lambda: Residual(1.0, ((0.8, (_attention(model={"qk_norm": "all", "softmax_scale": 0.1}),
                                                        Norm())),)),
    "residual-parallel": lambda: Residual(0.9, ((0.7, (_attention(),)),
                                                (0.5, (_mlp("silu", init={"std": 0.09}),))), shared=(Norm(),)),
}
INPUTS = {"q": 1.7, "p": 0.6, "gq": 1.3, "gp": 0.4}
# Known gaps (issue 13), strict: centered attention's whole output is the O(V/T) fluctuation of A, where the
# annealed cross-row overlap is low in the forward; the pair map's causal rows leave out the query/key path (the
# position-resolved backward carries it per row: Attention._qk_rows, tested in test_phases and test_causal).
GAPS = {"attention-centered", "attention-qk-norm-all-causal"}  # the second: the causal query/key path (11% of gq)


def _cases():
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="issue 13: finite-T fluctuation, Q/K path"))
            if n in GAPS else n for n in sorted(OPERATIONS)]


def _stream(rng, q, p):
    return np.sqrt(p) * rng.standard_normal((B, 1, D)) + np.sqrt(q - p) * rng.standard_normal((B, T, D))


def _numpy_moments(op, forward_fn):
    """Mean (q, p) of the output and (gq, gp) of the input gradient over SEEDS draws of weights and inputs,
    and their standard errors."""
    out = []
    for s in range(SEEDS):
        rng = np.random.default_rng([11, s])
        x = _stream(rng, INPUTS["q"], INPUTS["p"])
        G = _stream(rng, INPUTS["gq"], INPUTS["gp"])
        y, dx = forward_fn(op, x, G, rng)
        late = (2 * T) // 3 if _causal(op) else 0  # the causal forward map describes late tokens (001 C.6)
        out.append([m.mean() for m in (*pair_moments(y, late), *pair_moments(dx))])
    return np.mean(out, axis=0), np.std(out, axis=0, ddof=1) / np.sqrt(SEEDS)


def _numpy(op, x, G, rng):
    ops = (op,)
    W = init_block(ops, rng)
    y, caches = numpy_forward(ops, x, W, rng)
    return y, numpy_backward(ops, G, W, caches)


def _expected(op):
    q, p, cache = op.moments(INPUTS["q"], INPUTS["p"])
    gq, gp = op.moments_backward(INPUTS["gq"], INPUTS["gp"], cache)
    return np.array([q, p, gq, gp], dtype=float)


def _close(measured, expected):
    (mq, mp, mgq, mgp), (sq, sp, sgq, sgp) = measured
    eq, ep, egq, egp = expected
    assert abs(mq - eq) <= TOL * eq + 4 * sq, ("q", mq, eq, sq)
    assert abs(mp - ep) <= TOL * eq + 4 * sp, ("p", mp, ep, sp)
    assert abs(mgq - egq) <= TOL * egq + 4 * sgq, ("grad q", mgq, egq, sgq)
    assert abs(mgp - egp) <= TOL * egq + 4 * sgp, ("grad p", mgp, egp, sgp)


@pytest.mark.parametrize("name", _cases())
def test_moment_map_matches_numpy_monte_carlo(name):
    op = OPERATIONS[name]()
    _close(_numpy_moments(op, _numpy), _expected(op))


@pytest.mark.parametrize("qk_norm, heads, std, scale, rope", [
    ("none", 4, 0.02, None, None), ("none", 4, 0.05, 0.3, None), ("head", 2, 0.01, 0.25, None),
    ("head", 1, 0.3, None, None), ("all", 4, 0.05, 0.5, None),
    ("none", 4, 0.05, 0.3, 10.0), ("none", 2, 0.05, 0.3, 1000.0), ("head", 2, 0.01, 0.25, 10.0)])
def test_logit_variance_over_keys_is_the_rem_s(qk_norm, heads, std, scale, rope):
    """The engine's beta / beta_c sets the key-dependent variance of one row's logits, V = 2 (beta/beta_c)^2 ln T
    (001 Result 1); under a QK-norm it is the softmax scale's whatever the Q/K stds. Measured on the numpy network's
    own queries and keys (rows' sample variance over keys, averaged): within 3%, plus 2 / n under a QK-norm over
    n coordinates: at this width the norm's division adds about 2 / n (d 96: 4% at n = d_head 48, 9% at 24), a
    finite-size effect the engine leaves out (2% or less at the d_head >= 64 of real models)."""
    model = {"qk_norm": qk_norm, "heads": heads, **({} if scale is None else {"softmax_scale": scale}),
             **({} if rope is None else {"rope_theta": rope})}
    op = _attention(model=model, init={"q": {"std": std}, "k": {"std": std}})
    cache = op.moments(INPUTS["q"], INPUTS["p"])[2]
    expected = 2 * (op.P.beta / cache.beta_c) ** 2 * np.log(T)
    measured = []
    for s in range(8):
        rng = np.random.default_rng([5, s])
        W = init_block((op,), rng)
        _, (c,) = numpy_forward((op,), _stream(rng, INPUTS["q"], INPUTS["p"]), W, rng)
        scores = c["q"] @ c["k"].swapaxes(-1, -2) * op.P.softmax_scale  # (B, KV, G*T, T)
        measured.append(scores.var(axis=-1, ddof=1).mean())
    n = op.P.d_head if qk_norm == "head" else op.P.kv_heads * op.P.d_head
    assert np.mean(measured) == pytest.approx(expected, rel=0.03 + (2 / n if qk_norm != "none" else 0.0))


def test_a_planted_gain_error_fails():
    """The harness can fail: the MLP's moment map with its output gain 10% high is caught."""
    from dataclasses import replace

    op = OPERATIONS["mlp-relu"]()
    wrong = MLP(replace(op.P, g_2=1.1 * op.P.g_2))
    with pytest.raises(AssertionError):
        _close(_numpy_moments(op, _numpy), _expected(wrong))


# ------------------------------------------------------------------------------------------------
# PyTorch: the same operation as a module


TORCH_NAMES = {  # numpy weight name -> torch parameter (the transposed weight, or the bias)
    Attention: lambda op: {f"{w}{m}": f"{m}.{'weight' if w == 'w' else 'bias'}" for m in "qkvo" for w in "wb"},
    MLP: lambda op: ({"w_gate": "ff_in.weight", "b_gate": "ff_in.bias", "w_in": "ff_up.weight", "b_in": "ff_up.bias"}
                     if op.P.activation in ("swiglu", "geglu") else {"w_in": "ff_in.weight", "b_in": "ff_in.bias"})
    | {"w_out": "ff_out.weight", "b_out": "ff_out.bias"},
    MoE: lambda op: {"w_router": "router.weight"}
    | {f"e{j}.{n}": f"experts.{j}.{t}" for j in range(op.P.experts) for n, t in TORCH_NAMES[MLP](op).items()}
    | {f"shared.{n}": f"shared.{t}" for n, t in TORCH_NAMES[MLP](op).items()},
}


def _module(op):
    torch = pytest.importorskip("torch")
    from initadvisor.torch import OpModule

    return torch, OpModule(op, D).double().train()


def _load(module, W):
    """Copy the numpy weights into every operation's submodules."""
    import torch

    for sub in module.modules():
        op = getattr(sub, "op", None)
        if id(op) not in W:
            continue
        for np_name, t_name in TORCH_NAMES[type(op)](op).items():
            if np_name in W[id(op)]:
                w = W[id(op)][np_name]
                with torch.no_grad():
                    sub.get_parameter(t_name).copy_(torch.from_numpy(w.T if w.ndim == 2 else w))


def _causal(op) -> bool:
    return any(isinstance(o, Attention) and o.P.causal for o in leaves((op,)))


def _stochastic(op) -> bool:
    return any((isinstance(o, Dropout) and o.rate > 0) or (hasattr(o, "P") and o.P.attn_dropout > 0)
               for o in leaves((op,)))


# operations whose position-resolved map is tested against the numpy network elsewhere (test_verify) and whose pair
# map is a stand-in (ALiBi's heads as windows of their effective keys): here only numpy against PyTorch
TORCH_ONLY = {"attention-alibi": lambda: _attention(model={"causal": True, "alibi": True, "heads": 8})}


@pytest.mark.parametrize("name", sorted(n for n in OPERATIONS if not _stochastic(OPERATIONS[n]())) + list(TORCH_ONLY))
def test_numpy_equals_torch_module_on_the_same_weights(name):
    op = {**OPERATIONS, **TORCH_ONLY}[name]()
    torch, module = _module(op)
    rng = np.random.default_rng(5)
    W = init_block((op,), rng)
    _load(module, W)
    x, G = _stream(rng, 1.7, 0.6), _stream(rng, 1.3, 0.4)
    y, caches = numpy_forward((op,), x, W, rng)
    dx = numpy_backward((op,), G, W, caches)
    xt = torch.tensor(x, requires_grad=True)
    yt = module(xt)
    (yt * torch.from_numpy(G)).sum().backward()
    np.testing.assert_allclose(yt.detach().numpy(), y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), dx, rtol=1e-9, atol=1e-12)


def _torch_own_init(op, x, G, rng):
    torch, _ = _module(op)
    torch.manual_seed(int(rng.integers(2**31)))
    _, module = _module(op)
    xt = torch.tensor(x, requires_grad=True)
    y = module(xt)
    (y * torch.from_numpy(G)).sum().backward()
    return y.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("name", _cases())
def test_torch_module_with_its_own_init_matches_the_moment_map(name):
    op = OPERATIONS[name]()
    _close(_numpy_moments(op, _torch_own_init), _expected(op))


@pytest.mark.parametrize("model", [{}, {"embedding_scale": 3.0}, {"embedding_scale": 3.0, "embedding_norm": True,
                                                                   "norm_eps": 0.5},
                                   {"embedding_norm": True, "embedding_width": D // 2}])
def test_embeddings_moments_match_numpy_and_torch(model):
    """The input stage: Zipf tokens + positions (+ a scale, a norm and dropout, tables of another width projected
    to d_model: ELECTRA) against Embeddings.moments."""
    spec = build_spec({"model": {"layers": 1, "d_model": D, "heads": 4, **model}, "dropout": 0.1,
                       "sequence": {"length": T, "vocab": 50, "embeddings": ["token", "position", "segment"]},
                       "init": {"embedding": {"std": 0.7}}})
    emb = embeddings(spec)
    q, p = emb.moments()
    got = np.mean([[m.mean() for m in pair_moments(emb.forward(B, np.random.default_rng([3, s]), np.dtype("float64")))]
                   for s in range(SEEDS)], axis=0)
    assert abs(got[0] - q) <= TOL * q and abs(got[1] - p) <= TOL * q
    torch, module = _module(emb)
    vals = []
    for s in range(SEEDS):
        torch.manual_seed(s)
        m = type(module)(emb, D).double().train()
        ids = torch.as_tensor(np.random.default_rng(s).integers(0, 50, size=(B, T)))
        vals.append([v.mean() for v in pair_moments(m(ids).detach().numpy())])
    tq, tp = np.mean(vals, axis=0)
    assert abs(tq - q) <= TOL * q  # uniform ids in torch here: only q is comparable (p depends on the token law)


# ------------------------------------------------------------------------------------------------
# The position-resolved backward of every position-wise operation against its pair backward


@pytest.mark.parametrize("name", [k for k in OPERATIONS if not k.startswith(("attention", "residual-reordered",
                                                                           "residual-parallel"))])
def test_causal_backward_is_the_pair_backward_on_exchangeable_positions(name):
    """On a state where every position has the same q and every pair the same p (and the gradient the same gq, gp),
    an operation that acts position by position must map the gradient as its moments_backward does: every
    position's g and every group pair's cross moment (ReLU, GeLU, linear exactly; the Mehler series of SiLU, tanh
    and the gates within 1e-3). Attention (rows of t keys) is test_causal's."""
    from initadvisor.core import causal as cz

    op = OPERATIONS[name]()
    G = cz._grid(40, 8, 1.3)
    K = len(G.n)

    def state(a, b):
        P = np.full((K, K), b)
        P[G.single, G.single] = 0.0
        return cz.State(np.full(G.T, a), P)

    _, cache = op.causal(G, state(INPUTS["q"], INPUTS["p"]))
    D = op.causal_backward(G, state(INPUTS["gq"], INPUTS["gp"]), cache)
    _, (pair,) = spread_forward((op,), None, [op.moments(INPUTS["q"], INPUTS["p"])[2]])  # a norm's Jensen factor
    gq, gp = op.moments_backward(INPUTS["gq"], INPUTS["gp"], pair)
    off = ~np.eye(K, dtype=bool) | ~G.single[:, None]
    assert np.allclose(D.qf, gq, rtol=1e-3), (D.qf[:3], gq)
    assert np.allclose(D.P[off], gp, rtol=1e-3, atol=1e-6), (D.P[off][:3], gp)


@pytest.mark.parametrize("act", ["relu", "tanh"])
def test_hidden_unit_dropout_is_the_mlp_followed_by_dropout(act):
    """T5 drops the MLP's hidden units (y = W2 (m h) / keep); the engine puts `mlp_dropout` after the MLP (the block
    recipe's Dropout): the same moments both ways, as the masks are independent per token and unit. Checked on a
    numpy MLP that masks its hidden units, against the moment maps of (MLP, Dropout), at rate 0.3 (an error of the
    factor 1 / keep = 1.43 fails by far)."""
    from initadvisor.core.ops import activation, activation_grad, moments_backward, moments_forward

    rate = 0.3
    mlp = _mlp(act, init={"std": 0.09, "ff_in": {"bias_std": 0.1}})
    (s1, b1), (s2, _) = mlp.P.init["ff_in"], mlp.P.init["ff_out"]
    F = mlp.P.d_ff

    def hidden_dropout(_op, x, G, rng):
        w1, bias, w2 = rng.normal(0, s1, (D, F)), rng.normal(0, b1, F), rng.normal(0, s2, (F, D))
        mask = (rng.random((*x.shape[:2], F)) >= rate) / (1 - rate)
        z = x @ w1 + bias
        y = (activation(act, z) * mask) @ w2
        return y, ((G @ w2.T) * mask * activation_grad(act, z)) @ w1.T

    ops = (mlp, Dropout(rate))
    q, p, caches = moments_forward(ops, INPUTS["q"], INPUTS["p"])
    expected = np.array([q, p, *moments_backward(ops, INPUTS["gq"], INPUTS["gp"], caches)], dtype=float)
    _close(_numpy_moments(mlp, hidden_dropout), expected)


@pytest.mark.parametrize("heads", [1, 3, 4, 6, 8, 12, 16, 112])
def test_alibi_bias_is_transformers_bloom_bias(heads):
    """The numpy and PyTorch networks' ALiBi bias -m_h (t - s) against BLOOM's own slopes (any head count: the
    powers of 2 and the interleaved rest), and its rows at init: softmax of the bias alone."""
    torch = pytest.importorskip("torch")
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    from initadvisor.core.attention import alibi_rows, alibi_slopes
    from initadvisor.core.ops import _alibi_bias

    slopes = bloom._get_alibi_slopes(heads, "cpu").double().numpy()
    np.testing.assert_allclose(alibi_slopes(heads), slopes, rtol=1e-6)
    T = 12
    bias = _alibi_bias(T, heads, np.float64)
    t = np.arange(T)
    np.testing.assert_allclose(bias, -slopes[:, None, None] * (t[:, None] - t[None, :]), rtol=1e-6)
    masked = np.where(t[None, :] <= t[:, None], bias, -np.inf)
    rows = torch.softmax(torch.from_numpy(masked), -1).numpy()
    np.testing.assert_allclose(alibi_rows(T, heads), rows, rtol=1e-5, atol=1e-12)


def test_median_and_unique_are_numpys():
    """core.sorting's median and unique (numpy's without their numpy.ma import) against np.median and np.unique, odd
    and even sizes, repeats, infinities; the median is nan as soon as one value is nan."""
    from initadvisor.core.sorting import median, unique

    rng = np.random.default_rng(4)
    for n in range(0, 40):
        x = np.round(rng.standard_normal(n) * 10.0 ** rng.uniform(-1, 3))
        if n > 3:
            x[0], x[1] = np.inf, -np.inf
        assert np.array_equal(unique(x), np.unique(x))
        if n:
            assert median(x) == float(np.median(x)), x
            x[rng.integers(n)] = np.nan
            assert np.isnan(median(x))
