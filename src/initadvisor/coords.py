"""`sweep`: the analytic coordinate check, the first row (the network at init) of a muP coordinate check.

Per configuration of a width or depth sweep, the size of each module's output at init: RMS = sqrt(q), q the
per-coordinate second moment the engine propagates, and the mean absolute value sqrt(2/pi) RMS (at init a
coordinate, over tokens, units and draws of the weights, is Gaussian with variance q; tests/test_sweep.py
checks both against the Monte-Carlo of the numpy network). Per module, the exponent is the least-squares slope
of log RMS against log width (or depth).
"""

from __future__ import annotations

import math

import numpy as np

from initadvisor import __version__
from initadvisor.core.model import propagate
from initadvisor.core.ops import Attention, Residual, causal_forward, leaves, moments_forward
from initadvisor.diagnose import fits, notes as causal_notes, resolvable
from initadvisor.errors import UsageError
from initadvisor.numbers import LIMIT, clean
from initadvisor.progress import Progress, tell
from initadvisor.spec import MAX_INT
from initadvisor.stack import from_spec

MAX_CONFIGS = 32
MEAN_ABS = math.sqrt(2.0 / math.pi)  # E|x| / sqrt(E x^2) of a centred Gaussian
MODULES = {
    "embedding": "stream index 0: summed embedding tables (then the embedding norm and dropout, if any)",
    "attention": "value each attention branch adds to the residual stream (block scale included, before the "
                 "add); mean over blocks, *_last: the last block",
    "mlp": "value each MLP branch adds to the residual stream (block scale included, before the add); mean over "
           "blocks, *_last: the last block",
    "final_residual": "residual stream after the last block, before any final norm",
    "logits": "one logit: the output head (tied: init.embedding's std, else init.head) on the final hidden state "
              "(after model.final_norm), soft-capped if the spec says so",
}


def sweep(spec, width: list[int] | None = None, depth: list[int] | None = None,
          progress: Progress | None = None) -> dict:
    """Module output sizes at init over widths (d_model; head dimension and d_ff / d_model held) or depths
    (layers), and their fitted exponents. Exactly one of width, depth; values are sorted, duplicates dropped.
    `progress(done, total)`: told each block of each network profiled."""
    if (width is None) == (depth is None):
        raise _bad("give exactly one of --width and --depth", "--width")
    axis, option = ("width", "--width") if width is not None else ("depth", "--depth")
    values = _values(width if width is not None else depth, option)
    if axis == "width":
        specs = [_at_width(spec, n) for n in values]
        done = _counter(progress, spec.layers * len(specs))
        configs = [{"value": n, **_sizes(s, _profile(s, done))} for n, s in zip(values, specs)]
        group = spec.heads // spec.kv_heads
        held = (f"head dimension {spec.d_head} held (heads = width / {spec.d_head}"
                + (f", kv_heads = heads / {group}" if group > 1 else "")
                + f"); d_ff = {spec.d_ff / spec.d_model:g} x width (rounded); init stds as the spec writes them"
                + ("; Q/K stds re-resolved from qk_beta at each width" if spec.qk_beta is not None else ""))
    else:
        for L in values:
            if L > MAX_INT["model.layers"]:
                raise _bad(f"depth {L} is over the maximum of {MAX_INT['model.layers']} layers", option)
        specs = [spec.with_overrides(layers=values[-1])]
        profile = _profile(specs[0], _counter(progress, values[-1]))  # identical blocks: depth L is the first L blocks of the deepest network
        configs = [{"value": L, **_sizes(spec.with_overrides(layers=L), profile)} for L in values]
        held = "layers vary; every other field (residual scales included) as the spec writes it"
    out, _ = clean({
        "schema": "initadvisor.sweep/1", "version": __version__, "spec": spec.to_dict(), "axis": axis,
        "values": values, "held": held, "modules": MODULES, "notes": _notes(specs[-1]), "configs": configs,
    })
    out["exponents"] = {m: _slope(values, [c["modules"][m]["rms"] for c in out["configs"]]) for m in MODULES}
    out["fit"] = f"least-squares slope of log RMS against log {axis}; attention and mlp: of their mean over blocks"
    return out


