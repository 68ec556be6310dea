"""A token's mean-square spread (ops.spread_forward, causal.State.u) against independent routes: the unit squares'
moments against sampling, a finite-width MLP and attention block against their numpy forward over many tokens, and
the norms' E[1 / (ms + eps)] against the numpy network's own norms.

Why it matters: a norm's backward divides by each token's mean square, and E[1/x] > 1/E[x]. Behind block 1's
attention a token's mean square varies between sequences by 5-12% (the rows' IPR in each head, the Zipf repeats'
counts, finite width), and the embeddings' gradient was 10-23% low in every decoder family at d 256-512 for it.
"""

from __future__ import annotations

import numpy as np
import pytest

from initadvisor.core import kernels, ops
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
