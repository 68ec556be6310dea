"""Command-line interface, thin over `initadvisor.api`. Exit codes: 0 gate passes, 1 gate fails, 2 bad input or
usage (one line on stderr), 3 a defect (one line; INITADVISOR_DEBUG=1 shows the traceback).

The parser is the standard library's argparse: it costs nothing to import, so `check` starts as fast as
numpy allows. Each command is a handler plus its declared arguments (`command`); `main` dispatches on the
first word and parses the rest with `parse_intermixed_args` (options may come between spec paths)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

from initadvisor.errors import InitAdvisorError, UsageError, one_line
from initadvisor.progress import bar

COMMANDS: dict[str, tuple[tuple, Callable]] = {}
PROG = "initadvisor"
ABOUT = ("Predict rank collapse, entropy collapse and gradient growth of a transformer at initialisation, "
         "and recommend an init.")


def command(name: str, *arguments: tuple):
    """Register `fn` as command `name`; its docstring's first line is the command's help."""
    def register(fn: Callable) -> Callable:
        COMMANDS[name] = (arguments, fn)
        return fn
    return register


def arg(*names: str, **kw) -> tuple:
    return names, kw


def bounded(kind: type, lo: float | None = None, hi: float | None = None) -> Callable[[str], float]:
    """An argparse type: an int or a finite float within [lo, hi]."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}")
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if lo is not None and v < lo or hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo:g}, {hi:g}], got {text}" if hi is not None and kind is float
                                             else f"must be in [{lo}, {hi}], got {text}" if hi is not None
                                             else f"must be at least {lo:g}, got {text}")
        return v
    parse.__name__ = kind.__name__
    return parse


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(one_line(message), self.prog.rpartition(" ")[2])


