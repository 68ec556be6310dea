"""The Python API: load a model, run `check`, `recommend`, `verify`, `diagram` and `sweep` on it.

Every function takes a *source*: a YAML spec path, a HuggingFace ``config.json`` path (or a folder holding
one), a spec dict (the YAML layout), a HuggingFace config dict (it has ``model_type``), a
``transformers.PretrainedConfig``, or an already loaded `Spec`. Each returns a frozen dataclass with typed
fields and ``.to_json()``, the very JSON the command prints with ``--format json``. Bad input raises
`SpecError` (invalid spec or config), `UsageError` (a bad argument, named as its command-line option) or
`MissingExtraError` (an optional dependency is not installed); all derive from `InitAdvisorError`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Union

from initadvisor.errors import MissingExtraError, SpecError, UsageError, one_line
from initadvisor.progress import Progress, checked, tell
from initadvisor.rules import Finding
from initadvisor.spec import MAX_INT, Spec

Source = Union[str, os.PathLike, Mapping[str, Any], Spec, Any]  # Any: a transformers.PretrainedConfig


def is_hf_config(path: Path) -> bool:
    """A path is read as a HuggingFace config when it is a .json file or a folder holding config.json."""
    return path.suffix == ".json" or (path.is_dir() and (path / "config.json").is_file())


def load(source: Source, *, seq_len: int | None = None, input_correlation: float | None = None,
         dropout: float | None = None, project: Mapping[str, Any] | None = None) -> Spec:
    """The validated `Spec` of a source, with overrides applied; `project` is a ``[tool.initadvisor]`` table
    (`initadvisor.config.load_project`; none by default). A HuggingFace import's notes are in ``spec.notes``."""
    project = dict(project or {})
    if seq_len is not None and not 2 <= seq_len <= MAX_INT["sequence.length"]:
        raise UsageError(f"must be in [2, {MAX_INT['sequence.length']}], got {seq_len}", "--seq-len")
    if isinstance(source, Spec):
        spec, notes = source, list(source.notes)
    elif isinstance(source, (str, os.PathLike)) and not is_hf_config(Path(source)):
        from initadvisor.spec import load_spec

        spec, notes = load_spec(source, project), []
    elif isinstance(source, Mapping) and "model_type" not in source:
        from initadvisor.spec import build_spec

        spec, notes = build_spec(dict(source), {}, "<dict>", project), []
    else:
        if not isinstance(source, (str, os.PathLike, Mapping)):
            if not callable(getattr(source, "to_dict", None)):
                raise UsageError(f"cannot read a {type(source).__name__}: pass a path, a dict, a Spec or a "
                                 "transformers PretrainedConfig", "source")
            source = source.to_dict()  # a PretrainedConfig
        from initadvisor.hf import import_config

        spec, notes = import_config(source, seq_len)
        spec = replace(spec, thresholds={**spec.thresholds, **project.get("thresholds", {})},
                       select=tuple(project.get("select", ())), ignore=tuple(project.get("ignore", ())))
        seq_len = None  # the import applied it, with a note
    try:
        spec = spec.with_overrides(seq_len=seq_len, input_correlation=input_correlation, dropout=dropout)
    except SpecError as e:
        option = {"sequence.length": "--seq-len", "dropout": "--dropout",
                  "sequence.input_correlation": "--input-correlation"}.get(e.key or "", e.key)
        raise UsageError(e.message, option) from None
    return replace(spec, notes=tuple(notes))


def check_codes(codes: Sequence[str] | None, option: str = "--select/--ignore") -> tuple[str, ...] | None:
    """Rule codes or prefixes (IA1, IA201), upper-cased and validated."""
    if codes is None:
        return None
    if isinstance(codes, str):
        codes = codes.split(",")
    from initadvisor.spec import check_codes as why_not

    items = [c.strip().upper() for c in codes if c.strip()]
    why = why_not(items)
    if why:
        raise UsageError(why, option)
    return tuple(items)


