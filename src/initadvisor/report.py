"""The terminal presentation of every command (rich): check, recommend, verify, diagram, sweep, audit. The JSON is
the report itself (`.to_json()`), the CI formats are in initadvisor.formats and the pictures in initadvisor.plots."""

from __future__ import annotations

import math

import numpy as np

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
        "beta_c/2 -> " + ("the critical recipe's softmax scale (QK-norm)" if spec["model"]["qk_norm"] != "none"
                          else "the critical recipe's softmax scale (latent attention)" if "latent_attention" in spec
                          else f"Q/K std [bold]{show(rep['qk_std'], '.4g')}[/]"),
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


def render_verify(rep: dict, console) -> None:
    from rich.table import Table

    from initadvisor.verification import GATED

    m = rep["measurement"]
    console.width = max(console.width, 160)  # fifteen numeric columns: wrap rather than truncate them
    console.print(f"[bold]initadvisor verify[/]: {rep['spec']['name']}  backend {m['backend']}, {m['seeds']} seeds x "
                  f"{m['batch']} sequence{'' if m['batch'] == 1 else 's'}, {m['seconds']:.1f} s")
    t = Table(show_edge=False, header_style="bold")
    for col in ("layer", "rho theory", "rho MC", "err", "z", "q theory", "q MC", "rel err", "z", "grad theory",
                "grad MC", "rel err", "z", "IPR theory", "IPR MC"):
        t.add_column(col, justify="right")
    colour = {"fail": "red", "inconclusive": "yellow"}

    def cell(r, key, what):
        c = r.get(key)
        if c is None or c.get(what) is None:
            return "-"
        v = c[what]
        s = f"{v:+.3f}" if what == "error" else (f"{v:+.1f}" if abs(v) < 100 else f"{v:+.0f}") if what == "z" \
            else f"{v:.4g}"
        hue = colour.get(c.get("status", "pass" if c["ok"] else "fail")) if key in GATED else None
        return f"[{hue}]{s}[/]" if hue and what in ("error", "z") else s

    shown = set(_rows_to_show(len(rep["layers"]), 16))
    off = sorted({i for v in (*rep.get("failed", {}).values(), *rep.get("inconclusive", {}).values()) for i in v})
    shown |= set(off[:8])  # a few of the layers that did not pass, if the even spacing skipped them
    for i in sorted(shown):
        r = rep["layers"][i]
        t.add_row(str(i), *(cell(r, k, w) for k, ws in (("rho", ("theory", "measured", "error", "z")),
                                                        ("q", ("theory", "measured", "error", "z")),
                                                        ("grad_q", ("theory", "measured", "error", "z")),
                                                        ("ipr", ("theory", "measured"))) for w in ws))
    console.print(t)
    e, z = rep["max_error"], rep.get("max_z", {})
    hue = {"pass": "green", "fail": "red"}.get(rep["verdict"], "yellow")

    def zs(k):
        return "" if z.get(k) is None else f" (max |z| {z[k]:.3g})"

    console.print(f"max |error|: rho {show(e['rho'])}{zs('rho')} (tol {rep['tol']}), q {show(e['q'], '.1%')}"
                  f"{zs('q')}, grad {show(e['grad_q'], '.1%')}{zs('grad_q')} (rtol {rep['rtol']:.0%}); not gated: "
                  f"grad_p {show(e['grad_p'])} (abs), IPR {show(e['ipr'], '.1%')}")
    console.print(f"verdict: [bold {hue}]{rep['verdict'].upper()}[/]  {rep.get('reason', '')}")


def render_sweep(result: dict, console) -> None:
    """The sweep as a table: one row per configuration, RMS and mean |x| per module, the exponents below."""
    from rich.table import Table

    from initadvisor.coords import MODULES

    console.width = max(console.width, 150)  # eleven numeric columns: wrap rather than truncate them
    spec, axis = result["spec"], result["axis"]
    console.print(f"[bold]initadvisor sweep[/]: {spec['name']}  coordinate check at init over {axis} "
                  f"{', '.join(map(str, result['values']))}")
    for line in (result["held"], *result["notes"]):
        console.print(f"[dim]{line}[/]")
    t = Table(show_edge=False, header_style="bold")
    t.add_column(axis, justify="right")
    for m in MODULES:
        t.add_column(f"{m} rms", justify="right")
        t.add_column("mean|x|", justify="right")
    for c in result["configs"]:
        t.add_row(str(c["value"]), *(show(c["modules"][m][k], ".4g") for m in MODULES for k in ("rms", "mean_abs")))
    t.add_row("[bold]exponent[/]", *(x for m in MODULES for x in (show(result["exponents"][m], "+.3f"), "")))
    console.print(t)
    for m, what in MODULES.items():
        console.print(f"[dim]{m}: {what}[/]")
    console.print(f"[dim]exponent: {result['fit']}[/]")


