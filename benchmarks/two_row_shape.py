"""Two softmax rows' overlap between independent queries and one query, on keys with a positional structure: sampled,
against the field law's interpolation (the i.i.d. pair table's shape) and that shape with its slope at independent
queries made exact (Price's theorem).

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/two_row_shape.py [--rows 60000] [--seed 0]

Two rows read the same keys (cosines K, unit diagonal); their scores are z_a = sqrt(c) L g_a and z_b = r z_a +
sqrt(1 - r^2) sqrt(c) L g_h (L L^T = K), so the queries correlate by r. Y(r) = E sum_j A_j B_j. The engine's field law
(ops.Attention._field_law) has Y(0) and Y(1) exact and took Y(r) = Y(0) + (Y(1) - Y(0)) h(r) between them, h the
i.i.d. rows' shape (softmax_rows.expected_overlap at the rows' score spread). At r = 0 the rows are independent and
Price's theorem on their cross-covariance r c K gives the slope exactly from one row's moments:
dY/dr = c sum_i (a K a^T)_ii, a_ij = delta_ij E[A_i] - E[A_i A_j]. Printed per layout: Y(0), Y(1), that slope and
the shape's, then per r the sampled Y and the two interpolations over it (the shape's, and the shape plus
lambda r (1 - r) with lambda matching the slope, which the field law takes since: softmax_rows.field_rows' slope).
Asserts nothing (tests/test_two_row_shape.py checks the slope).
"""

from __future__ import annotations

import argparse

import numpy as np

LAYOUTS = (  # (keys per group, (near, far, within) as test_softmax_rows' _positional, score scale c)
    ([1] * 4 + [2, 4, 8, 16, 32], (0.9, 0.3, 0.95), 20.0),
    ([1] * 6 + [3, 8, 20, 60], (0.95, 0.6, 0.98), 60.0),
    ([64], (0.5, 0.5, 0.5), 20.0),
)
RS = (0.25, 0.5, 0.75, 0.9)


def positional(n, near: float, far: float, within: float) -> np.ndarray:
    """The keys' cosines (T x T) of groups of n keys: two groups' keys overlap far + (near - far) e^-d, d their groups'
    distance in ln(position); a group's own keys `within`."""
    n = np.asarray(n)
    ends = np.cumsum(n)
    x = np.log(ends - (n - 1) / 2.0)
    F = far + (near - far) * np.exp(-np.abs(np.subtract.outer(x, x)))
    F[np.diag_indices(len(n))] = within
    g = np.repeat(np.arange(len(n)), n)
    K = F[np.ix_(g, g)]
    np.fill_diagonal(K, 1.0)
    return K


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def overlaps(K: np.ndarray, c: float, rs, rows: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Sampled Y(r) = E sum_j A_j B_j at each r (common normals), and row a's weights A (rows x T)."""
    L = np.linalg.cholesky(K + 1e-12 * np.eye(len(K)))
    za = np.sqrt(c) * rng.standard_normal((rows, len(K))) @ L.T
    zh = np.sqrt(c) * rng.standard_normal((rows, len(K))) @ L.T
    A = _softmax(za)
    return np.array([(A * _softmax(r * za + np.sqrt(1.0 - r * r) * zh)).sum(axis=1).mean() for r in rs]), A


def price_slope(A: np.ndarray, K: np.ndarray, c: float) -> float:
    """dY/dr at r = 0 from one row's weights A (rows x T): c sum_i (a K a^T)_ii, a = diag E[A] - E[A A^T]."""
    a = np.diag(A.mean(axis=0)) - A.T @ A / len(A)
    return float(c * np.einsum("ij,jk,ik->", a, K, a))


def main() -> None:
    from initadvisor.core.softmax_rows import expected_overlap

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 100 <= args.rows <= 10**7 or args.seed < 0:
        ap.error("--rows must be in [100, 1e7] and --seed >= 0")
    rng = np.random.default_rng(args.seed)
    for n, structure, c in LAYOUTS:
        K = positional(n, *structure)
        T = len(K)
        Y, A = overlaps(K, c, (0.0, 1.0, *RS), args.rows, rng)
        y0, y1, at = Y[0], Y[1], Y[2:]
        s0 = price_slope(A, K, c)
        s = np.sqrt(c * (1.0 - K[~np.eye(T, dtype=bool)].mean()))  # the rows' score spread about their keys' mean
        iid = lambda r: float(expected_overlap(s, T, r))  # noqa: E731
        h = [(iid(r) - iid(0.0)) / (iid(1.0) - iid(0.0)) for r in RS]
        h0 = (iid(1e-3) - iid(0.0)) / 1e-3 / (iid(1.0) - iid(0.0))
        lam = s0 - (y1 - y0) * h0
        print(f"groups {n}, structure {structure}, c {c:g}: Y(0) {y0:.4f}, Y(1) {y1:.4f}, slope at 0 {s0:.4f} "
              f"(the shape's {(y1 - y0) * h0:.4f})")
        for r, y, hr in zip(RS, at, h):
            shape = y0 + (y1 - y0) * hr
            print(f"  r {r:.2f}: sampled {y:.4f}, shape / sampled {shape / y:.3f}, shape + slope / sampled "
                  f"{(shape + lam * r * (1.0 - r)) / y:.3f}")


if __name__ == "__main__":
    main()