# ---------------------------------------------------------------------------------------------------
# reports


@dataclass(frozen=True)
class Report:
    """A command's result: typed fields, and `data`, the JSON document the command prints."""

    data: dict = field(repr=False, compare=False)

    def to_dict(self) -> dict:
        return json.loads(self.to_json())

    def to_json(self) -> str:
        """The command's ``--format json`` output (without its final newline)."""
        return json.dumps(self.data, indent=2, allow_nan=False)


class Gated:
    """A report with a gate verdict (check, verify)."""

    verdict: str

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


def _record(cls, row: Mapping[str, Any]):
    """A dataclass from a JSON row, keeping the fields it declares (rows may carry more)."""
    return cls(**{f.name: row.get(f.name) for f in fields(cls)})


def _findings(rows) -> tuple[Finding, ...]:
    return tuple(_record(Finding, f) for f in rows)


@dataclass(frozen=True)
class Layer:
    """One residual-stream index: 0 = the input, i = after block i (block quantities are None at 0)."""

    index: int
    q: float | None
    p: float | None
    rho: float | None
    grad_q: float | None
    grad_p: float | None
    beta: float | None = None
    beta_c: float | None = None
    ipr: float | None = None
    attention_phase: str | None = None
    qk_grad: float | None = None
    qk_to_v_grad_ratio: float | None = None


@dataclass(frozen=True)
class CheckReport(Report, Gated):
    """`initadvisor.check/1`: per-layer predictions, findings and the gate's verdict."""

    spec: Spec = None
    verdict: str = ""
    findings: tuple[Finding, ...] = ()
    layers: tuple[Layer, ...] = ()
    notes: tuple[str, ...] = ()


def check(source: Source, *, fail_on: str = "error", select: Sequence[str] | None = None,
          ignore: Sequence[str] | None = None, seq_len: int | None = None, input_correlation: float | None = None,
          dropout: float | None = None, project: Mapping[str, Any] | None = None) -> CheckReport:
    """Predict signal propagation layer by layer and judge it; `fail_on` is error, warning or never
    (select/ignore: rule codes or prefixes, else the spec's own)."""
    from initadvisor.diagnose import check as run

    if fail_on not in ("error", "warning", "never"):
        raise UsageError(f"must be error, warning or never, got {fail_on!r}", "--fail-on")
    spec = load(source, seq_len=seq_len, input_correlation=input_correlation, dropout=dropout, project=project)
    data = run(spec, fail_on, check_codes(select, "--select"), check_codes(ignore, "--ignore"))
    data["notes"] = list(spec.notes) + data["notes"]
    return CheckReport(data, spec, data["verdict"], _findings(data["findings"]),
                       tuple(_record(Layer, r) for r in data["layers"]), tuple(data["notes"]))


