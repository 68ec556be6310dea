"""How much of a phase-grid cell's gradient and IPR miss is its rho path: the engine run on the network's own mean rho.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/rho_forced.py post:2.5:512:causal --load FILE.npz [FILE.npz ...]

FILES are one cell's per-seed moments (`batched_grid.py --save`). The engine `verify` compares with (the
position-resolved one for causal cells, the pair engine with the walk's means else) runs again with a constant added
to every pair overlap after each block's last residual sum, set by a few fixed-point passes so that its rho is the
network's mean at every layer (to 1e-4); each layer its own operations, so that the constants differ by layer. Per
layer: the measured rho, gradient (normalised at the top, with its standard error) and IPR; the engine's error in rho,
and its gradient and IPR over the measured ones as they are and on the forced path. The gradient's slope in rho is
steep past beta_c (post-LN: d log g / d rho about -30 through the blocks above), so a rho within issue 13's 0.03 can
still move it by tens of percent; what stays on the forced path is the blocks' own maps at the right rho.
--field-law: with the causal rows' field law (ops.FIELD_LAW). --chain-walk N (post-LN causal cells): also the gradient
on the forced path with the finite T's own rho walk added to the walk's (which is the width's alone): the per-draw
variance of rho in the chain at infinite width (gram_chain.chain, N draws), each block adding what its slope does not
carry of it (var_(l+1) - a_l^2 var_l), as the walk's own moves are carried (walk.causal_factor). Asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import inspect
from contextlib import contextmanager
from dataclasses import replace
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batched_grid import NAMES, pooled  # noqa: E402
from phase_fidelity import parse_cells, spec_for  # noqa: E402

PASSES = 12


def measured(files: list[str], key: str, layers: int) -> dict[str, np.ndarray]:
    """`verify`'s pooled measurement of one cell's saved moments (several files: their seeds pooled)."""
    parts = {k: [] for k in NAMES}
    for f in files:
        with np.load(f) as z:
            for k in NAMES:
                if f"{key}/{k}" not in z.files:
                    raise ValueError(f"{f}: no moments of cell {key}")
                x = z[f"{key}/{k}"].astype(np.float64)
                if x.ndim != 2 or x.shape[1] != layers + (k != "y2"):
                    raise ValueError(f"{f}: cell {key} is not per-seed moments of {layers} layers")
                parts[k].append(x)
    return pooled({k: np.concatenate(v) for k, v in parts.items()})


def _fmt(x, fmt: str) -> str:
    """x formatted, or '-' where it is not a finite number (an underflowed measurement's ratio)."""
    return format(x, fmt) if np.isfinite(x) else "-".rjust(int(fmt.lstrip("+- ").split(".")[0] or 0))


def _over(a, b, fmt: str) -> str:
    """a / b formatted, or '-' where the measurement b is not positive."""
    return _fmt(a / b if b > 0 else np.nan, fmt)


def _worst(a, b) -> str:
    """The largest |a / b - 1| where the measurement b is positive, formatted ('-' where none is)."""
    ok = b > 0
    return _fmt(np.abs(a[ok] / b[ok] - 1.0).max() if ok.any() else np.nan, ".3f")


def forced_engine(spec):
    """(run, delta): run() gives the engine's (rho, gradient q normalised at the top, IPR) per layer with delta[l]
    added to every pair overlap after block l's last residual sum."""
    from initadvisor.core import ops
    from initadvisor.core.model import Stack, propagate
    from initadvisor.diagnose import causal_trace
    from initadvisor.stack import from_spec

    net = from_spec(spec)
    net = Stack(net.embeddings, tuple(copy.copy(P) for P in net.layers))  # each layer its own operations
    last = {id([o for o in b if isinstance(o, ops.Residual)][-1]): l for l, b in enumerate(net.blocks)}
    delta = np.zeros(len(net.blocks))
    moments, causal = ops.Residual.moments, ops.Residual.causal

    def shifted_moments(self, q, p, run=ops.moments_forward):
        qo, po, c = moments(self, q, p, run)
        l = last.get(id(self))
        return (qo, po + delta[l] * (run is ops.moments_forward), c) if l is not None else (qo, po, c)

    def shifted_causal(self, G, S):
        out, c = causal(self, G, S)
        l = last.get(id(self))
        return (replace(out, P=out.P + delta[l]) if l is not None else out), c

    def run():
        ops.Residual.moments, ops.Residual.causal = shifted_moments, shifted_causal
        try:
            ct = causal_trace(net, backward=True)
            if ct is not None:
                return ct.rho_mean, ct.grad_q / ct.grad_q[-1], ct.y2.mean(axis=1)
            t = propagate(net, means=True)
            return np.ravel(t.rho), np.ravel(t.grad_q) / np.ravel(t.grad_q)[-1], np.ravel(t.y2)
        finally:
            ops.Residual.moments, ops.Residual.causal = moments, causal

    return run, delta


def force(run, delta, target, passes: int = PASSES):
    """Set delta (in place) so that run()'s rho is `target` at every layer; returns run() there. q after a post-LN norm
    is 1 and pre-LN's changes slowly, so each block's increment of the miss moves rho about 1:1."""
    rho, g, y = run()
    for _ in range(passes):
        delta += np.diff(target - rho)
        rho, g, y = run()
    return rho, g, y


# walk.causal_factor's lines that --chain-walk extends: the walk's variance per index, and the columns of the
# gradient's covariance that each block's moves add
_WALK_LINES = (
    ("V.append(min(a[l] ** 2 * V[l] + sum(s * s * x for s, x in zip(slope[1:], var)), (1.0 - r[0]) * (1.0 + r[0])))",
     "V.append(min(a[l] ** 2 * V[l] + sum(s * s * x for s, x in zip(slope[1:], var)) + (_ADDED.append(max(_CHAIN[l + 1]"
     " - a[l] ** 2 * _CHAIN[l], 0.0)) or _ADDED[l]), (1.0 - r[0]) * (1.0 + r[0])))"),
    ("for s, x, u in zip(slopes, var, us)])",
     "for s, x, u in zip(slopes, var, us)] + [_tangent((_root(_ADDED[l]), MR))])"),
)


@contextmanager
def chain_walk(var: np.ndarray):
    """walk.causal_factor with the per-index variance `var` of the sequences' rho that the finite T makes (the chain's
    at infinite width) in its walk: each block adds max(var_(l+1) - a_l^2 var_l, 0) to the walk's variance at its
    output, and to the gradient's covariance the column sqrt(that) M_l R_(l+1) (a move of the block's output rho)."""
    from initadvisor.core import walk

    src = inspect.getsource(walk.causal_factor)
    for old, new in _WALK_LINES:
        if src.count(old) != 1:
            raise RuntimeError("walk.causal_factor changed: update rho_forced._WALK_LINES")
        src = src.replace(old, new)
    added: list = []
    ns = dict(vars(walk), _CHAIN=var, _ADDED=added)
    exec(compile(src, walk.__file__, "exec"), ns)
    original, extended = walk.causal_factor, ns["causal_factor"]

    def factor(*args, **kwargs):
        added.clear()
        return extended(*args, **kwargs)

    walk.causal_factor = factor
    try:
        yield
    finally:
        walk.causal_factor = original


def chain_variance(raw: dict, draws: int) -> np.ndarray:
    """The per-index variance over draws of rho in the chain at infinite width (gram_chain.chain, rng seed 0)."""
    from gram_chain import chain

    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    q0, p0 = from_spec(build_spec(raw)).embeddings.moments()
    rho, _ = chain(raw, q0, p0, draws, np.random.default_rng(0), batch=min(draws, 32))
    return rho.var(axis=0, ddof=1)


def main() -> int:
    from initadvisor.spec import SpecError, build_spec

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cell", help="norm:ratio:T:bi|causal")
    ap.add_argument("--load", nargs="+", required=True, help="the cell's per-seed moments (batched_grid.py --save)")
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--d", type=int, default=720)
    ap.add_argument("--passes", type=int, default=PASSES, help="fixed-point passes onto the measured rho")
    ap.add_argument("--field-law", action="store_true", help="the causal rows' field law on (ops.FIELD_LAW)")
    ap.add_argument("--chain-walk", type=int, default=0, metavar="N",
                    help="also with the finite T's rho walk, from N draws of the chain at infinite width")
    args = ap.parse_args()
    try:
        if args.layers < 1 or args.d < 2 or args.passes < 0 or args.chain_walk < 0:
            raise ValueError("--layers >= 1, --d >= 2, --passes >= 0, --chain-walk >= 0")
        (cell,) = parse_cells(args.cell)
        if args.chain_walk and (cell[0] != "post" or not cell[3]):
            raise ValueError("--chain-walk: post-LN causal cells only (the position-resolved walk's)")
        if args.chain_walk == 1:
            raise ValueError("--chain-walk: at least 2 draws")
        key = f"{cell[0]}:{cell[1]}:{cell[2]}:{'causal' if cell[3] else 'bi'}"
        m = measured(args.load, key, args.layers)
        raw = spec_for(*cell, args.layers, args.d)
        spec = build_spec(raw)
    except (ValueError, OSError, SpecError) as e:
        print(f"rho_forced: {e}", file=sys.stderr)
        return 2
    from initadvisor.core import ops

    law = ops.FIELD_LAW
    ops.FIELD_LAW = args.field_law
    try:
        run, delta = forced_engine(spec)
        rho_m, g_m, g_se, y_m = m["rho"], m["grad_q_norm"], m["grad_q_norm_se"], m["y2"]
        rho0, g0, y0 = run()
        rho, g, y = force(run, delta, rho_m, args.passes)
        gt = None
        if args.chain_walk:
            with chain_walk(chain_variance(raw, args.chain_walk)):
                gt = run()[1]
    finally:
        ops.FIELD_LAW = law
    print(f"{key}, {m['seeds']} seeds{', field law' if args.field_law else ''}: largest |rho - measured| "
          f"{np.abs(rho0 - rho_m).max():.4f} as it is, {np.abs(rho - rho_m).max():.1e} forced; largest |gradient "
          f"error| {_worst(g0, g_m)} as it is, {_worst(g, g_m)} forced"
          + ("" if gt is None else f", {_worst(gt, g_m)} forced with the finite T's walk"))
    print(f"{'layer':>5s} {'rho':>7s} {'err':>7s} | {'gradient':>10s} {'se':>5s} {'engine':>7s} {'forced':>7s}"
          + ("" if gt is None else f" {'+T walk':>7s}") + f" | {'IPR':>6s} {'engine':>7s} {'forced':>7s}")
    for i in range(len(rho_m)):
        ipr = f"{_fmt(y_m[i], '6.3f')} {_over(y0[i], y_m[i], '7.3f')} {_over(y[i], y_m[i], '7.3f')}" if i < len(y_m) else ""
        print(f"{i:5d} {_fmt(rho_m[i], '7.4f')} {_fmt(rho0[i] - rho_m[i], '+7.4f')} | {_fmt(g_m[i], '10.4g')} "
              f"{_over(g_se[i], g_m[i], '5.1%')} "
              f"{_over(g0[i], g_m[i], '7.3f')} {_over(g[i], g_m[i], '7.3f')}"
              + ("" if gt is None else f" {_over(gt[i], g_m[i], '7.3f')}") + f" | {ipr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
