"""matplotlib figures (optional extra `plot`): the trainability diagram and per-layer profiles of `check`.

matplotlib is imported inside the functions, with the non-interactive Agg backend; the format follows the
file's suffix (.png, .svg, .pdf).
"""

from __future__ import annotations

from pathlib import Path

from initadvisor.phase_diagram import PHASES
from initadvisor.report import COLORS, NAMES

GREEK = {"beta": r"$\beta$ (Q/K scale, Giorlandino-Goldt)", "alpha_sa": r"$\alpha_{SA}$ (attention skip)",
         "alpha_mlp": r"$\alpha_{MLP}$ (MLP skip)", "depth": "depth (blocks)", "seq_len": "sequence length $T$"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:  # without the `plot` extra: one line, exit 2
        from initadvisor.errors import MissingExtraError

        raise MissingExtraError("pictures", "plot", "matplotlib") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path, dpi: int) -> None:
    """Save by suffix; an unwritable path is one line (the CLI checked it before the work, this is the net)."""
    from initadvisor.spec import SpecError

    import warnings

    try:
        with warnings.catch_warnings():  # e.g. a glyph of the spec's name missing from the font
            warnings.simplefilter("ignore")
            fig.savefig(path, dpi=dpi)
    except (OSError, ValueError) as e:
        from initadvisor.errors import UsageError

        raise UsageError(f"cannot write {path}: {e}") from None
    finally:
        plt.close(fig)


