"""Wall time of `initadvisor verify` with its default settings (numpy backend, 8 seeds x 1 sequence).

Usage: python benchmarks/verify_cost.py [SPEC ...]   (default: model_specs/bert-base.yaml, 12 x 768, T = 512)
Target: under a minute on a 2-core CPU for a 12-layer, 768-wide, 512-token model.
"""

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    specs = sys.argv[1:] or [str(ROOT / "model_specs" / "bert-base.yaml")]
    for spec in specs:
        for backend in ("numpy", "torch"):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "initadvisor", "verify", spec, "--backend", backend,
                                "--format", "json"], capture_output=True, text=True)
            secs = time.perf_counter() - t0
            if r.returncode not in (0, 1):
                print(f"verify {spec} --backend {backend}: failed ({r.stderr.strip()[:120]})")
                continue
            print(f"verify {Path(spec).name} --backend {backend:5s}: {secs:5.1f} s wall (target < 60 s), "
                  f"exit {r.returncode}")


if __name__ == "__main__":
    main()
