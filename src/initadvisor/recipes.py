"""`recommend`: solve for beta, alpha_c, tau and the DeepScaleLM variances; run the known recipes side by side.

Every recipe is a Spec (what the spec format can express) plus per-layer BlockParams fields (what it cannot,
e.g. DeepScaleLM's per-layer V/O variance or Admin's per-layer skip): one per-layer Stack, on which every
analysis of the recipe runs (forward, backward, causal, Q/K laws).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from initadvisor.core import gradients as G
from initadvisor.core.deepscalelm import dslm_init
from initadvisor.core.model import Stack, Trace, propagate
from initadvisor.core.sorting import median, unique
from initadvisor.diagnose import Analysis, analyse, diagnose, resolved_cells, verdict
from initadvisor.init_code import render, residual_instructions
from initadvisor.numbers import clean, overflow_findings, show, status
from initadvisor.progress import Progress, tell
from initadvisor.spec import MatrixInit, Residual, Spec, SpecError, build_spec
from initadvisor.stack import from_spec, input_correlation, spec_beta

BETA_MARGIN = 0.8  # recommended beta = 0.8 x beta_c,min / 2: inside the sharp (Gaussian) regime of 001 B.3
ALPHA_CEILING = 16.0  # alpha_c is searched in [0, 16]
ALPHA_MARGIN = 1.1  # the critical recipe's skip: the given one if above alpha_c, else 1.1 alpha_c
ALPHA_RTOL = 1e-9  # alpha_c: the good end of a bracket [bad, good] narrower than ALPHA_RTOL x alpha_c
RECIPE_CELLS = 5 * 10**6  # the recipes are resolved per position up to this many cells an analysis (about 0.5 us
# each, diagnose.resolved_cells: a 999-layer windowed MoE stack at T 10000, 1e7, took 150 s; GPT-2 small at 1682
# layers, 2e7, 105 s resolved, 27 s on the pair; Llama-3.1-8B at T 131072, 9e6: check 5.5 s, recommend 10 s, 41 s
# resolved; a 22-layer windowed stack at T 512, 6e6: check 3.9 s, recommend 7.9 s, 33 s resolved)
PATCH_ORDER = ("critical", "deepscalelm-simplified", "gpt2", "deepnorm", "t-fixup", "as-given")


@dataclass
class Recipe:
    name: str
    formula: str
    source: str
    spec: Spec
    per_layer: dict[str, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    undefined: str = ""  # why the recipe has no numbers for this spec (it is then not run)

    def stack(self) -> Stack:
        """The recipe's own per-layer model: every analysis of the recipe runs on it."""
        return from_spec(self.spec, self.per_layer)


def _with_init(spec: Spec, **stds: float) -> Spec:
    init = dict(spec.init)
    for m, s in stds.items():
        init[m] = MatrixInit(float(s), init[m].bias_std)
    return replace(spec, init=init, qk_beta=None)


def _xavier(fan_in: int, fan_out: int) -> float:
    return math.sqrt(2.0 / (fan_in + fan_out))


# ---------------------------------------------------------------------------------------------
# Solvers


def max_rho(spec: Spec, **over) -> np.ndarray:
    """Largest predicted rho over the layers, vectorised over array-valued overrides."""
    t = propagate(from_spec(spec, **over), backward=False)
    return t.rho.max(axis=0)


def alpha_c(spec: Spec, rho_max: float, which: str = "skip_a") -> tuple[float | None, str]:
    """Smallest skip strength (block kept) with rho < rho_max at every layer (001 Fig. 1c), or None and why."""
    grid = np.linspace(0.0, ALPHA_CEILING, 321)
    a = first_crossing(lambda x: max_rho(spec, **{which: x}) - rho_max, grid)
    if a is None:
        return None, f"no skip strength up to {ALPHA_CEILING:g} keeps rho below {rho_max} at every layer"
    if a == 0:
        return 0.0, "rho stays below the threshold even without this skip connection"
    return a, f"max_l rho_l(alpha) = rho_max, bracketed to {ALPHA_RTOL:g}"


