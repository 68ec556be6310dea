"""A token's mean-square spread (ops.spread_forward, causal.State.u) against independent routes: the unit squares'
moments against sampling, a finite-width MLP and attention block against their numpy forward over many tokens, and
the norms' E[1 / (ms + eps)] against the numpy network's own norms.

Why it matters: a norm's backward divides by each token's mean square, and E[1/x] > 1/E[x]. Behind block 1's
attention a token's mean square varies between sequences by 5-12% (the rows' IPR in each head, the Zipf repeats'
counts, finite width), and the embeddings' gradient was 10-23% low in every decoder family at d 256-512 for it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from initadvisor.core import kernels, ops
from initadvisor.core.ops import numpy_forward, spread_forward
from initadvisor.core.model import propagate_causal
from initadvisor.simulate import init_block, simulate
from initadvisor.spec import build_spec
from initadvisor.stack import block_params, from_spec

SEEDS = 24


def test_unit_square_moments():
    """ReLU: E relu(z)^2 = q / 2, E relu^4 = 3 q^2 / 2 (Var / mean^2 = 5), elasticity 1; linear: 2 and 1; gated
    SiLU and GeLU against 2e6 sampled pairs (2%), their elasticity against a finite difference of E f in q."""
    q = np.array([0.5, 1.0, 3.0])
    m, v, e = kernels.square_spread("relu", q)
    np.testing.assert_allclose((m, v, e), (q / 2, np.full(3, 5.0), np.ones(3)), rtol=1e-6)
    np.testing.assert_allclose(kernels.square_spread("linear", q)[1:], (np.full(3, 2.0), np.ones(3)), rtol=1e-6)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 2_000_000))
    for act in ("silu", "gelu"):
        phi = kernels.PHI[act][0]
        for qq in (0.5, 2.0):
            f = phi(np.sqrt(qq) * a) ** 2 * qq * b * b
            m, v, e = (float(x) for x in kernels.square_spread(act, qq, gated=True))
            assert m == pytest.approx(f.mean(), rel=0.02)
            assert v == pytest.approx(f.var() / f.mean() ** 2, rel=0.02)
            h = 1e-4
            up, down = (float(kernels.square_spread(act, qq * (1 + s), gated=True)[0]) for s in (h, -h))
            assert e == pytest.approx((np.log(up) - np.log(down)) / (2 * h), rel=1e-4)


def _layer(activation: str, d: int = 128, d_ff: int = 512, **model):
    spec = build_spec({"model": {"layers": 1, "d_model": d, "heads": 4, "d_ff": d_ff, "activation": activation,
                                 "norm_type": "rmsnorm", **model},
                       "sequence": {"length": 16, "vocab": 1000}, "init": {"std": 0.05}})
    return block_params(spec)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_mlp_spread_is_the_finite_width_network(activation):
    """A finite-width MLP (fixed weights) on unit-norm tokens: the relative variance of a token's output mean square
    over 4000 tokens, averaged over 24 weight draws, against _unit_spread's a / q_out^2 within 10% (measured: ReLU
    0.0254 against 0.0239, GeLU 0.0280 / 0.0279, SwiGLU 0.0492 / 0.0495; W_2's 2 / d alone is 0.0156)."""
    P = _layer(activation)
    op = ops.MLP(P)
    rng = np.random.default_rng(1)
    rel = []
    for _ in range(24):
        W = init_block((op,), rng)
        x = rng.standard_normal((1, 4000, P.d_model))
        x /= np.sqrt((x * x).mean(-1, keepdims=True))  # a norm's output: mean square 1 per token
        ms = (op.forward(x, W, rng)[0] ** 2).mean(-1).ravel()
        rel.append(ms.var() / ms.mean() ** 2)
    q1 = op.moments(1.0, 0.0)[2][0]
    a, _ = op._unit_spread(np.asarray(q1))
    q_out = op.moments(1.0, 0.0)[0]
    assert float(a) / q_out**2 == pytest.approx(np.mean(rel), rel=0.1)


