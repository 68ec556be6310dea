"""benchmarks/gram_chain.py, the encoder at infinite width and finite T, against the engine where the two must agree:
in the uniform phase (the mean field is exact there) and at the first layer past beta_c, whose keys are exchangeable,
so that a row's scores are i.i.d. and the engine's finite-T row law is exact (issue 13)."""

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gram_chain import _engine, blind, chain  # noqa: E402
from phase_fidelity import spec_for  # noqa: E402


@pytest.mark.parametrize("norm,causal", [("post", False), ("post", True), ("pre", True)])
@pytest.mark.parametrize("seed", [0, 1])
def test_chain_is_the_engine_in_the_uniform_phase(norm, causal, seed):
    """0.25 beta_c, T 32, 12 layers, 256 draws: rho within 0.0005 at every layer (causal: 0.004, as the engine's
    annealed two-row law runs 0.001-0.0025 above the chain by layer 12 over seeds 0-3), the IPR within 3% (measured:
    0.0001 and 0.5%). A W_V gain or a score scale 10% off in either moves them past that."""
    spec = spec_for(norm, 0.25, 32, causal, 12, 720)
    rho_e, ipr_e, q0, p0 = _engine(spec)
    rho, ipr = chain(spec, q0, p0, 256, np.random.default_rng(seed))
    assert np.abs(rho.mean(axis=0) - rho_e).max() < (0.004 if causal else 0.0005)
    assert np.abs(ipr.mean(axis=0) / ipr_e[1:] - 1.0).max() < 0.03


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_first_layer_rows_are_the_exact_row_law(causal, seed):
    """2.5 beta_c, T 32: the first layer's mean IPR over 4000 draws within 4 standard errors and 2% of the engine's
    exact finite-T rows (measured: 0.2-1.1 standard errors)."""
    spec = spec_for("post", 2.5, 32, causal, 1, 720)
    _, ipr_e, q0, p0 = _engine(spec)
    _, ipr = chain(spec, q0, p0, 4000, np.random.default_rng(seed))
    mean, se = ipr[:, 0].mean(), ipr[:, 0].std(ddof=1) / np.sqrt(ipr.shape[0])
    assert abs(mean - ipr_e[1]) < 4.0 * se
    assert abs(mean / ipr_e[1] - 1.0) < 0.02


@pytest.mark.parametrize("causal", [False, True])
def test_chain_at_finite_width_is_the_network(causal):
    """Post-LN 1.5 beta_c, T 16, d 64, 12 layers: with every part drawn at width 64 the chain's mean rho is the numpy
    network's (512 sequences, each its own weights) within 4.5 standard errors at every layer (measured over four sets
    of seeds: 1.3-3.3), and at infinite width it is not (7.2-9.5 at the last layer): the test sees the width."""
    from initadvisor.simulate import simulate
    from initadvisor.spec import build_spec

    spec = spec_for("post", 1.5, 16, causal, 12, 64)
    built = build_spec(spec)
    ms = [simulate(built, seeds=1, batch=1, rng_seed=s, dtype=np.float64, weight_grads=False) for s in range(512)]
    net = np.stack([np.ravel(m.p) / np.ravel(m.q) for m in ms])
    _, _, q0, p0 = _engine(spec)
    finite, _ = chain(spec, q0, p0, 2048, np.random.default_rng(7), width=64)
    infinite, _ = chain(spec, q0, p0, 2048, np.random.default_rng(7))
    for rho, far in ((finite, False), (infinite, True)):
        z = (rho.mean(axis=0) - net.mean(axis=0)) / np.sqrt(rho.var(axis=0) / len(rho) + net.var(axis=0) / len(net))
        assert (abs(z[-1]) > 4.0) if far else (np.abs(z).max() < 4.5), z


