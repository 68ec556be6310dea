"""The model: embeddings -> stack of blocks, forward and backward, and the translation from a Spec.

`propagate` runs the stack layer by layer (vectorised over any grid shape the parameters carry) and
returns a `Trace` of per-layer arrays. `from_spec` turns a validated Spec into the engine's numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from initadvisor.core.blocks import block_backward, block_forward
from initadvisor.core.components import BlockParams

EULER_GAMMA = 0.5772156649015329
from initadvisor.core.attention import HUGE  # moments are clamped to [1/HUGE, HUGE] after every block


@dataclass
class Trace:
    """Per-layer predictions. Index 0 of q/p/rho/grad_* is the stream entering block 1."""

    q: np.ndarray  # (L+1, *grid)
    p: np.ndarray
    grad_q: np.ndarray  # normalised to 1 at index L
    grad_p: np.ndarray
    grad_scale: np.ndarray  # raw gradient q at index 0 over index L (end-to-end ratio)
    att_q: np.ndarray  # (L, *grid) moments at each attention input
    att_p: np.ndarray
    beta: np.ndarray  # (L, *grid)
    beta_c: np.ndarray
    y2: np.ndarray
    y3: np.ndarray

    @property
    def rho(self) -> np.ndarray:
        return self.p / self.q


def propagate(blocks: Sequence[BlockParams], q0, p0, backward: bool = True) -> Trace:
    """Run the stack forward (and the gradient backward) from the input moments (q0, p0)."""
    q, p = np.asarray(q0, dtype=float), np.asarray(p0, dtype=float)
    qs, ps, caches = [q], [p], []
    for P in blocks:
        with np.errstate(over="ignore", invalid="ignore"):
            q, p, cache = block_forward(q, p, P)
        q, p = _clamp(q, p, 1.0 / HUGE)
        qs.append(q)
        ps.append(p)
        caches.append(cache)
    shape = np.broadcast_shapes(*(np.shape(x) for x in qs))
    gq, gp = np.ones(shape), np.zeros(shape)
    gqs, gps = [gq], [gp]
    if backward:
        for P, cache in zip(reversed(blocks), reversed(caches)):
            with np.errstate(over="ignore", invalid="ignore"):
                gq, gp = block_backward(gq, gp, cache, P)
            gq, gp = _clamp(gq, gp, 0.0)
            gqs.append(gq)
            gps.append(gp)
    gqs, gps = _stack(gqs[::-1], shape), _stack(gps[::-1], shape)

    def att(key: str) -> np.ndarray:
        return _stack([getattr(c["att"], key) for c in caches], shape)

    return Trace(
        q=_stack(qs, shape), p=_stack(ps, shape), grad_q=gqs, grad_p=gps, grad_scale=gqs[0],
        att_q=att("q_in"), att_p=att("p_in"), beta=_stack([P.beta for P in blocks], shape),
        beta_c=att("beta_c"), y2=att("y2"), y3=att("y3"),
    )


def _clamp(q, p, floor: float):
    """q into [floor, HUGE] (overflow and inf - inf become HUGE), p into [-q, q]; fmin/fmax skip NaN."""
    q = np.fmax(np.fmin(q, HUGE), floor)
    return q, np.fmax(np.fmin(p, q), -q)


def _stack(xs: list, shape: tuple) -> np.ndarray:
    """Stack per-layer values into (n, *shape), broadcasting only when a value's shape differs."""
    if all(np.shape(x) == shape for x in xs):
        return np.array(xs, dtype=float)
    return np.array([np.broadcast_to(x, shape) for x in xs], dtype=float)


# ---------------------------------------------------------------------------------------------
# From a Spec


def zipf_repeat_correlation(vocab: int) -> float:
    """Probability that two positions hold the same word, tokens i.i.d. Zipf: sum_i p_i^2, p_i = c / i.

    004 A.1 (digest 5) writes (L sum p_i^2 - 1)/(L - 1), which takes the counts N_i = p_i L as exact; for
    i.i.d. draws E[sum_i N_i (N_i - 1)] / (L (L - 1)) = sum_i p_i^2 exactly (0.0137 against 0.0099 at V = 32000).
    """
    if vocab < 10_000:
        i = np.arange(1, vocab + 1, dtype=float)
        h1, h2 = float(np.sum(1 / i)), float(np.sum(1 / i**2))
    else:
        h1 = math.log(vocab) + EULER_GAMMA + 1 / (2 * vocab)
        h2 = math.pi**2 / 6 - 1 / vocab
    return h2 / h1**2


def input_correlation(spec) -> float:
    """rho_0 of the summed embedding tables (THEORY.md 'Inputs'), or the spec's own value."""
    if spec.input_correlation is not None:
        return spec.input_correlation
    share = {"token": zipf_repeat_correlation(spec.vocab), "position": 0.0, "segment": 1.0}
    return sum(share[t] for t in spec.embeddings) / len(spec.embeddings)


def input_moments(spec) -> tuple[float, float]:
    """(q, p) of the stream entering block 1: summed tables, optional norm, dropout."""
    rho0 = input_correlation(spec)
    q = len(spec.embeddings) * spec.init["embedding"].std ** 2
    if spec.embedding_norm:
        q = 1.0
    return q / (1 - spec.dropout), rho0 * q


def spec_beta(spec) -> float:
    """Giorlandino-Goldt beta of the spec: score std for unit inputs over sqrt(ln T) (THEORY.md 'Units')."""
    sigma_a = spec.init["q"].std * spec.init["k"].std * spec.d_model * spec.softmax_scale * math.sqrt(spec.d_head)
    return sigma_a / math.sqrt(math.log(spec.seq_len))


def block_params(spec) -> BlockParams:
    gain, init = spec.gain, spec.init
    beta = spec_beta(spec)
    sq = init["q"].std
    return BlockParams(
        beta=beta, seq_len=float(spec.seq_len),
        g_v=gain("v"), g_o=gain("o") if spec.out_proj else 1.0,
        g_1=gain("ff_in"), g_1b=init["ff_in"].std ** 2 * spec.d_ff,
        g_2=gain("ff_out"), g_2b=init["ff_out"].std ** 2 * spec.d_model,
        b_v2=init["v"].bias_std ** 2, b_o2=init["o"].bias_std ** 2 if spec.out_proj else 0.0,
        b_12=init["ff_in"].bias_std ** 2, b_22=init["ff_out"].bias_std ** 2,
        q_bias=init["q"].bias_std ** 2 / (sq**2 * spec.d_model),
        activation=spec.activation, dropout=spec.dropout, attn_dropout=spec.attention_dropout,
        skip_a=spec.res_attention.skip, block_a=spec.res_attention.block,
        skip_m=spec.res_mlp.skip, block_m=spec.res_mlp.block,
        norm=spec.norm, centered=spec.attention == "centered", parallel=spec.parallel_residual,
        causal=spec.causal,
    )


def run_spec(spec, **overrides) -> Trace:
    """Propagate a spec; keyword overrides replace BlockParams fields (arrays allowed)."""
    P = replace(block_params(spec), **overrides) if overrides else block_params(spec)
    q0, p0 = input_moments(spec)
    return propagate([P] * spec.layers, q0, p0)