def first_crossing(excess, grid: np.ndarray, rtol: float = ALPHA_RTOL) -> float | None:
    """The first point of `grid` where the vectorised excess(x) < 0 (None if there is none), moved down to
    within rtol (relative) of the crossing before it: each step evaluates, as one batch, an even spread over the
    bracket [bad, good] and points ever closer to its inverse-interpolated crossing, and keeps the first good one."""
    x, f = grid, excess(grid)
    if not (f < 0).any():
        return None
    k = int(np.argmax(f < 0))
    while k and x[k] - x[k - 1] > rtol * x[k]:
        lo, hi = x[k - 1], x[k]
        est = _inverse_interpolation(x[max(k - 2, 0):k + 2], f[max(k - 2, 0):k + 2])
        if not lo < est < hi:
            est = lo + (hi - lo) * f[k - 1] / (f[k - 1] - f[k])  # secant
        near = (hi - lo) * 2.0 ** -np.arange(1, 24)
        a = unique(np.concatenate([est - near, [est], est + near, np.linspace(lo, hi, 65)]))
        a = a[(a > lo) & (a < hi)]
        if not a.size:
            break
        fa = excess(a)
        x, f = np.insert(x, k, a), np.insert(f, k, fa)
        k += int(np.argmax(fa < 0)) if (fa < 0).any() else a.size
    return float(x[k])


def _inverse_interpolation(x: np.ndarray, f: np.ndarray) -> float:
    """x at f = 0 on the polynomial x(f) through the points, where f falls strictly (else nan)."""
    if not np.all(np.diff(f) < 0):
        return math.nan
    w = [math.prod(-f[n] / (f[m] - f[n]) for n in range(f.size) if n != m) for m in range(f.size)]
    return float(np.dot(w, x))


def beta_recommendation(spec: Spec, first: Trace | None = None) -> tuple[float, np.ndarray]:
    """beta = BETA_MARGIN x min_l beta_c,l / 2, with beta_c at the geometry that beta itself produces;
    `first`: the spec's own trace (the fixed point's first step), when already run."""
    beta, t = float(spec_beta(spec)), first
    for i in range(3):  # fixed point: beta_c depends weakly on beta through the IPR (in the uniform phase not at all)
        if i or t is None:
            t = propagate(from_spec(spec, beta=beta), backward=False)
        new = BETA_MARGIN * float(t.beta_c.min()) / 2
        converged = i and abs(new - beta) <= 1e-13 * beta  # a further step would change nothing reported
        beta = new
        if converged:
            break
    return beta, t.beta_c


# ---------------------------------------------------------------------------------------------
# Recipes


def recipe_critical(spec: Spec, beta: float, alpha: float | None) -> Recipe:
    given = spec.res_attention.skip
    skip = given if alpha is None or given > alpha else ALPHA_MARGIN * alpha
    source = "Giorlandino & Goldt 2025, Result 1, B.3, Fig. 1c"
    if status(beta, positive=True):
        return Recipe("critical", "Q/K std for beta < beta_c/2", source, spec,
                      undefined=f"beta_c {status(beta_c_floor(beta), positive=True)}: the forward stream leaves "
                                "the engine's range first (fix the forward variance, IA103)")
    s = replace(spec.with_beta(beta), res_attention=Residual(skip, spec.res_attention.block))
    knob = "softmax scale (QK-norm)" if spec.qk_norm != "none" else \
        "softmax scale (latent attention)" if spec.latent else "Q/K std"
    return Recipe("critical", f"{knob} for beta = {beta:.3g} (< beta_c/2); attention skip "
                  f"{skip:.3f} (the given one if above alpha_c, else {ALPHA_MARGIN} alpha_c)", source, s)


def beta_c_floor(beta: float) -> float:
    """The beta_c a recommended beta came from (beta = BETA_MARGIN beta_c / 2)."""
    return 2 * beta / BETA_MARGIN


def dslm(spec: Spec, k: float, simplified: bool = False):
    """DeepScaleLM's init for this spec (004 sec. 3.5, App. M), from the spec's own input correlation."""
    return dslm_init(spec.layers, spec.d_model, spec.dropout, k=k, r0=input_correlation(spec),
                     n_embeddings=len(spec.embeddings), post_ln=spec.norm == "post", simplified=simplified,
                     d_ff=spec.d_ff)


