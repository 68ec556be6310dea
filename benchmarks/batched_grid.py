"""Issue 13's phase grid against an independent Monte-Carlo: paper 001's encoder transcribed in PyTorch from its
definition, many initialisations in one batch (each its own weights and one sequence), so that a GPU measures a
cell at thousands of seeds in seconds.

Usage: python benchmarks/batched_grid.py [--device cuda] [--seeds 1024] [--cells post:2.5:512:bi,...]
                                         [--layers 50] [--d 720] [--save FILE.npz] [--load FILE.npz ...]
                                         [--field-law]

The network is `phase_fidelity.py`'s (its `spec_for`; the weights' standard deviations are read from the spec's
`draws`): inputs x_t = sqrt(0.03) c + sqrt(0.97) e_t with c, e_t ~ N(0, 2 I), a norm-free LayerNorm after them in
post-LN; per block Q, K, V without biases, scores q.k / sqrt(d), the causal mask, softmax, A V with no output
projection; the MLP relu(u W1 + b1) W2 + b2; post-LN x -> LN(x + f(x)) after attention and after the MLP, pre-LN x ->
x + f(LN(x)). Measured per seed as `initadvisor.simulate` does: q and p of every stream index, each block's mean
IPR over its rows, and the moments of the gradient of sum(h_L * G), G ~ N(0, 1); written independently of
`simulate` and `initadvisor.torch`, so that it checks them as well as the engine (tests/test_batched_grid.py
checks it against `simulate`). Scored like `verify` (`verification.compare`, standard errors over seeds): per cell
the largest error over the layers of rho (absolute), the IPR and the gradient q normalised at the top (relative),
with its layer and |z|. `--save` keeps the per-seed moments, `--load` scores saved ones (files of several runs of
one cell pool their seeds). float32 with TF32 off; about 14 ms a seed at T 512 and 3 ms at T 64 on an H200 (50
layers, d 720); on a CPU use a few seeds and a small `--d`. Asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib

import numpy as np

from phase_fidelity import columns, parse_cells, spec_for

NAMES = ("q", "p", "y2", "gq", "gp")


def stds(spec) -> dict[str, float]:
    """The encoder's weight standard deviations, as the project's network draws them."""
    from initadvisor.core.ops import leaves
    from initadvisor.stack import from_spec

    drawn = {name: std for op in leaves(from_spec(spec).blocks[0]) for name, _, std, _ in op.draws()}
    if set(drawn) != {"wq", "wk", "wv", "w_in", "w_out", "b_in", "b_out"}:
        raise ValueError(f"not paper 001's encoder: draws {sorted(drawn)}")
    return drawn


def _layernorm(x):
    y = x - x.mean(-1, keepdim=True)
    return y * (y * y).mean(-1, keepdim=True).rsqrt()


def _moments(x):
    """Per sequence: q = mean square; p = mean over ordered pairs t != s of x_t . x_s / d (float64)."""
    x = x.double()
    _, T, d = x.shape
    sq = (x * x).sum((1, 2))
    tot = x.sum(1)
    return sq / (T * d), ((tot * tot).sum(-1) - sq) / (d * T * (T - 1))


def block_weights(B: int, d: int, s: dict, normal) -> list:
    """One block's weights for B initialisations: W_Q, W_K, W_V, the MLP's two matrices and two biases."""
    return ([normal(B, d, d, std=s[k]) for k in ("wq", "wk", "wv", "w_in", "w_out")]
            + [normal(B, 1, d, std=s[k]) for k in ("b_in", "b_out")])


def block(h, W: list, post: bool, keep=None):
    """(the block's output, its attention weights) on the stream h (B, T, d): post-LN x -> LN(x + f(x)) after the
    attention and after the MLP, pre-LN x -> x + f(LN(x)); keep: the causal mask (None: bidirectional)."""
    import torch

    wq, wk, wv, w1, w2, b1, b2 = W
    u = h if post else _layernorm(h)
    scores = (u @ wq) @ (u @ wk).transpose(1, 2) / math.sqrt(h.shape[-1])
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    a = scores.softmax(-1)
    h = _layernorm(h + a @ (u @ wv)) if post else h + a @ (u @ wv)
    u = h if post else _layernorm(h)
    h = h + torch.relu(u @ w1 + b1) @ w2 + b2
    return (_layernorm(h) if post else h), a


def run_batch(B: int, spec, s: dict, gen, device) -> dict[str, np.ndarray]:
    """B initialisations of the encoder, one sequence each: per seed q, p, gq, gp (L + 1) and y2 (L)."""
    import torch

    T, d, L, post = spec.seq_len, spec.d_model, spec.layers, spec.norm == "post"

    def normal(*shape, std):
        return torch.randn(*shape, generator=gen, device=device) * std

    sigma = math.sqrt(2.0)  # the token and position tables' summed variance
    x = math.sqrt(0.03) * normal(B, 1, d, std=sigma) + math.sqrt(0.97) * normal(B, T, d, std=sigma)
    hs = [(_layernorm(x) if post else x).requires_grad_(True)]
    keep = torch.ones(T, T, dtype=torch.bool, device=device).tril() if spec.causal else None
    y2 = []
    for _ in range(L):
        h, a = block(hs[-1], block_weights(B, d, s, normal), post, keep)
        y2.append((a.detach().double() ** 2).sum(-1).mean(-1))
        hs.append(h)
    G = torch.randn(hs[-1].shape, generator=gen, device=device)
    grads = torch.autograd.grad((hs[-1] * G).sum(), hs)
    fw = [_moments(h.detach()) for h in hs]
    bw = [_moments(g) for g in grads]
    out = {"q": [m[0] for m in fw], "p": [m[1] for m in fw], "gq": [m[0] for m in bw], "gp": [m[1] for m in bw],
           "y2": y2}
    return {k: torch.stack(v, 1).cpu().numpy() for k, v in out.items()}


def measure(spec, seeds: int, device: str = "cpu", chunk: int = 0, salt: str = "") -> dict[str, np.ndarray]:
    """Per-seed moments of `seeds` initialisations, `chunk` at a time (0: as many as 40 GB hold on a GPU, 2 GB
    elsewhere; the estimate is about twice what autograd keeps)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    T, d, L = spec.seq_len, spec.d_model, spec.layers
    memory = 40e9 if torch.device(device).type == "cuda" else 2e9
    chunk = chunk or max(1, int(memory // (L * (10 * T * d + 3 * T * T + 6 * d * d) * 8)))
    gen = torch.Generator(device=device).manual_seed(zlib.crc32((spec.name + salt).encode()))
    drawn = stds(spec)
    parts = [run_batch(min(chunk, seeds - start), spec, drawn, gen, device) for start in range(0, seeds, chunk)]
    return {k: np.concatenate([p[k] for p in parts]) for k in NAMES}


def pooled(m: dict[str, np.ndarray]) -> dict:
    """`verify`'s measurement (means and standard errors over seeds) from per-seed moments `m`."""
    from initadvisor.verification import pool_seeds

    return pool_seeds([{"q": m["q"][i], "p": m["p"][i], "grad_q": m["gq"][i], "grad_p": m["gp"][i], "y2": m["y2"][i]}
                       for i in range(len(m["q"]))])


def report(spec, m: dict[str, np.ndarray]) -> dict:
    """`verify`'s comparison of the engine with per-seed moments `m`."""
    from initadvisor.verification import compare, theory_of

    trace, resolved = theory_of(spec)
    return compare(spec, trace, pooled(m), theory=resolved)


def key_of(norm: str, ratio: float, T: int, causal: bool) -> str:
    return f"{norm}:{ratio}:{T}:{'causal' if causal else 'bi'}"


def main() -> int:
    from initadvisor.errors import UsageError
    from initadvisor.spec import SpecError, build_spec

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seeds", type=int, default=64)
    ap.add_argument("--cells", default="", help="comma-separated norm:ratio:T:bi|causal (default: the whole grid)")
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--d", type=int, default=720)
    ap.add_argument("--chunk", type=int, default=0, help="seeds per batch (0: as many as 40 GB hold on a GPU, 2 GB else)")
    ap.add_argument("--salt", default="", help="another set of seeds")
    ap.add_argument("--save", default="", help="keep the per-seed moments (npz)")
    ap.add_argument("--load", nargs="*", default=[], help="score saved per-seed moments instead of measuring")
    ap.add_argument("--field-law", action="store_true",
                    help="score with the causal rows' field law on (initadvisor.core.ops.FIELD_LAW)")
    try:
        args = ap.parse_args()
        cells = parse_cells(args.cells)
        if args.seeds < 2 or args.layers < 1 or args.d < 2 or args.chunk < 0:
            raise ValueError("--seeds >= 2, --layers >= 1, --d >= 2, --chunk >= 0")
    except ValueError as e:
        print(f"batched_grid: bad arguments: {e}", file=sys.stderr)
        return 2
    if args.field_law:
        from initadvisor.core import ops

        ops.FIELD_LAW = True
    saved = {}
    try:
        for f in args.load:
            with np.load(f) as z:
                for k in z.files:
                    saved.setdefault(k, []).append(z[k].astype(np.float64))
        specs = {key_of(*c): build_spec(spec_for(*c, args.layers, args.d)) for c in cells}
        if not args.load:
            from initadvisor.api import _torch_device

            _torch_device(args.device)
    except ImportError:
        print("batched_grid: measuring needs PyTorch (pip install torch)", file=sys.stderr)
        return 2
    except (OSError, ValueError, SpecError, UsageError) as e:
        print(f"batched_grid: {e}", file=sys.stderr)
        return 2
    keep = {}
    print(f"{'cell':22s} {'seeds':>6s} | {'rho err':>8s} {'@':>3s} {'|z|':>5s} | {'IPR err':>8s} {'@':>3s} {'|z|':>5s} | "
          f"{'grad err':>8s} {'@':>3s} {'|z|':>5s} | seconds", flush=True)
    for norm, ratio, T, causal in cells:
        key = key_of(norm, ratio, T, causal)
        spec = specs[key]
        t0 = time.perf_counter()
        if args.load:
            if f"{key}/q" not in saved:
                continue
            try:
                m = {k: np.concatenate(saved[f"{key}/{k}"]) if f"{key}/{k}" in saved
                     else np.full_like(np.concatenate(saved[f"{key}/q"]), np.nan) for k in NAMES}
                if any(v.ndim != 2 or v.shape != (len(m["q"]), args.layers + (k != "y2")) for k, v in m.items()):
                    raise ValueError("not per-seed moments of this cell")
            except ValueError as e:
                print(f"batched_grid: --load, cell {key}: {e} at --layers {args.layers}", file=sys.stderr)
                return 2
        else:
            m = measure(spec, args.seeds, args.device, args.chunk, args.salt)
            keep.update({f"{key}/{k}": v.astype(np.float32) for k, v in m.items()})
        rep = report(spec, m)
        print(f"{key:22s} {len(m['q']):6d} | {columns(rep['layers'])} | {time.perf_counter() - t0:.0f}", flush=True)
    if args.save and keep:
        np.savez(args.save, **keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
