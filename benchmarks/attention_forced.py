"""The causal attention operation teacher-forced at finite width: where its output parts from the network's.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/attention_forced.py post:2.5:512 [--sequences 16] [--blocks 20,37,44]

One causal phase-grid cell (phase_fidelity.py's encoder at `--d`). The numpy network runs `--sequences` sequences,
each its own weights (rng seeds [13, i]). At each of `--blocks` the engine's attention operation (Attention.causal on
the engine's position groups) reads each sequence's own input Gram (x_s . x_s' / d, averaged on the groups), and its
output is set against that sequence's measured output Gram (a v)(a v)^T / d: the output overlap between bands of
positions, engine / network - 1 of the means over sequences, and the output's q by band. Then the late rows (t >= T/2):
their weight on the first keys over uniform rows' weight, and their IPR, from the network's rows, from Gaussian rows of
each sequence's measured Gram (given the input and its query, row t's scores are N(0, scale^2 |q_t|^2 sigma_K^2 d C)
over W_K: the rows' law given the state, whatever the keys' structure), i.i.d. rows of the same spread, and the
engine (its key shares, softmax_rows.key_shares: each key's spread about the row's mean taken as independent; its
row law). Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from phase_fidelity import spec_for  # noqa: E402

BANDS = (0, 1, 4, 16, 64, 128, 256)  # band edges (those below T), then T
KEYS = ((0, 1), (1, 4), (4, 16), (16, 32))  # the first keys (singleton groups: the engine's shares are per key)


def group_state(G, C: np.ndarray):
    """The engine's state of a measured Gram: per-position q, the mean overlap of distinct tokens per group pair."""
    from initadvisor.core import causal as cz

    sums = np.add.reduceat(np.add.reduceat(C, G.start, axis=0), G.start, axis=1)
    sums[np.diag_indices(len(G.n))] -= np.add.reduceat(np.diag(C), G.start)
    with np.errstate(invalid="ignore", divide="ignore"):
        P = sums / np.maximum(np.where(np.eye(len(G.n), dtype=bool), G.pairs, np.multiply.outer(G.n, G.n)), 1.0)
    return cz.State(np.diag(C).copy(), P)


def band_means(C: np.ndarray, edges: list[int]) -> np.ndarray:
    """Mean of C over each pair of bands (distinct positions within a band)."""
    k = len(edges) - 1
    out = np.full((k, k), np.nan)
    for i in range(k):
        for j in range(k):
            blk = C[edges[i]:edges[i + 1], edges[j]:edges[j + 1]]
            n = edges[i + 1] - edges[i]
            out[i, j] = blk.mean() if i != j else (blk.sum() - np.trace(blk)) / (n * (n - 1)) if n > 1 else np.nan
    return out


def gaussian_rows(C: np.ndarray, kappa: float, rng, n: int = 2000) -> np.ndarray:
    """n softmax rows over C's keys whose scores are N(0, kappa C)."""
    w, V = np.linalg.eigh(C)
    Z = rng.standard_normal((n, len(w))) @ (V * np.sqrt(np.maximum(w, 0.0) * kappa)).T
    Z -= Z.max(axis=1, keepdims=True)
    A = np.exp(Z)
    return A / A.sum(axis=1, keepdims=True)


