"""CI renderings of check reports: SARIF 2.1.0 (validated against the OASIS schema), GitHub workflow commands,
JUnit XML, the pull-request markdown, and the rule texts."""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from conftest import ROOT, SPECS
from initadvisor import formats as F
from initadvisor.diagnose import check
from initadvisor.rules import RULES
from initadvisor.spec import SpecError, load_spec, parse_spec

# The OASIS SARIF 2.1.0 JSON schema, copied from the OASIS sarif-spec repository (sarif-2.1/schema/).
SARIF_SCHEMA = ROOT / "tests" / "data" / "sarif-schema-2.1.0.json"


def entries(paths=SPECS, fail_on="error"):
    out = []
    for p in paths:
        spec = load_spec(p)
        out.append((str(p.relative_to(ROOT)), check(spec, fail_on), spec))
    return out


@pytest.fixture(scope="module")
def shipped():
    return entries()


@pytest.fixture(scope="module")
def sarif_validator():
    import jsonschema  # a declared test dependency

    schema = json.loads(SARIF_SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def all_findings(items):
    return [(path, f) for path, rep, _ in items for f in rep["findings"]]


# A report with hostile text in every field a renderer copies: it must survive every format.
NASTY_MSG = "100% sure: a,b\r\nline two | <b>bold</b> & `code` ]]> \x1b[31m"


def nasty_entry():
    spec = parse_spec("model:\n  layers: 3\n  d_model: 64\n  heads: 4\n", "dir with space/we,ird:na%me.yaml")
    rep = check(spec)
    rep["findings"] = [{"code": "IA101", "severity": "error", "message": NASTY_MSG, "layer": 2, "source": "s & t"},
                       {"code": "IA999", "severity": "warning", "message": "unknown code", "layer": None,
                        "source": ""}]
    rep["verdict"] = "fail"
    return ("dir with space/we,ird:na%me.yaml", rep, spec)


# --------------------------------------------------------------------------------------------- SARIF


def test_sarif_validates_for_shipped_specs(shipped, sarif_validator):
    log = F.to_sarif(shipped)
    errors = sorted(sarif_validator.iter_errors(log), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])
    json.dumps(log, allow_nan=False)
    assert log["version"] == "2.1.0" and len(log["runs"]) == 1


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_sarif_validates_per_spec(path, sarif_validator):
    log = F.to_sarif(entries([path]))
    assert not list(sarif_validator.iter_errors(log))


def test_sarif_validates_with_hostile_text_and_no_findings(sarif_validator):
    for items in ([nasty_entry()], [], [("x.yaml", {**entries(SPECS[:1])[0][1], "findings": []})]):
        log = F.to_sarif(items)
        assert not list(sarif_validator.iter_errors(log))


def test_sarif_driver_lists_every_rule():
    driver = F.to_sarif([])["runs"][0]["tool"]["driver"]
    assert driver["name"] == "initadvisor" and driver["version"]
    assert [r["id"] for r in driver["rules"]] == list(RULES)
    level = {"error": "error", "warning": "warning", "info": "note"}
    for d in driver["rules"]:
        r = RULES[d["id"]]
        assert d["name"] == r.name
        assert d["shortDescription"]["text"] == r.title
        assert d["fullDescription"]["text"] == r.meaning
        assert d["defaultConfiguration"]["level"] == level[r.severity]
        for part in (r.formula, r.source, r.threshold, r.fix):
            assert part in d["help"]["text"]


def test_sarif_one_result_per_finding_with_locations(shipped):
    log = F.to_sarif(shipped)
    results = log["runs"][0]["results"]
    expected = all_findings(shipped)
    assert len(results) == len(expected) > 0
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    level = {"error": "error", "warning": "warning", "info": "note"}
    for res, (path, f) in zip(results, expected):
        assert res["ruleId"] == f["code"] and rules[res["ruleIndex"]]["id"] == f["code"]
        assert res["message"]["text"] == f["message"]
        assert res["level"] == level[f["severity"]]
        loc = res["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"] == path  # relative, as given
        n_lines = len((ROOT / path).read_text().splitlines())
        assert 1 <= loc["region"]["startLine"] <= n_lines


