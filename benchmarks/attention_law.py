"""What the causal engine predicts when its attention rows are exact at its own state: every causal attention's output
overlaps and IPR replaced by Gaussian rows sampled at the engine's state, the rest of the engine unchanged, scored
against batched_grid.py's saved per-seed moments (rho and the IPR; the gradient is not compared, since the backward
still reads the engine's own rows).

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/attention_law.py FILE.npz [...] [--draws 32] [--layers 50] [--d 720]
                                                                            [--every 3] [--walk]

The rows: the state's overlaps at full resolution C (T x T, every group's mean pair), scores S = g L Z L^T (L L^T =
C, Z i.i.d. N(0, 1), g^2 the query and key gains' product), so that Cov(S_tk, S_t'k') = g^2 C_tt' C_kk', as fresh
W_Q, W_K give two tokens' scores at infinite width; the causal softmax's A, and the output overlaps g_v E[A C A^T]
(W_V's expectation) and the rows' IPR, averaged over `--draws` draws and then over each pair of position groups as
the engine's state holds them. On the network's own states at 2.5 beta_c, T 512 (24 sequences, blocks 29 and 41)
these rows give each block's attention half within 1.6 per 1000 of the network's by pair of position bands, where
the engine's laws are up to 7.5 off. Paper 001's encoder only (no biases on Q, K, V, no rotary or QK norm, no
attention dropout); at T 512 about 0.7 s a layer at 32 draws. Prints per cell the largest error over the layers of
rho and the IPR, engine and exact rows, and every `--every`-th layer's values. --walk: the exact rows' rho and IPR
also moved by the pair engine's walk shift (walk.mean_shift: what the sequences' spread at width d does to the
means, which the position-resolved engine does not carry), as a third column. Asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_forced import group_state  # noqa: E402
from phase_fidelity import spec_for, worst  # noqa: E402


def law_rows(C: np.ndarray, g: float, g_v: float, draws: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(g_v E[A C A^T], E[Y2] per row) of causal softmax rows over scores g L Z L^T (module docstring)."""
    T = C.shape[0]
    ev, V = np.linalg.eigh(C)
    L = V * np.sqrt(np.maximum(ev, 0.0))
    later = ~np.tril(np.ones((T, T), dtype=bool))
    out, y2 = np.zeros((T, T)), np.zeros(T)
    for _ in range(draws):
        S = g * (L @ rng.standard_normal((T, T)) @ L.T)
        S[later] = -np.inf
        E = np.exp(S - S.max(axis=1, keepdims=True))
        A = E / E.sum(axis=1, keepdims=True)
        out += A @ C @ A.T
        y2 += (A * A).sum(axis=1)
    return g_v * out / draws, y2 / draws


@contextmanager
def exact_rows(draws: int, seed: int = 0):
    """Within: Attention.causal's output overlaps (and its rows' IPR) are law_rows' at the state it is given."""
    from initadvisor.core.ops import Attention

    engine = Attention.causal
    rng = np.random.default_rng(seed)

    def causal(self, G, S):
        O, rows = engine(self, G, S)
        P = self.P
        if P.q_bias or P.b_v2 or P.rope_theta or P.qk_norm != "none" or P.attn_dropout or P.centered or P.alibi:
            raise SystemExit("attention_law: paper 001's encoder only (no Q/V biases, rotary, QK norm, dropout)")
        C = S.P[G.gid][:, G.gid]
        np.fill_diagonal(C, S.qf)
        out, y2 = law_rows(C, float(np.sqrt(P.g_q * P.g_k)), float(P.g_v), draws, rng)
        return dataclasses.replace(O, qf=np.diag(out).copy(), P=group_state(G, out).P), dataclasses.replace(rows, y2=y2)

    Attention.causal = causal
    try:
        yield
    finally:
        Attention.causal = engine


def main() -> int:
    from initadvisor.core.model import propagate
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec
    from initadvisor.verification import compare, pool_seeds, theory_of

    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", help="batched_grid.py --save files (causal cells are scored)")
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--d", type=int, default=720)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--walk", action="store_true")
    args = ap.parse_args()
    if args.draws < 1 or args.layers < 1 or args.d < 2 or args.every < 1:
        print("attention_law: bad arguments: --draws, --layers, --every at least 1, --d at least 2", file=sys.stderr)
        return 2
    for f in args.files:
        try:
            with np.load(f) as z:
                saved = {k: z[k].astype(np.float64) for k in z.files}
        except (OSError, ValueError) as e:
            print(f"attention_law: {f}: {e}", file=sys.stderr)
            return 2
        for key in sorted({k.split("/")[0] for k in saved if k.endswith(":causal/q")}):
            norm, ratio, T, _ = key.split(":")
            x = [saved.get(f"{key}/{k}") for k in ("q", "p", "gq", "gp", "y2")]
            if any(v is None or v.ndim != 2 or len(v) != len(x[0]) or v.shape[1] != args.layers + (k < 4)
                   for k, v in enumerate(x)):
                print(f"attention_law: {f}: cell {key}: not batched_grid.py's per-seed moments at --layers "
                      f"{args.layers}", file=sys.stderr)
                return 2
            spec = build_spec(spec_for(norm, float(ratio), int(T), True, args.layers, args.d))
            fields = ("q", "p", "grad_q", "grad_p", "y2")
            m = pool_seeds([dict(zip(fields, (v[i] for v in x))) for i in range(len(x[0]))])
            reps = {}
            trace, resolved = theory_of(spec)
            reps["engine"] = compare(spec, trace, m, theory=resolved)["layers"]
            with exact_rows(args.draws):
                trace, resolved = theory_of(spec)
            reps["exact rows"] = compare(spec, trace, m, theory=resolved)["layers"]
            if args.walk:  # the pair engine's means over sequences less its mean field: rho's shift, the IPR's
                net = from_spec(spec)
                means, field = propagate(net, backward=False, means=True), propagate(net, backward=False)
                shifted = dict(resolved, rho=resolved["rho"] + means.rho - field.rho,
                               ipr=resolved["ipr"] + means.y2 - field.y2)
                reps["+ walk"] = compare(spec, trace, m, theory=shifted)["layers"]
            print(f"{key}, {m['seeds']} seeds, {args.draws} draws: largest error (rho, IPR) "
                  + "; ".join(f"{name} {worst(r, 'rho')[0]:.3f} @{worst(r, 'rho')[1]}, "
                              f"{100 * worst(r, 'ipr')[0]:.1f}% @{worst(r, 'ipr')[1]}" for name, r in reps.items()))
            names = " / ".join(reps)
            for i in range(0, args.layers + 1, args.every):
                rows = [r[i] for r in reps.values()]
                line = f"  {i:3d} rho " + " / ".join(f"{r['rho']['theory']:.4f}" for r in rows)
                line += f" / {rows[0]['rho']['measured']:.4f}"
                if "ipr" in rows[0]:
                    line += "  IPR " + " / ".join(f"{r['ipr']['theory']:.4g}" for r in rows)
                    line += f" / {rows[0]['ipr']['measured']:.4g}"
                print(line + f"  ({names} / network)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
