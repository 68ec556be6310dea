"""Every HuggingFace family of tests/test_reality.py at other shapes than the test's one: real, randomly initialised
`transformers` models against `check`, per layer (q, rho over all pairs and the late third, gradient ratio).

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/reality_sweep.py [--shapes small,std2,wide] [--families llama,olmo2]
       [--seeds 8]

Shapes (d_model, layers, heads, T, factor on the init std): small (128, 12, 2, 64, 1), std2 (256, 12, 4, 128, 2),
wide (512, 8, 8, 256, 1), gain (512, 8, 8, 256, 2.83: std 0.0566 at d 512 gives the gains of std 0.02 at d 4096),
long (128, 8, 2, 2048, 1: past the full-resolution engine's reach for windows and ALiBi, so `check` resolves their
late tokens by distance), t512 (256, 12, 4, 512, 1: issue 12's own size at a longer sequence).
Prints one line per family and shape: the largest error of each quantity, its index, the gradient's in standard
errors (z), block 1's beta, and a flag per quantity beyond issue 12's tolerances (q 15%, rho 0.05, gradient 25%):
Q, R (all pairs), L (late third), G. Asserts nothing; a family the shape cannot express prints its error.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SHAPES = {"small": (128, 12, 2, 64, 1.0), "std2": (256, 12, 4, 128, 2.0), "wide": (512, 8, 8, 256, 1.0),
          "gain": (512, 8, 8, 256, 2.83), "long": (128, 8, 2, 2048, 1.0), "t512": (256, 12, 4, 512, 1.0)}


def sweep_one(R, family: str, factor: float, seeds: int) -> str:
    import transformers

    from initadvisor.diagnose import check
    from initadvisor.hf import import_config
    from initadvisor.stack import run_spec
    from initadvisor.torch import build_hf, measure

    cfg = R._config(family)
    if factor != 1.0:
        key = next(k for k in ("initializer_factor", "init_std", "initializer_range") if hasattr(cfg, k))
        setattr(cfg, key, getattr(cfg, key) * factor)
    with tempfile.TemporaryDirectory() as tmp:
        cfg.save_pretrained(tmp)
        spec, _ = import_config(Path(tmp) / "config.json", seq_len=R.T)
    rep = check(spec)
    rows = rep["layers"]
    q, rho, g = (np.array([r[k] for r in rows]) for k in ("q", "rho", "grad_q"))
    late = np.array(rep["causal"]["rho_late"]) if rep["causal"] else run_spec(spec).rho
    impl = "sdpa" if spec.causal and not family.startswith(("gemma2", "bloom")) else "eager"
    m = measure(build_hf(cfg, transformers.AutoModel, attn_implementation=impl), R.T, batch=2, seeds=seeds,
                attentions=False)
    eq, er = np.abs(q / m["q"] - 1), np.abs(rho - m["rho"])
    el = np.abs(late - m["rho_thirds"][:, 2])
    eg = np.abs(g[:-1] / m["grad_q_norm"][:-1] - 1)
    z = np.abs(g[:-1] - m["grad_q_norm"][:-1]) / np.maximum(m["grad_q_norm_se"][:-1], 1e-300)
    flags = "".join(f for f, bad in (("Q", eq.max() > 0.15), ("R", er.max() > 0.05), ("L", el.max() > 0.05),
                                     ("G", eg.max() > 0.25)) if bad)
    k = int(eg.argmax())
    return (f"q {eq.max():.3f}@{eq.argmax():2d} rho {er.max():.3f}@{er.argmax():2d} late {el.max():.3f}@"
            f"{el.argmax():2d} grad {eg.max():.3f}@{k:2d} (z {z[k]:.1f}) beta {rows[1]['beta']:.3f} {flags}")


def main() -> None:
    import test_reality as R
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="small,std2,wide")
    ap.add_argument("--families", default=",".join(R.FAMILIES))
    ap.add_argument("--seeds", type=int, default=8)
    args = ap.parse_args()
    unknown = [x for x in args.shapes.split(",") if x not in SHAPES]
    if unknown:
        ap.error(f"unknown shape {unknown[0]!r} (known: {', '.join(SHAPES)})")
    torch.set_num_threads(1)
    for shape in args.shapes.split(","):
        R.D, R.L, R.HEADS, R.T, factor = SHAPES[shape]
        for family in args.families.split(","):
            t0 = time.perf_counter()
            try:
                line = sweep_one(R, family, factor, args.seeds)
            except Exception as e:  # a shape the family's import refuses (e.g. T5's initializer_factor != 1)
                line = f"error {type(e).__name__}: {str(e)[:160]}"
            print(f"{shape:6s} {family:15s} {line} [{time.perf_counter() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