def main() -> None:
    from initadvisor.core import causal as cz
    from initadvisor.core.ops import Attention, find, leaves
    from initadvisor.simulate import forward, init_network, make_input
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("cell", help="norm:ratio:T (causal)")
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--blocks", default="20,37,44", help="comma-separated, 1-based")
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--d", type=int, default=720)
    ap.add_argument("--rows", type=int, default=8, help="late rows sampled as Gaussian rows per sequence")
    args = ap.parse_args()
    try:
        norm, ratio, T = args.cell.split(":")
        T, ratio, blocks = int(T), float(ratio), [int(b) for b in args.blocks.split(",")]
    except ValueError:
        ap.error("cell must be norm:ratio:T and --blocks comma-separated integers")
    if (norm not in ("pre", "post") or not blocks or min(blocks) < 1 or max(blocks) > args.layers
            or args.sequences < 2 or args.rows < 1 or not 64 <= T <= 4096):
        ap.error("norm must be pre or post, --blocks lie in 1..--layers, --sequences >= 2, --rows >= 1, "
                 "64 <= T <= 4096")
    try:
        net = from_spec(build_spec(spec_for(norm, ratio, T, True, args.layers, args.d)))
    except ValueError as e:  # SpecError: a width, ratio or length the spec refuses
        ap.error(str(e))
    G = cz._grid(T, cz._SINGLE, cz._RATIO)
    edges = [e for e in BANDS if e < T] + [T]
    late = np.linspace(T // 2, T - 1, args.rows).astype(int)
    keys = [(a, b) for a, b in KEYS if b <= T // 2]
    rec = {k: [] for k in blocks}
    for s in range(args.sequences):
        rng = np.random.default_rng([13, s])
        W = init_network(net, rng)
        hs, caches = forward(net, W, make_input(net, 1, rng), rng)
        for k in blocks:
            ops = net.blocks[k - 1]
            op = next(o for o in leaves(ops) if isinstance(o, Attention))
            c = find(ops, caches[k - 1], Attention)
            a, v, u, q = (c[x][0, 0] if x != "u" else c[x][0] for x in ("a", "v", "u", "q"))
            o = a @ v
            Cu = u @ u.T / u.shape[1]
            O, rows = op.causal(G, group_state(G, Cu))
            Oe = O.P[np.ix_(G.gid, G.gid)]
            np.fill_diagonal(Oe, O.qf)
            kappa = op.P.softmax_scale**2 * np.var(W[k - 1][id(op)]["wk"]) * u.shape[1]
            gauss, iid = [], []
            for t in late:
                m = t + 1
                Ct = Cu[:m, :m]
                spread = np.trace(Ct) / m - Ct.mean()
                kt = kappa * float(q[t] @ q[t])
                A = gaussian_rows(Ct, kt, rng)
                gauss.append(((A * A).sum(1).mean(), [A[:, x:y].sum(1).mean() * m / (y - x) for x, y in keys]))
                Z = rng.standard_normal((2000, m)) * np.sqrt(kt * spread)
                Ai = np.exp(Z - Z.max(axis=1, keepdims=True))
                Ai /= Ai.sum(axis=1, keepdims=True)
                iid.append((Ai * Ai).sum(1).mean())
            shares = [[1.0] * len(keys) if rows.shares is None else  # the row's group, at its last row
                      [float(rows.shares[0][G.gid[t], x:y].mean()) for x, y in keys] for t in late]
            rec[k].append(dict(
                net=band_means(o @ o.T / o.shape[1], edges), eng=band_means(Oe, edges),
                qn=np.diag(o @ o.T) / o.shape[1], qe=O.qf,
                w_net=[np.mean([a[t, x:y].sum() * (t + 1) / (y - x) for t in late]) for x, y in keys],
                w_gauss=np.mean([g[1] for g in gauss], axis=0), w_eng=np.mean(shares, axis=0),
                y_net=np.mean([a[t] @ a[t] for t in late]), y_gauss=np.mean([g[0] for g in gauss]),
                y_iid=np.mean(iid), y_eng=float(np.mean(rows.y2[late]))))
    names = [f"[{a}:{b}]" for a, b in zip(edges[:-1], edges[1:])]
    for k in blocks:
        R = rec[k]
        mean = lambda x: np.mean([r[x] for r in R], axis=0)  # noqa: E731
        se = lambda x: np.std([r[x] for r in R], axis=0, ddof=1) / np.sqrt(len(R))  # noqa: E731
        err = mean("eng") / mean("net") - 1.0
        print(f"block {k} ({len(R)} sequences): attention output overlap, engine / network - 1 (rows by tokens)")
        print("          " + " ".join(f"{n:>9s}" for n in names))
        for i, n in enumerate(names):
            cells = (f"{err[i, j]:+9.1%}" if j <= i and np.isfinite(err[i, j]) else " " * 9 for j in range(len(names)))
            print(f"{n:>9s} " + " ".join(cells))
        qn, qe = mean("qn"), mean("qe")
        print("  q       " + " ".join(f"{qe[a:b].mean() / qn[a:b].mean() - 1:+9.1%}" for a, b in zip(edges, edges[1:])))
        wn, ws, wg, we = mean("w_net"), se("w_net"), mean("w_gauss"), mean("w_eng")
        print("  late rows' weight on keys over uniform (network +- se / Gaussian rows / engine): " + "  ".join(
            f"[{x}:{y}] {wn[i]:.2f} +- {ws[i]:.2f} / {wg[i]:.2f} / {we[i]:.2f}" for i, (x, y) in enumerate(keys)))
        print(f"  late rows' IPR: network {mean('y_net'):.4f} +- {se('y_net'):.4f}, Gaussian rows of the measured "
              f"Gram {mean('y_gauss'):.4f}, i.i.d. rows of its spread {mean('y_iid'):.4f}, engine {mean('y_eng'):.4f}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
