"""The adapter: a validated Spec -> the engine's input (`Stack`: embeddings and per-layer BlockParams).

The one place that reads a spec for the numerical core; everything in initadvisor.core takes the Stack.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from initadvisor.core.model import Stack, Trace, once, propagate, propagate_causal
from initadvisor.core.ops import BlockParams, Embeddings


def latent_logits(spec) -> tuple[float, float]:
    """Multi-head latent attention's logits for unit inputs: (variance, the rotary key's share of it). Per head,
    scale^2 g_Q (nope g_K + rope g_R): the latents are normed (unit second moment), so the up projections' gains
    g_Q = std_Q^2 q_rank and g_K = std_K^2 kv_rank act alone; the rotary key reads h, g_R = down_std^2 d."""
    A = spec.latent
    g_q, g_k, g_r = spec.gain("q"), spec.gain("k"), A.down_std ** 2 * spec.d_model
    nope, rope = A.nope_dim * g_k, A.rope_dim * g_r
    return spec.softmax_scale ** 2 * g_q * (nope + rope), rope / (nope + rope)


def spec_beta(spec) -> float:
    """Giorlandino-Goldt beta of the spec: score std for unit inputs over sqrt(ln T) (THEORY.md 'Units'); under a
    QK-norm the queries and keys have unit per-coordinate variance whatever the Q/K stds."""
    if spec.latent:
        return math.sqrt(latent_logits(spec)[0] / math.log(spec.seq_len))
    sigma_a = spec.softmax_scale * math.sqrt(spec.d_head)
    if spec.qk_norm == "none":
        sigma_a *= spec.init["q"].std * spec.init["k"].std * spec.d_model
    return sigma_a / math.sqrt(math.log(spec.seq_len))


def block_params(spec, moe: bool = False) -> BlockParams:
    """One layer's numbers: gains (std^2 x fan-in) for the moment maps, shapes and stds for the networks;
    `moe`: a mixture-of-experts layer (spec.moe), its MLP numbers one expert's."""
    gain, init = spec.gain, spec.init
    if moe:
        E = spec.moe
        P = block_params(replace(spec, d_ff=E.d_ff))
        return replace(P, experts=E.experts, top_k=E.top_k, router=E.router, route_norm=E.normalize,
                       route_scale=E.scale, route_groups=E.groups, route_top_groups=E.top_groups,
                       shared_experts=E.shared, g_r=E.router_std**2 * spec.d_model,
                       init={**P.init, "router": (E.router_std, 0.0)})
    sq = init["q"].std
    P = BlockParams(
        beta=spec_beta(spec), seq_len=float(spec.seq_len),
        g_v=gain("v"), g_o=gain("o") if spec.out_proj else 1.0,
        g_1=gain("ff_in"), g_1b=init["ff_in"].std ** 2 * spec.d_ff,
        g_2=gain("ff_out"), g_2b=init["ff_out"].std ** 2 * spec.d_model,
        b_v2=init["v"].bias_std ** 2, b_o2=init["o"].bias_std ** 2 if spec.out_proj else 0.0,
        b_12=init["ff_in"].bias_std ** 2, b_22=init["ff_out"].bias_std ** 2,
        q_bias=init["q"].bias_std ** 2 / (sq**2 * spec.d_model), g_q=gain("q"), g_k=gain("k"),
        activation=spec.activation, dropout=spec.dropout, attn_dropout=spec.attention_dropout,
        mlp_dropout=spec.mlp_dropout,
        skip_a=spec.res_attention.skip, block_a=spec.res_attention.block * spec.layers ** -spec.depth_alpha,
        skip_m=spec.res_mlp.skip, block_m=spec.res_mlp.block * spec.layers ** -spec.depth_alpha,
        qk_norm=spec.qk_norm, norm_eps=spec.norm_eps, rope_theta=spec.rope_theta or 0.0,
        rope_fraction=spec.rotary_fraction, alibi=spec.alibi_scale if spec.alibi else 0.0, norm=spec.norm, centered=spec.attention == "centered",
        parallel=spec.parallel_residual,
        causal=spec.causal, norm_type=spec.norm_type, d_model=spec.d_model, heads=spec.heads, head_dim=spec.d_head,
        kv_heads=spec.kv_heads, d_ff=spec.d_ff, softmax_scale=spec.softmax_scale, out_proj=spec.out_proj,
        init={m: (init[m].std, init[m].bias_std) for m in ("q", "k", "v", "o", "ff_in", "ff_out")},
    )
    return _latent_equivalent(spec, P) if spec.latent else P