def _edges(values: list, scale: str):
    """Cell edges around grid values (geometric midpoints on a log axis)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    t = np.log(v) if scale == "log" else v
    mid = (t[1:] + t[:-1]) / 2
    e = np.concatenate([[t[0] - (mid[0] - t[0])], mid, [t[-1] + (t[-1] - mid[-1])]])
    return np.exp(e) if scale == "log" else e


def save_diagram(result: dict, path, dpi: int = 150) -> Path:
    """The diagram as an image: phase colours, the spec's point, the recommended region (beta_c/2 and
    alpha_c lines, hatched), axis labels and a legend."""
    import numpy as np

    plt = _pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    path = Path(path)
    xa, ya = result["x"], result["y"]
    code = {p: i for i, p in enumerate(PHASES)}
    Z = np.array([[code[p] for p in row] for row in result["phase"]])
    fig, ax = plt.subplots(figsize=(7.2, 5.6), constrained_layout=True)
    cmap = ListedColormap([COLORS[p] for p in PHASES])
    ax.pcolormesh(_edges(xa["values"], xa["scale"]), _edges(ya["values"], ya["scale"]), Z, cmap=cmap,
                  vmin=-0.5, vmax=len(PHASES) - 0.5, shading="flat", rasterized=True)
    for a, setter in ((xa, ax.set_xscale), (ya, ax.set_yscale)):
        if a["scale"] == "log":
            setter("log", base=2 if a["name"] == "seq_len" else 10)
    ax.set_xlabel(GREEK.get(xa["name"], xa["name"]))
    ax.set_ylabel(GREEK.get(ya["name"], ya["name"]))
    handles = [Patch(facecolor=COLORS[p], edgecolor="none", label=NAMES[p]) for p in PHASES]

    rec = result.get("recommended") or {}
    limits = {}
    for k, a in (("x", xa), ("y", ya)):
        if a["name"] == "beta" and rec.get("beta_max") is not None:
            limits[k] = (rec["beta_max"], "below", r"$\beta_c/2$" + f" = {rec['beta_max']:.3g}")
        elif a["name"] in ("alpha_sa", "alpha_mlp") and rec.get(f"{a['name']}_min") is not None:
            sym = r"$\alpha_c$" if a["name"] == "alpha_sa" else r"$\alpha_{c,MLP}$"
            limits[k] = (rec[f"{a['name']}_min"], "above", sym + f" = {rec[a['name'] + '_min']:.3g}")
    if limits:
        x0, x1 = ax.get_xlim()
        y0, y1 = ax.get_ylim()
        bx = (x0, x1) if "x" not in limits else ((x0, limits["x"][0]) if limits["x"][1] == "below"
                                                 else (limits["x"][0], x1))
        by = (y0, y1) if "y" not in limits else ((y0, limits["y"][0]) if limits["y"][1] == "below"
                                                 else (limits["y"][0], y1))
        if bx[0] < bx[1] and by[0] < by[1]:
            ax.fill_between(bx, by[0], by[1], facecolor="none", edgecolor="white", hatch="//", linewidth=0,
                            alpha=0.55, zorder=2)
        for k, (v, _, text) in limits.items():
            if k == "x" and x0 <= v <= x1:
                ax.plot([v, v], by, color="black", ls="--", lw=1.4, zorder=3)
                top = limits.get("y", (0, "above"))[1] == "above"  # label the end away from the corner
                ax.annotate(text, (v, by[1] if top else by[0]), xytext=(3, -3 if top else 3),
                            textcoords="offset points", ha="left", va="top" if top else "bottom", fontsize=9,
                            zorder=4, bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
            if k == "y" and y0 <= v <= y1:
                ax.plot(bx, [v, v], color="black", ls="--", lw=1.4, zorder=3)
                left = limits.get("x", (0, "below"))[1] == "below"
                ax.annotate(text, (bx[0] if left else bx[1], v), xytext=(3 if left else -3, 3),
                            textcoords="offset points", ha="left" if left else "right", va="bottom", fontsize=9,
                            zorder=4, bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        handles.append(Patch(facecolor="none", edgecolor="black", hatch="//", label="recommended"))
    sp = result.get("spec_point")
    if sp:
        x0, x1 = sorted(ax.get_xlim())
        y0, y1 = sorted(ax.get_ylim())
        if x0 <= sp["x"] <= x1 and y0 <= sp["y"] <= y1:
            ax.plot([sp["x"]], [sp["y"]], "o", ms=10, mfc="white", mec="black", mew=2, zorder=5)
        handles.append(Line2D([], [], ls="none", marker="o", ms=8, mfc="white", mec="black", mew=2,
                              label=f"the spec ({_fmt(sp['x'])}, {_fmt(sp['y'])})"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False,
              fontsize=9)
    name = result.get("spec_name", "")
    layers = result.get("layers")
    ax.set_title(f"trainability at initialisation: {name}" + (f" ({layers} layers)" if layers else ""),
                 fontsize=11)
    _save(plt, fig, path, dpi)
    return path


def _fmt(v) -> str:
    return f"{v:d}" if isinstance(v, int) else f"{v:.3g}"


def save_profiles(report: dict, path, dpi: int = 150) -> Path:
    """Per-layer profiles of a `check` report (initadvisor.check/1): rho, beta/beta_c, q and grad q."""
    import numpy as np

    plt = _pyplot()
    path = Path(path)
    rows = report["layers"]
    spec = report.get("spec", {})
    th = spec.get("thresholds", {})
    L = np.array([r["index"] for r in rows])
    rho = np.array([r["rho"] for r in rows], dtype=float)
    q = np.array([r["q"] for r in rows], dtype=float)
    g = np.array([r["grad_q"] for r in rows], dtype=float)
    blk = [r for r in rows if "beta" in r]
    fig, axs = plt.subplots(2, 2, figsize=(9.5, 6.4), sharex=True, constrained_layout=True)
    a = axs[0, 0]
    a.plot(L, rho, color="#1f4e99", lw=1.8)
    thr = th.get("rank_collapse_rho", 0.99)
    a.axhline(thr, color=COLORS["rank_collapse"], ls="--", lw=1.4, label=f"rank collapse ({thr:g})")
    if "collapse_trend_rho" in th:
        a.axhline(th["collapse_trend_rho"], color="0.6", ls=":", lw=1.2, label=f"trend ({th['collapse_trend_rho']:g})")
    hit = [f["layer"] for f in report.get("findings", []) if f["code"] == "IA101" and f.get("layer") is not None]
    if hit:
        k = int(np.flatnonzero(L == hit[0])[0])
        a.plot([L[k]], [rho[k]], "o", color=COLORS["rank_collapse"], mec="black", ms=7, zorder=5)
        a.annotate(f"layer {L[k]}", (L[k], rho[k]), xytext=(0, -16), textcoords="offset points", ha="center",
                   va="top", fontsize=8)
    a.set_ylim(-0.02, 1.05)
    a.set_ylabel(r"$\rho$ (mean cosine similarity)")
    a.legend(fontsize=8, loc="lower right")
    a.set_title("token correlation", fontsize=10)

    a = axs[0, 1]
    if blk:
        bl = np.array([r["index"] for r in blk])
        ratio = np.array([r["beta"] for r in blk], dtype=float) / np.array([r["beta_c"] for r in blk], dtype=float)
        a.plot(bl, ratio, color="#7a3b8f", lw=1.8, label=r"$\beta/\beta_c$")
        a.axhline(1.0, color=COLORS["entropy_collapse"], ls="--", lw=1.4, label=r"entropy collapse ($\beta_c$)")
        a.axhline(0.5, color="0.6", ls=":", lw=1.2, label=r"$\beta_c/2$")
        a.set_ylim(0, max(1.15, float(np.nanmax(ratio, initial=0.0)) * 1.1))
        a.legend(fontsize=8, loc="center right")
    a.set_ylabel(r"$\beta/\beta_c$ per block")
    a.set_title("attention phase", fontsize=10)

    a = axs[1, 0]
    a.plot(L, q, color="#2a7f62", lw=1.8)
    if not np.isfinite(q).any():  # every value beyond the engine's range (IA104): nothing to scale
        pass
    elif np.nanmin(q) > 0 and np.nanmax(q) / np.nanmin(q) > 20:
        a.set_yscale("log")
    else:
        lo, hi = float(np.nanmin(q)), float(np.nanmax(q))
        pad = max(0.05 * (hi - lo), 0.05 * max(abs(hi), 1e-12))
        a.set_ylim(lo - pad, hi + pad)
    a.set_ylabel(r"$q$ (second moment of the stream)")
    a.set_xlabel("layer (0 = input)")
    a.set_title("forward variance", fontsize=10)

    a = axs[1, 1]
    pos = g > 0
    a.plot(L[pos], g[pos], color="#c0392b", lw=1.8)
    a.set_yscale("log")
    for key, what in (("grad_vanish", "vanishing"), ("grad_explode", "exploding")):
        if key in th and pos.any() and (g[pos].min() <= th[key] * 10 and g[pos].max() >= th[key] / 10):
            a.axhline(th[key], color="0.5", ls=":", lw=1.2, label=f"{what} ({th[key]:g})")
    if a.get_legend_handles_labels()[0]:
        a.legend(fontsize=8, loc="best")
    a.set_ylabel(r"gradient $q$ (1 at the output)")
    a.set_xlabel("layer (0 = input)")
    a.set_title("backward gradient", fontsize=10)
    for a in axs.flat:
        a.grid(alpha=0.3)
    m = spec.get("model", {})
    codes = sorted({f["code"] for f in report.get("findings", [])})
    verdict = report.get("verdict", "?").upper()
    fig.suptitle(f"{spec.get('name', '')}: {m.get('layers', '?')} layers, {m.get('norm', '?')}-LN, "
                 f"{m.get('activation', '?')}, T={spec.get('sequence', {}).get('length', '?')}  |  verdict {verdict}"
                 + (f"  ({', '.join(codes)})" if codes else ""), fontsize=11)
    _save(plt, fig, path, dpi)
    return path


def save_verify(report: dict, path, dpi: int = 150) -> Path:
    """Theory (lines) beside measurement (dots, 2 standard errors) of a `verify` report: rho, q, grad q."""
    import numpy as np

    plt = _pyplot()
    path = Path(path)
    rows = report["layers"]
    fig, axs = plt.subplots(1, 3, figsize=(12, 3.8), constrained_layout=True)
    for a, key, label, log in zip(axs, ("rho", "q", "grad_q"),
                                  (r"$\rho$", "q (stream second moment)", "grad q (1 at the output)"),
                                  (False, True, True)):
        have = [r for r in rows if key in r]
        idx = np.array([r["index"] for r in have])
        th = np.array([r[key]["theory"] for r in have], dtype=float)
        ms = np.array([r[key]["measured"] for r in have], dtype=float)
        se = np.array([r[key]["se"] or 0.0 for r in have], dtype=float)
        a.plot(idx, th, color="#1f4e99", lw=1.8, label="theory")
        a.errorbar(idx, ms, yerr=2 * se, fmt="o", ms=3.5, color="#d04a3a", ecolor="0.4", label="measured (2 se)")
        if log and np.all(th > 0) and np.all(ms > 0) and max(th.max(), ms.max()) / min(th.min(), ms.min()) > 20:
            a.set_yscale("log")
        a.set_xlabel("layer (0 = input)")
        a.set_ylabel(label)
        a.grid(alpha=0.3)
    axs[0].legend(fontsize=8)
    m = report.get("measurement", {})
    fig.suptitle(f"{report['spec']['name']}: theory vs {m.get('backend', 'Monte-Carlo')} measurement "
                 f"({m.get('seeds', '?')} seeds x {m.get('batch', '?')} sequences)  |  verdict "
                 f"{report['verdict'].upper()}", fontsize=10)
    _save(plt, fig, path, dpi)
    return path


def save_sweep(result: dict, path, dpi: int = 150) -> Path:
    """The first row of a muP coordinate check, from a `sweep` result (initadvisor.sweep/1): mean |x| of each
    module's output at init against width or depth, log-log, one line per module, its fitted exponent in the
    legend."""
    plt = _pyplot()
    path = Path(path)
    x = result["values"]
    fig, ax = plt.subplots(figsize=(7.2, 4.8), constrained_layout=True)
    for module in result["modules"]:
        y = [c["modules"][module]["mean_abs"] for c in result["configs"]]
        pts = [(a, b) for a, b in zip(x, y) if b is not None and b > 0]
        if not pts:
            continue
        slope = result["exponents"][module]
        label = module + ("" if slope is None else f"  ({result['axis']}^{slope:+.2f})")
        ax.plot(*zip(*pts), "o-", ms=4, lw=1.6, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(x, [str(v) for v in x])
    ax.minorticks_off()
    ax.set_xlabel("width (d_model)" if result["axis"] == "width" else "depth (blocks)")
    ax.set_ylabel("mean |x| of the module output")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"coordinate check at init: {result['spec']['name']}  (RMS exponents)", fontsize=11)
    _save(plt, fig, path, dpi)
    return path
