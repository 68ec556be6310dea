"""Paper 001's encoder at infinite width and finite T: which part of a phase-grid miss is the width, which the draw.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/gram_chain.py post:1.5:512:causal [--draws 32] [--seed 0]
       [--report DIR/post-1.5-512-causal.json] [--width 720 [--finite embeddings,scores,values,mlp]]
       [--structure] [--forced] [--pull 720] [--split 720] [--blind] [--batch 16]

At infinite width the stream of phase_fidelity.py's encoder is its T x T Gram matrix G (x_s . x_s' / d), and a block
maps it exactly, given one random matrix per layer: the scores S = beta sqrt(ln T) L Z L^T (L L^T the attention
input's cosine matrix, Z i.i.d. N(0, 1), T x T: W_Q and W_K act on the tokens through their Gram alone), the
attention output's Gram g_v A G A^T, the residual sum G + that (fresh W_V: no cross term), the ReLU MLP through the
arc-cosine kernel, LayerNorm to cosines. So the chain differs from the engine only in that its rows see one draw's
keys (the engine takes a row's scores as i.i.d. at the mean overlaps), and from the numpy network only in width.
Per layer it prints the engine's rho and IPR, the chain's mean over `--draws` draws with its standard error, and,
given a `verify` report of the same cell (phase_fidelity.py --reports), the network's; then the largest gap of each
pair over the layers. Token repeats (vocab 50000) are left out. Asserts nothing.

`--structure` prints per layer what the keys' structure does to the attention (`structure`, at infinite width),
`--forced` each block of the engine teacher-forced on the chain's mean state (`forced`, causal cells; with `--width`,
against the chain's next layer at that width), `--pull D` each block's own pull on rho at width D (`pull`, from the
infinite-width chain's states) beside its prediction from the norms' cosine bias (`pull_predicted`), `--split D`
where the width's pull on rho comes from, in chains run in lockstep with the infinite-width one (`split`), `--blind`
the chain beside one whose rows read the draws' mean state, as the engine's do (`blind`), and the engine's two row
laws against that.

`--width d` draws the `--finite` parts at width d instead (d >= T), which locates the width's effect: fresh Gaussian
weights are blind to the frame, so with the stream taken as sqrt(d) [L | 0] (its Gram L L^T, in its first T
coordinates) a branch's output is drawn as T x d (values: A L M, M i.i.d.; the MLP: its d_ff units and W_2 drawn, its
biases too) and added with its cross terms; the scores as L Zq Zk^T L^T / sqrt(d); the embeddings as Gaussian rows.
With every part finite this is the network in distribution (its LayerNorms' centering aside); the printed gaps are
then the engine's and the network's against it.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from phase_fidelity import spec_for  # noqa: E402


def _cosines(G: np.ndarray) -> np.ndarray:
    d = np.sqrt(np.einsum("bii->bi", G))
    return G / d[:, :, None] / d[:, None, :]


def _relu_kernel(G: np.ndarray) -> np.ndarray:
    """E relu(u) relu(v) for Gaussian (u, v) of covariance G: the engine's arc-cosine kernel, pair by pair."""
    from initadvisor.core.causal import _relu_pair

    d = np.einsum("bii->bi", G)
    return _relu_pair(d[:, :, None], d[:, None, :], G)


PARTS = ("embeddings", "scores", "values", "mlp")  # what `width` can draw at finite width


def _factor(G: np.ndarray) -> np.ndarray:
    """L with L L^T = G (batched; G positive semi-definite)."""
    w, v = np.linalg.eigh(G)
    return v * np.sqrt(np.maximum(w, 0.0))[:, None, :]


def _rows(Lc: np.ndarray, scale: float, mask: np.ndarray, rng, d: int, Lk: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray]:
    """One draw of the attention rows on the cosines Lc Lc^T and each draw's mean IPR: the scores c Lc Z Lc^T, Z i.i.d.
    N(0, 1) at infinite width, Zq Zk^T / sqrt(d) (Zq, Zk: T x d, i.i.d. N(0, 1): the queries and keys) at width d;
    Lk, if given, is the keys' factor in place of Lc's."""
    B, T = Lc.shape[:2]
    if d:
        Z = rng.standard_normal((B, T, d)) @ rng.standard_normal((B, T, d)).transpose(0, 2, 1) / math.sqrt(d)
    else:
        Z = rng.standard_normal((B, T, T))
    S = np.where(mask, scale * (Lc @ Z @ (Lc if Lk is None else Lk).transpose(0, 2, 1)), -np.inf)
    A = np.exp(S - S.max(axis=-1, keepdims=True))
    A /= A.sum(axis=-1, keepdims=True)
    return A, (A * A).sum(axis=-1).mean(axis=-1)


