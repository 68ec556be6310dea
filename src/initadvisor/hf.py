"""Import a HuggingFace `config.json` as an initadvisor spec.

Reads the JSON file with the `json` module only (never the network, never `transformers`) and maps the fields
that matter for signal propagation at initialisation onto the spec's YAML layout, by the mapping of the
config's `model_type` in `initadvisor.families` (which also says what transformers' initialisation is).

Everything the theory cannot use is listed in the notes, so nothing is dropped silently.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .families import FAMILIES, rope_attention_factor
from .errors import one_line
from .files import read_bounded
from .spec import MAX_INT, VERSION, Spec, SpecError, build_spec

SUPPORTED = tuple(FAMILIES)
MAX_BYTES = 10_000_000  # a config.json is a few kB


class _Config:
    """The parsed JSON with bookkeeping: which fields were used, which defaulted, where each one is."""

    def __init__(self, raw: dict[str, Any], text: str, fname: str):
        self.raw, self.fname = raw, fname
        self.used: set[str] = set()
        self.inert: set[str] = set()  # read, and of no effect at init whatever their value (kind "inert")
        self.defaulted: list[str] = []
        self.key_lines = _top_level_key_lines(text)
        self.src: dict[str, str] = {}  # spec key path -> config field it came from
        self.seq_len: int | None = None  # sequence length given by the caller, if any
        self.prefix = ""  # a nested config's key in its wrapper's ("text_config."): errors name the full path
        self.nested: _Config | None = None  # a multimodal wrapper's language model (WRAPPERS)
        self.home: int | None = None  # a nested config's line in its wrapper (where its missing keys belong)

    def line(self, key: str) -> int | None:
        return self.key_lines.get(key, self.home)

    def error(self, msg: str, key: str) -> SpecError:
        return SpecError(msg, self.fname, self.line(key), self.prefix + key)

    def get(self, key: str, kind: str, default: Any = None, *, required: bool = False, spec_key: str | None = None,
            aliases: tuple[str, ...] = ()) -> Any:
        """Field `key` (or the first alias present), type-checked. Missing or null: `default` (noted) or an error."""
        name = next((k for k in (key, *aliases) if self.raw.get(k) is not None), None)
        for k in (key, *aliases):
            if k in self.raw:
                self.used.add(k)
        if name is None:
            if required:
                raise self.error("required field missing from the config", key)
            if default is not None:
                self.defaulted.append(f"{key}={default}")
            return default
        if spec_key:
            self.src[spec_key] = name
        if kind == "inert":
            self.inert.add(name)
        v = _typed(self.raw[name], kind, name, self)
        if kind == "posint" and v > MAX_INT.get(spec_key, v):  # the spec's bound, before a family loops over it
            raise self.error(f"must be at most {MAX_INT[spec_key]} ({spec_key}), got {v}", name)
        return v


def _typed(v: Any, kind: str, key: str, cfg: _Config) -> Any:
    if kind == "str":
        if not isinstance(v, str):
            raise cfg.error(f"expected a string, got {type(v).__name__}", key)
    elif kind == "bool":
        if not isinstance(v, bool):
            raise cfg.error(f"expected true or false, got {v!r}", key)
    elif kind in ("posint", "natural"):
        lo = 1 if kind == "posint" else 0
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= 10**12:
            raise cfg.error(f"expected a whole number in [{lo}, 1e12], got {str(v)[:40]}", key)
    elif kind in ("float", "prob"):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or abs(v) > 1e300 or not math.isfinite(v):
            raise cfg.error(f"expected a finite number, got {str(v)[:40]}", key)
        if v < 0 or (kind == "prob" and v >= 1):
            raise cfg.error(f"expected a number in [0, {'1)' if kind == 'prob' else 'inf)'}, got {v!r}", key)
        v = float(v)
    elif kind in ("any", "inert"):
        pass
    else:  # pragma: no cover - programming error
        raise AssertionError(kind)
    return v


def _top_level_key_lines(text: str) -> dict[str, int]:
    """Line number of each top-level key of a JSON object (last occurrence, as json.loads keeps the last value),
    by a small string-aware scan."""
    out: dict[str, int] = {}
    depth, line, i, n = 0, 1, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        elif c == '"':
            start, start_line = i + 1, line
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                elif text[i] == "\n":
                    line += 1
                i += 1
            if depth == 1:
                j = i + 1
                while j < n and text[j] in " \t\r\n":
                    j += 1
                if j < n and text[j] == ":":
                    try:
                        key = json.loads(text[start - 1:i + 1])
                    except ValueError:
                        key = text[start:i]
                    out[key] = start_line
        i += 1
    return out


def _load_json(path: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str, str]:
    """(data, text, file name) of a config.json, or of a config dict (its JSON text gives the line numbers)."""
    if isinstance(path, Mapping):
        try:
            text = json.dumps(path, indent=2, allow_nan=False, default=str)
        except (TypeError, ValueError) as e:
            raise SpecError(f"not a JSON config: {e}", "<config>") from None
        return json.loads(text), text, "<config>"
    path = Path(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            path = path / "config.json"
        else:
            raise SpecError("is a directory without a config.json", str(path))
    fname = str(path)
    raw = read_bounded(path, MAX_BYTES, "config.json")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpecError(f"not UTF-8 text (byte {e.start})", fname) from None

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not allowed")

    try:
        data = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise SpecError(f"not valid JSON: {e.msg} (column {e.colno})", fname, e.lineno) from None
    except ValueError as e:
        raise SpecError(f"not valid JSON: {e}", fname) from None
    except RecursionError:
        raise SpecError("not valid JSON: nesting too deep", fname) from None
    if not isinstance(data, dict):
        raise SpecError(f"top level must be a JSON object (a mapping), got {type(data).__name__}", fname, 1)
    return data, text, fname


# ---------------------------------------------------------------------------------------------
# Public API


def read_hf_config(path: str | Path, seq_len: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """Map a HuggingFace config.json onto the spec's YAML layout. Returns (spec dict, notes).

    `seq_len` replaces the sequence length taken from max_position_embeddings / n_positions.
    """
    out, notes, _ = _read(path, seq_len)
    return out, notes


def import_config(path: str | Path, seq_len: int | None = None) -> tuple[Spec, list[str]]:
    """Read a config.json and build the validated Spec (errors name the config file and field)."""
    out, notes, cfg = _read(path, seq_len)
    src = cfg.nested or cfg  # where the spec's keys came from: a wrapper's nested language model
    lines = {k: src.line(f) for k, f in src.src.items() if src.line(f)}
    try:
        spec = build_spec(out, lines, cfg.fname)
    except SpecError as e:
        field_name = src.src.get(e.key or "")
        key = f"{src.prefix}{field_name} ({e.key})" if field_name else e.key
        raise SpecError(e.message, cfg.fname, e.line, key) from None
    return spec, notes


def _read(path: str | Path, seq_len: int | None) -> tuple[dict[str, Any], list[str], _Config]:
    data, text, fname = _load_json(path)
    cfg = _Config(data, text, fname)
    cfg.seq_len = seq_len
    out, notes = _map(cfg)
    if seq_len is not None:
        notes.append(f"sequence.length {seq_len} as requested "
                     f"(the config's position embeddings allow up to {out['sequence']['length']})")
        out["sequence"]["length"] = seq_len
        (cfg.nested or cfg).src.pop("sequence.length", None)
    inner = cfg.nested
    defaulted = cfg.defaulted + ([inner.prefix + k for k in inner.defaulted] if inner else [])
    if defaulted:
        notes.append("not in the config, transformers' default used: " + ", ".join(defaulted))
    ignored = sorted(k for k in data if k not in cfg.used)
    if inner:
        ignored += sorted(inner.prefix + k for k in data[inner.prefix[:-1]]
                          if k not in inner.used and k != "model_type")
    if ignored:
        notes.append("ignored (no effect on signal propagation at initialisation): " + ", ".join(ignored))
    return out, notes, cfg


class _FlowDict(dict):
    pass


def to_yaml(spec_dict: dict[str, Any], notes: list[str] | tuple[str, ...] = (), source: str | None = None) -> str:
    """A readable YAML spec: notes as leading comments, sections in block style, small leaves inline."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(_FlowDict, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v, flow_style=True))
    Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))

    def wrap(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            items = {k: wrap(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
            scalars = all(not isinstance(v, (dict, list)) for v in node.values())
            leaf = scalars and path.startswith(("init.", "residual."))
            return _FlowDict(items) if leaf else items
        return node

    head = ["# initadvisor model spec"
            + (f", imported from {one_line(source)}" if source else ", imported from a HuggingFace config.json")]
    for note in notes:
        for i, para in enumerate(str(note).splitlines() or [""]):
            for j, ln in enumerate(textwrap.wrap(para, 96) or [""]):
                head.append(("# - " if i == 0 and j == 0 else "#   ") + ln)
    body = yaml.dump(wrap(spec_dict, ""), Dumper=Dumper, sort_keys=False, width=100, allow_unicode=True)
    return "\n".join(head) + "\n\n" + body


# ---------------------------------------------------------------------------------------------
# Dispatch on model_type (the family mappings are in families.py)


# The layer type names transformers (5.24) accepts in layer_types: ALLOWED_ATTN_LAYER_TYPES and the legacy names it
# maps onto them
LAYER_TYPES = {"full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
               "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe",
               "hybrid", "hybrid_sliding", "reference_sliding_attention", "linear_attention", "mamba", "attention",
               "deepseek_sparse_attention", "qwen_sparse_attention"}

# Multimodal wrappers whose language model is a supported family: model_type -> (its model_type, the key holding it,
# the nested config class's defaults for what the family mapping requires: transformers fills them in)
WRAPPERS = {"gemma3": ("gemma3_text", "text_config", {  # Gemma3TextConfig
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 131072})}


def _map(cfg: _Config) -> tuple[dict[str, Any], list[str]]:
    mt = cfg.get("model_type", "str", required=True)
    for key in ("layer_types", "mtp_layer_types"):  # transformers reads them in every family, as lists of names
        kinds = cfg.raw.get(key)
        if kinds is not None and not (isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)):
            raise cfg.error(f"expected a JSON array of layer type names or null, got {str(kinds)[:40]}", key)
    if mt in WRAPPERS:
        return _map_wrapped(cfg, mt)
    family = FAMILIES.get(mt)
    if family is None:
        raise cfg.error(f"unsupported model_type {mt!r} (supported: {', '.join(SUPPORTED)})", "model_type")
    notes: list[str] = []
    name = cfg.get("_name_or_path", "str") or mt
    out = family.to_spec(cfg, family, notes)
    model = out["model"]
    kinds = cfg.raw.get("layer_types")
    if kinds is not None:  # transformers checks them in every family: known names, one per layer
        if unknown := sorted(set(kinds) - LAYER_TYPES):
            raise cfg.error(f"unknown layer type {unknown[0][:40]!r} (known: {', '.join(sorted(LAYER_TYPES))})",
                            "layer_types")
        if len(kinds) != model["layers"]:
            raise cfg.error(f"{len(kinds)} layer types for {model['layers']} layers", "layer_types")
    head = model.get("head_dim") or model["d_model"] // model["heads"]
    if model.get("rope_theta") and "latent_attention" not in out and head % 2 \
            and int(head * model["rotary_fraction"]) == head:  # rotate_half pairs the head's coordinates
        raise cfg.error(f"a fully rotated head needs an even head_dim, got {head}",
                        cfg.src.get("model.head_dim", cfg.src.get("model.d_model", "head_dim")))
    af = rope_attention_factor(cfg) if model.get("rope_theta") and "latent_attention" not in out else 1.0
    if af != 1.0:  # the rotated share f of each head's logits times af^2: the variance of the logits times
        f = model["rotary_fraction"]  # f af^4 + 1 - f, which the softmax scale carries
        base = model.get("softmax_scale") or (model.get("head_dim") or model["d_model"] // model["heads"]) ** -0.5
        model["softmax_scale"] = base * math.sqrt(f * af**4 + 1.0 - f)
        notes.append(f"RoPE attention_factor {af:.6g}: the rotated queries and keys times it (transformers' cos and "
                     f"sin), in softmax_scale: {base:.6g} -> {model['softmax_scale']:.6g}")
    return {"version": VERSION, "name": name, **out}, notes


def language_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The config of the stack the spec models, for transformers to build: a multimodal wrapper's language model
    (its nested config; WRAPPERS), else `raw` itself."""
    if raw.get("model_type") not in WRAPPERS or not isinstance(raw.get(WRAPPERS[raw["model_type"]][1]), dict):
        return raw
    inner_type, key, _ = WRAPPERS[raw["model_type"]]
    return {**raw[key], "model_type": inner_type}


def transformers_config(raw: dict[str, Any], lean: str | None = None):
    """transformers' config of the stack the spec models (language_config). transformers (5.24 on) refuses what its
    strict fields do not type. A field it refuses that the import reads as missing (null), ignores or reads as of
    no effect at init is passed as null, then left out (transformers' default); a whole number in a float field is
    passed as that float. What else it refuses is raised. `lean` "null" or "drop": the fields the import ignores
    passed as null or left out, for a model transformers cannot build with them (a refusal that names no field
    takes "null", then "drop")."""
    import re

    from transformers import AutoConfig

    read = _read(raw, None)[2]
    read = read.nested or read
    cfg = dict(language_config(raw))
    unused = {k for k in cfg if k != "model_type" and k not in read.used}
    inert = unused | read.inert
    while True:
        if lean == "drop":
            cfg = {k: v for k, v in cfg.items() if k not in unused}
        elif lean == "null":  # and no padding row (a family's default pad_token_id may lie past a small vocabulary)
            cfg |= {k: None for k in unused if k in cfg}
            if "pad_token_id" not in read.used:
                cfg["pad_token_id"] = None
        try:
            return AutoConfig.for_model(**cfg)
        except Exception as e:  # noqa: BLE001 - transformers' validation errors have no common base
            refused = re.search(r"field '([^']+)'", str(e))
            key = refused.group(1) if refused else None
            v = cfg.get(key)
            if key in cfg and v is None:
                del cfg[key]
                unused.discard(key)
            elif key in inert:
                cfg[key] = None
            elif key in cfg and type(v) is int and "float" in str(e):
                cfg[key] = float(v)
            elif lean != "drop" and unused:  # a check that names no field: without what the import does not read
                lean = "drop" if lean else "null"
            else:
                raise


def _map_wrapped(cfg: _Config, mt: str) -> tuple[dict[str, Any], list[str]]:
    """A multimodal wrapper (Gemma 3's Gemma3ForConditionalGeneration): its language model, read from the nested
    config as its own family (transformers draws it with the nested config's initializer_range, not the wrapper's:
    measured on the real model)."""
    inner_type, key, defaults = WRAPPERS[mt]
    sub = cfg.get(key, "any", required=True)
    if not isinstance(sub, dict):
        raise cfg.error(f"expected a JSON object (the language model's {inner_type} config)", key)
    inner = _Config({**defaults, **sub, "model_type": inner_type}, "", cfg.fname)
    inner.key_lines = {k: cfg.line(key) for k in (*defaults, *sub, "model_type")}
    inner.home = cfg.line(key)
    inner.prefix, inner.seq_len, cfg.nested = key + ".", cfg.seq_len, inner
    inner.defaulted += [f"{k}={v}" for k, v in defaults.items() if sub.get(k) is None]
    out, notes = _map(inner)
    out["name"] = cfg.get("_name_or_path", "str") or mt
    notes.insert(0, f"model_type {mt!r}: the language model, from {key} ({inner_type}); the vision tower and the "
                    "multimodal projector are not modelled (text tokens only)")
    return out, notes
