"""`verify`: theory beside a Monte-Carlo measurement of the actual random network, layer by layer.

A measurement is any mapping/object with per-stream arrays q, rho, grad_q_norm (and their `_se` standard
errors) and per-block y2 — `initadvisor.simulate.simulate` (numpy) or `initadvisor.torch.measure` (PyTorch).
The gate, per layer and gated quantity, with e the error, s its standard error (the measurement's SE carried
through the error's formula) and `allow` = tol (rho, absolute) or rtol (q and the gradient, relative):
pass when |e| + Z s <= allow (within tolerance even allowing Z standard errors of Monte-Carlo noise),
fail when |e| - Z s > allow (beyond tolerance by more than the noise), inconclusive in between: the
measurement is too noisy to decide, and the report says how many seeds would decide it. The verdict is fail
if any gated entry fails, else inconclusive if any is inconclusive, else pass. z = e / s is reported per entry.
The seed (one initialisation) is the independent unit (`pool_seeds`), so s is estimated from the seeds and Z is
the two-sided 95% Student-t quantile with seeds - 1 degrees of freedom (2.36 at the CLI's default 8 seeds, 2.26
at 10, 1.96 in the limit).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from initadvisor import __version__
from initadvisor.core.model import Trace
from initadvisor.numbers import clean, overflow_findings, ranges

GATED = ("rho", "q", "grad_q")
ABSOLUTE = ("rho", "grad_p")  # compared by difference: rho is bounded, grad_p (normalised) is often ~0


def _get(m, key):
    """An array of the measurement; the IPR is `y2` (numpy) or `ipr` (torch), None when not measured."""
    for k in (key, key.replace("y2", "ipr")):
        v = m.get(k) if isinstance(m, dict) else getattr(m, k, None)
        if v is not None:
            return np.asarray(v, dtype=float)
    return None


def _f(x) -> float | None:
    x = float(x)
    return float(f"{x:.6g}") if np.isfinite(x) else None


MAX_SEEDS = 1000  # the CLI's --seeds limit: suggestions above it are reported as "more than"


def z_crit(seeds: int) -> float:
    """Standard errors of Monte-Carlo noise a decision must clear: the 97.5% Student-t quantile, seeds - 1 dof."""
    from scipy.stats import t

    return float(t.ppf(0.975, seeds - 1)) if seeds >= 2 else np.inf


def _judge(err: float, err_se: float, allow: float, Z: float) -> str:
    """pass / fail / inconclusive of one entry (see the module docstring)."""
    if not np.isfinite(err):
        return "fail"
    if not np.isfinite(err_se * Z):
        return "inconclusive"
    if abs(err) + Z * err_se <= allow:
        return "pass"
    if abs(err) - Z * err_se > allow:
        return "fail"
    return "inconclusive"


def _seeds_to_decide(err: float, err_se: float, allow: float, seeds: int) -> float:
    """Seeds at which z_crit standard errors fit between |err| and allow and within allow / 2 (SE ~ 1/sqrt(seeds);
    the error itself is noisy, so the band must also be narrow against the tolerance)."""
    gap = min(abs(allow - abs(err)), allow / 2)
    if not np.isfinite(err_se) or gap == 0:
        return np.inf
    n = float(seeds)
    for _ in range(20):  # fixed point: z_crit depends on the number of seeds
        r = z_crit(max(2, int(np.ceil(n)))) * err_se / gap
        if not r < 1e150:  # beyond any run (the square would overflow a float)
            return np.inf
        n = max(float(seeds), seeds * r * r)
    return n


def _seeds_of(m) -> int:
    v = m.get("seeds") if isinstance(m, dict) else getattr(m, "seeds", None)
    return int(v) if v else 1


def pool_seeds(per_seed: list) -> dict:
    """One measurement from per-seed measurements (`simulate` Measurements or `initadvisor.torch.measure` dicts
    of one seed each, all with the same batch): means as over all sequences, standard errors over SEEDS.

    The sequences of one initialisation share its weights, whose randomness dominates: on bert-base the
    spread of rho and of the gradient between seeds is about 10x the spread between sequences of one seed, so
    an SE over seeds x batch sequences taken as independent is too small by about sqrt(batch)."""
    from initadvisor.simulate import mean_se, ratio_se

    def stack(key):
        vals = [_get(m, key) for m in per_seed]
        return None if any(v is None for v in vals) else np.stack(vals)

    q, p, gq, gp, y2 = stack("q"), stack("p"), stack("grad_q"), stack("grad_p"), stack("y2")
    L = q.shape[1] - 1
    ref = np.repeat(gq[:, L:L + 1], L + 1, axis=1)
    out: dict = {"seeds": len(per_seed)}
    with np.errstate(invalid="ignore"):
        out["q"], out["q_se"] = mean_se(q)
        out["rho"], out["rho_se"] = ratio_se(p, q)
        out["grad_q_norm"], out["grad_q_norm_se"] = ratio_se(gq, ref)
        out["grad_p_norm"], out["grad_p_norm_se"] = ratio_se(gp, ref)
        if y2 is not None:
            out["y2"], out["y2_se"] = mean_se(y2)
    return out


def theory_of(spec) -> tuple[Trace, dict | None]:
    """What a measurement of `spec`'s network is compared with: the engine's trace and, for causal models, the
    position-resolved averages over all tokens (`compare`'s `theory`)."""
    from initadvisor.core.model import propagate
    from initadvisor.diagnose import causal_trace
    from initadvisor.stack import from_spec

    net = from_spec(spec)
    ct = causal_trace(net, backward=True)
    resolved = None if ct is None else {"rho": ct.rho_mean, "q": ct.q.mean(axis=1), "ipr": ct.y2.mean(axis=1)}
    if ct is not None and ct.grad_q is not None:
        resolved.update(grad_q=ct.grad_q, grad_p=ct.grad_p)
    return propagate(net, means=True), resolved


def compare(spec, trace: Trace, m, tol: float = 0.05, rtol: float = 0.15, theory: dict | None = None) -> dict:
    """The `initadvisor.verify/1` report: per-layer theory, measurement, error, z, status and the verdict.

    `theory` replaces the trace's per-layer rho, q or ipr (causal models: position-resolved averages)."""
    th = {"rho": trace.rho, "q": trace.q, "grad_q": trace.grad_q, "grad_p": trace.grad_p, "ipr": trace.y2,
          **(theory or {})}
    ms = {"rho": (_get(m, "rho"), _get(m, "rho_se")), "q": (_get(m, "q"), _get(m, "q_se")),
          "grad_q": (_get(m, "grad_q_norm"), _get(m, "grad_q_norm_se")),
          "grad_p": (_get(m, "grad_p_norm"), _get(m, "grad_p_norm_se")), "ipr": (_get(m, "y2"), _get(m, "y2_se"))}
    if ms["ipr"][0] is None:  # not measured (a model that cannot return its attention probabilities)
        del th["ipr"], ms["ipr"]
    seeds = _seeds_of(m)
    Z = z_crit(seeds)
    layers, worst, max_z = [], {k: 0.0 for k in th}, {k: None for k in th}
    worst.setdefault("ipr", None)
    max_z.setdefault("ipr", None)
    bad: dict[str, list[int]] = {k: [] for k in GATED}
    unsure: dict[str, list[int]] = {k: [] for k in GATED}
    need = 0.0
    for i in range(spec.layers + 1):
        row: dict = {"index": i}
        for key in th:
            j = i - 1 if key == "ipr" else i
            if j < 0:
                continue
            t, (v, se) = float(th[key][j]), (float(ms[key][0][j]), float(ms[key][1][j]))
            if key in ABSOLUTE:
                err, err_se, allow = t - v, se, tol
            else:  # relative error t / v - 1: its SE by the delta method, |t| se / v^2
                err = (t - v) / v if v else np.inf
                err_se, allow = (abs(t) / abs(v) * se / abs(v) if v else np.inf), rtol  # v * v underflows at 1e-170
            z = 0.0 if err == 0 else err / err_se if err_se > 0 else np.inf if err_se == 0 else np.nan
            status = _judge(err, err_se, allow, Z)
            row[key] = {"theory": _f(t), "measured": _f(v), "se": _f(se), "error": _f(err), "ok": status == "pass",
                        "z": _f(z) if np.isfinite(z) else None, "status": status}  # None: no SE (one seed)
            worst[key] = max(worst[key], abs(err))
            if np.isfinite(z):
                max_z[key] = max(max_z[key] or 0.0, abs(z))
            if key in GATED and status == "fail":
                bad[key].append(i)
            elif key in GATED and status == "inconclusive":
                unsure[key].append(i)
                need = max(need, _seeds_to_decide(err, err_se, allow, seeds))
        layers.append(row)
    failed, inconclusive = any(bad.values()), any(unsure.values())
    verdict = "fail" if failed else "inconclusive" if inconclusive else "pass"
    suggested = None if verdict != "inconclusive" or not np.isfinite(need) else int(np.ceil(need))
    rep = {
        "schema": "initadvisor.verify/1", "version": __version__, "spec": spec.to_dict(),
        "tol": tol, "rtol": rtol, "gated": list(GATED), "verdict": verdict,
        "max_error": {k: None if v is None else _f(v) for k, v in worst.items()},
        "z_crit": _f(Z), "max_z": {k: None if v is None else _f(v) for k, v in max_z.items()},
        "failed": {k: v for k, v in bad.items() if v}, "inconclusive": {k: v for k, v in unsure.items() if v},
        "seeds_suggested": None if suggested is None or suggested > MAX_SEEDS else suggested,
        "reason": _reason(verdict, bad, unsure, suggested, seeds, tol, rtol, Z),
        "layers": layers,
    }
    rep, nulled = clean(rep)
    rep["findings"] = [asdict(f) for f in overflow_findings(nulled)]
    return rep


def _reason(verdict, bad, unsure, suggested, seeds, tol, rtol, Z) -> str:
    allow = {"rho": f"{tol:g} (absolute)", "q": f"{rtol:.0%}", "grad_q": f"{rtol:.0%}"}
    noise = f"{Z:.3g} standard errors" if np.isfinite(Z) else "the noise (one seed: no standard error)"
    if verdict == "pass":
        return f"every gated error is within tolerance by more than {noise}"
    if verdict == "fail":
        parts = [f"{k} at layers {ranges(v)}" for k, v in bad.items() if v]
        return f"error beyond tolerance by more than {noise}: " + "; ".join(parts)
    parts = [f"{k} at layers {ranges(v)} (tolerance {allow[k]})" for k, v in unsure.items() if v]
    if seeds < 2:
        return "inconclusive: one seed gives no standard error (the seed is the independent unit): use --seeds 2 or more"
    if suggested is None:
        more = "the measured error sits at the tolerance: more seeds narrow it only slowly"
    elif suggested > MAX_SEEDS:
        more = f"more than {MAX_SEEDS} seeds would be needed to decide"
    else:
        more = f"about {suggested} seeds (now {seeds}) would narrow the noise enough to decide"
    return (f"inconclusive: Monte-Carlo noise ({Z:.3g} standard errors) straddles the tolerance for "
            + "; ".join(parts) + f"; {more}")
