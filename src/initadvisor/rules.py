"""The rule registry: every finding as one self-contained rule object.

A `Rule` holds a finding's stable code, severity, the spec `thresholds` key it compares against (None for a
fixed criterion), the spec keys it points at (SARIF/GitHub locations), the check itself, and its
documentation: meaning, formula, source, fix, and a failing and a fixed example spec. `diagnose.diagnose`
runs the checks in registry order; `rules`, `explain`, the README's rules table and tests/test_rules.py all
read this module. An example is a few overrides of `EXAMPLE_BASE`; `example(overrides)` gives the full spec.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from initadvisor.numbers import show
from initadvisor.spec import THRESHOLDS


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    message: str
    layer: int | None
    source: str


def finding(code: str, message: str, layer: int | None = None) -> Finding:
    r = RULES[code]
    return Finding(code, r.severity, message, layer, r.source)


Check = Callable[[Any, Any], list[Finding]]  # (spec, diagnose.Analysis) -> findings


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: str  # error | warning | info
    title: str
    threshold_key: str | None  # the spec `thresholds` key it compares against; None: a fixed criterion
    criterion: str  # when it fires, one line
    keys: tuple[str, ...]  # the spec keys it points at, most specific first
    check: Check
    meaning: str
    formula: str
    source: str
    fix: str
    fails: dict  # overrides of EXAMPLE_BASE that make it fire
    passes: dict  # ... and the fixed spec, where it stays silent
    scope: str = "spec"  # "spec": `check` runs it on a spec; "audit": `initadvisor.audit` raises it on a live
    # model (no spec example: its fails / passes are empty)

    @property
    def threshold(self) -> str:
        """The threshold as text: `thresholds.KEY [default]`, or the fixed criterion."""
        if self.threshold_key is None:
            return f"fixed: {self.criterion}"
        return f"thresholds.{self.threshold_key} [{self.default}]"

    @property
    def default(self) -> str | None:
        """The threshold's built-in default as text (1e6, 0.99), None for a fixed criterion."""
        if self.threshold_key is None:
            return None
        v = THRESHOLDS[self.threshold_key]
        mantissa, exp = f"{v:e}".split("e")
        return f"1e{int(exp)}" if float(mantissa) == 1 and abs(int(exp)) >= 3 else f"{v:g}"


EXAMPLE_BASE: dict = {"model": {"layers": 4, "d_model": 64, "heads": 4}, "sequence": {"length": 64}}


def example(overrides: dict, base: dict | None = None) -> dict:
    """The full spec (YAML layout) of an example: `overrides` merged into EXAMPLE_BASE."""
    out = copy.deepcopy(EXAMPLE_BASE if base is None else base)
    for k, v in overrides.items():
        out[k] = example(v, out.get(k, {})) if isinstance(v, dict) else v
    return out


# ---------------------------------------------------------------------------------------------------
# the checks: (spec, Analysis) -> findings; `layer` is the stream index (0 = input, i = after block i)


def _rho(spec, a):
    """rho per layer; for causal models the late third of positions, where collapse sets in first (001 C.6)."""
    if a.ct is None:
        return a.trace.rho
    return a.ct.rho_thirds[:, 2] if spec.causal else a.ct.rho_mean  # bidirectional windows: all pairs


def _collapse_at(spec, a) -> int | None:
    hit = (_rho(spec, a) >= spec.thresholds["rank_collapse_rho"]).nonzero()[0]
    return int(hit[0]) if hit.size else None


def rank_collapse(spec, a) -> list[Finding]:
    k, rho, th = _collapse_at(spec, a), _rho(spec, a), spec.thresholds["rank_collapse_rho"]
    if k is None:
        return []
    return [finding("IA101", f"rho reaches {show(rho[k], '.4f')} >= {th} at layer {k} of {spec.layers} "
                             f"(final rho {show(rho[-1], '.4f')})", k)]


def collapse_trend(spec, a) -> list[Finding]:
    rho, th = _rho(spec, a), spec.thresholds["collapse_trend_rho"]
    if _collapse_at(spec, a) is not None or not rho[-1] >= th:  # IA101 takes precedence
        return []
    return [finding("IA102", f"final rho {show(rho[-1], '.4f')} >= {th} (rho rises from "
                             f"{show(rho[0], '.3f')} at the input)",
                    spec.layers)]


def forward_variance(spec, a) -> list[Finding]:
    grow = float(a.trace.q[-1] / a.trace.q[min(1, spec.layers)])
    lim = spec.thresholds["forward_ratio_max"]
    if 1 / lim <= grow <= lim:
        return []
    return [finding("IA103", f"forward variance changes {show(grow, '.3g')}x from block 1 to block {spec.layers} "
                             f"(outside [{1 / lim:g}, {lim:g}])", spec.layers)]


def numeric_range(spec, a) -> list[Finding]:
    """IA104 is raised where a report is assembled (numbers.clean finds the values it replaces by null)."""
    return []


def router_shrink(spec, a) -> list[Finding]:
    r = a.routing
    if r is None or r["shrink"] >= spec.thresholds["router_shrink"]:
        return []
    E = spec.moe
    how = "" if E.normalize else ", not renormalised"
    return [finding("IA105", f"the router's top {E.top_k} of {E.experts} weights ({E.router}{how}) leave the MoE "
                             f"branch sum_j w_j^2 = {show(r['sum_w2'], '.3g')} of one expert's second moment, "
                             f"{show(r['shrink'], '.3g')} x the 1/k of renormalised weights: the branch's and its "
                             f"experts' gradients' second moments start {show(1 / r['shrink'], '.3g')}x smaller",
                    r["block"])]