def test_structure_parts_vanish_for_exchangeable_keys():
    """Keys alike (the input's cosines p0 + (1 - p0) I): the output overlap with exchangeable keys is the drawn one and
    the positional and within-position parts are 0 (to rounding), and the rows' IPR sampled at the positional
    covariance is the engine's i.i.d. law within 3% (32 x 64 rows per row length; a pair count or a centering off
    moves the overlap by 1e-3 or more)."""
    from gram_chain import _rows, structure

    T, B, p0, scale = 24, 64, 0.3, 2.5
    rng = np.random.default_rng(0)
    K = np.broadcast_to(p0 + (1.0 - p0) * np.eye(T), (B, T, T)).copy()
    A, _ = _rows(np.broadcast_to(np.linalg.cholesky(K[0]), (B, T, T)), scale, np.tril(np.ones((T, T), bool)), rng, 0)
    drawn, exchangeable, positional, _, iid, sampled, _ = structure(K, A, scale, rng)
    assert abs(drawn - exchangeable) < 1e-12 and abs(positional - exchangeable) < 1e-12
    assert abs(sampled / iid - 1.0) < 0.03


def test_structure_samples_the_positional_covariance():
    """Keys in two clusters of identical keys (by parity; cosine 1 within, 0 between): a row's weight splits between the
    clusters as a logistic of the clusters' score gap, c sqrt(2) z, and evenly within each, so its IPR is
    E[W_1^2 / k_1 + W_2^2 / k_2]; the sampled positional IPR of the last 4 rows is that within 2% (a score scale off
    by 5% moves it 2.5-4%)."""
    from gram_chain import structure
    from initadvisor.core.kernels import gauss_hermite

    T, B, scale = 32, 64, 1.7
    par = np.arange(T) % 2
    K = np.broadcast_to((par[:, None] == par[None, :]).astype(float), (B, T, T)).copy()
    A = np.tril(np.ones((T, T)))
    A = np.broadcast_to(A / A.sum(axis=1, keepdims=True), (B, T, T))  # (any rows: only the drawn parts read them)
    z, w = gauss_hermite(81)
    exact = []
    for m in range(T - 3, T + 1):
        k1, k2 = (m + 1) // 2, m // 2
        W1 = 1.0 / (1.0 + k2 / k1 * np.exp(-scale * np.sqrt(2.0) * z))
        exact.append(w @ (W1 ** 2 / k1 + (1.0 - W1) ** 2 / k2))
    sampled = structure(K, A, scale, np.random.default_rng(1))[5]
    assert abs(sampled / np.mean(exact) - 1.0) < 0.02, (sampled, np.mean(exact))


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("seed", [0, 1])
def test_forced_blocks_are_the_chain_in_the_uniform_phase(norm, seed):
    """Causal 0.25 beta_c, T 64 (position groups past 32), 6 layers, 128 draws: each block of the engine on the chain's mean state is the chain's
    next layer within 3e-4 in rho, in the attention output's mean pair overlap and in its mean q (measured over seeds
    0-3: at most 1.1e-4, within 2 standard errors). The value gain left out of the chain's attention output, or the
    state's group pairs summed instead of averaged, moves them by 0.01 or more."""
    from gram_chain import forced

    spec = spec_for(norm, 0.25, 64, True, 6, 720)
    _, _, q0, p0 = _engine(spec)
    probe, steps = forced(spec)
    chain(spec, q0, p0, 128, np.random.default_rng(seed), probe=probe)
    bias = np.reshape(steps, (-1, 6, 3)).mean(axis=0)
    assert np.abs(bias).max() < 3e-4, bias


