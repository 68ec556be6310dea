"""`sweep`, the analytic coordinate check, against routes that do not share its code.

* the numpy Monte-Carlo of the actual random network (simulate.py's weights and input, each operation's numpy
  `forward`), built at each width or depth from its own spec (d_ff = 3 d_model, head dimension 32 written out,
  not derived by the sweep): every module's RMS and mean |x| within TOL, and the measured mean |x| / RMS (the
  Gaussian claim) within RATIO_TOL of the predicted one;
* closed forms of the width exponents when the stds are held (derived in `test_width_exponents_held_stds`);
* bad values refused in one line; finite JSON; the pictures written.
"""

from __future__ import annotations

import json
import math

from pathlib import Path

import numpy as np
import pytest

from initadvisor.coords import sweep
from initadvisor.report import render_sweep
from initadvisor.core.ops import Attention, Norm, Residual, leaves, numpy_forward
from initadvisor.errors import SpecError
from initadvisor.simulate import init_network, make_input
from initadvisor.spec import build_spec
from initadvisor.stack import from_spec

TOL = 0.05  # relative, RMS and mean |x| (Monte-Carlo noise of the attention output: 1-2 % at these sizes)
RATIO_TOL = 0.015  # mean |x| / RMS: measured against predicted (sqrt(2/pi) = 0.798 for one Gaussian)
D_HEAD = 32


def make(d_model: int, layers: int = 2, model: dict | None = None, **sections):
    """A small spec with head dimension 32 and d_ff = 3 d_model, written out for each width."""
    m = {"layers": layers, "d_model": d_model, "heads": d_model // D_HEAD, "d_ff": 3 * d_model, "norm": "pre",
         "activation": "gelu", **(model or {})}
    data = {"model": m, "sequence": {"length": 32, "vocab": 1000}, "init": {"std": 0.02}, **sections}
    return build_spec(data)


def measure(spec, seeds: int = 16, batch: int = 4) -> dict:
    """Per module (RMS, mean |x|) of the numpy network, keyed like the sweep's modules (attention and mlp:
    the mean over blocks of each block's value; *_last: the last block). Logits: an untied N(0, std_e^2) head
    of 256 rows on the final hidden state after the spec's norm (none for norm: none)."""
    net = from_spec(spec)
    sums: dict = {}

    def add(key, x):
        s = sums.setdefault(key, np.zeros(3))
        s += (np.sum(x * x), np.sum(np.abs(x)), x.size)

    for seed in range(seeds):
        rng = np.random.default_rng([2024, seed])
        weights = init_network(net, rng)
        h = make_input(net, batch, rng)
        add("embedding", h)
        for i, (ops, W) in enumerate(zip(net.blocks, weights)):
            for op in ops:
                if isinstance(op, Residual):
                    u = numpy_forward(op.shared, h, W, rng)[0]
                    for b, branch in op.branches:
                        kind = "attention" if any(isinstance(o, Attention) for o in leaves(branch)) else "mlp"
                        add((kind, i), b * numpy_forward(branch, u, W, rng)[0])
                h = op.forward(h, W, rng)[0]
        add("final_residual", h)
        hidden = h if spec.norm == "none" else Norm(spec.norm_type).forward(h, {}, rng)[0]
        add("logits", hidden @ rng.standard_normal((spec.d_model, 256)) * spec.init["embedding"].std)
    size = {k: (math.sqrt(s[0] / s[2]), s[1] / s[2]) for k, s in sums.items()}
    out = {k: v for k, v in size.items() if isinstance(k, str)}
    for kind in ("attention", "mlp"):
        per = [size[(kind, i)] for i in range(spec.layers)]
        out[kind], out[kind + "_last"] = tuple(np.mean(per, axis=0)), per[-1]
    return out


def predicted(config: dict) -> dict:
    """The sweep's (RMS, mean |x|) per module of one configuration, keyed like `measure`."""
    mods = config["modules"]
    out = {m: (v["rms"], v["mean_abs"]) for m, v in mods.items()}
    out.update({f"{m}_last": (mods[m]["rms_last"], mods[m]["mean_abs_last"]) for m in ("attention", "mlp")})
    return out


def assert_agree(spec, config):
    theory, mc = predicted(config), measure(spec)
    assert theory.keys() == mc.keys()
    for k, (rms, mean_abs) in theory.items():
        m_rms, m_abs = mc[k]
        assert m_rms == pytest.approx(rms, rel=TOL), (k, "rms", m_rms, rms)
        assert m_abs == pytest.approx(mean_abs, rel=TOL), (k, "mean_abs", m_abs, mean_abs)
        assert m_abs / m_rms == pytest.approx(mean_abs / rms, rel=RATIO_TOL), (k, "mean_abs / rms")


CASES = {  # pre-LN GeLU with a scaled attention branch; causal post-LN SwiGLU (positions pooled, Zipf tokens)
    "pre-gelu": dict(residual={"attention": {"block": 0.5}},
                     sequence={"length": 32, "vocab": 1000, "input_correlation": 0.0}),
    "causal-post-swiglu": dict(model={"norm": "post", "causal": True, "activation": "swiglu"},
                               init={"std": 0.05, "embedding": {"std": 1.0}}),
}


