"""The step-0 loss: the size of the logits at initialisation and the expected cross-entropy they give.

Logit v of one token is z_v = w_v . h (+ b_v), w_v the head's row v (i.i.d. N(0, std^2)) and h the final
hidden state, so given h the V logits are i.i.d. N(0, s^2) with s^2 = |h|^2 std^2 + bias_std^2, |h|^2 = d after a
unit-gain final norm (d q_L without one). With a tied head, w_v is the token embedding e_v and h still carries the
current token's own embedding, so that one logit has a mean: mu = s sqrt(d f), f the own embedding's share of
the final stream's second moment. Soft-capping maps each logit through c tanh(z / c).

For a random target y the expected cross-entropy is E ln sum_v e^{z_v} - E z_y. The first term is computed
exactly from the logits' distribution by Frullani's integral

    E ln S = int_R [exp(-e^u) - E exp(-e^u S)] du,   E exp(-e^u S) = prod_v E exp(-e^{u + z_v})

(ln S = int_0^inf (e^{-t} - e^{-tS}) dt / t, t = e^u; the V logits are independent), one 1-D quadrature over u
of a 1-D expectation per logit distribution: Gauss-Hermite nodes for narrow logits (s <= 1), bins of exact
probabilities on the u grid (a discrete correlation) for wide ones. No series in s, so it holds for any s and V
(ln V + s^2/2 - (e^{s^2} - 1)/(2V) for small s, the expected maximum of V Gaussians for large s).
"""

from __future__ import annotations

import math

import numpy as np

from initadvisor.core.kernels import gauss_hermite

_SPAN = 10.0  # logits beyond 10 std: probability 1e-23, below what V <= 1e9 logits can see
_MAX_BINS = 4000  # bins per logit distribution at most (the bin width grows for very wide logits)
_MAX_U = 50_000  # u grid points at most (far-apart logits, e.g. an own logit 10^6 above the rest)


def _capped(z, cap: float | None):
    if cap is None:
        return z
    with np.errstate(over="ignore"):
        return cap * np.tanh(np.asarray(z) / cap)


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def _ndtr(z) -> np.ndarray:
    """The standard normal CDF, accurate in either tail (math.erfc: scipy.special would cost 0.2 s of start-up)."""
    return 0.5 * _ERFC(-np.asarray(z, dtype=float) / math.sqrt(2.0)).astype(float)


def _g(w):
    """1 - exp(-e^w), the step each logit contributes to 1 - E exp(-e^u S)."""
    with np.errstate(over="ignore"):
        return -np.expm1(-np.exp(w))


class _Logit:
    """One logit's distribution: c tanh(N(mean, std^2) / c) (no cap: N(mean, std^2))."""

    def __init__(self, mean: float, std: float, cap: float | None):
        self.mean, self.std, self.cap = float(mean), float(std), cap

    @property
    def smooth(self) -> bool:
        """Narrow enough for Gauss-Hermite nodes: std <= 1 and a cap that does not bend it sharply."""
        return self.std <= 1.0 and (self.cap is None or self.cap >= 2 * self.std)

    def range(self) -> tuple[float, float]:
        lo, hi = self.mean - _SPAN * self.std, self.mean + _SPAN * self.std
        if self.cap is not None:
            lo, hi = _capped(lo, self.cap), _capped(hi, self.cap)
        return float(lo), float(hi)

    def bin_width(self) -> float:
        lo, hi = self.range()
        h = min(0.2, self.std / 16) if self.cap is None else min(0.01, self.std / 64, (hi - lo) / 256)
        return max(h, (hi - lo) / _MAX_BINS)

    def nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """Gauss-Hermite nodes (logit values) and weights."""
        x, w = gauss_hermite(96)
        return _capped(self.mean + self.std * x, self.cap), w

    def bins(self, h: float) -> tuple[int, np.ndarray]:
        """(j0, p): probabilities of the bins [(j - 1/2) h, (j + 1/2) h], j = j0, j0 + 1, ..., their mass put
        at j h. Binning adds a variance h^2 / 12 (Sheppard), removed beforehand from an uncapped Gaussian."""
        lo, hi = self.range()
        std = self.std
        if self.cap is None:
            std = std * math.sqrt(1.0 - (h / std) ** 2 / 12) if h < math.sqrt(12) * std else 0.0
        j = np.arange(math.floor(lo / h) - 1, math.ceil(hi / h) + 2)
        edges = np.append(j - 0.5, j[-1] + 0.5) * h
        with np.errstate(all="ignore"):  # infinite edges of a capped logit, a point mass (std 0)
            if self.cap is not None:
                edges = self.cap * np.arctanh(np.clip(edges / self.cap, -1.0, 1.0))
            z = (edges - self.mean) / std if std > 0 else np.sign(edges - self.mean) * np.inf
            lower, upper = _ndtr(z), _ndtr(-z)  # each accurate in its own tail
            mid = 0.5 * (z[1:] + z[:-1])
            p = np.where(mid < 0, np.diff(lower), -np.diff(upper))
        return int(j[0]), np.clip(np.nan_to_num(p), 0.0, 1.0)

    def support(self, h: float) -> tuple[np.ndarray, np.ndarray]:
        """(logit values, probabilities): Gauss-Hermite nodes, or bins of width h."""
        if self.smooth:
            return self.nodes()
        j0, p = self.bins(h)
        return (j0 + np.arange(p.size)) * h, p


