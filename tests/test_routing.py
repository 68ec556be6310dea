"""The mixture-of-experts router's statistics (core/routing.py) and the rotary coherence (core/attention.py) against
independent routes: their exact limits, finite differences of the routing weights, and brute-force sums."""

from __future__ import annotations

import numpy as np
import pytest

from initadvisor.core import attention as att
from initadvisor.core import routing

TINY = 1e-10  # logit variance: clipped to s = 1e-3, uniform weights to about 0.2%


@pytest.mark.parametrize("E, k", [(8, 2), (16, 4), (64, 8)])
def test_uniform_routing_limits(E, k):
    """At vanishing logit scale the weights are uniform on a random top k: renormalised softmax gives
    sum w^2 = 1/k, a Jacobian norm (k - 1)/k^2 and, for independent tokens, k^2/E shared experts at 1/k^2 each;
    the full softmax's values give k/E^2; a normalised sigmoid 1/k, times scale^2."""
    A, B, F, _ = routing.statistics(E, k, "softmax", True, 1.0, TINY, 0.0)
    assert A == pytest.approx(1 / k, rel=1e-2) and F == pytest.approx((k - 1) / k**2, rel=1e-2)
    assert B == pytest.approx(1 / E, rel=0.1)
    assert routing.statistics(E, k, "softmax", False, 1.0, TINY, 1.0)[0] == pytest.approx(k / E**2, rel=1e-2)
    assert routing.statistics(E, k, "sigmoid", True, 2.5, TINY, 1.0)[0] == pytest.approx(6.25 / k, rel=1e-2)


def test_same_token_is_the_single_token_law():
    """rho = 1: two tokens route alike, B = A and F_x = F (common random numbers), at any logit scale."""
    A, B, F, Fx = routing.statistics(8, 2, "softmax", True, 1.0, np.array([0.1, 1.0, 4.0]), 1.0)
    np.testing.assert_allclose(B, A, rtol=1e-12)
    np.testing.assert_allclose(Fx, F, rtol=1e-12)
    assert np.all(np.diff(A) > 0)  # larger logits concentrate the weights: sum w^2 grows towards 1


@pytest.mark.parametrize("router, normalize", [("softmax", True), ("softmax", False), ("sigmoid", True),
                                               ("sigmoid", False)])
