"""Machine-readable and CI renderings of `initadvisor.check/1` reports, and the rule texts.

Every function here is pure: it takes reports that are already computed and returns text (or a dict). A
report is passed as an *entry* together with the spec file it came from:

    (path, report)                  the spec file path (as the user gave it) and its check report
    (path, report, spec)            ... plus the `Spec` (or its `lines` mapping: key path -> line)

The spec (or its lines) is what lets a finding point at the line of the spec key it relates to (SARIF
`region.startLine`, GitHub `line=`); without it every finding points at line 1. A bare report dict is
accepted too: its file is `report["file"]` if present, else the spec's name.

    to_sarif(entries)               SARIF 2.1.0 log (dict), one run, every rule of RULES in the driver
    to_github(entries)              GitHub Actions workflow commands, one line per finding
    to_junit(entries, fail_on)      JUnit XML: one testsuite per spec, one testcase per rule
    to_markdown(entries)            pull-request comment: a table of specs and the findings
    checks(entries)                 the `initadvisor.checks/1` document of several specs (JSON)
    rule_text(code)                 the `initadvisor explain CODE` text, with the rule's examples
    rules_table()                   rows for `initadvisor rules`
    rules_markdown()                the README's rules table
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from initadvisor import __version__
from initadvisor.rules import RULES, Rule

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}
SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
GITHUB_COMMAND = {"error": "error", "warning": "warning", "info": "notice"}
GATE = {"error": 2, "warning": 1, "never": 3}  # lowest severity rank that fails the gate (never: none)

# The spec keys a finding relates to (each rule's `keys`), most specific first; the first one present in the
# spec file wins, then the nearest present parent of any of them (Spec.line_of), then line 1.
RULE_KEYS: dict[str, tuple[str, ...]] = {r.code: r.keys for r in RULES.values()}
FALLBACK_KEYS = ("model",)

Entry = Any  # (path, report) | (path, report, Spec | Mapping[str, int] | None) | report


# ---------------------------------------------------------------------------------------------------
# entries and locations


def _entries(entries: Iterable[Entry]) -> list[tuple[str, dict, Mapping[str, int]]]:
    """Normalise the accepted entry shapes to (file, report, lines)."""
    out = []
    for e in entries:
        if isinstance(e, Mapping):
            path, report, spec = e.get("file") or e.get("spec", {}).get("name") or "<spec>", e, None
        else:
            path, report, *rest = e
            spec = rest[0] if rest else None
        if spec is None:
            lines: Mapping[str, int] = {}
        elif isinstance(spec, Mapping):
            lines = spec
        else:
            lines = getattr(spec, "lines", None) or {}
        out.append((str(path), report, lines))
    return out


def _line_of(lines: Mapping[str, int], key: str) -> int | None:
    while key:
        if key in lines:
            return lines[key]
        key = key.rpartition(".")[0]
    return None


def finding_line(code: str, lines: Mapping[str, int] | Any) -> int:
    """The spec line a finding with this code relates to (1 when the spec file has none of its keys)."""
    if not isinstance(lines, Mapping):
        lines = getattr(lines, "lines", None) or {}
    keys = RULE_KEYS.get(code, ())
    for k in keys:  # exact keys first: init.q beats the `init` section
        if k in lines:
            return int(lines[k])
    for k in keys + FALLBACK_KEYS:  # then the nearest section present
        line = _line_of(lines, k)
        if line is not None:
            return int(line)
    return 1


def _uri(path: str) -> str:
    """The path as a URI reference: forward slashes, percent-encoded where a URI needs it."""
    return quote(path.replace("\\", "/"), safe="/:@!$&'()*+,;=-._~")


def _rule(code: str) -> Rule | None:
    return RULES.get(code)


def _title(code: str) -> str:
    r = _rule(code)
    return f"{code} {r.name}" if r else code


# ---------------------------------------------------------------------------------------------------
# SARIF 2.1.0


def _help_text(r: Rule) -> str:
    return (f"{r.title}: {r.meaning}\n\nFormula: {r.formula}\nSource: {r.source}\nThreshold: {r.threshold}\n"
            f"Fix: {r.fix}")


def _help_markdown(r: Rule) -> str:
    return (f"**{r.title}** ({r.code}, {r.severity}): {r.meaning}\n\n"
            f"- Formula: `{r.formula}`\n- Source: {r.source}\n- Threshold: `{r.threshold}`\n- Fix: {r.fix}")


def sarif_rules() -> list[dict]:
    return [{
        "id": r.code,
        "name": r.name,
        "shortDescription": {"text": r.title},
        "fullDescription": {"text": r.meaning},
        "help": {"text": _help_text(r), "markdown": _help_markdown(r)},
        "defaultConfiguration": {"level": SARIF_LEVEL[r.severity]},
        "properties": {"tags": ["initialisation", "signal-propagation"], "formula": r.formula,
                       "source": r.source, "threshold": r.threshold, "fix": r.fix},
    } for r in RULES.values()]


def to_sarif(entries: Iterable[Entry]) -> dict:
    """A SARIF 2.1.0 log: one run of initadvisor, one result per finding of every report."""
    items = _entries(entries)
    index = {code: i for i, code in enumerate(RULES)}
    version = next((rep.get("version") for _, rep, _ in items if rep.get("version")), __version__)
    results, artifacts, seen = [], [], {}
    for path, rep, lines in items:
        uri = _uri(path)
        loc: dict[str, Any] = {"uri": uri}
        if not Path(path).is_absolute() and not path.startswith("<"):
            loc["uriBaseId"] = "%SRCROOT%"
        if uri not in seen:
            seen[uri] = len(artifacts)
            artifacts.append({"location": dict(loc)})
        for f in rep.get("findings", []):
            code = f["code"]
            props = {"layer": f.get("layer"), "source": f.get("source"), "spec": rep.get("spec", {}).get("name"),
                     "verdict": rep.get("verdict")}
            result: dict[str, Any] = {
                "ruleId": code,
                "level": SARIF_LEVEL.get(f.get("severity", ""), "warning"),
                "message": {"text": f["message"]},
                "locations": [{"physicalLocation": {
                    "artifactLocation": {**loc, "index": seen[uri]},
                    "region": {"startLine": finding_line(code, lines)},
                }}],
                "properties": {k: v for k, v in props.items() if v is not None},
            }
            if code in index:
                result["ruleIndex"] = index[code]
            results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "initadvisor",
                "version": str(version),
                "semanticVersion": str(version),
                "rules": sarif_rules(),
            }},
            "artifacts": artifacts,
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    }


# ---------------------------------------------------------------------------------------------------
# GitHub Actions workflow commands


def escape_data(s: str) -> str:
    """A workflow command's message (after `::`)."""
    return str(s).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(s: str) -> str:
    """A workflow command property value (file=, title=)."""
    return escape_data(s).replace(":", "%3A").replace(",", "%2C")


