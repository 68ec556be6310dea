"""Presentation: the rich terminal report of `check` (JSON is printed by the CLI as it is)."""

from __future__ import annotations

from initadvisor.numbers import show

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
    if None not in rho:
        console.print(f"rho by depth  [dim]0[/] {sparkline(rho)} [dim]1[/]   "
                      f"(input {rho[0]:.3f} -> final {rho[-1]:.3f})")
    g = [r["grad_q"] for r in layers]
    if None not in g and max(g) > 0 and min(g) > 0:
        import math

        lg = [math.log10(x) for x in g]
        lo, hi = min(lg), max(lg)
        console.print(f"grad q (log)  [dim]{lo:+.1f}[/] {sparkline(lg, lo, hi if hi > lo else lo + 1)} "
                      f"[dim]{hi:+.1f}[/]   (input / top {g[0]:.3g})")
    t = Table(show_edge=False, header_style="bold")
    for col in ("layer", "q", "rho", "beta/beta_c", "IPR", "attention", "grad q"):
        t.add_column(col, justify="right")
    for i in _rows_to_show(len(layers)):
        r = layers[i]
        ratio = show(r["beta"] / r["beta_c"], ".3f") if i and None not in (r["beta"], r["beta_c"]) else "-"
        t.add_row(str(i), show(r["q"], ".4g"), show(r["rho"], ".4f"), ratio, show(r.get("ipr"), ".3g") if i else "-",
                  r.get("attention_phase", "input"), show(r["grad_q"], ".3g"))
    console.print(t)
    for note in report.get("notes", []):
        console.print(f"[dim]note: {note}[/]")
    if not report["findings"]:
        console.print("[green]no findings[/]")
    for f in report["findings"]:
        where = f" (layer {f['layer']})" if f["layer"] is not None else ""
        console.print(f"[{STYLE[f['severity']]}]{f['severity']:7}[/] [bold]{f['code']}[/]{where}: {f['message']}  "
                      f"[dim]{f['source']}[/]")


def render_summary(reports: list, console) -> None:
    """One line per spec after a multi-spec check."""
    from rich.table import Table

    t = Table(title="summary", show_edge=False, header_style="bold")
    for col in ("spec", "verdict", "final rho", "errors", "warnings"):
        t.add_column(col)
    for path, r in reports:
        sev = [f["severity"] for f in r["findings"]]
        colour = "green" if r["verdict"] == "pass" else "red"
        t.add_row(str(path), f"[{colour}]{r['verdict']}[/]", show(r["layers"][-1]["rho"], ".3f"),
                  str(sev.count("error")), str(sev.count("warning")))
    console.print(t)


def render_recommend(rep: dict, console) -> None:
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.table import Table

    spec = rep["spec"]
    a = rep["alpha_c"]
    lines = [
        f"[bold]beta[/] now {show(rep['beta'], '.4g')}; beta_c {show(rep['beta_c'], '.4g')} (binding at block "
        f"{rep['binding_layer']}); recommended beta {show(rep['beta_recommended'], '.4g')} = {rep['beta_margin']} x "
        f"beta_c/2 -> Q/K std [bold]{show(rep['qk_std'], '.4g')}[/]",
        f"[bold]alpha_c[/] (attention skip, rho < {rep['rho_max']}): "
        + (f"{a:.4g}  [dim]{rep['alpha_c_how']}[/]" if a is not None else f"none: {rep['alpha_c_how']}"),
        f"[bold]tau[/] (Noci eq. 47, median over layers): {show(rep['tau'], '.4g')}  [dim]{rep['tau_note']}[/]",
    ]
    if rep["alpha_c_mlp"] is not None:
        lines.insert(2, f"[bold]alpha_c (MLP skip)[/]: {rep['alpha_c_mlp']:.4g}")
    ds = rep["deepscalelm"]
    vo = ds["sigma_vo2_per_layer"]
    lines.append(f"[bold]DeepScaleLM[/] (k={show(ds['k'], 'g')}): lambda^2 {show(ds['lambda2'], '.4g')}, beta^2 "
                 f"{show(ds['beta2'], '.4g')}, sigma_e^2 {show(ds['sigma_e2'], '.4g')}, sigma_f^2 "
                 f"{show(ds['sigma_f2'], '.4g')}, sigma_qk^2 {show(ds['sigma_qk2'], '.4g')}, "
                 f"sigma_vo^2 {show(vo[0], '.4g')} .. {show(vo[-1], '.4g')} (per layer)")
    lines += [f"[yellow]caveat:[/] {c}" for c in ds["caveats"]]
    lines += [f"[{STYLE[f['severity']]}]{f['code']}:[/] {f['message']}" for f in rep.get("findings", [])]
    console.print(Panel("\n".join(lines), title=f"initadvisor recommend: {spec['name']}", expand=False))
    t = Table(show_edge=False, header_style="bold")
    for col in ("recipe", "final rho", "max beta/beta_c", "grad ratio", "verdict", "errors, warnings"):
        t.add_column(col, justify="left" if col in ("recipe", "findings") else "right")
    from initadvisor.rules import RULES

    for r in rep["recipes"]:
        style = {"pass": "green", "fail": "red"}.get(r["verdict"], "dim")
        shown = [c for c in r["findings"] if RULES[c].severity != "info"]  # the JSON keeps all codes
        t.add_row(r["name"], show(r["final_rho"], ".3f"), show(r["worst_beta_ratio"], ".3f"),
                  show(r["grad_ratio"], ".3g"), f"[{style}]{r['verdict']}[/]",
                  " ".join(shown) or (r["notes"][0] if r["verdict"] == "undefined" else ""))
    console.print(t)
    console.print(f"patched spec: the [bold]{rep['patched_recipe']}[/] recipe (`--format yaml` or `--out FILE`)")
    console.print(Syntax(rep["init_weights"], "python", theme="ansi_dark", word_wrap=True))
    for line in rep["residual_instructions"]:
        console.print(f"[dim]residual:[/] {line}")
