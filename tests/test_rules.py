"""Every rule of the registry, through the real `check`: it fires on its own failing example and stays silent
on its fixed one; a rule with a threshold key flips exactly where its threshold crosses the quantity the report
shows; --select / --ignore / fail-on through the real CLI with pyproject < spec < command line; and the
README's rules table is the one the registry generates."""

import contextlib
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
import yaml

from conftest import ROOT
from initadvisor import formats as F
from initadvisor.cli import main
from initadvisor.diagnose import analyse, check, diagnose
from initadvisor.rules import EXAMPLE_BASE, RULES, example
from initadvisor.spec import SCHEMA, THRESHOLDS, build_spec

CODES = [c for c, r in RULES.items() if r.scope == "spec"]  # audit rules fire on live models: tests/test_audit.py
THRESHOLD_RULES = [c for c, r in RULES.items() if r.threshold_key]

# The quantity each threshold is compared with, read from the check/1 report (not from the rule's code), and
# whether the rule fires when the quantity is above the threshold (True) or below it (False).
QUANTITY = {
    "rank_collapse_rho": (lambda rep: max(row["rho"] for row in rep["layers"]), True),
    "collapse_trend_rho": (lambda rep: rep["layers"][-1]["rho"], True),
    "forward_ratio_max": (lambda rep: max(rep["growth"]["forward"]["blocks"],
                                          1 / rep["growth"]["forward"]["blocks"]), True),
    "grad_explode": (lambda rep: rep["growth"]["gradient"]["blocks"], True),
    "grad_vanish": (lambda rep: rep["growth"]["gradient"]["blocks"], False),
    "qk_grad_ratio_min": (lambda rep: min(row["qk_to_v_grad_ratio"] for row in rep["layers"][1:]), False),
    "initial_loss_excess": (lambda rep: rep["initial_loss"]["expected"] - rep["initial_loss"]["uniform"], True),
    "router_shrink": (lambda rep: rep["routing"]["shrink"], False),
}
EPS = 1e-4  # "just below / just above": far wider than the report's 6 significant digits


def report(overrides: dict, thresholds: dict | None = None) -> dict:
    data = example(overrides)
    if thresholds:
        data["thresholds"] = thresholds
    return check(build_spec(data), "error", (), ())  # no select/ignore: every finding


def codes(rep: dict) -> list[str]:
    return [f["code"] for f in rep["findings"]]


# --------------------------------------------------------------------------------------------- the registry


def schema_has(key: str) -> bool:
    node = SCHEMA
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize("code", CODES)
def test_rule_is_complete(code):
    r = RULES[code]
    assert re.fullmatch(r"IA\d{3}", r.code) and r.code == code
    assert r.severity in ("error", "warning", "info")
    assert r.threshold_key is None or r.threshold_key in THRESHOLDS
    assert r.keys and all(schema_has(k) for k in r.keys), r.keys
    assert callable(r.check)
    for text in (r.name, r.title, r.criterion, r.meaning, r.formula, r.source, r.fix):
        assert text.strip() and "\n" not in text
    assert r.fails and r.passes and r.fails != r.passes


def test_registry_owns_every_threshold_and_names_are_unique():
    assert {r.threshold_key for r in RULES.values()} - {None} == set(THRESHOLDS)
    assert len({r.name for r in RULES.values()}) == len(RULES)
    assert set(QUANTITY) == set(THRESHOLDS)  # a new threshold needs its quantity here


def test_diagnose_is_the_rules_in_order():
    spec = build_spec(example(RULES["IA103"].fails))  # several rules fire here
    a = analyse(spec)
    expected = [f for r in RULES.values() for f in r.check(spec, a)]
    assert diagnose(spec, a) == expected and len(expected) >= 3


# --------------------------------------------------------------------------------------------- fire / silent


@pytest.mark.parametrize("code", CODES)
def test_fires_on_its_failing_example(code):
    r = RULES[code]
    rep = report(r.fails)
    hits = [f for f in rep["findings"] if f["code"] == code]
    assert len(hits) == 1, codes(rep)
    assert hits[0]["severity"] == r.severity and hits[0]["source"] == r.source and hits[0]["message"]
    spec = build_spec(example(r.fails))
    assert {f.code for f in r.check(spec, analyse(spec))} <= {code}  # a rule's check reports its own code only


@pytest.mark.parametrize("code", CODES)
def test_silent_on_its_fixed_example(code):
    r = RULES[code]
    rep = report(r.passes)
    assert code not in codes(rep)
    spec = build_spec(example(r.passes))
    assert r.check(spec, analyse(spec)) == []


