"""`recommend` against `check`: wall time of both on the same spec, and their ratio.

Usage: OPENBLAS_NUM_THREADS=1 python benchmarks/recommend_speed.py [--repeat 3]

Specs: gpt2-small, model_specs/deep-preln-96.yaml at 1000 layers (pre-LN), gpt2-small at 1682 layers (causal:
every recipe also runs the position-resolved engine), and every shipped spec. Two ways of timing, each the
best of --repeat runs: in-process (the library calls `diagnose.check(spec)` and `recommend.recommend(spec)` on
a loaded spec, after one warm-up call) and the real command in a fresh interpreter (`python -m initadvisor
check|recommend SPEC --format json`, start-up included). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "initadvisor"]


def deep_specs(tmp: Path) -> list[Path]:
    """The 1000-layer pre-LN and the 1682-layer causal spec, written under tmp."""
    out = []
    for src, layers in (("deep-preln-96", 1000), ("gpt2-small", 1682)):
        data = yaml.safe_load((ROOT / "model_specs" / f"{src}.yaml").read_text())
        data["name"] = f"{src}-{layers}"
        data["model"]["layers"] = layers
        path = tmp / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data))
        out.append(path)
    return out


def best(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def in_process(path: Path, repeat: int) -> tuple[float, float]:
    from initadvisor.diagnose import check
    from initadvisor.recipes import recommend
    from initadvisor.spec import load_spec

    spec = load_spec(path)
    check(spec), recommend(spec)  # warm-up: lazy imports
    return best(lambda: check(spec), repeat), best(lambda: recommend(spec), repeat)


def command(path: Path, repeat: int) -> tuple[float, float]:
    def run(cmd: str) -> None:
        subprocess.run([*CLI, cmd, str(path), "--format", "json"], capture_output=True, check=False)

    return best(lambda: run("check"), repeat), best(lambda: run("recommend"), repeat)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        specs = [ROOT / "model_specs" / "gpt2-small.yaml", *deep_specs(Path(tmp))]
        specs += [p for p in sorted((ROOT / "model_specs").glob("*.yaml")) if p.name != "gpt2-small.yaml"]
        print(f"{'spec':24s} {'layers':>6s} | {'in-process: check':>17s} {'recommend':>9s} {'ratio':>6s} | "
              f"{'command: check':>14s} {'recommend':>9s} {'ratio':>6s}")
        for path in specs:
            layers = yaml.safe_load(path.read_text())["model"]["layers"]
            c, r = in_process(path, args.repeat)
            cc, rc = command(path, args.repeat)
            print(f"{path.stem:24s} {layers:6d} | {c:16.3f}s {r:8.3f}s {r / c:6.1f} | {cc:13.3f}s {rc:8.3f}s "
                  f"{rc / cc:6.1f}", flush=True)


if __name__ == "__main__":
    main()
