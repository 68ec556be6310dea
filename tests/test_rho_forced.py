"""benchmarks/rho_forced.py moves the engine onto a given rho path and nowhere else: on its own path nothing changes,
on another one every layer's rho is that path's, in the position-resolved engine and in the pair engine, and the
operations are the engine's own again afterwards."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from phase_fidelity import spec_for  # noqa: E402
from rho_forced import force, forced_engine  # noqa: E402

from initadvisor.core import ops  # noqa: E402
from initadvisor.spec import build_spec  # noqa: E402


@pytest.mark.parametrize("causal", [True, False])
def test_forcing_puts_rho_on_the_path(causal):
    spec = build_spec(spec_for("post", 1.5, 16, causal, 6, 64))
    before = ops.Residual.moments, ops.Residual.causal
    run, delta = forced_engine(spec)
    rho0, g0, y0 = run()
    rho, g, y = force(run, delta, rho0)
    assert np.abs(delta).max() < 1e-12 and np.allclose(g, g0, rtol=1e-12) and np.allclose(y, y0, rtol=1e-12)
    target = rho0 + 0.02 * np.arange(len(rho0)) / len(rho0) * (1.0 - rho0)  # a higher path, 0 at the input
    rho, g, y = force(run, delta, target)
    assert np.abs(rho - target).max() < 1e-4
    assert np.all(np.abs(delta) > 1e-4)
    assert not np.allclose(g, g0, rtol=1e-3)  # the gradient reads the path
    assert (ops.Residual.moments, ops.Residual.causal) == before


def _moments(path, key, seeds, layers, gq=1.0):
    rng = np.random.default_rng(0)
    q = 1.0 + 0.01 * rng.standard_normal((seeds, layers + 1))
    np.savez(path, **{f"{key}/q": q, f"{key}/p": 0.3 * q, f"{key}/y2": np.full((seeds, layers), 0.2),
                      f"{key}/gq": np.full((seeds, layers + 1), gq), f"{key}/gp": np.zeros((seeds, layers + 1))})


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import rho_forced

    f = tmp_path / "m.npz"
    _moments(f, "post:1.5:16:causal", 4, 3)
    for argv in (["post:1.5:16:bi", "--load", str(f)],  # no such cell in the file
                 ["post:1.5:16:causal", "--layers", "5", "--load", str(f)],  # other layers
                 ["post:1.5:16:causal", "--load", str(tmp_path / "none.npz")],
                 ["post:1.5:16:causal", "--d", "1", "--load", str(f)],
                 ["post:1.5:16:causal", "--passes", "-1", "--load", str(f)],
                 ["post:1.5:16:causal", "--chain-walk", "1", "--load", str(f)],
                 ["pre:1.5:16:causal", "--chain-walk", "8", "--load", str(f)],  # no walk in pre-LN
                 ["post:1.5:16:bi", "--chain-walk", "8", "--load", str(f)]):
        monkeypatch.setattr(sys, "argv", ["rho_forced.py", *argv])
        assert rho_forced.main() == 2
        err = capsys.readouterr().err
        assert err.startswith("rho_forced: ") and err.count("\n") == 1


def test_an_underflowed_measurement_prints_no_inf(tmp_path, monkeypatch, capsys):
    import rho_forced

    f = tmp_path / "m.npz"
    _moments(f, "post:1.5:16:causal", 4, 3, gq=0.0)
    monkeypatch.setattr(sys, "argv", ["rho_forced.py", "post:1.5:16:causal", "--layers", "3", "--d", "64",
                                      "--load", str(f)])
    assert rho_forced.main() == 0
    out = capsys.readouterr().out
    assert "inf" not in out and "nan" not in out and " - " in out


@pytest.mark.parametrize("fmt, width", [("+7.4f", 7), ("7.4f", 7), ("10.4g", 10), ("5.1%", 5), (".3f", 1)])
def test_a_non_finite_value_prints_a_dash_at_its_width(fmt, width):
    from rho_forced import _fmt

    assert _fmt(np.nan, fmt) == "-".rjust(width)
    assert _fmt(-np.inf, fmt) == "-".rjust(width)
    assert _fmt(0.5, fmt) == format(0.5, fmt)


@pytest.mark.parametrize("law", [False, True])
def test_chain_walk_adds_the_finite_t_walk_and_nothing_else(law, monkeypatch):
    """--chain-walk's walk: with no variance to add the gradient is the engine's to 1e-12; with the chain's own
    variance (post-LN causal 2.5 beta_c, T 16, 20 layers, d 64) the walk is wider, so the mean gradient at the input
    rises (the gains fall with rho: measured +2.2%), and with the field law, whose rho is the walk's mean, rho moves by
    the maps' curvature over the wider walk (measured 0.0008 at most); walk.causal_factor is the engine's again afterwards."""
    from rho_forced import chain_variance, chain_walk

    from initadvisor.core import walk

    monkeypatch.setattr(ops, "FIELD_LAW", law)
    raw = spec_for("post", 2.5, 16, True, 20, 64)
    run, _ = forced_engine(build_spec(raw))
    rho0, g0, _ = run()
    before = walk.causal_factor
    with chain_walk(np.zeros(21)):
        rho, g, _ = run()
        assert np.allclose(g, g0, rtol=1e-12) and np.allclose(rho, rho0, rtol=0.0, atol=1e-12)
    var = chain_variance(raw, 64)
    assert var.shape == (21,) and var[0] < 1e-20 and np.all(var[1:] > 0)
    with chain_walk(var):
        rho, g, _ = run()
    assert g[0] > g0[0] * 1.01 and np.allclose(g[-1], g0[-1])
    if law:
        assert np.abs(rho - rho0).max() > 1e-4
    assert walk.causal_factor is before


def test_field_law_and_chain_walk_run_from_the_command_line(tmp_path, monkeypatch, capsys):
    """--field-law --chain-walk on a small post-LN causal cell: exit 0, the finite T's column printed, and the field
    law's switch as it was before."""
    import rho_forced

    f = tmp_path / "m.npz"
    _moments(f, "post:2.5:16:causal", 4, 3)
    monkeypatch.setattr(sys, "argv", ["rho_forced.py", "post:2.5:16:causal", "--layers", "3", "--d", "64", "--passes",
                                      "2", "--field-law", "--chain-walk", "8", "--load", str(f)])
    before = ops.FIELD_LAW
    assert rho_forced.main() == 0
    assert ops.FIELD_LAW == before
    out = capsys.readouterr().out
    assert "field law" in out and "+T walk" in out and "with the finite T's walk" in out
