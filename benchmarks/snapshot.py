"""Snapshot every number initadvisor prints, to show that a refactoring changed none of them.

    python benchmarks/snapshot.py dump before.json          # on the old code
    python benchmarks/snapshot.py dump after.json           # on the new code
    python benchmarks/snapshot.py compare before.json after.json [--rtol 1e-12]

Covers the shipped specs, the fuzz corpus's valid specs, the HuggingFace test configs and a grid of small
variants (every norm placement, the parallel block, causal, centered, each activation, dropout, GQA, biases,
residual scales): the JSON of `check`, `recommend`, `diagram` (a small grid), the causal engine's arrays,
and `verify`'s measurements with fixed seeds (numpy and, when installed, torch).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASE = {"model": {"layers": 3, "d_model": 32, "heads": 4, "d_ff": 64}, "sequence": {"length": 24, "vocab": 97}}


def variants() -> list[tuple[str, dict]]:
    """Small specs spanning the block recipes and the operations (each small enough for `verify`)."""
    out = []
    for norm, causal, act in itertools.product(("post", "pre", "none"), (False, True),
                                               ("relu", "gelu", "swiglu", "geglu", "tanh", "silu", "linear")):
        out.append((f"{norm}-{causal}-{act}", {**BASE, "model": {**BASE["model"], "norm": norm, "causal": causal,
                                                                 "activation": act}}))
    extra = {
        "parallel": {"model": {"parallel_residual": True, "norm": "pre"}},
        "parallel-causal": {"model": {"parallel_residual": True, "norm": "pre", "causal": True, "kv_heads": 2}},
        "centered": {"model": {"attention": "centered"}},
        "centered-causal": {"model": {"attention": "centered", "causal": True}},
        "dropout": {"dropout": 0.1, "attention_dropout": 0.2},
        "dropout-causal": {"dropout": 0.1, "attention_dropout": 0.2, "model": {"causal": True}},
        "gqa-rms": {"model": {"kv_heads": 1, "norm_type": "rmsnorm", "norm": "pre", "causal": True}},
        "biases": {"init": {"std": 0.05, "q": {"bias_std": 0.1}, "k": {"bias_std": 0.05}, "v": {"bias_std": 0.02},
                            "o": {"bias_std": 0.03}, "ff_in": {"bias_std": 0.04}, "ff_out": {"bias_std": 0.05}}},
        "biases-causal": {"model": {"causal": True}, "init": {"q": {"bias_std": 0.2}, "v": {"bias_std": 0.1}}},
        "residual": {"residual": {"attention": {"skip": 0.7, "block": 1.3}, "mlp": {"skip": 1.2, "block": 0.4}}},
        "residual-causal": {"model": {"causal": True, "norm": "pre"},
                            "residual": {"attention": {"skip": 0.5, "block": 2.0}}},
        "no-out-proj": {"model": {"out_proj": False}},
        "embedding-norm": {"model": {"embedding_norm": True}, "sequence": {"embeddings": ["token", "position"]}},
        "corr": {"sequence": {"input_correlation": 0.3}},
        "hot": {"init": {"qk_beta": 3.0}},
        "hot-causal": {"init": {"qk_beta": 2.0}, "model": {"causal": True}},
        "scale": {"model": {"softmax_scale": 0.5}},
    }
    for name, patch in extra.items():
        spec = json.loads(json.dumps(BASE))
        for k, v in patch.items():
            spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
        out.append((name, spec))
    return out


def _run(args: list[str]):
    """One command in-process: its JSON, or the exit code and the end of its output."""
    import contextlib
    import io

    from initadvisor.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as e:
            code = e.code
    try:
        return json.loads(out.getvalue())
    except ValueError:
        return {"exit": code, "stdout": (out.getvalue() + err.getvalue())[-300:]}


def dump(path: str) -> None:
    import numpy as np
    import yaml

    from initadvisor.spec import load_spec
    from initadvisor.stack import run_causal

    files = sorted((ROOT / "model_specs").glob("*.yaml")) + sorted((ROOT / "tests/fuzz/ok").glob("*.yaml"))
    files += sorted((ROOT / "tests/data/hf").glob("*/config.json"))
    tmp = Path(tempfile.gettempdir()) / "initadvisor-snapshot"
    tmp.mkdir(exist_ok=True)
    small = []
    for name, spec in variants():
        f = tmp / f"{name}.yaml"
        f.write_text(yaml.safe_dump({"name": name, **spec}))
        files.append(f)
        small.append(f)
    out: dict = {}
    for f in files:
        key = f.stem if f.suffix == ".yaml" else f.parent.name
        rec = {"check": _run(["check", str(f), "--format", "json"]),
               "recommend": _run(["recommend", str(f), "--format", "json"])}
        if f in small or f.parent.name == "model_specs":
            rec["diagram"] = _run(["diagram", str(f), "--grid", "6", "--format", "json"])
            rec["diagram_alpha"] = _run(["diagram", str(f), "--x", "alpha_sa", "--y", "depth",
                                                      "--grid", "5", "--format", "json"])
        if f in small:
            rec["verify"] = _run(["verify", str(f), "--seeds", "2", "--format", "json"])
            try:
                import torch  # noqa: F401

                rec["verify_torch"] = _run(["verify", str(f), "--seeds", "2", "--backend", "torch",
                                                         "--format", "json"])
            except ImportError:
                pass
            spec = load_spec(f)
            c = run_causal(spec)
            rec["causal"] = {k: np.asarray(getattr(c, k)).tolist() for k in
                             ("q", "rho_mean", "rho_thirds", "q_thirds", "y2", "beta_c",
                              "attention_output_variance_layer1")}
        out[key] = rec
        print(key, file=sys.stderr)
    Path(path).write_text(json.dumps(out, default=str))


def _diff(a, b, where: str, rtol: float, bad: list) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() | b.keys():
            if k in ("seconds_per_seed", "elapsed_s", "seconds"):
                continue
            if k not in a or k not in b:
                bad.append(f"{where}.{k}: only in {'before' if k in a else 'after'}")
            else:
                _diff(a[k], b[k], f"{where}.{k}", rtol, bad)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            bad.append(f"{where}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{where}[{i}]", rtol, bad)
    elif isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, int):
        if not (a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= rtol * max(abs(a), abs(b))):
            bad.append(f"{where}: {a!r} != {b!r}")
    elif a != b:
        bad.append(f"{where}: {str(a)[:80]!r} != {str(b)[:80]!r}")


def compare(before: str, after: str, rtol: float = 1e-12) -> int:
    bad: list[str] = []
    _diff(json.loads(Path(before).read_text()), json.loads(Path(after).read_text()), "", rtol, bad)
    for line in bad[:200]:
        print(line)
    print(f"{len(bad)} differences (rtol {rtol:g})")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2])
    else:
        rt = float(sys.argv[sys.argv.index("--rtol") + 1]) if "--rtol" in sys.argv else 1e-12
        sys.exit(compare(sys.argv[2], sys.argv[3], rt))
