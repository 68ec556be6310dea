"""Diagnosis: turn an engine Trace of a Spec into findings with stable codes, and the JSON report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from initadvisor import __version__
from initadvisor.core import gradients as G
from initadvisor.core.attention import alibi_windows, phase
from initadvisor.core.distances import propagate_distances
from initadvisor.core.model import BACKWARD_T, WALK_COST, Stack, Trace, propagate, propagate_causal, walks
from initadvisor.loss import initial_loss
from initadvisor.numbers import clean, overflow_findings
from initadvisor.rules import RULES, Finding, finding  # noqa: F401  (Finding, finding: re-exported)
from initadvisor.stack import from_spec


def qk_laws(stack: Stack, trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Per block: Result 2's scaled Q gradient and Noci's Q/K-to-V gradient ratio at the attention input."""
    def per_layer(f):
        return np.array([f(P) for P in stack.layers])

    q, p = trace.att_q, trace.att_p
    g_q, g_k = per_layer(lambda P: P.g_q), per_layer(lambda P: P.g_k)
    g_v, g_vo = per_layer(lambda P: P.g_v), per_layer(lambda P: P.g_v * P.g_o)
    normed, qq = per_layer(lambda P: P.qk_norm != "none"), q + per_layer(lambda P: P.q_bias)
    T, d = stack.embeddings.seq_len, stack.embeddings.d_model
    # dL/dW_Q carries W_K: with unequal Q/K stds the product beta ~ s_Q s_K takes a factor s_K / s_Q
    qk = G.qk_grad(trace.beta, g_vo, q, p, trace.y2, trace.y3, trace.y22) * np.sqrt(g_k / g_q)
    # Noci's tau^2 (one std for all matrices) is g_Q g_K scale^2 d_head = beta^2 ln T; the Q/K gradients carry
    # the value gain in place of the other Q/K gain: tau^2 = g_V (g_Q + g_K) / 2 scale^2 d_head
    tau2 = trace.beta**2 * np.log(T) * g_v * (g_q + g_k) / (2 * g_q * g_k)
    ratio = G.qk_to_v_grad_ratio(tau2, q, p / q, T, d)
    if normed.any():  # QK-norm: unit-variance keys spread by 1 - rho = (q - p) / q, so the key factor
        # scale^2 d_head (1 - rho) = beta^2 ln T (1 - rho), and the norm's Jacobian 1 / RMS^2 = 1 / (g_Q q_eff) on the
        # query side (1 / (g_K q) on the key side) carries the gradient to W_Q
        b_ln = trace.beta * np.sqrt(np.log(T))
        qk_n = G.qk_grad(trace.beta, g_vo, q, p, trace.y2, trace.y3, trace.y22) * b_ln / (q * g_q * qq)
        tau2_n = trace.beta**2 * np.log(T) * g_v * (1 / (g_q * qq) + 1 / (g_k * q)) / 2
        qk = np.where(normed, qk_n, qk)
        ratio = np.where(normed, G.qk_to_v_grad_ratio(tau2_n, q, p / q, T, d) / q, ratio)
    return qk, ratio


def width(stack: Stack, trace: Trace) -> dict | None:
    """Paper 002 at block 1: spectral gap of the attention matrix and stable rank of its output vs T (full
    attention: none for centered attention or a sliding window at block 1)."""
    P0 = stack.layers[0]
    if P0.centered or (P0.window and P0.window < stack.embeddings.seq_len):
        return None
    from initadvisor.core.spectral import attention_spectrum, stable_rank_attention_output, width_collapse

    q, p = float(trace.att_q[0]), float(trace.att_p[0])
    V = float(trace.beta[0] ** 2 * q * (q - p) * np.log(stack.embeddings.seq_len))  # key-dependent score variance
    rho, T, d = p / q, float(stack.embeddings.seq_len), stack.embeddings.d_model
    if V >= 2 * np.log(T) or rho > 1 - 1e-9:  # 002's spectrum needs spread rows and distinct tokens
        return None
    a = attention_spectrum(T, V, exact=False)
    w = width_collapse(T, V, rho, d=d, exact=False)
    Ts = 2.0 ** np.arange(4, int(np.log2(4 * T)) + 1)
    sr = stable_rank_attention_output(Ts, V, rho, d=d, exact=False)
    src = stable_rank_attention_output(Ts, V, rho, d=d, centered=True, exact=False)
    return {"seq_len": int(T), "score_variance": _f(V), "sigma1": _f(a.sigma1), "sigma2": _f(a.sigma2),
            "gap_ratio": _f(a.gap_ratio), "stable_rank": _f(w.stable_rank),
            "stable_rank_centered": _f(w.stable_rank_centered), "collapsed": bool(w.collapsed),
            "by_seq_len": [{"seq_len": int(t), "stable_rank": _f(x), "stable_rank_centered": _f(y)}
                           for t, x, y in zip(Ts, sr, src)]}


