"""benchmarks/batched_grid.py, the seed-batched PyTorch transcription of paper 001's encoder (issue 13's independent
Monte-Carlo), measures the same network as `initadvisor.simulate`: per layer rho, the IPR and the normalised gradient
agree within 5 standard errors of their difference at 600 seeds each."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from batched_grid import measure, report  # noqa: E402
from phase_fidelity import parse_cells, spec_for  # noqa: E402


@pytest.mark.parametrize("norm,ratio,causal,strong", [("post", 2.5, True, False), ("pre", 1.5, False, False),
                                                      ("post", 1.0, True, True), ("pre", 1.0, False, True)])
def test_batched_encoder_is_the_simulated_network(norm, ratio, causal, strong):
    """d 48, T 16, 4 blocks, 600 seeds each side (about 2 s a case); `strong`: V and MLP gains 1 and MLP biases of std
    0.5, where the MLP's part shows. Planted in the transcription, each fails: the causal mask dropped (post-LN IPR
    25 se), scores over d for sqrt(d) (IPR 176-212 se), the input's common part sqrt(0.3) for sqrt(0.03) (rho 95-100
    se), the MLP's biases left out (strong: rho 47-50 se). Below this test's resolution: LayerNorm without its mean
    subtraction and W2's std 10% high (at most 2.2 and 4.3 se)."""
    from initadvisor.simulate import simulate
    from initadvisor.spec import build_spec

    raw = spec_for(norm, ratio, 16, causal, 4, 48)
    if strong:
        raw["init"].update(v={"gain": 1.0}, ff_in={"gain": 1.0, "bias_std": 0.5}, ff_out={"gain": 1.0, "bias_std": 0.5})
    spec = build_spec(raw)
    got = report(spec, measure(spec, 600))["layers"]
    ref = simulate(spec, seeds=600, batch=1, rng_seed=3, weight_grads=False)
    want = {"rho": (ref.rho, ref.rho_se), "ipr": (ref.y2, ref.y2_se), "grad_q": (ref.grad_q_norm, ref.grad_q_norm_se)}
    worst = {}
    for row in got:
        i = row["index"]
        for key, (m, se) in want.items():
            if key not in row:
                continue
            j = i - 1 if key == "ipr" else i
            if se[j] == 0 and row[key]["se"] == 0:  # the normalised gradient at the top is 1 on both sides
                continue
            z = (row[key]["measured"] - m[j]) / np.hypot(row[key]["se"], se[j])
            worst[key] = max(worst.get(key, 0.0), abs(z))
    assert set(worst) == {"rho", "ipr", "grad_q"}
    assert max(worst.values()) < 5, worst


def test_cells_grammar():
    """The benchmarks' --cells: the whole grid by default (48 cells), a listed cell as written, and a malformed one a
    ValueError that names it (the scripts print it on one line and exit 2)."""
    assert len(parse_cells("")) == 48 and len(set(parse_cells(""))) == 48
    assert parse_cells("post:2.5:512:bi,pre:0.5:64:causal") == [("post", 2.5, 512, False), ("pre", 0.5, 64, True)]
    for bad in ("post:2.5", "mid:1:64:bi", "post:x:64:bi", "post:1:1:bi", "post:1:64:both", "post:1:8192:bi"):
        with pytest.raises(ValueError, match=bad):
            parse_cells(bad)
