"""Property tests of the CLI contract (tests/cli_contract.py) over the documented input space: every command,
every format and every option either exits 0/1 with a finite report or exits 2 with one line on stderr; valid
inputs are never refused; `import` and `recommend` never write a spec that `check` refuses; unwritable output
paths are refused. Derandomised and bounded (about a minute on 2 cores); benchmarks/fuzz.py runs longer.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import cli_contract as cc
from initadvisor.rules import RULES


def examples(n: int):
    """Derandomised, no shrinking (a failure prints its spec and command line; the time stays bounded)."""
    return settings(derandomize=True, database=None, max_examples=n, deadline=None,
                    phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))


def assert_contract(case: cc.Case) -> None:
    _, found = cc.run_case(case)
    if found:
        shown = "".join(f"--- {p}\n{p.read_text(errors='replace')}\n" for p in case.files
                        if p.is_file() and p.stat().st_size < 4000)
        raise AssertionError("\n".join(f"{key}\n  $ {shlex.join(['initadvisor', *argv])}\n  {detail}"
                                       for key, detail, argv in found) + "\n" + shown)


def spec_case(r: cc.Rand, d: Path, command: str, max_layers: int, abuse: bool = False, fmt: str | None = None,
              small: bool = False, skip: tuple[str, ...] = ("--plot", "--png", "--svg")) -> cc.Case:
    """A valid spec file under d and random options of `command` but `skip` (one abused when `abuse`)."""
    spec = d / "spec.yaml"
    spec.write_text(cc.spec_text(r, cc.valid_spec(r, max_layers, small)))
    args, valid, must = cc.options(r, command, d, abuse, skip + (("--format",) if fmt else ()))
    args += ["--format", fmt] if fmt else []
    return cc.Case([command, str(spec), *args], d, valid, must, files=[spec])


@examples(15)
@given(st.randoms(use_true_random=False))
def test_check_every_format(rnd):
    r = cc.Rand(rnd)
    for fmt in cc.FORMATS["check"]:
        with tempfile.TemporaryDirectory() as t:
            assert_contract(spec_case(r, Path(t), "check", 300, fmt=fmt))


@examples(5)
@given(st.randoms(use_true_random=False))
def test_recommend_patched_spec_is_accepted_by_check(rnd):
    r = cc.Rand(rnd)
    with tempfile.TemporaryDirectory() as t:
        case = spec_case(r, Path(t), "recommend", 12, fmt=r.choice(cc.FORMATS["recommend"]))
        if "--out" not in case.argv:
            case.argv += ["--out", str(Path(t) / "patched.yaml")]
        assert_contract(case)


@examples(10)
@given(st.randoms(use_true_random=False))
def test_diagram_every_axis_pair(rnd):
    r = cc.Rand(rnd)
    with tempfile.TemporaryDirectory() as t:
        assert_contract(spec_case(r, Path(t), "diagram", 20))


@examples(4)
@given(st.randoms(use_true_random=False))
def test_verify_small_networks(rnd):
    r = cc.Rand(rnd)
    with tempfile.TemporaryDirectory() as t:
        assert_contract(spec_case(r, Path(t), "verify", 3, small=True, skip=("--plot", "--backend")))


@examples(2)
@given(st.randoms(use_true_random=False))
def test_figures(rnd):
    r = cc.Rand(rnd)
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        for argv in (["plot", "--png", d / "p.png"], ["diagram", "--grid", "4", "--svg", d / "d.svg"],
                     ["check", "--plot", d / "c.pdf"]):
            case = spec_case(r, d, argv[0], 20)
            case.argv = [argv[0], case.argv[1], *map(str, argv[1:])]
            assert_contract(case)


@examples(30)
@given(st.randoms(use_true_random=False))
def test_hf_configs_import_and_check(rnd):
    r = cc.Rand(rnd)
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        cfg = d / "config.json"
        mutate = r.coin(0.7)
        cfg.write_text(json.dumps(cc.hf_config(r, mutate), indent=2))
        command = r.choice(["import", "import", "check"])
        args, valid, must = cc.options(r, command, d, abuse=False)
        assert_contract(cc.Case([command, str(cfg), *args], d, valid and not mutate, must, files=[cfg]))


@examples(8)
@given(st.randoms(use_true_random=False))
def test_sweep(rnd):
    r = cc.Rand(rnd)
    with tempfile.TemporaryDirectory() as t:
        assert_contract(spec_case(r, Path(t), "sweep", 30))


@examples(40)
@given(st.randoms(use_true_random=False))
def test_option_abuse_is_one_line(rnd):
    r = cc.Rand(rnd)
    command = r.choice(["check", "recommend", "diagram", "verify", "plot", "import", "sweep"])
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        if command == "import":
            cfg = d / "config.json"
            cfg.write_text(json.dumps(cc.hf_config(r, False)))
            args, valid, must = cc.options(r, command, d, abuse=True)
            case = cc.Case([command, str(cfg), *args], d, valid, must, files=[cfg])
        else:
            layers = {"recommend": 10, "diagram": 10, "sweep": 10}.get(command, 50)
            case = spec_case(r, d, command, layers, abuse=True,
                             small=command == "verify", skip=("--backend",))
        assert_contract(case)


@examples(25)
@given(st.randoms(use_true_random=False))
def test_odd_files(rnd):
    r = cc.Rand(rnd)
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        path, ok = cc.odd_file(r, d)
        command = r.choice(["check", "recommend", "diagram", "verify", "plot", "import", "sweep"])
        args, valid, must = cc.options(r, command, d, abuse=False)
        if command == "verify":
            args += ["--seq-len", "4"]
        assert_contract(cc.Case([command, str(path), *args], d, ok and valid and command != "import", must,
                                files=[path]))


@examples(15)
@given(st.randoms(use_true_random=False))
def test_pyproject_settings(rnd):
    r = cc.Rand(rnd)
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        text, ok = cc.pyproject(r)
        (d / "pyproject.toml").write_text(text)
        case = spec_case(r, d, "check", 50)
        case.cwd, case.valid = d, case.valid and ok
        assert_contract(case)


@pytest.mark.parametrize("option", ["check --plot", "recommend --out", "verify --plot", "diagram --png",
                                    "diagram --svg", "plot --png"])
def test_unwritable_outputs_are_refused(option, tmp_path):
    command, flag = option.split()
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: {layers: 2, d_model: 8, heads: 2}\nsequence: {length: 8}\n")
    extra = ["--seeds", "1", "--batch", "1"] if command == "verify" else ["--grid", "2"] if command == "diagram" else []
    for bad in cc.bad_paths(tmp_path):
        assert_contract(cc.Case([command, str(spec), flag, bad, *extra], tmp_path, False, True, files=[spec]))


@pytest.mark.parametrize("argv", [["rules"], *(["explain", c] for c in RULES),
                                  *(["explain", r.name] for r in RULES.values()),
                                  ["explain", "IA999"], ["explain", ""], ["explain", "\n"], ["explain", "x" * 300]])
def test_rules_and_explain(argv, tmp_path):
    assert_contract(cc.Case(argv, tmp_path, valid=argv[0] == "rules" or argv[1] in RULES
                            or argv[1] in [r.name for r in RULES.values()]))


CORNERS = {  # ends of the documented ranges, together
    "causal-longest": "model: {layers: 2000, d_model: 64, heads: 4, causal: true}\nsequence: {length: 10000000}\n",
    "widest": "model: {layers: 2, d_model: 1000000, heads: 1, d_ff: 10000000}\n",
    "largest-stds-no-norm": "model: {layers: 300, d_model: 64, heads: 4, norm: none}\ninit: {std: 999999}\n",
    "smallest-stds": "model: {layers: 300, d_model: 64, heads: 4, norm: pre}\ninit: {std: 1.0e-8}\n",
    "extreme-thresholds": ("model: {layers: 3, d_model: 8, heads: 2}\nthresholds: {rank_collapse_rho: 1.0e-12, "
                           "collapse_trend_rho: 1.0e+12, grad_explode: 1.0e-12, grad_vanish: 1.0e+12, "
                           "qk_grad_ratio_min: 1.0e+12, forward_ratio_max: 1.0e-12}\n"),
}


@pytest.mark.parametrize("name", list(CORNERS))
def test_range_corners(name, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(CORNERS[name])
    assert_contract(cc.Case(["check", str(spec), "--format", "json"], tmp_path, files=[spec]))
    assert_contract(cc.Case(["recommend", str(spec), "--format", "yaml"], tmp_path, files=[spec]))