def test_logit_gradient_is_the_weights_jacobian(router, normalize):
    """dL/dl from routing.logit_gradient against central differences of routing.weights (top k held)."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((5, 8))
    dw = rng.standard_normal((5, 8))
    w, a, b, c = routing.weights(logits, 3, router, normalize, 2.0)
    got = routing.logit_gradient(dw * (w != 0), a, b, c)
    h, want = 1e-6, np.zeros_like(logits)
    for e in range(8):
        step = np.zeros(8)
        step[e] = h
        wp = routing.weights(logits + step, 3, router, normalize, 2.0)[0]
        wm = routing.weights(logits - step, 3, router, normalize, 2.0)[0]
        want[:, e] = ((wp - wm) / (2 * h) * dw).sum(axis=-1)
    np.testing.assert_allclose(got, want, atol=1e-7)


@pytest.mark.parametrize("m, d_head, theta, fraction", [(37, 16, 500.0, 1.0), (128, 64, 1e4, 1.0),
                                                         (90, 32, 1e6, 0.25), (2, 8, 10.0, 0.5)])
def test_rope_coherence_is_the_mean_cosine(m, d_head, theta, fraction):
    """kappa(m) by the Fejer kernel against the direct mean over ordered key pairs and head coordinates."""
    r = att.rope_dims(d_head, fraction)
    w = theta ** (-np.arange(0, r, 2) / r)
    s = np.arange(m)
    D = (s[:, None] - s[None, :])[~np.eye(m, dtype=bool)]
    turned = np.mean([np.cos(D * wi).mean() for wi in w])
    assert att.rope_coherence(m, d_head, theta, fraction) == pytest.approx(1 - r / d_head + r / d_head * turned,
                                                                          abs=1e-12)


def test_rope_rows_interpolate_the_exact_law():
    exact = att.rope_coherence(np.arange(1, 3001), 128, 1e4, 1.0)
    np.testing.assert_allclose(att.rope_rows(3000, 128, 1e4, 1.0), exact, atol=1e-5)


def test_statistics_in_chunks(monkeypatch):
    """Positions of a long causal sequence go through the routing tables in chunks: the same numbers."""
    import initadvisor.core.routing as routing

    rng = np.random.default_rng(4)
    s2, rho = rng.uniform(0.01, 5.0, 3000), rng.uniform(-1.0, 1.0, 3000)
    whole = routing.statistics(8, 2, "softmax", True, 1.0, s2, rho)
    monkeypatch.setattr(routing, "_CHUNK", 100)
    for a, b in zip(routing.statistics(8, 2, "softmax", True, 1.0, s2, rho), whole):
        assert a.shape == (3000,) and np.array_equal(a, b)


@pytest.mark.parametrize("router,normalize", [("softmax", True), ("softmax", False), ("sigmoid", True),
                                              ("sigmoid", False)])
def test_statistics_at_one_point_is_the_array_path(router, normalize):
    """A scalar pass asks at one point (floats): the same numbers as the array path at that point, across the
    tables' range and beyond it (s2 0, 1e-8 .. 1e8, inf, nan; rho outside [-1, 1], nan)."""
    rng = np.random.default_rng(11)
    s2 = np.concatenate([10 ** rng.uniform(-8, 8, 40), [0.0, np.inf, np.nan, 1.0]])
    rho = np.concatenate([rng.uniform(-1.2, 1.2, 40), [0.3, 1.0, np.nan, -1.0]])
    whole = routing.statistics(8, 2, router, normalize, 2.5, s2, rho)
    for i in range(s2.size):
        one = routing.statistics(8, 2, router, normalize, 2.5, float(s2[i]), float(rho[i]))
        np.testing.assert_allclose(one, [w[i] for w in whole], rtol=1e-13, atol=0.0)

def test_group_limited_routing_is_deepseek_v3s_router():
    """DeepSeek-V3's router (transformers' DeepseekV3TopkRouter: sigmoid scores, the best 2 of 4 groups by their two
    best scores, top 4 of 16 within them, renormalised x 2.5) on Gaussian tokens at logit std 2.4: A = E sum_j w_j^2
    and B = E sum_j w_j(a) w_j(b) (tokens at correlation 0.5) within 0.3% of routing.statistics, which without the
    groups is 1% low in A."""
    torch = pytest.importorskip("torch")
    ds = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    cfg = pytest.importorskip("transformers").DeepseekV3Config(
        hidden_size=64, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=True,
        routed_scaling_factor=2.5)
    router = ds.DeepseekV3TopkRouter(cfg)
    gen = torch.Generator().manual_seed(0)
    A, B = [], []
    for _ in range(20):
        with torch.no_grad():
            router.weight.normal_(0.0, 0.3, generator=gen)
        xa = torch.randn(4096, 64, generator=gen)
        xb = 0.5 * xa + 0.75 ** 0.5 * torch.randn(4096, 64, generator=gen)
        dense = []
        for x in (xa, xb):
            _, w, idx = router(x)
            dense.append(torch.zeros(x.shape[0], 16).scatter(-1, idx, w))
        A.append((dense[0] ** 2).sum(-1).mean().item())
        B.append((dense[0] * dense[1]).sum(-1).mean().item())
    s2 = 0.3 ** 2 * 64
    ours = routing.statistics(16, 4, "sigmoid", True, 2.5, s2, 0.5, 4, 2)
    assert np.mean(A) == pytest.approx(ours[0], rel=0.003) and np.mean(B) == pytest.approx(ours[1], rel=0.003)
    plain = routing.statistics(16, 4, "sigmoid", True, 2.5, s2, 0.5)
    assert abs(plain[0] / np.mean(A) - 1) > 0.006