# Each threshold rule on its own failing example, plus the sides that example does not reach.
THRESHOLD_CASES = [(c, RULES[c].fails) for c in THRESHOLD_RULES] + [
    ("IA103", {"model": {"layers": 8, "norm": "none"},  # forward variance dies (q_L / q_1 ~ 5e-5)
               "residual": {"attention": {"skip": 0.7}, "mlp": {"skip": 0.7}}}),
]


@pytest.mark.parametrize("code, overrides", THRESHOLD_CASES,
                         ids=[f"{c}-{i}" for i, (c, _) in enumerate(THRESHOLD_CASES)])
def test_threshold_flips_at_the_reported_quantity(code, overrides):
    r = RULES[code]
    assert r.threshold_key in QUANTITY, f"{code}: add how to read {r.threshold_key}'s quantity to QUANTITY"
    read, fires_above = QUANTITY[r.threshold_key]
    assert not example(overrides)["model"].get("causal"), "layer rows of causal models average positions"
    x = read(report(overrides))
    assert 1e-11 < x < 1e11
    below, above = x * (1 - EPS), x * (1 + EPS)
    fire, silent = (below, above) if fires_above else (above, below)
    assert code in codes(report(overrides, {r.threshold_key: fire})), (r.threshold_key, fire, x)
    assert code not in codes(report(overrides, {r.threshold_key: silent})), (r.threshold_key, silent, x)
    if overrides is r.fails:  # the built-in default sits on the firing side of the rule's failing example
        assert (x > THRESHOLDS[r.threshold_key]) == fires_above


def test_exclusive_pairs_never_fire_together():
    for r in RULES.values():
        for overrides in (r.fails, r.passes):
            found = set(codes(report(overrides)))
            for pair in ({"IA101", "IA102"}, {"IA201", "IA202"}, {"IA301", "IA302"}):
                assert not pair <= found, (r.code, found)


# --------------------------------------------------------------------------------------------- the CLI



@dataclass
class Result:
    exit_code: int
    stdout: str


