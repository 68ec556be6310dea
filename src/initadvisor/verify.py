"""`verify`: theory beside a Monte-Carlo measurement of the actual random network, layer by layer.

A measurement is any mapping/object with per-stream arrays q, rho, grad_q_norm (and their `_se` standard
errors) and per-block y2 — `initadvisor.simulate.simulate` (numpy) or `initadvisor.torch.measure` (PyTorch).
The gate: |rho error| <= tol and |relative error| <= rtol for q and the gradient, each allowed two standard
errors of Monte-Carlo noise on top.
"""

from __future__ import annotations

import numpy as np

from initadvisor import __version__
from initadvisor.core.model import Trace

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


def compare(spec, trace: Trace, m, tol: float = 0.05, rtol: float = 0.15, theory: dict | None = None) -> dict:
    """The `initadvisor.verify/1` report: per-layer theory, measurement, error and pass/fail.

    `theory` replaces the trace's per-layer rho, q or ipr (causal models: position-resolved averages)."""
    th = {"rho": trace.rho, "q": trace.q, "grad_q": trace.grad_q, "grad_p": trace.grad_p, "ipr": trace.y2,
          **(theory or {})}
    ms = {"rho": (_get(m, "rho"), _get(m, "rho_se")), "q": (_get(m, "q"), _get(m, "q_se")),
          "grad_q": (_get(m, "grad_q_norm"), _get(m, "grad_q_norm_se")),
          "grad_p": (_get(m, "grad_p_norm"), _get(m, "grad_p_norm_se")), "ipr": (_get(m, "y2"), _get(m, "y2_se"))}
    if ms["ipr"][0] is None:  # not measured (a model that cannot return its attention probabilities)
        del th["ipr"], ms["ipr"]
    layers, worst = [], {k: 0.0 for k in th}
    worst.setdefault("ipr", None)
    ok = True
    for i in range(spec.layers + 1):
        row: dict = {"index": i}
        for key in th:
            j = i - 1 if key == "ipr" else i
            if j < 0:
                continue
            t, (v, se) = float(th[key][j]), (float(ms[key][0][j]), float(ms[key][1][j]))
            err = t - v if key in ABSOLUTE else (t - v) / v if v else np.inf
            allow = (tol + 2 * se) if key in ABSOLUTE else (rtol + 2 * se / abs(v) if v else np.inf)
            good = bool(abs(err) <= allow)
            row[key] = {"theory": _f(t), "measured": _f(v), "se": _f(se), "error": _f(err), "ok": good}
            worst[key] = max(worst[key], abs(err))
            ok &= good or key not in GATED
        layers.append(row)
    return {
        "schema": "initadvisor.verify/1", "version": __version__, "spec": spec.to_dict(),
        "tol": tol, "rtol": rtol, "gated": list(GATED), "verdict": "pass" if ok else "fail",
        "max_error": {k: None if v is None else _f(v) for k, v in worst.items()},
        "layers": layers,
    }


def render_verify(rep: dict, console) -> None:
    from rich.table import Table

    from initadvisor.report import _rows_to_show

    m = rep["measurement"]
    console.width = max(console.width, 132)  # twelve numeric columns: wrap rather than truncate them
    console.print(f"[bold]initadvisor verify[/]: {rep['spec']['name']}  backend {m['backend']}, {m['seeds']} seeds x "
                  f"{m['batch']} sequences, {m['seconds']:.1f} s")
    t = Table(show_edge=False, header_style="bold")
    for col in ("layer", "rho theory", "rho MC", "err", "q theory", "q MC", "rel err", "grad theory", "grad MC",
                "rel err", "IPR theory", "IPR MC"):
        t.add_column(col, justify="right")

    def cell(r, key, what):
        c = r.get(key)
        if c is None or c[what] is None:
            return "-"
        s = f"{c[what]:+.3f}" if what == "error" else f"{c[what]:.4g}"
        return s if what != "error" or c["ok"] or key not in GATED else f"[red]{s}[/]"

    for i in _rows_to_show(len(rep["layers"]), 16):
        r = rep["layers"][i]
        t.add_row(str(i), cell(r, "rho", "theory"), cell(r, "rho", "measured"), cell(r, "rho", "error"),
                  cell(r, "q", "theory"), cell(r, "q", "measured"), cell(r, "q", "error"),
                  cell(r, "grad_q", "theory"), cell(r, "grad_q", "measured"), cell(r, "grad_q", "error"),
                  cell(r, "ipr", "theory"), cell(r, "ipr", "measured"))
    console.print(t)
    e = rep["max_error"]
    colour = "green" if rep["verdict"] == "pass" else "red"
    console.print(f"max |error|: rho {e['rho']:.3g} (tol {rep['tol']}), q {e['q']:.1%}, grad {e['grad_q']:.1%} "
                  f"(rtol {rep['rtol']:.0%}); not gated: grad_p {e['grad_p']:.3g} (abs), "
                  f"IPR {'-' if e['ipr'] is None else format(e['ipr'], '.1%')}  "
                  f"verdict: [bold {colour}]{rep['verdict'].upper()}[/]")