def test_probe_sees_the_attention_output_at_finite_width():
    """With the values drawn at width 64, the attention output's Gram the probe sees averages to its infinite-width
    expectation g_V A K A^T over the draws (post-LN 1.5 beta_c, T 16, 3 layers, 512 draws: the mean pair overlap and
    mean q within 4 standard errors at every layer, rng seeds 0-9; the value gain or the width's normalisation left out,
    or the width taken 7% off, fails it)."""
    spec = spec_for("post", 1.5, 16, True, 3, 720)
    _, _, q0, p0 = _engine(spec)
    gv = spec["init"]["v"]["gain"]
    off = ~np.eye(16, dtype=bool)
    seen = {0: [], 1: [], 2: []}  # per layer, each draw's (mean pair overlap, mean q) of O less its expectation
    chain(spec, q0, p0, 512, np.random.default_rng(3), width=64, finite=("values",),
          probe=lambda l, G_in, K, A, O, G_out: seen[l].append(
              np.stack([(O - gv * A @ K @ A.transpose(0, 2, 1))[:, off].mean(axis=1),
                        np.einsum("bii->b", O - gv * A @ K @ A.transpose(0, 2, 1)) / 16], axis=1)))
    for parts in seen.values():
        d = np.concatenate(parts)
        assert d.shape == (512, 2)
        assert np.all(np.abs(d.mean(axis=0)) < 4.0 * d.std(axis=0, ddof=1) / np.sqrt(len(d))), d.mean(axis=0)


@pytest.mark.parametrize("norm,causal,ratio", [("post", True, 1.5), ("post", False, 0.5), ("pre", False, 2.5)])
@pytest.mark.parametrize("d", [32, 128])
def test_pull_is_the_norms_cosine_bias(norm, causal, ratio, d):
    """Each block's pull on rho at width d, measured (`pull`, 2048 draws, T 16, 4 layers), against pull_predicted:
    the norms' delta-method cosine bias from the fresh last weights' covariances at the mean state (pre-LN: each sum's
    ratio of means over T). Summed over the blocks within 3.5 standard errors and, post-LN at d 32, 12% (measured over
    rng seeds 0-1: post-LN 0.91-1.12 of the prediction, |z| <= 1.1; pre-LN, a tenth of the size, 0.67-2.2, |z| <=
    1.7). Post-LN the common part alone is a fifth of it; halving the pair's cross covariance (q p - qs ps) fails both
    post-LN cells at d 32, the norms' variance term at 0.5 c instead of 0.75 c the causal 1.5 beta_c one."""
    from gram_chain import pull

    spec = spec_for(norm, ratio, 16, causal, 4, 720)
    _, _, q0, p0 = _engine(spec)
    probe, pulls = pull(spec, d, 0)
    chain(spec, q0, p0, 2048, np.random.default_rng(0), batch=128, probe=probe)
    total = sum(np.concatenate(pulls[i::4]) for i in range(4))
    measured, predicted = total[:, 0].mean(), total[:, 1].mean()
    assert abs(measured - predicted) < 3.5 * total[:, 0].std(ddof=1) / np.sqrt(len(total)), (measured, predicted)
    if norm == "post" and d == 32:
        assert measured / predicted == pytest.approx(1.0, abs=0.12)


def test_pull_is_the_widths_second_order():
    """Each block's own pull on rho at width d (values and MLP drawn at d, common scores, antithetic weights) is the
    width's second-order effect: post-LN causal 1.5 beta_c, T 16, 4 layers, 1024 draws, its sum over the blocks is
    negative by more than 5 standard errors at d 32 and 4x its value at d 128 within [3, 5.3] (measured over rng seeds
    0-3: -0.0064 to -0.0086 at d 32, ratio 3.7-4.3), and the common scores and antithetic weights hold its spread over
    draws at d 128 below 0.014 (measured 0.0105-0.011; scores not shared: 0.018, weights not antithetic: 0.026-0.028).
    The finite parts left out fail it too."""
    from gram_chain import pull

    spec = spec_for("post", 1.5, 16, True, 4, 720)
    _, _, q0, p0 = _engine(spec)
    sums = {}
    for d in (32, 128):
        probe, pulls = pull(spec, d, 0)
        chain(spec, q0, p0, 1024, np.random.default_rng(0), batch=128, probe=probe)
        total = sum(np.concatenate(pulls[i::4]) for i in range(4))[:, 0]
        sums[d] = total.mean()
        if d == 32:
            assert total.mean() < -5.0 * total.std(ddof=1) / np.sqrt(len(total)), total.mean()
        else:
            assert total.std(ddof=1) < 0.014, total.std(ddof=1)
    assert 3.0 < sums[32] / sums[128] < 5.3, sums


