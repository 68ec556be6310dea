"""benchmarks/attention_forced.py's teacher forcing feeds the engine its own state: a state expanded to the T x T Gram
and group-averaged back is the same state, so the attention operation on it gives the same output (issue 13)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from attention_forced import group_state  # noqa: E402
from phase_fidelity import spec_for  # noqa: E402


@pytest.mark.parametrize("ratio,T,layers", [(0.5, 64, 6), (2.5, 128, 20)])
def test_group_state_round_trips_the_engines_state(ratio, T, layers):
    """The engine's overlaps after `layers` post-LN causal blocks (position groups past position 32 at T 128) expanded
    and group-averaged: q and the group-pair overlaps within 1e-12, and the next attention operation's output the
    same. Within-group pairs counted as n^2 instead of n (n - 1) move P by 0.08 and 0.17 and fail both."""
    from initadvisor.core import causal as cz
    from initadvisor.core.ops import Attention, leaves
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    net = from_spec(build_spec(spec_for("post", ratio, T, True, layers + 1, 720)))
    q0, p0 = net.embeddings.moments()
    C = cz.propagate_overlaps(net.blocks[:layers], q0, p0, T, keep_overlap=True).overlap
    G = cz._grid(T, cz._SINGLE, cz._RATIO)
    S = group_state(G, C)
    back = S.P[np.ix_(G.gid, G.gid)]
    np.fill_diagonal(back, S.qf)
    assert np.abs(back - C).max() < 1e-12
    op = next(o for o in leaves(net.blocks[layers]) if isinstance(o, Attention))
    O, rows = op.causal(G, S)
    O2, rows2 = op.causal(G, group_state(G, back))
    assert np.abs(O.P - O2.P).max() < 1e-12 and np.abs(O.qf - O2.qf).max() < 1e-12