def double_depth_scaling(spec, a) -> list[Finding]:
    """Output projections depth-scaled against the input projections (GPT-2's 1/sqrt(2N)) and branch multipliers
    that shrink with depth (block, depth_alpha) together; both at most L^-1/4 (1/sqrt(2N) and L^-1/2 pass it from
    L = 4 on)."""
    L = spec.layers
    mult = max(spec.res_attention.block, spec.res_mlp.block) * L ** -spec.depth_alpha
    init = spec.init
    ratio = max(init["o"].std / init["v"].std, init["ff_out"].std / init["ff_in"].std)
    if L < 4 or mult > L ** -0.25 or ratio > L ** -0.25:
        return []
    grown = (f", and over {L} blocks the branches add {show(a.trace.q[-1] / a.trace.q[0] - 1, '.3g')} x the "
             "stream's entering second moment") if spec.norm == "pre" else ""
    return [finding("IA106", f"depth scaling applied twice: output projections at {show(ratio, '.3g')} x the input "
                             f"projections' std (1/sqrt(2N) = {show((2 * L) ** -0.5, '.3g')}) and branch multipliers "
                             f"{show(mult, '.3g')} (residual block x layers^-depth_alpha): each branch's second "
                             f"moment is scaled by {show((ratio * mult) ** 2, '.3g')}{grown}")]


def windows_mask_collapse(spec, a) -> list[Finding]:
    """The same stack with every layer global (window 0): its rho by _rho's measure, position-resolved where the
    engine resolved the spec's own (a recipe compared on the late-token pair: on it)."""
    from initadvisor.diagnose import causal_trace
    from initadvisor.core.model import propagate
    from initadvisor.stack import from_spec

    th = spec.thresholds["rank_collapse_rho"]
    windows = spec.sliding_window and spec.sliding_window < spec.seq_len and spec.window_blocks != ()
    if not (windows or spec.alibi) or _collapse_at(spec, a) is not None:  # IA101 takes precedence; no layer
        return []  # with a window shorter than the sequence: the counterfactual is the spec itself
    stack = from_spec(spec, window=0, alibi=0.0)
    ct = causal_trace(stack) if spec.causal and a.ct is not None else None
    rho = propagate(stack, backward=False).rho if ct is None else ct.rho_thirds[:, 2]
    hit = (rho >= th).nonzero()[0]
    if not hit.size:
        return []
    k, own = int(hit[0]), _rho(spec, a)
    if spec.alibi:
        return [finding("IA107", f"ALiBi's biases keep rho at {show(float(own.max()), '.4f')} at most, but without "
                                 f"them it reaches {show(float(rho[k]), '.4f')} >= {th} at layer {k}: the heads' "
                                 "local weighting masks a collapse of the attention itself (its far-reaching heads "
                                 "carry it as the context grows)", k)]
    return [finding("IA107", f"the sliding windows keep rho at {show(float(own.max()), '.4f')} at most, but with "
                             f"every layer global it reaches {show(float(rho[k]), '.4f')} >= {th} at layer {k}: the "
                             "local layers mask a collapse of global attention (longer windows, fewer local layers or "
                             "a longer context bring it back)", k)]


def _beta_ratio(a):
    x = a.trace.beta / a.trace.beta_c
    return x, int(x.argmax())


def entropy_collapse(spec, a) -> list[Finding]:
    t, (x, w) = a.trace, _beta_ratio(a)
    if not x[w] >= 1.0:
        return []
    return [finding("IA201", f"beta {show(t.beta[w], '.3f')} >= beta_c {show(t.beta_c[w], '.3f')} at block "
                             f"{w + 1} (IPR Y2 {show(t.y2[w], '.3f')}; {int((x >= 1).sum())} of {spec.layers} "
                             "blocks localized)", w + 1)]


def finite_size(spec, a) -> list[Finding]:
    t, (x, w) = a.trace, _beta_ratio(a)
    if not 0.5 <= x[w] < 1.0:
        return []
    return [finding("IA202", f"beta {show(t.beta[w], '.3f')} is in [beta_c/2, beta_c) = "
                             f"[{show(t.beta_c[w] / 2, '.3f')}, "
                             f"{show(t.beta_c[w], '.3f')}) at block {w + 1}: IPR {show(t.y2[w], '.3g')} at "
                             f"T = {spec.seq_len} (uniform: {show(1 / spec.seq_len, '.3g')})", w + 1)]


def qk_norm_beta(spec, a) -> list[Finding]:
    if spec.qk_norm == "none":
        return []
    t, (x, w) = a.trace, _beta_ratio(a)
    return [finding("IA203", f"QK-norm ({spec.qk_norm}): beta = softmax_scale {show(spec.softmax_scale, '.4g')} x "
                             f"sqrt(d_head {spec.d_head}) / sqrt(ln T) = {show(t.beta[w], '.3f')} whatever the Q/K "
                             f"init stds; beta/beta_c up to {show(x[w], '.3f')} (block {w + 1})", w + 1)]


WIDTH_BLIND_GAIN = 2.0  # sqrt(g_Q g_K) above this (std^2 d per matrix): a std that ignores the width


def width_blind_qk(spec, a) -> list[Finding]:
    """Q/K stds that do not shrink with the width: the logits' std for unit inputs, s_Q s_K d x scale sqrt(d_head),
    grows with d, and the attention leaves its uniform phase."""
    if spec.qk_norm != "none" or spec.qk_beta is not None or spec.latent:  # beta set on purpose (init.qk_beta);
        # latent attention's queries and keys read normed latents, not h
        return []
    sq, sk, d = spec.init["q"].std, spec.init["k"].std, spec.d_model
    gain = sq * sk * d
    t, (x, w) = a.trace, _beta_ratio(a)
    if gain <= WIDTH_BLIND_GAIN or x[w] < 0.5:
        return []
    unit = spec.softmax_scale * math.sqrt(spec.d_head)  # the logits' std at stds 1/sqrt(d)
    return [finding("IA204", f"Q/K stds {show(sq, '.3g')} and {show(sk, '.3g')} at d_model {d} (s_Q s_K d = "
                             f"{show(gain, '.3g')}): the logits' std for unit inputs is {show(gain * unit, '.3g')}, "
                             f"beta {show(t.beta[w], '.3f')} >= beta_c/2 = {show(t.beta_c[w] / 2, '.3f')} at block "
                             f"{w + 1}; stds 1/sqrt(d) = {show(d ** -0.5, '.3g')} give {show(unit, '.3g')} "
                             f"(beta {show(t.beta[w] / gain, '.3f')})", w + 1)]