def _notes(spec) -> list[str]:
    """How a causal spec's positions were treated (the largest configuration decides)."""
    if not spec.causal:
        return []
    return causal_notes(spec) or ["causal: positions resolved (the position-resolved engine); RMS pools every "
                                  "position, mean_abs averages each position's sqrt(2/pi) RMS"]


def _bad(message: str, option: str) -> UsageError:
    return UsageError(message, option)


def _values(values, option: str) -> list[int]:
    """Positive whole numbers, at most MAX_CONFIGS distinct ones, sorted."""
    values = list(values)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise _bad(f"expected positive whole numbers, got {v!r}", option)
    out = sorted({int(v) for v in values})
    if not out:
        raise _bad("expected at least one value", option)
    if len(out) > MAX_CONFIGS:
        raise _bad(f"too many configurations ({len(out)}; at most {MAX_CONFIGS})", option)
    return out


def _at_width(spec, n: int):
    """The spec at d_model = n with its head dimension and d_ff / d_model ratio (and heads / kv_heads) held."""
    group, step = spec.heads // spec.kv_heads, spec.d_head * (spec.heads // spec.kv_heads)
    if n % step:
        per = f"head dimension {spec.d_head}" + (f" x {group} heads per K/V head" if group > 1 else "")
        raise _bad(f"width {n} is not a multiple of {step} ({per}, held fixed)", "--width")
    d_ff = max(1, round(spec.d_ff * n / spec.d_model))
    if n > MAX_INT["model.d_model"] or d_ff > MAX_INT["model.d_ff"]:
        raise _bad(f"width {n} is over the maximum d_model {MAX_INT['model.d_model']} (or d_ff "
                   f"{MAX_INT['model.d_ff']})", "--width")
    heads = n // spec.d_head
    return spec.with_overrides(d_model=n, heads=heads, kv_heads=heads // group, d_ff=d_ff)


def _counter(progress: Progress | None, total: int):
    """A step() that tells `progress` one more of `total` steps done."""
    done = [0]

    def step() -> None:
        done[0] += 1
        tell(progress, done[0], total)
    return step


def _profile(spec, step=lambda: None) -> dict[str, np.ndarray]:
    """(RMS, mean |x|) rows of the stream and the logits at indices 0..L, and of the value each block's attention
    and MLP branch adds; causal specs (within the position-resolved engine's reach) pool the positions, sliding windows
    beyond it take the late tokens' (distance-resolved, as `check`); step() is called after each block."""
    stack = from_spec(spec)
    if spec.causal and resolvable(stack):
        from initadvisor.core import causal as cz

        T = spec.seq_len
        G = cz._grid(T, T if stack.windowed else cz._SINGLE, cz._RATIO)  # cz.propagate_overlaps' grouping (sliding
        # windows: every position its own group) and start state
        S = cz.input_state(G, *stack.embeddings.moments(), stack.embeddings.repeats())

        def run(ops, S):
            return causal_forward(ops, G, S)[0]

        streams, added = [S.qf], []
        for ops in stack.blocks:
            added.append(_added(ops, S, run, lambda S: S.qf))
            with np.errstate(over="ignore", invalid="ignore"):
                S = cz._clamp(G, run(ops, S))
            streams.append(S.qf)
            step()
    elif stack.windowed and fits(len(stack.layers), spec.seq_len):  # the late tokens by distance, as `check`
        from initadvisor.core.distances import block_forward, distance_forward

        q0, p0 = stack.embeddings.moments()
        s = (float(q0), np.full(spec.seq_len - 1, float(p0)))
        streams, added = [s[0]], []
        for ops in stack.blocks:
            added.append(_added(ops, s, lambda ops, s: distance_forward(ops, *s)[:2], lambda s: s[0]))
            s = block_forward(ops, *s)[:2]
            streams.append(s[0])
            step()
    else:
        trace = propagate(stack, backward=False)
        streams = list(trace.q)
        added = []
        for ops, q, p in zip(stack.blocks, trace.q, trace.p):
            added.append(_added(ops, (q, p), lambda ops, s: moments_forward(ops, *s)[:2], lambda s: s[0]))
            step()
    return {"stream": np.array([_size(q) for q in streams]), "q": streams,
            **{m: np.array([_size(a[m]) for a in added]).reshape(-1, 2) for m in ("attention", "mlp")}}


def _added(ops, state, run, q_of) -> dict:
    """q of the value each residual branch of one block adds to the stream (block scale^2 x the branch output's
    q), keyed 'attention' or 'mlp' by the operation the branch holds. state: the block's input in the engine's
    representation, run(ops, state) -> state its interpreter, q_of(state) its q."""
    out = {}
    with np.errstate(over="ignore", invalid="ignore"):
        for op in ops:
            if isinstance(op, Residual):
                shared = run(op.shared, state)
                for b, branch in op.branches:
                    kind = "attention" if any(isinstance(o, Attention) for o in leaves(branch)) else "mlp"
                    out[kind] = b**2 * q_of(run(branch, shared))
            state = run((op,), state)
    return out


def _size(q) -> tuple[float, float]:
    """(RMS, mean |x|) of centred Gaussian coordinates whose second moment is q (per position: pooled)."""
    q = np.asarray(q, dtype=float)
    r = np.sqrt(np.where((q == 0) | (q > 1 / LIMIT) & (q < LIMIT), q, np.nan))  # else the engine's clamp
    return float(np.sqrt(np.mean(r * r))), float(MEAN_ABS * np.mean(r))


def logits_q(spec, q_final) -> np.ndarray:
    """Per-logit second moment (`loss.logit_std`: the head's std, tying, final norm, soft-cap) for each
    position's final-stream q; many distinct q (no final norm, causal) on a 33-point grid, interpolated in log."""
    from initadvisor.loss import logit_std

    q = np.asarray(q_final, dtype=float)
    u = np.unique(q)
    if u.size > 33 and u[0] > 0:
        grid = np.geomspace(u[0], u[-1], 33)
        return np.exp(np.interp(np.log(q), np.log(grid), [2 * np.log(logit_std(spec, g)) for g in grid]))
    return np.array([logit_std(spec, x) ** 2 for x in u])[np.searchsorted(u, q)]


def _sizes(spec, profile: dict) -> dict:
    """One configuration (the first spec.layers blocks of the profile): its shape and per module {rms,
    mean_abs} (attention, mlp: the mean over blocks, and rms_last, mean_abs_last of the last block)."""
    L = spec.layers

    def size(rows) -> dict:
        return {"rms": float(rows[..., 0].mean()), "mean_abs": float(rows[..., 1].mean())}

    mods = {"embedding": size(profile["stream"][0]), "final_residual": size(profile["stream"][L]),
            "logits": size(np.array(_size(logits_q(spec, profile["q"][L]))))}
    for m in ("attention", "mlp"):
        rows = profile[m][:L]
        mods[m] = {**size(rows), "rms_last": float(rows[-1, 0]), "mean_abs_last": float(rows[-1, 1])}
    return {"d_model": spec.d_model, "heads": spec.heads, "kv_heads": spec.kv_heads, "d_ff": spec.d_ff,
            "layers": L, "modules": {m: mods[m] for m in MODULES}}


def _slope(x: list[int], rms: list) -> float | None:
    """Least-squares slope of log rms against log x; None with fewer than two values or any unreportable one."""
    if len(x) < 2 or any(r is None or r <= 0 for r in rms):
        return None
    slope = float(np.polyfit(np.log(x), np.log(rms), 1)[0])
    return round(slope, 6) + 0.0 if math.isfinite(slope) else None  # + 0.0: no "-0.000"
