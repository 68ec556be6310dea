"""The Monte-Carlo judge: its hand-written backward against torch autograd, and sanity facts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from initadvisor.simulate import (
    Measurement, backward, block_forward, forward, init_network, make_input, pair_moments, simulate,
)
from initadvisor.core.ops import Attention, Dropout, leaves, walk
from initadvisor.stack import from_spec
from initadvisor.spec import build_spec

try:  # a declared test dependency; without it only the autograd comparison is skipped, not the sanity facts
    import torch
except ImportError:
    torch = None


def make_spec(**kw):
    """A small spec; keyword arguments override model keys, or top-level sections by their name."""
    model = {"layers": 2, "d_model": 16, "heads": 4, "d_ff": 24, "norm_eps": 1e-5}
    data = {"model": model, "sequence": {"length": 7, "vocab": 50},
            "init": {"std": 0.25, "q": {"std": 0.4, "bias_std": 0.1}, "k": {"std": 0.4, "bias_std": 0.2},
                     "v": {"bias_std": 0.1}, "o": {"bias_std": 0.1}, "ff_in": {"bias_std": 0.3},
                     "ff_out": {"bias_std": 0.1}, "embedding": {"std": 1.0}}}
    for k, v in kw.items():
        if k in ("sequence", "init", "residual", "dropout", "attention_dropout"):
            data[k] = v
        else:
            model[k] = v
    return build_spec(data)


# ------------------------------------------------------------------------------------------------
# An independent torch implementation of the same network, fed the numpy weights and dropout masks.


def _t(a):
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))


def _torch_norm(x, kind, eps):
    if kind == "layernorm":
        return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=eps)
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _torch_act(name, z):
    F = torch.nn.functional
    return {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "silu": F.silu,
            "tanh": torch.tanh, "linear": lambda z: z}[name](z)


def _torch_drop(x, mask, p):
    return x if mask is None else x * _t(mask).to(x.dtype) / (1 - p)


def _tw(w, leaves=None):
    """Weights by name -> dict of torch tensors (optionally some replaced by given leaves)."""
    out = {k: _t(v) for k, v in w.items()}
    out.update(leaves or {})
    return out


def _roles(ops, W, caches):
    """A block's numpy weights by name and its caches by role (attention, the dropout after each branch)."""
    w = dict.fromkeys(("bq", "bk", "bv", "wo", "bo", "b_in", "b_out", "w_gate", "b_gate"))
    for op in leaves(ops):
        w.update(W.get(id(op), {}))
    c, last = {}, None
    for op, cache in walk(ops, caches):
        if isinstance(op, Attention):
            c["attn"] = cache
        if isinstance(op, Dropout):
            c["m_att" if last is Attention else "m_mlp"] = cache
        last = type(op)
    return w, c


def _lin(x, W, b):
    y = x @ W
    return y if b is None else y + b


def _torch_attn(spec, w, u, c):
    B, T, d = u.shape
    H, KV, dh = spec.heads, spec.kv_heads, spec.d_head
    lin = _lin
    q = lin(u, w["wq"], w["bq"]).reshape(B, T, H, dh).transpose(1, 2)
    k = lin(u, w["wk"], w["bk"]).reshape(B, T, KV, dh).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    v = lin(u, w["wv"], w["bv"]).reshape(B, T, KV, dh).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    s = q @ k.transpose(-1, -2) * spec.softmax_scale
    allowed = torch.ones(T, T, dtype=torch.bool)
    if spec.causal:
        allowed = torch.tril(allowed)
        s = s.masked_fill(~allowed, float("-inf"))
    a = torch.softmax(s, dim=-1)
    mask = c["mask"]
    if mask is not None:
        mask = mask.reshape(B, H, T, T)
    o = _torch_drop(a, mask, spec.attention_dropout) @ v
    if spec.attention == "centered":
        avg = allowed.to(u.dtype) / allowed.sum(-1, keepdim=True)
        o = o - avg @ v
    o = o.transpose(1, 2).reshape(B, T, d)
    return lin(o, w["wo"], w["bo"]) if spec.out_proj else o, a


def _torch_mlp(spec, w, u):
    if spec.activation in ("swiglu", "geglu"):
        act = "silu" if spec.activation == "swiglu" else "gelu"
        a = _torch_act(act, _lin(u, w["w_gate"], w["b_gate"])) * _lin(u, w["w_in"], w["b_in"])
    else:
        a = _torch_act(spec.activation, _lin(u, w["w_in"], w["b_in"]))
    return _lin(a, w["w_out"], w["b_out"])


