"""`verify` and the PyTorch integration: the numpy and torch measurements agree, `apply` sets the stds."""

import json
import subprocess
import sys

import numpy as np
import pytest

from initadvisor.spec import parse_spec

from conftest import ROOT

SMALL = """
name: small
model: {layers: 4, d_model: 96, heads: 4, norm: %s, activation: gelu, causal: %s}
sequence: {length: 48, vocab: 2000, embeddings: [token, position]}
dropout: 0.1
attention_dropout: 0.1
"""


def run(*args):
    return subprocess.run([sys.executable, "-m", "initadvisor", *map(str, args)], capture_output=True, text=True)


def test_verify_cli_contract(tmp_path):
    f = tmp_path / "small.yaml"
    f.write_text(SMALL % ("post", "false"))
    r = run("verify", f, "--format", "json", "--seeds", "3", "--plot", tmp_path / "v.png")
    rep = json.loads(r.stdout)
    assert rep["schema"] == "initadvisor.verify/1" and rep["measurement"]["backend"] == "numpy"
    assert r.returncode == (0 if rep["verdict"] == "pass" else 1)
    assert rep["verdict"] == "pass", rep["max_error"]  # post-LN GeLU: theory within tolerance
    assert len(rep["layers"]) == 5 and set(rep["layers"][1]) >= {"rho", "q", "grad_q", "ipr"}
    for key in ("theory", "measured", "se", "error", "ok"):
        assert key in rep["layers"][1]["rho"]
    assert (tmp_path / "v.png").stat().st_size > 10_000
    table = run("verify", f, "--seeds", "2")
    assert "rho theory" in table.stdout and table.returncode in (0, 1)


@pytest.mark.parametrize("norm,causal", [("post", "false"), ("pre", "true")])
def test_numpy_and_torch_measurements_agree(norm, causal):
    """The numpy Monte-Carlo and the PyTorch network of the same spec measure the same moments, within
    their combined statistical error (4 standard errors, plus 1% for the float32 arithmetic of torch)."""
    pytest.importorskip("torch")
    from initadvisor.simulate import simulate
    from initadvisor.torch import measure_spec

    spec = parse_spec(SMALL % (norm, causal))
    a = simulate(spec, seeds=6, batch=2, weight_grads=False)
    b = measure_spec(spec, seeds=6, batch=2)
    for key, scale in (("rho", 1.0), ("q", None), ("grad_q_norm", None)):
        x, sx = getattr(a, key), getattr(a, key + "_se")
        y, sy = np.asarray(b[key]), np.asarray(b[key + "_se"])
        slack = 0.01 * (np.abs(y) if scale is None else 1.0)
        assert np.all(np.abs(x - y) <= 4 * np.sqrt(sx**2 + sy**2) + slack), (key, x, y)


def test_torch_backend_on_a_real_config(tmp_path):
    pytest.importorskip("transformers")
    cfg = ROOT / "tests" / "data" / "hf" / "bert" / "config.json"
    r = run("verify", cfg, "--backend", "torch", "--seeds", "2", "--format", "json")
    rep = json.loads(r.stdout)
    assert rep["measurement"]["backend"] == "torch" and rep["layers"][1]["ipr"]["measured"] is not None
    assert rep["max_error"]["rho"] < 0.05


def test_apply_initialises_a_real_model_with_a_recommendation():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from initadvisor.hf import import_config
    from initadvisor.recommend import recommend
    from initadvisor.torch import apply

    cfg = ROOT / "tests" / "data" / "hf" / "gpt2" / "config.json"
    spec, _ = import_config(cfg)
    rep = recommend(spec)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(cfg.parent))
    changes = apply(model, rep)
    roles = {c["role"] for c in changes}
    assert {"qkv", "o", "ff_in", "ff_out", "embedding"} <= roles
    want = rep["patched_spec"]["init"]
    for c in changes:
        if c["role"] in ("o", "ff_in", "ff_out"):
            assert c["std_after"] == pytest.approx(want[c["role"]]["std"], rel=0.08)