def routing(spec, trace: Trace) -> dict | None:
    """A mixture of experts' routed branch at its first MoE block: sum_j w_j^2 (its second moment over one expert's,
    core.routing) and top_k times it (1 for renormalised weights at uniform routing); the router's input q is 1
    behind a norm, else the stream entering the block."""
    E = spec.moe
    b = next((i for i in range(spec.layers) if i + 1 not in E.dense_blocks), None) if E else None
    if b is None:  # dense, or every block in dense_blocks
        return None
    from initadvisor.core.routing import statistics

    q = 1.0 if spec.norm in ("pre", "post", "sandwich") else float(trace.q[b])
    A = float(statistics(E.experts, E.top_k, E.router, E.normalize, E.scale, E.router_std**2 * spec.d_model * q,
                         1.0)[0])
    return {"block": b + 1, "experts": E.experts, "top_k": E.top_k, "sum_w2": _f(A), "shrink": _f(E.top_k * A)}


def growth(stack: Stack, trace: Trace) -> dict:
    norm = stack.layers[0].norm
    return {"forward": G.forward_growth(trace.q), "gradient": G.gradient_growth(trace.grad_q, trace.q, norm)}


CAUSAL_CELLS = 10**7  # the position-resolved engine keeps (layers + 1) x T arrays: about 240 MB at this size


def causal_trace(stack: Stack, backward: bool = False):
    """The position-resolved prediction for causal models and for bidirectional ones with sliding windows (None
    otherwise, or beyond CAUSAL_CELLS / WINDOW_CELLS); backward: with the gradient where it resolves it (causal
    rows over all keys)."""
    how = route(stack)
    if how == "resolved":
        return propagate_causal(stack, backward=backward)
    if how == "distances":  # the late tokens, distance-resolved
        q0, p0 = stack.embeddings.moments()
        return propagate_distances(stack.blocks, q0, p0, stack.embeddings.seq_len, backward=backward)
    return None


def route(stack: Stack) -> str | None:
    """Which run causal_trace makes for this stack: "resolved" (per position), "distances" (the late tokens by
    distance) or None (the pair engine alone)."""
    if not (stack.layers[0].causal or stack.windowed):
        return None
    if resolvable(stack):
        return "resolved"
    P = _alibi_layer(stack)
    if stack.windowed and distances_fit(len(stack.layers), stack.embeddings.seq_len, P.heads, P.alibi):
        return "distances"
    return None


def _alibi_layer(stack: Stack):
    """An ALiBi layer's parameters (its heads set the distance state's maps), else the first layer's."""
    return next((P for P in stack.layers if P.alibi), stack.layers[0])


WINDOW_CELLS = 2 * 10**7  # sliding-window rows run at full resolution: (layers + 1) x T^2 overlaps at most
# (check at this size, T 1024 and 18 layers: 12.6 s with the backward, 560 MB; T 1024, 8 layers: 4.7 s)


ALIBI_FLOPS = 2 * 10**10  # ALiBi's rows: (layers + 1) x heads x T^3 multiply-adds at most (dense T x T products)


