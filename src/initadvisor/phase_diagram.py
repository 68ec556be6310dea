"""Trainability diagram: the phase (rank collapse, entropy collapse, trainable) over a 2-D grid of settings.

`diagram(spec, x, y, grid, x_range, y_range)` runs the engine once over the whole grid (BlockParams fields
are arrays; no Python loop over points) and classifies every point with the rules of `check`:

- ``entropy_collapse``: beta / beta_c >= 1 at some block (finding IA201);
- ``rank_collapse``: rho >= thresholds.rank_collapse_rho at some layer, the input included (IA101);
- ``trainable``: neither.

Where both hold, the point is ``entropy_collapse``: as in paper 001 Fig. 1c, the localized phase is
beta >= beta_c whatever the skip strength (the per-point ``max_rho`` and ``max_beta_ratio`` grids keep
both quantities, so either rule can be recomputed).

Axes (``x`` and ``y``, distinct):

=========  =============================================  ==========================  =======
name       what varies                                    default range               spacing
=========  =============================================  ==========================  =======
beta       Giorlandino-Goldt beta (BlockParams.beta)      [0.01, 3 beta_c(input)] *   linear
alpha_sa   attention skip strength (residual.attention)   [0, 3]                      linear
alpha_mlp  MLP skip strength (residual.mlp)               [0, 3]                      linear
depth      number of blocks                               [1, 2 layers]               linear
seq_len    sequence length T, at fixed beta               [16, 8192]                  log
=========  =============================================  ==========================  =======

(*) [3 beta_c / 300, 3 beta_c] when beta_c(input) is below 1. beta is linear so that the phase boundaries beta_c / 2 and beta_c sit where 001 Fig. 1c draws them;
beta_c(input) is the engine's beta_c at block 1's attention input. A point of the grid is the spec with
``init.qk_beta`` = beta (Q and K stds realising it at that T), the skip strength, ``model.layers`` = depth
and ``sequence.length`` = T: varying T keeps beta (not the Q/K stds) fixed, since beta is already
normalised by sqrt(ln T). depth and seq_len values are integers; values that coincide after rounding are
dropped, so those axes can hold fewer than ``grid`` values.

The depth axis runs the deepest stack once and reads each depth's prefix (rho at layer l of a deeper
stack equals the shallower model's). The grid is streamed through the blocks in chunks, keeping only
running maxima: propagate() would also store every cache and per-layer array (a GB at 256 x 256 x 100).

`initadvisor.report.render_diagram(result, console)` draws the result with rich; `initadvisor.plots.save_diagram` with
matplotlib.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from initadvisor.core.model import Stack, propagate
from initadvisor.core.ops import Attention, find, moments_forward
from initadvisor.numbers import clean, overflow_findings
from initadvisor.errors import UsageError
from initadvisor.progress import Progress
from initadvisor.stack import from_spec, spec_beta

SCHEMA = "initadvisor.diagram/1"
PHASES = ("trainable", "rank_collapse", "entropy_collapse")  # codes 0, 1, 2 of the `codes` grid
MAX_GRID = 1024
CLOSED_FORM = ("relu", "gelu", "geglu", "gelu_tanh", "linear")  # activations without Gauss-Hermite quadrature
CHUNK = 8192  # points per vectorised pass: arrays stay in cache (2.5x faster than one 65536-point pass)
QUAD_CHUNK = 256  # quadrature activations hold (points, 48, 48) arrays


@dataclass(frozen=True)
class Axis:
    name: str
    label: str
    scale: str  # linear | log
    integer: bool
    minimum: float  # smallest allowed value
    strict: bool  # minimum itself excluded


AXES = {
    "beta": Axis("beta", "beta (Giorlandino-Goldt, Q/K scale)", "linear", False, 0.0, True),
    "alpha_sa": Axis("alpha_sa", "alpha_SA (attention skip)", "linear", False, 0.0, False),
    "alpha_mlp": Axis("alpha_mlp", "alpha_MLP (MLP skip)", "linear", False, 0.0, False),
    "depth": Axis("depth", "depth (blocks)", "linear", True, 1.0, False),
    "seq_len": Axis("seq_len", "sequence length T", "log", True, 2.0, False),
}


MAXIMUM = {"beta": 1e6, "alpha_sa": 1e6, "alpha_mlp": 1e6, "depth": 200_000, "seq_len": 1e7}


def _err(message: str, option: str) -> UsageError:
    return UsageError(message, option)


# ---------------------------------------------------------------------------------------------
# Axes


def beta_c_input(spec) -> float:
    """The engine's beta_c at block 1's attention input (independent of beta)."""
    net = from_spec(spec)
    t = propagate(Stack(net.embeddings, net.layers[:1]), backward=False)
    return float(t.beta_c[0])


def spec_value(spec, name: str) -> float:
    """The spec's own coordinate on an axis."""
    return {
        "beta": lambda: float(spec_beta(spec)),
        "alpha_sa": lambda: float(spec.res_attention.skip),
        "alpha_mlp": lambda: float(spec.res_mlp.skip),
        "depth": lambda: spec.layers,
        "seq_len": lambda: spec.seq_len,
    }[name]()


