"""Qualitative facts of Giorlandino & Goldt (paper 001) that the engine must reproduce."""

from dataclasses import replace

import numpy as np
import pytest

from initadvisor.stack import run_spec
from initadvisor.spec import load_spec

from conftest import ROOT

FIG1 = ROOT / "model_specs" / "paper001-fig1-bert60.yaml"


def first_collapse(trace, level=0.99):
    hit = np.flatnonzero(trace.rho >= level)
    return int(hit[0]) if hit.size else None


@pytest.mark.parametrize("alpha,collapses", [(1.0, True), (1.5, False), (2.0, False)])
def test_fig1_post_ln_bert60(alpha, collapses):
    """Fig. 1c/d: the 60-layer post-LN BERT collapses at alpha_SA = 1 and not at 1.5 or 2."""
    trace = run_spec(load_spec(FIG1), skip_a=alpha)
    assert (first_collapse(trace) is not None) == collapses
    if not collapses:
        assert trace.rho[-1] < 0.95


def test_pre_ln_collapses_later_than_post_ln():
    """Fig. 4: rank collapse occurs much later for pre-LN than for post-LN."""
    spec = replace(load_spec(FIG1), layers=2000)
    post = first_collapse(run_spec(spec))
    pre = first_collapse(run_spec(replace(spec, norm="pre")))  # LN-ed input, q = 1 as in Fig. 4
    assert post is not None and pre is not None
    assert pre > 10 * post


@pytest.mark.parametrize("norm,layers", [("post", 400), ("pre", 2000)])
def test_centered_attention_avoids_collapse(norm, layers):
    """Fig. 4: removing the values' sequence mean (gain control) stops rank collapse."""
    spec = replace(load_spec(FIG1), layers=layers, norm=norm)
    assert first_collapse(run_spec(spec)) is not None
    centered = run_spec(replace(spec, attention="centered"))
    assert centered.rho.max() < 0.9


def test_entropy_collapse_above_beta_c():
    """Result 1: for beta > beta_c the IPR is 1 - beta_c / beta > 0 as T -> inf (above it at T = 256, the finite-T
    value) and attention keeps tokens apart."""
    spec = load_spec(FIG1)
    low, high = run_spec(spec, beta=0.1), run_spec(spec, beta=3.0)
    asymptotic = run_spec(spec, beta=3.0, seq_len=np.inf)
    assert asymptotic.y2[0] == pytest.approx(1 - asymptotic.beta_c[0] / 3.0)
    assert 1 - high.beta_c[0] / 3.0 < high.y2[0] < 1 - high.beta_c[0] / 3.0 + 0.1
    assert low.y2[0] < 0.01
    assert high.rho[10] < low.rho[10]