@pytest.mark.parametrize("case", CASES)
def test_width_sweep_matches_monte_carlo(case):
    widths = [64, 128, 256]
    res = sweep(make(128, **CASES[case]), width=widths)
    for n, config in zip(widths, res["configs"]):
        assert (config["value"], config["d_model"], config["heads"], config["d_ff"]) == (n, n, n // D_HEAD, 3 * n)
        assert_agree(make(n, **CASES[case]), config)


DEPTH_CASES = {  # causal pre-LN; no norm at all (the logits read the raw stream), correlated input
    "causal-pre": dict(model={"causal": True}, init={"std": 0.05}),
    "no-norm-relu": dict(model={"norm": "none", "activation": "relu"}, init={"std": 0.05, "embedding": {"std": 1.0}},
                         sequence={"length": 32, "vocab": 1000, "input_correlation": 0.2}),
}


@pytest.mark.parametrize("case", DEPTH_CASES)
def test_depth_sweep_matches_monte_carlo(case):
    case, depths = DEPTH_CASES[case], [1, 3, 6]
    res = sweep(make(128, **case), depth=depths)
    for L, config in zip(depths, res["configs"]):
        assert (config["value"], config["layers"]) == (L, L)
        assert_agree(make(128, layers=L, **case), config)


def test_width_exponents_held_stds():
    """Pre-LN, one block, ReLU, every std held at s = 0.02 (embedding included), beta held by qk_beta. The
    branches read a normed input (q = 1, its token correlation independent of width) and each matrix of fan-in
    n multiplies q by its gain s^2 n:
      attention: q = g_O mix(g_V)         = s^4 n^2 M(beta, rho)  -> RMS ~ width^1 (width^1/2 per matrix);
      MLP:       q = g_2 relu-kernel(g_1) = (s^2 3n)(s^2 n)/2     -> RMS ~ width^1, exactly s^2 n sqrt(3/2);
      logits:    q = n s^2 (unit-RMS hidden state)                 -> width^1/2;  embedding: q = 2 s^2 -> width^0.
    The same network with 1/sqrt(fan_in) stds, written per width (gain 1), has width-free branches; written once
    at width 128 its stds are held by the sweep like any others, so it shows the same exponents."""
    s, widths = 0.02, [128, 256, 512, 1024]
    spec = make(128, layers=1, model={"activation": "relu"}, init={"std": s, "qk_beta": 0.5})
    res = sweep(spec, width=widths)
    assert res["exponents"]["embedding"] == pytest.approx(0.0, abs=1e-9)
    assert res["exponents"]["attention"] == pytest.approx(1.0, abs=1e-6)
    assert res["exponents"]["mlp"] == pytest.approx(1.0, abs=1e-6)
    assert res["exponents"]["logits"] == pytest.approx(0.5, abs=1e-6)
    assert 0.5 < res["exponents"]["final_residual"] < 1.0  # a width-free embedding plus width^1 branches
    for n, config in zip(widths, res["configs"]):
        assert config["modules"]["mlp"]["rms"] == pytest.approx(s * s * n * math.sqrt(1.5), rel=1e-9)

    fan_in = dict(model={"activation": "relu"}, init={"qk_beta": 0.5, "embedding": {"std": 1.0},
                                                      **{m: {"gain": 1.0} for m in ("v", "o", "ff_in", "ff_out")}})
    per_width = [sweep(make(n, layers=1, **fan_in), width=[n])["configs"][0]["modules"] for n in widths]
    for m in ("attention", "mlp", "final_residual"):
        assert [c[m]["rms"] for c in per_width] == pytest.approx([per_width[0][m]["rms"]] * len(widths), rel=1e-9)
    assert per_width[0]["mlp"]["rms"] == pytest.approx(math.sqrt(0.5), rel=1e-9)  # g_2 (g_1 / 2) = 1/2
    held = sweep(make(128, layers=1, **fan_in), width=widths)["exponents"]
    assert (held["attention"], held["mlp"]) == pytest.approx((1.0, 1.0), abs=1e-6)


def test_depth_exponents():
    """Pre-LN ReLU: each MLP branch reads a unit-q input, so its output is depth-free (exponent 0, as the
    logits after the final norm); the stream adds O(1) per block (exponent near 1/2). Post-LN: the stream
    after the last norm is unit (0)."""
    pre = sweep(make(128, model={"activation": "relu"}), depth=[2, 8, 32, 128])["exponents"]
    assert (pre["mlp"], pre["logits"], pre["embedding"]) == pytest.approx((0.0, 0.0, 0.0), abs=1e-9)
    assert 0.4 < pre["final_residual"] < 0.6
    post = sweep(make(128, model={"norm": "post"}), depth=[2, 8, 32])["exponents"]
    assert post["final_residual"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("kw, option, words", [
    ({"width": [100]}, "--width", "not a multiple of 32"),
    ({"width": [0, 64]}, "--width", "positive"),
    ({"width": [-64]}, "--width", "positive"),
    ({"width": [64.0]}, "--width", "whole"),
    ({"width": [True]}, "--width", "whole"),
    ({"width": []}, "--width", "at least one"),
    ({"width": list(range(32, 32 * 40, 32))}, "--width", "too many"),
    ({"width": [32 * 10**5]}, "--width", "maximum"),
    ({"depth": [2, 100_001]}, "--depth", "maximum"),
    ({"depth": [0]}, "--depth", "positive"),
    ({}, "--width", "exactly one"),
    ({"width": [64], "depth": [2]}, "--width", "exactly one"),
])
def test_bad_values_refused_in_one_line(kw, option, words):
    with pytest.raises(SpecError) as e:
        sweep(make(128), **kw)
    assert (e.value.file, e.value.line, e.value.key) == ("command line", None, option)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_gqa_width_keeps_head_dimension_and_group():
    spec = make(128, model={"heads": 8, "kv_heads": 2, "d_ff": 341})  # head dimension 16, 4 heads per K/V head
    res = sweep(spec, width=[64, 256])
    assert [(c["heads"], c["kv_heads"], c["d_ff"]) for c in res["configs"]] == [(4, 1, 170), (16, 4, 682)]
    with pytest.raises(SpecError, match="multiple of 64"):
        sweep(spec, width=[96])


def test_json_finite_and_round_trips():
    res = sweep(make(128), width=[256, 64, 128, 64])
    assert res["values"] == [64, 128, 256] and res["schema"] == "initadvisor.sweep/1"
    assert json.loads(json.dumps(res, allow_nan=False)) == res
    assert set(res["exponents"]) == set(res["modules"]) == set(res["configs"][0]["modules"])
    # a stream beyond the engine's range: the clamp is not reported as a size, nor fitted
    wild = sweep(make(128, model={"norm": "none"}, init={"std": 50.0}), depth=[1, 200])
    json.dumps(wild, allow_nan=False)
    assert wild["configs"][1]["modules"]["final_residual"]["rms"] is None
    assert wild["exponents"]["final_residual"] is None


def test_render_and_pictures(tmp_path):
    from rich.console import Console

    res = sweep(make(128), width=[64, 128, 256])
    console = Console(record=True, width=200)
    render_sweep(res, console)
    text = console.export_text()
    assert "exponent" in text and "final_residual rms" in text and "d_ff = 3 x width" in text
    pytest.importorskip("matplotlib")
    from initadvisor.plots import save_sweep

    png, svg = save_sweep(res, tmp_path / "c.png"), save_sweep(sweep(make(128), depth=[1, 2, 4]), tmp_path / "c.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:400]


def test_depth_sweep_of_a_sliding_window_model():
    """A causal model with a sliding window (Mistral's test config: window 64 < T 256) pools its positions on the
    full-resolution state the windowed rows need (the fuzzer's ValueError): each depth's final residual RMS is the
    position-resolved engine's own run of that depth, pooled over the positions."""
    from initadvisor.api import load
    from initadvisor.stack import run_causal

    spec = load(str(Path(__file__).parent / "data" / "hf" / "mistral" / "config.json"))
    res = sweep(spec, depth=[2, 4])
    for row in res["configs"]:
        ct = run_causal(spec.with_overrides(layers=row["value"]))
        assert row["modules"]["final_residual"]["rms"] == pytest.approx(float(np.sqrt(ct.q[-1].mean())), rel=1e-9)


def test_sweep_of_a_long_sliding_window_model(monkeypatch):
    """Beyond the full-resolution engine's reach (diagnose.WINDOW_CELLS, here lowered) a windowed model's sizes are the
    distance-resolved late tokens', as `check` reports them (its per-layer q); the late-token pair's are 0.6% off
    here, 7-35% on the Mistral-shaped stacks of test_distances."""
    import initadvisor.coords as C
    import initadvisor.diagnose as D
    from initadvisor.api import load

    spec = load(str(Path(__file__).parent / "data" / "hf" / "mistral" / "config.json"))
    monkeypatch.setattr(D, "WINDOW_CELLS", 10)
    monkeypatch.setattr(C, "resolvable", D.resolvable)
    for row in sweep(spec, depth=[2, 4])["configs"]:
        q = D.check(spec.with_overrides(layers=row["value"]))["layers"][-1]["q"]
        assert row["modules"]["final_residual"]["rms"] == pytest.approx(math.sqrt(q), rel=1e-5)


def test_sweep_past_the_range_on_the_distance_engine():
    """A windowed long-context stack whose stream leaves the engine's range (the fuzzer's OverflowError inside a
    block of the distance-resolved engine): finite JSON, and the clamped stream reported as no size."""
    from initadvisor.api import load
    from test_hostile import ENGINE_REGRESSIONS

    res = sweep(load(ENGINE_REGRESSIONS["windowed-long-context-skip-overflow"]), depth=[11, 44])
    json.dumps(res, allow_nan=False)
    assert res["configs"][-1]["modules"]["final_residual"]["rms"] is None
