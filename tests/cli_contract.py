"""The CLI contract and random inputs over its documented input space, shared by tests/test_properties.py
and benchmarks/fuzz.py.

Contract: every command either exits 0/1 with a report, or exits 2 with exactly one line on stderr; never a
traceback, never NaN/inf or an engine clamp sentinel (>= 1e200) in any output; inputs inside the documented
space are never refused; `import` and `recommend` never write a spec that `check` refuses; output paths
that cannot be written are refused (exit 2).

Generators draw from a `Rand` over a random.Random (the fuzzer) or hypothesis' st.randoms() (the tests).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import traceback
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import yaml

from initadvisor import schemas
from initadvisor.rules import RULES
from initadvisor.spec import ACTIVATIONS, ATTENTIONS, EMBEDDINGS, MATRICES, NORM_TYPES, NORMS, QK_NORMS, ROUTERS, \
    THRESHOLDS

ROOT = Path(__file__).resolve().parents[1]
HF_DIR = ROOT / "tests" / "data" / "hf"
FAMILIES = sorted(p.name for p in HF_DIR.iterdir() if (p / "config.json").is_file())
FORMATS = {"check": ["table", "json", "sarif", "github", "junit", "markdown"], "recommend": ["table", "json", "yaml"],
           "verify": ["table", "json"], "diagram": ["table", "json"], "sweep": ["table", "json"]}
AXES = ["beta", "alpha_sa", "alpha_mlp", "depth", "seq_len"]
NAMES = ["m", "a:b", "<x&y>\"'", "% :: , ;", "模型 🚀", "x" * 200, "- dash", "#hash", "with  spaces", "ünï"]
CODES = [*RULES, "IA", "IA1", "IA2", "IA3", "IA4", "IA9", "ia304", "I"]
BAD_INT = ["-1", "0", "1", "10000001", "99999999999999999999", "abc", "1.5", "nan", "inf", "", "1e3"]
BAD_FLOAT = ["nan", "inf", "-inf", "-1", "1e309", "1e300", "-1e-320", "abc", "", "NaN"]
BAD_CODES = ["IA999", "XX", "IA1,,FOO", "🚀", "IA10 1", "IA1;IA2"]
HF_VALUES = [0, -1, 1, 2, 3, 7, 64, 10**7, 10**8, 2**63, 10**400, 0.5, 1e-9, 1e308, -0.0, "gelu", "", "relu",
             "swish", "quick_gelu", "gelu_new", "bogus", None, True, False, [], {}, [1, 2], {"a": 1},
             float("nan"), float("inf")]
TIMEOUT_S = 60
MEMORY_S = 2 << 30  # address space a CLI call may add (a sound analysis needs megabytes)
NONFINITE = re.compile(r"(?<![\w.])[-+]?(nan|inf|infinity)(?!\w)", re.I)
BIGNUM = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)[eE]\+?(\d{3,})(?!\w)|\d{201,}")  # not in a word
# (a temporary path's run00434-23e547x9 is no number)


# --------------------------------------------------------------------------------------------- random inputs


class Rand:
    """The generators' random source: real() gives an end point 5% of the time each."""

    def __init__(self, rng):
        self.rng = rng

    def choice(self, seq):
        return self.rng.choice(list(seq))

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def coin(self, p: float = 0.5) -> bool:
        return self.rng.random() < p

    def real(self, lo: float, hi: float, log: bool = False) -> float:
        u = self.rng.random()
        if u < 0.05 or u > 0.95:
            return lo if u < 0.05 else hi
        x = math.exp(self.rng.uniform(math.log(lo), math.log(hi))) if log else self.rng.uniform(lo, hi)
        return min(hi, max(lo, x))


def real(r, lo: float, hi: float, typical: tuple[float, float] | None = None) -> float:
    """Log-uniform over [lo, hi] (or, half the time, over `typical`); lo may be 0."""
    if typical and r.coin(0.5):
        lo, hi = typical
    if lo == 0:
        return 0.0 if r.coin(0.2) else r.real(min(1e-8, hi), hi, log=True)
    return r.real(lo, hi, log=True)


