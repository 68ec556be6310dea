"""The Python API against the CLI: every command's report is the JSON the command prints, from every kind of
source (a YAML path, a config.json, a spec dict, a HuggingFace config dict, a PretrainedConfig); typed fields
read the same numbers; bad input raises the named exceptions."""

import contextlib
import io
import json
import sys

import pytest
import yaml

import initadvisor
from conftest import ROOT
from initadvisor import api
from initadvisor.cli import main

SPECS = sorted((ROOT / "model_specs").glob("*.yaml"))
HF = ROOT / "tests" / "data" / "hf"


def cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            return e.code, out.getvalue(), err.getvalue()
    raise AssertionError("main() returned without exiting")


@pytest.mark.parametrize("path", SPECS + [HF / "gpt2" / "config.json", HF / "llama" / "config.json"],
                         ids=lambda p: p.parent.name if p.name == "config.json" else p.stem)
def test_check_is_the_cli_json(path):
    code, out, _ = cli("check", path, "--format", "json")
    rep = initadvisor.check(path)
    assert out == rep.to_json() + "\n"
    assert code == (0 if rep.passed else 1)
    data = json.loads(out)
    assert rep.verdict == data["verdict"] and len(rep.layers) == len(data["layers"])
    for layer, row in zip(rep.layers, data["layers"]):
        assert layer.index == row["index"] and layer.rho == row["rho"] and layer.grad_q == row["grad_q"]
    assert [f.code for f in rep.findings] == [f["code"] for f in data["findings"]]
    assert list(rep.notes) == data["notes"]


def test_recommend_diagram_verify_are_the_cli_json():
    spec = ROOT / "model_specs" / "bert-base.yaml"
    rep = initadvisor.recommend(spec, k=3.0)
    assert cli("recommend", spec, "--k", "3", "--format", "json")[1] == rep.to_json() + "\n"
    assert cli("recommend", spec, "--k", "3", "--format", "yaml")[1] == rep.patched_yaml(
        f"# initadvisor recommend: {rep.patched_recipe} recipe applied to {spec}\n")
    assert [r.name for r in rep.recipes] == [r["name"] for r in rep.data["recipes"]]
    assert rep.patched_spec.to_dict() == rep.data["patched_spec"] and rep.beta_c == rep.data["beta_c"]
    d = initadvisor.diagram(spec, x="beta", y="depth", grid=5)
    assert cli("diagram", spec, "--y", "depth", "--grid", "5", "--format", "json")[1] == d.to_json() + "\n"
    assert sum(d.counts.values()) == sum(len(r) for r in d.phase)
    small = {"model": {"layers": 2, "d_model": 16, "heads": 2}, "sequence": {"length": 8, "vocab": 50}}
    v = initadvisor.verify(small, seeds=2)
    assert v.verdict == v.data["verdict"] and set(v.max_error) >= {"rho", "q", "grad_q"}
    v.data["measurement"]["seconds"] = 0.0  # the one number that differs between two runs


def test_every_source_gives_the_same_spec(tmp_path):
    from transformers import AutoConfig

    path = HF / "mistral" / "config.json"
    from_path = initadvisor.load(path)
    raw = json.loads(path.read_text())
    assert initadvisor.load(raw).to_dict() == from_path.to_dict()
    from_object = initadvisor.load(AutoConfig.from_pretrained(path)).to_dict()
    assert from_object.pop("name").endswith("config.json")  # its _name_or_path
    assert from_object == {k: v for k, v in from_path.to_dict().items() if k != "name"}
    assert from_path.notes and initadvisor.load(raw).notes == from_path.notes
    yaml_path = ROOT / "model_specs" / "gpt2-small.yaml"
    as_dict = yaml.safe_load(yaml_path.read_text())
    assert initadvisor.load(as_dict).to_dict() == initadvisor.load(yaml_path).to_dict()
    spec = initadvisor.load(yaml_path, seq_len=64)
    assert spec.seq_len == 64 and initadvisor.load(spec).to_dict() == spec.to_dict()
    assert initadvisor.check(as_dict).to_json() == initadvisor.check(yaml_path).to_json()