def _latent_equivalent(spec, P: BlockParams) -> BlockParams:
    """Multi-head latent attention as the multi-head attention with the same moments behind a unit norm (the spec
    requires one): the latents' norms make the value path a map of gain g_V = std_V^2 kv_rank and the logits those
    of latent_logits. Equivalent heads of D coordinates, rope_dim of them turned, D = rope_dim / (the rotary key's
    share of the logits' variance) (rope_coherence weighs the turned coordinates by their count), queries and keys
    of gain sqrt(V) each at scale 1 / sqrt(D), the output projection's std rescaled so that its gain std_O^2 H v_dim
    stays; the numpy and PyTorch networks are this equivalent too."""
    A, d, H = spec.latent, spec.d_model, spec.heads
    V, share = latent_logits(spec)
    D = max(A.rope_dim, round(A.rope_dim / share)) if A.rope_dim and share > 0 else A.nope_dim
    s_qk, s_v = math.sqrt(math.sqrt(V) / d), math.sqrt(spec.gain("v") / d)
    s_o = spec.init["o"].std * math.sqrt(A.v_dim / D)
    init = {**P.init, "q": (s_qk, 0.0), "k": (s_qk, 0.0), "v": (s_v, 0.0), "o": (s_o, P.init["o"][1])}
    return replace(P, head_dim=D, kv_heads=H, softmax_scale=D ** -0.5, g_q=math.sqrt(V), g_k=math.sqrt(V),
                   b_v2=0.0, q_bias=0.0, rope_fraction=A.rope_dim / D if A.rope_dim else 1.0,
                   rope_theta=P.rope_theta if A.rope_dim else 0.0, init=init)


def embeddings(spec) -> Embeddings:
    return Embeddings(tables=tuple(spec.embeddings), vocab=spec.vocab, d_model=spec.d_model, seq_len=spec.seq_len,
                      std=spec.init["embedding"].std, input_correlation=spec.input_correlation,
                      norm=spec.norm_type if spec.embedding_norm else None,
                      dropout=spec.dropout if spec.embedding_dropout is None else spec.embedding_dropout,
                      norm_eps=spec.norm_eps, scale=spec.embedding_scale, width=spec.embedding_width or 0)


def from_spec(spec, per_layer: dict[str, np.ndarray] | None = None, **fields) -> Stack:
    """The spec's stack; `fields` replace BlockParams fields at every layer (arrays allowed), `per_layer`
    gives one value per layer (a recipe's per-layer variances or skips)."""
    P = block_params(spec)
    base = (P,) * spec.layers
    if spec.moe is not None:
        M = block_params(spec, moe=True)
        base = tuple(P if i + 1 in spec.moe.dense_blocks else M for i in range(spec.layers))
    if spec.layernorm_scaling:  # block l's branch-input norms times 1 / sqrt(l)
        base = tuple(replace(B, norm_gain=(i + 1) ** -0.5) for i, B in enumerate(base))
    if spec.sliding_window:  # local attention in window_blocks (all when None)
        chosen = None if spec.window_blocks is None else set(spec.window_blocks)
        local: dict[int, BlockParams] = {}  # repeated layers share one, built for the window blocks alone

        def windowed(B: BlockParams) -> BlockParams:
            if id(B) not in local:
                local[id(B)] = replace(B, window=spec.sliding_window)
            return local[id(B)]

        base = tuple(windowed(B) if chosen is None or i + 1 in chosen else B for i, B in enumerate(base))
    if spec.input_correlation is None and "token" in spec.embeddings and spec.causal:  # every block sees the tokens
        share = (1.0 - embeddings(spec).dropout) / len(spec.embeddings)  # block 1: the token table's share of q
        later = once(base[1:], lambda B: replace(B, repeat_vocab=spec.vocab))
        base = (replace(base[0], repeat_vocab=spec.vocab, repeat_rho=share), *later)
    if per_layer:
        layers = tuple(replace(base[i], **fields, **{k: float(v[i]) for k, v in per_layer.items()})
                       for i in range(spec.layers))
        return Stack(embeddings(spec), layers)
    return Stack(embeddings(spec), base).replace(**fields)


def input_correlation(spec) -> float:
    """rho_0 of the summed embedding tables (THEORY.md 'Inputs'), or the spec's own value."""
    return embeddings(spec).rho0


def input_moments(spec) -> tuple[float, float]:
    """(q, p) of the stream entering block 1: summed tables, optional norm, dropout."""
    return embeddings(spec).moments()


def run_spec(spec, **fields) -> Trace:
    """Propagate a spec; keyword fields replace BlockParams fields (arrays allowed)."""
    return propagate(from_spec(spec, **fields))


def run_causal(spec, keep_overlap: bool = False, **fields):
    """Position-resolved forward prediction of a spec (causal rows on position groups; bidirectional and windowed
    rows at full resolution, T x T). Keyword fields replace BlockParams fields (scalars only)."""
    return propagate_causal(from_spec(spec, **fields), keep_overlap=keep_overlap)
