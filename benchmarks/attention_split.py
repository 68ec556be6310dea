"""Where a causal block's per-band gradient error forms: the engine's operations on the network's own states, the
attention's value path split into its rows' own and cross-row parts, and two rows' overlap behind the latter.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/attention_split.py post:1.5:64 [--sequences 128]
                                                                   [--blocks 33,30,24,21,18] [--layers 50] [--d 720]

One causal cell of phase_fidelity.py's grid (paper 001's encoder). The numpy network runs `--sequences` sequences
(rng seeds [9, i], as teacher_forced.py) and keeps, at the chosen blocks, the mean over them of the stream's Gram at
every operation's input and of the gradient's, and of the attention's A A^T, sum_t A_ts^2 |do_t|^2 / d (the value
path's rows' own part) and |A^T do|_s^2 / d (the whole value path before W_V; do the gradient at the attention's
output). Printed per block, by bands of positions 0-3, 4-31, 32-127, 128-T:
- each operation's backward (the engine's, from the network's gradient at its output and its cache from the network's
  input Gram) against the network's gradient at its input: which operation carries a band's error;
- the value path (causal.mix_backward_rows on the network's states): whole, rows' own part (the gradient's pairs
  zeroed), cross-row part, engine / network;
- two rows' overlap sum_s A_ts A_t's by bands of (earlier row, later row): the engine's (its annealed law, the rows'
  `shared` + 1 / max(t, t')), the exact pair law at the earlier row's keys times m_t / m_t'
  (softmax_rows.expected_overlap at the rows' query correlation), the network's;
- the forward: each operation's output overlaps (its `causal` map from the network's input Gram) less the network's,
  by pairs of bands, beside the network's own change; and how much of each row band's attention goes to each band of
  keys (E[A], the engine's key shares), engine against network.
Full position resolution (T <= 512 is practical). Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from phase_fidelity import parse_cells, spec_for  # noqa: E402
from attention_forced import band_means, group_state  # noqa: E402
from teacher_forced import bands_of  # noqa: E402


def measure(net, blocks: list[int], sequences: int, d: int) -> dict[str, np.ndarray]:
    """The network's mean states at the chosen blocks (module docstring)."""
    from initadvisor.core.ops import Attention, Residual
    from initadvisor.simulate import init_network, make_input

    ops0 = net.blocks[0]
    if not (isinstance(ops0[0], Residual) and isinstance(ops0[0].branches[0][1][0], Attention)):
        raise SystemExit("not paper 001's encoder: the first operation is not attention's residual")
    T, nops, nb = net.embeddings.seq_len, len(ops0), len(blocks)
    out = {k: np.zeros((nb, nops + 1, T, T)) for k in ("C", "D")}
    out.update({k: np.zeros((nb, T, T)) for k in ("Y", "Do", "EA")} | {k: np.zeros((nb, T)) for k in ("own", "value")})
    at = {k: i for i, k in enumerate(blocks)}
    for s in range(sequences):
        rng = np.random.default_rng([9, s])
        W = init_network(net, rng)
        h = make_input(net, 1, rng)
        xs, caches = [], []
        for k, ops in enumerate(net.blocks):
            xk, ck = [h], []
            for op in ops:
                h, c = op.forward(h, W[k], rng)
                xk.append(h)
                ck.append(c)
            xs.append(xk if k in at else None)
            caches.append(ck)
        g = rng.standard_normal(h.shape)
        for k in range(len(net.blocks) - 1, -1, -1):
            gk = [g]
            for op, c in zip(reversed(net.blocks[k]), reversed(caches[k])):
                g = op.backward(g, W[k], c, None)
                gk.append(g)
            if k not in at:
                continue
            b, gk = at[k], gk[::-1]  # the gradient at each operation's input, then the block's output
            for j in range(nops + 1):
                out["C"][b, j] += xs[k][j][0] @ xs[k][j][0].T / d
                out["D"][b, j] += gk[j][0] @ gk[j][0].T / d
            res = net.blocks[k][0]
            A = caches[k][0][1][0][0]["a"][0, 0]  # (T, T): its one head
            do = res.branches[0][0] * gk[1][0]  # the gradient at the attention's output (its dropout at rate 0)
            dv = A.T @ do
            out["own"][b] += (A * A).T @ ((do * do).sum(-1) / d)
            out["value"][b] += (dv * dv).sum(-1) / d
            out["Y"][b] += A @ A.T
            out["EA"][b] += A
            out["Do"][b] += do @ do.T / d
    return {k: v / sequences for k, v in out.items()}


