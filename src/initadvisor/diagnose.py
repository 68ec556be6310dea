"""Diagnosis: turn an engine Trace of a Spec into findings with stable codes, and the JSON report."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from initadvisor import __version__
from initadvisor.core import gradients as G
from initadvisor.core.attention import phase
from initadvisor.core.model import Trace, block_params, run_spec
from initadvisor.rules import RULES


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    message: str
    layer: int | None
    source: str


def finding(code: str, message: str, layer: int | None = None) -> Finding:
    r = RULES[code]
    return Finding(code, r.severity, message, layer, r.source)


def qk_laws(spec, trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Per block: Result 2's scaled Q gradient and Noci's Q/K-to-V gradient ratio at the attention input."""
    P = block_params(spec)
    q, p = trace.att_q, trace.att_p
    qk = G.qk_grad(trace.beta, P.g_v * P.g_o, q, p, trace.y2, trace.y3, trace.beta_c)
    tau2 = trace.beta**2 * np.log(spec.seq_len)  # score variance for unit inputs (Noci's tau^2)
    ratio = G.qk_to_v_grad_ratio(tau2, q, p / q, spec.seq_len, spec.d_model)
    return qk, ratio


def width(spec, trace: Trace) -> dict | None:
    """Paper 002 at block 1: spectral gap of the attention matrix and stable rank of its output vs T."""
    if spec.attention != "softmax":
        return None
    from initadvisor.core.spectral import attention_spectrum, stable_rank_attention_output, width_collapse

    q, p = float(trace.att_q[0]), float(trace.att_p[0])
    V = float(trace.beta[0] ** 2 * q * (q - p) * np.log(spec.seq_len))  # key-dependent score variance
    rho, T, d = p / q, float(spec.seq_len), spec.d_model
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


def growth(spec, trace: Trace) -> dict:
    return {"forward": G.forward_growth(trace.q), "gradient": G.gradient_growth(trace.grad_q, trace.q, spec.norm)}


def causal_trace(spec):
    """The position-resolved prediction for causal models (None otherwise)."""
    if not spec.causal:
        return None
    from initadvisor.core.causal import propagate_causal

    return propagate_causal(spec)


def causal_summary(spec, ct) -> dict | None:
    """Early/middle/late rho per layer and paper 003's per-position attention variance at block 1."""
    if ct is None:
        return None
    T = spec.seq_len
    pos = sorted({int(m) for m in np.unique(np.round(np.geomspace(1, T, 12)))})
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

    trace: Trace
    ct: object  # the position-resolved causal trace, or None
    growth: dict
    width: dict | None
    qk: np.ndarray  # Result 2's scaled Q gradient per block
    ratio: np.ndarray  # Noci's Q/K-to-V gradient ratio per block


def analyse(spec, trace: Trace | None = None) -> Analysis:
    """The engine's trace of the spec (or a given one, e.g. a recipe's per-layer run) and what derives from it."""
    trace = run_spec(spec) if trace is None else trace
    return Analysis(trace, causal_trace(spec), growth(spec, trace), width(spec, trace), *qk_laws(spec, trace))