def invoke(args: list[str]) -> Result:
    """The CLI in-process: its exit code and stdout (a one-line error, if any, goes to stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(args)
        except SystemExit as e:
            return Result(e.code, out.getvalue())
    raise AssertionError("main() returned without exiting")

# IA103's failing example fires one rule of each family: IA102 IA103 IA201 IA301 IA304 IA501 (its forward
# variance explodes, and with no final norm so do the logits).
MANY = example(RULES["IA103"].fails)
MANY_CODES = ["IA102", "IA103", "IA201", "IA301", "IA304", "IA305", "IA501"]


def write(tmp_path, spec: dict, pyproject: str = "") -> str:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n" + pyproject)  # also shields parents
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    return "spec.yaml"


def cli(tmp_path, monkeypatch, *args):
    monkeypatch.chdir(tmp_path)
    res = invoke(["check", "spec.yaml", "--format", "json", *args])
    rep = json.loads(res.stdout)
    assert rep["verdict"] == ("fail" if res.exit_code == 1 else "pass") and res.exit_code in (0, 1)
    return codes(rep), res.exit_code


def test_many_fires_what_the_cli_tests_expect(tmp_path, monkeypatch):
    write(tmp_path, MANY)
    assert cli(tmp_path, monkeypatch) == (MANY_CODES, 1)


@pytest.mark.parametrize("args, expected", [
    (["--select", "IA3"], ["IA301", "IA304", "IA305"]),
    (["--select", "IA301,ia1"], ["IA102", "IA103", "IA301"]),
    (["--select", "IA2,IA9"], ["IA201"]),
    (["--ignore", "IA3"], ["IA102", "IA103", "IA201", "IA501"]),
    (["--ignore", "ia304,IA2"], ["IA102", "IA103", "IA301", "IA305", "IA501"]),
    (["--select", "IA1,IA3", "--ignore", "IA103,IA30"], ["IA102"]),
])
def test_select_and_ignore_on_the_command_line(tmp_path, monkeypatch, args, expected):
    write(tmp_path, MANY)
    found, rc = cli(tmp_path, monkeypatch, *args)
    assert found == expected
    assert rc == (1 if any(RULES[c].severity == "error" for c in expected) else 0)  # the gate sees only these


@pytest.mark.parametrize("key, project, spec, line, expected", [
    ("ignore", ["IA1"], None, None, ["IA201", "IA301", "IA304", "IA305", "IA501"]),
    ("ignore", ["IA1"], ["IA3"], None, ["IA102", "IA103", "IA201", "IA501"]),  # the spec replaces pyproject's list
    ("ignore", ["IA1"], ["IA3"], "IA2", ["IA102", "IA103", "IA301", "IA304", "IA305", "IA501"]),  # the command line replaces both
    ("ignore", None, ["IA201"], None, ["IA102", "IA103", "IA301", "IA304", "IA305", "IA501"]),
    ("select", ["IA3"], None, None, ["IA301", "IA304", "IA305"]),
    ("select", ["IA3"], ["IA1"], None, ["IA102", "IA103"]),
    ("select", ["IA3"], ["IA1"], "IA2", ["IA201"]),
    ("select", None, None, "IA304", ["IA304"]),
])
def test_select_ignore_precedence(tmp_path, monkeypatch, key, project, spec, line, expected):
    data = dict(MANY, **({key: spec} if spec else {}))
    write(tmp_path, data, f"[tool.initadvisor]\n{key} = {json.dumps(project)}\n" if project else "")
    found, _ = cli(tmp_path, monkeypatch, *([f"--{key}", line] if line else []))
    assert found == expected


WARN_ONLY = example(RULES["IA102"].fails)  # IA102 (warning), IA303 (warning), IA304 (info)


@pytest.mark.parametrize("spec, project, line, rc", [
    (WARN_ONLY, None, None, 0),  # default fail-on: error
    (WARN_ONLY, None, "warning", 1),
    (WARN_ONLY, "warning", None, 1),  # pyproject's fail-on
    (WARN_ONLY, "warning", "error", 0),  # the command line wins
    (MANY, None, None, 1),
    (MANY, "never", None, 0),
    (MANY, "never", "error", 1),
    (MANY, "error", "never", 0),
])
def test_fail_on(tmp_path, monkeypatch, spec, project, line, rc):
    write(tmp_path, spec, f'[tool.initadvisor]\nfail-on = "{project}"\n' if project else "")
    assert cli(tmp_path, monkeypatch, *(["--fail-on", line] if line else []))[1] == rc


def test_precedence_through_the_installed_entry_point(tmp_path):
    """The same chain in a real process: pyproject selects IA3, the spec IA1 and IA2, the command line ignores IA2."""
    write(tmp_path, dict(MANY, select=["IA1", "IA2"]), '[tool.initadvisor]\nselect = ["IA3"]\nfail-on = "never"\n')
    res = subprocess.run([sys.executable, "-m", "initadvisor", "check", "spec.yaml", "--format", "json",
                          "--ignore", "IA2"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr  # IA103 is an error, but pyproject's fail-on is never
    assert codes(json.loads(res.stdout)) == ["IA102", "IA103"]


# --------------------------------------------------------------------------------------------- rules / explain / README


def explained_examples(text: str) -> tuple[dict, dict]:
    def block(title):
        body = text.split(title, 1)[1].split("\n", 1)[1].split("\n\n", 1)[0]  # the lines under the title
        return yaml.safe_load(body)

    return block("failing example"), block("fixed example")


@pytest.mark.parametrize("code", CODES)
def test_explain_shows_the_examples_and_they_work(tmp_path, monkeypatch, code):
    r = RULES[code]
    res = invoke(["explain", code.lower()])
    assert res.exit_code == 0
    for part in (r.code, r.name, r.title, r.meaning, r.criterion, r.formula, r.source, r.threshold, r.fix):
        assert part in res.stdout
    fails, passes = explained_examples(res.stdout)
    assert fails == example(r.fails) and passes == example(r.passes)
    write(tmp_path, fails)
    assert code in cli(tmp_path, monkeypatch)[0]
    write(tmp_path, passes)
    assert code not in cli(tmp_path, monkeypatch)[0]


def test_rules_command_lists_the_registry(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich: no wrapping
    res = invoke(["rules"])
    assert res.exit_code == 0
    for row in F.rules_table():
        assert re.search(r"[\s│]+".join(map(re.escape, row)), res.stdout), row
    assert [row[0] for row in F.rules_table()] == list(RULES)


def test_readme_rules_table_is_generated_from_the_registry():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.split("### Findings\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    table = "".join(line + "\n" for line in lines[start:end])
    assert table == F.rules_markdown(), (
        "README.md's rules table drifted from src/initadvisor/rules.py; paste "
        "`python -c 'from initadvisor.formats import rules_markdown; print(rules_markdown())'` into it")
    assert all(f"| {c} |" in table for c in RULES)


def test_examples_are_small_and_valid():
    assert build_spec(EXAMPLE_BASE).layers <= 4
    for r in RULES.values():
        for overrides in (r.fails, r.passes):
            spec = build_spec(example(overrides))
            assert spec.layers <= 24 and spec.d_model <= 64


def test_alibi_masks_a_collapse_as_windows_do():
    """IA107 on ALiBi: BLOOM's biases keep an attention-led stack's rho below rank_collapse_rho where the same stack
    without them collapses; a stronger attention skip leaves nothing to mask."""
    spec = {"model": {"layers": 8, "norm": "pre", "causal": True, "alibi": True, "heads": 8},
            "init": {"v": {"gain": 4}}}
    hits = [f for f in report(spec)["findings"] if f["code"] == "IA107"]
    assert len(hits) == 1 and "ALiBi" in hits[0]["message"]
    assert "IA107" not in codes(report({**spec, "residual": {"attention": {"skip": 2.0}}}))


def test_windows_counterfactual_runs_on_the_engine_its_row_ran_on(monkeypatch):
    """IA107's every-layer-global counterfactual: position-resolved where the analysis of the spec was (check), on the
    pair engine where the analysis was (recommend's recipes past their budget), so that such a row does not pay for
    the position-resolved run it was spared; on both it fires for an attention-led ALiBi stack."""
    from initadvisor import diagnose

    spec = build_spec(example({"model": {"layers": 8, "norm": "pre", "causal": True, "alibi": True, "heads": 8},
                               "init": {"v": {"gain": 4}}}))
    resolved, paired = diagnose.analyse(spec), diagnose.analyse(spec, resolve=False)
    assert resolved.ct is not None and paired.ct is None
    assert "IA107" in {f.code for f in diagnose.diagnose(spec, resolved)}

    def refuse(*_a, **_k):
        raise AssertionError("the position-resolved engine ran for a row analysed on the pair engine")

    monkeypatch.setattr(diagnose, "causal_trace", refuse)
    assert "IA107" in {f.code for f in diagnose.diagnose(spec, paired)}


@pytest.mark.parametrize("window", [{"sliding_window": 64, "window_blocks": []}, {"sliding_window": 200}])
def test_windows_mask_collapse_skips_a_stack_without_windows(monkeypatch, window):
    """No layer with a window shorter than the sequence (window_blocks [] or W >= T): IA107's counterfactual would be
    the spec itself, so it is not run (fuzz seed 113: a 100000-layer check spent a third of its 60 s on it)."""
    from initadvisor import rules
    from initadvisor.diagnose import analyse
    from initadvisor.spec import build_spec

    spec = build_spec({"model": {"layers": 3, "d_model": 32, "heads": 2, "causal": True, **window},
                       "sequence": {"length": 128}, "thresholds": {"rank_collapse_rho": 0.999}})
    a = analyse(spec)

    def no_counterfactual(*args, **kwargs):
        raise AssertionError("the counterfactual stack was built")

    monkeypatch.setattr("initadvisor.stack.from_spec", no_counterfactual)
    assert rules.windows_mask_collapse(spec, a) == []


@pytest.mark.parametrize("toml, expected", [
    ('[tool."initadvisor"]\nselect = ["IA2"]\n', ["IA201"]),  # quoted key
    ("[tool]\ninitadvisor = {select = ['IA2']}\n", ["IA201"]),  # inline table
    ('tool.initadvisor.select = ["IA2"]\n', ["IA201"]),  # dotted key at the top level
    ("[tool.other]\nx = = 1\n", MANY_CODES),  # not our table: not parsed, so its syntax is not ours to refuse
])
def test_pyproject_forms_of_our_table(tmp_path, monkeypatch, toml, expected):
    """Every TOML spelling of [tool.initadvisor] is read; a pyproject without one is left alone."""
    (tmp_path / "pyproject.toml").write_text(toml)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(MANY))
    assert cli(tmp_path, monkeypatch)[0] == expected


def test_malformed_pyproject_with_our_table_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_text("[tool.initadvisor]\nselect = [\n")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(MANY))
    monkeypatch.chdir(tmp_path)
    assert invoke(["check", "spec.yaml"]).exit_code == 2
    err = capsys.readouterr().err
    assert "pyproject.toml" in err and "malformed TOML" in err
