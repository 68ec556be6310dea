"""Algorithms 1, 2, 3 of Giorlandino & Goldt (paper 001, B.5.2) are special cases of the engine.

The transcriptions below follow the paper's pseudo-code line by line; the engine runs with T = inf
(the asymptotic REM laws), no dropout, no output projection, sigma_v^2 = value gain.
"""

import math

import numpy as np
import pytest

from initadvisor.core.model import Stack, propagate
from initadvisor.core.ops import BlockParams, Embeddings


def f_relu(rho):
    return (math.sqrt(1 - rho**2) + rho * (math.pi - math.acos(rho))) / math.pi


def mlp(q, p, sw2, sb2):  # Algorithm 1 lines 10-11
    q1, p1 = sw2 * q + sb2, sw2 * p + sb2
    return sw2 / 2 * q1 + sb2, sw2 / 2 * f_relu(p1 / q1) * q1 + sb2


def crit(q, p):  # beta_c; infinite once the tokens have fully collapsed (p = q)
    return math.sqrt(2 / (q * (q - p))) if q > p else math.inf


def algorithm1(beta, q, p, a_sa, a_mlp, sw2, sb2, sv2):
    bc = crit(q, p)
    y2 = max(0.0, 1 - bc / beta)
    q, p = sv2 * (p + (q - p) * y2) + q * a_sa**2, p * (sv2 + a_sa**2)
    p, q = p / q, 1.0
    q2, p2 = mlp(q, p, sw2, sb2)
    q, p = q2 + a_mlp**2 * q, p2 + a_mlp**2 * p
    return 1.0, p / q


def algorithm2(beta, q, p, a_sa, a_mlp, sw2, sb2, sv2):
    pl, ql = p / q, 1.0
    bc = crit(1.0, pl)
    y2 = max(0.0, 1 - bc / beta)
    q = sv2 * (pl + (ql - pl) * y2) + q * a_sa**2
    p = sv2 * pl + a_sa**2 * p
    pl, ql = p / q, 1.0
    q2, p2 = mlp(ql, pl, sw2, sb2)
    return q2 + a_mlp**2 * q, p2 + a_mlp**2 * p


def algorithm3(beta, q, p, a_sa, a_mlp, sw2, sb2, sv2):
    bc = crit(q, p)
    y2 = max(0.0, 1 - bc / beta)
    q = sv2 * ((q - p) * y2) + a_sa**2 * q
    p = a_sa**2 * p
    p, q = p / q, 1.0
    q2, p2 = mlp(q, p, sw2, sb2)
    q, p = q2 + a_mlp**2 * q, p2 + a_mlp**2 * p
    return 1.0, p / q


def _stack(P, layers, q0, p0):
    """`layers` blocks P entered with moments (q0, p0): an unnormed single table with q0 = std^2, rho0 = p0 / q0."""
    emb = Embeddings(tables=("token",), vocab=2, d_model=1, seq_len=2, std=float(q0) ** 0.5,
                     input_correlation=float(p0) / float(q0))
    return Stack(emb, (P,) * layers)


CASES = [("post", False, algorithm1), ("pre", False, algorithm2), ("post", True, algorithm3)]


@pytest.mark.parametrize("norm,centered,algo", CASES, ids=["alg1-post", "alg2-pre", "alg3-centered"])
def test_engine_reproduces_algorithm(norm, centered, algo, rng):
    for _ in range(40):
        beta = float(rng.choice([rng.uniform(0.01, 1.0), rng.uniform(1.5, 6.0)]))  # both phases
        a_sa, a_mlp = (float(x) for x in rng.uniform(0.5, 2.5, size=2))
        sw2, sv2 = (float(x) for x in rng.uniform(0.1, 2.5, size=2))
        sb2 = float(rng.uniform(0, 0.1))
        q0 = 1.0 if norm == "post" else rng.uniform(0.5, 3)
        p0 = rng.uniform(0, 0.9) * q0
        P = BlockParams(beta=beta, seq_len=np.inf, g_v=sv2, g_o=1.0, g_1=sw2, g_1b=sw2, g_2=sw2, g_2b=sw2,
                        b_12=sb2, b_22=sb2, activation="relu", skip_a=a_sa, skip_m=a_mlp, norm=norm,
                        centered=centered)
        layers = 25
        trace = propagate(_stack(P, layers, q0, p0), backward=False)
        q, p = float(q0), float(p0)
        for layer in range(1, layers + 1):
            q, p = algo(beta, q, p, a_sa, a_mlp, sw2, sb2, sv2)
            assert trace.q[layer] == pytest.approx(q, rel=1e-12, abs=1e-12)
            assert trace.p[layer] == pytest.approx(p, rel=1e-12, abs=1e-12)