def default_range(spec, name: str) -> tuple[float, float]:
    return {
        "beta": lambda: _beta_range(min(3.0 * beta_c_input(spec), MAXIMUM["beta"])),  # (a collapsed input's
        # beta_c is unbounded)
        "alpha_sa": lambda: (0.0, 3.0),
        "alpha_mlp": lambda: (0.0, 3.0),
        "depth": lambda: (1, 2 * spec.layers),
        "seq_len": lambda: (16, 8192),
    }[name]()


def _beta_range(hi: float) -> tuple[float, float]:
    """[0.01, hi], or [hi / 300, hi] when beta_c is so small that 0.01 is already past it."""
    return min(0.01, hi / 300), hi


def axis_values(spec, name: str, n: int, rng=None, option: str = "--x") -> np.ndarray:
    """n values of an axis over rng (default: the axis's default range), validated."""
    ax = AXES[name]
    lo, hi = default_range(spec, name) if rng is None else (float(rng[0]), float(rng[1]))
    where = f"{option}-range"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise _err(f"{name} range must be finite, got [{lo}, {hi}]", where)
    if not lo < hi:
        raise _err(f"{name} range needs A < B, got [{lo:g}, {hi:g}]", where)
    if lo < ax.minimum or (ax.strict and lo <= ax.minimum):
        raise _err(f"{name} must be {'>' if ax.strict else '>='} {ax.minimum:g}, got {lo:g}", where)
    if rng is not None and hi > MAXIMUM[name]:  # a given range: the spec's own bounds (1e6 for the scales)
        raise _err(f"{name} must be at most {MAXIMUM[name]:g}, got {hi:g}", where)
    if rng is not None and any(0 < abs(x) < 1e-12 for x in (lo, hi)):  # (a report prints nothing under 1e-200)
        raise _err(f"{name} range ends must be 0 or at least 1e-12, got [{lo:g}, {hi:g}]", where)
    v = np.geomspace(lo, hi, n) if ax.scale == "log" else np.linspace(lo, hi, n)
    if ax.integer:
        v = np.unique(np.round(v).astype(int))
        if v.size < 2:
            raise _err(f"{name} range [{lo:g}, {hi:g}] holds fewer than 2 integers", where)
    return v


# ---------------------------------------------------------------------------------------------
# The vectorised sweep