def to_github(entries: Iterable[Entry]) -> str:
    """One `::error|warning|notice file=F,line=N,title=CODE name::message` line per finding."""
    out = []
    for path, rep, lines in _entries(entries):
        for f in rep.get("findings", []):
            cmd = GITHUB_COMMAND.get(f.get("severity", ""), "warning")
            props = (f"file={escape_property(path)},line={finding_line(f['code'], lines)},"
                     f"title={escape_property(_title(f['code']))}")
            out.append(f"::{cmd} {props}::{escape_data(f['message'])}")
    return "".join(line + "\n" for line in out)


# ---------------------------------------------------------------------------------------------------
# JUnit XML


_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml(s: Any) -> str:
    """Text XML 1.0 can carry: characters it forbids (control codes, lone surrogates) become \\xNN."""
    return _XML_BAD.sub(lambda m: f"\\x{ord(m.group()):02x}", str(s))


def to_junit(entries: Iterable[Entry], fail_on: str = "error") -> str:
    """JUnit XML: a testsuite per spec, a testcase per spec rule of RULES (the audit's rules judge live models).

    A rule that fired with severity at or above `fail_on` is a <failure>; one that fired below it is
    <skipped> carrying its message (visible, not gating); one that did not fire passes.
    """
    if fail_on not in GATE:
        raise ValueError(f"fail_on must be one of {', '.join(GATE)}, got {fail_on!r}")
    gate = GATE[fail_on]
    root = ET.Element("testsuites", name="initadvisor")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for path, rep, lines in _entries(entries):
        name = rep.get("spec", {}).get("name") or Path(path).stem
        fired: dict[str, list[dict]] = {}
        for f in rep.get("findings", []):
            fired.setdefault(f["code"], []).append(f)
        suite = ET.SubElement(root, "testsuite", name=path, hostname="initadvisor")
        props = ET.SubElement(suite, "properties")
        for k, v in (("verdict", rep.get("verdict")), ("version", rep.get("version")), ("spec", name)):
            if v is not None:
                ET.SubElement(props, "property", name=k, value=str(v))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        codes = [c for c, r in RULES.items() if r.scope == "spec"] + [c for c in fired if c not in RULES]
        for code in codes:
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", name=_title(code), classname=f"initadvisor.{name}",
                                 file=path, line=str(finding_line(code, lines)), time="0")
            hits = fired.get(code)
            if not hits:
                continue
            text = "\n".join(f"{h['code']} {h['severity']}"
                             + (f" (layer {h['layer']})" if h.get("layer") is not None else "")
                             + f": {h['message']}\n{h.get('source', '')}" for h in hits)
            worst = max(hits, key=lambda h: SEVERITY_RANK.get(h["severity"], 1))
            if SEVERITY_RANK.get(worst["severity"], 1) >= gate:
                counts["failures"] += 1
                el = ET.SubElement(case, "failure", message=worst["message"], type=worst["severity"])
            else:
                counts["skipped"] += 1
                el = ET.SubElement(case, "skipped",
                                   message=f"{worst['severity']} below --fail-on {fail_on}: {worst['message']}")
            el.text = text
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
        suite.set("time", "0")
    for k, v in totals.items():
        root.set(k, str(v))
    for el in root.iter():  # report text may hold characters XML 1.0 cannot carry
        el.attrib.update({k: _xml(v) for k, v in el.attrib.items()})
        if el.text:
            el.text = _xml(el.text)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# ---------------------------------------------------------------------------------------------------