def test_norm_jensen_factor_is_the_network_s():
    """Block 1 of a Llama-like stack (pre-norm RMSNorm, GQA, SwiGLU, Zipf tokens, d 256, T 128): the MLP's norm
    divides each token by its mean square, whose spread the attention rows set; E[1/ms] E[ms] of the numpy network's
    norm (24 seeds x 4 sequences) per position, averaged over ranges of positions, against the position-resolved
    engine's factor j, and block 2's first norm (the attention's and the MLP's spreads summed by the residual
    stream), within 0.03: measured 1.034-1.076 against the engine's 1.046-1.057 at block 1 over rng seeds 0-3,
    1.020-1.030 against 1.021-1.027 at block 2 (the mean-field 1 is 0.02-0.08 off)."""
    spec = build_spec({"model": {"layers": 2, "d_model": 256, "heads": 4, "kv_heads": 2, "d_ff": 688, "norm": "pre",
                                 "norm_type": "rmsnorm", "activation": "swiglu", "causal": True, "rope_theta": 1e4},
                       "sequence": {"length": 128, "vocab": 5000, "embeddings": ["token"]}, "init": {"std": 0.04}})
    seen, factors = [], []
    forward, causal = ops.Norm.forward, ops.Norm.causal

    def record(self, x, W, rng):
        y, c = forward(self, x, W, rng)
        seen.append(1.0 / c[1][..., 0] ** 2)
        return y, c

    def keep(self, G, S):
        out = causal(self, G, S)
        if S.R is not None:  # the state's own call (the same-token pairs' map calls it again, without a spread)
            factors.append(np.broadcast_to(out[1][0][1], (G.T,)))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops.Norm, "forward", record)
        mp.setattr(ops.Norm, "causal", keep)
        propagate_causal(from_spec(spec))
        simulate(spec, seeds=SEEDS, batch=4, weight_grads=False)
    per = len(seen) // SEEDS
    assert len(factors) == per == 4
    for k in (1, 2):  # block 1's MLP norm, block 2's attention norm
        ms = np.concatenate([seen[s * per + k] for s in range(SEEDS)], 0)
        for lo, hi in ((1, 8), (8, 32), (32, 128)):
            net = float(np.mean((1.0 / ms[:, lo:hi]).mean(0) * ms[:, lo:hi].mean(0)))  # per position, then averaged
            assert float(factors[k][lo:hi].mean()) == pytest.approx(net, abs=0.03), (k, lo, hi)
            if k == 1 and lo == 8:
                assert net - 1.0 > 0.03  # the mean-field 1 is off here


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_mlp_passes_its_input_spread_with_the_elasticity(activation):
    """Tokens whose mean square varies (lognormal, relative variance 0.04): the MLP's output spread is
    a + b (u / q^2), b the kernel's elasticity squared (1 for ReLU, about 4.7 for SwiGLU), within 15% (measured:
    ReLU 0.0654 / 0.0650, SwiGLU 0.230 / 0.259, the delta method's 6% on a kernel of degree 2 included); without b
    the law is 2.5x (ReLU) and 5x (SwiGLU) low, with the elasticity unsquared SwiGLU's is 40% low."""
    P = _layer(activation)
    op = ops.MLP(P)
    rng = np.random.default_rng(2)
    rel, sd = [], np.sqrt(np.log(1.04))
    for _ in range(16):
        W = init_block((op,), rng)
        x = rng.standard_normal((1, 4000, P.d_model))
        x /= np.sqrt((x * x).mean(-1, keepdims=True))
        x *= np.exp(0.5 * sd * rng.standard_normal((1, 4000, 1)) - 0.25 * sd * sd)  # ms x e^(sd z - sd^2 / 2)
        ms = (op.forward(x, W, rng)[0] ** 2).mean(-1).ravel()
        rel.append(ms.var() / ms.mean() ** 2)
    q_out, _, cache = op.moments(1.0, 0.0)
    u = op.spread(0.04, cache)[0]
    assert float(u) / q_out**2 == pytest.approx(np.mean(rel), rel=0.15)


@pytest.mark.parametrize("qk_std", [0.001, 0.08, 0.15, 0.25])
def test_attention_spread_is_the_network_s(qk_std):
    """Bidirectional attention (T 64, d 128, 4 heads on 2 K/V heads, no repeated tokens) on unit-norm i.i.d. tokens,
    uniform to localized rows (beta 6e-5, 0.40, 1.41, 3.92): the relative variance of a token's output mean square
    over 24 weight draws x 16 sequences against the pair map's spread (the rows' IPR over the heads, W_V's and W_O's
    finite width). Within 30% past uniform rows (measured 11% low, 6% and 20% high, alike over rng seeds 3-17);
    within 40% at uniform rows, where the law is 25-34% low over those seeds: the keys' cross terms in the input,
    2 (1 - 1/m) / d = 0.015 of the 0.066 measured, are not modelled. Dropping the width term puts the uniform case
    75% low, not dividing the IPR's spread by the heads the localized ones 2-3x high."""
    spec = build_spec({"model": {"layers": 1, "d_model": 128, "heads": 4, "kv_heads": 2, "d_ff": 256},
                       "sequence": {"length": 64, "vocab": 1000},
                       "init": {"std": 0.08, "q": {"std": qk_std}, "k": {"std": qk_std}}})
    op = ops.Attention(replace(block_params(spec), repeat_vocab=0))
    rng = np.random.default_rng(3)
    ms = []
    for _ in range(24):
        W = init_block((op,), rng)
        x = rng.standard_normal((16, 64, 128))
        x /= np.sqrt((x * x).mean(-1, keepdims=True))
        ms.append((op.forward(x, W, rng)[0] ** 2).mean(-1).ravel())
    ms = np.concatenate(ms)
    q_out, _, cache = op.moments(1.0, 0.0)
    tolerance = 0.4 if qk_std < 0.01 else 0.3
    assert float(op.spread(None, cache)[0]) / q_out**2 == pytest.approx(ms.var() / ms.mean() ** 2, rel=tolerance)


def test_residual_and_dropout_carry_the_spread():
    """x 1.5 + MLP(x) dropped at 0.2, on tokens whose mean square varies (lognormal, relative variance 0.04): the output's
    spread, skip^4 u + the branch's (dropout: / keep^2), against the numpy forward within 35%: measured 25% low (0.033
    against 0.044), the skip path's finite-width cross term with the branch (2 skip x.f(x) / d, mean 0, variance
    4 skip^2 q q_f / d) not modelled; skip^2 in place of skip^4 is 55% low."""
    P = _layer("relu")
    op = ops.Residual(1.5, ((1.0, (ops.MLP(P), ops.Dropout(0.2))),))
    rng = np.random.default_rng(4)
    sd, ms = np.sqrt(np.log(1.04)), []
    for _ in range(16):
        W = init_block((op,), rng)
        x = rng.standard_normal((1, 4000, P.d_model))
        x /= np.sqrt((x * x).mean(-1, keepdims=True))
        x *= np.exp(0.5 * sd * rng.standard_normal((1, 4000, 1)) - 0.25 * sd * sd)
        ms.append((numpy_forward((op,), x, W, rng)[0] ** 2).mean(-1).ravel())
    ms = np.concatenate(ms)
    q_out, _, cache = op.moments(1.0, 0.0)
    u, _ = spread_forward((op,), 0.04, [cache])
    assert float(u) / q_out**2 == pytest.approx(ms.var() / ms.mean() ** 2, rel=0.35)