def _gradient_law(a) -> str:
    law = a.growth["gradient"]
    if law["law"] == "hyperbolic":
        return f"hyperbolic, exponent {show(law['exponent'], '.2f')}"
    if law["law"] == "exponential":
        return f"exponential, factor {show(law['per_layer_factor'], '.4f')} per layer"
    return law["law"]


def exploding_gradient(spec, a) -> list[Finding]:
    end, th = a.growth["gradient"]["blocks"], spec.thresholds["grad_explode"]
    if not end > th:
        return []
    return [finding("IA301", f"gradient second moment grows {show(end, '.3g')}x from block {spec.layers} to block 1 "
                             f"({_gradient_law(a)}) > {th:g}", 1)]


def vanishing_gradient(spec, a) -> list[Finding]:
    end, th = a.growth["gradient"]["blocks"], spec.thresholds["grad_vanish"]
    if not end < th or end > spec.thresholds["grad_explode"]:  # IA301 takes precedence
        return []
    return [finding("IA302", f"gradient second moment shrinks to {show(end, '.3g')} of its top value at block 1 "
                             f"({_gradient_law(a)}) < {th:g}", 1)]


QK_PATH_SHARE = 0.5  # IA305: the query/key path carries at least this share of an attention input's gradient


def qk_path_growth(spec, a) -> list[Finding]:
    """Gradients that explode through the attention scores: the query/key path carries most of some block's
    gradient (the softmax Jacobian's trace grows once attention localises)."""
    end, th = a.growth["gradient"]["blocks"], spec.thresholds["grad_explode"]
    share = [float(x) for x in a.trace.qk_share]
    w = max(range(len(share)), key=share.__getitem__)
    if not (end > th and share[w] >= QK_PATH_SHARE):
        return []
    n = sum(x >= QK_PATH_SHARE for x in share)
    x = a.trace.beta[w] / a.trace.beta_c[w]
    return [finding("IA305", f"the query/key path carries {show(100 * share[w], '.0f')}% of the gradient at block "
                             f"{w + 1}'s attention input ({n} of {spec.layers} blocks above "
                             f"{100 * QK_PATH_SHARE:.0f}%; beta/beta_c {show(x, '.2f')}, IPR {show(a.trace.y2[w], '.3f')})"
                             f": the scores' gradient A (V - O) G through W_Q and W_K grows the gradient "
                             f"{show(end, '.3g')}x to block 1 > {th:g}", w + 1)]


def qk_gradient(spec, a) -> list[Finding]:
    t, th = a.trace, spec.thresholds["qk_grad_ratio_min"]
    w = int(a.ratio.argmin())
    if not a.ratio[w] < th:
        return []
    return [finding("IA303", f"Q/K-to-V gradient ratio {show(a.ratio[w], '.2e')} < {th:g} at block {w + 1} "
                             f"(rho {show(t.att_p[w] / t.att_q[w], '.3f')} at its input)", w + 1)]


def qk_uniform_phase(spec, a) -> list[Finding]:
    from initadvisor.core.gradients import jacobian_trace

    t, (x, _) = a.trace, _beta_ratio(a)
    if not x[0] < 0.5:
        return []
    return [finding("IA304", f"block 1 attends uniformly (IPR {show(t.y2[0], '.2e')}): Result 2's Q/K gradient factor "
                             f"E tr(M^2) = {show(jacobian_trace(t.y2[0], t.y3[0], t.y22[0]), '.2e')} (at most 1/12, "
                             "reached at beta = 2 beta_c)", 1)]


def width_collapse(spec, a) -> list[Finding]:
    w = a.width
    if not (w and w["collapsed"]) or spec.alibi:  # ALiBi's rows are not uniform: the spectral law is for those
        return []
    return [finding("IA401", f"one attention layer's output has stable rank {show(w['stable_rank'], '.3g')} at T = "
                             f"{w['seq_len']} against {show(w['stable_rank_centered'], '.3g')} with centered attention "
                             f"(spectral gap sigma1/sigma2 = {show(w['gap_ratio'], '.3g')})", 1)]


def audit_only(spec, a) -> list[Finding]:
    """Audit rules fire on a live model's weights (initadvisor.audit), never on a spec."""
    return []


def initial_loss(spec, a) -> list[Finding]:
    loss, th = a.loss, spec.thresholds["initial_loss_excess"]
    excess = loss["expected"] - loss["uniform"]
    if not excess > th:
        return []
    return [finding("IA501", f"expected step-0 loss {show(loss['expected'], '.4g')} exceeds ln V = "
                             f"{show(loss['uniform'], '.4g')} by {show(excess, '.3g')} > {th:g} nats (logit std "
                             f"{show(loss['logit_std'], '.3g')})")]


def causal_positions(spec, a) -> list[Finding]:
    if a.ct is None or not spec.causal:
        return []
    e, m, late = a.ct.rho_thirds[-1]
    if a.ct.stationary:
        return [finding("IA901", f"causal attention, late tokens resolved by distance (too long to resolve per "
                                 f"position): final rho {show(late, '.3f')}, early positions taken as late ones, the "
                                 "gradient the late tokens'; attention phase from the late-token pair (001 C.6)")]
    return [finding("IA901", f"causal attention, position-resolved: final rho {show(e, '.3f')} / "
                             f"{show(m, '.3f')} / {show(late, '.3f')} "
                             f"for early / middle / late tokens (mean {show(a.ct.rho_mean[-1], '.3f')}); attention phase "
                             "and gradients from the late-token pair (001 C.6)")]


# ---------------------------------------------------------------------------------------------------
# the registry, in report order