def _torch_block(spec, w, h, c):
    sa, ba = spec.res_attention.skip, spec.res_attention.block
    sm, bm = spec.res_mlp.skip, spec.res_mlp.block
    p, N = spec.dropout, (lambda x: _torch_norm(x, spec.norm_type, spec.norm_eps))
    drop_a = lambda x: _torch_drop(x, c["m_att"], p)  # noqa: E731
    drop_m = lambda x: _torch_drop(x, c["m_mlp"], p)  # noqa: E731
    if spec.parallel_residual:
        att, a = _torch_attn(spec, w, N(h), c["attn"])
        return sa * h + ba * drop_a(att) + bm * drop_m(_torch_mlp(spec, w, N(h))), a
    if spec.norm == "post":
        att, a = _torch_attn(spec, w, h, c["attn"])
        h = N(sa * h + ba * drop_a(att))
        return N(sm * h + bm * drop_m(_torch_mlp(spec, w, h))), a
    if spec.norm == "pre":
        att, a = _torch_attn(spec, w, N(h), c["attn"])
        h = sa * h + ba * drop_a(att)
        return sm * h + bm * drop_m(_torch_mlp(spec, w, N(h))), a
    att, a = _torch_attn(spec, w, h, c["attn"])
    h = sa * h + ba * drop_a(att)
    return sm * h + bm * drop_m(_torch_mlp(spec, w, h)), a


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