def valid_spec(r, max_layers: int = 2000, small: bool = False) -> dict:
    """A spec dict inside the documented ranges (README "Spec reference", spec.SCHEMA); `small`: verify-sized."""
    heads = r.choice([1, 2, 4] if small else [1, 1, 2, 3, 4, 8, 12, 16, 64])
    top = 16 if small else (10**6 // heads if r.coin(0.05) else 256)
    d = heads * max(1, int(r.real(1, top, log=True)))
    model = {"layers": max(1, int(r.real(1, max_layers, log=True))), "d_model": d, "heads": heads}

    def opt(into, key, make, p=0.5):
        if r.coin(p):
            into[key] = make()

    opt(model, "kv_heads", lambda: r.choice([k for k in range(1, heads + 1) if heads % k == 0]))
    opt(model, "d_ff", lambda: max(1, int(r.real(1, 256 if small else 10**7, log=True))))
    opt(model, "norm", lambda: r.choice(NORMS))
    opt(model, "norm_type", lambda: r.choice(NORM_TYPES))
    opt(model, "attention", lambda: r.choice(ATTENTIONS))
    opt(model, "out_proj", lambda: r.coin())
    opt(model, "causal", lambda: r.coin())
    opt(model, "activation", lambda: r.choice(ACTIVATIONS))
    opt(model, "softmax_scale", lambda: None if r.coin(0.2) else real(r, 1e-8, 999999.0, (0.01, 1.0)))
    opt(model, "embedding_norm", lambda: r.choice([None, True, False]))
    if model.get("norm") == "pre":
        opt(model, "parallel_residual", lambda: r.coin())
    opt(model, "final_norm", lambda: r.coin(), 0.3)
    opt(model, "tie_embeddings", lambda: r.coin(), 0.4)
    opt(model, "head_transform", lambda: r.coin(), 0.2)
    opt(model, "logit_softcap", lambda: None if r.coin(0.2) else real(r, 1e-8, 999999.0, (1.0, 50.0)), 0.2)
    opt(model, "norm_eps", lambda: real(r, 0.0, 0.999, (1e-12, 1e-5)), 0.3)
    opt(model, "embedding_scale", lambda: real(r, 1e-8, 999999.0, (1.0, 64.0)), 0.2)
    opt(model, "embedding_width", lambda: max(1, int(r.real(1, 256 if small else 10**6, log=True))), 0.15)
    if model.get("norm") in ("pre", "sandwich"):
        opt(model, "layernorm_scaling", lambda: r.coin(), 0.2)
    opt(model, "rope_theta", lambda: None if r.coin(0.2) else real(r, 1e-8, 1e12, (1e3, 1e7)), 0.3)
    opt(model, "rotary_fraction", lambda: r.choice([0.25, 0.5, 1.0, r.real(1e-3, 1.0)]), 0.2)
    if model.get("attention") != "centered" and r.coin(0.3):
        model["sliding_window"] = max(1, int(r.real(1, 64 if small else 10**5, log=True)))
        n = model["layers"]
        opt(model, "window_blocks", lambda: sorted({r.integer(1, n) for _ in range(r.integer(0, min(n, 4)))}), 0.4)
    if model.get("out_proj", True):  # heads * head_dim != d_model needs the output projection
        opt(model, "head_dim", lambda: max(1, int(r.real(1, 64 if small else 4096, log=True))), 0.2)
    seq: dict = {}
    opt(seq, "length", lambda: max(2, int(r.real(2, 32 if small else 1e7, log=True))))
    opt(seq, "vocab", lambda: max(1, int(r.real(1, 1e9, log=True))))
    opt(seq, "input_correlation", lambda: "auto" if r.coin(0.3) else r.real(0.0, 0.999))
    opt(seq, "embeddings", lambda: [e for e in EMBEDDINGS if r.coin()] or [r.choice(EMBEDDINGS)])
    data: dict = {"model": model}
    opt(data, "version", lambda: 1, 0.3)
    opt(data, "name", lambda: r.choice(NAMES), 0.3)
    if seq:
        data["sequence"] = seq
    opt(data, "dropout", lambda: r.real(0.0, 0.999))
    opt(data, "attention_dropout", lambda: r.real(0.0, 0.999))
    opt(data, "mlp_dropout", lambda: r.real(0.0, 0.999), 0.2)
    init: dict = {}
    opt(init, "std", lambda: real(r, 1e-8, 999999.0, (0.005, 0.2)))
    use_beta = r.coin(0.3)
    for m in MATRICES:
        if (m in ("q", "k") and use_beta) or r.coin(0.6):
            continue
        e: dict = {}
        if r.coin():
            e["std"] = real(r, 1e-8, 999999.0, (0.005, 0.2))
        else:
            e["gain"] = real(r, 1e-8, 999999.0, (0.1, 4.0))
        opt(e, "bias_std", lambda: real(r, 0, 999999.0, (0.0, 0.1)), 0.3)
        init[m] = e
    if use_beta:
        opt(init, "qk_beta", lambda: real(r, 1e-8, 999999.0, (0.01, 3.0)), 0.8)
    else:  # a QK-norm fixes beta by the softmax scale: qk_beta is refused with it
        opt(model, "qk_norm", lambda: r.choice(QK_NORMS), 0.3)
    if model.get("tie_embeddings") is False and r.coin(0.6):  # an untied head's own init
        init["head"] = {"std": real(r, 1e-8, 999999.0, (0.005, 0.2))} if r.coin() else \
            {"gain": real(r, 1e-8, 999999.0, (0.1, 4.0))}
        opt(init["head"], "bias_std", lambda: real(r, 0, 999999.0, (0.0, 0.1)), 0.3)
    if init:
        data["init"] = init
    res: dict = {}
    for branch in ("attention", "mlp"):
        if r.coin(0.4):
            skip, block = real(r, 0, 999999.0, (0.0, 3.0)), real(r, 0, 999999.0, (0.0, 3.0))
            res[branch] = {"skip": skip, "block": block or 1.0}
    opt(res, "depth_alpha", lambda: r.choice([0.5, 1.0, real(r, 0.0, 4.0)]), 0.2)
    if res:
        data["residual"] = res
    if r.coin(0.2):
        moe: dict = {"experts": max(1, int(r.real(1, 8 if small else 4096, log=True)))}
        opt(moe, "top_k", lambda: r.integer(1, moe["experts"]))
        opt(moe, "router", lambda: r.choice(ROUTERS))
        opt(moe, "normalize", lambda: r.coin())
        opt(moe, "scale", lambda: real(r, 1e-8, 999999.0, (0.5, 3.0)))
        opt(moe, "d_ff", lambda: max(1, int(r.real(1, 64 if small else 10**5, log=True))))
        opt(moe, "shared_experts", lambda: r.integer(0, 2 if small else 4096))
        n = model["layers"]
        opt(moe, "dense_blocks", lambda: sorted({r.integer(1, n) for _ in range(r.integer(0, min(n, 4)))}))
        opt(moe, "router_std", lambda: None if r.coin(0.2) else real(r, 1e-8, 999999.0, (0.005, 0.2)))
        groups = [g for g in range(2, moe["experts"] // 2 + 1) if moe["experts"] % g == 0]
        if groups and r.coin(0.3):
            moe["groups"] = r.choice(groups)
            size, k = moe["experts"] // moe["groups"], moe.get("top_k", 1)
            moe["top_groups"] = r.integer(min(moe["groups"], -(-k // size)), moe["groups"])
        data["moe"] = moe
    if r.coin(0.15) and model.get("norm") in ("pre", "sandwich") and not model.get("layernorm_scaling") \
            and model.get("qk_norm", "none") == "none" and "head_dim" not in model:  # where latent attention is valid
        width = 64 if small else 4096
        lat: dict = {k: max(1, int(r.real(1, width, log=True))) for k in ("kv_rank", "nope_dim", "v_dim")}
        lat["rope_dim"] = 2 * r.integer(0, 4 if small else 64) if model.get("rope_theta") else 0
        opt(lat, "q_rank", lambda: None if r.coin(0.3) else max(1, int(r.real(1, width, log=True))))
        opt(lat, "down_std", lambda: None if r.coin(0.2) else real(r, 1e-8, 999999.0, (0.005, 0.2)))
        if model.get("out_proj", True):  # latent attention is modelled with its output projection
            data["latent_attention"] = lat
    if r.coin(0.1) and model.get("causal") and not (model.get("sliding_window") or model.get("rope_theta")
                                                     or "latent_attention" in data
                                                     or model.get("attention") == "centered"):
        model["alibi"] = True
    th = {k: real(r, 1e-12, 1e12) for k in THRESHOLDS if r.coin(0.2)}
    if th:
        data["thresholds"] = th
    opt(data, "select", lambda: [r.choice(CODES) for _ in range(r.integer(0, 2))], 0.1)
    opt(data, "ignore", lambda: [r.choice(CODES) for _ in range(r.integer(0, 2))], 0.2)
    return data


def spec_text(r, data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=r.coin(), default_flow_style=r.coin(0.2), allow_unicode=r.coin())


def hf_config(r, mutate: bool) -> dict:
    """One of the test configs in tests/data/hf, with 1-3 random mutations (delete, retype, add a key)."""
    cfg = json.loads((HF_DIR / r.choice(FAMILIES) / "config.json").read_text())
    for _ in range(r.integer(1, 3) if mutate else 0):
        op = r.choice(["delete", "value", "value", "model_type", "add"])
        key = r.choice(sorted(cfg)) if cfg else "model_type"
        if op == "delete":
            cfg.pop(key, None)
        elif op == "model_type":
            cfg["model_type"] = r.choice([*FAMILIES, "xlnet", "", 5, None])
        else:
            new = r.choice(["hidden_act", "head_dim", "n_inner", "num_key_value_heads", "sliding_window",
                            "use_sliding_window", "is_decoder", "type_vocab_size", "embedding_size",
                            "rotary_pct", "pad_token_id", "max_window_layers", "layer_types", "feed_forward_proj",
                            "d_kv", "initializer_factor", "x"])
            cfg[key if op == "value" else new] = r.choice(HF_VALUES)
    return cfg


def odd_file(r, d: Path) -> tuple[Path, bool]:
    """(path, valid): a file that is not a plain small UTF-8 spec, or a valid spec at an odd file name."""
    base = "model:\n  layers: 2\n  d_model: 8\n  heads: 2\n"
    kind = r.choice(["dir", "dir_config", "empty", "binary", "devnull", "huge_yaml", "huge_json", "latin1",
                     "utf16", "bom", "missing", "proc", "json_array", "yaml_as_json", "json_as_yaml", "nul",
                     "odd_name", "symlink_loop", "dangling"])
    p = d / f"{kind}.yaml"
    if kind == "dir":
        p.mkdir()
    elif kind == "dir_config":
        p.mkdir()
        (p / "config.json").write_text(json.dumps(hf_config(r, True), indent=2))
    elif kind == "devnull":
        p = Path("/dev/null")
    elif kind == "proc":
        p = Path(r.choice(["/proc/self/status", "/proc/self/cmdline", "/proc/self/maps"]))
    elif kind == "missing":
        p = d / "missing.yaml"
    elif kind == "symlink_loop":
        p.symlink_to(p)
    elif kind == "dangling":
        p.symlink_to(d / "nowhere")
    elif kind in ("json_array", "yaml_as_json", "huge_json"):
        p = d / f"{kind}.json"
        p.write_bytes({"json_array": b"[1, 2]", "yaml_as_json": base.encode(),
                       "huge_json": b" " * 10_000_001 + b"{}"}[kind])
    elif kind == "odd_name":
        p = d / r.choice(["a b.yaml", "new\nline.yaml", "%3A::,.yaml", "模型.yaml", "-dash.yaml"])
        p.write_text(base)
    else:
        content = {"empty": b"", "binary": bytes(range(256)), "huge_yaml": b"# pad\n" * 200_000 + base.encode(),
                   "latin1": (base + "name: caf\xe9\n").encode("latin-1"), "utf16": base.encode("utf-16"),
                   "bom": base.encode("utf-8-sig"), "nul": base.encode() + b"\x00\n",
                   "json_as_yaml": (HF_DIR / "bert" / "config.json").read_bytes()}[kind]
        p.write_bytes(content)
    return p, kind == "odd_name"


def pyproject(r) -> tuple[str, bool]:
    """([tool.initadvisor] TOML text, valid)."""
    th = {k: real(r, 1e-12, 1e12) for k in THRESHOLDS if r.coin(0.3)}
    good = (f'fail-on = "{r.choice(["error", "warning", "never"])}"\n'
            f'ignore = {json.dumps([r.choice(CODES) for _ in range(r.integer(0, 2))])}\n'
            "[tool.initadvisor.thresholds]\n" + "".join(f"{k} = {v!r}\n" for k, v in th.items()))
    bad = r.choice([None, 'fail-on = "fatal"\n', "select = [\"IA999\"]\n", "thresholds = 3\n", "bogus = 1\n",
                    "[tool.initadvisor.thresholds]\ngrad_explode = nan\n", "[tool.initadvisor.thresholds]\nx = 1\n",
                    "[tool.initadvisor.thresholds]\ngrad_vanish = 1e-300\n", "fail-on = \n", "ignore = 'IA1'\n"])
    return "[tool.initadvisor]\n" + (good if bad is None else bad), bad is None


# --------------------------------------------------------------------------------------------- options


@dataclass
class Case:
    """One CLI call: argv, and what the contract expects of it."""

    argv: list[str]
    workdir: Path  # a scratch folder of this case (follow-ups write there)
    valid: bool = True  # every input inside the documented space: exit 2 is a bug
    must_refuse: bool = False  # an output path that cannot be written: only exit 2 is right
    files: list[Path] = field(default_factory=list)  # inputs to show in a reproducer
    cwd: Path | None = None  # run here (next to a pyproject.toml)


def bad_paths(d: Path) -> list[str]:
    """Output paths that cannot be written: a directory, no such folder, a file as folder, a full disk. All
    inside d (or impossible), so a tool that writes `PATH.png` instead leaves nothing outside d."""
    (d / "afile").write_text("x")
    (d / "adir").mkdir(exist_ok=True)
    if not (d / "full.png").is_symlink():
        (d / "full.png").symlink_to("/dev/full")
    return [str(d / "adir"), "/proc/initadvisor-fuzz.png", "/nonexistent-initadvisor/x.png",
            str(d / "afile" / "x.png"), str(d / "full.png")]


def codes_text(r) -> str:
    return ",".join(r.choice(CODES) for _ in range(r.integer(1, 3)))


def axis_range(r, axis: str) -> list[str]:
    if axis == "beta":
        lo = r.real(1e-3, 5.0, log=True)
        return [repr(lo), repr(lo * r.real(1.01, 100.0, log=True))]
    if axis in ("alpha_sa", "alpha_mlp"):
        lo = r.real(0.0, 5.0)
        lo = lo if lo >= 1e-12 else 0.0  # range ends are 0 or at least 1e-12 (README, diagram)
        return [repr(lo), repr(lo + r.real(0.01, 10.0, log=True))]
    if axis == "depth":
        lo = r.integer(1, 20)
        return [str(lo), str(lo + r.integer(1, 50))]
    lo = r.integer(2, 10**6)
    return [str(lo), str(min(10**7, lo + r.integer(1, 10**6)))]


def option_table(r, command: str, d: Path) -> dict:
    """option -> (valid value maker, abusive values, probability of using it); [] for a flag."""
    img = lambda: str(d / f"out{r.choice(['.png', '.svg', '.pdf'])}")  # noqa: E731
    corr = lambda: repr(r.real(0.0, 0.999))  # noqa: E731
    table = {
        "check": {"--format": (lambda: r.choice(FORMATS["check"]), ["xml", "", "JSON"], 0.8),
                  "--seq-len": (lambda: str(max(2, int(r.real(2, 1e7, log=True)))), BAD_INT, 0.2),
                  "--input-correlation": (corr, BAD_FLOAT + ["1", "1.5", "-0.1"], 0.2),
                  "--dropout": (corr, BAD_FLOAT + ["1", "-0.1"], 0.2),
                  "--fail-on": (lambda: r.choice(["error", "warning", "never"]), ["fatal", ""], 0.3),
                  "--select": (lambda: codes_text(r), BAD_CODES, 0.1),
                  "--ignore": (lambda: codes_text(r), BAD_CODES, 0.2),
                  "--plot": (img, bad_paths(d) + [str(d / "x.xyz")], 0.03)},
        "recommend": {"--format": (lambda: r.choice(FORMATS["recommend"]), ["sarif", ""], 0.8),
                      "--rho-max": (lambda: repr(r.real(0.01, 0.999)), BAD_FLOAT + ["0", "1", "2"], 0.2),
                      "--k": (lambda: repr(r.real(0.01, 100.0, log=True)), BAD_FLOAT + ["0", "1e-300"], 0.2),
                      "--seq-len": (lambda: str(max(2, int(r.real(2, 1e7, log=True)))), BAD_INT, 0.2),
                      "--alpha-mlp": ([], [], 0.3),
                      "--out": (lambda: str(d / "patched.yaml"), bad_paths(d), 0.2)},
        "verify": {"--format": (lambda: r.choice(FORMATS["verify"]), ["yaml"], 0.8),
                   "--backend": (lambda: "torch" if r.coin(0.1) else "numpy", ["jax", ""], 0.3),
                   "--device": (lambda: "cpu", ["cuda", "bogus", "cpu:7", "meta"], 0.1),
                   "--seeds": (lambda: "1", ["0", "-1", "1001", "10000000000000000000000", "x"], 1.0),
                   "--batch": (lambda: "1", ["0", "-1", "1001", "x"], 1.0),
                   "--seq-len": (lambda: str(r.integer(2, 16)), BAD_INT[:3] + ["x"], 0.5),
                   "--tol": (lambda: repr(r.real(0.0, 1.0)), BAD_FLOAT, 0.2),
                   "--rtol": (lambda: repr(r.real(0.0, 1.0)), BAD_FLOAT, 0.2),
                   "--plot": (img, bad_paths(d), 0.05)},
        "diagram": {"--format": (lambda: r.choice(FORMATS["diagram"]), ["png"], 0.8),
                    "--grid": (lambda: str(r.integer(2, 12)), BAD_INT + ["1025"], 1.0),
                    "--png": (lambda: str(d / "d.png"), bad_paths(d) + [str(d / "x.xyz")], 0.03),
                    "--svg": (lambda: str(d / "d.svg"), bad_paths(d), 0.03)},
        "plot": {"--png": (img, bad_paths(d) + [str(d / "x.xyz")], 1.0)},
        "sweep": {"--format": (lambda: r.choice(FORMATS["sweep"]), ["sarif"], 0.8),
                  "--depth": (lambda: ",".join(str(r.integer(1, 48)) for _ in range(r.integer(1, 4))),
                              ["0", "-1", "x", "1,,x", "", "1.5", "100001", ",".join(["2"] * 40)], 1.0),
                  "--png": (lambda: str(d / "s.png"), bad_paths(d) + [str(d / "x.xyz")], 0.03),
                  "--svg": (lambda: str(d / "s.svg"), bad_paths(d), 0.03)},
        "import": {"--seq-len": (lambda: str(max(2, int(r.real(2, 1e7, log=True)))), BAD_INT, 0.3)},
    }
    return table[command]


def options(r, command: str, d: Path, abuse: bool, skip: tuple[str, ...] = ()) -> tuple[list[str], bool, bool]:
    """(arguments, valid, must_refuse): random valid options (none of `skip`), with one abused when `abuse`."""
    table = {k: v for k, v in option_table(r, command, d).items() if k not in skip}
    abused = r.choice([k for k, v in table.items() if v[1]]) if abuse else None
    args: list[str] = []
    must_refuse = False
    for opt, (make, bad, p) in table.items():
        if opt == abused:
            value = r.choice(bad)
            must_refuse = opt in ("--plot", "--png", "--svg", "--out") and value in bad_paths(d)
            args += [opt, value]
        elif r.coin(p):
            args += [opt] if make == [] else [opt, make()]
    if command == "sweep" and abuse and r.coin(0.3):  # a width: refused unless the head dimension divides it
        args += ["--width", r.choice(["64", "7", "0", "64,128"])]
    if command == "diagram":
        x, y = r.choice(AXES), r.choice(AXES)
        if x == y and not abuse:
            y = AXES[(AXES.index(x) + 1) % len(AXES)]
        args += ["--x", x, "--y", y]
        for opt, axis in (("--x-range", x), ("--y-range", y)):
            if r.coin(0.3):
                args += [opt, *axis_range(r, axis)]
            elif abuse and r.coin(0.3):
                args += [opt, *r.choice([["1", "1"], ["2", "1"], ["nan", "1"], ["0", "inf"], ["-1", "1"],
                                         ["0", "1e300"], ["1", "1000000000000"], ["1", "1.4"], ["x", "1"]])]
    return args, not abuse, must_refuse


# --------------------------------------------------------------------------------------------- running


@dataclass
class Result:
    code: int | None  # None: an uncaught exception or a timeout
    out: str
    err: str
    exc: str | None = None  # the traceback


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _address_space_limit(extra: int) -> None:
    """Limit this process's address space to its present size + extra (-1: lift the limit)."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    size = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    soft = hard if extra < 0 else size + extra if hard == resource.RLIM_INFINITY else min(hard, size + extra)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def invoke(argv: list[str], cwd: Path | None = None, timeout: float = TIMEOUT_S) -> Result:
    """Run `initadvisor ARGV` in this process (initadvisor.cli.main), stdout and stderr captured, with a
    timeout and at most MEMORY_S more address space."""
    from initadvisor.cli import main

    os.environ["INITADVISOR_DEBUG"] = "1"  # a defect re-raised: its traceback, not exit 3 with one line
    out, err = io.StringIO(), io.StringIO()
    saved, here = (sys.argv, sys.stdout, sys.stderr), os.getcwd()
    os.chdir(cwd or here)
    sys.argv, sys.stdout, sys.stderr = ["initadvisor", *argv], out, err
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    _address_space_limit(MEMORY_S)
    code, exc = None, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except _Timeout:
        exc = f"Timeout: over {timeout:g} s"
    except Exception:
        exc = traceback.format_exc()
    finally:
        _address_space_limit(-1)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sys.argv, sys.stdout, sys.stderr = saved
        os.chdir(here)
    return Result(code, out.getvalue(), err.getvalue(), exc)


def invoke_subprocess(argv: list[str], cwd: Path | None = None, timeout: float = TIMEOUT_S) -> Result:
    """Run `python -m initadvisor ARGV` in a child process."""
    try:
        p = subprocess.run([sys.executable, "-m", "initadvisor", *argv], capture_output=True, text=True,
                           timeout=timeout, cwd=cwd, errors="backslashreplace",
                           env={**os.environ, "INITADVISOR_DEBUG": "1"},
                           preexec_fn=lambda: _address_space_limit(MEMORY_S + (1 << 30)))
    except subprocess.TimeoutExpired:
        return Result(None, "", "", f"Timeout: over {timeout:g} s")
    tb = p.stderr if "Traceback (most recent call last)" in p.stderr else None
    return Result(None if tb else p.returncode, p.stdout, p.stderr, tb)


# --------------------------------------------------------------------------------------------- the contract


def _norm(text: str) -> str:
    """A message with paths and numbers blanked: equal for the same kind of failure."""
    text = re.sub(r"(/[^\s:,'\"]*)+", "PATH", text)
    return re.sub(r"[-+]?\d[\d.e+-]*", "N", text)[:140]


def exc_key(tb: str) -> str:
    """'ExcType at file.py:function' of the innermost frame inside initadvisor (else the innermost one)."""
    if tb.startswith("Timeout"):
        return "timeout"
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', tb)
    ours = [f for f in frames if "initadvisor" in f[0] and "cli_contract" not in f[0]] or frames
    last = tb.strip().splitlines()[-1]
    etype = last.split(":")[0]
    return f"{etype} at {Path(ours[-1][0]).name}:{ours[-1][1]}" if ours else etype


def bad_numbers(text: str) -> list[str]:
    """Non-finite tokens and numbers >= 1e200 in an output text."""
    hits = [m.group(0) for m in NONFINITE.finditer(text)]
    hits += [m.group(0) for m in BIGNUM.finditer(text) if m.group(1) is None or int(m.group(1)) >= 200]
    return hits


def _format(argv: list[str]) -> str:
    return argv[argv.index("--format") + 1] if "--format" in argv[:-1] else "table"


def violations(case: Case, res: Result) -> list[tuple[str, str]]:
    """(class key, detail) for each way `res` breaks the contract."""
    cmd, fmt = case.argv[0], _format(case.argv)
    if res.exc:
        return [(f"{cmd}: uncaught {exc_key(res.exc)}", "\n".join(res.exc.strip().splitlines()[-14:]))]
    found = []
    if res.code not in (0, 1, 2):
        found.append((f"{cmd}: exit code {res.code}: {_norm(res.err.strip()[:100])}", res.err[-400:]))
    if res.code == 2:
        lines = res.err.strip().splitlines()
        if len(lines) != 1:
            found.append((f"{cmd}: exit 2 with {'no' if not lines else 'several'} stderr lines: "
                          f"{_norm(lines[0]) if lines else ''}", res.err[-600:]))
        elif case.valid and "measuring this network needs" not in lines[0]:  # memory (or address space) is no spec's fault
            found.append((f"{cmd}: valid input refused: {_norm(lines[0].partition(': error: ')[2])}", lines[0]))
    elif res.code in (0, 1):
        if case.must_refuse:
            found.append((f"{cmd}: unwritable output path accepted (exit {res.code})", " ".join(case.argv)))
        if res.err.strip():
            found.append((f"{cmd}: stderr output on exit {res.code}: {_norm(res.err.strip().splitlines()[-1])}",
                          res.err[-400:]))
        lines = [ln.strip() for ln in res.out.splitlines() if bad_numbers(ln)]
        if lines:
            found.append((f"{cmd} --format {fmt}: non-finite or sentinel number in: {_norm(lines[0])[:70]}",
                          "\n".join(lines[:5])[:1000]))
        found += _parse_problems(cmd, fmt, res.out)
    return found


def _parse_problems(cmd: str, fmt: str, out: str) -> list[tuple[str, str]]:
    """Machine formats must parse: JSON (strict, no NaN, and valid against its shipped schema), SARIF, JUnit XML."""
    try:
        if fmt in ("json", "sarif"):
            doc = json.loads(out, parse_constant=lambda c: float("nan"))
            if fmt == "json":
                schemas.validate(doc)
        elif fmt == "junit":
            ET.fromstring(out)
    except (ValueError, ET.ParseError) as e:
        return [(f"{cmd} --format {fmt}: output does not parse", str(e)[:200])]
    except jsonschema.ValidationError as e:
        return [(f"{cmd} --format {fmt}: output breaks its JSON Schema at {'/'.join(map(str, e.absolute_path))}",
                 e.message[:300])]
    return []


def run_case(case: Case, run=invoke) -> tuple[Result, list[tuple[str, str, list[str]]]]:
    """Run a case and its follow-ups: the result, and (class key, detail, argv of the offending call) for every
    violation."""
    res = run(case.argv, case.cwd)
    found = [(k, v, case.argv) for k, v in violations(case, res)]
    cmd, d = case.argv[0], case.workdir
    if found or res.code not in (0, 1, 2):
        return res, found

    def follow(argv: list[str], key: str, want) -> None:
        r = run(argv, case.cwd)
        sub = Case(argv, d, valid=False)
        found.extend((k, v, argv) for k, v in violations(sub, r))
        if r.code is not None and not want(r.code):
            found.append((key, r.err.strip()[:300] or f"exit {r.code}", argv))

    written = []
    if cmd == "import" and res.code == 0:
        written.append(d / "imported.yaml")
        written[-1].write_text(res.out)
        follow(["check", str(written[-1])], "import wrote a spec that check refuses", lambda c: c != 2)
    if cmd == "recommend" and res.code == 0:
        if "--out" in case.argv and not case.must_refuse:
            written.append(Path(case.argv[case.argv.index("--out") + 1]))
        if _format(case.argv) == "yaml":
            written.append(d / "patched-stdout.yaml")
            written[-1].write_text(res.out)
        for p in written:
            hits = bad_numbers(p.read_text()) if p.is_file() else ["(not written)"]
            if hits:
                found.append(("recommend: bad patched spec file", ", ".join(hits[:5]), case.argv))
            follow(["check", str(p)], "recommend wrote a spec that check refuses", lambda c: c != 2)
    src = case.argv[1] if len(case.argv) > 1 and cmd in ("import", "recommend", "diagram", "plot", "verify",
                                                          "sweep") else None
    refused_input = res.code == 2 and src and src in res.err and "measuring this network needs" not in res.err
    if refused_input and not case.valid and (cmd != "import" or src.endswith(".json") or Path(src).is_dir()):
        # the same input through check, without options: accepted there means refused here without cause
        follow(["check", src], f"{cmd} refuses an input that check accepts", lambda c: c == 2)
    if cmd == "check" and res.code in (0, 1) and len(case.argv) > 1 and case.argv[1].endswith(".json") \
            and "--seq-len" not in case.argv:
        follow(["import", case.argv[1]], "import refuses a config that check accepts", lambda c: c == 0)
    return res, found