def _plus(G: np.ndarray, Lx: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """The Gram of the stream plus a fresh branch output Y (B, T, d), in the frame where the stream is
    sqrt(d) [Lx | 0] (its first T coordinates; fresh Gaussian weights are blind to the frame): cross terms included."""
    T, d = Y.shape[1], Y.shape[2]
    cross = Lx @ Y[:, :, :T].transpose(0, 2, 1) / math.sqrt(d)
    return G + cross + cross.transpose(0, 2, 1) + Y @ Y.transpose(0, 2, 1) / d


def structure(K: np.ndarray, A: np.ndarray, scale: float, rng, rows: int = 4) -> np.ndarray:
    """What the keys' structure does to one infinite-width attention over a batch of B draws (K: the keys' cosines, A:
    the drawn rows), for the late half of the positions. The late pairs' output overlap (A K A^T off the diagonal): as
    drawn; with each pair's other key pairs at their mean overlap (the exchangeable keys the engine's laws assume, the
    shared keys as drawn); and with K at its mean over the batch position by position (the positional structure; the
    rest is within a position, 1/B of which the batch's mean keeps). The last `rows` rows' IPR: as drawn; at i.i.d.
    scores of each row's own spread (the engine's law); sampled at the positional covariance. And the share of the
    keys' centered variance in the positional structure's top direction."""
    from initadvisor.core.softmax_rows import expected_y

    B, T = K.shape[:2]
    off = ~np.eye(T, dtype=bool)
    late = np.zeros((T, T), bool)
    late[T // 2:, T // 2:] = True
    late &= off
    Km = K.mean(axis=0)
    shared = A @ A.transpose(0, 2, 1)
    cs = np.cumsum(np.cumsum(K * off, axis=1), axis=2)  # the mean overlap of a pair's key pairs (s <= m, s' <= n)
    lo, hi = np.minimum.outer(np.arange(T), np.arange(T)), np.maximum.outer(np.arange(T), np.arange(T))
    mean_k = cs[:, lo, hi] / np.maximum((lo + 1.0) * (hi + 1.0) - (lo + 1.0), 1.0)
    out = [(A @ K @ A.transpose(0, 2, 1))[:, late].mean(), (shared + (1.0 - shared) * mean_k)[:, late].mean(),
           (A @ np.where(off, Km, K) @ A.transpose(0, 2, 1))[:, late].mean()]
    drawn, iid, positional = [], [], []
    for t in range(T - rows, T):
        m = t + 1
        J = np.eye(m) - 1.0 / m
        spread = np.einsum("bii->b", J @ K[:, :m, :m] @ J) / (m - 1.0)  # mean diagonal - mean off-diagonal
        iid.append(np.mean(expected_y(np.minimum(scale * np.sqrt(spread), 30.0), np.full(B, float(m)))[0]))
        w, v = np.linalg.eigh(J @ Km[:m, :m] @ J)
        S = scale * rng.standard_normal((32 * B, m)) @ (v * np.sqrt(np.maximum(w, 0.0))).T
        P = np.exp(S - S.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        positional.append((P * P).sum(axis=1).mean())
        drawn.append((A[:, t, :m] ** 2).sum(axis=1).mean())
    J = np.eye(T) - 1.0 / T
    w = np.linalg.eigvalsh(J @ Km @ J)
    return np.array(out + [np.mean(drawn), np.mean(iid), np.mean(positional), w[-1] / w.sum()])


def forced(spec: dict):
    """A probe for `chain` (causal cells) and its results: per batch and layer, the engine's block and its attention
    applied to the batch's mean state (position groups as the engine's, from the chain's mean Gram) against the chain's
    next layer: the block's rho, the attention output's mean pair overlap and mean q (the engine less the chain).
    Teacher forcing isolates each block's bias, which free-running stacks amplify; with the chain's parts at finite
    width, the width's part of it."""
    from initadvisor.core import causal as cz
    from initadvisor.core.ops import Attention, Residual, causal_forward
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    from attention_forced import group_state

    net = from_spec(build_spec(spec))
    T = spec["sequence"]["length"]
    grid = cz._grid(T, cz._SINGLE, cz._RATIO)
    off = ~np.eye(T, dtype=bool)
    pairs = np.where(np.eye(len(grid.n), dtype=bool), grid.pairs, np.multiply.outer(grid.n, grid.n))
    out = []

    def probe(layer, G_in, K, A, Oc, G_out):
        ops = net.blocks[layer]
        S = group_state(grid, G_in.mean(axis=0))  # the engine's state of the batch's mean Gram
        branch = next(b for op in ops if isinstance(op, Residual) for _, b in op.branches
                      if any(isinstance(x, Attention) for x in b))
        Sa = S
        for op in branch[:next(i for i, x in enumerate(branch) if isinstance(x, Attention))]:
            Sa = op.causal(grid, Sa)[0]
        O = next(x for x in branch if isinstance(x, Attention)).causal(grid, Sa)[0]
        rho = cz._summary(grid, cz._clamp(grid, causal_forward(ops, grid, S)[0]))[0]
        chain_rho = _rho(G_out).mean()
        out.append((rho - chain_rho, (O.P * pairs).sum() / pairs.sum() - Oc[:, off].mean(),
                    O.qf.mean() - np.einsum("bii->b", Oc).mean() / T))

    return probe, out


def _constants(spec: dict) -> dict:
    """What a block of the chain reads of the encoder `spec`."""
    m, init = spec["model"], spec["init"]
    T = spec["sequence"]["length"]
    return {"T": T, "pre": m["norm"] == "pre", "f": m["d_ff"], "gv": init["v"]["gain"], "g1": init["ff_in"]["gain"],
            "g2": init["ff_out"]["gain"], "b1": init["ff_in"]["bias_std"] ** 2, "b2": init["ff_out"]["bias_std"] ** 2,
            "scale": init["qk_beta"] * math.sqrt(math.log(T)),
            "mask": np.tril(np.ones((T, T), bool)) if m["causal"] else np.ones((T, T), bool)}


def _block(G: np.ndarray, c: dict, scores, weights, d: dict, sign: float = 1.0, own: bool = False,
           shadow: np.ndarray | None = None, keys: bool = False) -> tuple:
    """One block of the chain on a batch's Gram G: (the Gram leaving it, the attention's input cosines K, rows A and
    output's Gram O, the rows' IPR). d: the width of each part (0: infinite); scores and weights: the generators of
    the score matrices and of the finite parts' weights; sign flips those weights (an antithetic pair of draws).
    own: each finite sum keeps its fluctuation less its common part (the mean off-diagonal move, on every entry).
    shadow: the rows read this Gram instead of G (a noiseless run's), or with `keys` its queries only (the keys' Gram
    G's, its factor rotated onto the shadow's: S = c L_q Z L_k^T)."""
    B, T, width = G.shape[0], c["T"], max(d.values())
    off = ~np.eye(T, dtype=bool)
    for branch in ("values", "mlp"):
        Lx = _factor(G)
        Lc = Lx / np.sqrt(np.einsum("bii->bi", G))[:, :, None]  # the branch reads the normed stream
        C = Lc @ Lc.transpose(0, 2, 1)
        if branch == "values":
            K = C
            if shadow is None:
                A, y2 = _rows(Lc, c["scale"], c["mask"], scores, d["scores"])
            else:
                Ls = _factor(shadow)
                Ls = Ls / np.sqrt(np.einsum("bii->bi", shadow))[:, :, None]
                if keys:
                    U, _, Vt = np.linalg.svd(Lc.transpose(0, 2, 1) @ Ls)
                    A, y2 = _rows(Ls, c["scale"], c["mask"], scores, d["scores"], Lc @ (U @ Vt))
                else:
                    A, y2 = _rows(Ls, c["scale"], c["mask"], scores, d["scores"])
            O = c["gv"] * (A @ K @ A.transpose(0, 2, 1)) if own or not d["values"] else None
            plain = None if O is None else G + O
            if d["values"]:
                Y = sign * math.sqrt(c["gv"]) * (A @ Lc @ weights.standard_normal((B, T, width)))
                O = Y @ Y.transpose(0, 2, 1) / width
                G = _plus(G, Lx, Y)
            else:
                G = plain
        else:
            plain = G + c["g2"] * _relu_kernel(c["g1"] * C + c["b1"]) + c["b2"] if own or not d["mlp"] else None
            if d["mlp"]:
                f = c["f"]
                H = math.sqrt(c["g1"]) * (Lc @ weights.standard_normal((B, T, f)))
                H += math.sqrt(c["b1"]) * weights.standard_normal((B, 1, f))
                Y = np.maximum(H, 0.0) @ weights.standard_normal((B, f, width)) * math.sqrt(c["g2"] / f)
                G = _plus(G, Lx, sign * (Y + math.sqrt(c["b2"]) * weights.standard_normal((B, 1, width))))
            else:
                G = plain
        if own:
            G = G - (G - plain)[:, off].mean(axis=1)[:, None, None]
        if not c["pre"]:
            G = _cosines(G)
    return G, K, A, O, y2


def _rho(G: np.ndarray) -> np.ndarray:
    """Each draw's rho: its mean off-diagonal overlap over its mean q."""
    T = G.shape[1]
    return (np.einsum("bij->b", G) - np.einsum("bii->b", G)) / (T - 1.0) / np.einsum("bii->b", G)


def pull_predicted(G: np.ndarray, A: np.ndarray, c: dict, width: int) -> np.ndarray:
    """Each draw's block pull on rho at width `width` (as `pull` measures it) from its norms' cosine bias
    (core/walk.py's cosine_bias) at the mean state, carried through the rest of the block by its slope, and its
    common part: (B, 2). Post-LN: both norms', the first through the MLP's kernel slope and the second norm.
    Pre-LN: the bias of each sum's ratio of means over the T tokens (the MLP's input norm, through the kernel's slope
    of about g2 g1 / 4, is left out). The MLP's curvature and its d_ff units' own noise are left out too (at d 64
    under 2% of the pull)."""
    from initadvisor.core.kernels import relu_backward, relu_forward
    from initadvisor.core.walk import cosine_bias

    T = G.shape[1]

    def mean_pair(X):
        q = np.einsum("bii->b", X) / T
        return q, (X.sum(axis=(1, 2)) - T * q) / (T * (T - 1.0))

    K = _cosines(G)
    qs, ps = mean_pair(G)
    q, p = mean_pair(G + c["gv"] * (A @ K @ A.transpose(0, 2, 1)))
    b = np.stack(cosine_bias(qs, ps, q, p), axis=1) / width
    cos = p / q
    s2 = c["g1"] + c["b1"]  # the MLP's pre-activations' (q, p) on unit-norm tokens
    kernel = relu_forward(s2, c["g1"] * cos + c["b1"])[1]
    slope = c["g2"] * c["g1"] * relu_backward(s2, c["g1"] * cos + c["b1"])[1]  # the kernel's slope in the cosine
    if c["pre"]:  # no norm on the stream: a draw's rho is its ratio of means
        attn = cosine_bias(qs, ps, q, p, T)
        mlp = cosine_bias(q, p, q + c["g2"] * s2 / 2.0 + c["b2"], p + c["g2"] * kernel + c["b2"], T)
        return (np.stack(attn, axis=1) + np.stack(mlp, axis=1)) / width
    q2 = 1.0 + c["g2"] * s2 / 2.0 + c["b2"]
    b2 = np.stack(cosine_bias(1.0, cos, q2, cos + c["g2"] * kernel + c["b2"]), axis=1) / width
    return ((1.0 + slope) / q2)[:, None] * b + b2


def pull(spec: dict, width: int, seed: int = 0):
    """A probe for `chain` (at infinite width) and its results: per batch and layer, each draw's rho change when the
    block's values and MLP are drawn at `width` instead of infinite width, from the chain's own state entering it,
    with common score matrices and an antithetic pair of weight draws (whose first-order terms cancel, leaving the
    width's mean pull on rho, which the stack then amplifies), beside its prediction and that prediction's common
    part (pull_predicted): (B, 3) each."""
    c, out = _constants(spec), []
    finite = {"embeddings": 0, "scores": 0, "values": width, "mlp": width}
    none = dict.fromkeys(PARTS, 0)

    def probe(layer, G_in, *_):
        key = [seed, layer, len(out)]
        runs = [_rho(_block(G_in, c, np.random.default_rng(key), np.random.default_rng(key + [1]), finite, sign)[0])
                for sign in (1.0, -1.0)]
        G, _, A, _, _ = _block(G_in, c, np.random.default_rng(key), None, none)
        out.append(np.column_stack([0.5 * (runs[0] + runs[1]) - _rho(G), pull_predicted(G_in, A, c, width)]))

    return probe, out


SPLIT = ("whole", "own", "own, rows blind", "own, keys only")


def price_factor(A: np.ndarray) -> np.ndarray:
    """Per row of A (softmax rows over the last axis): sum over keys s != s' of d^2 (A_s A_s') / dz_s dz_s' in the
    scores z, 1 - 5 Y2 + 4 Y3 + 6 Y2^2 - 6 Y4 (Y_k = sum_s A_s^k): by Price's theorem a row's own output moves by c^2 D
    times its mean where the keys' overlaps disperse by D."""
    Y2, Y3, Y4 = ((A**k).sum(axis=-1) for k in (2, 3, 4))
    return 1.0 - 5.0 * Y2 + 4.0 * Y3 + 6.0 * Y2 * Y2 - 6.0 * Y4


def price_ipr(A: np.ndarray) -> np.ndarray:
    """Per row of A: sum over keys s != s' of d^4 Y2 / dz_s^2 dz_s'^2, -10 Y2 + 64 Y3 - 96 Y4 + 192 Y5 - 6 Y2^2 - 144
    Y2 Y3 - 120 Y2 Y4 + 120 Y2^3 (a least-squares fit over the products of power sums of degree <= 6, exact to 1e-13):
    by Price's theorem at second order a row's IPR moves by scale^4 D Q / 4 where the keys' overlaps disperse by D pair
    by pair, independently."""
    Y2, Y3, Y4, Y5 = ((A**k).sum(axis=-1) for k in (2, 3, 4, 5))
    return -10.0 * Y2 + 64.0 * Y3 - 96.0 * Y4 + 192.0 * Y5 - 6.0 * Y2 * Y2 - 144.0 * Y2 * Y3 - 120.0 * Y2 * Y4 \
        + 120.0 * Y2**3


def _prefix_rows(z: np.ndarray, t: int, c: dict) -> np.ndarray:
    """Softmax rows of the scores z (N, T) for row t: its keys 0..t (causal) or all of them."""
    k = t + 1 if c["mask"][0, -1] == 0 else z.shape[1]
    a = np.exp(z[:, :k] - z[:, :k].max(axis=1, keepdims=True))
    return a / a.sum(axis=1, keepdims=True)


def realized(G: np.ndarray, width: int, rng) -> np.ndarray:
    """The Gram G (T x T) realized at `width`: the cosines of T Gaussian tokens of G's cosines in `width` coordinates,
    less their pairs' mean move (the common part, which the walk carries), eigenvalues held at 1e-6 where that leaves
    them indefinite (width near or below T; cosines again after), at G's own lengths."""
    T = G.shape[0]
    q = np.sqrt(np.diag(G))
    K = G / np.outer(q, q)
    X = np.linalg.cholesky(K + 1e-10 * np.eye(T)) @ rng.standard_normal((T, width))
    W = _cosines((X @ X.T / width)[None])[0]
    off = ~np.eye(T, dtype=bool)
    W[off] -= (W - K)[off].mean()
    ev, vec = np.linalg.eigh(W)
    if ev[0] < 1e-6:  # (then cosines again)
        W = _cosines(((vec * np.maximum(ev, 1e-6)) @ vec.T)[None])[0]
    return W * np.outer(q, q)


def fresh_width(rho: float, D: float) -> int:
    """The width at which `realized` tokens at cosine rho disperse by D over pairs: a cosine of fresh tokens varies by
    (1 - rho^2)^2 / width, and two disjoint pairs' covary by 2 rho^2 (1 - rho)^2 / width (the common part, which
    `realized` takes off)."""
    return max(int(round(((1.0 - rho * rho) ** 2 - 2.0 * rho * rho * (1.0 - rho) ** 2) / D)), 2)


def row_means(M: np.ndarray, c: dict, n: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The mean over `rows` and over the scores' normals n (N, T) of a row's own output a^T M a and its IPR, on keys'
    cosines M (scores z = chol(scale^2 M) n, row t reading its keys' prefix: _prefix_rows)."""
    z = n @ np.linalg.cholesky(c["scale"] ** 2 * M).T
    out = np.zeros(2)
    for t in rows:
        a = _prefix_rows(z, t, c)
        k = a.shape[1]
        out += [((a @ M[:k, :k]) * a).sum(axis=1).mean(), (a * a).sum(axis=1).mean()]
    return out / len(rows)


def rows_response(K: np.ndarray, dK: np.ndarray, c: dict, n: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The second-order response of attention rows to a dispersion dK of their keys' cosines K (one draw, T x T):
    ((f(K + e dK) + f(K - e dK)) / 2 - f(K)) / e^2 for f row_means' (a row's own output a^T K a, the values reading the
    same cosines, and its IPR), the scores' normals n common to the three; e the largest of 1, 1/2, .., 1/16 that
    keeps K -+ e dK positive definite (nan where none does: a dispersion spectrally as large as K's smallest
    eigenvalues, as the carried one at T / width 0.7). The first order drops out: what is left is what a mean-zero
    dispersion does to the rows' means."""
    for e in (1.0, 0.5, 0.25, 0.125, 0.0625):
        if min(np.linalg.eigvalsh(K + x * dK)[0] for x in (e, -e)) > 1e-8:
            f = [row_means(K + x * dK, c, n, rows) for x in (e, -e, 0.0)]
            return ((f[0] + f[1]) / 2.0 - f[2]) / e**2
    return np.full(2, np.nan)


def response(spec: dict, q0: float, p0: float, width: int, draws: int, seed: int = 0, batch: int = 16,
             every: int = 4, normals: int = 1024, moves: int = 8) -> dict:
    """What each block's attention rows do with the pairs' own dispersion that the skip carries at `width` (the
    "own" chain of `split`, beside the infinite-width one: delta = its cosines less the infinite chain's, D their
    variance over pairs): per draw at every `every`-th block, the rows' second-order response (rows_response, the
    last half's rows, at most 32) to delta as carried ("carried"), to a normalized Wishart fluctuation of the same
    variance over pairs less its common part ("wishart": fresh Gaussian tokens at the width, the shape the sums add),
    and the independent pairs' law from the rows' power sums ("iid": c D X + (1 - rho) c^2 D Q / 4 on the own output,
    c^2 D Q / 4 on the IPR, c = scale^2; price_factor, price_ipr). Returns {block (from 1): (draws, 10)}: D, then
    the own output's and the IPR's response as carried, as wishart and by iid (nan where rows_response finds no
    second order); and what the attention output carries of delta at first order: with the rows held, g_V A delta A^T,
    its slope on delta over pairs, and the rows' own move, g_V (A' K A'^T - A K A^T) with A' the rows on the carried
    cosines (common score draws), its variance over pairs over D; and the whole block's move of rho when its input is
    realized at the width at which fresh tokens disperse by D (`realized` at `fresh_width`; the mean over `moves`
    realizations, common score draws): the carried dispersion taken as Wishart-shaped, whole."""
    T, L = spec["sequence"]["length"], spec["model"]["layers"]
    c = _constants(spec)
    d = {"embeddings": 0, "scores": 0, "values": width, "mlp": width}
    none = dict.fromkeys(PARTS, 0)
    pairs = np.triu_indices(T, 1)
    rows = np.unique(np.linspace(T // 2, T - 1, min(32, T - T // 2)).astype(int))
    rng = np.random.default_rng([seed, 7])
    out = {}
    for start in range(0, draws, batch):
        B = min(batch, draws - start)
        own = plain = np.broadcast_to(p0 + (q0 - p0) * np.eye(T), (B, T, T)).copy()
        for layer in range(L):
            if layer % every == every - 1:
                Kp, Ko = _cosines(plain), _cosines(own)
                A, Ao = (_rows(_factor(K), c["scale"], c["mask"], np.random.default_rng([seed, start, layer, 9]), 0)[0]
                         for K in (Kp, Ko))
                first = c["gv"] * (Ao @ Kp @ Ao.transpose(0, 2, 1) - A @ Kp @ A.transpose(0, 2, 1))
                held = c["gv"] * (A @ (Ko - Kp) @ A.transpose(0, 2, 1))
                for b in range(B):
                    delta = Ko[b] - Kp[b]
                    D = delta[pairs].var()
                    W = realized(Kp[b], width, rng) - Kp[b]
                    W *= math.sqrt(D / W[pairs].var())
                    n = rng.standard_normal((normals, T))
                    z = n @ np.linalg.cholesky(c["scale"] ** 2 * Kp[b] + 1e-10 * np.eye(T)).T
                    x = q = 0.0
                    for t in rows:
                        a = _prefix_rows(z, t, c)
                        x, q = x + price_factor(a).mean() / len(rows), q + price_ipr(a).mean() / len(rows)
                    c2, r = c["scale"] ** 2, Kp[b][pairs].mean()
                    iid = [c2 * D * x + (1.0 - r) * c2 * c2 * D * q / 4.0, c2 * c2 * D * q / 4.0]
                    x, y = (v[pairs] - v[pairs].mean() for v in (delta, held[b]))
                    whole = []
                    for k in range(moves if D > 0.0 else 0):  # (no dispersion: no width)
                        gen = [seed, start, layer, b, k]
                        hat = realized(plain[b], fresh_width(r, D), np.random.default_rng(gen + [1]))
                        whole.append(_rho(_block(hat[None], c, np.random.default_rng(gen), None, none)[0])[0]
                                     - _rho(_block(plain[b][None], c, np.random.default_rng(gen), None, none)[0])[0])
                    out.setdefault(layer + 1, []).append(np.concatenate(
                        [[D], rows_response(Kp[b], delta, c, n, rows), rows_response(Kp[b], W, c, n, rows), iid,
                         [(x @ y) / (x @ x), first[b][pairs].var() / D, np.mean(whole) if whole else np.nan]]))
            key = [seed, start, layer]
            own = _block(own, c, np.random.default_rng(key), np.random.default_rng(key + [1]), d, own=True)[0]
            plain = _block(plain, c, np.random.default_rng(key), None, none)[0]
    return {k: np.array(v) for k, v in out.items()}


def wishart_rows(spec: dict, rho: float, width: int, draws: int, seed: int = 0, normals: int = 512) -> np.ndarray:
    """The mean move of the late rows' own output and IPR (row_means', the last half's rows, at most 32) when
    their keys' cosines K (exchangeable at `rho`) are realized at `width` (`realized`), f(K^) - f(K) with common score
    normals, whole rather than to second order (at T / width near 1 and above, K^'s spectrum is as spread as K's).
    Returns (draws, 3): the variance over pairs of K^ - K, and the two moves."""
    T, c = spec["sequence"]["length"], _constants(spec)
    K = (1.0 - rho) * np.eye(T) + rho
    rows = np.unique(np.linspace(T // 2, T - 1, min(32, T - T // 2)).astype(int))
    pairs = np.triu_indices(T, 1)
    rng = np.random.default_rng([seed, 11])

    got = []
    for _ in range(draws):
        W = realized(K, width, rng)
        n = rng.standard_normal((normals, T))
        got.append(np.concatenate([[(W - K)[pairs].var()], row_means(W, c, n, rows) - row_means(K, c, n, rows)]))
    return np.array(got)


def split(spec: dict, q0: float, p0: float, width: int, draws: int, seed: int = 0, batch: int = 16) -> dict:
    """Where the width's pull on rho comes from, as chains run in lockstep with the infinite-width one (common score
    draws, common weights): the values and MLP at `width` ("whole"); each sum's fluctuation less its common part
    ("own"); that, with the rows reading the noiseless run's state ("own, rows blind"); and with only the keys' Gram
    realized in the scores, the queries' the noiseless run's ("own, keys only"). Returns each mode's rho less the
    infinite chain's, (draws, L + 1), from the stream-0 moments (q0, p0); and (draws, L) per block: "D", the variance
    over pairs of the "own" chain's overlaps less the infinite chain's (the pairs' own dispersion that the skip
    carries), and "X", the infinite chain's rows' mean price_factor (docs/phase-grid.md, "What the walk leaves
    out")."""
    T, L = spec["sequence"]["length"], spec["model"]["layers"]
    c = _constants(spec)
    d = {"embeddings": 0, "scores": 0, "values": width, "mlp": width}
    none = dict.fromkeys(PARTS, 0)
    out = {m: [] for m in SPLIT + ("D", "X")}
    pairs = np.triu_indices(T, 1)
    for start in range(0, draws, batch):
        B = min(batch, draws - start)
        G0 = np.broadcast_to(p0 + (q0 - p0) * np.eye(T), (B, T, T)).copy()
        plain, runs = G0, dict.fromkeys(SPLIT, G0)
        rho = {m: [np.zeros(B)] for m in SPLIT}
        rho.update(D=[], X=[])
        for layer in range(L):
            key = [seed, start, layer]
            for m in SPLIT:
                runs[m] = _block(runs[m], c, np.random.default_rng(key), np.random.default_rng(key + [1]), d,
                                 own=m != "whole", shadow=plain if "only" in m or "blind" in m else None,
                                 keys="keys" in m)[0]
            plain, _, A, _, _ = _block(plain, c, np.random.default_rng(key), None, none)
            for m in SPLIT:
                rho[m].append(_rho(runs[m]) - _rho(plain))
            rho["D"].append((runs["own"] - plain)[:, pairs[0], pairs[1]].var(axis=1))
            rho["X"].append(price_factor(A).mean(axis=1))
        for m in rho:
            out[m].append(np.stack(rho[m], axis=1))
    return {m: np.concatenate(v) for m, v in out.items()}


def blind(spec: dict, q0: float, p0: float, draws: int, seed: int = 0) -> dict:
    """The infinite-width chain (all `draws` in one batch) in lockstep with the same chain whose rows read the batch's
    mean state at every layer (common score draws): rows blind to each draw's own departure from the mean Gram, its
    pairs' dispersion at finite T and its common move, as the engine's rows are. Returns "plain" and "blind", rho
    (draws, L + 1), and "D" (L + 1): the plain chain's pairs' own dispersion at finite T, the variance over pairs of
    each draw's cosines less their mean over the draws and less the draw's mean move, averaged over the draws."""
    T, L = spec["sequence"]["length"], spec["model"]["layers"]
    c = _constants(spec)
    none = dict.fromkeys(PARTS, 0)
    pairs = np.triu_indices(T, 1)
    G = np.broadcast_to(p0 + (q0 - p0) * np.eye(T), (draws, T, T)).copy()
    H = G.copy()
    out = {"plain": [_rho(G)], "blind": [_rho(H)], "D": [0.0]}
    for layer in range(L):
        key = [seed, layer, 13]
        G = _block(G, c, np.random.default_rng(key), None, none)[0]
        H = _block(H, c, np.random.default_rng(key), None, none, shadow=np.broadcast_to(H.mean(axis=0), H.shape))[0]
        dev = _cosines(G)[:, pairs[0], pairs[1]]
        dev = dev - dev.mean(axis=0)
        out["plain"].append(_rho(G))
        out["blind"].append(_rho(H))
        out["D"].append(float((dev - dev.mean(axis=1, keepdims=True)).var(axis=1).mean()))
    return {"plain": np.stack(out["plain"], axis=1), "blind": np.stack(out["blind"], axis=1), "D": np.array(out["D"])}


def chain(spec: dict, q0: float, p0: float, draws: int, rng, batch: int = 16, width: int = 0,
          finite: tuple = PARTS, probe=None) -> tuple[np.ndarray, np.ndarray]:
    """rho (draws, L + 1) and IPR (draws, L) of the encoder `spec` from the stream-0 moments: at infinite width, or
    (`width` d >= T) with the `finite` parts drawn at width d (the whole network in distribution with all of them,
    its LayerNorms' centering aside), the rest at infinite width. probe(l, G_in, K, A, O, G_out), if given, sees each
    batch's block l: the stream entering it, its attention's input cosines, rows and output's Gram, the stream leaving
    it."""
    from initadvisor.spec import build_spec

    T, L = spec["sequence"]["length"], spec["model"]["layers"]
    if width and width < T:
        raise ValueError(f"width {width} < T {T}: the stream's frame needs T coordinates")
    c = _constants(spec)
    d = {part: width if part in finite else 0 for part in PARTS}
    normed = build_spec(spec).embedding_norm
    rhos, iprs = [], []
    for start in range(0, draws, batch):
        B = min(batch, draws - start)
        G = np.broadcast_to(p0 + (q0 - p0) * np.eye(T), (B, T, T)).copy()
        if d["embeddings"]:  # Gaussian rows over d coordinates (then the embeddings' norm, if any: q0 = 1)
            Y = _factor(G) @ rng.standard_normal((B, T, width))
            G = Y @ Y.transpose(0, 2, 1) / width
            if normed:
                G = _cosines(G)
        rho, ipr = [_rho(G)], []
        for layer in range(L):
            G_in = G
            G, K, A, O, y2 = _block(G, c, rng, rng, d)
            if probe is not None:
                probe(layer, G_in, K, A, O, G)
            rho.append(_rho(G))
            ipr.append(y2)
        rhos.append(np.stack(rho, axis=1))
        iprs.append(np.stack(ipr, axis=1))
    return np.concatenate(rhos), np.concatenate(iprs)


def _engine(spec: dict) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The engine's rho (L + 1) and IPR (L + 1, nan at 0) as `verify` compares them, and the stream-0 moments."""
    from initadvisor.core.model import propagate
    from initadvisor.diagnose import causal_trace
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    net = from_spec(build_spec(spec))
    tr, ct = propagate(net, backward=False), causal_trace(net)
    rho, ipr = (tr.rho, tr.y2) if ct is None else (ct.rho_mean, ct.y2.mean(axis=1))
    q0, p0 = net.embeddings.moments()
    return np.asarray(rho, float), np.concatenate([[np.nan], ipr]), float(q0), float(p0)


def _se(x: float) -> str:
    """A standard error, or '-' where one draw gives none."""
    return f"{x:.4f}" if np.isfinite(x) else "-"


def _gap(a, b, se, relative: bool) -> str:
    """The largest gap of a over b over the layers, its layer and z (se: the gap's standard error)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        g = (a / b - 1.0) if relative else (a - b)
        z = (a - b) / se
    i = int(np.nanargmax(np.abs(g)))
    zs = f" (z {z[i]:+.1f})" if np.isfinite(z[i]) else ""
    return (f"{g[i]:+.1%}" if relative else f"{g[i]:+.4f}") + f" at {i}{zs}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cell", help="norm:ratio:T:bi|causal, as phase_fidelity.py's --cells")
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16, help="draws run together (the probes' mean state is a batch's)")
    ap.add_argument("--report", default="", help="a verify report of the same cell (JSON)")
    ap.add_argument("--width", type=int, default=0, help="draw the --finite parts at this width (>= T; 0: infinite)")
    ap.add_argument("--finite", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--structure", action="store_true",
                    help="also what the keys' structure does per layer (infinite width; `structure`)")
    ap.add_argument("--pull", type=int, default=0,
                    help="also each block's own pull on rho at this width (values, MLP; infinite-width chain; `pull`)")
    ap.add_argument("--split", type=int, default=0,
                    help="also where the width's pull comes from at this width (values, MLP; `split`)")
    ap.add_argument("--response", type=int, default=0,
                    help="also the rows' response to the pairs' dispersion carried at this width (`response`)")
    ap.add_argument("--wishart", type=int, default=0,
                    help="also the late rows' move on exchangeable keys realized at this width (`wishart_rows`)")
    ap.add_argument("--blind", action="store_true",
                    help="also the chain with its rows reading the draws' mean state (infinite width; `blind`)")
    ap.add_argument("--forced", action="store_true",
                    help="also each block teacher-forced on the chain's mean state (causal, infinite width; `forced`)")
    args = ap.parse_args()
    try:
        norm, ratio, T, kind = args.cell.split(":")
        if norm not in ("post", "pre") or kind not in ("bi", "causal") or not 2 <= int(T) <= 4096 \
                or not 0 < float(ratio) <= 100:
            raise ValueError
    except ValueError:
        ap.error(f"cell: expected norm:ratio:T:bi|causal with norm post or pre, 0 < ratio <= 100 and 2 <= T <= 4096, "
                 f"got {args.cell!r}")
    if not 1 <= args.draws <= 10000 or not 1 <= args.layers <= 1000 or args.seed < 0 or not 1 <= args.batch <= 10000:
        ap.error("--draws and --batch must be in [1, 10000], --layers in [1, 1000] and --seed >= 0")
    finite = tuple(p for p in args.finite.split(",") if p)
    if args.width and not int(T) <= args.width <= 65536 or any(p not in PARTS for p in finite):
        ap.error(f"--width must be 0 or in [T, 65536] and --finite of {', '.join(PARTS)}")
    if (args.structure or args.pull or args.split or args.response or args.wishart or args.blind) and args.width:
        ap.error("--structure, --pull, --split, --response, --wishart and --blind run beside the infinite-width chain: "
                 "leave out --width")
    if any(x and not int(T) <= x <= 65536 for x in (args.pull, args.split, args.response)):
        ap.error("--pull, --split and --response must be in [T, 65536]")
    if args.wishart and not 2 <= args.wishart <= 65536:
        ap.error("--wishart must be in [2, 65536]")
    if args.forced and kind != "causal":
        ap.error("--forced runs the position-resolved engine: a causal cell")
    spec = spec_for(norm, float(ratio), int(T), kind == "causal", args.layers, 720)
    net = None
    if args.report:
        import json

        try:
            report = json.loads(Path(args.report).read_text())
            layers, name = report["layers"], report["spec"]["name"]
            net = {k: (np.array([r[k]["measured"] if k in r else np.nan for r in layers], float),
                       np.array([r[k]["se"] if k in r else np.nan for r in layers], float)) for k in ("rho", "ipr")}
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--report {args.report}: not a verify report ({e})")
        if name != spec["name"]:
            ap.error(f"--report {args.report}: a report of {name}, not of {spec['name']}")
        if len(layers) != args.layers + 1:
            ap.error(f"--report {args.report}: {len(layers) - 1} layers, the cell has {args.layers}")
    e_rho, e_ipr, q0, p0 = _engine(spec)
    rng = np.random.default_rng(args.seed)
    scale = _constants(spec)["scale"]
    found, steps, pulls, probes = [], [], [], []
    if args.structure:
        probes.append(lambda l, G_in, K, A, O, G_out: found.append(structure(K, A, scale, rng, max(4, int(T) // 32))))
    if args.forced:
        probe, steps = forced(spec)
        probes.append(probe)
    if args.pull:
        probe, pulls = pull(spec, args.pull, args.seed)
        probes.append(probe)
    rho, ipr = chain(spec, q0, p0, args.draws, rng, batch=args.batch, width=args.width, finite=finite,
                     probe=(lambda *a: [p(*a) for p in probes]) if probes else None)
    c_rho, c_ipr = rho.mean(axis=0), np.concatenate([[np.nan], ipr.mean(axis=0)])
    s_rho = rho.std(axis=0, ddof=1) / math.sqrt(args.draws) if args.draws > 1 else np.full_like(c_rho, np.nan)
    s_ipr = np.concatenate([[np.nan], ipr.std(axis=0, ddof=1) / math.sqrt(args.draws) if args.draws > 1
                            else np.full(args.layers, np.nan)])
    at = f"width {args.width} ({', '.join(finite) or 'none'}; the rest infinite)" if args.width else "infinite width"
    print(f"{args.cell}: beta {spec['init']['qk_beta']:.4g}, {args.draws} draws at {at}")
    print("index   rho: engine  chain (se)        network (se)     IPR: engine  chain (se)        network (se)")
    for i in range(args.layers + 1):
        line = f"{i:5d}   {e_rho[i]:.4f}  {c_rho[i]:.4f} ({_se(s_rho[i])})"
        line += f"  {net['rho'][0][i]:.4f} ({net['rho'][1][i]:.4f})" if net else ""
        if i:
            line += f"   {e_ipr[i]:.4f}  {c_ipr[i]:.4f} ({_se(s_ipr[i])})"
            line += f"  {net['ipr'][0][i]:.4f} ({net['ipr'][1][i]:.4f})" if net else ""
        print(line)
    print(f"engine - chain (the draw's keys):  rho {_gap(e_rho, c_rho, s_rho, False)}, "
          f"IPR {_gap(e_ipr, c_ipr, s_ipr, True)}")
    per_batch = min(args.batch, args.draws)
    if found:
        found = np.mean(np.reshape(found, (-1, args.layers, 7)), axis=0)
        print(f"\nthe keys' structure (the mean over batches of {per_batch} draws): the late pairs' output overlap "
              "as drawn, with exchangeable keys, and its excess over them at the keys' positional means and within a "
              f"position; the last {max(4, int(T) // 32)} rows' IPR as drawn, at i.i.d. scores of each row's spread "
              "and at the positional covariance; the positional structure's top direction's share")
        print("index   overlap: drawn  exchangeable  positional  within    IPR: drawn  i.i.d.  positional    top share")
        for i, (o, x, p, y, iid, pos, top) in enumerate(found, start=1):
            print(f"{i:5d}   {o:13.4f}  {x:12.4f}  {p - x:+10.4f}  {o - p:+7.4f}  {y:11.4f}  {iid:6.4f}  {pos:10.4f}"
                  f"  {top:11.3f}")
    if steps:
        steps = np.reshape(steps, (-1, args.layers, 3))
        mean = steps.mean(axis=0)
        se = steps.std(axis=0, ddof=1) / math.sqrt(len(steps)) if len(steps) > 1 else None
        print("\nteacher-forced (the engine's block on each batch's mean state against the chain's next layer; the "
              f"engine less the chain, mean over batches of {per_batch} draws (se)): the block's rho, its attention "
              "output's mean pair overlap and mean q")
        print("index   block rho            attention: pair overlap      q")
        for i, row in enumerate(mean, start=1):
            err = [f" ({se[i - 1][k]:.5f})" if se is not None else "" for k in range(3)]
            print(f"{i:5d}   {row[0]:+.5f}{err[0]}   {row[1]:+.5f}{err[1]}   {row[2]:+.5f}{err[2]}")
    if pulls:
        per = [np.concatenate(pulls[i::args.layers]) for i in range(args.layers)]
        print(f"\neach block's own pull on rho at width {args.pull} (its values and MLP drawn there against infinite "
              "width, from the chain's state entering it; common scores, antithetic weights): mean over draws (se), "
              "predicted by the norms' cosine bias (pull_predicted) and that prediction's common part")
        print("index   measured (se)        predicted  common")
        for i, x in enumerate(per, start=1):
            se = f" ({x[:, 0].std(ddof=1) / math.sqrt(len(x)):.5f})" if len(x) > 1 else ""
            print(f"{i:5d}   {x[:, 0].mean():+.5f}{se}   {x[:, 1].mean():+.6f}  {x[:, 2].mean():+.6f}")
    if args.response:
        got = response(spec, q0, p0, args.response, args.draws, args.seed, args.batch)
        print(f"\nthe rows' response to the pairs' own dispersion carried at width {args.response} (every 4th block, "
              "the last half's rows, mean over draws (se)): sqrt D, and the second-order move of a row's own attention "
              "output and of its IPR, to the dispersion as carried, to a Wishart one of the same D, and by the "
              "independent pairs' law (`response`)")
        print("block   sqrt D    own output: carried (se)      wishart (se)          iid        "
              "IPR: carried (se)             wishart (se)          iid        held slope  rows' move / D  "
              "block at fresh_width (se)")
        for b, x in sorted(got.items()):
            n = np.isfinite(x).sum(axis=0)  # (rows_response is nan where no second order exists: a large dispersion)
            with np.errstate(invalid="ignore", divide="ignore"):
                m = np.nanmean(np.where(np.isfinite(x), x, np.nan), axis=0) if len(x) else np.full(10, np.nan)
                se = np.nanstd(np.where(np.isfinite(x), x, np.nan), axis=0, ddof=1) / np.sqrt(n)

            def v(k):
                if not n[k]:
                    return "-" + " " * 18
                return f"{m[k]:+.5f} ({se[k]:.5f})" if n[k] > 1 else f"{m[k]:+.5f} (-)      "

            print(f"{b:5d}   {math.sqrt(m[0]):.4f}    {v(1)}   {v(3)}   {m[5]:+.5f}   {v(2)}   {v(4)}   {m[6]:+.5f}   "
                  f"{m[7]:+.4f}      {m[8]:.4f}          {v(9)}")
    if args.wishart:
        print(f"\nthe late rows on exchangeable keys realized at width {args.wishart} (normalized, less the common "
              f"part; {args.draws} draws): sqrt D, the mean move of a row's own attention output and of its IPR (se)")
        for r in (0.3, 0.5, 0.7, 0.9):
            x = wishart_rows(spec, r, args.wishart, args.draws, args.seed)
            m, se = x.mean(axis=0), x.std(axis=0, ddof=1) / math.sqrt(len(x)) if len(x) > 1 else np.full(3, np.nan)
            print(f"rho {r:.1f}   sqrt D {math.sqrt(m[0]):.4f}   own output {m[1]:+.5f} ({se[1]:.5f})   "
                  f"IPR {m[2]:+.5f} ({se[2]:.5f})")
    if args.split:
        moves = split(spec, q0, p0, args.split, args.draws, args.seed, args.batch)
        print(f"\nwhere the width's pull comes from at width {args.split} (values and MLP; chains in lockstep with the "
              "infinite-width one, common scores and weights): rho less the infinite chain's, mean over draws (se); "
              "the sums' whole fluctuation, their own (less the common part), that with the rows reading the "
              "noiseless run's state, and with only the keys' Gram realized in the scores")
        print("; and the pairs' own dispersion that the skip carries, as a standard deviation (sqrt D), and "
              "c^2 D X g_v, the move of a row's own attention output that it makes by Price's theorem (`split`)")
        print("index   " + "".join(f"{m:22s}" for m in SPLIT) + "sqrt D    c^2 D X g_v")
        D, X = moves.pop("D"), moves.pop("X")
        for i in range(1, args.layers + 1):
            se = [f" ({_se(x[:, i].std(ddof=1) / math.sqrt(len(x)))})" if len(x) > 1 else "" for x in moves.values()]
            price = scale**2 * float((D[:, i - 1] * X[:, i - 1]).mean()) * spec["init"]["v"]["gain"]
            print(f"{i:5d}   " + "".join(f"{x[:, i].mean():+.5f}{e}".ljust(22) for x, e in zip(moves.values(), se))
                  + f"{math.sqrt(D[:, i - 1].mean()):.4f}    {price:.2e}")
    if args.blind:
        from initadvisor.core import ops

        got = blind(spec, q0, p0, args.draws, args.seed)
        big = spec_for(norm, float(ratio), int(T), kind == "causal", args.layers, 10**6)
        laws, was = [_engine(big)[0]], ops.FIELD_LAW
        ops.FIELD_LAW = True
        try:
            laws.append(_engine(big)[0])
        finally:
            ops.FIELD_LAW = was
        x, b = got["plain"], got["blind"]
        se = (b - x).std(axis=0, ddof=1) / math.sqrt(len(x)) if len(x) > 1 else np.full(x.shape[1], np.nan)
        print(f"\nthe rows blind to the draws (`blind`; {args.draws} draws in one batch, infinite width): the chain's "
              "rho, the chain whose rows read the draws' mean state less it (se, paired), the engine's rows at the mean "
              "state (at width 10^6: the i.i.d. rows as shipped, the field law) less that blind chain, and sqrt D_T, "
              "the chain's pairs' own dispersion at finite T")
        print("index   chain    blind - chain (se)    i.i.d. rows - blind   field law - blind   sqrt D_T")
        for i in range(args.layers + 1):
            print(f"{i:5d}   {x[:, i].mean():.4f}   {b[:, i].mean() - x[:, i].mean():+.5f} ({_se(se[i])})   "
                  f"{laws[0][i] - b[:, i].mean():+.5f}             {laws[1][i] - b[:, i].mean():+.5f}           "
                  f"{math.sqrt(got['D'][i]):.4f}")
    if net:
        (n_rho, n_srho), (n_ipr, n_sipr) = net["rho"], net["ipr"]
        print(f"chain - network (the width):       rho {_gap(c_rho, n_rho, np.hypot(s_rho, n_srho), False)}, "
              f"IPR {_gap(c_ipr, n_ipr, np.hypot(s_ipr, n_sipr), True)}")
        print(f"engine - network:                  rho {_gap(e_rho, n_rho, n_srho, False)}, "
              f"IPR {_gap(e_ipr, n_ipr, n_sipr, True)}")


if __name__ == "__main__":
    main()
