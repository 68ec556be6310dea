"""The JSON contracts as JSON Schema files shipped in the package: `spec.json` (a model spec, the YAML layout)
and one file per report (`check.json` for `initadvisor.check/1`, ...). `load(name)` reads one.

`spec.json` is generated from the validator's own table (`initadvisor.spec.SCHEMA`) by `spec_schema()`, and a
test keeps the shipped file equal to it; the report schemas are written by hand, and the tests validate every
command's output against them."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

NAMES = ("spec", "check", "checks", "recommend", "verify", "diagram", "sweep", "audit")
BASE = "https://initadvisor.dev/schemas/"


def load(name: str) -> dict[str, Any]:
    """The shipped schema `name` (one of NAMES)."""
    return json.loads(resources.files(__package__).joinpath(f"{name}.json").read_text("utf-8"))


def _number(lo: float | None = None, hi: float | None = None, hi_open: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "number"}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["exclusiveMaximum" if hi_open else "maximum"] = hi
    return out


def _kind(kind: Any, key: str) -> dict[str, Any]:
    """The JSON Schema of one of spec.SCHEMA's value kinds."""
    from initadvisor.spec import EMBEDDINGS, MAX_INT, THRESHOLD_RANGE

    if isinstance(kind, dict):
        return {"type": "object", "additionalProperties": False,
                "properties": {k: _kind(v, f"{key}.{k}".lstrip(".")) for k, v in kind.items()}}
    if isinstance(kind, tuple):
        return {"enum": list(kind)}
    if kind.endswith("?"):
        return {"anyOf": [_kind(kind[:-1], key), {"type": "null"}]}
    table = {
        "str": lambda: {"type": "string", "maxLength": 200},
        "bool": lambda: {"type": "boolean"},
        "posint": lambda: {"type": "integer", "minimum": 1, "maximum": MAX_INT.get(key, 10**9)},
        "pos": lambda: _number(1e-8, 1e6),
        "nonneg": lambda: _number(0, 1e6),
        "prob": lambda: _number(0, 1),
        "eps": lambda: _number(0, 1),
        "alpha": lambda: _number(0, 4, hi_open=False),
        "base": lambda: _number(1e-8, 1e12, hi_open=False),
        "fraction": lambda: {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "corr": lambda: {"anyOf": [{"const": "auto"}, _number(0, 1)]},
        "threshold": lambda: _number(*THRESHOLD_RANGE, hi_open=False),
        "codes": lambda: {"type": "array", "items": {"type": "string", "pattern": "^[Ii]([Aa][0-9]*)?$"}},
        "embeddings": lambda: {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": list(EMBEDDINGS)}},
        "count": lambda: {"type": "integer", "minimum": 0, "maximum": MAX_INT.get(key, 10**9)},
        "blocks": lambda: {"type": "array", "uniqueItems": True,
                           "items": {"type": "integer", "minimum": 1, "maximum": 100_000}},
    }
    if kind not in table:
        raise ValueError(f"spec.SCHEMA kind {kind!r} of {key} has no JSON Schema")
    return table[kind]()


def spec_schema() -> dict[str, Any]:
    """The model spec's JSON Schema, from the validator's table (what it cannot express, e.g. heads dividing
    d_model, the validator still checks)."""
    from initadvisor.spec import REQUIRED, SCHEMA

    out = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": BASE + "spec.json",
           "title": "initadvisor model spec", **_kind(SCHEMA, "")}
    out["required"] = sorted({r.partition(".")[0] for r in REQUIRED})
    for sec in out["required"]:
        out["properties"][sec]["required"] = [r.partition(".")[2] for r in REQUIRED if r.startswith(sec + ".")]
    return out


def validate(document: Any, name: str | None = None) -> None:
    """Raise jsonschema.ValidationError unless `document` matches schema `name` (default: the one its own
    "schema" field names, e.g. initadvisor.check/1 -> check). Needs the jsonschema package."""
    import jsonschema
    from referencing import Registry, Resource

    if name is None:
        name = str(document.get("schema", "")).removeprefix("initadvisor.").partition("/")[0]
    if name not in NAMES:
        raise ValueError(f"no schema for {name!r} (known: {', '.join(NAMES)})")
    registry = Registry().with_resources((BASE + f"{n}.json", Resource.from_contents(load(n))) for n in NAMES
                                         if resources.files(__package__).joinpath(f"{n}.json").is_file())
    jsonschema.Draft202012Validator(load(name), registry=registry).validate(document)
