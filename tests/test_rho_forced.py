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