CASES = {
    "post": dict(norm="post", dropout=0.1, attention_dropout=0.2),
    "post_rms_noproj": dict(norm="post", norm_type="rmsnorm", out_proj=False, activation="tanh"),
    "pre_causal": dict(norm="pre", causal=True, activation="relu", dropout=0.15),
    "pre_rms_centered": dict(norm="pre", norm_type="rmsnorm", attention="centered", activation="gelu_tanh"),
    "none": dict(norm="none", activation="silu", residual={"attention": {"skip": 0.8, "block": 0.6},
                                                           "mlp": {"skip": 1.1, "block": 0.5}}),
    "none_causal_centered": dict(norm="none", causal=True, attention="centered", activation="linear",
                                 attention_dropout=0.1),
    "parallel": dict(norm="pre", parallel_residual=True, dropout=0.1, attention_dropout=0.1,
                     residual={"attention": {"skip": 0.9, "block": 0.7}, "mlp": {"skip": 1.0, "block": 0.4}}),
    "swiglu_gqa_causal": dict(norm="pre", activation="swiglu", kv_heads=2, causal=True, dropout=0.1,
                              attention_dropout=0.1),
    "geglu_gqa_centered_post": dict(norm="post", activation="geglu", kv_heads=1, attention="centered",
                                    dropout=0.1, attention_dropout=0.1),
    "mqa_parallel_causal_centered": dict(norm="pre", parallel_residual=True, kv_heads=1, causal=True,
                                         attention="centered", activation="swiglu", out_proj=False,
                                         attention_dropout=0.2, dropout=0.2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_matches_torch_autograd(case):
    if torch is None:
        pytest.importorskip("torch")
    spec = make_spec(**CASES[case])
    net = from_spec(spec)
    rng = np.random.default_rng(1)
    layers = init_network(net, rng)
    B = 2
    h0 = make_input(net, B, rng)
    hs, caches = forward(net, layers, h0, rng)
    G = rng.standard_normal(h0.shape)
    wg = {"wq": [], "wk": [], "wv": []}
    gs = backward(net, layers, caches, G, wg)
    flat = [_roles(ops, W, c) for ops, W, c in zip(net.blocks, layers, caches)]
    assert len(hs) == len(gs) == spec.layers + 1
    if spec.dropout > 0:  # the masks are really used
        assert any(c["m_att"] is not None and not c["m_att"].all() for _, c in flat)
    if spec.attention_dropout > 0:
        assert any(not c["attn"]["mask"].all() for _, c in flat)

    th = [torch.tensor(h0, requires_grad=True)]
    probs = []
    for w, c in flat:
        h, a = _torch_block(spec, _tw(w), th[-1], c)
        h.retain_grad()
        th.append(h)
        probs.append(a)
    # forward streams and attention matrices agree
    for i, (h, t) in enumerate(zip(hs, th)):
        assert _rel(h, t.detach().numpy()) < 1e-10, f"stream {i}"
    for (_, c), a in zip(flat, probs):
        B_, H, T, _ = a.shape
        assert _rel(c["attn"]["a"].reshape(B_, H, T, T), a.detach().numpy()) < 1e-10
    # per-sequence gradients: loss_b = sum(h_L[b] * G[b]); streams and W_Q/W_K/W_V norms
    Gt = torch.from_numpy(G)
    (th[-1] * Gt).sum().backward()
    for i, (g, t) in enumerate(zip(gs, th)):
        assert _rel(g, t.grad.numpy()) < 1e-6, f"gradient at stream {i}"
    assert np.abs(gs[0]).max() > 0
    # weight-gradient norms, per sequence, through torch with leaf weights
    for b in range(B):
        ws = [{n: torch.tensor(w[n], requires_grad=True) for n in ("wq", "wk", "wv")} for w, _ in flat]
        h = torch.tensor(h0[b:b + 1])
        for (w, c), leaf in zip(flat, ws):
            cb = _slice_cache(c, b)
            h = _torch_block(spec, _tw(w, leaf), h, cb)[0]
        (h * Gt[b:b + 1]).sum().backward()
        for li, leaf in enumerate(ws):
            for n in ("wq", "wk", "wv"):
                want = float((leaf[n].grad ** 2).sum())
                got = wg[n][spec.layers - 1 - li][b]
                assert abs(got - want) <= 1e-6 * abs(want) + 1e-300, (n, li, b)


def _slice_cache(c, b):
    out = dict(c)
    out["m_att"] = None if c["m_att"] is None else c["m_att"][b:b + 1]
    out["m_mlp"] = None if c["m_mlp"] is None else c["m_mlp"][b:b + 1]
    out["attn"] = dict(c["attn"], mask=None if c["attn"]["mask"] is None else c["attn"]["mask"][b:b + 1])
    return out


# ------------------------------------------------------------------------------------------------
# Sanity facts


def test_uniform_attention_without_skip_makes_tokens_identical():
    rho0 = 0.3
    spec = build_spec({
        "model": {"layers": 1, "d_model": 64, "heads": 4, "norm": "none"},
        "sequence": {"length": 32, "input_correlation": rho0},
        "init": {"std": 0.125, "q": {"std": 1e-4}, "k": {"std": 1e-4}, "embedding": {"std": 1.0}},
        "residual": {"attention": {"skip": 0.0, "block": 1.0}, "mlp": {"skip": 1.0, "block": 0.0}},
    })
    # 8 seeds x 4 sequences: q after the V/O projections varies between seeds at d = 64 (random gains), q0 between
    # sequences. Over 20 seeds the relative errors of q1 and q0 had standard deviations 5.8% and 1.0% (max 10%,
    # 2.5%), so the 35% and 5% bounds are 5-6 of them; with 3 seeds x 2 sequences they failed at 3 of 12 seeds.
    m = simulate(spec, seeds=8, batch=4)
    assert isinstance(m, Measurement) and m.n == 32
    assert abs(m.rho[0] - rho0) < 5 * m.rho_se[0] + 0.02
    assert m.rho[1] > 0.9999
    assert m.y2[0] == pytest.approx(1 / 32, rel=1e-6)  # uniform rows: sum_s (1/T)^2 = 1/T
    # q after uniform attention: g_V g_O (p0 + (q0 - p0)/T) with gains std^2 d = 1 (per-sequence noise aside)
    q0 = 2.0
    assert m.q[0] == pytest.approx(q0, rel=0.05)
    assert m.q[1] == pytest.approx(q0 * (rho0 + (1 - rho0) / 32), rel=0.35)


def test_causal_uniform_attention_y2_is_mean_of_one_over_position():
    T = 16
    spec = make_spec(layers=1, causal=True, sequence={"length": T, "vocab": 50},
                     init={"std": 0.25, "q": {"std": 1e-6}, "k": {"std": 1e-6}})
    m = simulate(spec, seeds=1, batch=2)
    assert m.y2[0] == pytest.approx(np.mean(1.0 / np.arange(1, T + 1)), rel=1e-6)


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_post_norm_streams_have_unit_q(norm_type):
    spec = make_spec(layers=3, d_model=64, norm="post", norm_type=norm_type, sequence={"length": 16})
    m = simulate(spec, seeds=2, batch=2)
    np.testing.assert_allclose(m.q, 1.0, atol=1e-4)  # var / (var + eps) with var ~ O(1)


def test_dropout_raises_q_by_one_over_keep():
    p = 0.2
    spec = make_spec(layers=1, d_model=128, heads=4, norm="post", dropout=p, sequence={"length": 64})
    m = simulate(spec, seeds=3, batch=2, weight_grads=False)
    assert m.q[0] == pytest.approx(1 / (1 - p), abs=4 * m.q_se[0] + 1e-3)
    assert m.q[0] == pytest.approx(1.25, rel=0.01)
    assert m.q[1] == pytest.approx(1.0, abs=1e-4)  # post-LN output, dropout inside


def test_embedding_correlation_from_shared_segment_and_zipf():
    """BERT-like tables, one segment: rho_0 = (1 + P(same token)) / 3 with P = sum p_i^2 of the Zipf law."""
    V = 1000
    spec = build_spec({
        "model": {"layers": 1, "d_model": 256, "heads": 4, "norm": "pre"},
        "sequence": {"length": 64, "vocab": V, "embeddings": ["token", "position", "segment"]},
        "init": {"embedding": {"std": 0.5}},
    })
    m = simulate(spec, seeds=8, batch=4, weight_grads=False)
    w = 1.0 / np.arange(1, V + 1)
    p_same = (w ** 2).sum() / w.sum() ** 2
    want = (1 + p_same) / 3
    assert m.q[0] == pytest.approx(3 * 0.25, rel=0.05)
    # the standard error treats the sequences of one initialisation as independent; they share the tables
    assert abs(m.rho[0] - want) < 5 * m.rho_se[0] + 0.015


def test_pair_moments_against_explicit_loops():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3)) + 0.7
    q, p = pair_moments(x)
    for b in range(2):
        pairs = [x[b, t] @ x[b, s] / 3 for t in range(5) for s in range(5) if t != s]
        assert p[b] == pytest.approx(np.mean(pairs))
        assert q[b] == pytest.approx(np.mean(x[b] ** 2))
    q3, p3 = pair_moments(x, 1, 4)
    assert p3[0] == pytest.approx(np.mean([x[0, t] @ x[0, s] / 3 for t in range(1, 4) for s in range(1, 4) if t != s]))


