"""Gradient tails: why a few seeds cannot judge a post-LN gradient past beta_c, where the engine sits among them, and
the rho walk behind them.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/gradient_tails.py post:2.5:64:bi [--sequences 128] [--layers 50]
                                                                         [--d 720] [--seed 0]

One cell of phase_fidelity.py's grid, measured sequence by sequence (each its own weights, rng seeds [seed, i]). Per
sequence the gradient's q at index l over index L is a product of per-block gains; printed per layer: the engine
(`check`'s prediction as `verify` compares it), the mean over sequences (what `verify` measures) with its standard
error, the median, the product of the blocks' mean gains (the mean if the blocks' gains were independent), the
variance of the log gradient, and the part of the mean's excess over that product that the sequences' own rho
carries (exp of half the covariance, across blocks, of each block's log gain regressed on its input's rho). Then the
walk of the sequences' own rho, per layer: the engine's rho, the sequences' mean and spread, the walk's spread as the
engine predicts it (core/walk.py), each block's slope (its output's rho regressed on its input's) and the spread it
adds of its own (the regression's residual), and the IPR: the engine's, the engine's block at the sequences' mean
state, the mean over sequences of the engine's block at each sequence's own state, and the measured mean with its
standard error. Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from phase_fidelity import spec_for  # noqa: E402


def main() -> None:
    from initadvisor.core.model import propagate
    from initadvisor.core.ops import Attention, find, moments_forward
    from initadvisor.core.walk import gradient_factor
    from initadvisor.diagnose import causal_trace
    from initadvisor.simulate import run_one
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("cell", help="norm:ratio:T:bi|causal")
    ap.add_argument("--sequences", type=int, default=128)
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--d", type=int, default=720)
    ap.add_argument("--seed", type=int, default=0, help="sequence i draws from rng seed [seed, i]")
    args = ap.parse_args()
    norm, ratio, T, kind = args.cell.split(":")
    net = from_spec(build_spec(spec_for(norm, float(ratio), int(T), kind == "causal", args.layers, args.d)))
    ct = causal_trace(net, backward=True)
    engine = ct.grad_q if ct is not None else propagate(net).grad_q
    runs = [run_one(net, 1, np.random.default_rng([args.seed, i]), weight_grads=False) for i in range(args.sequences)]
    g = np.concatenate([r["gq"] for r in runs])  # sequences x (L + 1)
    q, p = np.concatenate([r["q"] for r in runs]), np.concatenate([r["p"] for r in runs])
    rho = p / q
    L = g.shape[1] - 1
    gn = g / g[:, L:]
    gains = np.log(g[:, :-1] / g[:, 1:])  # block l + 1's log gain, fed by the stream at index l
    dr = rho[:, :-1] - rho[:, :-1].mean(0)
    slope = np.array([np.cov(gains[:, l], dr[:, l])[0, 1] / dr[:, l].var() for l in range(L)])
    cov = np.cov(dr.T)
    n = len(g)
    print(f"{args.cell}, {n} sequences, d {args.d}")
    print(f"{'index':>5s} {'engine':>9s} {'mean':>9s} {'se':>5s} {'median':>9s} {'prod E':>9s} {'var log':>7s} "
          f"{'rho part':>8s} {'engine/mean':>11s}")
    for l in range(0, L + 1, max(1, L // 10)):
        mean = gn[:, l].mean()
        se = gn[:, l].std(ddof=1) / np.sqrt(n) / mean
        prod = np.prod(np.exp(gains[:, l:]).mean(0))
        s, C = slope[l:], cov[l:, l:]
        rho_part = np.exp(0.5 * (s @ C @ s - (s * s * np.diag(C)).sum()))
        print(f"{l:5d} {engine[l]:9.3g} {mean:9.3g} {se:5.0%} {np.median(gn[:, l]):9.3g} {prod:9.3g} "
              f"{np.log(gn[:, l]).var():7.2f} {rho_part:8.2f} {engine[l] / mean:11.2f}")
    if ct is not None:  # (causal stacks: the position-resolved engine's rows are not one pair map's)
        return
    tr = propagate(net)
    walk = np.sqrt(gradient_factor(net.blocks, [args.d] * L, tr.q, tr.p, list(tr.grad_q), list(tr.grad_p))[2])
    y2 = np.concatenate([r["y2"] for r in runs]).reshape(n, L)

    def ipr(l: int, qq, pp) -> np.ndarray:  # the engine's block l at input states (qq, pp)
        return find(net.blocks[l], moments_forward(net.blocks[l], qq, pp)[2], Attention).y2

    print(f"\n{'index':>5s} {'rho eng':>7s} {'mean':>6s} {'sd':>6s} {'walk sd':>7s} {'slope':>5s} {'own sd':>6s} | "
          f"{'IPR eng':>8s} "
          f"{'at mean':>8s} {'E seqs':>8s} {'measured':>8s} {'se':>5s}")
    for l in range(0, L, max(1, L // 16)):
        x, y = rho[:, l], rho[:, l + 1]
        a = np.cov(x, y)[0, 1] / x.var()
        own = (y - y.mean() - a * (x - x.mean())).std()
        at_mean = float(ipr(l, q[:, l].mean(), p[:, l].mean()))
        print(f"{l:5d} {tr.rho[l]:7.3f} {x.mean():6.3f} {x.std():6.4f} {walk[l]:7.4f} {a:5.2f} {own:6.4f} | "
              f"{tr.y2[l]:8.4f} {at_mean:8.4f} {ipr(l, q[:, l], p[:, l]).mean():8.4f} {y2[:, l].mean():8.4f} "
              f"{y2[:, l].std(ddof=1) / np.sqrt(n) / y2[:, l].mean():5.1%}")


if __name__ == "__main__":
    sys.exit(main())
