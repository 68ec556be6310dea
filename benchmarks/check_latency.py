"""Wall time of `initadvisor check` on a 1000-layer spec, interpreter start-up included.

Usage: python benchmarks/check_latency.py [--layers 1000] [--repeat 7]
Prints the median and best of several runs of the real command (JSON and table output).
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """\
name: deep-{layers}
model: {{layers: {layers}, d_model: 1024, heads: 16, norm: {norm}, activation: gelu}}
sequence: {{length: 2048}}
init: {{std: 0.02}}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for norm in ("pre", "post"):
            path = Path(tmp) / f"{norm}.yaml"
            path.write_text(SPEC.format(layers=args.layers, norm=norm))
            for fmt in ("json", "table"):
                times = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    subprocess.run([sys.executable, "-m", "initadvisor", "check", str(path), "--format", fmt],
                                   capture_output=True, check=False)
                    times.append(time.perf_counter() - t0)
                print(f"check {args.layers:5d} layers {norm:4s}-LN --format {fmt:5s}: "
                      f"median {statistics.median(times) * 1e3:6.0f} ms, best {min(times) * 1e3:6.0f} ms "
                      f"(target < 500 ms)")


if __name__ == "__main__":
    main()
