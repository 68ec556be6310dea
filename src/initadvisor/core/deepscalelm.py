"""DeepScaleLM moment propagation (Kedia et al. 2024, paper 004) and the DeepScaleLM init.

Every component maps the moments of its input (mean, variance, correlation r^l between two tokens at
the same hidden index) to those of its output, and the moments of the gradient w.r.t. its output
(`grad_var_out`, `grad_corr_out`; gradient mean 0 by assumption, 004 App. A) to those of the gradient
w.r.t. its input. Formulas are the full closed forms of 004 App. A-C as rebuilt in the digest
`shared/theory/004_deepscalelm.md` (cited as "digest §x"), with its corrections. All functions
accept numpy arrays and broadcast.

Assumptions (004 App. A, L.2): Gaussian inputs equicorrelated along the sequence, independent along
the hidden dimension; i.i.d. zero-mean Gaussian weights; large L and d for LayerNorm, softmax and
attention; attention gradients flow through V only (the Q/K path is ignored).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = [
    "Moments", "embeddings", "token_corr", "segment_corr", "linear", "relu", "gelu", "layernorm",
    "dropout", "softmax", "single_head_attention", "attention_block", "ffn_block",
    "corr_input_layerwise", "DSLMInit", "dslm_init",
]

_PI = np.pi


@dataclass(frozen=True)
class Moments:
    """Per-element moments of an activation and of the loss gradient w.r.t. it.

    corr / grad_corr: correlation between two different tokens at the same hidden index (r^l).
    For a component's output, (mean, var, corr) describe its output and (grad_var, grad_corr) the
    gradient w.r.t. its input. NaN marks a moment the paper does not model.
    """

    mean: float | np.ndarray = 0.0
    var: float | np.ndarray = 1.0
    corr: float | np.ndarray = 0.0
    grad_var: float | np.ndarray = 1.0
    grad_corr: float | np.ndarray = 0.0

    @property
    def cov(self):
        """Cov^l = r^l * variance, the quantity tabulated in 004 Table 18."""
        return self.corr * self.var

    @property
    def grad_cov(self):
        """Cov^l of the input gradient (004 Table 20)."""
        return self.grad_corr * self.grad_var


def _require_zero_mean(x: Moments, what: str) -> None:
    if np.any(np.asarray(x.mean) != 0):
        raise ValueError(f"{what}: the closed form assumes a zero-mean input (004 App. A)")


# ---------------------------------------------------------------------------------------------
# Embeddings (004 A.1, digest §1.1, §5)


def token_corr(vocab_size, exact: bool = False):
    """r^l of Zipf-distributed token-embedding lookups.

    Default: the paper's closed form pi^2 / (6 ln^2 |V|) (drops Euler's gamma and the -1).
    exact=True: sum_i p_i^2 with p_i = 1/(i H_|V|), the exact expectation of
    sum_i N_i(N_i-1) / (L(L-1)) when the L tokens are drawn i.i.d. (independent of L).
    """
    if not exact:
        return _PI**2 / (6.0 * np.log(vocab_size) ** 2)  # 004 A.1, final approximation (digest §5)

    def one(v):
        inv = 1.0 / np.arange(1, int(v) + 1, dtype=np.float64)
        p = inv / inv.sum()  # Zipf p_i = c / i (004 A.1)
        return float(np.sum(p * p))  # E[sum N_i(N_i-1)] / (L(L-1)) under multinomial sampling [derived]

    return np.vectorize(one, otypes=[np.float64])(vocab_size)


def segment_corr(seq_len, exact: bool = False):
    """r^l of a 2-segment token-type embedding with the split point uniform on [0, L] (004 A.1)."""
    if not exact:
        return 2.0 / 3.0 + 0.0 * np.asarray(seq_len, dtype=np.float64)  # 004 A.1, large-L value
    L = np.asarray(seq_len, dtype=np.float64)
    return (2.0 / 3.0 * L**2 - L) / (L * (L - 1.0))  # 004 A.1: E[N1^2 + N2^2] = 2L^2/3


def embeddings(vocab_size, seq_len, var_embd, *, segment: bool = True, position: bool = True,
               exact: bool = False) -> Moments:
    """Sum of token (+ segment) (+ learned position) embeddings, each table with variance var_embd.

    BERT (all three, exact=False) gives the paper's r = pi^2 / (18 ln^2 |V|) + 2/9 (0.227 for
    |V| = 32000, L = 256). The embedding output has no input gradient: grad fields are NaN.
    """
    n_tables = 1 + int(segment) + int(position)
    r = token_corr(vocab_size, exact)
    if segment:
        r = r + segment_corr(seq_len, exact)
    # position embeddings are unique per token: r^l = 0 (004 A.1); equal-variance tables average
    r = r / n_tables  # 004 A.1 "Final model input", Table 18 row Embeddings
    var = n_tables * np.asarray(var_embd, dtype=np.float64)  # 004 A.1: 3 sigma^2_w_embd for BERT
    nan = np.full(np.shape(var), np.nan)
    return Moments(mean=0.0 * var, var=var, corr=r + 0.0 * var, grad_var=nan, grad_corr=nan)


# ---------------------------------------------------------------------------------------------
# Components (004 App. A, Tables 15-20)


def linear(x: Moments, d_in, d_out, var_w, *, grad_var_out=1.0, grad_corr_out=0.0) -> Moments:
    """Linear d_in -> d_out without bias, weights i.i.d. N(0, var_w)."""
    second = x.var + x.mean**2
    var = d_in * second * var_w  # 004 A.2, Table 16
    corr = (x.corr * x.var + x.mean**2) / second  # 004 A.2; Cov^l = d_in var_w (Cov + mu^2), Table 18
    grad_var = d_out * grad_var_out * var_w  # 004 A.2, Table 17
    grad_corr = grad_corr_out + 0.0 * grad_var  # 004 A.2, Table 20: Cov^l_g = d_out var_w Cov^l_g_out
    return Moments(mean=0.0 * var, var=var, corr=corr, grad_var=grad_var, grad_corr=grad_corr)


def relu_corr(r, approx: bool = False):
    """ReLU output correlation for a zero-mean Gaussian input with correlation r."""
    r = np.asarray(r, dtype=np.float64)
    if approx:
        return 0.7 * r + 0.3 * r**2  # 004 Table 1 polynomial fit (App. L.1)
    return (_PI * r / 2 + r * np.arcsin(r) + np.sqrt(1 - r**2) - 1) / (_PI - 1)  # 004 A.4 final line


def relu(x: Moments, *, grad_var_out=1.0, grad_corr_out=0.0, approx: bool = False) -> Moments:
    """ReLU of a zero-mean Gaussian. approx=True uses the Table 1 fit 0.7 r + 0.3 r^2 for r^l."""
    _require_zero_mean(x, "relu")
    mean = np.sqrt(x.var / (2 * _PI))  # 004 A.4 Eq. 1, Table 15
    var = x.var * (_PI - 1) / (2 * _PI)  # 004 A.4, Table 16
    corr = relu_corr(x.corr, approx)  # 004 A.4 (full) or Table 1 (approx)
    grad_var = grad_var_out / 2 + 0.0 * var  # 004 A.4 backward, Table 17
    grad_corr = (0.5 + np.arcsin(x.corr) / _PI) * grad_corr_out  # 004 A.4, Table 20: P(x>0,y>0) = 1/4 + asin(r)/(2 pi)
    return Moments(mean=mean, var=var, corr=corr, grad_var=grad_var, grad_corr=grad_corr)


def gelu(x: Moments, *, grad_var_out=1.0, grad_corr_out=0.0) -> Moments:
    """Exact GeLU x Phi(x) of a zero-mean Gaussian (all five closed forms of 004 A.5)."""
    _require_zero_mean(x, "gelu")
    s2, r = np.asarray(x.var, dtype=np.float64), np.asarray(x.corr, dtype=np.float64)
    a = s2 / (1 + s2)
    mean = s2 / np.sqrt(2 * _PI * (s2 + 1))  # 004 A.5, Table 15
    var = s2 / (2 * _PI) * (_PI / 2 - a + np.arcsin(a) + 2 * s2 / ((1 + s2) * np.sqrt(1 + 2 * s2)))  # 004 A.5, Table 16
    rs = r * s2
    cov = s2 / (4 * _PI) * (_PI * r + 2 * r * np.arcsin(rs / (s2 + 1))  # 004 A.5 forward, Table 18
                            + 2 * s2 * (s2 * (1 - r**2) + 1 + r**2) / ((s2 + 1) * np.sqrt((s2 + 1) ** 2 - rs**2))
                            - 2 * s2 / (s2 + 1))
    g2 = 0.25 + np.arcsin(a) / (2 * _PI) + s2 * (5 * s2 + 3) / (2 * _PI * (s2 + 1) * (2 * s2 + 1) ** 1.5)  # 004 A.5 backward, Table 17
    gg = (0.25 + np.arcsin(rs / (s2 + 1)) / (2 * _PI)  # 004 A.5 backward, Table 20
          + rs * ((2 * s2 + 3) * (s2 + 1) - 2 * rs**2) / (2 * _PI * (s2 + 1) * ((s2 + 1) ** 2 - rs**2) ** 1.5))
    return Moments(mean=mean, var=var, corr=cov / var, grad_var=g2 * grad_var_out,
                   grad_corr=gg / g2 * grad_corr_out)


def layernorm(x: Moments, d, *, grad_var_out=1.0, grad_corr_out=0.0) -> Moments:
    """LayerNorm over d hidden units at init (gain 1, bias 0); the input mean is removed."""
    var = 1.0 + 0.0 * np.asarray(x.var, dtype=np.float64)  # 004 A.6, Table 16 (exact)
    corr = x.corr * (1 - 1 / np.asarray(d, dtype=np.float64))  # 004 A.6, Table 18: (1 - 1/d) Cov / sigma^2
    grad_var = grad_var_out / x.var  # 004 A.6 backward (Xu et al. 2019 Eq. 17), Table 17
    grad_corr = grad_corr_out + 0.0 * grad_var  # 004 A.6, Table 20: Cov^l_g / sigma^2_x_in
    return Moments(mean=0.0 * var, var=var, corr=corr, grad_var=grad_var, grad_corr=grad_corr)


def dropout(x: Moments, p, *, grad_var_out=1.0, grad_corr_out=0.0) -> Moments:
    """Inverted dropout (kept units scaled by 1/(1-p)) in training mode."""
    denom = x.var + p * x.mean**2
    var = denom / (1 - p)  # 004 A.3, Table 16
    corr = x.corr * x.var * (1 - p) / denom  # 004 A.3; Cov^l unchanged, Table 18
    grad_var = grad_var_out / (1 - p) + 0.0 * var  # 004 A.3, Table 17
    grad_corr = (1 - p) * grad_corr_out + 0.0 * var  # 004 A.3, Table 20: Cov^l_g unchanged
    return Moments(mean=x.mean + 0.0 * var, var=var, corr=corr, grad_var=grad_var, grad_corr=grad_corr)


def softmax(x: Moments, seq_len, *, grad_var_out=1.0, grad_corr_out=0.0, approx: bool = False) -> Moments:
    """Softmax over seq_len logits with variance x.var and pairwise correlation x.corr (one row).

    approx=True gives the Table 1 forms. grad_corr_out is the correlation of the output gradient
    along the row; the (1 - grad_corr_out) factor is derived here (the common part of g is projected
    out by the Jacobian) and is 1 in the paper's setting r_g = 0. The output correlations are not
    modelled (Table 21 '-'): NaN.
    """
    s2, r, L = (np.asarray(v, dtype=np.float64) for v in (x.var, x.corr, seq_len))
    if approx:
        e = np.exp((1 - r) * s2)
        var = (e - 1) / L**2  # 004 A.7, Table 1
        grad_var = grad_var_out * e / L**2  # 004 A.7, Table 1
    else:
        sz2 = s2 * (1 - r) * L / (L - 1)  # 004 A.7: log-normal sigma_z^2 (Lo 2013)
        s_plus = (L - 1) * np.exp(s2 * (1 - r)) + 1  # 004 A.7: S_+ = E[sum_j e^{y_j}]
        var = (np.exp(sz2) - 1) * np.exp(2 * sz2) / s_plus**2  # 004 A.7 full variance, Table 16
        grad_var = grad_var_out * (var + 1 / L**2)  # 004 Table 17, softmax.py "V2" (J ~ diag(x_out))
    grad_var = grad_var * (1 - np.asarray(grad_corr_out, dtype=np.float64))  # [derived] J removes g's common part
    nan = np.full(np.shape(var), np.nan)
    return Moments(mean=1 / L + 0.0 * var, var=var, corr=nan, grad_var=grad_var, grad_corr=nan)


def single_head_attention(x: Moments, d_in, d_v, var_q, var_k, var_v, seq_len, p=0.0, *,
                          grad_var_out=1.0, grad_corr_out=0.0) -> Moments:
    """Dropout(Softmax(X W_Q W_K^T X^T / sqrt(d_k))) X W_V over seq_len tokens (004 A.8).

    var_q, var_k, var_v: per-entry variances of W_Q, W_K, W_V (d_k cancels in the logits).
    d_v: output width of W_V; for multi-head attention pass the total width (heads summed) since the
    value-path gradients of the heads add. p: dropout on the attention probabilities.
    The backward is the value path only (Q/K path ignored, as in the paper).
    """
    _require_zero_mean(x, "single_head_attention")
    s2, r, L = (np.asarray(v, dtype=np.float64) for v in (x.var, x.corr, seq_len))
    gain_v = d_in * var_v  # Linear rule applied to the V projection (004 A.8 "with W_V")
    sw2 = d_in * s2 * var_q * var_k  # 004 A.8: sigma_w^2 of W = X W_Q W_K^T / sqrt(d_k)
    var = gain_v * (r * s2 + ((1 - r) ** 2 * (L - 1) * sw2 * s2**2  # 004 A.8 full variance (SHA.py)
                              + np.exp((1 - r) * d_in * sw2 * s2) / (1 - p)
                              * (4 * (1 - r) ** 2 * sw2 * s2**2 + (1 - r) * s2)) / L)
    cov = gain_v * (r * s2 + (2 * (1 - r) ** 2 * d_in * var_q * var_k * s2**3 + (1 - r) * s2) / L)  # 004 A.8, Table 18
    rg = np.asarray(grad_corr_out, dtype=np.float64)
    gscale = d_v * var_v * grad_var_out / L
    grad_var = gscale * (1 + (L - 1) * rg * (1 - p)) / (1 - p)  # 004 A.8 / SHA.py: (1-p), not Table 17's (1-p)^2
    grad_cov = gscale * (1 + (L - 1) * rg)  # 004 A.8, Table 20
    return Moments(mean=0.0 * var, var=var, corr=cov / var, grad_var=grad_var, grad_corr=grad_cov / grad_var)


# ---------------------------------------------------------------------------------------------
# Blocks (004 App. B, Table 2): compositions of the components above (digest §2.1)

Stage = Callable[[Moments, object, object], Moments]


def _compose(x: Moments, stages: list[Stage], grad_var_out, grad_corr_out) -> Moments:
    """Run stages forward, then their backward formulas in reverse order."""
    inputs = [x]
    for f in stages:
        inputs.append(f(inputs[-1], 1.0, 0.0))
    gv, gc = grad_var_out, grad_corr_out
    for f, xin in zip(reversed(stages), reversed(inputs[:-1])):
        m = f(xin, gv, gc)
        gv, gc = m.grad_var, m.grad_corr
    out = inputs[-1]
    return Moments(mean=out.mean, var=out.var, corr=out.corr, grad_var=gv, grad_corr=gc)


def attention_block(x: Moments, d, var_q, var_k, var_v, var_o, seq_len, p=0.0, *, attn_p=None,
                    norm_first: bool = True, grad_var_out=1.0, grad_corr_out=0.0) -> Moments:
    """[LayerNorm] -> multi-head attention (any head count) -> W_O (d -> d) -> Dropout(p).

    norm_first=True is the Pre-LN block (x = residual stream); False is the Post-LN block, whose input
    is already normalised. attn_p: dropout on attention probabilities (default p).
    The backward composes the components, so the output dropout lowers r_g before the value
    averaging: r_g (1-p)^2 in the bracket, not Table 17's (1-p) (digest §2.1 MC caveat).
    """
    attn_p = p if attn_p is None else attn_p
    stages: list[Stage] = [
        lambda m, gv, gc: single_head_attention(m, d, d, var_q, var_k, var_v, seq_len, attn_p,
                                                grad_var_out=gv, grad_corr_out=gc),  # 004 A.8 / B.1
        lambda m, gv, gc: linear(m, d, d, var_o, grad_var_out=gv, grad_corr_out=gc),  # W_O, 004 A.2
        lambda m, gv, gc: dropout(m, p, grad_var_out=gv, grad_corr_out=gc),  # 004 A.3
    ]
    if norm_first:
        stages.insert(0, lambda m, gv, gc: layernorm(m, d, grad_var_out=gv, grad_corr_out=gc))  # 004 A.6
    return _compose(x, stages, grad_var_out, grad_corr_out)


def ffn_block(x: Moments, d, var_w1, var_w2, p=0.0, *, d_ff=None, activation: str = "relu",
              norm_first: bool = True, grad_var_out=1.0, grad_corr_out=0.0) -> Moments:
    """[LayerNorm] -> Linear d -> d_ff (default 4d) -> ReLU/GeLU -> Linear d_ff -> d -> Dropout(p).

    With ReLU, d_ff = 4d and unit input this is 004 B.2: var 2 d^2 var_w1 var_w2 / (1-p) and
    r = (1-p)(r + (sqrt(1-r^2) - r acos r)/pi) (Table 18 with the 4d^2 prefactor, digest §2.1).
    """
    d_ff = 4 * d if d_ff is None else d_ff
    acts = {"relu": relu, "gelu": gelu}
    if activation not in acts:
        raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
    act = acts[activation]
    stages: list[Stage] = [
        lambda m, gv, gc: linear(m, d, d_ff, var_w1, grad_var_out=gv, grad_corr_out=gc),  # 004 A.2
        lambda m, gv, gc: act(m, grad_var_out=gv, grad_corr_out=gc),  # 004 A.4 / A.5
        lambda m, gv, gc: linear(m, d_ff, d, var_w2, grad_var_out=gv, grad_corr_out=gc),  # 004 A.2
        lambda m, gv, gc: dropout(m, p, grad_var_out=gv, grad_corr_out=gc),  # 004 A.3
    ]
    if norm_first:
        stages.insert(0, lambda m, gv, gc: layernorm(m, d, grad_var_out=gv, grad_corr_out=gc))  # 004 A.6
    return _compose(x, stages, grad_var_out, grad_corr_out)


# ---------------------------------------------------------------------------------------------
# DeepScaleLM initialisation (004 §3.5, App. M; digest §4)


def corr_input_layerwise(r0, n_layers: int, dropout: float, lambda2: float, beta2: float,
                         embedding_dropout: bool = True) -> np.ndarray:
    """r^l entering each layer of a DSLM Pre-LN model, then after the last layer (length N + 1).

    Authors' `sigma_attn_v_out`: start at r0 (1-p) (embedding dropout), mix each block's output
    correlation into the skip, weighted by variance (block variance 1; digest §2.2, §4.3).
    Equals App. M's pseudocode when lambda2 + beta2 = 1.
    """
    r = r0 * (1 - dropout) if embedding_dropout else r0  # 004 A.3 applied to the embeddings (code)
    s = 1.0  # skip variance
    out = [r]
    for _ in range(n_layers):
        # attention block output correlation is 1 - p (004 Table 2, App. F)
        r = (lambda2 * r * s + beta2 * (1 - dropout)) / (lambda2 * s + beta2)  # 004 App. M Fig. 15, line 1
        s = lambda2 * s + beta2
        r_ffn = (1 - dropout) * (r + (np.sqrt(1 - r**2) - r * np.arccos(r)) / _PI)  # 004 App. M / B.2 full FFN corr
        r = (lambda2 * r * s + beta2 * r_ffn) / (lambda2 * s + beta2)  # 004 App. M Fig. 15, line 2
        s = lambda2 * s + beta2
        out.append(r)
    return np.array(out)


@dataclass(frozen=True)
class DSLMInit:
    """DeepScaleLM residual scales and per-entry weight variances (std = sqrt of the variance)."""

    lambda2: float  # skip scale^2: x <- lambda x + beta f(x)
    beta2: float  # block scale^2
    var_embd: float  # each embedding table
    var_qk: float  # each of W_Q and W_K (per matrix, not the product)
    var_ffn: float  # W_1 and W_2 of the FFN
    var_vo: np.ndarray  # W_V and W_O of layer n (index n-1), length N
    corr_in: np.ndarray  # r^l entering layer n (index n-1), then after the last layer: length N + 1
    simplified: bool
    post_ln: bool
    gradient_bound_proven: bool  # False for Post-LN with beta2 > k / N^2 (004 §3.5, App. E.6)
    caveats: tuple[str, ...]


def dslm_init(n_layers: int, d: int, dropout: float, k: float = 2.0, r0: float = 0.221,
              n_embeddings: int = 3, post_ln: bool = False, simplified: bool = False,
              beta2: float | None = None, d_ff: int | None = None) -> DSLMInit:
    """DeepScaleLM init for an N-layer, width-d model with dropout p (004 §3.5, App. M).

    r0: input correlation before embedding dropout (authors' code uses the measured 0.221; the Zipf
    closed form `embeddings(...).corr` gives 0.227 for |V| = 32000, L = 256). beta2 overrides k/N.
    simplified=True: V and O use the FFN variance (004 App. M Fig. 14).
    """
    N, p = int(n_layers), float(dropout)
    beta2 = k / N if beta2 is None else float(beta2)  # 004 §3.5: beta^2 = k/N, k = 2
    lambda2 = 1.0 - beta2  # 004 §3.5: lambda^2 + beta^2 = 1
    var_embd = (1 - p) / n_embeddings  # 004 §3.5 item 1, App. M
    var_qk = 1.0 / d  # 004 §3.5 item 3, App. M (per matrix; code std sqrt(1/d))
    d_ff = 4 * d if d_ff is None else d_ff
    # 004 App. M: (1/d) sqrt((1-p)/2) for d_ff = 4d (not sqrt(1-p)/(2d)); C2 = d d_ff sigma_f^4 / (2(1-p)) = 1 generally
    var_ffn = np.sqrt(2 * (1 - p) / (d * d_ff))
    corr = corr_input_layerwise(r0, N, p, lambda2, beta2)
    if simplified:
        var_vo = np.full(N, var_ffn)  # 004 App. M Fig. 14: v_proj, out_proj use sigma_f
    else:
        with np.errstate(divide="ignore"):  # r = 0: unbounded (inf), reported as undefined by recommend
            var_vo = np.sqrt((1 - p) / corr[:-1]) / d  # 004 App. M Fig. 15: C1 r^{l,n} = 1 per layer
    caveats = []
    bound = k / N**2
    proven = not (post_ln and beta2 > bound * (1 + 1e-12))
    if not proven:
        caveats.append(f"Post-LN: beta^2 = {beta2:.4g} > k/N^2 = {bound:.4g}; the backward-gradient bound "
                       "is only proven for beta^2 <= k/N^2 (004 §3.5, App. E.6); the paper trains with "
                       "beta^2 = 2/N in practice")
    return DSLMInit(lambda2=lambda2, beta2=beta2, var_embd=var_embd, var_qk=var_qk, var_ffn=float(var_ffn),
                    var_vo=var_vo, corr_in=corr, simplified=simplified, post_ln=post_ln,
                    gradient_bound_proven=proven, caveats=tuple(caveats))
