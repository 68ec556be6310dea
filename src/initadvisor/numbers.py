"""What a report may print: finite numbers inside the engine's trusted range, never NaN, inf or a clamp value.

The engine caps moments at HUGE (1e250) so extreme stacks stay finite; a magnitude beyond LIMIT is that cap
(or a product of it), not a prediction. Reports replace such values by null (JSON) or a word (text) and a
finding names the quantity and the layers where it overflowed.
"""

from __future__ import annotations

import math
import re

LIMIT = 1e200  # |x| >= LIMIT (or a positive quantity <= 1 / LIMIT) is outside what the engine resolves
# quantities that are strictly positive: 0 means they underflowed (e.g. beta_c of an overflowed stream)
POSITIVE = frozenset({"q", "grad_q", "beta_c", "beta_c_per_layer", "qk_std", "tau", "tau_per_layer", "tau_beta",
                      "beta_recommended", "sigma_e2", "sigma_f2", "sigma_qk2", "sigma_vo2", "sigma_vo2_per_layer",
                      "sigma1", "score_variance"})


def status(x: float, positive: bool = False) -> str | None:
    """None for a reportable number, else 'overflows', 'underflows' or 'is undefined' (NaN)."""
    if math.isnan(x):
        return "is undefined"
    if abs(x) >= LIMIT:
        return "overflows"
    if (positive and x <= 1 / LIMIT) or 0 < abs(x) <= 1 / LIMIT:
        return "underflows"
    return None


def show(x: float | None, spec: str = ".3g", positive: bool = False) -> str:
    """A number for a message or a table cell; out-of-range values as words (a finding says more)."""
    if x is None:
        return "n/a"
    why = status(float(x), positive)
    if why is None:
        if spec.endswith("%") and abs(float(x)) >= 1e3:  # '.1%' of 1e199 prints 200 digits
            return format(100.0 * float(x), ".3g") + "%"
        return format(float(x), spec)
    return {"overflows": "> 10^200", "underflows": "< 10^-200"}.get(why, "undefined")


SPECS = ("spec", "patched_spec")  # validated specs, the user's own numbers (a dropout of 1e-250 is a valid input)
OPTIONS = ("tol", "rtol")  # a report's echo of the user's own options (verify --rtol 5e-324 is a valid input)


def clean(obj, path: str = "", key: str = "", out: list | None = None):
    """(obj with unreportable floats replaced by None, [(json path, why)]); walks dicts and lists, but not the
    specs a report echoes."""
    out = [] if out is None else out
    if isinstance(obj, dict):
        return {k: v if k in SPECS or k in OPTIONS else clean(v, f"{path}.{k}" if path else k, k, out)[0]
                for k, v in obj.items()}, out
    if isinstance(obj, (list, tuple)):
        return [clean(v, f"{path}[{i}]", key, out)[0] for i, v in enumerate(obj)], out
    if isinstance(obj, float) or (hasattr(obj, "dtype") and getattr(obj, "ndim", 1) == 0):
        why = status(float(obj), key in POSITIVE)
        if why is not None:
            out.append((path, why))
            return None, out
    return obj, out


def summarise(paths: list) -> list[tuple[str, str, int | None, str]]:
    """Group (json path, why) by quantity: (quantity, why, first layer, 'layers 3-7, 9' or ''). Layers are
    stream indices: `layers[i]` is layer i, `*_per_layer[b]` (block b + 1) is layer b + 1; other list
    indices (grid cells, recipes) are dropped from the quantity's name."""
    groups: dict[tuple[str, str], list[int]] = {}
    for path, why in paths:
        m = re.fullmatch(r"(?:.*\.)?layers\[(\d+)\]\.(\w+)|(.*_per_layer)\[(\d+)\]", path)
        if m and m.group(2):
            qty, idx = m.group(2), int(m.group(1))
        elif m:
            qty, idx = m.group(3), int(m.group(4)) + 1
        else:
            qty, idx = re.sub(r"\[\d+\]", "", path), None
        groups.setdefault((qty, why), []).append(idx)
    out = []
    for (qty, why), idx in groups.items():
        known = sorted({i for i in idx if i is not None})
        out.append((qty, why, known[0] if known else None, f"layers {ranges(known)}" if known else ""))
    return out


def ranges(xs: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    parts, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            parts.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(parts)


def overflow_findings(paths: list) -> list:
    """One IA104 finding naming every quantity `clean` replaced by null, and where (none when nothing was)."""
    from initadvisor.rules import finding

    if not paths:
        return []
    words = {"overflows": "overflows (beyond 10^200)", "underflows": "underflows (below 10^-200)"}
    groups = summarise(paths)
    parts = [f"{qty} {words.get(why, why)}{' at ' + where if where else ''}" for qty, why, _, where in groups]
    layers = [layer for _, _, layer, _ in groups if layer is not None]
    return [finding("IA104", "reported as null, the engine cannot resolve them: " + "; ".join(parts),
                    min(layers) if layers else None)]
