"""Black-box fuzzer of the initadvisor CLI: random valid specs, pristine and mutated HuggingFace configs, odd
files, a pyproject.toml and abused options, through every command and format. Prints each distinct contract
violation (tests/cli_contract.py) once, with a reproducer; exit code 1 if there is any.

    python benchmarks/fuzz.py --runs 300 --seed 0 [--subprocess-every 25] [--keep DIR]

Runs are in-process (initadvisor.cli.main), each with a 60 s alarm and 2 GiB of extra address space; every
--subprocess-every'th run goes through `python -m initadvisor`. Run i draws from its own seed (SEED-i).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import cli_contract as cc  # noqa: E402
from initadvisor.rules import RULES  # noqa: E402

MAX_LAYERS = {"check": 2000, "recommend": 200, "diagram": 60, "plot": 300, "verify": 4, "sweep": 200}
NAMES = [r.name for r in RULES.values()]
EXPLAIN = [*RULES, *NAMES, "ia101", "IA999", "", "x" * 300, "\n", "🚀", "IA1"]


def make_case(r: cc.Rand, d: Path) -> cc.Case:
    """One random CLI call with its input files written under d."""
    kind = r.choice(["spec"] * 6 + ["abuse"] * 3 + ["hf", "hf_mut", "hf_mut", "odd", "odd", "pyproject", "rules"])
    if kind == "rules":
        argv = ["rules"] if r.coin(0.2) else ["explain", r.choice(EXPLAIN)]
        return cc.Case(argv, d, valid=argv == ["rules"] or argv[1] in [*RULES, *NAMES])
    commands = ["check"] * 3 + ["recommend"] * 2 + ["diagram"] * 2 + ["verify", "plot", "sweep"]
    if kind in ("hf", "hf_mut"):
        path = d / "config.json"
        path.write_text(json.dumps(cc.hf_config(r, kind == "hf_mut"), indent=2))
        cmd = r.choice(["import"] * 3 + commands)
        args, valid, must = cc.options(r, cmd, d, abuse=False)
        target = d if r.coin(0.2) else path
        return cc.Case([cmd, str(target), *args], d, kind == "hf" and valid, must, files=[path])
    if kind == "odd":
        path, ok = cc.odd_file(r, d)
        cmd = r.choice(["import", *commands])
        args, valid, must = cc.options(r, cmd, d, abuse=False)
        return cc.Case([cmd, str(path), *args], d, ok and valid and cmd != "import", must, files=[path])
    cmd = r.choice(commands)
    data = cc.valid_spec(r, MAX_LAYERS[cmd], small=cmd == "verify")
    if cmd == "check" and r.coin(0.01):
        data["model"]["layers"] = 100_000
    files = [d / "spec.yaml"]
    files[0].write_text(cc.spec_text(r, data))
    if cmd == "check" and r.coin(0.1):
        files.append(d / "spec2.yaml")
        files[1].write_text(cc.spec_text(r, cc.valid_spec(r, 200)))
    args, valid, must = cc.options(r, cmd, d, abuse=kind == "abuse")
    case = cc.Case([cmd, *map(str, files), *args], d, valid, must, files=files)
    if kind == "pyproject":
        text, ok = cc.pyproject(r)
        (d / "pyproject.toml").write_text(text)
        case.cwd, case.valid = d, valid and ok
        case.files.append(d / "pyproject.toml")
    return case


def show_file(p: Path) -> str:
    """A reproducer input: its text when small, else what it is."""
    try:
        if p.is_file() and not p.is_symlink() and p.stat().st_size <= 4000:
            return p.read_text(errors="backslashreplace")
        if p.is_dir():
            return f"(a directory holding {sorted(x.name for x in p.iterdir())})"
        return f"({'symlink' if p.is_symlink() else 'file'} of {p.lstat().st_size} bytes)"
    except OSError as e:
        return f"({e.strerror})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--subprocess-every", type=int, default=25, help="0: never")
    ap.add_argument("--keep", type=Path, help="folder for reproducers [a new temporary one]")
    a = ap.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="initadvisor-fuzz-"))
    root.mkdir(parents=True, exist_ok=True)
    classes: dict[str, dict] = {}
    slow: list[tuple[float, int, str]] = []
    codes: Counter = Counter()
    t0 = time.perf_counter()
    for i in range(a.runs):
        d = Path(tempfile.mkdtemp(prefix=f"run{i:05d}-", dir=root))
        case = make_case(cc.Rand(random.Random(f"{a.seed}-{i}")), d)
        sub = a.subprocess_every and i % a.subprocess_every == a.subprocess_every - 1
        t = time.perf_counter()
        res, found = cc.run_case(case, cc.invoke_subprocess if sub else cc.invoke)
        codes[f"{case.argv[0]}:{'exc' if res.code is None else res.code}"] += 1
        slow.append((time.perf_counter() - t, i, shlex.join(["initadvisor", *case.argv])))
        new = False
        for key, detail, argv in found:
            c = classes.setdefault(key, {"count": 0, "run": i, "case": case, "argv": argv, "detail": detail})
            c["count"] += 1
            new |= c["run"] == i
        if not new:
            shutil.rmtree(d, ignore_errors=True)
        if (i + 1) % 50 == 0:
            print(f"... {i + 1} runs, {time.perf_counter() - t0:.0f} s, {len(classes)} classes", file=sys.stderr)
    print(f"{a.runs} runs (seed {a.seed}) in {time.perf_counter() - t0:.1f} s: {len(classes)} distinct failure "
          f"classes; reproducers under {root}")
    print("exit codes: " + ", ".join(f"{k} {v}" for k, v in sorted(codes.items())))
    for n, (key, c) in enumerate(sorted(classes.items()), 1):
        case = c["case"]
        print(f"\n[{n}] {key}   ({c['count']}x, first in run {c['run']})")
        print("    $ " + (f"cd {shlex.quote(str(case.cwd))} && " if case.cwd else "")
              + shlex.join(["initadvisor", *c["argv"]]))
        if c["argv"] != case.argv:
            print("    (follow-up of: " + shlex.join(["initadvisor", *case.argv]) + ")")
        for p in case.files:
            print(f"    --- {p}\n" + "".join(f"    | {ln}\n" for ln in show_file(p).splitlines()[:40]), end="")
        print("".join(f"    > {ln}\n" for ln in c["detail"].splitlines()), end="")
    print("\nslowest runs:")
    for s, i, cmd in sorted(slow, reverse=True)[:5]:
        print(f"    {s:6.1f} s  run {i}: {cmd}")
    return 1 if classes else 0


if __name__ == "__main__":
    sys.exit(main())