def test_sarif_lines_point_at_the_relevant_key(shipped):
    by = {(path, res["ruleId"]): res["locations"][0]["physicalLocation"]["region"]["startLine"]
          for path, rep, spec in shipped for res in F.to_sarif([(path, rep, spec)])["runs"][0]["results"]}
    text = {path: (ROOT / path).read_text().splitlines() for path, _, _ in shipped}

    def line(path, code):
        return text[path][by[(path, code)] - 1].strip()

    assert line("model_specs/entropy-collapse.yaml", "IA201").startswith("qk_beta:")
    assert line("model_specs/paper001-fig1-bert60.yaml", "IA101").startswith("attention: {skip")
    assert line("model_specs/gpt2-small.yaml", "IA901").startswith("causal:")
    assert line("model_specs/deep-preln-96.yaml", "IA102").startswith("layers:")


def test_finding_line_fallbacks():
    assert F.finding_line("IA101", {}) == 1
    assert F.finding_line("IA101", {"model": 3, "model.layers": 4}) == 4
    assert F.finding_line("IA201", {"init": 7, "init.std": 8, "init.q": 9}) == 9  # exact key beats the section
    assert F.finding_line("IA201", {"init": 7, "model": 2}) == 7  # nearest present parent
    assert F.finding_line("IA999", {"model": 2}) == 2
    spec = parse_spec("model:\n  layers: 3\n  d_model: 64\n  heads: 4\n  causal: true\n")
    assert F.finding_line("IA901", spec) == 5
    # without a spec (e.g. reports read back from JSON) every finding points at line 1
    rep = check(spec)
    assert {r["locations"][0]["physicalLocation"]["region"]["startLine"]
            for r in F.to_sarif([("a.yaml", rep)])["runs"][0]["results"]} == {1}


def test_bare_report_dicts_are_accepted(shipped):
    _, rep, _ = shipped[0]
    assert F.to_sarif([{**rep, "file": "x/y.yaml"}])["runs"][0]["artifacts"][0]["location"]["uri"] == "x/y.yaml"
    assert rep["spec"]["name"] in F.to_github([rep]) or not rep["findings"]


# --------------------------------------------------------------------------------------------- GitHub

GH_LINE = re.compile(r"^::(error|warning|notice) file=([^,:]*),line=(\d+),title=([^,:]*)::(.*)$")


def gh_unescape(s):
    return s.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


def test_github_lines_parse(shipped):
    out = F.to_github(shipped)
    lines = out.splitlines()
    expected = all_findings(shipped)
    assert len(lines) == len(expected) and out.endswith("\n")
    cmd = {"error": "error", "warning": "warning", "info": "notice"}
    for line, (path, f) in zip(lines, expected):
        m = GH_LINE.match(line)
        assert m, line
        assert m.group(1) == cmd[f["severity"]]
        assert gh_unescape(m.group(2)) == path
        assert gh_unescape(m.group(4)) == f"{f['code']} {RULES[f['code']].name}"
        assert gh_unescape(m.group(5)) == f["message"]


def test_github_escapes_hostile_text():
    out = F.to_github([nasty_entry()])
    lines = out.splitlines()
    assert len(lines) == 2  # no raw CR/LF leaks into a second command
    m = GH_LINE.match(lines[0])
    assert m, lines[0]
    assert gh_unescape(m.group(2)) == "dir with space/we,ird:na%me.yaml"
    assert gh_unescape(m.group(5)) == NASTY_MSG
    assert "%25" in m.group(2) and "%2C" in m.group(2) and "%3A" in m.group(2)
    assert F.escape_data("a%0A\n") == "a%250A%0A"


# --------------------------------------------------------------------------------------------- JUnit

SPEC_RULES = [c for c, r in RULES.items() if r.scope == "spec"]  # the audit's rules judge live models