def test_split_puts_the_carried_pull_in_the_rows_keys():
    """`split` at d 64 (post-LN bidirectional 1.5 beta_c, T 16, 10 layers, 256 draws): the sums' own fluctuations (less
    their common part) lower rho at layer 10 by more than 5 standard errors; with the rows reading the noiseless run's
    state, by at most 0.6 of that, and with only the keys' Gram realized, by at least 0.75 of it (measured over rng
    seeds 0-1: 0.46 / 0.25 and 1.05 / 0.87; at T 64, layer 24: 0.09-0.10 and 0.66-0.70). Without the common part
    (the walk, which carries most of a draw's own move) the draws spread less: own's standard deviation at most half
    the whole fluctuation's (measured 0.29-0.30). Rows read from the run's own state in the blind mode, the keys' and
    queries' factors swapped, or the common part kept in "own", fail it."""
    from gram_chain import split

    spec = spec_for("post", 1.5, 16, False, 10, 720)
    _, _, q0, p0 = _engine(spec)
    moves = split(spec, q0, p0, 64, 256, 0, 64)
    whole, own, blind, keys = (moves[m][:, 10] for m in ("whole", "own", "own, rows blind", "own, keys only"))
    assert own.std() < 0.5 * whole.std(), (own.std(), whole.std())
    assert own.mean() < -5.0 * own.std(ddof=1) / np.sqrt(len(own)), own.mean()
    assert blind.mean() > 0.6 * own.mean(), (blind.mean(), own.mean())
    assert keys.mean() < 0.75 * own.mean(), (keys.mean(), own.mean())


