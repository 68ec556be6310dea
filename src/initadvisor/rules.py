"""The rule registry: every finding's stable code, severity, meaning, formula, source and fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: str  # error | warning | info
    title: str
    meaning: str
    formula: str
    source: str
    threshold: str  # the spec `thresholds` key (or a fixed criterion)
    fix: str


RULES: dict[str, Rule] = {r.code: r for r in [
    Rule("IA101", "rank-collapse", "error", "Rank collapse",
         "Token representations converge to one direction: the mean cosine similarity rho between tokens reaches "
         "the collapse threshold at some layer, so attention has nothing to distinguish and Q/K gradients vanish.",
         "rho_l = p_l / q_l from the (q, p) recurrence (001 Algorithms 1-3, eqs. 14-17)",
         "Giorlandino & Goldt 2025, Result 1, eqs. 11, 14-17", "thresholds.rank_collapse_rho [0.99]",
         "Strengthen the attention skip (alpha_SA >= alpha_c, see `initadvisor recommend`), use pre-LN, "
         "centered attention, or fewer layers."),
    Rule("IA102", "collapse-trend", "warning", "Collapse trend",
         "The final layer's rho is high: deeper variants of this model, or training, will push it into collapse.",
         "rho_L >= threshold", "Giorlandino & Goldt 2025, eqs. 14-17", "thresholds.collapse_trend_rho [0.9]",
         "As for IA101: a stronger attention skip or centered attention."),
    Rule("IA201", "entropy-collapse", "error", "Entropy collapse",
         "The query/key scale beta is at or above the critical beta_c of the layer's input geometry: attention "
         "rows condense on a few random tokens (localized REM phase) and training is unstable.",
         "beta >= beta_c(q, p) = sqrt(2 / (q (q - p))); IPR Y2 = 1 - beta_c / beta",
         "Giorlandino & Goldt 2025, Result 1, eq. 12", "beta / beta_c >= 1",
         "Lower the Q/K init std (or init.qk_beta) below beta_c / 2, see `initadvisor recommend`."),
    Rule("IA202", "finite-size-crossover", "warning", "Finite-size crossover",
         "beta lies between beta_c/2 and beta_c: at finite sequence length the softmax partition function is "
         "no longer Gaussian and attention is partly localized; the asymptotic laws are not sharp here.",
         "beta_c / 2 <= beta < beta_c", "Giorlandino & Goldt 2025, sec. 3.2 and B.3", "beta / beta_c >= 0.5",
         "Lower the Q/K init std below beta_c / 2."),
    Rule("IA901", "causal-late-token", "info", "Causal model: late-token approximation",
         "For causal attention the single (q, p) pair describes late tokens only; early tokens average over "
         "few keys and follow other laws.", "late-token simplex approximation", "Giorlandino & Goldt 2025, C.6",
         "causal: true", "None needed; read per-position results where available."),
]}
