"""Start-up of the CLI against a bare `python -c "import numpy"`, as ratios (issue 14: check within 2x).

Usage: python benchmarks/startup.py [--repeat 15]

Each command runs as the user runs it (the installed `initadvisor` script) in a fresh interpreter, with the
package's bytecode compiled first, as `pip install` leaves it (PYTHONDONTWRITEBYTECODE would otherwise make
every run compile the sources). Runs are interleaved with the baseline and the best of `repeat` is kept, so a
busy machine slows both sides alike. Prints seconds and the ratio to the baseline.
"""

import argparse
import compileall
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    import initadvisor

    compileall.compile_dir(Path(initadvisor.__file__).parent, quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    script = shutil.which("initadvisor", path=str(Path(sys.executable).parent))
    cli = [script] if script else [sys.executable, "-m", "initadvisor"]
    specs = sorted((ROOT / "model_specs").glob("*.yaml"))
    cases = {"python -c 'import numpy'": [sys.executable, "-c", "import numpy"]}
    for s in specs:
        cases[f"check {s.name} --format json"] = [*cli, "check", str(s), "--format", "json"]
    cases[f"check {specs[0].name} (table)"] = [*cli, "check", str(specs[0])]
    cases["rules"] = [*cli, "rules"]
    cases["explain IA101"] = [*cli, "explain", "IA101"]
    cases["--help"] = [*cli, "--help"]
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(args.repeat):
        for name, argv in cases.items():
            t0 = time.perf_counter()
            subprocess.run(argv, capture_output=True, env=env, check=False)
            best[name] = min(best[name], time.perf_counter() - t0)
    base = best["python -c 'import numpy'"]
    for name, t in best.items():
        print(f"{name:48s} {t * 1e3:6.0f} ms  {t / base:4.2f}x")


if __name__ == "__main__":
    main()