def resolvable(stack: Stack) -> bool:
    T, L = stack.embeddings.seq_len, len(stack.layers)
    heads = max((P.heads for P in stack.layers if P.alibi), default=0)
    return fits(L, T) and (not stack.windowed or (L + 1) * T * T <= WINDOW_CELLS) \
        and (L + 1) * heads * T**3 <= ALIBI_FLOPS


ROW_FLOOR = 1024  # check's reach counts a layer as at least this many positions (Python per operation; a layer costs
# 2.1 ms at T 64 with the backward: recommend's budget counts it as LAYER_POSITIONS more, below)


def fits(layers: int, seq_len: int) -> bool:
    """The position-resolved engine's reach: (layers + 1) x max(T, ROW_FLOOR) cells (a 100000-layer causal stack at
    T = 6 took 100 s), and T up to BACKWARD_T (its per-position temporaries: about 2 GB at T = 4e6)."""
    return (layers + 1) * max(seq_len, ROW_FLOOR) <= CAUSAL_CELLS and seq_len <= BACKWARD_T


DISTANCE_CELLS = 3 * 10**7  # the distance-resolved state: (layers + 1) x T x the maps a layer runs (ALiBi: one per
# distinct head window), about 0.3 us each (64 ALiBi heads over 1626 layers at T 2188 took a minute)


def distances_fit(layers: int, seq_len: int, heads: int, alibi: float) -> bool:
    """The distance-resolved state's reach: the position-resolved engine's, and DISTANCE_CELLS."""
    maps = len(alibi_windows(heads, alibi, seq_len)[0]) if alibi else 1
    return fits(layers, seq_len) and (layers + 1) * seq_len * maps <= DISTANCE_CELLS


LAYER_POSITIONS = 5000  # a position-resolved layer costs 0.6-1.2 us x (T + LAYER_POSITIONS) (2026-11-28, forward and
# backward: GPT-2 small's blocks 2.1 / 4.0 / 9.3 / 44 ms at T 64 / 1024 / 8192 / 65536; Llama-3.1-8B's rotary blocks at
# T 131072 166 ms)