def test_gradient_at_last_index_is_the_probe_and_normalisation():
    spec = make_spec(layers=2, norm="pre", sequence={"length": 16})
    m = simulate(spec, seeds=2, batch=2)
    L = spec.layers
    assert m.grad_q[L] == pytest.approx(1.0, abs=5 * m.grad_q_se[L] + 0.05)
    assert m.grad_q_norm[L] == pytest.approx(1.0)
    assert m.grad_p[L] == pytest.approx(0.0, abs=5 * m.grad_p_se[L] + 0.05)
    assert m.grad_q.shape == m.q.shape == (L + 1,) and m.y2.shape == (L,) and m.rho_thirds.shape == (L + 1, 3)
    d = m.to_dict()
    assert d["n"] == 4 and len(d["rho"]) == L + 1


def test_pre_ln_q_grows_and_float32_agrees():
    """Pre-LN: every block adds its branch variance to the stream, so q grows with depth; a float32 run of the
    same spec measures the same thing (different random draws, so only statistically)."""
    spec = make_spec(layers=4, d_model=64, norm="pre", sequence={"length": 32})
    m64 = simulate(spec, seeds=2, batch=2)
    m32 = simulate(spec, seeds=2, batch=2, dtype=np.float32)
    assert np.all(np.diff(m64.q) > 0)
    assert m32.dtype == "float32" and np.all(np.isfinite(m32.q)) and np.all(np.isfinite(m32.grad_q))
    np.testing.assert_allclose(m32.q, m64.q, rtol=0.3)


def test_block_forward_is_deterministic_given_rng():
    net = from_spec(make_spec(dropout=0.1))
    layers = init_network(net, np.random.default_rng(0))
    h0 = make_input(net, 2, np.random.default_rng(1))
    a, _ = block_forward(net.blocks[0], layers[0], h0, np.random.default_rng(2))
    b, _ = block_forward(net.blocks[0], layers[0], h0, np.random.default_rng(2))
    np.testing.assert_array_equal(a, b)
