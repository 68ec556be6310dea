"""Phase fidelity: `check`'s per-layer predictions against `verify`'s Monte-Carlo of the actual network, across
the attention phases.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/phase_fidelity.py [--layers 50] [--d 720] [--seeds 4]
                                                                  [--cells post:1.5:64:bi,...] [--json out.json]
                                                                  [--reports DIR]
                                                                  [--backend torch --device cuda]

Grid: norm {post, pre} x beta / beta_c at block 1 {0.25, 0.5, 0.7, 1.0, 1.5, 2.5} x T {64, 512} x {bidirectional,
causal}. The model is paper 001's encoder (1 head, ReLU MLP of width d, gains 0.2 on V and the MLP, MLP biases
0.02, no output projection, input correlation 0.03, unit embedding variance), `--layers` deep; beta is set with
init.qk_beta; d 720 is the width of issue 13's own simulation (at d 256 the width's fluctuations hold rho down past
beta_c: a narrower network is further from the engine's infinite-width law there). Prints per cell the largest error
over the layers of rho (absolute), the IPR (relative) and the gradient q normalised at the top (relative), with the
layer where it occurs and its size in the measurement's standard errors (|z|: past beta_c a post-LN gradient is
heavy-tailed over weight draws, and a large error with a small |z| is a draw, not the engine). --reports keeps each
cell's whole `verify` report (every layer) as DIR/<norm>-<ratio>-<T>-<bi|causal>.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

RATIOS = (0.25, 0.5, 0.7, 1.0, 1.5, 2.5)


def spec_for(norm: str, ratio: float, T: int, causal: bool, layers: int, d: int) -> dict:
    from initadvisor.spec import build_spec
    from initadvisor.stack import run_spec

    spec = {"name": f"{norm}-{ratio}-{T}-{'causal' if causal else 'bi'}",
            "model": {"layers": layers, "d_model": d, "heads": 1, "d_ff": d, "norm": norm, "activation": "relu",
                      "causal": causal, "out_proj": False},
            "sequence": {"length": T, "vocab": 50000, "input_correlation": 0.03},
            "init": {"std": 0.02, "embedding": {"std": 1.0}, "qk_beta": 1.0, "v": {"gain": 0.2},
                     "ff_in": {"gain": 0.2, "bias_std": 0.02}, "ff_out": {"gain": 0.2, "bias_std": 0.02}}}
    bc = float(run_spec(build_spec(spec)).beta_c[0])  # beta_c at block 1 does not depend on beta
    spec["init"]["qk_beta"] = ratio * bc
    return spec


def worst(layers: list[dict], key: str) -> tuple[float | None, int | None, float | None]:
    """The largest error over the layers, its layer, and its size in standard errors of the measurement (z)."""
    errs = [(abs(r[key]["error"]), r["index"], r[key].get("z")) for r in layers
            if key in r and r[key]["error"] is not None]
    return max(errs, key=lambda e: e[0]) if errs else (None, None, None)


def parse_cells(text: str) -> list[tuple[str, float, int, bool]]:
    """--cells: norm:ratio:T:bi|causal, comma-separated (empty: the whole grid); a ValueError naming a bad one."""
    if not text:
        return list(itertools.product(("post", "pre"), RATIOS, (64, 512), (False, True)))
    cells = []
    for cell in text.split(","):
        try:
            norm, ratio, T, kind = cell.split(":")
            if norm not in ("post", "pre") or kind not in ("bi", "causal") or not 2 <= int(T) <= 4096:
                raise ValueError
            cells.append((norm, float(ratio), int(T), kind == "causal"))
        except ValueError:
            raise ValueError(f"cell {cell!r}: expected norm:ratio:T:bi|causal, norm post or pre, T in 2-4096") from None
    return cells


def columns(layers: list[dict]) -> str:
    """A report's largest error of rho, the IPR and the gradient over the layers, each with its layer and |z|."""
    out = []
    for key, pct in (("rho", False), ("ipr", True), ("grad_q", True)):
        e, i, z = worst(layers, key)
        err = f"{'-':>8s}" if e is None else (f"{100 * e:7.1f}%" if pct else f"{e:8.3f}")
        out.append(f"{err} {i or 0:3d} {'' if z is None else f'{abs(z):5.1f}':>5s}")
    return " | ".join(out)


def main() -> int:
    import yaml

    from initadvisor.cli import main as cli

    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--d", type=int, default=720)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--cells", default="", help="comma-separated norm:ratio:T:bi|causal (default: the whole grid)")
    ap.add_argument("--json", default="")
    ap.add_argument("--reports", default="", help="a folder for each cell's whole verify report (JSON)")
    ap.add_argument("--backend", default="numpy", help="verify's backend: numpy, or torch (no IPR measured)")
    ap.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    args = ap.parse_args()
    try:
        cells = parse_cells(args.cells)
    except ValueError as e:
        print(f"phase_fidelity: {e}", file=sys.stderr)
        return 2
    print(f"{'norm':4s} {'b/bc':>5s} {'T':>4s} {'rows':6s} | {'rho err':>8s} {'@':>3s} {'|z|':>5s} | {'IPR err':>8s} "
          f"{'@':>3s} {'|z|':>5s} | {'grad err':>8s} {'@':>3s} {'|z|':>5s} | seconds", flush=True)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for norm, ratio, T, causal in cells:
            path = Path(tmp) / "spec.yaml"
            path.write_text(yaml.safe_dump(spec_for(norm, ratio, T, causal, args.layers, args.d)))
            t0 = time.perf_counter()
            import contextlib
            import io

            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                try:
                    cli(["verify", str(path), "--seeds", str(args.seeds), "--format", "json", "--backend", args.backend,
                         *(["--device", args.device] if args.backend == "torch" else [])])
                except SystemExit:
                    pass
            rep = json.loads(buf.getvalue())
            if args.reports:
                Path(args.reports).mkdir(parents=True, exist_ok=True)
                name = f"{norm}-{ratio}-{T}-{'causal' if causal else 'bi'}.json"
                (Path(args.reports) / name).write_text(json.dumps(rep, indent=1))
            row = {"norm": norm, "ratio": ratio, "T": T, "causal": causal, "seconds": time.perf_counter() - t0}
            for key in ("rho", "ipr", "grad_q"):
                row[key], row[key + "_layer"], row[key + "_z"] = worst(rep["layers"], key)
            out.append(row)
            print(f"{norm:4s} {ratio:5.2f} {T:4d} {'causal' if causal else 'bi':6s} | {columns(rep['layers'])} | "
                  f"{row['seconds']:.0f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
