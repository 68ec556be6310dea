"""Wall time and peak memory of `initadvisor check` on sliding-window stacks that the full-resolution engine runs.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/window_check.py [--layers 8,18] [--seq-len 1024] [--repeat 1]

A Mistral-like block (pre-RMSNorm, SwiGLU, GQA, rotary, a window of T / 4) at T positions: every position is its own
row at full resolution, (layers + 1) T^2 overlaps a run; at T 1024 and 18 layers that is diagnose.WINDOW_CELLS, the
largest stack `check` resolves so (beyond, the late tokens by distance). Each run is the real command in a fresh
interpreter (start-up included, JSON output); prints the best time of --repeat runs and the run's peak resident memory.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """\
name: window-{layers}
model: {{layers: {layers}, d_model: 256, heads: 4, kv_heads: 2, d_ff: 688, norm: pre, norm_type: rmsnorm,
        activation: swiglu, causal: true, rope_theta: 10000.0, sliding_window: {window}}}
sequence: {{length: {T}, vocab: 5000, embeddings: [token]}}
init: {{std: 0.02}}
"""


def counts(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers of at least 1 (8,18)."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers of at least 1, got {text!r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=counts, default=[8, 18])
    ap.add_argument("--seq-len", type=lambda x: counts(x)[0], default=1024)
    ap.add_argument("--repeat", type=lambda x: counts(x)[0], default=1)
    args = ap.parse_args()
    T = args.seq_len
    with tempfile.TemporaryDirectory() as tmp:
        for layers in args.layers:
            path = Path(tmp) / f"window-{layers}.yaml"
            path.write_text(SPEC.format(layers=layers, window=T // 4, T=T))
            cells = (layers + 1) * T * T
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "initadvisor", "check", str(path), "--format", "json"],
                               capture_output=True, check=False)
                best = min(best, time.perf_counter() - t0)
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child so far (MB)
            print(f"T {T} layers {layers:3d} ({cells:.2g} overlaps): check {best:6.2f} s, peak {peak:5.0f} MB",
                  flush=True)


if __name__ == "__main__":
    main()
