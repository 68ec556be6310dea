"""The shipped JSON Schemas: each is a valid schema; spec.json is the validator's own table; every command's
JSON output validates against its schema, and a broken document does not (the schemas can fail)."""

import copy
import json

import jsonschema
import pytest
import yaml

from conftest import ROOT
from initadvisor import api, schemas
from initadvisor.spec import build_spec, load_spec

SPECS = sorted((ROOT / "model_specs").glob("*.yaml"))
CORPUS = sorted((ROOT / "tests" / "fuzz" / "ok").glob("*.yaml"))
HF = sorted((ROOT / "tests" / "data" / "hf").glob("*/config.json"))
SHIPPED = [n for n in schemas.NAMES if (ROOT / "src" / "initadvisor" / "schemas" / f"{n}.json").is_file()]


@pytest.mark.parametrize("name", SHIPPED)
def test_schema_is_valid_and_in_the_package(name):
    s = schemas.load(name)
    jsonschema.Draft202012Validator.check_schema(s)
    assert s["$id"] == schemas.BASE + f"{name}.json"


def test_spec_schema_is_generated_from_the_validator():
    assert schemas.load("spec") == json.loads(json.dumps(schemas.spec_schema())), \
        "regenerate: python -c \"import json; from initadvisor.schemas import spec_schema; " \
        "print(json.dumps(spec_schema(), indent=1))\" > src/initadvisor/schemas/spec.json"


@pytest.mark.parametrize("path", SPECS + CORPUS, ids=lambda p: p.stem)
def test_spec_files_and_their_normal_form_validate(path):
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError:  # a tag plain YAML refuses (the spec reader composes nodes itself)
        raw = None
    if raw is not None:
        schemas.validate(raw, "spec")
    schemas.validate(load_spec(path).to_dict(), "spec")


@pytest.mark.parametrize("patch", [
    {"model": {"layers": 0}}, {"model": {"norm": "middle"}}, {"model": {"bogus": 1}}, {"dropout": 1.0},
    {"init": {"q": {"std": -0.1}}}, {"sequence": {"embeddings": ["token", "token"]}}, {"select": ["XX1"]},
    {"sequence": {"input_correlation": "sometimes"}}, {"model": {"heads": None}},
], ids=str)
def test_invalid_specs_fail_both_validators(patch):
    """What the schema refuses, build_spec refuses too (the schema is no looser than the file format)."""
    spec = yaml.safe_load((ROOT / "model_specs" / "bert-base.yaml").read_text())
    for k, v in patch.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    with pytest.raises(jsonschema.ValidationError):
        schemas.validate(spec, "spec")
    with pytest.raises(api.SpecError):
        build_spec(spec)


@pytest.mark.parametrize("path", SPECS + HF, ids=lambda p: p.parent.name if p.name == "config.json" else p.stem)
def test_check_and_recommend_outputs_validate(path):
    schemas.validate(api.check(path).to_dict())
    schemas.validate(api.recommend(path).to_dict())


def test_checks_diagram_verify_outputs_validate():
    from initadvisor.formats import checks

    reports = [(str(p), api.check(p).data, None) for p in SPECS[:3]]
    schemas.validate(checks(reports))
    schemas.validate(api.diagram(SPECS[0], grid=4).to_dict())
    schemas.validate(api.diagram(SPECS[0], x="alpha_sa", y="depth", grid=3).to_dict())
    small = {"model": {"layers": 2, "d_model": 16, "heads": 2, "causal": True}, "sequence": {"length": 8, "vocab": 50}}
    schemas.validate(api.verify(small, seeds=2).to_dict())
    schemas.validate(api.sweep(SPECS[0], width=[64, 128]).to_dict())
    schemas.validate(api.sweep(small, depth=[1, 3]).to_dict())
    tiny = {**small, "attention_dropout": 3.75e-202}  # a valid input below the reports' 1e-200: echoed as it is
    for report in (api.verify(tiny, seeds=2), api.recommend(tiny), api.sweep(tiny, depth=[1, 2])):
        schemas.validate(report.to_dict())
        assert report.data["spec"]["attention_dropout"] == 3.75e-202
    denormal = api.verify(small, seeds=1, rtol=5e-324, tol=5e-324)  # the user's own tolerances, echoed as given
    schemas.validate(denormal.to_dict())
    assert (denormal.data["rtol"], denormal.data["tol"]) == (5e-324, 5e-324)


@pytest.mark.parametrize("breakage", [
    lambda d: d.pop("verdict"), lambda d: d.update(verdict="maybe"), lambda d: d["layers"][1].update(rho="0.5"),
    lambda d: d["findings"].append({"code": "IA1", "severity": "error", "message": "x", "layer": 1, "source": ""}),
    lambda d: d.update(extra=1), lambda d: d["spec"]["model"].update(layers=-3),
], ids=["missing", "enum", "type", "code", "extra-key", "nested-spec"])
def test_a_broken_report_fails_its_schema(breakage):
    doc = api.check(SPECS[0]).to_dict()
    schemas.validate(copy.deepcopy(doc))
    breakage(doc)
    with pytest.raises(jsonschema.ValidationError):
        schemas.validate(doc)


def test_audit_output_validates():
    from initadvisor.audit import audit_config

    schemas.validate(audit_config(ROOT / "tests" / "data" / "hf" / "llama" / "config.json").to_dict())