def diagnose(spec, a: Analysis) -> list[Finding]:
    """Findings for one spec; `layer` is the stream index (0 = input, i = after block i).

    For causal models collapse is judged on the late third of positions, where it sets in first (001 C.6)."""
    trace, ct = a.trace, a.ct
    th = spec.thresholds
    out: list[Finding] = []
    rho = trace.rho if ct is None else ct.rho_thirds[:, 2]
    hit = np.flatnonzero(rho >= th["rank_collapse_rho"])
    if hit.size:
        k = int(hit[0])
        out.append(finding("IA101", f"rho reaches {rho[k]:.4f} >= {th['rank_collapse_rho']} at layer {k} "
                                    f"of {spec.layers} (final rho {rho[-1]:.4f})", k))
    elif rho[-1] >= th["collapse_trend_rho"]:
        out.append(finding("IA102", f"final rho {rho[-1]:.4f} >= {th['collapse_trend_rho']} "
                                    f"(rho rises from {rho[0]:.3f} at the input)", spec.layers))
    grow = float(trace.q[-1] / trace.q[min(1, spec.layers)])
    lim = th["forward_ratio_max"]
    if not 1 / lim <= grow <= lim:
        out.append(finding("IA103", f"forward variance changes {grow:.3g}x from block 1 to block {spec.layers} "
                                    f"(outside [{1 / lim:g}, {lim:g}])", spec.layers))
    x = trace.beta / trace.beta_c
    worst = int(np.argmax(x))
    if x[worst] >= 1.0:
        out.append(finding("IA201", f"beta {trace.beta[worst]:.3f} >= beta_c {trace.beta_c[worst]:.3f} at block "
                                    f"{worst + 1} (IPR Y2 {trace.y2[worst]:.3f}; {int((x >= 1).sum())} of "
                                    f"{spec.layers} blocks localized)", worst + 1))
    elif x[worst] >= 0.5:
        out.append(finding("IA202", f"beta {trace.beta[worst]:.3f} is in [beta_c/2, beta_c) = "
                                    f"[{trace.beta_c[worst] / 2:.3f}, {trace.beta_c[worst]:.3f}) at block "
                                    f"{worst + 1}", worst + 1))
    law = a.growth["gradient"]
    end = law["blocks"]
    how = {"hyperbolic": lambda: f"hyperbolic, exponent {law['exponent']:.2f}",
           "exponential": lambda: f"exponential, factor {law['per_layer_factor']:.4f} per layer"}
    desc = how[law["law"]]() if law["law"] in how else law["law"]
    if end > th["grad_explode"]:
        out.append(finding("IA301", f"gradient second moment grows {end:.3g}x from block {spec.layers} to block 1 "
                                    f"({desc}) > {th['grad_explode']:g}", 1))
    elif end < th["grad_vanish"]:
        out.append(finding("IA302", f"gradient second moment shrinks to {end:.3g} of its top value at "
                                    f"block 1 ({desc}) < {th['grad_vanish']:g}", 1))
    ratio = a.ratio
    worst = int(np.argmin(ratio))
    if ratio[worst] < th["qk_grad_ratio_min"]:
        out.append(finding("IA303", f"Q/K-to-V gradient ratio {ratio[worst]:.2e} < {th['qk_grad_ratio_min']:g} "
                                    f"at block {worst + 1} (rho {trace.att_p[worst] / trace.att_q[worst]:.3f} "
                                    f"at its input)", worst + 1))
    if x[0] < 0.5:
        out.append(finding("IA304", f"block 1 attends uniformly (IPR {trace.y2[0]:.2e}): Result 2's Q/K gradient "
                                    f"factor E tr(M^2) = {G.jacobian_trace(trace.y2[0], trace.y3[0], x[0]):.2e} "
                                    f"(at most 1/12, reached at beta = 2 beta_c)", 1))
    w = a.width
    if w and w["collapsed"]:
        out.append(finding("IA401", f"one attention layer's output has stable rank {w['stable_rank']:.3g} at "
                                    f"T = {w['seq_len']} against {w['stable_rank_centered']:.3g} with centered "
                                    f"attention (spectral gap sigma1/sigma2 = {w['gap_ratio']:.3g})", 1))
    if ct is not None:
        e, m, late = ct.rho_thirds[-1]
        out.append(finding("IA901", f"causal attention, position-resolved: final rho {e:.3f} / {m:.3f} / "
                                    f"{late:.3f} for early / middle / late tokens (mean {ct.rho_mean[-1]:.3f}); "
                                    "attention phase and gradients from the late-token pair (001 C.6)"))
    return out


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
                       attention_phase=str(phases[b]), qk_grad=_f(qk[b]), qk_to_v_grad_ratio=_f(ratio[b]))
        rows.append(row)
    return rows


def check(spec, fail_on: str = "error", chosen=None, ignored=None) -> dict:
    """Run the engine on a spec and build the `initadvisor.check/1` report (select/ignore: CLI, else spec)."""
    a = analyse(spec)
    findings = select(diagnose(spec, a), spec.select if chosen is None else chosen,
                      spec.ignore if ignored is None else ignored)
    return {
        "schema": "initadvisor.check/1",
        "version": __version__,
        "spec": spec.to_dict(),
        "verdict": verdict(findings, fail_on),
        "findings": [asdict(f) for f in findings],
        "growth": _clean(a.growth),
        "width": a.width,
        "causal": causal_summary(spec, a.ct),
        "layers": layer_rows(a),
    }


def _clean(d: dict) -> dict:
    return {k: _clean(v) if isinstance(v, dict) else (_f(v) if isinstance(v, float) else v) for k, v in d.items()}
