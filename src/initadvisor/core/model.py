"""The model: embeddings -> stack of blocks (`Stack`, the engine's whole input), forward and backward.

`propagate` runs the stack layer by layer (vectorised over any grid shape the parameters carry) and
returns a `Trace` of per-layer arrays; `propagate_causal` runs it position-resolved (causal.py).
The adapter from a Spec is initadvisor.stack: nothing here reads a spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from initadvisor.core.attention import HUGE  # moments are clamped to [1/HUGE, HUGE] after every block
from initadvisor.core.ops import Attention, BlockParams, Embeddings, block, find, moments_backward, \
    moments_forward, spread_forward
from initadvisor.core import walk


@dataclass(frozen=True)
class Stack:
    """The engine's input: the embeddings and one BlockParams per layer (layers may differ)."""

    embeddings: Embeddings
    layers: tuple[BlockParams, ...]

    @cached_property
    def blocks(self) -> list[tuple]:
        """Each layer's operations (`ops.block`), built once; a layer repeated by identity shares them."""
        return once(self.layers, block)

    @cached_property
    def windowed(self) -> bool:
        """Some layer attends through a sliding window shorter than the sequence, or with ALiBi's biases (rows at
        full resolution both)."""
        T = self.embeddings.seq_len
        return any((P.window and P.window < T) or P.alibi for P in self.layers)

    def replace(self, **fields) -> "Stack":
        """The same stack with BlockParams fields replaced at every layer (numpy arrays allowed: a grid)."""
        if not fields:
            return self
        return Stack(self.embeddings, tuple(once(self.layers, lambda P: replace(P, **fields))))


def once(layers, f) -> list:
    """[f(P) for P in layers], computed once per distinct (by identity) P: a repeated layer shares the result."""
    done: dict[int, object] = {}
    out = []
    for P in layers:
        if id(P) not in done:
            done[id(P)] = f(P)
        out.append(done[id(P)])
    return out


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
    y22: np.ndarray  # E[Y2^2]
    qk_share: np.ndarray  # the share of the gradient's q at each attention input through its query/key path
    caches: list = field(default_factory=list, repr=False)  # each block's forward caches (its norms' inputs, ...)

    @property
    def rho(self) -> np.ndarray:
        return self.p / self.q


def propagate(stack: Stack, backward: bool = True, means: bool = False) -> Trace:
    """Run the stack forward (and the gradient backward) from the embeddings' moments. The gradient is the mean over
    sequences at the layers' width (the rho walk's factor, walk.py); means: rho and the IPR too (walk.mean_shift),
    else the mean field's, which the recommendations' conditions are stated in."""
    q0, p0 = stack.embeddings.moments()
    q, p = np.asarray(q0, dtype=float), np.asarray(p0, dtype=float)
    blocks = stack.blocks
    qs, ps, caches, u = [q], [p], [], None
    with np.errstate(over="ignore", invalid="ignore"):
        for ops in blocks:
            q, p, cache = moments_forward(ops, q, p)
            if backward:  # the norms' backward reads a token's mean-square spread (spread_forward)
                u, cache = spread_forward(ops, u, cache)
            q, p = _clamp(q, p, 1.0 / HUGE)
            u = clamp_spread(u, q)
            qs.append(q)
            ps.append(p)
            caches.append(cache)
    shape = np.broadcast_shapes(*(np.shape(x) for x in qs))
    gq, gp = np.ones(shape), np.zeros(shape)
    gqs, gps = [gq], [gp]
    if backward:
        with np.errstate(over="ignore", invalid="ignore"):
            for ops, cache in zip(reversed(blocks), reversed(caches)):
                gq, gp = moments_backward(ops, gq, gp, cache)
                gq, gp = _clamp(gq, gp, 0.0)
                gqs.append(gq)
                gps.append(gp)
    gqs, gps = gqs[::-1], gps[::-1]
    atts = [find(ops, c, Attention) for ops, c in zip(blocks, caches)]

    def att(key: str) -> np.ndarray:
        return _stack([getattr(c, key) for c in atts], shape)

    Q, Pq, y2 = _stack(qs, shape), _stack(ps, shape), att("y2")
    widths = [P.d_model for P in stack.layers]
    if (backward or means) and all(widths):  # the means over sequences at finite width: the rho walk (walk.py)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            resp = walk.responses(blocks, widths, qs, ps, backward)
            V = walk.walk_variance(resp, qs, ps)
            shift = walk.mean_shift(blocks, widths, qs, ps, resp, V)
            if backward:
                f = walk.gradient_factor(blocks, widths, qs, ps, gqs, gps, resp, V)[0]
                f = [x * y for x, y in zip(f, walk.gradient_mean(gqs, gps, resp, V, shift[0]))]
                gqs, gps = map(list, zip(*(_clamp(g * x, h * x, 0.0) for g, h, x in zip(gqs, gps, f))))
            if means:
                B, dy = (x.reshape(x.shape + (1,) * (len(shape) + 1 - x.ndim)) for x in shift)
                Pq = _clamp(Q, Pq + B * Q, 0.0)[1]
                y2 = np.clip(y2 + dy, 0.0, 1.0)
    gqs, gps = _stack(gqs, shape), _stack(gps, shape)
    return Trace(
        q=Q, p=Pq, grad_q=gqs, grad_p=gps, grad_scale=gqs[0],
        att_q=att("q_in"), att_p=att("p_in"), beta=_stack([P.beta for P in stack.layers], shape),
        beta_c=att("beta_c"), y2=y2, y3=att("y3"), y22=att("y22"), qk_share=att("qk_share"), caches=caches,
    )