def _num(x: float | None, fmt: str = ".3g") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def render_audit(report, console) -> None:
    """The terminal view: the per-tensor table (biases and other parameters only where a finding names them),
    the findings, the check report's verdict, the notes."""
    from rich.table import Table

    from initadvisor.rules import RULES

    t = Table(title=f"{report.model}: init audit against {report.intent}", show_edge=False, header_style="bold")
    for col in ("block", "role", "tensor", "std", "intended", "factor", "mean", "max/std", "findings"):
        t.add_column(col, justify="left" if col in ("role", "tensor", "findings") else "right")
    for r in report.tensors:
        if r.kind in ("bias", "param") and not r.codes:
            continue
        role = f"{r.role} (1 + w)" if r.convention == "1 + w" else r.role + (" bias" if r.kind == "bias" else "")
        intended = "gain 1" if r.kind == "gain" and r.intended_mean is not None else _num(r.intended_std)
        t.add_row(_num(r.block, "d"), role, r.name, _num(r.std), intended, _num(r.factor),
                  _num(r.mean, ".2g"), _num(r.max_abs / r.std if r.std else None), " ".join(r.codes))
    console.print(t)
    color = {"error": "red", "warning": "yellow", "info": "cyan"}
    for f in report.findings:
        console.print(f"[{color[f.severity]}]{f.code} {f.severity}[/] {RULES[f.code].name}: ", end="")
        console.print(f.message, markup=False, highlight=False)
    if not report.findings:
        console.print("no init findings: the weights are as intended", markup=False)
    if report.check is not None:
        codes = ", ".join(f"{f['code']} ({f['severity']})" for f in report.check["findings"]) or "no findings"
        console.print(f"check of the spec of the weights as they are: {report.check['verdict']}: {codes}",
                      markup=False, highlight=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False)


COLORS = {"trainable": "#3b7dd8", "rank_collapse": "#f2c12e", "entropy_collapse": "#d64541"}  # shared with plots
NAMES = {"trainable": "trainable", "rank_collapse": "rank collapse", "entropy_collapse": "entropy collapse"}
_CORNER = {("R", "D"): "┘", ("R", "U"): "┐", ("L", "D"): "└", ("L", "U"): "┌"}


def _edge_glyph(mask: np.ndarray, r: int, c: int) -> str:
    """Boundary glyph of a region cell (row r counts upwards); the plot's own edges are not boundaries."""
    h, w = mask.shape

    def out(rr: int, cc: int) -> bool:
        return 0 <= rr < h and 0 <= cc < w and not mask[rr, cc]

    right, left, up, down = out(r, c + 1), out(r, c - 1), out(r + 1, c), out(r - 1, c)
    side = "R" if right else "L" if left else None
    vert = "U" if up else "D" if down else None
    if side and vert:
        return _CORNER[(side, vert)]
    return "│" if side else "─" if vert else " "


def _sample(n_src: int, n_dst: int) -> np.ndarray:
    return np.unique(np.round(np.linspace(0, n_src - 1, n_dst)).astype(int)) if n_dst < n_src else np.arange(n_src)


def _fmt(v) -> str:
    return f"{v:d}" if isinstance(v, int) else show(v)


def _region_mask(result: dict, xs: list, ys: list) -> np.ndarray | None:
    """Recommended region on the rendered grid, or None when neither axis carries one of its limits."""
    rec = result.get("recommended") or {}
    limits = []  # (axis index 0 = x / 1 = y, value, side)
    for k, name in enumerate((result["x"]["name"], result["y"]["name"])):
        if name == "beta" and rec.get("beta_max") is not None:
            limits.append((k, rec["beta_max"], "below"))
        if name in ("alpha_sa", "alpha_mlp") and rec.get(f"{name}_min") is not None:
            limits.append((k, rec[f"{name}_min"], "above"))
    if not limits:
        return None
    X, Y = np.meshgrid(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))
    mask = np.ones(X.shape, dtype=bool)
    for k, v, side in limits:
        A = X if k == 0 else Y
        mask &= (A < v) if side == "below" else (A >= v)
    return mask