def test_named_exceptions(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  layers: 4\n  d_model: 64\n  heads: 5\n")
    with pytest.raises(initadvisor.SpecError) as e:
        initadvisor.check(bad)
    assert "bad.yaml" in str(e.value) and isinstance(e.value, initadvisor.InitAdvisorError)
    with pytest.raises(initadvisor.InvalidSpecError, match="model.layers"):
        initadvisor.load({"model": {"layers": -1, "d_model": 64, "heads": 4}})
    with pytest.raises(initadvisor.UsageError, match="--seq-len"):
        initadvisor.check(ROOT / "model_specs" / "bert-base.yaml", seq_len=1)
    with pytest.raises(initadvisor.UsageError, match="--fail-on"):
        initadvisor.check(ROOT / "model_specs" / "bert-base.yaml", fail_on="sometimes")
    with pytest.raises(initadvisor.UsageError, match="--select"):
        initadvisor.check(ROOT / "model_specs" / "bert-base.yaml", select=["IA999"])
    with pytest.raises(initadvisor.UsageError, match="source"):
        initadvisor.load(42)
    monkeypatch.setitem(sys.modules, "torch", None)  # as if PyTorch were not installed
    with pytest.raises(initadvisor.MissingExtraError, match=r"initadvisor\[torch\]") as e:
        initadvisor.verify(ROOT / "model_specs" / "bert-base.yaml", backend="torch", seeds=1)
    assert isinstance(e.value, ImportError)
    code, out, err = cli("verify", ROOT / "model_specs" / "bert-base.yaml", "--backend", "torch")
    assert code == 2 and err.count("\n") == 1 and "initadvisor[torch]" in err


def test_import_initadvisor_is_cheap():
    """The package imports neither numpy nor the engine until an API name is used (the CLI's start-up)."""
    import subprocess

    code = ("import sys, initadvisor; assert 'numpy' not in sys.modules; initadvisor.check; "
            "assert 'initadvisor.api' in sys.modules; print(sorted(initadvisor.__all__) == dir(initadvisor))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def test_check_of_a_shipped_spec_imports_no_scipy():
    """`check --format json` on every shipped spec, as a command: scipy (about 150 ms, more than the engine's run on
    GPT-2 small) is never imported; a GeLU's quadrature once pulled it in for scipy.special.erf and doubled the
    start-up (benchmarks/startup.py: 1.7x -> 3.5x numpy's import)."""
    import subprocess

    code = ("import runpy, sys; sys.argv = ['initadvisor', 'check', sys.argv[1], '--format', 'json']\n"
            "try:\n    runpy.run_module('initadvisor', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in ('scipy', 'torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    for path in sorted((ROOT / "model_specs").glob("*.yaml")):
        r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
        assert r.returncode == 0, (path.name, r.stderr[-500:])


def readme_python(*sections: str) -> list[str]:
    """The ```python blocks of the README's sections with these headings, in order."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = []
    for heading in sections:
        body = text.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
        blocks += re.findall(r"```python\n(.*?)```", body, re.S)
    return blocks


def test_readme_python_section_runs_as_written(monkeypatch, capsys):
    """The README's Python API and audit examples, executed as a user would paste them (from the repository root),
    and what their comments promise."""
    pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)
    blocks = readme_python("### Init audit: the model you actually built", "### Python API")
    assert len(blocks) == 2
    audit_block, api_block = blocks
    ns: dict = {}
    exec(compile(audit_block, "README.md (audit)", "exec"), ns)  # raise_for_findings: a fresh GPT-2 is clean
    ns = {}
    exec(compile(api_block, "README.md (Python API)", "exec"), ns)
    assert (ns["report"].verdict, ns["report"].passed) == ("pass", True)
    assert ns["report"].to_json() == cli("check", "model_specs/gpt2-small.yaml", "--format", "json")[1].rstrip("\n")
    assert isinstance(ns["rec"], api.Recommendation) and ns["rec"].alpha_c is not None
    assert "/" in capsys.readouterr().out  # the progress callback ran