def forward_errors(ops, C, bands) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per operation of one block: (the engine's output overlap from the network's input Gram less the network's
    output Gram, the network's own change), each by pair of bands (attention_forced.band_means)."""
    from initadvisor.core import causal as cz

    G = cz._grid(C.shape[-1], C.shape[-1], 1.1)
    edges = [a for a, _ in bands] + [bands[-1][1]]
    return [(band_means(op.causal(G, group_state(G, C[j]))[0].P - C[j + 1], edges), band_means(C[j + 1] - C[j], edges))
            for j, op in enumerate(ops)]


def _bad(message: str) -> int:
    print(f"attention_split: bad arguments: {message}", file=sys.stderr)
    return 2


def main() -> int:
    from initadvisor.core import causal as cz
    from initadvisor.core.softmax_rows import expected_overlap
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("cell", help="norm:ratio:T (causal)")
    ap.add_argument("--sequences", type=int, default=128)
    ap.add_argument("--blocks", default="33,30,24,21,18")
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--d", type=int, default=720)
    args = ap.parse_args()
    try:
        (norm, ratio, T, _), = parse_cells(args.cell + ":causal")
    except ValueError:
        return _bad(f"cell {args.cell!r}: expected norm:ratio:T, norm post or pre, T in 2-4096")
    try:
        blocks = [int(b) for b in args.blocks.split(",")]
    except ValueError:
        return _bad(f"--blocks {args.blocks!r}: expected integers")
    if args.sequences < 1 or args.d < 1 or not all(0 <= b < args.layers for b in blocks) or len(set(blocks)) < len(blocks):
        return _bad(f"--sequences and --d at least 1, --blocks distinct within 0-{args.layers - 1}")
    net = from_spec(build_spec(spec_for(norm, ratio, T, True, args.layers, args.d)))
    M = measure(net, blocks, args.sequences, args.d)
    G = cz._grid(T, T, 1.1)
    BANDS = bands_of(T)
    t = np.arange(T)
    m = t + 1.0
    off = ~np.eye(T, dtype=bool)

    def band(x):
        return np.array([x[a:b].mean() for a, b in BANDS])

    def versus(e, n):
        return " ".join(f"{x:.4g}/{y:.4g} ({x / y - 1:+.1%})" for x, y in zip(band(e), band(n)))

    names = [type(op).__name__ for op in net.blocks[0]]
    print(f"{args.cell}, {args.sequences} sequences; bands {BANDS}")
    for b, k in enumerate(blocks):
        C, D = M["C"][b], M["D"][b]
        print(f"block {k}: input rho {C[0][off].mean() / np.diag(C[0]).mean():.3f}")
        for j, op in enumerate(net.blocks[k]):
            _, cache = op.causal(G, group_state(G, C[j]))
            back = op.causal_backward(G, group_state(G, D[j + 1]), cache)
            ref = np.diag(D[j])
            print(f"  {names[j]:9s} gain {ref.mean() / np.diag(D[j + 1]).mean():.4f}, engine / network - 1 by band: "
                  + " ".join(f"{e / n - 1:+.2%}" for e, n in zip(band(back.qf), band(ref))))
            if j == 0:
                rows = cache[1][0][0]
        print("  forward, engine - network / the network's change (x1000), pairs by band (earlier band x later band):")
        upper = np.triu_indices(len(BANDS))
        for j, (err, change) in enumerate(forward_errors(net.blocks[k], C, BANDS)):
            print(f"    {names[j]:9s} " + "  ".join(f"{1000 * e:+.2f}/{1000 * c:.2f}" for e, c in
                                               zip(err[upper], change[upper])))
        ea = rows.shares[0] / m[:, None] if rows.shares is not None else np.tril(np.ones((T, T))) / m[:, None]
        print("  E[A] on each band of keys (rows' band: keys' bands), engine / network")
        for a0, a1 in BANDS:
            print(f"    [{a0}:{a1}] " + " ".join(f"{np.tril(ea)[a0:a1, b0:b1].sum(1).mean():.3f}/"
                                          f"{M['EA'][b][a0:a1, b0:b1].sum(1).mean():.3f}" for b0, b1 in BANDS))
        gS = group_state(G, M["Do"][b])
        share = None if rows.shares is None else rows.shares[1]
        whole = cz.mix_backward_rows(G, gS, rows.y2, 0.0, rows.shared, share)
        own = cz.mix_backward_rows(G, cz.State(gS.qf, np.zeros_like(gS.P)), rows.y2, 0.0, rows.shared, share)
        print(f"  value path A^T do, engine / network: whole {versus(whole.qf, M['value'][b])}")
        print(f"    rows' own  {versus(own.qf, M['own'][b])}")
        print(f"    cross-row  {versus(whole.qf - own.qf, M['value'][b] - M['own'][b])}")
        att = net.blocks[k][0].branches[0][1][0]
        s = cz.row_std(att.P.beta, rows.beta_c, rows.qk[0])
        q = np.diag(C[0])
        c = np.clip(C[0] / np.sqrt(np.outer(q, q)), 0.0, 1.0)
        lo, hi = np.minimum.outer(t, t), np.maximum.outer(t, t)
        exact = expected_overlap(s[lo], m[lo], c) * m[lo] / m[hi]
        engine = rows.shared + 1.0 / m[hi]
        print("  two rows' overlap (earlier band x later band): engine / exact law / network")
        for i, (a0, a1) in enumerate(BANDS):
            cells = []
            for b0, b1 in BANDS[i:]:
                sel = np.zeros((T, T), dtype=bool)
                sel[a0:a1, b0:b1] = True
                sel &= t[:, None] < t[None, :]
                if sel.any():
                    cells.append(f"[{a0}:{a1}]x[{b0}:{b1}] {engine[sel].mean():.4f}/{exact[sel].mean():.4f}/"
                                 f"{M['Y'][b][sel].mean():.4f}")
            print("    " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
