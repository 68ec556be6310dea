"""Teacher-forced causal backward: which part of the engine's position-resolved gradient drifts from the network's.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/teacher_forced.py post:1.5:512 [--sequences 48] [--layers 50]

One causal cell of phase_fidelity.py's grid. The numpy network runs `--sequences` sequences (each its own weights,
rng seeds [9, i]) and keeps, per stream index, the mean over them of the stream's Gram (x_s . x_s' / d) and of the
gradient's. The engine's block maps then run at full resolution on those measured forward states, two ways:
"block" (each block from the measured gradient above it: its own error) and "run" (its own gradient state carried
down from the top, as `check` does). Printed every third layer: the block's total gain against the network's (and
the sequences' mean gain with its standard error), the product of the blocks' errors, the run's error, both per band
of positions; then the bands' shares of the gradient, and the mean correlation of the gradients at positions 0-3
(network, block, run). Last, per layer, how alike the late rows (t >= 4) weigh keys 0-3 (the mean correlation of
their weights over the rows, from the network's attention at 4 of the sequences' weights) against the engine's rows
(their uniform pair moment over the key shares' E[A^2]). Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from phase_fidelity import spec_for  # noqa: E402



def bands_of(T: int) -> list[tuple[int, int]]:
    """Position bands 0-3, 4-31, 32-127, 128-T (those that hold positions)."""
    edges = sorted({min(e, T) for e in (0, 4, 32, 128, T)})
    return list(zip(edges[:-1], edges[1:]))


def main() -> None:
    from initadvisor.core import causal as cz
    from initadvisor.core.ops import Attention, causal_backward, causal_forward, find
    from initadvisor.simulate import backward, forward, init_network, make_input
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("cell", help="norm:ratio:T (causal)")
    ap.add_argument("--sequences", type=int, default=48)
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--d", type=int, default=720)
    args = ap.parse_args()
    norm, ratio, T = args.cell.split(":")
    T, L = int(T), args.layers
    net = from_spec(build_spec(spec_for(norm, float(ratio), T, True, L, args.d)))

    C, D, gd, alike = np.zeros((L + 1, T, T)), np.zeros((L + 1, T, T)), [], np.zeros((L, 4, 4))
    for s in range(args.sequences):
        rng = np.random.default_rng([9, s])
        W = init_network(net, rng)
        hs, caches = forward(net, W, make_input(net, 1, rng), rng)
        gs = backward(net, W, caches, rng.standard_normal(hs[0].shape))
        gd.append([np.mean(g[0] ** 2, axis=1).mean() for g in gs])
        for k in range(L + 1):
            C[k] += hs[k][0] @ hs[k][0].T / args.d
            D[k] += gs[k][0] @ gs[k][0].T / args.d
        if s < 4:
            for k in range(L):
                a = find(net.blocks[k], caches[k], Attention)["a"][0, 0][4:, :4]
                alike[k] += a.T @ a
    C, D, gd = C / args.sequences, D / args.sequences, np.array(gd)

    G = cz._grid(T, T, 1.1)
    BANDS = bands_of(T)
    off4 = ~np.eye(4, dtype=bool)

    def state(M):
        P = M.copy()
        np.fill_diagonal(P, 0.0)
        return cz.State(np.diag(M).copy(), P)

    def corr4(q, P):
        n = np.sqrt(q[:4])
        return (P[:4, :4] / np.outer(n, n))[off4].mean()

    def bands(x, ref):
        return " ".join(f"[{a}:{b}] {x[a:b].mean() / ref[a:b].mean() - 1:+.1%}" for a, b in BANDS)

    m, t = np.arange(1, T + 1.0), np.arange(4, T)

    def alike_engine(rows):  # the engine's rows t >= 4: E A_tj^2 at the key shares, the uniform pair moment
        sh = np.ones((T, T)) if rows.shares is None else rows.shares[1]
        diag = (rows.y2[t] / m[t]) @ sh[t, :4]
        pair = np.sum((1.0 - rows.y2[t]) / (m[t] * (m[t] - 1.0)))
        return (pair / np.sqrt(np.outer(diag, diag)))[off4].mean()

    print(f"{args.cell}, {args.sequences} sequences; errors engine / network - 1")
    run, cum, engine_alike = state(D[L]), 0.0, {}
    for k in range(L - 1, -1, -1):
        S, caches = causal_forward(net.blocks[k], G, state(C[k]))
        if (L - 1 - k) % 3 == 0:
            engine_alike[k] = alike_engine(find(net.blocks[k], caches, Attention))
        one = causal_backward(net.blocks[k], G, state(D[k + 1]), caches)
        run = causal_backward(net.blocks[k], G, run, caches)
        up, dm = np.diag(D[k + 1]).mean(), np.diag(D[k])
        ge, gm = one.qf.mean() / up, dm.mean() / up
        seq = gd[:, k] / gd[:, k + 1]
        cum += np.log(ge / gm)
        if k % 3 == 0:
            print(f"{k:2d} block gain {ge:.4f} network {gm:.4f} ({ge / gm - 1:+.1%}; sequences' {seq.mean():.4f} +- "
                  f"{seq.std(ddof=1) / np.sqrt(len(seq)):.4f}), product {np.exp(cum) - 1:+.1%}, run "
                  f"{run.qf.mean() / dm.mean() - 1:+.1%}\n   block by band {bands(one.qf, dm)}\n   run by band   "
                  f"{bands(run.qf, dm)}\n   shares (network / run) "
                  + " ".join(f"[{a}:{b}] {dm[a:b].mean() / dm.mean():.3g} / {run.qf[a:b].mean() / run.qf.mean():.3g}"
                             for a, b in BANDS)
                  + f"\n   positions 0-3's gradient correlation: network {corr4(dm, D[k] - np.diag(dm)):.3f}, block "
                    f"{corr4(one.qf, one.P):.3f}, run {corr4(run.qf, run.P):.3f}", flush=True)

    print("late rows' weights on keys 0-3, mean correlation over the rows: network / engine")
    for k in range(L - 1, -1, -3):
        M = alike[k]
        net_c = (M / np.sqrt(np.outer(np.diag(M), np.diag(M))))[off4].mean()
        print(f"{k:2d} {net_c:.3f} / {engine_alike[k]:.3f}")

if __name__ == "__main__":
    sys.exit(main())