def expected_logsumexp(V: int, s: float, cap: float | None = None, self_mean: float = 0.0,
                       self_std: float | None = None) -> float:
    """E ln sum_v e^{l_v} for V independent logits: V - 1 of them cap(N(0, s^2)), one cap(N(self_mean, self_std^2))
    (by default like the others). Frullani's integral (module docstring), trapezoid rule over u (the integrand
    varies on a scale of 1 whatever the logits)."""
    dists = (_Logit(0.0, s, cap), _Logit(self_mean, s if self_std is None else self_std, cap))
    if V == 1:
        return _mean(dists[1])
    lo, hi = min(d.range()[0] for d in dists), max(d.range()[1] for d in dists)
    u_lo, u_hi = -hi - math.log(V) - 40.0, -lo + 5.0  # outside: the integrand is below e^-40
    h = max(min(d.bin_width() for d in dists), (u_hi - u_lo) / _MAX_U)
    n_u = (u_hi - u_lo) / 0.1
    if n_u <= _MAX_U and (all(d.smooth for d in dists) or n_u * (hi - lo) / h <= 2e6):  # step 0.1, all pairs
        u = np.linspace(u_lo, u_hi, int(n_u) + 2)
        du = u[1] - u[0]
        a = [_g(u[:, None] + x[None, :]) @ p for x, p in (d.support(h) for d in dists)]
    else:  # wide logits: u step h, aligned with the bins, 1 - phi(u) a discrete correlation
        k_lo, k_hi = math.floor(u_lo / h), math.ceil(u_hi / h)
        u, du = np.arange(k_lo, k_hi + 1) * h, h
        bins = [d.bins(h) for d in dists]
        j_min = min(j0 for j0, _ in bins)
        kernel = _g(np.arange(k_lo + j_min, k_hi + max(j0 + p.size for j0, p in bins) + 1) * h)
        a = [_correlate(kernel[j0 - j_min:j0 - j_min + u.size + p.size - 1], p) for j0, p in bins]
    a_o, a_s = np.clip(a[0], 0.0, 1.0), np.clip(a[1], 0.0, 1.0)
    with np.errstate(divide="ignore", over="ignore"):
        log_laplace = (V - 1) * np.log1p(-a_o) + np.log1p(-a_s)
        integrand = -np.expm1(log_laplace) - _g(u)  # exp(-e^u) - E exp(-e^u S), accurate where both are near 1
    return float(integrand.sum() * du)


def _correlate(a: np.ndarray, p: np.ndarray) -> np.ndarray:
    """out[i] = sum_j p[j] a[i + j] for i = 0 .. len(a) - len(p): directly, or by FFT when large."""
    if a.size * p.size <= 4_000_000:
        return np.correlate(a, p, mode="valid")
    n = a.size + p.size - 1
    full = np.fft.irfft(np.fft.rfft(a, n) * np.fft.rfft(p[::-1], n), n)
    return full[p.size - 1:a.size]


def _mean(d: _Logit) -> float:
    if d.cap is None:
        return d.mean
    x, w = d.nodes()
    return float(x @ w)


def expected_cross_entropy(V: int, s: float, cap: float | None = None, self_mean: float = 0.0,
                           self_std: float | None = None) -> float:
    """E[ln sum_v e^{l_v} - l_y] for a uniformly random target y among the V logits of `expected_logsumexp`
    (the others have mean 0: cap is odd)."""
    own = _Logit(self_mean, s if self_std is None else self_std, cap)
    return expected_logsumexp(V, s, cap, self_mean, self_std) - _mean(own) / V


# ---------------------------------------------------------------------------------------------------
# A spec's head


def hidden_moment(spec, q_final: float) -> float:
    """Per-coordinate second moment of the hidden state the head reads: 1 after the LayerNorm ending BERT's MLM
    transform (|h|^2 = d), q / (q + eps) after the final norm, else the last block's q."""
    if spec.head_transform:
        return 1.0
    return float(q_final) / (float(q_final) + spec.norm_eps) if spec.final_norm else float(q_final)


def raw_logit_std(spec, q_final: float) -> float:
    """s: the std of one logit before soft-capping, s^2 = d q_h std_head^2 + bias_std_head^2."""
    head = spec.head_init
    return math.hypot(head.std * math.sqrt(spec.d_model * hidden_moment(spec, q_final)), head.bias_std)


