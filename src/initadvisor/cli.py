"""Command-line interface. Exit codes: 0 gate passes, 1 gate fails, 2 bad input or usage."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from initadvisor.files import FIGURES, check_output, write_output
from initadvisor.spec import SpecError, one_line

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Predict rank collapse, entropy collapse and gradient growth of a transformer at "
                       "initialisation, and recommend an init.")


@app.callback()
def _root() -> None:
    """initadvisor: signal propagation at initialisation for transformers."""


class CheckFormat(str, Enum):
    table = "table"
    json = "json"


class GateFormat(str, Enum):
    table = "table"
    json = "json"
    sarif = "sarif"
    github = "github"
    junit = "junit"
    markdown = "markdown"


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    never = "never"


def is_hf_config(path: Path) -> bool:
    return path.suffix == ".json" or (path.is_dir() and (path / "config.json").is_file())


def project_config() -> dict:
    from initadvisor.config import load_project

    return load_project()


def load(path: Path, seq_len: int | None = None, input_correlation: float | None = None,
         dropout: float | None = None, project: dict | None = None):
    """(spec, notes) from a YAML spec or a HuggingFace config.json, with command-line overrides applied."""
    from dataclasses import replace

    notes: list[str] = []
    check_seq_len(seq_len)
    project = project_config() if project is None else project
    if is_hf_config(path):
        from initadvisor.hf import import_config

        spec, notes = import_config(path, seq_len)
        spec = replace(spec, thresholds={**spec.thresholds, **project.get("thresholds", {})},
                       select=tuple(project.get("select", ())), ignore=tuple(project.get("ignore", ())))
    else:
        from initadvisor.spec import load_spec

        spec = load_spec(path, project)
    try:
        return spec.with_overrides(seq_len=seq_len, input_correlation=input_correlation, dropout=dropout), notes
    except SpecError as e:
        raise SpecError(e.message, "command line", None, {"sequence.length": "--seq-len", "dropout": "--dropout",
                        "sequence.input_correlation": "--input-correlation"}.get(e.key or "", e.key)) from None


def check_seq_len(seq_len: int | None) -> None:
    """--seq-len within the spec's own range, named as the option (not as the file's key)."""
    from initadvisor.spec import MAX_INT

    top = MAX_INT["sequence.length"]
    if seq_len is not None and not 2 <= seq_len <= top:
        raise SpecError(f"must be in [2, {top}], got {seq_len}", "command line", None, "--seq-len")


def emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")


def emit(obj, as_json: bool, render) -> None:
    """JSON on stdout, or the rich rendering `render(obj, console)`."""
    if as_json:
        emit_json(obj)
        return
    from rich.console import Console

    render(obj, Console())


def codes(text: str | None) -> tuple[str, ...] | None:
    """A comma-separated --select/--ignore list, validated."""
    if text is None:
        return None
    from initadvisor.spec import check_codes

    items = [c.strip().upper() for c in text.split(",") if c.strip()]
    why = check_codes(items)
    if why:
        raise SpecError(why, "command line", None, "--select/--ignore")
    return tuple(items)


@app.command()
def check(
    specs: list[Path] = typer.Argument(..., help="YAML model specs (or HuggingFace config.json files)."),
    format: GateFormat = typer.Option(GateFormat.table, "--format",
                                      help="table, json, sarif, github (annotations), junit or markdown."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Override sequence.length."),
    input_correlation: Optional[float] = typer.Option(None, "--input-correlation",
                                                      help="Override sequence.input_correlation."),
    dropout: Optional[float] = typer.Option(None, "--dropout", help="Override dropout."),
    fail_on: Optional[FailOn] = typer.Option(None, "--fail-on",
                                             help="Findings that fail the gate [error, or pyproject's fail-on]."),
    select: Optional[str] = typer.Option(None, "--select", help="Only these rule codes/prefixes, e.g. IA1,IA201."),
    ignore: Optional[str] = typer.Option(None, "--ignore", help="Drop these rule codes/prefixes, e.g. IA304."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Save rho, q and gradient profiles (PNG/SVG)."),
) -> None:
    """Predict signal propagation layer by layer and gate on the findings (several specs: one exit code)."""
    from initadvisor.diagnose import check as run_check

    project = project_config()
    gate = fail_on.value if fail_on is not None else (project.get("fail_on") or "error")
    chosen, ignored = codes(select), codes(ignore)
    if plot is not None:
        check_output(plot, "--plot", FIGURES)
    reports = []
    for path in specs:
        s, notes = load(path, seq_len, input_correlation, dropout, project)
        report = run_check(s, gate, chosen, ignored)
        report["notes"] = notes + report["notes"]
        reports.append((str(path), report, s))
    if plot is not None:
        from initadvisor.plots import save_profiles

        save_profiles(reports[0][1], plot)
    failed = any(r["verdict"] == "fail" for _, r, _ in reports)
    emit_check(reports, format, gate)
    raise typer.Exit(1 if failed else 0)


def emit_check(reports: list, format: "GateFormat", gate: str) -> None:
    """reports: (path, report, spec) triples."""
    from initadvisor import formats

    if format is GateFormat.json:
        if len(reports) == 1:
            emit_json(reports[0][1])
        else:
            emit_json({"schema": "initadvisor.checks/1", "version": reports[0][1]["version"],
                       "verdict": "fail" if any(r["verdict"] == "fail" for _, r, _ in reports) else "pass",
                       "reports": [r for _, r, _ in reports]})
    elif format is GateFormat.sarif:
        emit_json(formats.to_sarif(reports))
    elif format is GateFormat.github:
        sys.stdout.write(formats.to_github(reports))
    elif format is GateFormat.junit:
        sys.stdout.write(formats.to_junit(reports, gate))
    elif format is GateFormat.markdown:
        sys.stdout.write(formats.to_markdown(reports))
    else:
        from rich.console import Console

        from initadvisor.report import render_check, render_summary

        console = Console()
        for _, report, _ in reports:
            render_check(report, console)
        if len(reports) > 1:
            render_summary([(p, r) for p, r, _ in reports], console)


class RecommendFormat(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


def spec_yaml(spec_dict: dict, header: str) -> str:
    import yaml

    return header + yaml.safe_dump(spec_dict, sort_keys=False, default_flow_style=False, width=100)


@app.command()
def recommend(
    spec: Path = typer.Argument(..., help="YAML model spec (or HuggingFace config.json)."),
    format: RecommendFormat = typer.Option(RecommendFormat.table, "--format",
                                           help="table, json, or yaml (the patched spec)."),
    rho_max: float = typer.Option(0.99, "--rho-max", min=0.0, max=1.0, help="Collapse threshold for alpha_c."),
    k: float = typer.Option(2.0, "--k", min=0.0, help="DeepScaleLM's k (beta^2 = k/N)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Override sequence.length."),
    alpha_mlp: bool = typer.Option(False, "--alpha-mlp", help="Also solve alpha_c for the MLP skip."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the patched spec (YAML) to this file."),
) -> None:
    """Solve for beta_c, alpha_c, tau and DeepScaleLM's variances; compare init recipes; patch the spec."""
    from initadvisor.recommend import recommend as run

    if out is not None:
        check_output(out, "--out")
    s, notes = load(spec, seq_len)
    if not 1e-6 <= k <= 1e6:
        raise SpecError(f"must be in [1e-6, 1e6], got {k}", "command line", None, "--k")
    rep = run(s, rho_max=rho_max, k=k, alpha_mlp=alpha_mlp)
    rep["notes"] = notes
    patched = spec_yaml(rep["patched_spec"], f"# initadvisor recommend: {rep['patched_recipe']} recipe applied "
                                             f"to {spec}\n")
    if out is not None:
        write_output(out, patched, "--out")
    if format is RecommendFormat.yaml:
        sys.stdout.write(patched)
    else:
        from initadvisor.report import render_recommend

        emit(rep, format is RecommendFormat.json, render_recommend)


