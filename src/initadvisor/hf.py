"""Import a HuggingFace `config.json` as an initadvisor spec.

Reads the JSON file with the `json` module only (never the network, never `transformers`) and maps the fields
that matter for signal propagation at initialisation onto the spec's YAML layout. The family conventions
(norm placement, embeddings, initialisation) follow what `transformers` does when it builds a randomly
initialised model from the config (`AutoModel.from_config`), as of transformers 5.x:

* every `nn.Linear` / `Conv1D` weight and every `nn.Embedding` table ~ N(0, initializer_range^2), every bias 0,
  every norm gain 1 (`PreTrainedModel._init_weights`);
* GPT-2 re-draws both `c_proj` weights (attention output and MLP down projection) with
  std = initializer_range / sqrt(2 * n_layer) (`GPT2PreTrainedModel._init_weights`);
* GPT-NeoX, Llama, Mistral and Qwen2 use the plain rule for every matrix (no depth scaling).

Everything the theory cannot use is listed in the notes, so nothing is dropped silently.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

from .files import read_bounded
from .spec import MATRICES, Spec, SpecError, build_spec

SUPPORTED = ("bert", "roberta", "electra", "gpt2", "gpt_neox", "llama", "mistral", "qwen2")
MAX_BYTES = 10_000_000  # a config.json is a few kB

# hidden_act / activation_function -> spec activation (ungated MLPs).
# gelu_new, gelu_fast, gelu_accurate and gelu_pytorch_tanh all compute the tanh approximation of GELU.
_ACT = {
    "relu": "relu", "gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu",
    "tanh": "tanh", "linear": "linear",
}
# close approximations, mapped with a note
_ACT_APPROX = {"quick_gelu": "gelu", "gelu_10": "gelu"}
# gate activation of the gated MLPs (Llama family: down(act(gate(x)) * up(x)))
_GATED = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_python": "geglu"}
_GATED_APPROX = {"gelu_new": "geglu", "gelu_fast": "geglu", "gelu_accurate": "geglu", "gelu_pytorch_tanh": "geglu"}


class _Config:
    """The parsed JSON with bookkeeping: which fields were used, which defaulted, where each one is."""

    def __init__(self, raw: dict[str, Any], text: str, fname: str):
        self.raw, self.fname = raw, fname
        self.used: set[str] = set()
        self.defaulted: list[str] = []
        self.key_lines = _top_level_key_lines(text)
        self.src: dict[str, str] = {}  # spec key path -> config field it came from
        self.seq_len: int | None = None  # sequence length given by the caller, if any

    def line(self, key: str) -> int | None:
        return self.key_lines.get(key)

    def error(self, msg: str, key: str) -> SpecError:
        return SpecError(msg, self.fname, self.line(key), key)

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
        return _typed(self.raw[name], kind, name, self)


def _typed(v: Any, kind: str, key: str, cfg: _Config) -> Any:
    if kind == "str":
        if not isinstance(v, str):
            raise cfg.error(f"expected a string, got {type(v).__name__}", key)
    elif kind == "bool":
        if not isinstance(v, bool):
            raise cfg.error(f"expected true or false, got {v!r}", key)
    elif kind == "posint":
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 10**12:
            raise cfg.error(f"expected a whole number in [1, 1e12], got {str(v)[:40]}", key)
    elif kind in ("float", "prob"):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or abs(v) > 1e300 or not math.isfinite(v):
            raise cfg.error(f"expected a finite number, got {str(v)[:40]}", key)
        if v < 0 or (kind == "prob" and v >= 1):
            raise cfg.error(f"expected a number in [0, {'1)' if kind == 'prob' else 'inf)'}, got {v!r}", key)
        v = float(v)
    elif kind == "any":
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


def _load_json(path: str | Path) -> tuple[dict[str, Any], str, str]:
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
    lines = {k: cfg.line(f) for k, f in cfg.src.items() if cfg.line(f)}
    try:
        spec = build_spec(out, lines, cfg.fname)
    except SpecError as e:
        field_name = cfg.src.get(e.key or "")
        key = f"{field_name} ({e.key})" if field_name else e.key
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
        cfg.src.pop("sequence.length", None)
    if cfg.defaulted:
        notes.append("not in the config, transformers' default used: " + ", ".join(cfg.defaulted))
    ignored = sorted(k for k in data if k not in cfg.used)
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
            + (f", imported from {source}" if source else ", imported from a HuggingFace config.json")]
    for note in notes:
        for i, para in enumerate(str(note).splitlines() or [""]):
            for j, ln in enumerate(textwrap.wrap(para, 96) or [""]):
                head.append(("# - " if i == 0 and j == 0 else "#   ") + ln)
    body = yaml.dump(wrap(spec_dict, ""), Dumper=Dumper, sort_keys=False, width=100, allow_unicode=True)
    return "\n".join(head) + "\n\n" + body


# ---------------------------------------------------------------------------------------------
# Family mappings


def _map(cfg: _Config) -> tuple[dict[str, Any], list[str]]:
    mt = cfg.get("model_type", "str", required=True)
    if mt not in SUPPORTED:
        raise cfg.error(f"unsupported model_type {mt!r} (supported: {', '.join(SUPPORTED)})", "model_type")
    notes: list[str] = []
    name = cfg.get("_name_or_path", "str") or mt
    if mt in ("bert", "roberta", "electra"):
        out = _bert_like(cfg, mt, notes)
    elif mt == "gpt2":
        out = _gpt2(cfg, notes)
    elif mt == "gpt_neox":
        out = _gpt_neox(cfg, notes)
    else:
        out = _llama_like(cfg, mt, notes)
    return {"name": name, **out}, notes


def _activation(cfg: _Config, key: str, default: str, gated: bool, notes: list[str],
                aliases: tuple[str, ...] = ()) -> str:
    act = cfg.get(key, "str", default, spec_key="model.activation", aliases=aliases)
    exact, approx = (_GATED, _GATED_APPROX) if gated else (_ACT, _ACT_APPROX)
    if act in exact:
        return exact[act]
    if act in approx:
        notes.append(f"{key} {act!r} approximated by '{approx[act]}'")
        return approx[act]
    what = "gate activation" if gated else "activation"
    supported = sorted(set(exact) | set(approx))
    raise cfg.error(f"unsupported {what} {act!r} (supported: {', '.join(supported)})", key)


def _init_std(cfg: _Config, notes: list[str]) -> float:
    r = cfg.get("initializer_range", "float", 0.02, spec_key="init.std")
    if r == 0:  # PreTrainedModel._init_weights: `std = config.initializer_range or 0.02`
        notes.append("initializer_range 0 is replaced by 0.02 in transformers (`initializer_range or 0.02`)")
        return 0.02
    return r


def _init(std: float, **per_matrix: float) -> dict[str, Any]:
    init: dict[str, Any] = {"std": std}
    for m in MATRICES:
        init[m] = {"std": per_matrix.get(m, std), "bias_std": 0.0}
    return init


def _attention_scale(d: int, heads: int, head_dim: int, scale: float) -> float | None:
    """softmax_scale in the spec's terms (logits = scale * sum over d_model/heads coordinates), None if standard.

    The real logit sums head_dim products; keeping its variance scale^2 * head_dim gives the spec's scale."""
    s = scale * math.sqrt(head_dim / (d // heads)) if d >= heads else scale
    return None if math.isclose(s, 1.0 / math.sqrt(max(d // heads, 1)), rel_tol=1e-12) else s


def _cross_attention(cfg: _Config, notes: list[str]) -> bool:
    if cfg.get("add_cross_attention", "bool", None):
        notes.append("add_cross_attention: the cross-attention blocks of an encoder-decoder are not modelled")
        return True
    return False


def _seq(cfg: _Config, key: str, aliases: tuple[str, ...] = ()) -> int:
    return cfg.get(key, "posint", required=True, spec_key="sequence.length", aliases=aliases)


def _shape(cfg: _Config) -> tuple[int, int, int, int]:
    """Depth, width, heads and FFN width under the field names BERT-style, GPT-NeoX and Llama configs share."""
    g = cfg.get
    return (g("num_hidden_layers", "posint", required=True, spec_key="model.layers"),
            g("hidden_size", "posint", required=True, spec_key="model.d_model"),
            g("num_attention_heads", "posint", required=True, spec_key="model.heads"),
            g("intermediate_size", "posint", required=True, spec_key="model.d_ff"))


def _bert_like(cfg: _Config, mt: str, notes: list[str]) -> dict[str, Any]:
    g = cfg.get
    layers, d, heads, d_ff = _shape(cfg)
    act = _activation(cfg, "hidden_act", "gelu", False, notes)
    causal = g("is_decoder", "bool", None, spec_key="model.causal") or False
    if causal:
        notes.append("is_decoder: true, so self-attention is causal")
    _cross_attention(cfg, notes)
    n_pos = _seq(cfg, "max_position_embeddings")
    length = n_pos
    if mt == "roberta":
        pad = g("pad_token_id", "any", None)
        pad = pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else 1
        length = n_pos - (pad + 1)
        notes.append(f"RoBERTa position ids start at pad_token_id + 1 = {pad + 1}: "
                     f"sequence.length = max_position_embeddings {n_pos} - {pad + 1} = {length}")
        if length < 2:
            raise cfg.error(f"leaves a sequence length of {length} after RoBERTa's padding offset {pad + 1}",
                            "max_position_embeddings")
    pos_type = g("position_embedding_type", "str", None)
    if pos_type not in (None, "absolute"):
        notes.append(f"position_embedding_type {pos_type!r}: transformers 5.x builds absolute position "
                     "embeddings regardless; mapped as absolute, relative position terms not modelled")
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    type_vocab = g("type_vocab_size", "any", 2)
    embeddings = ["token", "position"]
    if isinstance(type_vocab, int) and not isinstance(type_vocab, bool) and type_vocab >= 1:
        embeddings.append("segment")
        notes.append("segment embedding: token_type_ids default to 0, so one token_type row is shared by all tokens")
    if mt == "electra":
        e = g("embedding_size", "posint", 128)
        if e != d:
            notes.append(f"ELECTRA embedding_size {e} != hidden_size {d}: the embeddings_project linear map "
                         f"(std initializer_range, zero bias) after the embedding LayerNorm is not modelled; the spec "
                         f"takes the layer-0 input as the LayerNorm output (second moment 1), the real one has second "
                         f"moment about initializer_range^2 * {e}")
    std = _init_std(cfg, notes)
    drop = g("hidden_dropout_prob", "prob", 0.1, spec_key="dropout")
    attn_drop = g("attention_probs_dropout_prob", "prob", 0.1, spec_key="attention_dropout")
    return {
        "model": {"layers": layers, "d_model": d, "heads": heads, "kv_heads": heads, "d_ff": d_ff, "norm": "post",
                  "norm_type": "layernorm", "attention": "softmax", "out_proj": True, "causal": causal,
                  "activation": act, "embedding_norm": True, "parallel_residual": False},
        "sequence": {"length": length, "vocab": vocab, "embeddings": embeddings},
        "dropout": drop, "attention_dropout": attn_drop,
        "init": _init(std),
    }


def _dropouts(cfg: _Config, notes: list[str], resid: str, emb: str, default: float) -> float:
    r = cfg.get(resid, "prob", default, spec_key="dropout")
    e = cfg.get(emb, "prob", default)
    if r != e:
        notes.append(f"embedding dropout {emb}={e} differs from residual dropout {resid}={r}: "
                     f"the spec has one dropout rate, {resid} used")
    return r


def _rotary_note(cfg: _Config, notes: list[str], partial_key: str | None = None) -> None:
    rp = cfg.raw.get("rope_parameters")
    rp = rp if isinstance(rp, dict) else {}
    rs = cfg.raw.get("rope_scaling")
    rs = rs if isinstance(rs, dict) else {}
    frac = rp.get("partial_rotary_factor", cfg.raw.get("partial_rotary_factor"))
    if partial_key and cfg.raw.get(partial_key) is not None:
        frac = cfg.raw[partial_key]
    where = "" if frac in (None, 1, 1.0) else f" (on a fraction {frac} of each head's dimensions)"
    notes.append(f"rotary position embedding{where} is not modelled: the spec has token embeddings only, so "
                 "attention logits at initialisation carry no position information")
    rtype = rp.get("rope_type") or rs.get("rope_type") or rs.get("type")
    if rtype not in (None, "default"):
        notes.append(f"rope_type {rtype!r}: RoPE scaling (and any attention_factor it applies to the logits) "
                     "is not modelled")


def _decoder(layers: int, d: int, heads: int, kv: int, d_ff: int, act: str, norm_type: str, parallel: bool,
             scale: float | None) -> dict[str, Any]:
    """The `model` section of a pre-LN causal decoder (GPT-2, GPT-NeoX, Llama family)."""
    model = {"layers": layers, "d_model": d, "heads": heads, "kv_heads": kv, "d_ff": d_ff, "norm": "pre",
             "norm_type": norm_type, "attention": "softmax", "out_proj": True, "causal": True, "activation": act,
             "embedding_norm": False, "parallel_residual": parallel}
    if scale is not None:
        model["softmax_scale"] = scale
    return model


def _gpt2(cfg: _Config, notes: list[str]) -> dict[str, Any]:
    g = cfg.get
    layers = g("n_layer", "posint", required=True, spec_key="model.layers", aliases=("num_hidden_layers",))
    d = g("n_embd", "posint", required=True, spec_key="model.d_model", aliases=("hidden_size",))
    heads = g("n_head", "posint", required=True, spec_key="model.heads", aliases=("num_attention_heads",))
    n_inner = g("n_inner", "posint", None, spec_key="model.d_ff")
    d_ff = n_inner if n_inner is not None else 4 * d
    if n_inner is None:
        notes.append(f"n_inner is null: d_ff = 4 * n_embd = {d_ff}")
    act = _activation(cfg, "activation_function", "gelu_new", False, notes)
    length = _seq(cfg, "n_positions", aliases=("n_ctx", "max_position_embeddings"))
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    _cross_attention(cfg, notes)
    scale_weights = g("scale_attn_weights", "bool", True, spec_key="model.softmax_scale")
    d_head = d // heads if d >= heads else 1
    scale = _attention_scale(d, heads, d_head, 1.0 / math.sqrt(d_head) if scale_weights else 1.0)
    if not scale_weights:
        notes.append("scale_attn_weights: false, so attention logits are not divided by sqrt(head_dim): "
                     "softmax_scale 1")
    if g("scale_attn_by_inverse_layer_idx", "bool", None):
        notes.append("scale_attn_by_inverse_layer_idx: true divides layer l's logits by l + 1 (l = 0, 1, ...): "
                     "per-layer scales are not modelled, the spec uses layer 0's for every layer")
    std = _init_std(cfg, notes)
    proj = std / math.sqrt(2 * layers)
    notes.append(f"GPT-2 init: both c_proj weights (attention output, MLP down projection) have std "
                 f"initializer_range / sqrt(2 * n_layer) = {std:g} / sqrt({2 * layers}) = {proj:.6g}")
    drop = _dropouts(cfg, notes, "resid_pdrop", "embd_pdrop", 0.1)
    attn_drop = g("attn_pdrop", "prob", 0.1, spec_key="attention_dropout")
    return {
        "model": _decoder(layers, d, heads, heads, d_ff, act, "layernorm", False, scale),
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token", "position"]},
        "dropout": drop, "attention_dropout": attn_drop,
        "init": _init(std, o=proj, ff_out=proj),
    }


def _gpt_neox(cfg: _Config, notes: list[str]) -> dict[str, Any]:
    g = cfg.get
    layers, d, heads, d_ff = _shape(cfg)
    act = _activation(cfg, "hidden_act", "gelu", False, notes)
    parallel = g("use_parallel_residual", "bool", True, spec_key="model.parallel_residual")
    length = _seq(cfg, "max_position_embeddings")
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    _rotary_note(cfg, notes, "rotary_pct")
    std = _init_std(cfg, notes)
    drop = g("hidden_dropout", "prob", 0.0, spec_key="dropout")  # embedding dropout uses the same rate
    attn_drop = g("attention_dropout", "prob", 0.0, spec_key="attention_dropout")
    return {
        "model": _decoder(layers, d, heads, heads, d_ff, act, "layernorm", parallel, None),
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        "dropout": drop, "attention_dropout": attn_drop,
        "init": _init(std),
    }


def _llama_like(cfg: _Config, mt: str, notes: list[str]) -> dict[str, Any]:
    g = cfg.get
    layers, d, heads, d_ff = _shape(cfg)
    kv = g("num_key_value_heads", "posint", None, spec_key="model.kv_heads")
    kv = heads if kv is None else kv
    act = _activation(cfg, "hidden_act", "silu", True, notes)
    length = _seq(cfg, "max_position_embeddings")
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    head_dim = g("head_dim", "posint", None, spec_key="model.softmax_scale") or (d // heads if d >= heads else 1)
    scale = _attention_scale(d, heads, head_dim, head_dim ** -0.5)
    if heads * head_dim != d:
        notes.append(f"head_dim {head_dim} != hidden_size / num_attention_heads = {d / heads:g}: the spec assumes "
                     f"heads * head_dim = d_model; the logit variance (scale head_dim^-0.5 over head_dim terms) is "
                     f"that of the spec's default softmax_scale, but the output projection's fan-in "
                     f"{heads * head_dim} is taken as {d}")
    _rotary_note(cfg, notes)
    _sliding_window(cfg, mt, layers, length, notes)
    std = _init_std(cfg, notes)
    attn_drop = g("attention_dropout", "prob", 0.0, spec_key="attention_dropout")
    return {
        "model": _decoder(layers, d, heads, kv, d_ff, act, "rmsnorm", False, scale),
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        "dropout": 0.0,  # no embedding or residual dropout in these families
        "attention_dropout": attn_drop,
        "init": _init(std),
    }


def _sliding_window(cfg: _Config, mt: str, layers: int, length: int, notes: list[str]) -> None:
    if mt == "llama":
        return
    g = cfg.get
    if mt == "mistral":
        window = g("sliding_window", "posint", 4096 if "sliding_window" not in cfg.raw else None)
        n_sliding = layers if window is not None else 0
    else:  # qwen2: the config nulls sliding_window unless use_sliding_window; layer_types says which layers
        if not g("use_sliding_window", "bool", False):
            return
        window = g("sliding_window", "posint", 4096 if "sliding_window" not in cfg.raw else None)
        types = cfg.raw.get("layer_types")
        if isinstance(types, list):
            cfg.used.add("layer_types")
            n_sliding = sum(t == "sliding_attention" for t in types)
        else:
            mwl = g("max_window_layers", "any", 28)
            mwl = mwl if isinstance(mwl, int) and not isinstance(mwl, bool) else 28
            n_sliding = max(layers - mwl, 0)
    length = cfg.seq_len or length
    if n_sliding and window is not None and window < length:
        notes.append(f"sliding-window attention (window {window}) in {n_sliding} of {layers} layers is not "
                     f"modelled: the spec attends over the whole causal prefix of {length} tokens")
