"""Project configuration: `[tool.initadvisor]` in the nearest pyproject.toml (select, ignore, fail-on,
thresholds). Precedence: built-in defaults < pyproject.toml < the spec file < the command line."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from initadvisor.spec import THRESHOLD_RANGE, THRESHOLDS, SpecError, check_codes

KEYS = ("select", "ignore", "fail-on", "thresholds")
MAX_BYTES = 1 << 20  # a pyproject.toml is a few kB
OUR_KEY = re.compile(r"""initadvisor["']?\s*[.=\]]""")  # a key `initadvisor` (bare or quoted) before . = or ]


def find_pyproject(start: Path) -> Path | None:
    for d in [start, *start.parents]:
        f = d / "pyproject.toml"
        if f.is_file():
            return f
    return None


def _line(text: str, needle: str) -> int | None:
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith(needle):
            return i
    return None


def load_project(start: Path | None = None) -> dict[str, Any]:
    """The validated [tool.initadvisor] table of the nearest pyproject.toml ({} when there is none)."""
    f = find_pyproject((start or Path.cwd()).resolve())
    if f is None:
        return {}
    from initadvisor.files import read_bounded

    text = read_bounded(f, MAX_BYTES, "pyproject.toml").decode("utf-8", errors="replace")
    if not OUR_KEY.search(text):  # no table of ours: not parsed (tomllib is 4 ms of `check`'s start-up)
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        tool = tomllib.loads(text).get("tool", {})
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"malformed TOML: {e}", str(f)) from None

    def bad(msg: str, key: str) -> SpecError:
        line = _line(text, key.split(".")[-1] or "initadvisor")
        return SpecError(msg, str(f), line, f"tool.initadvisor.{key}".rstrip("."))

    if not isinstance(tool, dict):
        raise SpecError("expected a table", str(f), _line(text, "tool"), "tool")
    table = tool.get("initadvisor", {})
    if not isinstance(table, dict):
        raise bad("expected a table", "")

    for key, value in table.items():
        if key not in KEYS:
            raise bad(f"unknown key (expected one of: {', '.join(KEYS)})", key)
        if key in ("select", "ignore") and (why := check_codes(value)):
            raise bad(why, key)
        if key == "fail-on" and value not in ("error", "warning", "never"):
            raise bad(f"must be error, warning or never, got {value!r}", key)
    th = table.get("thresholds", {})
    if not isinstance(th, dict):
        raise bad("expected a table", "thresholds")
    for k, v in th.items():
        if k not in THRESHOLDS:
            raise bad(f"unknown threshold (expected one of: {', '.join(THRESHOLDS)})", f"thresholds.{k}")
        lo, hi = THRESHOLD_RANGE
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise bad(f"must be a number in [{lo:g}, {hi:g}], got {v!r}", f"thresholds.{k}")
    return {"select": table.get("select", []), "ignore": table.get("ignore", []),
            "fail_on": table.get("fail-on"), "thresholds": {k: float(v) for k, v in th.items()}}