def recipe_deepscalelm(spec: Spec, ds) -> Recipe:
    d, simplified = spec.d_model, ds.simplified
    lam, bet = math.sqrt(ds.lambda2), math.sqrt(ds.beta2)
    s = _with_init(spec, embedding=math.sqrt(ds.var_embd), q=math.sqrt(ds.var_qk), k=math.sqrt(ds.var_qk),
                   v=math.sqrt(ds.var_ffn), o=math.sqrt(ds.var_ffn), ff_in=math.sqrt(ds.var_ffn),
                   ff_out=math.sqrt(ds.var_ffn))
    s = replace(s, res_attention=Residual(lam, bet), res_mlp=Residual(lam, bet))
    per_layer = {} if simplified else {"g_v": ds.var_vo * d, "g_o": ds.var_vo * d}
    name = "deepscalelm-simplified" if simplified else "deepscalelm"
    zero = np.flatnonzero(~np.isfinite(ds.var_vo))
    undefined = "" if simplified or not zero.size else (
        f"the per-layer V/O variance sqrt((1-p)/r_l)/d is unbounded where the input correlation r_l is 0 "
        f"(block {zero[0] + 1}); use deepscalelm-simplified")
    return Recipe(name, "lambda^2 = 1 - k/N, beta^2 = k/N; sigma_e^2 = (1-p)/n_emb, sigma_qk^2 = 1/d, "
                  "sigma_f^2 = sqrt((1-p)/2)/d, V/O per layer sqrt((1-p)/r_l)/d",
                  "Kedia et al. 2024, sec. 3.5, App. M", s, per_layer, list(ds.caveats), undefined)


def recipe_gpt2(spec: Spec) -> Recipe:
    std = spec.init["ff_in"].std
    scaled = std / math.sqrt(2 * spec.layers)
    return Recipe("gpt2", "c_proj (attention output, MLP down projection) std = std / sqrt(2N)",
                  "Radford et al. 2019 (GPT-2), sec. 2.3", _with_init(spec, o=scaled, ff_out=scaled))


def recipe_deepnorm(spec: Spec) -> Recipe:
    N, d, f = spec.layers, spec.d_model, spec.d_ff
    a, b = (2 * N) ** 0.25, (8 * N) ** -0.25  # DeepNet Table/Fig. 2: encoder-only and decoder-only
    s = _with_init(spec, q=_xavier(d, d), k=_xavier(d, d), v=b * _xavier(d, d), o=b * _xavier(d, d),
                   ff_in=b * _xavier(d, f), ff_out=b * _xavier(f, d))
    s = replace(s, norm="post", embedding_norm=True, parallel_residual=False,
                res_attention=Residual(a, 1.0), res_mlp=Residual(a, 1.0))
    return Recipe("deepnorm", f"post-LN x = LN(alpha x + f(x)), alpha = (2N)^(1/4) = {a:.3f}; Xavier init with "
                  f"gain beta = (8N)^(-1/4) = {b:.3f} on V, O, FFN", "Wang et al. 2022 (DeepNet), sec. 3, Fig. 2", s)


def recipe_tfixup(spec: Spec) -> Recipe:
    N, d, f = spec.layers, spec.d_model, spec.d_ff
    scale = (9 * N) ** -0.25 if spec.causal else 0.67 * N**-0.25  # decoder vs encoder rule
    s = _with_init(spec, q=_xavier(d, d), k=_xavier(d, d), v=scale * _xavier(d, d), o=scale * _xavier(d, d),
                   ff_in=scale * _xavier(d, f), ff_out=scale * _xavier(f, d),
                   embedding=d**-0.5 * (9 * N) ** -0.25)
    s = replace(s, norm="none", embedding_norm=False, parallel_residual=False)
    rule = "(9N)^(-1/4)" if spec.causal else "0.67 N^(-1/4)"
    return Recipe("t-fixup", f"no LayerNorm; Xavier init, V, O, FFN scaled by {rule} = {scale:.3f}; embeddings "
                  "N(0, d^-1/2) scaled by (9N)^(-1/4)", "Huang et al. 2020 (T-Fixup), sec. 3.3", s)


def admin_spec(spec: Spec) -> Spec:
    """Admin's block: post-LN, embedding norm, sequential."""
    return replace(spec, norm="post", embedding_norm=True, parallel_residual=False)


