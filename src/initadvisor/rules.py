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
    Rule("IA103", "forward-variance", "error", "Forward variance explodes or dies",
         "The residual stream's second moment changes by more than the threshold from block 1 to the last block: "
         "without normalisation (or with residual gains above 1) it grows or decays exponentially with depth "
         "and activations overflow or vanish in floating point.",
         "q_L / q_1 from the forward recurrence (moments are clamped at 1e250 to stay finite)",
         "Kedia et al. 2024, App. E.1 (eq. 2); Giorlandino & Goldt 2025, eq. 15", "thresholds.forward_ratio_max [1e6]",
         "Use pre- or post-LN, or scale residual branches (DeepScaleLM lambda^2 + beta^2 = 1)."),
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
    Rule("IA301", "exploding-gradient", "error", "Exploding gradients towards the input",
         "The loss gradient's second moment grows from the top of the stack to the input beyond the threshold: "
         "Pre-LN grows hyperbolically (q_L / q_l)^C, Post-LN exponentially C5^(L - l).",
         "grad_q[1] / grad_q[L] (through the blocks) from the backward moment recurrence", "Kedia et al. 2024, App. E.1.2, E.2 (eq. 3)",
         "thresholds.grad_explode [1e3]",
         "Scale residual branches (DeepScaleLM lambda/beta, GPT-2's 1/sqrt(2N)), see `initadvisor recommend`."),
    Rule("IA302", "vanishing-gradient", "error", "Vanishing gradients towards the input",
         "The loss gradient's second moment shrinks from the top of the stack to the input below the threshold "
         "(Post-LN's exponential decay C5^(L - l) with C5 < 1).",
         "grad_q[1] / grad_q[L]", "Kedia et al. 2024, App. E.2 (eq. 3)", "thresholds.grad_vanish [1e-3]",
         "Use pre-LN or DeepScaleLM/DeepNorm scaling; see `initadvisor recommend`."),
    Rule("IA303", "qk-gradient-vanishing", "warning", "Vanishing query/key gradients",
         "Query/key gradients are negligible against value gradients at some block: correlated tokens "
         "(rho -> 1) and a small score scale starve attention's Q/K of signal, so attention cannot learn.",
         "E||dS/dW_Q||^2 / E||dS/dW_V||^2 = tau^2 sigma_x^4 (n-1)(1-rho)^2 (n+d) / (d n (1 + rho (n-1)))",
         "Noci et al. 2022, eqs. 17, 18, 46", "thresholds.qk_grad_ratio_min [1e-4]",
         "Avoid rank collapse (IA101), or temper the softmax with tau (Noci eq. 47), see `initadvisor recommend`."),
    Rule("IA304", "qk-gradient-uniform-phase", "info", "Q/K gradients suppressed by uniform attention",
         "In the uniform attention phase (beta < beta_c / 2) the query/key gradient carries the softmax "
         "Jacobian's trace E tr(M^2) ~ Y2 ~ 1/T: small at initialisation, restored once skip connections move "
         "the tokens (001 sec. 3.3).",
         "T/(d^2 sqrt(ln T)) E||dL/dW_Q||^2 = C beta sigma_v^2 q (q-p)^2 [Y2 - 2 Y3 + E Y2^2]",
         "Giorlandino & Goldt 2025, Result 2 (eq. 13, trace corrected)", "beta < beta_c / 2 at block 1",
         "None needed with skip connections; a larger beta up to beta_c / 2 raises it."),
    Rule("IA401", "width-rank-collapse", "info", "Rank collapse in width",
         "A softmax attention matrix at init is a rank-one outlier (singular value ~1, along the all-ones "
         "direction) over a bulk of order sqrt((e^V - 1) / T), so one attention layer's output has stable rank "
         "near 1 at long contexts; skip connections carry the rank, removing the outlier (A - 11^T/T) restores it.",
         "stable rank ||A X||_F^2 / ||A X||_2^2 vs the centered (A - 11^T/T) X; collapsed below 10% of it",
         "Naderi, Nait Saada & Tanner 2025 (Mind the Gap), Thm. 1, 2, Prop. 3", "stable rank < 0.1 x centered",
         "Use centered (gain-controlled) attention, model.attention: centered; keep the attention skip."),
    Rule("IA901", "causal-positions", "info", "Causal model: position-resolved geometry",
         "Token m of a causal model averages over m keys, so early tokens stay less correlated than late ones; "
         "the tool propagates per-position overlaps, judges collapse on the late third of positions, and takes "
         "the attention phase and gradients from the late-token (q, p) pair.",
         "per-position overlaps through causal REM rows at m keys; attention-output variance ~ 1/m (003 Lemma 3)",
         "Giorlandino & Goldt 2025, C.6; Chi et al. 2023, Lemma 3", "causal: true",
         "None needed; read the `causal` object of the JSON report."),
]}