@pytest.mark.parametrize("fail_on", ["error", "warning", "never"])
def test_junit_counts(fail_on):
    items = entries(fail_on=fail_on)
    root = ET.fromstring(F.to_junit(items, fail_on))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [p for p, _, _ in items]
    gate = {"error": {"error"}, "warning": {"error", "warning"}, "never": set()}[fail_on]
    tot_fail = tot_skip = 0
    for suite, (path, rep, _) in zip(suites, items):
        cases = suite.findall("testcase")
        assert [c.get("name").split()[0] for c in cases] == SPEC_RULES
        fired = {f["code"]: f for f in rep["findings"]}
        n_fail = sum(f["severity"] in gate for f in fired.values())
        n_skip = len(fired) - n_fail
        assert int(suite.get("tests")) == len(SPEC_RULES)
        assert int(suite.get("failures")) == n_fail == len(suite.findall("testcase/failure"))
        assert int(suite.get("skipped")) == n_skip == len(suite.findall("testcase/skipped"))
        for c in cases:
            code = c.get("name").split()[0]
            failed, skipped = c.find("failure") is not None, c.find("skipped") is not None
            assert failed == (code in fired and fired[code]["severity"] in gate)
            assert skipped == (code in fired and fired[code]["severity"] not in gate)
        # a spec fails the gate exactly when its suite has a failure
        assert (n_fail > 0) == (rep["verdict"] == "fail")
        tot_fail += n_fail
        tot_skip += n_skip
    assert int(root.get("tests")) == len(SPEC_RULES) * len(items)
    assert int(root.get("failures")) == tot_fail and int(root.get("skipped")) == tot_skip


def test_junit_hostile_text_is_well_formed():
    xml = F.to_junit([nasty_entry()])
    root = ET.fromstring(xml)
    fail = root.find("testsuite/testcase/failure")
    assert fail is not None and "100% sure" in fail.get("message")
    assert len(root.findall("testsuite/testcase")) == len(SPEC_RULES) + 1  # the unknown code still shows
    with pytest.raises(ValueError):
        F.to_junit([], "sometimes")


# --------------------------------------------------------------------------------------------- markdown


def test_markdown_lists_every_spec_and_finding(shipped):
    md = F.to_markdown(shipped)
    for path, rep, _ in shipped:
        row = next(line for line in md.splitlines() if line.startswith(f"| `{path}`"))
        assert row.count("|") == 6
        assert rep["verdict"] in row
        s = F.summary(rep)
        assert f"{s['final_rho']:.4f}" in row and f"{s['worst_beta_ratio']:.3f}" in row
        assert f"{s['gradient_ratio']:.3g}" in row
    for _, f in all_findings(shipped):
        assert f["code"] in md
    assert md.count("\n- ") == len(all_findings(shipped))
    assert "2 failing" in md


def test_markdown_hostile_text_stays_in_its_cell():
    md = F.to_markdown([nasty_entry()])
    assert "\r" not in md and "<b>" not in md
    bullets = [line for line in md.splitlines() if line.startswith("- ")]
    assert len(bullets) == 2
    assert "No findings." in F.to_markdown([("a.yaml", {**nasty_entry()[1], "findings": []})])


def test_summary_values(shipped):
    for _, rep, _ in shipped:
        s = F.summary(rep)
        assert s["final_rho"] == rep["layers"][-1]["rho"]
        assert s["gradient_ratio"] == rep["growth"]["gradient"]["blocks"]
        ratios = [r["beta"] / r["beta_c"] for r in rep["layers"][1:]]
        assert s["worst_beta_ratio"] == pytest.approx(max(ratios))


# --------------------------------------------------------------------------------------------- rule texts


def test_rule_text_and_table():
    for code, r in RULES.items():
        t = F.rule_text(code)
        for part in (r.code, r.name, r.severity, r.title, r.meaning, r.formula, r.source, r.threshold, r.fix):
            assert part in t
        assert F.rule_text(code.lower()) == t == F.rule_text(r.name)
    rows = F.rules_table()
    assert [row[0] for row in rows] == list(RULES)
    assert all(len(row) == len(F.RULES_COLUMNS) for row in rows)
    with pytest.raises(SpecError) as e:
        F.rule_text("IA999")
    assert "IA999" in str(e.value) and "\n" not in str(e.value)
