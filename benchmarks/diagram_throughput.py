"""Throughput of the trainability diagram: the vectorised grid against the single-spec engine per point.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/diagram_throughput.py [--grid 256] [--layers 100] [--sample 200]
Times `diagram()` on a grid x grid beta x alpha_SA diagram of a `layers`-layer spec (bert-base's shape,
post-LN GeLU, and paper 001's post-LN ReLU model), then the per-point route on `sample` random grid points:
(a) the engine alone, run_spec(spec, beta=b, skip_a=a) and the IA101/IA201 rules on its trace;
(b) diagnose.check() on the spec built at the point (what a user would script). Both are extrapolated to
the full grid and compared with the vectorised time.
"""

import argparse
import statistics
import time

import numpy as np

from initadvisor.stack import run_spec
from initadvisor.diagnose import check
from initadvisor.phase_diagram import diagram
from initadvisor.spec import Residual, load_spec

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def per_point_engine(spec, b, a):
    t = run_spec(spec, beta=b, skip_a=a)
    ent = (t.beta / t.beta_c).max() >= 1
    rank = t.rho.max() >= spec.thresholds["rank_collapse_rho"]
    return "entropy_collapse" if ent else "rank_collapse" if rank else "trainable"


def per_point_check(spec, b, a):
    s = spec.with_overrides(qk_beta=b, res_attention=Residual(a, spec.res_attention.block))
    codes = {f["code"] for f in check(s)["findings"]}
    return "entropy_collapse" if "IA201" in codes else "rank_collapse" if "IA101" in codes else "trainable"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=256)
    ap.add_argument("--layers", type=int, default=100)
    ap.add_argument("--sample", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = args.grid**2
    for name in ("bert-base", "paper001-fig1-bert60"):
        spec = load_spec(ROOT / "model_specs" / f"{name}.yaml").with_overrides(layers=args.layers)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = diagram(spec, grid=args.grid)
            times.append(time.perf_counter() - t0)
        vec = min(times)
        xs, ys = res["x"]["values"], res["y"]["values"]
        pts = [(int(rng.integers(len(ys))), int(rng.integers(len(xs)))) for _ in range(args.sample)]
        t0 = time.perf_counter()
        eng = [per_point_engine(spec, xs[i], ys[j]) for j, i in pts]
        t_eng = (time.perf_counter() - t0) / len(pts)
        k = max(10, len(pts) // 4)
        t0 = time.perf_counter()
        chk = [per_point_check(spec, xs[i], ys[j]) for j, i in pts[:k]]
        t_chk = (time.perf_counter() - t0) / k
        agree = sum(res["phase"][j][i] == p for (j, i), p in zip(pts, eng))
        agree_chk = sum(res["phase"][j][i] == p for (j, i), p in zip(pts[:k], chk))
        print(f"{name} ({spec.layers} layers, {spec.norm}-LN, {spec.activation}): {args.grid} x {args.grid} diagram")
        print(f"  vectorised diagram():        {vec:7.3f} s (best of {args.repeat}; median "
              f"{statistics.median(times):.3f} s; recommended region and the list-valued grids included)")
        print(f"  engine per point (run_spec): {t_eng * 1e3:7.2f} ms/point -> {t_eng * n:8.1f} s extrapolated "
              f"-> speed-up {t_eng * n / vec:6.0f}x   (phases agree on {agree}/{len(pts)} sampled points)")
        print(f"  diagnose.check per point:    {t_chk * 1e3:7.2f} ms/point -> {t_chk * n:8.1f} s extrapolated "
              f"-> speed-up {t_chk * n / vec:6.0f}x   (phases agree on {agree_chk}/{k})")


if __name__ == "__main__":
    main()