def logit_std(spec, q_final: float) -> float:
    """The std of one logit at initialisation as the model outputs it (after soft-capping), over the head's
    draw and the hidden state; `q_final` is the last block's per-coordinate second moment (trace.q[-1])."""
    s, cap = raw_logit_std(spec, q_final), spec.logit_softcap
    if cap is None:
        return s
    d = _Logit(0.0, s, cap)
    x, p = d.support(d.bin_width())
    return float(math.sqrt(p @ (x * x)))


def own_token_moment(stack, trace) -> float:
    """c: the per-coordinate second moment of the current token's own embedding row in the final stream.

    The row enters with second moment std^2 (1/n of n summed tables, kept through an embedding norm), and only
    the skip paths carry it on: a residual multiplies it by skip^2, a norm divides it by its input's q + eps (the
    forward's caches keep it); the branches' outputs are uncorrelated with it at init (their weights have mean 0)."""
    from initadvisor.core.ops import Norm, Residual

    emb = stack.embeddings
    if "token" not in emb.tables:
        return 0.0
    c = float(trace.q[0]) * (1.0 - emb.dropout) / len(emb.tables)  # dropout adds noise, not signal
    for ops, caches in zip(stack.blocks, trace.caches):
        for op, cache in zip(ops, caches):
            if isinstance(op, Residual):
                c *= float(op.skip) ** 2
            elif isinstance(op, Norm):
                r = float(cache[0]) * float(op.gain) ** 2  # q + eps
                c = c / r if r > 0 else 0.0  # a vanished stream carries no row
    return c


POSITIONS = 16  # positions of a causal model the expected loss is averaged over (evenly spaced)


def initial_loss(spec, trace=None, stack=None, ct=None) -> dict:
    """The expected step-0 cross-entropy of random targets: {"expected", "uniform" (= ln V), "logit_std"}.

    `trace`: the engine's Trace of `stack` (the spec's; both run here when None), or the last block's q as a
    number. A tied head without the MLM transform adds the own token's logit: after the final norm h = x / sqrt(q),
    x = k e + rest, so e.h = k |e|^2 / sqrt(q) with |e|^2 ~ d std^2: mean mu = s sqrt(d f), variance s^2 (1 + f),
    f = c / q the own row's share. `ct`: the causal trace; its final q per position (which sets f, and s without a
    final norm) then averages the loss over POSITIONS positions, each token's as in the real model."""
    from initadvisor.core.model import propagate
    from initadvisor.stack import from_spec

    own = spec.tie_embeddings and not spec.head_transform
    q_final = None if trace is None else float(trace.q[-1]) if hasattr(trace, "q") else float(trace)
    if q_final is None or (own and not hasattr(trace, "q")):  # the own row needs the engine's run
        stack = from_spec(spec) if stack is None else stack
        trace = propagate(stack, backward=False)
        q_final = float(trace.q[-1]) if q_final is None else q_final
    c = own_token_moment(from_spec(spec) if stack is None else stack, trace) if own else 0.0
    qs = [q_final]
    if ct is not None and (own or not (spec.final_norm or spec.head_transform)):
        q_pos = np.asarray(ct.q[-1], dtype=float)
        qs = q_pos[((np.arange(POSITIONS) + 0.5) * q_pos.size / POSITIONS).astype(int)] \
            if q_pos.size > POSITIONS else q_pos
    V, cap = spec.vocab, spec.logit_softcap

    def loss(q: float) -> float:
        s = raw_logit_std(spec, q)
        f = min(c / float(q), 1.0) if float(q) > 0 else 0.0
        return expected_cross_entropy(V, s, cap, s * math.sqrt(spec.d_model * f), s * math.sqrt(1.0 + f))

    lo, hi = float(min(qs)), float(max(qs))
    losses = [loss(lo), loss(hi)] if len(qs) > 1 else [loss(qs[0])]
    if abs(losses[-1] - losses[0]) >= 1e-7:  # the positions differ: average them all, the loss being smooth
        x = np.log(np.asarray(qs, dtype=float)) if lo > 0 else np.asarray(qs, dtype=float)  # in q: interpolated
        t = (x - x.min()) / (x.max() - x.min())  # through 5 points (degree 4) of t in [0, 1]
        inner = x.min() + (x.max() - x.min()) * np.array([0.25, 0.5, 0.75])
        vals = [losses[0], *(loss(math.exp(g) if lo > 0 else g) for g in inner), losses[-1]]
        losses = np.polyval(np.polyfit(np.linspace(0.0, 1.0, 5), vals, 4), t)
    return {"expected": float(np.mean(losses)), "uniform": math.log(V), "logit_std": logit_std(spec, q_final)}