def _softmax(z):
    """Softmax rows over the last axis."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _moved(z, s, t, a, b):
    """The scores z with key s's moved by a and key t's by b, in every row."""
    w = z.copy()
    w[:, s] += a
    w[:, t] += b
    return w


def test_price_factor_is_the_rows_mixed_second_derivatives():
    """price_factor (split's X) against central finite differences of each pair's A_s A_s' in the scores (step 1e-4,
    rows of 5 keys at score std 2): within 1e-6 (measured 5e-9); 4 for 5 on Y2 is off by at least 0.2, Y4 dropped
    by at least 0.048 (6 / 5^3)."""
    from gram_chain import price_factor

    rng, h = np.random.default_rng(0), 1e-4
    z = 2.0 * rng.standard_normal((4, 5))
    direct = np.zeros(4)
    for s, t in itertools.permutations(range(5), 2):
        def g(a, b):
            x = _softmax(_moved(z, s, t, a * h, b * h))
            return x[:, s] * x[:, t]
        direct += (g(1, 1) - g(1, -1) - g(-1, 1) + g(-1, -1)) / (4.0 * h * h)
    assert np.allclose(price_factor(_softmax(z)), direct, atol=1e-6), (price_factor(_softmax(z)), direct)


def test_price_ipr_is_the_rows_mixed_fourth_derivatives():
    """price_ipr against central finite differences of each row's IPR, d^2/dz_s^2 d^2/dz_s'^2 summed over keys s != s'
    (step 1e-2, rows of 5 keys at score std 2): within 1e-3 (measured 4e-5, the stencil's h^2); a coefficient 10 off
    on Y2^3 moves it by at least 0.08 (10 / 5^2 x 0.2, Y2 >= 1 / 5)."""
    from gram_chain import price_ipr

    rng, h = np.random.default_rng(1), 1e-2
    z = 2.0 * rng.standard_normal((4, 5))
    direct = np.zeros(4)
    for s, t in itertools.permutations(range(5), 2):
        def g(a, b):
            return (_softmax(_moved(z, s, t, a * h, b * h)) ** 2).sum(axis=-1)
        second = [g(1, b) - 2.0 * g(0, b) + g(-1, b) for b in (1, 0, -1)]
        direct += (second[0] - 2.0 * second[1] + second[2]) / h**4
    assert np.allclose(price_ipr(_softmax(z)), direct, atol=1e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_rows_response_to_independent_pairs_is_their_law(seed):
    """rows_response averaged over independent pair dispersions (sd 0.02 about cosines 0.3, T 16, score scale 3, all
    keys read, 64 dispersions, 8192 normals each, common to its three runs) against the law `response` prints beside
    it: the own output's move c D E[X] + (1 - rho) c^2 D E[Q] / 4 and the IPR's c^2 D E[Q] / 4 (c = scale^2, E over
    rows of the mean cosines; Price's theorem) within 12% (measured within 2-7% over seeds 0-3; without its IPR term
    the own output's law is 2.2x the response)."""
    from gram_chain import price_factor, price_ipr, rows_response

    T, rho, scale, sd = 16, 0.3, 3.0, 0.02
    rng = np.random.default_rng(seed)
    K = (1.0 - rho) * np.eye(T) + rho
    c = {"scale": scale, "mask": np.ones((T, T), bool)}
    got = np.zeros(2)
    for _ in range(64):
        dK = np.triu(sd * rng.standard_normal((T, T)), 1)
        got += rows_response(K, dK + dK.T, c, rng.standard_normal((8192, T)), np.array([T - 1])) / 64
    n = rng.standard_normal((65536, T))
    a = _softmax(n @ np.linalg.cholesky(scale**2 * K).T)
    c2, D = scale**2, sd**2
    ipr = c2 * c2 * D * price_ipr(a).mean() / 4.0
    law = np.array([c2 * D * price_factor(a).mean() + (1.0 - rho) * ipr, ipr])
    assert np.all(np.abs(got / law - 1.0) < 0.12), (got, law)


@pytest.mark.parametrize("rho", [0.3, 0.8])
def test_realized_at_fresh_width_disperses_by_D(rho):
    """realized at fresh_width(rho, D): lengths kept, the pairs' mean overlap K's (the common part off), and the
    variance over pairs D within 10% over 20 draws (T 64, D 3e-4 and 1e-4: widths 4T and more, where no eigenvalue is
    held; measured within 7% at rho 0.3-0.95, widths 200-7400; at widths near T the held eigenvalues add 10%, below T
    more). Without the disjoint pairs' covariance in fresh_width the variance is 0.64 D at rho 0.8, 0.90 D at 0.3 and
    0.77 D at 0.5: the 0.3 case alone would not see it."""
    from gram_chain import fresh_width, realized

    T = 64
    pairs = np.triu_indices(T, 1)
    q = np.linspace(0.5, 2.0, T)
    K = (1.0 - rho) * np.eye(T) + rho
    G = K * np.sqrt(np.outer(q, q))
    for D in (3e-4, 1e-4):
        w = fresh_width(rho, D)
        got = []
        for s in range(20):
            hat = realized(G, w, np.random.default_rng(s))
            assert np.allclose(np.diag(hat), q)
            cos = hat / np.sqrt(np.outer(q, q))
            assert cos[pairs].mean() == pytest.approx(rho, abs=1e-9)
            got.append((cos - K)[pairs].var())
        assert np.mean(got) == pytest.approx(D, rel=0.10)


def test_blind_rows_read_the_draws_mean_state():
    """`blind`: the rows of the blind chain read the draws' mean state. From the common input its first block is the
    chain's (the mean of equal states is each); from the second on the draws' own departures move the chain's rows
    and not the blind one's; with one draw the mean is the draw, so the two chains are one, and a draw has no
    dispersion about itself. Rows read at another axis's mean, or the chain's own state, fail one of these."""
    spec = spec_for("post", 2.5, 8, True, 4, 720)
    _, _, q0, p0 = _engine(spec)
    got = blind(spec, q0, p0, 3)
    assert np.array_equal(got["plain"][:, :2], got["blind"][:, :2])
    assert np.abs(got["plain"][:, 2:] - got["blind"][:, 2:]).min() > 1e-6
    assert got["D"][0] == 0.0 and (got["D"][1:] > 1e-6).all()
    one = blind(spec, q0, p0, 1)
    np.testing.assert_allclose(one["plain"], one["blind"], rtol=0, atol=1e-12)
    assert np.abs(one["D"]).max() < 1e-20
