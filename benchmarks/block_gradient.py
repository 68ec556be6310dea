"""One block's gradient gain in the network against the same block with weights that do not see its gradient.

Usage: python benchmarks/block_gradient.py post:2.5:512:bi [--sequences 256] [--layers 8] [--blocks 2,4] [--d 720]

One bidirectional cell of phase_fidelity.py's grid, in batched_grid.py's PyTorch encoder (each sequence its own
weights). At each chosen block l the gain of the gradient's q (index l over index l + 1) five ways, with its mean
over sequences and standard error: the network's own block (what `verify` measures); a fresh block (independent
weights) on the same stream h_l fed the network's own gradient at index l + 1; the same with that gradient's tokens
shuffled; the same fed an isotropic gradient (G ~ N(0, 1)); the network's own block fed an isotropic gradient; then
the engine's block gain at the sequences' mean rho there (gradient q 1, p 0: the isotropic case). The engine takes
the gradient independent of the block's own weights (the mean field's assumption): "own" against "own, isotropic"
(paired: same weights, same stream) tests it. A fresh block fed the network's gradient is not that test: the gradient
is enriched along each token's own h_(l + 1), which the own block's last norm removes exactly and a fresh block's
norms do not, so it reads more than either. Asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import batched_grid as bg  # noqa: E402
from phase_fidelity import parse_cells, spec_for  # noqa: E402


def block_gains(cell, sequences: int, layers: int, blocks: list[int], d: int, seed: int = 11) -> dict:
    """Per chosen block: (means, standard errors) over sequences of [own, fresh, fresh shuffled, fresh isotropic,
    own isotropic gain, the stream's rho at the block], and the engine's block gain at that mean rho (isotropic
    gradient)."""
    import torch

    from initadvisor.core.ops import moments_backward, moments_forward, spread_forward
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    spec = build_spec(spec_for(*cell, 50, d))
    s, T = bg.stds(spec), spec.seq_len
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    def q(g):
        return (g.double() ** 2).mean((1, 2))

    def gain(h, W, G):  # the gradient's q at h over G's, G fed at the block's output
        h = h.detach().requires_grad_(True)
        (g,) = torch.autograd.grad((bg.block(h, W, True)[0] * G).sum(), h)
        return (q(g) / q(G)).numpy()

    out = {b: [] for b in blocks}
    B = 8
    for _ in range(max(1, sequences // B)):
        x = math.sqrt(0.03) * normal(B, 1, d, std=math.sqrt(2.0)) + math.sqrt(0.97) * normal(B, T, d, std=math.sqrt(2.0))
        hs, Ws = [bg._layernorm(x).requires_grad_(True)], []
        for _ in range(layers):
            Ws.append(bg.block_weights(B, d, s, normal))
            hs.append(bg.block(hs[-1], Ws[-1], True)[0])
        grads = torch.autograd.grad((hs[-1] * torch.randn(hs[-1].shape, generator=gen)).sum(), hs)
        for b in blocks:
            G, Wf = grads[b + 1], bg.block_weights(B, d, s, normal)
            qq, pp = bg._moments(hs[b].detach())
            out[b].append(np.stack([(q(grads[b]) / q(G)).numpy(), gain(hs[b], Wf, G),
                                    gain(hs[b], Wf, G[:, torch.randperm(T, generator=gen)]),
                                    gain(hs[b], Wf, torch.randn(G.shape, generator=gen)),
                                    gain(hs[b], Ws[b], torch.randn(G.shape, generator=gen)), (pp / qq).numpy()], 1))
    ops = from_spec(spec).blocks[0]
    result = {}
    for b in blocks:
        r = np.concatenate(out[b])
        m = r.mean(0)
        caches = spread_forward(ops, None, moments_forward(ops, 1.0, float(m[5]))[2])[1]
        result[b] = (m, r.std(0, ddof=1) / math.sqrt(len(r)), float(moments_backward(ops, 1.0, 0.0, caches)[0]))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cell", help="norm:ratio:T:bi (post-LN)")
    ap.add_argument("--sequences", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8, help="the stack's depth (the gradient enters at its top)")
    ap.add_argument("--blocks", default="2,4")
    ap.add_argument("--d", type=int, default=720)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    try:
        cells = parse_cells(args.cell)
        try:
            blocks = [int(x) for x in args.blocks.split(",")]
        except ValueError:
            raise ValueError(f"--blocks {args.blocks!r}: comma-separated block indices, e.g. 2,4") from None
        if len(cells) != 1 or cells[0][0] != "post" or cells[0][3]:
            raise ValueError(f"cell {args.cell!r}: one post-LN bidirectional cell, e.g. post:2.5:512:bi")
        if args.sequences < 8 or args.d < 2 or not 0 <= min(blocks) <= max(blocks) < args.layers:
            raise ValueError("--sequences >= 8, --d >= 2, --blocks in 0 .. --layers - 1")
    except ValueError as e:
        print(f"block_gradient: bad arguments: {e}", file=sys.stderr)
        sys.exit(2)
    t0 = time.time()
    res = block_gains(cells[0], args.sequences, args.layers, blocks, args.d, args.seed)
    print(f"{args.cell}, d {args.d}, {args.layers} layers, {8 * max(1, args.sequences // 8)} sequences, "
          f"{time.time() - t0:.0f} s")
    print("block    rho | own            fresh          fresh, shuffled  fresh, isotropic own, isotropic | engine")
    for b, (m, se, engine) in res.items():
        cols = "  ".join(f"{m[k]:.4f} +- {se[k]:.4f}" for k in range(5))
        print(f"{b:5d} {m[5]:.4f} | {cols} | {engine:.4f}")


if __name__ == "__main__":
    main()
