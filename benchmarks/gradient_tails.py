"""Gradient tails: why a few seeds cannot judge a post-LN gradient past beta_c, and where the engine sits among them.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/gradient_tails.py post:2.5:64:bi [--sequences 128] [--layers 50]

One cell of phase_fidelity.py's grid, measured sequence by sequence (each its own weights, rng seeds [0, i]). Per
sequence the gradient's q at index l over index L is a product of per-block gains; printed per layer: the engine
(`check`'s prediction as `verify` compares it), the mean over sequences (what `verify` measures) with its standard
error, the median, the product of the blocks' mean gains (the mean if the blocks' gains were independent), the
variance of the log gradient, and the part of the mean's excess over that product that the sequences' own rho
carries (exp of half the covariance, across blocks, of each block's log gain regressed on its input's rho). Asserts
nothing.
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
    from initadvisor.diagnose import causal_trace
    from initadvisor.simulate import run_one
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("cell", help="norm:ratio:T:bi|causal")
    ap.add_argument("--sequences", type=int, default=128)
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--d", type=int, default=720)
    args = ap.parse_args()
    norm, ratio, T, kind = args.cell.split(":")
    net = from_spec(build_spec(spec_for(norm, float(ratio), int(T), kind == "causal", args.layers, args.d)))
    ct = causal_trace(net, backward=True)
    engine = ct.grad_q if ct is not None else propagate(net).grad_q
    runs = [run_one(net, 1, np.random.default_rng([0, i]), weight_grads=False) for i in range(args.sequences)]
    g = np.concatenate([r["gq"] for r in runs])  # sequences x (L + 1)
    rho = np.concatenate([r["p"] / r["q"] for r in runs])
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


if __name__ == "__main__":
    sys.exit(main())