def recipe_admin(spec: Spec, base: Trace | None = None) -> Recipe:
    """Post-LN with skip omega_i = sqrt(sum_{j<i} Var f_j): branch variances profiled by the engine on
    admin_spec's stack (`base`: its forward trace, when already run)."""
    from initadvisor.core.ops import MLP, Attention, Dropout

    s = admin_spec(spec)
    net = from_spec(s)
    base = propagate(net, backward=False) if base is None else base
    P = net.layers[0]
    att = Attention(P).moments(base.att_q, base.att_p)
    var_att = P.block_a**2 * Dropout(P.dropout).moments(att[0], att[1])[0]
    mlp = MLP(P).moments(1.0, 0.0)
    var_mlp = P.block_m**2 * Dropout(P.dropout).moments(mlp[0], mlp[1])[0] * np.ones_like(var_att)  # post-LN: q = 1
    q0 = net.embeddings.moments()[0]
    branch = np.column_stack([var_att, var_mlp]).ravel()  # sublayers in order: att 1, mlp 1, att 2, ...
    omega = np.sqrt(q0 + np.concatenate([[0.0], np.cumsum(branch)[:-1]]))
    return Recipe("admin", "post-LN x_i = LN(omega_i x + f_i(x)), omega_i^2 = Var(embeddings) + sum_{j<i} Var f_j",
                  "Liu et al. 2020 (Admin), sec. 4.2", s, {"skip_a": omega[0::2], "skip_m": omega[1::2]})


# ---------------------------------------------------------------------------------------------


def _summary(r: Recipe, a: Analysis | None, note: str = "") -> dict:
    """The recipe's row, from the analysis of its stack (None: undefined); `note`: how it was analysed, if not as
    `check` would."""
    if r.undefined:
        return {"name": r.name, "formula": r.formula, "source": r.source, "final_rho": None, "max_rho": None,
                "worst_beta_ratio": None, "grad_ratio": None, "grad_ratio_blocks": None, "verdict": "undefined",
                "findings": [], "notes": [r.undefined, *r.notes]}
    t, law = a.trace, a.growth["gradient"]
    findings = diagnose(r.spec, a)
    return {"name": r.name, "formula": r.formula, "source": r.source, "final_rho": _f(t.rho[-1]),
            "max_rho": _f(t.rho.max()), "worst_beta_ratio": _f(np.max(t.beta / t.beta_c)),
            "grad_ratio": _f(law["end_to_end"]), "grad_ratio_blocks": _f(law["blocks"]),
            "verdict": verdict(findings, "error"), "findings": sorted({f.code for f in findings}),
            "notes": [*r.notes, note] if note else r.notes}


def _f(x) -> float:
    return float(f"{float(x):.6g}")