class Backend(str, Enum):
    numpy = "numpy"
    torch = "torch"


@app.command()
def verify(
    spec: Path = typer.Argument(..., help="YAML model spec (or HuggingFace config.json)."),
    backend: Backend = typer.Option(Backend.numpy, "--backend", help="numpy, or torch (needs PyTorch)."),
    device: str = typer.Option("cpu", "--device", help="Torch device, e.g. cuda (torch backend)."),
    seeds: int = typer.Option(8, "--seeds", min=1, max=1000,
                              help="Independent initialisations (the unit of the standard errors)."),
    batch: int = typer.Option(1, "--batch", min=1, max=1000, help="Random sequences per initialisation."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Override sequence.length."),
    tol: float = typer.Option(0.05, "--tol", min=0.0, max=2.0, help="Allowed |rho error| per layer."),
    rtol: float = typer.Option(0.15, "--rtol", min=0.0, max=100.0,
                               help="Allowed relative error of q and grad_q per layer."),
    format: CheckFormat = typer.Option(CheckFormat.table, "--format", help="Output format."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Save theory vs measurement as PNG/SVG (matplotlib)."),
) -> None:
    """Build the actual random network, measure it, and compare with the theory layer by layer."""
    import time

    from initadvisor.core.model import propagate
    from initadvisor.stack import from_spec
    from initadvisor.verify import compare

    if plot is not None:
        check_output(plot, "--plot", FIGURES)
    s, notes = load(spec, seq_len)
    from initadvisor.simulate import check_memory

    check_memory(s, batch, 4, tables=backend is Backend.torch)  # float32 on either backend: refuse before allocating
    t0 = time.perf_counter()
    if backend is Backend.torch:
        per_seed = measure_torch(spec, s, seeds, batch, device)["per_seed"]
    else:
        import numpy as np

        from initadvisor.simulate import simulate

        per_seed = [simulate(s, seeds=1, batch=batch, rng_seed=k, dtype=np.float32, weight_grads=False)
                    for k in range(seeds)]
    from initadvisor.diagnose import causal_trace
    from initadvisor.verify import pool_seeds

    net = from_spec(s)
    ct = causal_trace(net)  # causal models: compare with the position-resolved averages over all tokens
    resolved = None if ct is None else {"rho": ct.rho_mean, "q": ct.q.mean(axis=1), "ipr": ct.y2.mean(axis=1)}
    # standard errors over seeds: the sequences of one initialisation share its weights (see pool_seeds)
    rep = compare(s, propagate(net), pool_seeds(per_seed), tol=tol, rtol=rtol, theory=resolved)
    rep["measurement"] = {"backend": backend.value, "seeds": seeds, "batch": batch,
                          "seconds": round(time.perf_counter() - t0, 2)}
    rep["notes"] = notes
    if plot is not None:
        from initadvisor.plots import save_verify

        save_verify(rep, plot)
    from initadvisor.verify import render_verify

    emit(rep, format is CheckFormat.json, render_verify)
    raise typer.Exit(0 if rep["verdict"] == "pass" else 1)


def measure_torch(path: Path, spec, seeds: int, batch: int, device: str):
    """The torch measurement: the real HuggingFace model for a config.json, else the spec's network in torch."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SpecError("the torch backend needs PyTorch: pip install 'initadvisor[torch]'", "command line", None,
                        "--backend") from None
    from initadvisor import torch as it

    if is_hf_config(path):
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise SpecError("measuring a HuggingFace model needs transformers: pip install 'initadvisor[hf]'",
                            "command line", None, "--backend") from None
        return it.measure_hf_config(path, spec, seeds=seeds, batch=batch, device=device)
    return it.measure_spec(spec, seeds=seeds, batch=batch, device=device)


class Axis(str, Enum):
    beta = "beta"
    alpha_sa = "alpha_sa"
    alpha_mlp = "alpha_mlp"
    depth = "depth"
    seq_len = "seq_len"


@app.command()
def diagram(
    spec: Path = typer.Argument(..., help="YAML model spec (or HuggingFace config.json)."),
    x: Axis = typer.Option(Axis.beta, "--x", help="Horizontal axis."),
    y: Axis = typer.Option(Axis.alpha_sa, "--y", help="Vertical axis."),
    grid: int = typer.Option(64, "--grid", help="N x N points."),
    x_range: Optional[tuple[float, float]] = typer.Option(None, "--x-range", help="A B: x from A to B."),
    y_range: Optional[tuple[float, float]] = typer.Option(None, "--y-range", help="A B: y from A to B."),
    format: CheckFormat = typer.Option(CheckFormat.table, "--format", help="table (a coloured grid) or json."),
    png: Optional[Path] = typer.Option(None, "--png", help="Save the diagram as PNG (matplotlib)."),
    svg: Optional[Path] = typer.Option(None, "--svg", help="Save the diagram as SVG (matplotlib)."),
) -> None:
    """Trainability diagram (001 Fig. 1c): rank collapse, entropy collapse or trainable over a grid."""
    from initadvisor.diagram import diagram as run, render_diagram

    for path, option in ((png, "--png"), (svg, "--svg")):
        if path is not None:
            check_output(path, option, FIGURES)
    s, _ = load(spec)
    res = run(s, x=x.value, y=y.value, grid=grid, x_range=x_range, y_range=y_range)
    for path in (png, svg):
        if path is not None:
            from initadvisor.plots import save_diagram

            save_diagram(res, path)
    emit(res, format is CheckFormat.json, render_diagram)


@app.command()
def plot(
    spec: Path = typer.Argument(..., help="YAML model spec (or HuggingFace config.json)."),
    png: Path = typer.Option(..., "--png", help="Output file (PNG, or SVG/PDF by suffix)."),
) -> None:
    """Per-layer rho, beta/beta_c, q and gradient profiles as a picture (matplotlib)."""
    from initadvisor.diagnose import check as run_check
    from initadvisor.plots import save_profiles

    check_output(png, "--png", FIGURES)
    s, _ = load(spec)
    save_profiles(run_check(s), png)
    sys.stdout.write(f"wrote {png}\n")


@app.command()
def rules() -> None:
    """List every rule: code, severity, name, when it fires and its threshold."""
    from rich.console import Console
    from rich.table import Table

    from initadvisor.formats import RULES_COLUMNS, rules_table

    t = Table(show_edge=False, header_style="bold")
    for col in RULES_COLUMNS:
        t.add_column(col)
    for row in rules_table():
        t.add_row(*row)
    Console().print(t)


@app.command()
def explain(code: str = typer.Argument(..., help="A rule code (IA101) or name (rank-collapse).")) -> None:
    """Print one rule: what it means, formula, paper, threshold, fix, and a failing and a fixed example."""
    from initadvisor.formats import rule_text

    sys.stdout.write(rule_text(code))


@app.command("import")
def import_(
    config: Path = typer.Argument(..., help="HuggingFace config.json (or a folder holding one)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Sequence length [max_position_embeddings]."),
) -> None:
    """Write the YAML spec equivalent to a HuggingFace config.json on stdout."""
    from initadvisor.hf import import_config, read_hf_config, to_yaml

    check_seq_len(seq_len)
    import_config(config, seq_len)  # refuse here what `check` would refuse, naming the config field
    data, notes = read_hf_config(config, seq_len)
    sys.stdout.write(to_yaml(data, notes, source=str(config)))


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: usage and input errors are one line on stderr with exit code 2, never a traceback."""
    import os
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning)  # overflow in the engine: reports say so instead
    try:
        code = typer.main.get_command(app).main(args=argv, prog_name="initadvisor", standalone_mode=False)
    except SpecError as e:
        _fail(str(e), 2)  # SpecError text is one printable line
    except typer.Abort:
        _fail("aborted", 130)
    except Exception as e:  # noqa: BLE001
        if callable(getattr(e, "format_message", None)):  # click's usage errors (typer may vendor click)
            _fail(one_line(e.format_message()), 2)
        if os.environ.get("INITADVISOR_DEBUG"):  # a defect: still one line; the variable shows the traceback
            raise
        _fail(one_line(f"internal error, please report: {type(e).__name__}: {e}"), 3)
    sys.exit(code or 0)


def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"initadvisor: error: {message}\n")
    sys.exit(code)