_COLLAPSE_KEYS = ("residual.attention.skip", "residual.attention", "model.attention", "model.layers")
_BETA_KEYS = ("init.qk_beta", "init.q", "init.k", "model.softmax_scale", "init.std", "sequence.length")

RULES: dict[str, Rule] = {r.code: r for r in [
    Rule(
        code="IA101", name="rank-collapse", severity="error", title="Rank collapse",
        threshold_key="rank_collapse_rho",
        criterion="rho >= rank_collapse_rho at some layer (causal: late third of positions)",
        keys=_COLLAPSE_KEYS, check=rank_collapse,
        meaning="Token representations converge to one direction: the mean cosine similarity rho between tokens "
                "reaches the collapse threshold at some layer, so attention has nothing to distinguish and Q/K "
                "gradients vanish.",
        formula="rho_l = p_l / q_l from the (q, p) recurrence (001 Algorithms 1-3, eqs. 14-17)",
        source="Giorlandino & Goldt 2025, Result 1, eqs. 11, 14-17",
        fix="Strengthen the attention skip (alpha_SA >= alpha_c, see `initadvisor recommend`), use pre-LN, "
            "centered attention, or fewer layers.",
        fails={"model": {"layers": 8, "norm": "pre"}, "init": {"v": {"gain": 4}}},
        passes={"model": {"layers": 8, "norm": "pre", "attention": "centered"}, "init": {"v": {"gain": 4}}},
    ),
    Rule(
        code="IA102", name="collapse-trend", severity="warning", title="Collapse trend",
        threshold_key="collapse_trend_rho", criterion="final rho >= collapse_trend_rho (and no IA101)",
        keys=_COLLAPSE_KEYS, check=collapse_trend,
        meaning="The final layer's rho is high: deeper variants of this model, or training, will push it into "
                "collapse.",
        formula="rho_L >= threshold", source="Giorlandino & Goldt 2025, eqs. 14-17",
        fix="As for IA101: a stronger attention skip or centered attention.",
        fails={"model": {"layers": 8, "norm": "pre"}, "residual": {"attention": {"skip": 0.7}, "mlp": {"skip": 0.7}}},
        passes={"model": {"layers": 8, "norm": "pre"}, "residual": {"attention": {"skip": 1.0}, "mlp": {"skip": 1.0}}},
    ),
    Rule(
        code="IA103", name="forward-variance", severity="error", title="Forward variance explodes or dies",
        threshold_key="forward_ratio_max",
        criterion="q_L / q_1 outside [1 / forward_ratio_max, forward_ratio_max]",
        keys=("model.norm", "residual", "init.std", "model.layers"), check=forward_variance,
        meaning="The residual stream's second moment changes by more than the threshold from block 1 to the last "
                "block: without normalisation (or with residual gains above 1) it grows or decays exponentially "
                "with depth and activations overflow or vanish in floating point.",
        formula="q_L / q_1 from the forward recurrence (moments are capped at 10^250 to stay finite)",
        source="Kedia et al. 2024, App. E.1 (eq. 2); Giorlandino & Goldt 2025, eq. 15",
        fix="Use pre- or post-LN, or scale residual branches (DeepScaleLM lambda^2 + beta^2 = 1).",
        fails={"model": {"layers": 24, "norm": "none"}, "init": {"std": 0.1}},
        passes={"model": {"layers": 24, "norm": "pre"}, "init": {"std": 0.1}},
    ),
    Rule(
        code="IA104", name="numeric-range", severity="error", title="A quantity leaves the engine's range",
        threshold_key=None, criterion="a reported quantity beyond 10^200 or a positive one below 10^-200",
        keys=("model.norm", "init.std", "residual", "model.layers"), check=numeric_range,
        meaning="A predicted moment, gradient or derived quantity overflows (or a strictly positive one underflows) "
                "the range the engine resolves: the engine caps moments at 10^250 to keep going, so the value is "
                "reported as null and this finding names the quantity and the layers. In floating point the "
                "network itself overflows or vanishes long before.",
        formula="|x| >= 10^200, or 0 <= x <= 10^-200 for q, beta_c, tau and the other positive quantities",
        source="IEEE 754 double range; the engine's clamp (core/attention.py HUGE)",
        fix="Bring the forward variance under control first (IA103): a norm, smaller init stds or residual "
            "scaling; see `initadvisor recommend`.",
        fails={"model": {"layers": 24, "norm": "none"}, "init": {"std": 1000}},
        passes={"model": {"layers": 24, "norm": "pre"}, "init": {"std": 1000}},
    ),
    Rule(
        code="IA105", name="router-shrinks-branch", severity="warning", title="The router shrinks the MLP branch",
        threshold_key="router_shrink",
        criterion="routing.shrink = top_k x sum_j w_j^2 < router_shrink (first MoE block)",
        keys=("moe.normalize", "moe.scale", "moe.top_k", "moe.experts", "moe"), check=router_shrink,
        meaning="A mixture-of-experts branch is sum_j w_j f_j over each token's top k experts: its second moment is "
                "sum_j w_j^2 times one expert's. Renormalised top-k weights give about 1/k; the full softmax's "
                "values (not renormalised, transformers' default for Qwen3-MoE) give about k / E^2, so the branch's "
                "second moment, and its experts' weight gradients' (times w_j^2), start (E / k)^2 times smaller "
                "than with renormalised weights: at init the blocks are attention-only and the experts barely learn.",
        formula="q_moe = (sum_j w_j^2) q_expert; uniform routing: 1/k (renormalised), k / E^2 (softmax over E)",
        source="core/routing.py (Monte-Carlo over the router's Gaussian logits); Shazeer et al. 2017, "
               "Fedus et al. 2022 (Switch), sec. 2.2",
        fix="Renormalise the top-k weights (moe.normalize: true; HF norm_topk_prob: true) or scale them (moe.scale, "
            "DeepSeek's routed_scaling_factor).",
        fails={"moe": {"experts": 32, "top_k": 4, "normalize": False}}, passes={"moe": {"experts": 32, "top_k": 4}},
    ),
    Rule(
        code="IA106", name="double-depth-scaling", severity="warning", title="Depth scaling applied twice",
        threshold_key=None, criterion="output-projection std ratio <= L^-1/4 and branch multiplier <= L^-1/4, L >= 4",
        keys=("residual.depth_alpha", "residual", "init.o", "init.ff_out"), check=double_depth_scaling,
        meaning="Two depth corrections for the same thing: an output-projection init shrunk with depth (GPT-2's "
                "1/sqrt(2N), Megatron's 1/sqrt(2L)) and a branch multiplier that shrinks with depth (depth-muP's "
                "1/sqrt(L), CompleteP's 1/L, or a residual block scale). Each alone keeps the stream's growth O(1) "
                "over depth; together the branches add a vanishing share: the blocks start as near-identities and their "
                "gradients are scaled down with them.",
        formula="branch second moment x (std_out / std_in)^2 x (block L^-alpha)^2, e.g. 1/(2L) x 1/L^2",
        source="Radford et al. 2019 (GPT-2), sec. 2.3; Bordelon et al. 2024 / Yang et al. 2024 (depth-muP); Dey et "
               "al. 2025 (CompleteP)",
        fix="Keep one of them: the 1/sqrt(2N) output-projection init or the depth multiplier (residual.depth_alpha), "
            "not both.",
        fails={"model": {"layers": 16, "norm": "pre"}, "init": {"o": {"std": 0.0035}, "ff_out": {"std": 0.0035}},
               "residual": {"depth_alpha": 1.0}},
        passes={"model": {"layers": 16, "norm": "pre"}, "init": {"o": {"std": 0.0035}, "ff_out": {"std": 0.0035}}},
    ),
    Rule(
        code="IA107", name="windows-mask-collapse", severity="warning", title="Sliding windows mask a rank collapse",
        threshold_key=None, criterion="rho >= rank_collapse_rho at some layer with every layer global (no windows, "
                                      "no ALiBi biases), below it with them (and no IA101)",
        keys=("model.sliding_window", "model.window_blocks", "model.alibi", "residual.attention.skip"),
        check=windows_mask_collapse,
        meaning="Local attention averages each token with its last W keys only, so tokens stay apart and rho stays "
                "low; the same stack with global attention in every layer collapses. The model is one change away "
                "from rank collapse: longer windows, more global layers (long-context variants turn local layers "
                "global) or a longer sequence for the global ones. ALiBi's biases act alike: each head weighs its "
                "keys e^(-m_h (t - s)), most of them locally.",
        formula="rho_l of the stack with window = 0 and no ALiBi in every block (position-resolved for causal models, "
                "late third) against the same with the spec's windows or biases",
        source="Giorlandino & Goldt 2025, Result 1 and eqs. 14-17, with a REM per window (Beltagy et al. 2020, "
               "Longformer; Gemma 2 and 3)",
        fix="Make the stack trainable with global attention too: a stronger attention skip (alpha_SA >= alpha_c, "
            "`initadvisor recommend`), or a smaller value/output gain.",
        fails={"model": {"layers": 8, "norm": "pre", "causal": True, "sliding_window": 4}, "init": {"v": {"gain": 4}}},
        passes={"model": {"layers": 8, "norm": "pre", "causal": True, "sliding_window": 4}, "init": {"v": {"gain": 4}},
                "residual": {"attention": {"skip": 2.0}}},
    ),
    Rule(
        code="IA201", name="entropy-collapse", severity="error", title="Entropy collapse",
        threshold_key=None, criterion="beta >= beta_c at some block",
        keys=_BETA_KEYS, check=entropy_collapse,
        meaning="The query/key scale beta is at or above the critical beta_c of the layer's input geometry: "
                "attention rows condense on a few random tokens (localized REM phase) and training is unstable.",
        formula="beta >= beta_c(q, p) = sqrt(2 / (q (q - p))); IPR Y2 = 1 - beta_c / beta",
        source="Giorlandino & Goldt 2025, Result 1, eq. 12",
        fix="Lower the Q/K init std (or init.qk_beta) below beta_c / 2, see `initadvisor recommend`.",
        fails={"init": {"qk_beta": 1.8}}, passes={"init": {"qk_beta": 0.5}},
    ),
    Rule(
        code="IA202", name="finite-size-crossover", severity="warning", title="Finite-size crossover",
        threshold_key=None, criterion="beta_c / 2 <= beta < beta_c at the worst block",
        keys=_BETA_KEYS, check=finite_size,
        meaning="beta lies between beta_c/2 and beta_c: the softmax partition function is no longer Gaussian and "
                "attention is partly localized (the engine's IPR is the exact finite-T value there); the scores' "
                "gradient through W_Q and W_K is no longer negligible and grows the gradient with depth.",
        formula="beta_c / 2 <= beta < beta_c", source="Giorlandino & Goldt 2025, sec. 3.2 and B.3",
        fix="Lower the Q/K init std below beta_c / 2.",
        fails={"init": {"qk_beta": 1.0}}, passes={"init": {"qk_beta": 0.5}},
    ),
    Rule(
        code="IA203", name="qk-norm-beta", severity="info", title="QK-norm sets beta",
        threshold_key=None, criterion="model.qk_norm is head or all",
        keys=("model.qk_norm", "model.softmax_scale", "sequence.length"), check=qk_norm_beta,
        meaning="Queries and keys are normalised (unit per-coordinate variance, gains 1 at init) before the scores, "
                "so the logits' scale, and beta, are fixed by the softmax scale and the norm gains: the Q/K init "
                "std no longer moves beta (it only scales the Q/K gradients, through the norm's Jacobian).",
        formula="beta = softmax_scale sqrt(d_head) g_q g_k / sqrt(ln T); beta_c = sqrt(2 / (1 - rho))",
        source="Giorlandino & Goldt 2025, Result 1, with unit-variance queries and keys",
        fix="Set beta with model.softmax_scale (or the norm gains), not the Q/K stds; `initadvisor recommend` "
            "gives the critical recipe's scale.",
        fails={"model": {"qk_norm": "head"}}, passes={"model": {"qk_norm": "none"}},
    ),
    Rule(
        code="IA204", name="width-blind-qk-std", severity="warning", title="Width-blind Q/K init std",
        threshold_key=None, criterion=f"s_Q s_K d > {WIDTH_BLIND_GAIN:g} (stds given, no QK-norm) and beta >= "
                                      "beta_c/2 at some block",
        keys=("init.q", "init.k", "init.std", "model.d_model"), check=width_blind_qk,
        meaning="A fixed Q/K std (0.02 whatever the width) makes each logit a sum over d coordinates: its std for "
                "unit inputs is s_Q s_K d x softmax_scale sqrt(d_head), which grows linearly with d (0.02 at d 16384: "
                "6.6). Wide models then start with attention in the crossover or localized phase (entropy collapse, "
                "IA201/IA202) although the same std is harmless at small width.",
        formula="sigma_a = s_Q s_K d softmax_scale sqrt(d_head); beta = sigma_a / sqrt(ln T); width-aware: s ~ 1/sqrt(d)",
        source="Giorlandino & Goldt 2025, sec. 2 (beta's definition); Yang et al. 2022 (muP), Table 3",
        fix="Scale the Q/K std with the width (1/sqrt(d_model), or muP's 1/d for the logits), or normalise queries "
            "and keys (model.qk_norm); `initadvisor recommend` gives the critical std.",
        fails={"init": {"q": {"std": 0.2}, "k": {"std": 0.2}}},  # s^2 d = 2.56 at d 64
        passes={"init": {"q": {"std": 0.125}, "k": {"std": 0.125}}},  # 1/sqrt(d)
    ),
    Rule(
        code="IA301", name="exploding-gradient", severity="error", title="Exploding gradients towards the input",
        threshold_key="grad_explode", criterion="grad_q[1] / grad_q[L] > grad_explode",
        keys=("model.norm", "residual.attention.block", "residual.mlp.block", "residual", "init.o", "init.ff_out",
              "init.std", "model.layers"),
        check=exploding_gradient,
        meaning="The loss gradient's second moment grows from the top of the stack to the input beyond the "
                "threshold: Pre-LN grows hyperbolically (q_L / q_l)^C, Post-LN exponentially C5^(L - l).",
        formula="grad_q[1] / grad_q[L] (through the blocks) from the backward moment recurrence",
        source="Kedia et al. 2024, App. E.1.2, E.2 (eq. 3)",
        fix="Scale residual branches (DeepScaleLM lambda/beta, GPT-2's 1/sqrt(2N)), see `initadvisor recommend`.",
        fails={"model": {"layers": 16, "norm": "none"}, "init": {"std": 0.1}},
        passes={"model": {"layers": 16, "norm": "pre"}, "init": {"std": 0.1}},
    ),
    Rule(
        code="IA302", name="vanishing-gradient", severity="error", title="Vanishing gradients towards the input",
        threshold_key="grad_vanish", criterion="grad_q[1] / grad_q[L] < grad_vanish",
        keys=("model.norm", "residual.attention.skip", "residual.mlp.skip", "residual", "init.std", "model.layers"),
        check=vanishing_gradient,
        meaning="The loss gradient's second moment shrinks from the top of the stack to the input below the "
                "threshold (Post-LN's exponential decay C5^(L - l) with C5 < 1).",
        formula="grad_q[1] / grad_q[L]", source="Kedia et al. 2024, App. E.2 (eq. 3)",
        fix="Use pre-LN or DeepScaleLM/DeepNorm scaling; see `initadvisor recommend`.",
        fails={"model": {"layers": 8, "norm": "none"}, "residual": {"attention": {"skip": 0.7}, "mlp": {"skip": 0.7}}},
        passes={"model": {"layers": 8, "norm": "none"}, "residual": {"attention": {"skip": 1.0}, "mlp": {"skip": 1.0}}},
    ),
    Rule(
        code="IA303", name="qk-gradient-vanishing", severity="warning", title="Vanishing query/key gradients",
        threshold_key="qk_grad_ratio_min", criterion="Noci's Q/K-to-V gradient ratio < qk_grad_ratio_min at some block",
        keys=("residual.attention.skip", "residual.attention", "init.qk_beta", "init.q", "init.k",
              "model.softmax_scale", "model.layers"),
        check=qk_gradient,
        meaning="Query/key gradients are negligible against value gradients at some block: correlated tokens "
                "(rho -> 1) and a small score scale starve attention's Q/K of signal, so attention cannot learn.",
        formula="E||dS/dW_Q||^2 / E||dS/dW_V||^2 = tau^2 sigma_x^4 (n-1)(1-rho)^2 (n+d) / (d n (1 + rho (n-1)))",
        source="Noci et al. 2022, eqs. 17, 18, 46",
        fix="Avoid rank collapse (IA101), or temper the softmax with tau (Noci eq. 47), see `initadvisor recommend`.",
        fails={"init": {"std": 0.002}}, passes={"init": {"std": 0.02}},
    ),
    Rule(
        code="IA304", name="qk-gradient-uniform-phase", severity="info",
        title="Q/K gradients suppressed by uniform attention",
        threshold_key=None, criterion="beta < beta_c / 2 at block 1 (Result 2)",
        keys=("init.qk_beta", "init.q", "init.k", "init.std", "sequence.length"), check=qk_uniform_phase,
        meaning="In the uniform attention phase (beta < beta_c / 2) the query/key gradient carries the softmax "
                "Jacobian's trace E tr(M^2) ~ Y2 ~ 1/T: small at initialisation, restored once skip connections "
                "move the tokens (001 sec. 3.3).",
        formula="T/(d^2 sqrt(ln T)) E||dL/dW_Q||^2 = C beta sigma_v^2 q (q-p)^2 [Y2 - 2 Y3 + E Y2^2]",
        source="Giorlandino & Goldt 2025, Result 2 (eq. 13, trace corrected)",
        fix="None needed with skip connections; a larger beta up to beta_c / 2 raises it.",
        fails={"init": {"qk_beta": 0.3}}, passes={"init": {"qk_beta": 1.0}},
    ),
    Rule(
        code="IA305", name="qk-path-gradient-growth", severity="warning",
        title="Gradients explode through the attention scores",
        threshold_key="grad_explode", criterion=f"grad_q[1] / grad_q[L] > grad_explode and the query/key path carries "
                                                f">= {100 * QK_PATH_SHARE:.0f}% of some attention input's gradient",
        keys=("init.qk_beta", "init.q", "init.k", "model.softmax_scale", "sequence.length"), check=qk_path_growth,
        meaning="The loss gradient reaches each attention input through the values and through the scores: "
                "A_ts G_t.(V_s - O_t) carried back by W_Q and W_K. That path is O(1/T) while attention is uniform and "
                "dominant once it localises (beta near or above beta_c): the softmax Jacobian's trace "
                "Y2 - 2 Y3 + Y2^2 times beta^2 ln T multiplies the gradient at every such block, so it grows "
                "exponentially towards the input; the mechanism by which entropy collapse destabilises training.",
        formula="beta^2 ln T (2 q - p + b_Q^2) g_V (q - p) E tr(M^2) H d_head / d per block (Attention._qk_gain; "
                "causal rows: per row at its t keys, Attention._qk_rows)",
        source="Giorlandino & Goldt 2025, Result 2 (the softmax Jacobian, traced back through W_Q and W_K)",
        fix="Lower beta below beta_c / 2 (the Q/K std, or the softmax scale under a QK-norm); `initadvisor "
            "recommend` gives the critical std.",
        fails={"model": {"layers": 16, "norm": "pre"}, "init": {"qk_beta": 3.0}},
        passes={"model": {"layers": 16, "norm": "pre"}, "init": {"qk_beta": 0.3}},
    ),
    Rule(
        code="IA401", name="width-rank-collapse", severity="info", title="Rank collapse in width",
        threshold_key=None, criterion="one attention output's stable rank < 10% of the centered one (paper 002)",
        keys=("model.attention", "sequence.length"), check=width_collapse,
        meaning="A softmax attention matrix at init is a rank-one outlier (singular value ~1, along the all-ones "
                "direction) over a bulk of order sqrt((e^V - 1) / T), so one attention layer's output has stable "
                "rank near 1 at long contexts; skip connections carry the rank, removing the outlier "
                "(A - 11^T/T) restores it.",
        formula="stable rank ||A X||_F^2 / ||A X||_2^2 vs the centered (A - 11^T/T) X; collapsed below 10% of it",
        source="Naderi, Nait Saada & Tanner 2025 (Mind the Gap), Thm. 1, 2, Prop. 3",
        fix="Use centered (gain-controlled) attention, model.attention: centered; keep the attention skip.",
        fails={"sequence": {"length": 1024}},
        passes={"model": {"attention": "centered"}, "sequence": {"length": 1024}},
    ),
    Rule(
        code="IA501", name="initial-loss", severity="warning", title="Step-0 loss above ln V",
        threshold_key="initial_loss_excess",
        criterion="expected step-0 cross-entropy - ln V > initial_loss_excess (nats)",
        keys=("init.head", "init.embedding", "model.tie_embeddings", "model.final_norm", "model.logit_softcap",
              "init.std"),
        check=initial_loss,
        meaning="The logits at initialisation are large: for random targets the expected cross-entropy exceeds "
                "the uniform ln V, so the model starts confidently wrong and its first steps go to shrinking the "
                "head; a tied head without BERT's MLM transform also scores each token's own embedding, a logit "
                "that predicts the current token.",
        formula="z_v = w_v.h i.i.d. N(0, s^2), s^2 = d q_h std_head^2 (q_h = 1 after the final norm); "
                "E CE = E ln sum_v e^{z_v} - E z_y = ln V + s^2/2 - (e^{s^2} - 1)/(2V) + ... (exact: Frullani's "
                "integral); tied: the own logit has mean s sqrt(d f), f its row's share of the final stream",
        source="initadvisor.loss (log-sum-exp of Gaussian logits); reference: torchtitan's Llama-3 debug model, "
               "output std dim^-1/2, logs 8.05 at step 1 against ln V = 7.62",
        fix="Shrink the head's init (init.head: {gain: 1} gives std d^-1/2, logit std 1; smaller is closer to "
            "ln V); with a tied head shrink init.embedding or untie it; or soft-cap the logits (model.logit_softcap).",
        fails={"model": {"tie_embeddings": False}, "init": {"head": {"std": 0.5}}},
        passes={"model": {"tie_embeddings": False}, "init": {"head": {"std": 0.05}}},
    ),
    Rule(
        code="IA601", name="init-mismatch", severity="error", title="Weights differ from the intended init",
        threshold_key=None,
        criterion="a role's std (or mean, or norm gain) differs from the intended one beyond 6 standard errors",
        keys=("init.o", "init.ff_out", "init.ff_in", "init.q", "init.k", "init.v", "init.embedding", "init.std"),
        check=audit_only, scope="audit",
        meaning="A weight role of the live model (q, k, v, o, gate/up, down, embeddings, head, biases, norm gains) "
                "does not have the std the config and the family's init intend: the report gives the factor and "
                "names it where it is a common one (a missing or doubled 1/sqrt(2L), a depth scale on the SwiGLU "
                "value matrix, 1/sqrt(2)).",
        formula="factor = measured std / intended std, reported when |ln factor| > max(0.01, 6 / sqrt(2 n)) "
                "(n entries: a std's relative standard error is 1 / sqrt(2 n))",
        source="transformers PreTrainedModel._init_weights and GPT2PreTrainedModel._init_weights; nanoGPT "
               "model.py; Radford et al. 2019, sec. 2.3 (1/sqrt(N) scaling of residual layers)",
        fix="Make the init code draw each role with its intended std (the finding names the factor to remove or "
            "add); `initadvisor recommend` prints an init_weights snippet.",
        fails={}, passes={},
    ),
    Rule(
        code="IA602", name="pytorch-default-init", severity="error", title="Weights left at PyTorch's default init",
        threshold_key=None,
        criterion="an nn.Linear uniform within +-1/sqrt(fan_in) at std 1/sqrt(3 fan_in), or an nn.Embedding "
                  "at std 1, where another init is intended",
        keys=("init.std",), check=audit_only, scope="audit",
        meaning="The module was never reached by the model's init function (created after post_init() or "
                "model.apply(init), or skipped by its type test), so it keeps PyTorch's default: "
                "kaiming_uniform(a = sqrt(5)) for nn.Linear, N(0, 1) for nn.Embedding.",
        formula="nn.Linear: max |w| <= 1/sqrt(fan_in) and std = 1/sqrt(3 fan_in) within 6 standard errors; "
                "nn.Embedding: std = 1",
        source="PyTorch nn.Linear.reset_parameters and nn.Embedding.reset_parameters",
        fix="Initialise the module after it is built (model.apply(init) last, or re-run post_init()).",
        fails={}, passes={},
    ),
    Rule(
        code="IA603", name="zero-or-constant-tensor", severity="error", title="All-zero or constant weights",
        threshold_key=None,
        criterion="a weight matrix or embedding whose entries are all equal, a tensor with non-finite entries, "
                  "or a zero norm gain",
        keys=("init.std",), check=audit_only, scope="audit",
        meaning="Every unit of a constant matrix computes the same function and gets the same gradient, so "
                "training never breaks the symmetry; a zero matrix or norm gain also blocks the signal and the "
                "gradient of everything before it.",
        formula="max(w) == min(w); an entry of w not finite; a norm's gain g = w (or 1 + w) all zero",
        source="Goodfellow, Bengio & Courville 2016, sec. 8.4 (random initialisation breaks symmetry)",
        fix="Draw the tensor randomly; for a deliberately zero-initialised output projection, ignore IA603 "
            "(raise_for_findings(ignore=...)).",
        fails={}, passes={},
    ),
    Rule(
        code="IA604", name="no-gradient", severity="error", title="Parameters receive no gradient",
        threshold_key=None,
        criterion="a trainable parameter's gradient is None or exactly zero after one probe forward/backward",
        keys=("model",), check=audit_only, scope="audit",
        meaning="A module that was built but is never called (a configured QK-norm skipped in forward()), or "
                "is called under no_grad or on a detached tensor, or sits behind an all-zero tensor, takes no "
                "part in training.",
        formula="torch.autograd.grad(sum of <output, G>, parameters, allow_unused=True) on random tokens, "
                "G ~ N(0, 1): None or all zero",
        source="PyTorch autograd (allow_unused: None for parameters outside the graph)",
        fix="Call the module in forward() (or remove it); if an all-zero tensor blocks the gradient, see IA603.",
        fails={}, passes={},
    ),
    Rule(
        code="IA605", name="truncation-never-bites", severity="warning", title="Truncation bounds never bite",
        threshold_key=None,
        criterion="audit(truncation=t) and a weight's max |w| exceeds t standard deviations of its normal",
        keys=("init.std",), check=audit_only, scope="audit",
        meaning="The init is meant to be a normal truncated at +-t std, but the weights reach beyond: the bounds "
                "were given in absolute units (trunc_normal_(w, std=0.02) keeps a = -2, b = 2, i.e. +-100 std) "
                "and never truncate anything.",
        formula="max |w| > t s (1 + 6 / sqrt(2 n)), s = std / sqrt(1 - 2 t phi(t) / (2 Phi(t) - 1)); tested "
                "where an untruncated normal exceeds the bound with probability > 0.999",
        source="torch.nn.init.trunc_normal_ (a and b are absolute bounds, not multiples of std)",
        fix="Pass the bounds in units of the std: trunc_normal_(w, std=s, a=-t*s, b=t*s).",
        fails={}, passes={},
    ),
    Rule(
        code="IA606", name="head-tying-mismatch", severity="warning", title="Output head tying differs from the config",
        threshold_key=None,
        criterion="the output head is tied to the token embedding where the config says untied, or the reverse",
        keys=("init.embedding",), check=audit_only, scope="audit",
        meaning="tie_word_embeddings (nanoGPT: always tied) says whether the output head shares the token "
                "embedding's matrix; a head re-created after tying, or tied by hand against the config, trains a "
                "different model than the config describes.",
        formula="head.weight is embedding.weight vs tie_word_embeddings",
        source="transformers PreTrainedModel.tie_weights; nanoGPT model.py (weight tying)",
        fix="Tie with model.tie_weights() (or head.weight = embedding.weight), or set tie_word_embeddings.",
        fails={}, passes={},
    ),
    Rule(
        code="IA901", name="causal-positions", severity="info", title="Causal model: position-resolved geometry",
        threshold_key=None, criterion="model.causal: true",
        keys=("model.causal",), check=causal_positions,
        meaning="Token m of a causal model averages over m keys, so early tokens stay less correlated than late "
                "ones; the tool propagates per-position overlaps, judges collapse on the late third of positions, "
                "and takes the attention phase and gradients from the late-token (q, p) pair.",
        formula="per-position overlaps through causal REM rows at m keys; attention-output variance ~ 1/m "
                "(003 Lemma 3)",
        source="Giorlandino & Goldt 2025, C.6; Chi et al. 2023, Lemma 3",
        fix="None needed; read the `causal` object of the JSON report.",
        fails={"model": {"causal": True}}, passes={"model": {"causal": False}},
    ),
]}