def recommend(spec: Spec, rho_max: float = 0.99, k: float = 2.0, alpha_mlp: bool = False,
              progress: Progress | None = None) -> dict:
    """The `initadvisor.recommend/1` report; `progress(done, total)`: told after the spec's analysis, the solvers
    and each recipe's analysis."""
    k_caveat = []
    if k >= spec.layers:  # lambda^2 = 1 - k/N must stay positive
        k_caveat = [f"k = {k:g} is not below N = {spec.layers}: DeepScaleLM uses k = N/2 = {spec.layers / 2:g}"]
        k = spec.layers / 2
    given = Recipe("as-given", "the spec unchanged", spec.source or "", spec)
    stack = given.stack()
    total = 9  # the spec, the solvers (beta, alpha_c), seven recipes
    tell(progress, 0, total)
    first = analyse(spec, stack)
    tell(progress, 1, total)
    cells = resolved_cells(stack)
    resolve = cells <= RECIPE_CELLS  # else the recipes' rows on the late-token pair, the patched one confirmed
    pair_note = "" if resolve else (
        f"compared on the late-token pair: this spec's position-resolved analysis has {cells:.3g} cells, beyond "
        f"recommend's {RECIPE_CELLS:.0e} a recipe; the patched recipe is analysed as check analyses it")
    beta, bc = beta_recommendation(spec, first.trace)
    defined = not status(beta, positive=True)
    qk_std = spec.qk_std_for_beta(beta) if defined and spec.qk_norm == "none" and not spec.latent else None
    a_c, a_how = alpha_c(spec.with_beta(beta) if defined else spec, rho_max)
    a_m, a_m_how = alpha_c(spec, rho_max, "skip_m") if alpha_mlp else (None, "not requested (--alpha-mlp)")
    tell(progress, 2, total)
    ds, dss = dslm(spec, k), dslm(spec, k, simplified=True)
    recipes = [given, recipe_critical(spec, beta, a_c), recipe_deepscalelm(spec, ds), recipe_deepscalelm(spec, dss),
               recipe_gpt2(spec), recipe_deepnorm(spec), recipe_tfixup(spec),
               recipe_admin(spec, first.trace if admin_spec(spec) == spec else None)]
    analyses = [first]
    for r in recipes[1:]:
        analyses.append(None if r.undefined else analyse(r.spec, r.stack(), resolve))
        tell(progress, len(analyses) + 1, total)
    t = (first if analyses[1] is None else analyses[1]).trace  # an undefined critical recipe: the spec
    taus = G.balancing_tau(t.att_q, t.att_p / t.att_q, spec.seq_len, spec.d_model)
    tau = median(taus)
    tau_beta = tau / math.sqrt(math.log(spec.seq_len))
    rows = [_summary(r, a, "" if i == 0 or r.undefined else pair_note)
            for i, (r, a) in enumerate(zip(recipes, analyses))]
    patched, chosen = _patched(recipes, rows)
    confirmed = {r.name for r in recipes} if resolve else {"as-given"}
    while chosen not in confirmed:  # only where the rows are the late-token pair's: the patched recipe as check runs it
        i = next(i for i, r in enumerate(recipes) if r.name == chosen)
        analyses[i] = analyse(recipes[i].spec, recipes[i].stack())
        rows[i] = _summary(recipes[i], analyses[i])
        confirmed.add(chosen)
        patched, chosen = _patched(recipes, rows)
    rep = {
        "schema": "initadvisor.recommend/1",
        "spec": spec.to_dict(),
        "beta": _f(spec_beta(spec)),
        "beta_c": _f(bc.min()), "beta_c_per_layer": [_f(x) for x in bc], "binding_layer": int(np.argmin(bc)) + 1,
        "beta_recommended": _f(beta), "beta_margin": BETA_MARGIN, "qk_std": None if qk_std is None else _f(qk_std),
        "alpha_c": None if a_c is None else _f(a_c), "alpha_c_how": a_how,
        "alpha_c_mlp": None if a_m is None else _f(a_m), "alpha_c_mlp_how": a_m_how, "rho_max": rho_max,
        "tau": _f(tau), "tau_per_layer": [_f(x) for x in taus], "tau_beta": _f(tau_beta),
        "tau_note": ("eq. 47 assumes uniform attention; its tau corresponds to beta = "
                     f"{show(tau_beta, '.3f')}" + (f" >= beta_c/2 = {show(bc.min() / 2, '.3f')}: it would leave the "
                                                  "uniform phase, keep beta_recommended"
                                                  if tau_beta >= bc.min() / 2 else "")),
        "deepscalelm": {
            "k": k, "lambda2": _f(ds.lambda2), "beta2": _f(ds.beta2), "sigma_e2": _f(ds.var_embd),
            "sigma_f2": _f(ds.var_ffn), "sigma_qk2": _f(ds.var_qk),
            "sigma_vo2_per_layer": [_f(x) for x in ds.var_vo], "corr_per_layer": [_f(x) for x in ds.corr_in],
            "simplified": {"sigma_vo2": _f(dss.var_ffn), "sigma_f2": _f(dss.var_ffn)},
            "caveats": k_caveat + list(ds.caveats),
        },
        "recipes": rows,
        "patched_recipe": chosen,
        "patched_spec": patched,
        "init_weights": render(build_spec(patched)),
        "residual_instructions": residual_instructions(build_spec(patched)),
    }
    rep, bad = clean(rep)
    rep["findings"] = [asdict(f) for f in overflow_findings(bad)]
    return rep


def _patched(recipes: list[Recipe], rows: list[dict]) -> tuple[dict, str]:
    """The first passing recipe in PATCH_ORDER that the spec format can express: no per-layer values, and
    every number inside the spec's ranges (so `check` accepts the patched file)."""
    by_name = {r.name: (r, row) for r, row in zip(recipes, rows)}
    for name in PATCH_ORDER:
        r, row = by_name[name]
        if not r.per_layer and row["verdict"] == "pass" and _expressible(r.spec):
            return r.spec.to_dict(), name
    return recipes[0].spec.to_dict(), "as-given"


def _expressible(spec: Spec) -> bool:
    try:
        build_spec(spec.to_dict())
    except SpecError:
        return False
    return True