def parser(name: str) -> Parser:
    arguments, fn = COMMANDS[name]
    p = Parser(prog=f"{PROG} {name}", description=fn.__doc__, allow_abbrev=False,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    for names, kw in arguments:
        p.add_argument(*names, **kw)
    return p


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [ARGS]...", "", ABOUT, "", "commands:"]
    lines += [f"  {n:<{width}}  {fn.__doc__.splitlines()[0]}" for n, (_, fn) in COMMANDS.items()]
    return "\n".join(lines + ["", f"`{PROG} COMMAND --help` for a command's options."]) + "\n"


# ---------------------------------------------------------------------------------------------------
# shared options and output

SEQ_LEN = arg("--seq-len", type=bounded(int), help="Override sequence.length.")
SPEC = arg("spec", type=Path, help="YAML model spec (or HuggingFace config.json).")


def project_config() -> dict:
    from initadvisor.config import load_project

    return load_project()


def output_path(path: Path | None, option: str, figures: bool = False) -> None:
    """Refuse an output file that cannot be written, before any work."""
    if path is not None:
        from initadvisor.files import FIGURES, check_output

        check_output(path, option, FIGURES if figures else ())


def emit(report, fmt: str, render: Callable | None = None) -> None:
    """A report on stdout: its JSON (`--format json`), or the rich rendering `render(data, console)`."""
    if fmt == "json":
        sys.stdout.write(report.to_json() + "\n")
        return
    from rich.console import Console

    render(report.data, Console())


def figures(a, run: Callable, save: str, render: Callable, label: str) -> None:
    """A command with --png/--svg: refuse unwritable files first, run (`run(progress)`, a progress bar named
    `label` on a terminal), save the pictures (initadvisor.plots.`save`), then print the report."""
    output_path(a.png, "--png", figures=True)
    output_path(a.svg, "--svg", figures=True)
    with bar(label, a.format) as progress:
        res = run(progress)
    for path in (a.png, a.svg):
        if path is not None:
            from initadvisor import plots

            getattr(plots, save)(res.data, path)
    emit(res, a.format, render)


# ---------------------------------------------------------------------------------------------------
# commands


@command("check",
         arg("specs", nargs="+", type=Path, metavar="SPEC", help="YAML model specs (or HuggingFace config.json)."),
         arg("--format", default="table", choices=["table", "json", "sarif", "github", "junit", "markdown"],
             help="table, json, sarif, github (annotations), junit or markdown [table]."),
         SEQ_LEN,
         arg("--input-correlation", type=bounded(float), help="Override sequence.input_correlation."),
         arg("--dropout", type=bounded(float), help="Override dropout."),
         arg("--fail-on", choices=["error", "warning", "never"],
             help="Findings that fail the gate [error, or pyproject's fail-on]."),
         arg("--select", help="Only these rule codes/prefixes, e.g. IA1,IA201."),
         arg("--ignore", help="Drop these rule codes/prefixes, e.g. IA304."),
         arg("--plot", type=Path, help="Save rho, q and gradient profiles (PNG/SVG)."))
def check(a) -> int:
    """Predict signal propagation layer by layer and gate on the findings (several specs: one exit code)."""
    from initadvisor import api

    project = project_config()
    gate = a.fail_on or project.get("fail_on") or "error"
    chosen, ignored = api.check_codes(a.select), api.check_codes(a.ignore)
    output_path(a.plot, "--plot", figures=True)
    reports = [(str(path), api.check(path, fail_on=gate, select=chosen, ignore=ignored, seq_len=a.seq_len,
                                     input_correlation=a.input_correlation, dropout=a.dropout, project=project))
               for path in a.specs]
    if a.plot is not None:
        from initadvisor.plots import save_profiles

        save_profiles(reports[0][1].data, a.plot)
    emit_check(reports, a.format, gate)
    return 1 if any(not r.passed for _, r in reports) else 0


def emit_check(reports: list, fmt: str, gate: str) -> None:
    """reports: (path, CheckReport) pairs, in any of check's formats."""
    if fmt == "json" and len(reports) == 1:
        sys.stdout.write(reports[0][1].to_json() + "\n")
    elif fmt != "table":
        import json

        from initadvisor import formats

        entries = [(path, r.data, r.spec) for path, r in reports]
        text = {"json": lambda: formats.checks(entries), "sarif": lambda: formats.to_sarif(entries),
                "github": lambda: formats.to_github(entries), "junit": lambda: formats.to_junit(entries, gate),
                "markdown": lambda: formats.to_markdown(entries)}[fmt]()
        sys.stdout.write(text if isinstance(text, str) else json.dumps(text, indent=2, allow_nan=False) + "\n")
    else:
        from rich.console import Console

        from initadvisor.report import render_check, render_summary

        console = Console()
        for _, r in reports:
            render_check(r.data, console)
        if len(reports) > 1:
            render_summary([(p, r.data) for p, r in reports], console)


@command("recommend",
         SPEC,
         arg("--format", default="table", choices=["table", "json", "yaml"],
             help="table, json, or yaml (the patched spec) [table]."),
         arg("--rho-max", type=bounded(float, 0.0, 1.0), default=0.99, help="Collapse threshold for alpha_c [0.99]."),
         arg("--k", type=bounded(float, 0.0), default=2.0, help="DeepScaleLM's k (beta^2 = k/N) [2]."),
         SEQ_LEN,
         arg("--alpha-mlp", action="store_true", help="Also solve alpha_c for the MLP skip."),
         arg("--out", type=Path, help="Write the patched spec (YAML) to this file."))
def recommend(a) -> int:
    """Solve for beta_c, alpha_c, tau and DeepScaleLM's variances; compare init recipes; patch the spec."""
    from initadvisor import api

    output_path(a.out, "--out")
    with bar("recommend", a.format) as progress:
        rep = api.recommend(a.spec, rho_max=a.rho_max, k=a.k, alpha_mlp=a.alpha_mlp, seq_len=a.seq_len,
                            project=project_config(), progress=progress)
    where = one_line(str(a.spec))  # a line break in the file name would end the comment
    patched = rep.patched_yaml(f"# initadvisor recommend: {rep.patched_recipe} recipe applied to {where}\n")
    if a.out is not None:
        from initadvisor.files import write_output

        write_output(a.out, patched, "--out")
    if a.format == "yaml":
        sys.stdout.write(patched)
    else:
        from initadvisor.report import render_recommend

        emit(rep, a.format, render_recommend)
    return 0


@command("verify",
         SPEC,
         arg("--backend", default="numpy", choices=["numpy", "torch"], help="numpy, or torch (needs PyTorch)."),
         arg("--device", default="cpu", help="Torch device, e.g. cuda (torch backend) [cpu]."),
         arg("--seeds", type=bounded(int, 1, 1000), default=8,
             help="Independent initialisations (the unit of the standard errors) [8]."),
         arg("--batch", type=bounded(int, 1, 1000), default=1, help="Random sequences per initialisation [1]."),
         SEQ_LEN,
         arg("--tol", type=bounded(float, 0.0, 2.0), default=0.05, help="Allowed |rho error| per layer [0.05]."),
         arg("--rtol", type=bounded(float, 0.0, 100.0), default=0.15,
             help="Allowed relative error of q and grad_q per layer [0.15]."),
         arg("--format", default="table", choices=["table", "json"], help="Output format [table]."),
         arg("--plot", type=Path, help="Save theory vs measurement as PNG/SVG (matplotlib)."))
def verify(a) -> int:
    """Build the actual random network, measure it, and compare with the theory layer by layer."""
    from initadvisor import api

    output_path(a.plot, "--plot", figures=True)
    with bar("verify", a.format) as progress:
        rep = api.verify(a.spec, backend=a.backend, device=a.device, seeds=a.seeds, batch=a.batch,
                         seq_len=a.seq_len, tol=a.tol, rtol=a.rtol, project=project_config(), progress=progress)
    if a.plot is not None:
        from initadvisor.plots import save_verify

        save_verify(rep.data, a.plot)
    from initadvisor.report import render_verify

    emit(rep, a.format, render_verify)
    return 0 if rep.passed else 1


AXES = ["beta", "alpha_sa", "alpha_mlp", "depth", "seq_len"]


@command("diagram",
         SPEC,
         arg("--x", default="beta", choices=AXES, help="Horizontal axis [beta]."),
         arg("--y", default="alpha_sa", choices=AXES, help="Vertical axis [alpha_sa]."),
         arg("--grid", type=bounded(int), default=64, help="N x N points [64]."),
         arg("--x-range", type=bounded(float), nargs=2, metavar=("A", "B"), help="x from A to B."),
         arg("--y-range", type=bounded(float), nargs=2, metavar=("A", "B"), help="y from A to B."),
         arg("--format", default="table", choices=["table", "json"], help="table (a coloured grid) or json."),
         arg("--png", type=Path, help="Save the diagram as PNG (matplotlib)."),
         arg("--svg", type=Path, help="Save the diagram as SVG (matplotlib)."))
def diagram(a) -> int:
    """Trainability diagram (001 Fig. 1c): rank collapse, entropy collapse or trainable over a grid."""
    from initadvisor import api
    from initadvisor.report import render_diagram

    figures(a, lambda progress: api.diagram(a.spec, x=a.x, y=a.y, grid=a.grid,
                                            x_range=a.x_range and tuple(a.x_range),
                                            y_range=a.y_range and tuple(a.y_range), project=project_config(),
                                            progress=progress),
            "save_diagram", render_diagram, "diagram")
    return 0


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers (256,512,1024)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None


@command("sweep",
         SPEC,
         arg("--width", type=int_list, help="d_model values, e.g. 256,512,1024 (head dimension, d_ff ratio held)."),
         arg("--depth", type=int_list, help="Layer counts, e.g. 2,4,8,16."),
         arg("--format", default="table", choices=["table", "json"], help="Output format [table]."),
         arg("--png", type=Path, help="Save the coordinate-check plot as PNG (matplotlib)."),
         arg("--svg", type=Path, help="Save the coordinate-check plot as SVG (matplotlib)."))
def sweep(a) -> int:
    """Analytic coordinate check: each module's output size at init over widths or depths, exponents fitted."""
    from initadvisor import api
    from initadvisor.report import render_sweep

    figures(a, lambda progress: api.sweep(a.spec, width=a.width, depth=a.depth, project=project_config(),
                                          progress=progress), "save_sweep", render_sweep, "sweep")
    return 0


@command("plot",
         SPEC,
         arg("--png", type=Path, required=True, help="Output file (PNG, or SVG/PDF by suffix)."))
def plot(a) -> int:
    """Per-layer rho, beta/beta_c, q and gradient profiles as a picture (matplotlib)."""
    from initadvisor import api
    from initadvisor.plots import save_profiles

    output_path(a.png, "--png", figures=True)
    save_profiles(api.check(a.spec, project=project_config()).data, a.png)
    sys.stdout.write(f"wrote {a.png}\n")
    return 0


@command("audit",
         arg("config", type=Path, help="HuggingFace config.json (or a folder holding one)."),
         arg("--layers", type=bounded(int, 1, 1000), default=2,
             help="Blocks to build (two show every per-role init) [2]."),
         arg("--seed", type=bounded(int, 0, 2**31 - 1), default=0, help="Torch seed of the initialisation [0]."),
         arg("--format", default="table", choices=["table", "json"], help="Output format [table]."))
def audit(a) -> int:
    """Build the model on CPU as transformers initialises it and audit its weights (exit 1 on an error)."""
    for module, extra, package in (("torch", "torch", "PyTorch"), ("transformers", "hf", "transformers")):
        try:
            __import__(module)
        except ImportError:
            from initadvisor.errors import MissingExtraError

            raise MissingExtraError("audit", extra, package) from None
    from initadvisor.api import is_hf_config

    if not is_hf_config(a.config):
        raise UsageError(f"{a.config}: audit builds a HuggingFace model: give its config.json (or its folder)", "audit")
    from initadvisor.audit import audit_config
    from initadvisor.report import render_audit

    with bar("audit", a.format) as progress:
        rep = audit_config(a.config, layers=a.layers, seed=a.seed, progress=progress)
    if a.format == "json":
        sys.stdout.write(rep.to_json() + "\n")
    else:
        from rich.console import Console

        render_audit(rep, Console())
    return 1 if rep.verdict == "fail" else 0


@command("rules")
def rules(a) -> int:
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
    return 0


@command("explain", arg("code", help="A rule code (IA101) or name (rank-collapse)."))
def explain(a) -> int:
    """Print one rule: what it means, formula, paper, threshold, fix, and a failing and a fixed example."""
    from initadvisor.formats import rule_text

    sys.stdout.write(rule_text(a.code))
    return 0


@command("import",
         arg("config", type=Path, help="HuggingFace config.json (or a folder holding one)."),
         arg("--seq-len", type=bounded(int), help="Sequence length [max_position_embeddings]."))
def import_(a) -> int:
    """Write the YAML spec equivalent to a HuggingFace config.json on stdout."""
    from initadvisor import api
    from initadvisor.hf import read_hf_config, to_yaml

    api.load(a.config, seq_len=a.seq_len)  # refuse here what `check` would refuse, naming the config field
    data, notes = read_hf_config(a.config, a.seq_len)
    sys.stdout.write(to_yaml(data, notes, source=str(a.config)))
    return 0


# ---------------------------------------------------------------------------------------------------


def run(argv: list[str]) -> int:
    """Parse and run one command; returns its exit code."""
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from initadvisor import __version__

        sys.stdout.write(f"{PROG} {__version__}\n")
        return 0
    if argv[0] not in COMMANDS:
        raise UsageError(f"no such command {argv[0]!r} (commands: {', '.join(COMMANDS)})")
    return COMMANDS[argv[0]][1](parser(argv[0]).parse_intermixed_args(argv[1:]))


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: usage and input errors are one line on stderr with exit code 2, never a traceback."""
    import os
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning)  # overflow in the engine: reports say so instead
    # transformers' own warnings on a config's fields the import does not read (a bos_token_id past the vocabulary):
    # the report says what matters, on stdout (read when transformers first configures its logger)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        code = run(sys.argv[1:] if argv is None else list(argv))
    except InitAdvisorError as e:
        _fail(str(e), 2)  # one printable line
    except KeyboardInterrupt:
        _fail("aborted", 130)
    except SystemExit:  # --help
        raise
    except Exception as e:  # noqa: BLE001
        if os.environ.get("INITADVISOR_DEBUG"):  # a defect: still one line; the variable shows the traceback
            raise
        _fail(one_line(f"internal error, please report: {type(e).__name__}: {e}"), 3)
    sys.exit(code)


def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.exit(code)