# Markdown (pull-request comment)


def _md(s: Any) -> str:
    """A table cell or inline text: no pipes or newlines to break the table, no HTML."""
    return (str(s).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\r", " ").replace("\n", " "))


def _code(s: Any) -> str:
    """An inline code span inside a table: backticks and pipes cannot end it early."""
    return "`" + str(s).replace("`", "'").replace("|", "\\|").replace("\r", " ").replace("\n", " ") + "`"


def _num(x: Any, fmt: str) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    return format(x, fmt)


def summary(report: dict) -> dict:
    """Final rho, worst beta/beta_c (and its block) and the through-the-blocks gradient ratio of a report."""
    layers = report.get("layers") or []
    final_rho = layers[-1].get("rho") if layers else None
    worst, worst_block = None, None
    for row in layers[1:]:
        b, bc = row.get("beta"), row.get("beta_c")
        if isinstance(b, (int, float)) and isinstance(bc, (int, float)) and bc > 0:
            if worst is None or b / bc > worst:
                worst, worst_block = b / bc, row.get("index")
    grad = report.get("growth", {}).get("gradient", {})
    return {"final_rho": final_rho, "worst_beta_ratio": worst, "worst_beta_block": worst_block,
            "gradient_ratio": grad.get("blocks"), "gradient_law": grad.get("law")}


VERDICT_MARK = {"pass": "✅ pass", "fail": "❌ fail"}
SEVERITY_MARK = {"error": "🔴 error", "warning": "🟡 warning", "info": "🔵 info"}


def checks(entries: Iterable[Entry]) -> dict:
    """`initadvisor.checks/1`: several specs' check reports and their one verdict (`check --format json`)."""
    reports = [report for _, report, _ in _entries(entries)]
    return {"schema": "initadvisor.checks/1", "version": __version__,
            "verdict": "fail" if any(r["verdict"] == "fail" for r in reports) else "pass", "reports": reports}


def to_markdown(entries: Iterable[Entry]) -> str:
    """A pull-request comment: one row per spec, then every finding."""
    items = _entries(entries)
    n_fail = sum(rep.get("verdict") == "fail" for _, rep, _ in items)
    head = f"### initadvisor: {len(items)} spec{'s' if len(items) != 1 else ''} checked, "
    head += f"{n_fail} failing" if n_fail else "all passing"
    out = [head, "", "| spec | verdict | final rho | worst beta/beta_c | gradient ratio (block 1 / top) |",
           "|---|---|---:|---:|---:|"]
    for path, rep, _ in items:
        s = summary(rep)
        worst = _num(s["worst_beta_ratio"], ".3f")
        if s["worst_beta_block"] is not None and worst != "-":
            worst += f" (block {s['worst_beta_block']})"
        grad = _num(s["gradient_ratio"], ".3g")
        if s["gradient_law"] and grad != "-":
            grad += f" ({_md(s['gradient_law'])})"
        verdict = rep.get("verdict", "?")
        out.append(f"| {_code(path)} | {VERDICT_MARK.get(verdict, _md(verdict))} | {_num(s['final_rho'], '.4f')} "
                   f"| {worst} | {grad} |")
    out += ["", "#### Findings", ""]
    any_finding = False
    for path, rep, lines in items:
        for f in rep.get("findings", []):
            any_finding = True
            where = _code(f"{path}:{finding_line(f['code'], lines)}")
            layer = f", layer {f['layer']}" if f.get("layer") is not None else ""
            out.append(f"- {SEVERITY_MARK.get(f.get('severity'), _md(f.get('severity')))} **{_md(_title(f['code']))}** "
                       f"{where}{layer}: {_md(f['message'])} _({_md(f.get('source', ''))})_")
    if not any_finding:
        out.append("No findings.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------
# rule texts


def find_rule(code: str) -> Rule:
    """A rule by code (any case) or name; SpecError (exit 2 in the CLI) when there is none."""
    key = str(code).strip()
    r = RULES.get(key.upper()) or next((r for r in RULES.values() if r.name == key.lower()), None)
    if r is None:
        from initadvisor.errors import UsageError

        raise UsageError(f"unknown rule {key!r} (known: {', '.join(RULES)})", "CODE")
    return r


def _example_yaml(overrides: dict) -> str:
    import yaml

    from initadvisor.rules import example

    text = yaml.safe_dump(example(overrides), sort_keys=False, default_flow_style=None, width=110)
    return "".join(f"    {line}\n" for line in text.splitlines())


def rule_text(code: str) -> str:
    """The `initadvisor explain CODE` text."""
    r = find_rule(code)
    return (f"{r.code} {r.name} ({r.severity}): {r.title}\n\n{r.meaning}\n\n"
            f"fires when: {r.criterion}\nformula:    {r.formula}\nsource:     {r.source}\n"
            f"threshold:  {r.threshold}\nspec keys:  {', '.join(r.keys)}\nfix:        {r.fix}\n\n"
            + (f"failing example (reports {r.code}):\n{_example_yaml(r.fails)}\n"
               f"fixed example (no {r.code}):\n{_example_yaml(r.passes)}" if r.scope == "spec" else
               "found by `initadvisor audit` (or initadvisor.torch.audit) on the weights of a live model; a spec "
               "has no example of it\n"))


RULES_COLUMNS = ("code", "severity", "name", "fires when", "threshold [default]")


def _threshold_cell(r: Rule) -> str:
    return f"{r.threshold_key} [{r.default}]" if r.threshold_key else "fixed"


def rules_table() -> list[tuple[str, str, str, str, str]]:
    """Rows (code, severity, name, fires when, threshold) for `initadvisor rules`, in registry order."""
    return [(r.code, r.severity, r.name, r.criterion, _threshold_cell(r)) for r in RULES.values()]


def rules_markdown() -> str:
    """The README's rules table (tests/test_rules.py checks that the README holds exactly this)."""
    rows = ["| code | severity | meaning | fires when | threshold [default] |", "|---|---|---|---|---|"]
    for r in RULES.values():
        th = f"`{r.threshold_key}` [{r.default}]" if r.threshold_key else "fixed"
        cells = (c.replace("|", "\\|").replace("\n", " ") for c in (r.code, r.severity, r.title, r.criterion, th))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"