def clamp_spread(u, q):
    """A spread u of a token's mean square into [0, q^2] (relative variance at most 1; nan: 0)."""
    if u is None:
        return None
    if np.ndim(u) == 0 and np.ndim(q) == 0:  # the scalar pass: floats
        u, qq = float(u), float(q) * float(q)
        return min(u, qq) if u >= 0.0 else 0.0
    return np.where(u >= 0.0, np.minimum(u, q * q), 0.0)


def _clamp(q, p, floor: float):
    """q into [floor, HUGE] (overflow and inf - inf become HUGE), p into [-q, q]; fmin/fmax skip NaN."""
    q = np.fmax(np.fmin(q, HUGE), floor)
    return q, np.fmax(np.fmin(p, q), -q)


def _stack(xs: list, shape: tuple) -> np.ndarray:
    """Stack per-layer values into (n, *shape), broadcasting only when a value's shape differs."""
    try:
        out = np.array(xs, dtype=float)
        if out.shape[1:] == shape:
            return out
    except ValueError:  # ragged: some values broadcast
        pass
    out = np.empty((len(xs), *shape))
    for i, x in enumerate(xs):
        out[i] = x
    return out


def propagate_causal(stack: Stack, keep_overlap: bool = False, backward: bool = False):
    """Position-resolved forward prediction (causal.py); causal rows on position groups, sliding windows and
    bidirectional rows at full resolution (every position its own group). backward: the gradient too, where
    `resolves_backward` (else the trace's grad_q is None), with the rho walk's factor where `walks`."""
    from initadvisor.core.causal import propagate_overlaps

    q0, p0 = stack.embeddings.moments()
    T = stack.embeddings.seq_len
    full = stack.windowed or not stack.layers[0].causal  # sliding windows, bidirectional rows: position by position
    return propagate_overlaps(stack.blocks, q0, p0, T, keep_overlap=keep_overlap,
                              backward=backward and resolves_backward(stack), repeats=stack.embeddings.repeats(),
                              widths=[P.d_model for P in stack.layers] if walks(stack) else None,
                              **({"single": T} if full else {}))


WALK_CELLS = 10**5  # the causal walk's reach (walk.causal_factor, about WALK_COST x the position-resolved run):
WALK_COST = 7  # (layers + 1) x max(T, 1024) cells (a 50-layer post-LN stack at T 512, 52000 cells: check 0.7 -> 3.6 s)


def walks(stack: Stack) -> bool:
    """Whether the position-resolved backward carries the rho walk's factor (walk.causal_factor): causal rows on
    position groups (not sliding windows or bidirectional rows at full resolution, whose states are T x T), within
    WALK_CELLS, where walk.resolves_walk (post-LN); elsewhere the gradient is the mean field's."""
    T = stack.embeddings.seq_len
    return bool(stack.layers[0].causal) and not stack.windowed and (len(stack.layers) + 1) * max(T, 1024) <= WALK_CELLS \
        and walk.resolves_walk(stack.blocks)


BACKWARD_T = 1 << 20  # the position-resolved backward keeps about 30 per-position arrays a block: 250 MB at this T


def resolves_backward(stack: Stack) -> bool:
    """The position-resolved backward's reach: every stack the position-resolved forward runs (causal rows, sliding
    windows) up to BACKWARD_T positions, not centered."""
    return ((bool(stack.layers[0].causal) or stack.windowed) and stack.embeddings.seq_len <= BACKWARD_T
            and not any(L.centered for L in stack.layers))