def _overrides(spec, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """BlockParams fields for flat arrays of axis values (depth excluded: it is the number of blocks)."""
    out: dict[str, np.ndarray] = {}
    if "beta" in values:
        out["beta"] = np.asarray(values["beta"], dtype=float)
    if "alpha_sa" in values:
        out["skip_a"] = np.asarray(values["alpha_sa"], dtype=float)
    if "alpha_mlp" in values:
        out["skip_m"] = np.asarray(values["alpha_mlp"], dtype=float)
    if "seq_len" in values:
        out["seq_len"] = np.asarray(values["seq_len"], dtype=float)
    bq = spec.init["q"].bias_std
    if bq and ("beta" in values or "seq_len" in values):
        # init.qk_beta sets the Q std to s, s^2 = beta sqrt(ln T) / (d scale sqrt(d_head)): the query-bias
        # share b_Q^2 / (s^2 d) follows it
        beta = out.get("beta", float(spec_beta(spec)))
        lnt = np.log(out.get("seq_len", float(spec.seq_len)))
        out["q_bias"] = bq**2 * spec.softmax_scale * math.sqrt(spec.d_head) / (beta * np.sqrt(lnt))
    return out


def sweep(stack: Stack, over: dict[str, np.ndarray], layers: int, per_layer: bool = False,
          progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Stream flat arrays of BlockParams overrides through the stack's first `layers` blocks (its last block
    repeated beyond its depth).

    Returns max_rho (over layers 0..L), max_beta_ratio (over blocks 1..L) and final_rho, each of shape (n,);
    with per_layer, their prefixes: cum_rho (L+1, n) = max rho over layers 0..l, cum_ratio (L, n) = max
    beta/beta_c over blocks 1..l+1, and rho (L+1, n). `progress(done, total)`: told each layer of each chunk.
    """
    n = len(next(iter(over.values()))) if over else 1
    step = CHUNK if all(P.activation in CLOSED_FORM for P in stack.layers) else QUAD_CHUNK
    res = {k: np.empty(n) for k in ("max_rho", "max_beta_ratio", "final_rho")}
    if per_layer:
        res.update(cum_rho=np.empty((layers + 1, n)), cum_ratio=np.empty((layers, n)), rho=np.empty((layers + 1, n)))
    chunks = -(-n // step)
    for c, s in enumerate(range(0, n, step)):
        idx = np.arange(s, min(s + step, n))
        fields = {k: v[idx] for k, v in over.items()}
        _run_chunk(stack.replace(**fields), layers, idx, res, per_layer,
                   progress and (lambda layer, c=c: progress(c * layers + layer, chunks * layers)))
    return res


def _run_chunk(stack: Stack, layers, idx, res, per_layer, done=None) -> None:
    m = idx.size
    q0, p0 = stack.embeddings.moments()
    blocks = stack.blocks
    q, p = np.full(m, float(q0)), np.full(m, float(p0))
    rho = p / q
    mx_rho, mx_ratio = rho.copy(), np.full(m, -np.inf)
    if per_layer:
        res["cum_rho"][0, idx] = mx_rho
        res["rho"][0, idx] = rho
    for layer in range(layers):
        k = min(layer, len(blocks) - 1)
        q, p, cache = moments_forward(blocks[k], q, p)
        rho = p / q
        np.fmax(mx_rho, rho, out=mx_rho)
        np.fmax(mx_ratio, np.divide(stack.layers[k].beta, find(blocks[k], cache, Attention).beta_c), out=mx_ratio)
        if per_layer:
            res["cum_rho"][layer + 1, idx] = mx_rho
            res["cum_ratio"][layer, idx] = mx_ratio
            res["rho"][layer + 1, idx] = rho
        if done is not None:
            done(layer + 1)
    res["max_rho"][idx], res["max_beta_ratio"][idx], res["final_rho"][idx] = mx_rho, mx_ratio, rho


def classify(max_rho, max_beta_ratio, rank_collapse_rho: float) -> np.ndarray:
    """Phase codes (indices into PHASES): entropy collapse wins over rank collapse."""
    return np.where(np.asarray(max_beta_ratio) >= 1.0, 2, np.where(np.asarray(max_rho) >= rank_collapse_rho, 1, 0))


# ---------------------------------------------------------------------------------------------
# Recommended region (the numbers of `initadvisor recommend`)


def alpha_c(spec, rho_max: float, field: str = "skip_a", beta: float | None = None,
            ceiling: float = 16.0) -> float | None:
    """Smallest skip strength with rho < rho_max at every layer: recommend.alpha_c's search
    (recommend.first_crossing) on the streamed sweep."""
    from initadvisor.recipes import first_crossing

    base = {} if beta is None else {"beta": np.full(1, beta)}
    net = from_spec(spec)

    def excess(a: np.ndarray) -> np.ndarray:
        over = {field: a, **{k: np.broadcast_to(v, a.shape) for k, v in base.items()}}
        return sweep(net, over, spec.layers)["max_rho"] - rho_max

    return first_crossing(excess, np.linspace(0.0, ceiling, 321))


def recommended_region(spec, axes: tuple[str, str]) -> dict:
    """beta < beta_c/2 and alpha >= alpha_c, with `recommend`'s beta_c (at its recommended beta)."""
    from initadvisor.recipes import BETA_MARGIN, beta_recommendation

    thr = spec.thresholds["rank_collapse_rho"]
    beta_rec, bc = beta_recommendation(spec)
    out = {"rule": "beta < beta_c/2 and alpha_sa >= alpha_c", "beta_max": _r(bc.min() / 2),
           "beta_recommended": _r(beta_rec), "beta_margin": BETA_MARGIN, "rho_max": thr,
           "alpha_sa_min": _r_or_none(alpha_c(spec, thr, "skip_a", beta=beta_rec))}
    if "alpha_mlp" in axes:
        out["alpha_mlp_min"] = _r_or_none(alpha_c(spec, thr, "skip_m"))
        out["rule"] += " (alpha_mlp >= alpha_c,MLP)"
    return out


def _r(x) -> float:
    return float(f"{float(x):.6g}")


def _r_or_none(x):
    return None if x is None else _r(x)


# ---------------------------------------------------------------------------------------------


def diagram(spec, x: str = "beta", y: str = "alpha_sa", grid: int = 64, x_range=None, y_range=None,
            progress: Progress | None = None) -> dict:
    """The `initadvisor.diagram/1` result: phase[j][i] at (x.values[i], y.values[j]); `progress`: see `sweep`."""
    for name, opt in ((x, "--x"), (y, "--y")):
        if name not in AXES:
            raise _err(f"unknown axis {name!r}; choose from {', '.join(AXES)}", opt)
    if x == y:
        raise _err(f"x and y are both {x!r}", "--y")
    if not isinstance(grid, (int, np.integer)) or not 2 <= grid <= MAX_GRID:
        raise _err(f"must be an integer in [2, {MAX_GRID}], got {grid}", "--grid")
    xs = axis_values(spec, x, grid, x_range, "--x")
    ys = axis_values(spec, y, grid, y_range, "--y")
    ny, nx = ys.size, xs.size
    if "depth" in (x, y):
        other, ov, dv = (y, ys, xs) if x == "depth" else (x, xs, ys)
        r = sweep(from_spec(spec), _overrides(spec, {other: ov}), int(dv.max()), per_layer=True, progress=progress)
        mr, mb, fr = r["cum_rho"][dv], r["cum_ratio"][dv - 1], r["rho"][dv]  # (n_depth, n_other)
        if x == "depth":
            mr, mb, fr = mr.T, mb.T, fr.T  # rows = y = other
    else:
        Y, X = np.meshgrid(ys, xs, indexing="ij")
        r = sweep(from_spec(spec), _overrides(spec, {x: X.ravel(), y: Y.ravel()}), spec.layers, progress=progress)
        mr, mb, fr = (r[k].reshape(ny, nx) for k in ("max_rho", "max_beta_ratio", "final_rho"))
    thr = spec.thresholds["rank_collapse_rho"]
    codes = classify(mr, mb, thr)
    names = np.array(PHASES)[codes]
    res = {
        "schema": SCHEMA,
        "x": _axis_json(x, xs),
        "y": _axis_json(y, ys),
        "phase": names.tolist(),
        "spec_name": spec.name,
        "layers": spec.layers,
        "spec_point": {"x": _num(spec_value(spec, x)), "y": _num(spec_value(spec, y))},
        "rule": "entropy_collapse if max_l beta/beta_c >= 1 (IA201), else rank_collapse if max_l rho >= "
                f"{thr:g} (IA101), else trainable",
        "thresholds": {"rank_collapse_rho": thr, "beta_ratio": 1.0},
        "beta_c_input": _r(beta_c_input(spec)),
        "recommended": recommended_region(spec, (x, y)),
        "counts": {p: int((codes == i).sum()) for i, p in enumerate(PHASES)},
        "max_rho": _grid_json(mr),
        "final_rho": _grid_json(fr),
        "max_beta_ratio": _grid_json(mb),
    }
    res, bad = clean(res)
    res["findings"] = [asdict(f) for f in overflow_findings(bad)]
    return res


def _num(v):
    return int(v) if isinstance(v, (int, np.integer)) else _r(v)


def _axis_json(name: str, v: np.ndarray) -> dict:
    ax = AXES[name]
    vals = [int(a) for a in v] if ax.integer else [_r(a) for a in v]
    return {"name": name, "values": vals, "scale": ax.scale, "label": ax.label}


def _grid_json(a: np.ndarray) -> list:
    a = np.round(np.asarray(a, dtype=float), 6)
    if np.isfinite(a).all():
        return a.tolist()
    return [[float(v) if math.isfinite(v) else None for v in row] for row in a.tolist()]