def render_diagram(result: dict, console, max_width: int | None = None, max_height: int = 32) -> None:
    """A coloured character grid: one cell per (sampled) grid point, y upwards, with the spec's point (●),
    the recommended region's boundary and a legend."""
    from rich.text import Text

    from initadvisor.phase_diagram import PHASES

    xa, ya = result["x"], result["y"]
    phase = result["phase"]
    ny, nx = len(ya["values"]), len(xa["values"])
    ylabels = [_fmt(v) for v in ya["values"]]
    lw = max(len(s) for s in ylabels)
    width = (max_width or console.width) - lw - 3 - len(xa["name"]) - 3
    ix = _sample(nx, max(8, min(width, 96)))
    iy = _sample(ny, max(6, min(max_height, len(ix) // 2 + 1)))
    xs = [xa["values"][i] for i in ix]
    ys = [ya["values"][j] for j in iy]
    mask = _region_mask(result, xs, ys)
    sp = result.get("spec_point") or {}
    px = py = None
    if sp and xs[0] <= sp["x"] <= xs[-1] and ys[0] <= sp["y"] <= ys[-1]:
        px = int(np.argmin(np.abs(_scaled(xs, xa["scale"]) - _scaled([sp["x"]], xa["scale"])[0])))
        py = int(np.argmin(np.abs(_scaled(ys, ya["scale"]) - _scaled([sp["y"]], ya["scale"])[0])))
    title = (f"[bold]trainability diagram[/]  {result.get('spec_name', '')}  ({result.get('layers', '?')} layers): "
             f"{xa['name']} x {ya['name']}, {nx} x {ny} points")
    console.print(title)
    console.print(f"{'':>{lw}} [bold]{ya['name']}[/]  [dim]({ya['label']}, {ya['scale']})[/]")
    label_rows = {len(iy) - 1, 0, (len(iy) - 1) // 2}
    for r in range(len(iy) - 1, -1, -1):
        j = iy[r]
        line = Text(f"{ylabels[j] if r in label_rows else '':>{lw}} ┤ " if r in label_rows else f"{'':>{lw}} │ ")
        for c, i in enumerate(ix):
            ph = phase[j][i]
            ch, fg = " ", "black"
            if mask is not None and mask[r, c]:
                ch = _edge_glyph(mask, r, c)
                fg = "bold white"
            if r == py and c == px:
                ch, fg = "●", "bold white"
            line.append(ch, style=f"{fg} on {COLORS[ph]}")
        console.print(line)
    axis = f"{'':>{lw}} └─" + "─" * len(ix)
    console.print(axis)
    left, mid, right = _fmt(xs[0]), _fmt(xs[len(xs) // 2]), _fmt(xs[-1])
    n = len(ix)
    ticks = [" "] * (n + 12)
    used = -1  # labels are placed left to right and never overlap (a narrow grid shows fewer)
    for pos, s in ((0, left), (n // 2 - len(mid) // 2, mid), (n - len(right), right)):
        pos = max(pos, used + 2 if used >= 0 else 0)
        if pos + len(s) <= len(ticks):
            ticks[pos:pos + len(s)] = list(s)
            used = pos + len(s) - 1
    console.print(f"{'':>{lw}}   " + "".join(ticks).rstrip() + f"   [bold]{xa['name']}[/]")
    console.print(f"{'':>{lw}}   [dim]x: {xa['label']}, {xa['scale']}[/]")
    legend = Text("  ")
    counts = result.get("counts", {})
    total = max(1, nx * ny)
    for ph in PHASES:
        legend.append("  ", style=f"on {COLORS[ph]}")
        legend.append(f" {NAMES[ph]} {100 * counts.get(ph, 0) / total:.0f}%   ")
    console.print(legend)
    if sp:
        where = "" if px is not None else "  [dim](outside the plotted ranges)[/]"
        console.print(f"  ● the spec: {xa['name']} = {_fmt(sp['x'])}, {ya['name']} = {_fmt(sp['y'])}{where}")
    rec = result.get("recommended")
    if rec:
        parts = [f"beta < beta_c/2 = {show(rec['beta_max'])}"]
        if rec.get("alpha_sa_min") is not None:
            parts.append(f"alpha_sa >= alpha_c = {show(rec['alpha_sa_min'])}")
        if rec.get("alpha_mlp_min") is not None:
            parts.append(f"alpha_mlp >= {show(rec['alpha_mlp_min'])}")
        drawn = "outlined" if mask is not None and mask.any() else "not on these axes"
        console.print(f"  recommended region ({drawn}): " + " and ".join(parts)
                      + f"  [dim](rho < {rec['rho_max']:g}; `initadvisor recommend`)[/]")


def _scaled(v, scale: str) -> np.ndarray:
    a = np.asarray(v, dtype=float)
    return np.log(a) if scale == "log" else a
