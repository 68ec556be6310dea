"""Presentation: the rich terminal report of `check` (JSON is printed by the CLI as it is)."""

from __future__ import annotations

SPARK = "▁▂▃▄▅▆▇█"
STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def sparkline(values, lo: float = 0.0, hi: float = 1.0, width: int = 48) -> str:
    """Values resampled to at most `width` bars between lo and hi."""
    n = len(values)
    idx = [round(i * (n - 1) / max(width - 1, 1)) for i in range(min(width, n))]
    span = (hi - lo) or 1.0
    return "".join(SPARK[min(7, max(0, int((values[i] - lo) / span * 7.999)))] for i in idx)


def _rows_to_show(n: int, limit: int = 14) -> list[int]:
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


def render_check(report: dict, console) -> None:
    from rich.panel import Panel
    from rich.table import Table

    spec, layers = report["spec"], report["layers"]
    m = spec["model"]
    ok = report["verdict"] == "pass"
    head = (f"[bold]{spec['name']}[/]  {m['layers']} layers, d={m['d_model']}, {m['heads']} heads, "
            f"{m['norm']}-LN, {m['activation']}, T={spec['sequence']['length']}"
            f"{', causal' if m['causal'] else ''}")
    console.print(Panel(f"{head}\nverdict: [{'bold green' if ok else 'bold red'}]{report['verdict'].upper()}[/]",
                        title="initadvisor check", expand=False))
    rho = [r["rho"] for r in layers]
    console.print(f"rho by depth  [dim]0[/] {sparkline(rho)} [dim]1[/]   "
                  f"(input {rho[0]:.3f} -> final {rho[-1]:.3f})")
    g = [r["grad_q"] for r in layers]
    if max(g) > 0 and min(g) > 0:
        import math

        lg = [math.log10(x) for x in g]
        lo, hi = min(lg), max(lg)
        console.print(f"grad q (log)  [dim]{lo:+.1f}[/] {sparkline(lg, lo, hi if hi > lo else lo + 1)} "
                      f"[dim]{hi:+.1f}[/]   (input/output ratio {g[0]:.3g})")
    t = Table(show_edge=False, header_style="bold")
    for col in ("layer", "q", "rho", "beta/beta_c", "IPR", "attention", "grad q"):
        t.add_column(col, justify="right")
    for i in _rows_to_show(len(layers)):
        r = layers[i]
        ratio = f"{r['beta'] / r['beta_c']:.3f}" if "beta" in r else "-"
        t.add_row(str(i), f"{r['q']:.4g}", f"{r['rho']:.4f}", ratio, f"{r.get('ipr', 0):.3g}" if i else "-",
                  r.get("attention_phase", "input"), f"{r['grad_q']:.3g}")
    console.print(t)
    for note in report.get("notes", []):
        console.print(f"[dim]note: {note}[/]")
    if not report["findings"]:
        console.print("[green]no findings[/]")
    for f in report["findings"]:
        where = f" (layer {f['layer']})" if f["layer"] is not None else ""
        console.print(f"[{STYLE[f['severity']]}]{f['severity']:7}[/] [bold]{f['code']}[/]{where}: {f['message']}  "
                      f"[dim]{f['source']}[/]")