@dataclass(frozen=True)
class RecipeResult:
    """One init recipe judged by `check` on its own (per-layer) model."""

    name: str
    formula: str
    source: str
    final_rho: float | None
    max_rho: float | None
    worst_beta_ratio: float | None
    grad_ratio: float | None
    verdict: str
    findings: tuple[str, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Recommendation(Report):
    """`initadvisor.recommend/1`: beta_c, alpha_c, tau, DeepScaleLM's variances and the recipes compared."""

    spec: Spec = None
    beta: float | None = None
    beta_c: float | None = None
    beta_recommended: float | None = None
    qk_std: float | None = None
    alpha_c: float | None = None
    tau: float | None = None
    recipes: tuple[RecipeResult, ...] = ()
    patched_recipe: str = ""
    patched_spec: Spec = None
    init_weights: str = ""

    def patched_yaml(self, header: str = "") -> str:
        """The patched spec as a YAML file (what `recommend --format yaml` prints)."""
        import yaml

        return header + yaml.safe_dump(self.data["patched_spec"], sort_keys=False, default_flow_style=False,
                                       width=100)


def recommend(source: Source, *, rho_max: float = 0.99, k: float = 2.0, alpha_mlp: bool = False,
              seq_len: int | None = None, project: Mapping[str, Any] | None = None,
              progress: Progress | None = None) -> Recommendation:
    """Solve for beta_c, alpha_c (rho stays below `rho_max`), tau and DeepScaleLM's variances (its k), and
    compare the init recipes; the patched spec applies the first passing one. `progress(done, total)`: told after
    the spec's analysis, the solvers and each recipe's (9 steps)."""
    from initadvisor.recipes import recommend as run
    from initadvisor.spec import build_spec

    if not 0 <= rho_max <= 1:
        raise UsageError(f"must be in [0, 1], got {rho_max}", "--rho-max")
    if not 1e-6 <= k <= 1e6:
        raise UsageError(f"must be in [1e-6, 1e6], got {k}", "--k")
    progress = checked(progress)
    spec = load(source, seq_len=seq_len, project=project)
    data = run(spec, rho_max=rho_max, k=k, alpha_mlp=alpha_mlp, progress=progress)
    data["notes"] = list(spec.notes)
    recipes = tuple(_record(RecipeResult, {**r, "findings": tuple(r["findings"]), "notes": tuple(r["notes"])})
                    for r in data["recipes"])
    return Recommendation(data, spec, data["beta"], data["beta_c"], data["beta_recommended"], data["qk_std"],
                          data["alpha_c"], data["tau"], recipes, data["patched_recipe"],
                          build_spec(data["patched_spec"]), data["init_weights"])


@dataclass(frozen=True)
class VerifyReport(Report, Gated):
    """`initadvisor.verify/1`: theory against a Monte-Carlo of the actual random network, per layer."""

    spec: Spec = None
    verdict: str = ""
    max_error: Mapping[str, float | None] = None
    findings: tuple[Finding, ...] = ()


def verify(source: Source, *, backend: str = "numpy", device: str = "cpu", seeds: int = 8, batch: int = 1,
           seq_len: int | None = None, tol: float = 0.05, rtol: float = 0.15,
           project: Mapping[str, Any] | None = None, progress: Progress | None = None) -> VerifyReport:
    """Build the random network (numpy, or torch: the real HuggingFace model for a config), measure it under
    `seeds` initialisations and compare with the theory: |rho error| <= tol, relative q and grad_q <= rtol.
    `progress(done, total)`: told each seed measured, then the theory (seeds + 1 steps)."""
    import time

    from initadvisor.simulate import check_memory
    from initadvisor.verification import compare, pool_seeds, theory_of

    if backend not in ("numpy", "torch"):
        raise UsageError(f"must be numpy or torch, got {backend!r}", "--backend")
    for name, v, lo, hi in (("--seeds", seeds, 1, 1000), ("--batch", batch, 1, 1000)):
        if not lo <= v <= hi:
            raise UsageError(f"must be in [{lo}, {hi}], got {v}", name)
    for name, v, hi in (("--tol", tol, 2.0), ("--rtol", rtol, 100.0)):
        if not 0 <= v <= hi:
            raise UsageError(f"must be in [0, {hi:g}], got {v}", name)
    progress = checked(progress)
    spec = load(source, seq_len=seq_len, project=project)
    check_memory(spec, batch, 4, tables=backend == "torch")  # float32 either way: refuse before allocating
    t0 = time.perf_counter()
    tell(progress, 0, seeds + 1)
    if backend == "torch":
        per_seed = _measure_torch(source, spec, seeds, batch, device,
                                  progress and (lambda done, _: progress(done, seeds + 1)))["per_seed"]
    else:
        import numpy as np

        from initadvisor.simulate import simulate

        per_seed = []
        for s in range(seeds):
            per_seed.append(simulate(spec, seeds=1, batch=batch, rng_seed=s, dtype=np.float32, weight_grads=False))
            tell(progress, s + 1, seeds + 1)
    # standard errors over seeds: the sequences of one initialisation share its weights (see pool_seeds)
    trace, resolved = theory_of(spec)
    data = compare(spec, trace, pool_seeds(per_seed), tol=tol, rtol=rtol, theory=resolved)
    tell(progress, seeds + 1, seeds + 1)
    data["measurement"] = {"backend": backend, "seeds": seeds, "batch": batch,
                           "seconds": round(time.perf_counter() - t0, 2)}
    data["notes"] = list(spec.notes)
    return VerifyReport(data, spec, data["verdict"], dict(data["max_error"]), _findings(data["findings"]))


def _torch_device(device: str) -> None:
    """A device the measurement can run on and read back (not 'meta', which holds no data), else a UsageError."""
    import torch

    try:
        if torch.device(device).type == "meta":
            raise RuntimeError("a meta tensor holds no data to measure")
        torch.zeros(1, device=device).cpu()
    except (RuntimeError, AssertionError, ValueError) as e:  # unknown type, no such device, not compiled in
        raise UsageError(f"not a device to measure on here ({one_line(str(e))}), got {device!r}", "--device") from None


def _measure_torch(source: Source, spec: Spec, seeds: int, batch: int, device: str,
                   progress: Progress | None) -> dict:
    """The real HuggingFace model for a config (path, dict or PretrainedConfig), else the spec's network."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MissingExtraError("the torch backend", "torch", "PyTorch") from None
    from initadvisor import torch as it

    _torch_device(device)
    hf = (isinstance(source, (str, os.PathLike)) and is_hf_config(Path(source))
          or isinstance(source, Mapping) and "model_type" in source
          or not isinstance(source, (str, os.PathLike, Mapping, Spec)))
    if not hf:
        return it.measure_spec(spec, seeds=seeds, batch=batch, device=device, progress=progress)
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise MissingExtraError("measuring a HuggingFace model", "hf", "transformers") from None
    return it.measure_hf_config(source, spec, seeds=seeds, batch=batch, device=device, progress=progress)


@dataclass(frozen=True)
class Diagram(Report):
    """`initadvisor.diagram/1`: the phase (trainable, rank_collapse, entropy_collapse) over a 2-D grid."""

    x: str = ""
    y: str = ""
    phase: tuple[tuple[str, ...], ...] = ()
    counts: Mapping[str, int] = None


def diagram(source: Source, *, x: str = "beta", y: str = "alpha_sa", grid: int = 64,
            x_range: tuple[float, float] | None = None, y_range: tuple[float, float] | None = None,
            project: Mapping[str, Any] | None = None, progress: Progress | None = None) -> Diagram:
    """The trainability diagram (001 Fig. 1c) over x and y: beta, alpha_sa, alpha_mlp, depth or seq_len;
    `progress(done, total)`: told each layer of each chunk of grid points."""
    from initadvisor.phase_diagram import diagram as run

    data = run(load(source, project=project), x=x, y=y, grid=grid, x_range=x_range, y_range=y_range,
               progress=checked(progress))
    return Diagram(data, x, y, tuple(tuple(r) for r in data["phase"]), dict(data["counts"]))


@dataclass(frozen=True)
class SweepReport(Report):
    """`initadvisor.sweep/1`: each module's output size at init over widths or depths (a coordinate check's
    first row) and the fitted exponents."""

    axis: str = ""
    values: tuple[int, ...] = ()
    exponents: Mapping[str, float | None] = None


def sweep(source: Source, *, width: Sequence[int] | None = None, depth: Sequence[int] | None = None,
          project: Mapping[str, Any] | None = None, progress: Progress | None = None) -> SweepReport:
    """The analytic coordinate check over `width` (d_model; head dimension and d_ff / d_model held) or `depth`;
    `progress(done, total)`: told each block of each network profiled."""
    from initadvisor.coords import sweep as run

    data = run(load(source, project=project), width=None if width is None else list(width),
               depth=None if depth is None else list(depth), progress=checked(progress))
    return SweepReport(data, data["axis"], tuple(data["values"]), dict(data["exponents"]))