def resolved_cells(stack: Stack) -> int:
    """The size of causal_trace's run for this stack, in cells of about 0.5 us: (layers + 1) x 2 (T + LAYER_POSITIONS)
    position-resolved (a layer's Python and group-pair work is counted as LAYER_POSITIONS positions); (layers + 1)
    x T^2 for windows at full resolution (2026-11-28: 0.35-0.45 us a cell at T 128-512, 0.73 us at T 1024, causal or
    not; counted as T^2 / 2 before, a 22-layer windowed stack at T 512 ran recommend in 33 s, 3.9 s an analysis); ALiBi's rows
    there (layers + 1) x heads x T^3 / 2000 (their dense products: 3.3 s for 1.4e10, counted high); (layers + 1) x T
    x the distinct ALiBi windows on the distance state; 0 where the pair engine stands alone. Mixture-of-experts stacks
    count their position-resolved cells twice (the routing statistics of every pair: 2.1 us a window cell, against
    1.3 us dense, a 25-layer stack at T 512), post-LN causal stacks that carry the rho walk WALK_COST times
    (model.walks)."""
    how = route(stack)
    T, L, P = stack.embeddings.seq_len, len(stack.layers), _alibi_layer(stack)
    moe = 2 if any(B.experts for B in stack.layers) else 1
    if how == "resolved" and P.alibi:
        return moe * (L + 1) * max(T * T // 2, P.heads * T**3 // 2000)
    if how == "resolved":
        cost = WALK_COST if walks(stack) else 1
        return moe * ((L + 1) * T * T if stack.windowed else cost * (L + 1) * 2 * (T + LAYER_POSITIONS))
    if how == "distances":
        return (L + 1) * T * (len(alibi_windows(P.heads, P.alibi, T)[0]) if P.alibi else 1)
    return 0


def notes(spec) -> list[str]:
    """What the analysis left out for this spec."""
    if spec.causal and spec.seq_len > BACKWARD_T:
        return [f"causal: T = {spec.seq_len} exceeds {BACKWARD_T} positions: the position-resolved prediction is "
                "skipped, rows (forward and gradient) use the late-token pair"]
    if spec.causal and not fits(spec.layers, spec.seq_len):
        cells = (spec.layers + 1) * max(spec.seq_len, ROW_FLOOR)
        return [f"causal: (layers + 1) x max(T, {ROW_FLOOR}) = {cells:.3g} exceeds {CAUSAL_CELLS:.0e} positions x "
                "layers: the position-resolved prediction is skipped, rows use the late-token pair"]
    T = spec.seq_len
    late = DISTANCES if distances_fit(spec.layers, T, spec.heads, spec.alibi_scale if spec.alibi else 0.0) else (
        "the position-resolved prediction is skipped, and the late-token pair stands in (it overstates rho: near and "
        "far tokens alike get the correlation near ones gain by sharing keys" + (
            "; past the distance-resolved state's reach too: (layers + 1) x T x the heads' distinct windows "
            f"> {DISTANCE_CELLS:.0e}" if fits(spec.layers, T) else "") + ")")
    if spec.alibi and ((spec.layers + 1) * T * T > WINDOW_CELLS or (spec.layers + 1) * spec.heads * T**3 > ALIBI_FLOPS):
        most = int(min((WINDOW_CELLS / (spec.layers + 1)) ** 0.5,
                       (ALIBI_FLOPS / ((spec.layers + 1) * spec.heads)) ** (1 / 3)))
        return [f"ALiBi: its rows are resolved per position up to (layers + 1) x T^2 = {WINDOW_CELLS:.0e} and (layers "
                f"+ 1) x heads x T^3 = {ALIBI_FLOPS:.0e} (here T = {T}; --seq-len {most} fits): {late} (each head a "
                "window of its effective keys coth(m_h / 2))"]
    if spec.sliding_window and spec.sliding_window < T and (spec.layers + 1) * T * T > WINDOW_CELLS:
        most = int((WINDOW_CELLS / (spec.layers + 1)) ** 0.5)
        return [f"sliding window: its rows are resolved per position up to (layers + 1) x T^2 = {WINDOW_CELLS:.0e} "
                f"(here T = {T}; --seq-len {most} fits): {late}"]
    return []


DISTANCES = ("the late tokens are resolved by distance instead (core/distances.py: past its first W positions a "
             "window's row sees W keys and two tokens' overlap is a function of their distance; within 0.011 of the "
             "per-position engine's late-third rho where both run; the gradient the same way, within 4% at all but the "
             "first indices): the early positions are taken as late ones")


def causal_summary(spec, ct) -> dict | None:
    """Early/middle/late rho per layer and paper 003's per-position attention variance at block 1."""
    if ct is None or not spec.causal:
        return None
    T = spec.seq_len
    pos = sorted({int(m) for m in np.round(np.geomspace(1, T, 12))})
    out = {
        "rho_mean": [_f(x) for x in ct.rho_mean],
        "rho_early": [_f(x) for x in ct.rho_thirds[:, 0]],
        "rho_middle": [_f(x) for x in ct.rho_thirds[:, 1]],
        "rho_late": [_f(x) for x in ct.rho_thirds[:, 2]],
        "attention_variance_layer1": {"position": pos,
                                      "value": [_f(ct.attention_output_variance_layer1[m - 1]) for m in pos]},
    }
    if "position" not in spec.embeddings:
        out["note"] = ("no position embeddings: position information lives only in the causal attention's "
                       "variance, ~1/m at position m under uniform attention (Chi et al. 2023, Lemma 3)")
    return out


@dataclass
class Analysis:
    """Everything the findings and the report are built from, computed once."""

    stack: Stack
    trace: Trace
    ct: object  # the position-resolved causal trace, or None
    growth: dict
    width: dict | None
    qk: np.ndarray  # Result 2's scaled Q gradient per block
    ratio: np.ndarray  # Noci's Q/K-to-V gradient ratio per block
    loss: dict  # the expected step-0 loss (initadvisor.loss.initial_loss): expected, uniform, logit_std
    routing: dict | None  # a mixture of experts' routed branch (routing()), None when dense


def analyse(spec, stack: Stack | None = None, resolve: bool = True) -> Analysis:
    """The engine's run of the spec's stack (or a given one, e.g. a recipe's per-layer stack) and what derives
    from it: every analysis sees the same per-layer model. resolve=False: the pair engine alone (the late-token pair
    for causal and windowed rows)."""
    stack = from_spec(spec) if stack is None else stack
    ct = causal_trace(stack, backward=True) if resolve else None
    resolved = ct is not None and ct.grad_q is not None  # the gradient of every position, not the late pair's
    trace = propagate(stack, backward=not resolved, means=True)
    if resolved:
        trace = replace(trace, grad_q=ct.grad_q, grad_p=ct.grad_p, grad_scale=ct.grad_q[0], qk_share=ct.qk_share)
    return Analysis(stack, trace, ct, growth(stack, trace), width(stack, trace), *qk_laws(stack, trace),
                    initial_loss(spec, trace, stack, ct), routing(spec, trace))


def diagnose(spec, a: Analysis) -> list[Finding]:
    """Findings for one spec: every rule's check, in registry order (initadvisor.rules)."""
    return [f for rule in RULES.values() for f in rule.check(spec, a)]


def select(findings: list[Finding], chosen=(), ignored=()) -> list[Finding]:
    """Keep findings whose code starts with a selected prefix (all when none) and with no ignored prefix."""
    return [f for f in findings if (not chosen or any(f.code.startswith(c) for c in chosen))
            and not any(f.code.startswith(c) for c in ignored)]


def verdict(findings: list[Finding], fail_on: str) -> str:
    levels = {"error": ("error",), "warning": ("error", "warning"), "never": ()}[fail_on]
    return "fail" if any(f.severity in levels for f in findings) else "pass"


def _f(x) -> float:
    return float(f"{float(x):.6g}")


def layer_rows(a: Analysis) -> list[dict]:
    """Per-layer rows; for causal models q, p, rho are the position-resolved averages over all tokens."""
    rows = []
    trace, ct, qk, ratio = a.trace, a.ct, a.qk, a.ratio
    phases = phase(trace.beta, trace.beta_c)
    if ct is None:
        q, rho = trace.q, trace.rho
    else:
        q, rho = ct.q.mean(axis=1), ct.rho_mean
    for i in range(trace.q.shape[0]):
        row = {"index": i, "q": _f(q[i]), "p": _f(rho[i] * q[i]), "rho": _f(rho[i]),
               "grad_q": _f(trace.grad_q[i]), "grad_p": _f(trace.grad_p[i])}
        if i > 0:
            b = i - 1
            row.update(beta=_f(trace.beta[b]), beta_c=_f(trace.beta_c[b]), ipr=_f(trace.y2[b]),
                       attention_phase=str(phases[b]), qk_grad=_f(qk[b]), qk_to_v_grad_ratio=_f(ratio[b]),
                       qk_path_share=_f(trace.qk_share[b]))
        rows.append(row)
    return rows


def check(spec, fail_on: str = "error", chosen=None, ignored=None) -> dict:
    """Run the engine on a spec and build the `initadvisor.check/1` report (select/ignore: CLI, else spec).

    Values the engine cannot resolve (overflowed, underflowed) are null, each quantity named by an IA104."""
    a = analyse(spec)
    body, bad = clean({"growth": _clean(a.growth), "width": a.width, "causal": causal_summary(spec, a.ct),
                       "initial_loss": _clean(a.loss), "routing": a.routing, "layers": layer_rows(a)})
    findings = select(diagnose(spec, a) + overflow_findings(bad), spec.select if chosen is None else chosen,
                      spec.ignore if ignored is None else ignored)
    return {
        "schema": "initadvisor.check/1",
        "version": __version__,
        "spec": spec.to_dict(),
        "verdict": verdict(findings, fail_on),
        "findings": [asdict(f) for f in findings],
        **body,
        "notes": notes(spec),
    }


def _clean(d: dict) -> dict:
    return {k: _clean(v) if isinstance(v, dict) else (_f(v) if isinstance(v, float) else v) for k, v in d.items()}
