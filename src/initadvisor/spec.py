"""Model spec: YAML parsing with line numbers, validation, defaults, normalisation.

Everything a user can get wrong is reported as a `SpecError` naming the file, the key and its line;
the CLI turns it into one line on stderr and exit code 2.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from initadvisor.errors import SpecError, one_line  # noqa: F401  (re-exported: the historical home)

MATRICES = ("q", "k", "v", "o", "ff_in", "ff_out", "embedding")
NORMS = ("post", "pre", "sandwich", "reordered", "none")  # sandwich: Gemma 2/3; reordered: OLMo 2
NORM_TYPES = ("layernorm", "rmsnorm")
QK_NORMS = ("none", "head", "all")  # a norm on the queries and keys: none, per head (Qwen3), over all heads (OLMo 2)
ATTENTIONS = ("softmax", "centered")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "tanh", "linear", "swiglu", "geglu")
EMBEDDINGS = ("token", "position", "segment")
ROUTERS = ("softmax", "sigmoid")  # a mixture of experts' router (initadvisor.core.routing)
MAX_NODES = 20_000  # YAML nodes visited at most: a spec is small, an alias bomb is not
MAX_BYTES = 1 << 20  # a spec file is a few hundred bytes; refuse anything over 1 MiB before parsing it
VERSION = 1  # the spec format version this initadvisor reads and writes (the top-level `version` key)
MAX_INT = {"latent_attention.q_rank": 1_000_000, "latent_attention.kv_rank": 1_000_000,
           "latent_attention.nope_dim": 100_000, "latent_attention.rope_dim": 100_000, "latent_attention.v_dim": 100_000,
           "model.layers": 100_000, "model.d_model": 1_000_000, "model.heads": 1_000_000, "model.head_dim": 1_000_000,
           "model.embedding_width": 1_000_000, "model.kv_heads": 1_000_000, "model.d_ff": 10_000_000, "sequence.length": 10_000_000,
           "moe.experts": 4096, "moe.top_k": 4096, "moe.d_ff": 10_000_000, "moe.shared_experts": 4096}


@dataclass(frozen=True)
class MatrixInit:
    std: float
    bias_std: float = 0.0


@dataclass(frozen=True)
class Residual:
    skip: float = 1.0
    block: float = 1.0


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts MLP in every block but `dense_blocks` (the `moe` section)."""

    experts: int
    top_k: int = 1
    router: str = "softmax"  # softmax | sigmoid (core.routing)
    normalize: bool = True  # the top-k weights divided by their sum
    scale: float = 1.0  # the routed weights times this (DeepSeek's routed_scaling_factor)
    d_ff: int = 0  # each expert's hidden width
    shared: int = 0  # always-on experts of width d_ff, added unweighted
    dense_blocks: tuple[int, ...] = ()  # blocks (from 1) with the dense MLP of model.d_ff instead
    router_std: float = 0.02
    groups: int = 1  # group-limited routing: experts in groups, the top k within the best top_groups (DeepSeek-V3)
    top_groups: int = 1


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention (DeepSeek-V2/V3, the `latent_attention` section): queries from a q_rank-wide
    latent (q_a_proj, RMSNorm, q_b_proj = init.q; none: init.q straight from h), keys' nope_dim and values' v_dim
    coordinates per head from one kv_rank-wide latent (kv_a_proj, RMSNorm, kv_b_proj = init.k and init.v), a
    rope_dim-wide rotary key from h (kv_a_proj's extra rows, std down_std), shared by the heads; o = init.o."""

    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    q_rank: int | None = None
    down_std: float = 0.02  # the down projections' std: it sets the rotary key (the latents are normed)


@dataclass(frozen=True)
class Spec:
    """A validated, normalised model spec (every default filled in)."""

    name: str
    layers: int
    d_model: int
    heads: int
    d_ff: int
    norm: str
    norm_type: str
    attention: str
    out_proj: bool
    causal: bool
    activation: str
    softmax_scale: float
    embedding_norm: bool
    kv_heads: int
    parallel_residual: bool
    seq_len: int
    vocab: int
    input_correlation: float | None  # None: "auto", derived from the embeddings
    embeddings: tuple[str, ...]
    dropout: float
    attention_dropout: float
    init: dict[str, MatrixInit]
    qk_beta: float | None
    res_attention: Residual
    res_mlp: Residual
    thresholds: dict[str, float] = field(default_factory=dict)
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    # the output head (initadvisor.loss): a final norm, tied or own matrix, BERT's MLM transform, soft-capping
    final_norm: bool = True
    tie_embeddings: bool = True
    head_transform: bool = False
    logit_softcap: float | None = None
    head: MatrixInit | None = None  # the untied head's init; None when tied (it is the token embedding)
    qk_norm: str = "none"  # QK_NORMS; the norm is of norm_type, with unit gains (their init in every family)
    norm_eps: float = 0.0  # every norm's epsilon: x / sqrt(mean x^2 + eps)
    embedding_scale: float = 1.0  # the summed embedding tables times this entering the stream (Gemma: sqrt(d))
    embedding_width: int | None = None  # the tables' width where a linear map takes them to d_model (ELECTRA)
    embedding_dropout: float | None = None  # the embeddings' dropout rate; None: `dropout`
    mlp_dropout: float = 0.0  # dropout on the MLP's hidden units (T5), besides `dropout` on the branch's output
    head_dim: int | None = None  # each head's width when heads * head_dim != d_model (Qwen3, Gemma); None: d / heads
    moe: Experts | None = None  # mixture-of-experts MLPs; None: dense
    latent: Latent | None = None  # multi-head latent attention; None: standard
    depth_alpha: float = 0.0  # every branch times layers^-depth_alpha (depth-muP 1/2, CompleteP 1)
    layernorm_scaling: bool = False  # the norm before each branch of block l times 1 / sqrt(l) (Sun et al. 2025)
    rope_theta: float | None = None  # rotary position embedding's base; None: no rotary embedding
    rotary_fraction: float = 1.0  # the share of each head's coordinates it turns
    sliding_window: int | None = None  # a local layer's keys per row: causal the last W, else |m - s| <= W // 2
    window_blocks: tuple[int, ...] | None = None  # blocks (from 1) with the window; None: all
    alibi: bool = False  # ALiBi (BLOOM): head h's logits minus m_h (t - s), slopes 2^(-8 h / heads)
    alibi_scale: float = 1.0  # the slopes times this (Falcon: 1 / sqrt(d_head), its biases scaled with the logits)
    source: str | None = field(default=None, compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)  # what an import could not model
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def d_head(self) -> int:
        """Each head's query/key width."""
        if self.latent:
            return self.latent.nope_dim + self.latent.rope_dim
        return self.head_dim or self.d_model // self.heads

    def fan_in(self, matrix: str) -> int:
        fans = {"ff_out": self.d_ff, "embedding": 1, "o": self.heads * self.d_head}
        if self.latent:  # the up projections read the latents; o the heads' values
            A = self.latent
            fans.update(q=A.q_rank or self.d_model, k=A.kv_rank, v=A.kv_rank, o=self.heads * A.v_dim)
        return fans.get(matrix, self.d_model)

    def gain(self, matrix: str) -> float:
        """std^2 x fan-in: the factor a matrix multiplies a per-coordinate second moment by."""
        return self.init[matrix].std ** 2 * self.fan_in(matrix)

    @property
    def head_init(self) -> MatrixInit:
        """The output matrix's init: the token embedding's when tied (no bias), else init.head."""
        if self.tie_embeddings or self.head is None:
            return MatrixInit(self.init["embedding"].std)
        return self.head

    def qk_std_for_beta(self, beta: float) -> float:
        """Per-matrix Q/K std realising Giorlandino-Goldt's beta: s_Q s_K d scale sqrt(d_head) = beta sqrt(ln T)."""
        return math.sqrt(beta * math.sqrt(math.log(self.seq_len)) / (self.d_model * self.softmax_scale
                                                                        * math.sqrt(self.d_head)))

    def scale_for_beta(self, beta: float) -> float:
        """With a QK-norm (unit-variance queries and keys), the softmax scale realising beta:
        scale sqrt(d_head) = beta sqrt(ln T)."""
        return beta * math.sqrt(math.log(self.seq_len)) / math.sqrt(self.d_head)

    def with_beta(self, beta: float) -> "Spec":
        """The spec with its attention at beta: Q/K stds, or the softmax scale under a QK-norm (which fixes the
        logits' scale whatever the Q/K stds)."""
        if self.qk_norm != "none":
            return replace(self, softmax_scale=self.scale_for_beta(beta))
        if self.latent:  # the logits are linear in the softmax scale (the latents are normed)
            from initadvisor.stack import spec_beta

            return replace(self, softmax_scale=self.softmax_scale * beta / spec_beta(self))
        std = self.qk_std_for_beta(beta)
        init = {**self.init, "q": replace(self.init["q"], std=std), "k": replace(self.init["k"], std=std)}
        return replace(self, init=init, qk_beta=None)

    def line_of(self, key: str) -> int | None:
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key.rpartition(".")[0]
        return None

    def with_overrides(self, **kw: Any) -> "Spec":
        """Copy with top-level fields replaced (command-line overrides), re-validated; at another depth the
        per-block lists (window_blocks, moe.dense_blocks) keep the blocks that still exist."""
        out = replace(self, **{k: v for k, v in kw.items() if v is not None})
        if out.window_blocks and out.layers < self.layers:
            out = replace(out, window_blocks=tuple(b for b in out.window_blocks if b <= out.layers))
        if out.moe and out.layers < self.layers:
            out = replace(out, moe=replace(out.moe, dense_blocks=tuple(b for b in out.moe.dense_blocks
                                                                       if b <= out.layers)))
        _check_consistency(out)
        return _resolve_qk_beta(out)

    def to_dict(self) -> dict[str, Any]:
        """The normalised spec in the YAML layout, defaults filled in; `build_spec` reads it back."""
        given = self.qk_beta is not None  # what follows from qk_beta is not written: the Q/K stds, or (latent
        skip = ("q", "k") if given and not self.latent else ()  # attention: its up projections' gains) the scale
        scale = None if given and self.latent else self.softmax_scale
        init: dict[str, Any] = {m: {"std": i.std, "bias_std": i.bias_std}
                                for m, i in self.init.items() if m not in skip}
        if not self.tie_embeddings and self.head is not None:
            init["head"] = {"std": self.head.std, "bias_std": self.head.bias_std}
        init["qk_beta"] = self.qk_beta
        return {
            "version": VERSION,
            "name": self.name,
            "model": {
                "layers": self.layers, "d_model": self.d_model, "heads": self.heads, "kv_heads": self.kv_heads,
                "d_ff": self.d_ff, "norm": self.norm, "norm_type": self.norm_type, "attention": self.attention,
                "out_proj": self.out_proj, "causal": self.causal, "activation": self.activation,
                "softmax_scale": scale, "embedding_norm": self.embedding_norm,
                "parallel_residual": self.parallel_residual, "final_norm": self.final_norm,
                "tie_embeddings": self.tie_embeddings, "head_transform": self.head_transform,
                "logit_softcap": self.logit_softcap, "qk_norm": self.qk_norm, "norm_eps": self.norm_eps,
                "embedding_scale": self.embedding_scale, "embedding_width": self.embedding_width,
                "head_dim": self.head_dim, "layernorm_scaling": self.layernorm_scaling, "rope_theta": self.rope_theta,
                "rotary_fraction": self.rotary_fraction, "sliding_window": self.sliding_window,
                "window_blocks": None if self.window_blocks is None else list(self.window_blocks),
                "alibi": self.alibi, "alibi_scale": self.alibi_scale,
            },
            "sequence": {
                "length": self.seq_len, "vocab": self.vocab,
                "input_correlation": "auto" if self.input_correlation is None else self.input_correlation,
                "embeddings": list(self.embeddings),
            },
            "dropout": self.dropout,
            "embedding_dropout": self.embedding_dropout,
            "mlp_dropout": self.mlp_dropout,
            "attention_dropout": self.attention_dropout,
            "init": init,
            "residual": {
                "attention": {"skip": self.res_attention.skip, "block": self.res_attention.block},
                "mlp": {"skip": self.res_mlp.skip, "block": self.res_mlp.block},
                "depth_alpha": self.depth_alpha,
            },
            "thresholds": dict(self.thresholds),
            "select": list(self.select),
            "ignore": list(self.ignore),
            **({} if self.moe is None else {"moe": {
                "experts": self.moe.experts, "top_k": self.moe.top_k, "router": self.moe.router,
                "normalize": self.moe.normalize, "scale": self.moe.scale, "d_ff": self.moe.d_ff,
                "shared_experts": self.moe.shared, "dense_blocks": list(self.moe.dense_blocks),
                "router_std": self.moe.router_std, "groups": self.moe.groups, "top_groups": self.moe.top_groups}}),
            **({} if self.latent is None else {"latent_attention": {
                "q_rank": self.latent.q_rank, "kv_rank": self.latent.kv_rank, "nope_dim": self.latent.nope_dim,
                "rope_dim": self.latent.rope_dim, "v_dim": self.latent.v_dim, "down_std": self.latent.down_std}}),
        }


# ---------------------------------------------------------------------------------------------
# Schema: key -> (kind, default). Kinds: int, float, bool, str, choice tuple, or a nested dict.

THRESHOLDS = {
    "rank_collapse_rho": 0.99,  # rho at or above this at some layer: rank collapse (error)
    "collapse_trend_rho": 0.9,  # final rho at or above this: collapse trend (warning)
    "grad_explode": 1e3,  # end-to-end gradient second-moment ratio above this: exploding (error)
    "grad_vanish": 1e-3,  # ... below this: vanishing (error)
    "qk_grad_ratio_min": 1e-4,  # Noci query/key-to-value gradient ratio below this: vanishing Q/K gradient
    "forward_ratio_max": 1e6,  # q_L / q_1 above this or below its inverse: forward variance explodes or dies
    "initial_loss_excess": 1.0,  # expected step-0 loss above ln V by more than this (nats): over-confident logits
    "router_shrink": 0.25,  # top_k x sum_j w_j^2 of a mixture of experts below this: the router shrinks the branch
}

THRESHOLD_RANGE = (1e-12, 1e12)
_MATRIX = {"std": "pos", "gain": "pos", "bias_std": "nonneg"}
_RES = {"skip": "nonneg", "block": "nonneg"}
SCHEMA: dict[str, Any] = {
    "version": (VERSION,),
    "name": "str",
    "model": {
        "layers": "posint", "d_model": "posint", "heads": "posint", "kv_heads": "posint", "d_ff": "posint",
        "norm": NORMS, "norm_type": NORM_TYPES, "attention": ATTENTIONS, "out_proj": "bool", "causal": "bool",
        "activation": ACTIVATIONS, "softmax_scale": "pos?", "embedding_norm": "bool?", "parallel_residual": "bool",
        "final_norm": "bool", "tie_embeddings": "bool", "head_transform": "bool", "logit_softcap": "pos?",
        "qk_norm": QK_NORMS, "norm_eps": "eps", "embedding_scale": "pos", "embedding_width": "posint?",
        "head_dim": "posint?",
        "layernorm_scaling": "bool", "rope_theta": "base?", "rotary_fraction": "fraction",
        "sliding_window": "posint?", "window_blocks": "blocks?", "alibi": "bool",
        "alibi_scale": "pos",
    },
    "sequence": {"length": "posint", "vocab": "posint", "input_correlation": "corr", "embeddings": "embeddings"},
    "dropout": "prob",
    "embedding_dropout": "prob?",
    "mlp_dropout": "prob",
    "attention_dropout": "prob",
    "init": {"std": "pos", "qk_beta": "pos?", **{m: _MATRIX for m in MATRICES}, "head": _MATRIX},
    "residual": {"attention": _RES, "mlp": _RES, "depth_alpha": "alpha"},
    "thresholds": {k: "threshold" for k in THRESHOLDS},
    "moe": {"experts": "posint", "top_k": "posint", "router": ROUTERS, "normalize": "bool", "scale": "pos",
            "d_ff": "posint?", "shared_experts": "count", "dense_blocks": "blocks", "router_std": "pos?",
            "groups": "posint", "top_groups": "posint"},
    "latent_attention": {"q_rank": "posint?", "kv_rank": "posint", "nope_dim": "posint", "rope_dim": "count",
                         "v_dim": "posint", "down_std": "pos?"},
    "select": "codes",
    "ignore": "codes",
}
REQUIRED = ("model.layers", "model.d_model", "model.heads")


def load_spec(path: str | Path, project: dict[str, Any] | None = None) -> Spec:
    """Read and validate a YAML spec file; `project` ([tool.initadvisor]) supplies lower-priority defaults."""
    from initadvisor.files import read_bounded

    fname = str(path)
    raw = read_bounded(path, MAX_BYTES, "spec file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"not UTF-8 text (byte {e.start})", fname) from None
    return parse_spec(text, fname, project)


def parse_spec(text: str, fname: str = "<spec>", project: dict[str, Any] | None = None) -> Spec:
    if len(text) > MAX_BYTES:
        raise SpecError(f"spec too large ({len(text)} characters; at most {MAX_BYTES})", fname)
    data, lines = _yaml_to_plain(text, fname)
    if data is None:
        raise SpecError("empty spec: expected a mapping with at least a 'model' section", fname, 1)
    if not isinstance(data, dict):
        raise SpecError("top level must be a mapping (key: value)", fname, 1)
    return build_spec(data, lines, fname, project)


def _yaml_to_plain(text: str, fname: str) -> tuple[Any, dict[str, int]]:
    """Compose YAML safely into plain Python objects, recording each key path's line."""
    import yaml

    class CountingLoader(yaml.SafeLoader):
        """Stops composing after MAX_NODES nodes (aliases count each time they are used)."""

        nodes = 0

        def compose_node(self, parent, index):  # noqa: D401
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise SpecError(f"too many YAML nodes (over {MAX_NODES})", fname, self.line + 1)
            return super().compose_node(parent, index)

    try:
        node = yaml.compose(text, Loader=CountingLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise SpecError(f"malformed YAML: {e.problem or e.context}", fname, line) from None
    except yaml.YAMLError as e:
        raise SpecError(f"malformed YAML: {e}", fname) from None
    except RecursionError:
        raise SpecError("malformed YAML: nesting too deep", fname) from None
    if node is None:
        return None, {}
    lines: dict[str, int] = {}
    budget = [MAX_NODES]
    constructor = yaml.SafeLoader("")

    def walk(n: Any, path: str, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise SpecError(f"too many YAML nodes (over {MAX_NODES}; aliases expanded)", fname, n.start_mark.line + 1)
        if depth > 20:
            raise SpecError("nesting too deep", fname, n.start_mark.line + 1, path or None)
        if isinstance(n, yaml.MappingNode):
            out: dict[str, Any] = {}
            for k, v in n.value:
                if not isinstance(k, yaml.ScalarNode):
                    raise SpecError("keys must be plain names", fname, k.start_mark.line + 1, path or None)
                key = str(k.value)
                kp = f"{path}.{key}" if path else key
                if key in out:
                    raise SpecError("duplicate key", fname, k.start_mark.line + 1, kp)
                lines[kp] = k.start_mark.line + 1
                out[key] = walk(v, kp, depth + 1)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [walk(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(n.value)]
        try:
            return constructor.construct_object(n, deep=True)
        except Exception as e:  # bad tags (!!int abc), 5000-digit integers, impossible dates ...
            why = getattr(e, "problem", None) or f"cannot read {n.value[:40]!r} as {n.tag.rpartition(':')[2]}"
            raise SpecError(f"bad value: {why}", fname, n.start_mark.line + 1, path or None) from None

    return walk(node, "", 0), lines


def _fail(msg: str, key: str, lines: dict[str, int], fname: str) -> SpecError:
    line = None
    k = key
    while k and line is None:
        line = lines.get(k)
        k = k.rpartition(".")[0]
    return SpecError(msg, fname, line, key)


def _check_keys(data: dict[str, Any], schema: dict[str, Any], prefix: str, lines: dict[str, int], fname: str) -> None:
    for key, value in data.items():
        kp = f"{prefix}{key}"
        if key not in schema:
            close = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (expected one of: {', '.join(schema)})"
            raise _fail(f"unknown key{hint}", kp, lines, fname)
        sub = schema[key]
        if isinstance(sub, dict):
            if not isinstance(value, dict):
                raise _fail(f"expected a mapping, got {_typename(value)}", kp, lines, fname)
            _check_keys(value, sub, kp + ".", lines, fname)
        else:
            _check_value(value, sub, kp, lines, fname)


def _typename(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", type(None): "null"}.get(type(v), type(v).__name__)


def _check_value(v: Any, kind: Any, key: str, lines: dict[str, int], fname: str) -> None:
    def bad(msg: str) -> SpecError:
        return _fail(msg, key, lines, fname)

    if isinstance(kind, tuple):
        if key == "version" and not any(v == k and type(v) is type(k) for k in kind):  # true and 1.0 are not 1
            raise bad(f"unsupported spec format version {repr(v)[:40]} (this initadvisor reads version {VERSION})")
        if v not in kind:
            close = difflib.get_close_matches(str(v), kind, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise bad(f"must be one of {', '.join(kind)}, got {v!r}{hint}")
        return
    if kind.endswith("?"):
        if v is None:
            return
        kind = kind[:-1]
    if kind == "str":
        if not isinstance(v, str):
            raise bad(f"expected a string, got {_typename(v)}")
        if not v.isprintable() or len(v) > 200:
            raise bad("must be printable text of at most 200 characters")
    elif kind == "bool":
        if not isinstance(v, bool):
            raise bad(f"expected true or false, got {_typename(v)}")
    elif kind == "posint":
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(f"expected a whole number, got {_typename(v)}")
        if v < 1:
            raise bad(f"must be >= 1, got {v}")
        if v > MAX_INT.get(key, 10**9):
            raise bad(f"must be at most {MAX_INT.get(key, 10**9)}, got {str(v)[:20]}")
    elif kind == "count":
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_INT.get(key, 10**9):
            raise bad(f"expected a whole number in [0, {MAX_INT.get(key, 10**9)}], got {repr(v)[:40]}")
    elif kind == "blocks":
        if not isinstance(v, list) or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 100_000
                                              for b in v):
            raise bad("expected a list of block numbers (1 = the first block)")
        if len(set(v)) != len(v):
            raise bad("a block is listed twice")
    elif kind == "codes":
        bad_code = check_codes(v)
        if bad_code:
            raise bad(bad_code)
    elif kind == "embeddings":
        if not isinstance(v, list) or not v:
            raise bad("expected a non-empty list of: token, position, segment")
        for e in v:
            if e not in EMBEDDINGS:
                raise bad(f"unknown embedding table {e!r} (expected token, position, segment)")
        if len(set(v)) != len(v):
            raise bad("an embedding table is listed twice")
    elif kind == "corr":
        if v == "auto":
            return
        _number(v, bad)
        if not 0.0 <= v < 1.0:
            raise bad(f"must be 'auto' or a number in [0, 1), got {v}")
    else:  # numeric kinds
        _number(v, bad)
        if kind == "threshold" and not (THRESHOLD_RANGE[0] <= v <= THRESHOLD_RANGE[1]):
            raise bad(f"must be a number in [{THRESHOLD_RANGE[0]:g}, {THRESHOLD_RANGE[1]:g}], got {v}")
        if kind == "pos" and not (1e-8 <= v < 1e6):
            raise bad(f"must be a number in [1e-8, 1e6), got {v}")
        if kind == "nonneg" and not (0 <= v < 1e6):
            raise bad(f"must be a number in [0, 1e6), got {v}")
        if kind == "prob" and not 0 <= v < 1:
            raise bad(f"must be a probability in [0, 1), got {v}")
        if kind == "eps" and not 0 <= v < 1:
            raise bad(f"must be a number in [0, 1), got {v}")
        if kind == "base" and not 1e-8 <= v <= 1e12:
            raise bad(f"must be a number in [1e-8, 1e12], got {v}")
        if kind == "fraction" and not 0 < v <= 1:
            raise bad(f"must be a number in (0, 1], got {v}")
        if kind == "alpha" and not 0 <= v <= 4:
            raise bad(f"must be a number in [0, 4], got {v}")


def check_codes(v: Any) -> str | None:
    """Why a select/ignore list is invalid, or None. Entries are rule codes or their prefixes (IA3)."""
    from initadvisor.rules import RULES

    if not isinstance(v, list) or not all(isinstance(c, str) for c in v):
        return "expected a list of rule codes, e.g. [IA304, IA9]"
    for c in v:
        if not any(code.startswith(c.upper()) for code in RULES):
            close = difflib.get_close_matches(c.upper(), list(RULES), n=1)
            return f"unknown rule code {c!r}" + (f" (did you mean '{close[0]}'?)" if close else "")
    return None


def _number(v: Any, bad: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(f"expected a number, got {_typename(v)}")
    if isinstance(v, int) and abs(v) > 1e300:
        raise bad(f"out of range ({str(v)[:20]}...)")
    if not math.isfinite(v):
        raise bad(f"must be finite, got {v}")


def build_spec(data: dict[str, Any], lines: dict[str, int] | None = None, fname: str = "<spec>",
               project: dict[str, Any] | None = None) -> Spec:
    """Validate a plain dict (the YAML layout) and fill in defaults (the project's, then the built-in ones)."""
    lines = lines or {}
    project = project or {}
    _check_keys(data, SCHEMA, "", lines, fname)
    for req in REQUIRED:
        sec, _, key = req.partition(".")
        if key not in data.get(sec, {}):
            raise _fail("required key missing", req, lines, fname)
    m = data["model"]
    s = data.get("sequence", {})
    ini = data.get("init", {})
    d, heads = m["d_model"], m["heads"]
    if d % heads:
        raise _fail(f"heads ({heads}) must divide d_model ({d})", "model.heads", lines, fname)
    kv = m.get("kv_heads", heads)
    if heads % kv:
        raise _fail(f"kv_heads ({kv}) must divide heads ({heads})", "model.kv_heads", lines, fname)
    norm = m.get("norm", "post")
    d_ff = m.get("d_ff", 4 * d)
    scale = m.get("softmax_scale")
    head_dim = m.get("head_dim")
    if head_dim is not None and heads * head_dim != d and not m.get("out_proj", True):
        raise _fail(f"heads * head_dim = {heads * head_dim} != d_model ({d}) needs the output projection "
                    "(model.out_proj: true) to map the heads back to d_model", "model.head_dim", lines, fname)
    default_std = float(ini.get("std", 0.02))
    lat = data.get("latent_attention")
    if lat is not None:
        for key in ("kv_rank", "nope_dim", "v_dim"):
            if key not in lat:
                raise _fail("required key missing", f"latent_attention.{key}", lines, fname)
        if head_dim is not None:
            raise _fail("latent attention sets each head's widths (latent_attention.nope_dim, rope_dim, v_dim)",
                        "model.head_dim", lines, fname)
        lat = Latent(kv_rank=lat["kv_rank"], nope_dim=lat["nope_dim"], rope_dim=lat.get("rope_dim", 0),
                     v_dim=lat["v_dim"], q_rank=lat.get("q_rank"), down_std=float(lat.get("down_std") or default_std))
    qk_width = lat.nope_dim + lat.rope_dim if lat else head_dim or d // heads
    scale = 1.0 / math.sqrt(qk_width) if scale is None else float(scale)
    fan = {"ff_out": d_ff, "embedding": 1, "o": heads * (head_dim or d // heads)}
    if lat:
        fan.update(q=lat.q_rank or d, k=lat.kv_rank, v=lat.kv_rank, o=heads * lat.v_dim)

    def matrix(mat: str) -> MatrixInit:
        e = ini.get(mat, {})
        if "std" in e and "gain" in e:
            raise _fail("give either std or gain, not both", f"init.{mat}", lines, fname)
        std = math.sqrt(e["gain"] / fan.get(mat, d)) if "gain" in e else float(e.get("std", default_std))
        return MatrixInit(std=std, bias_std=float(e.get("bias_std", 0.0)))

    init = {mat: matrix(mat) for mat in MATRICES}
    tied = m.get("tie_embeddings", True)
    if tied and "head" in ini:
        raise _fail("the head is the token embedding (model.tie_embeddings: true), so init.embedding sets it; "
                    "set model.tie_embeddings: false to give the head its own init", "init.head", lines, fname)
    qk_beta = ini.get("qk_beta")
    if qk_beta is not None and ("q" in ini or "k" in ini) and data.get("latent_attention") is None:
        raise _fail("give either qk_beta or q/k, not both", "init.qk_beta", lines, fname)  # (latent: the scale)
    moe = data.get("moe")
    if moe is not None:
        if "experts" not in moe:
            raise _fail("required key missing", "moe.experts", lines, fname)
        if moe.get("top_k", 1) > moe["experts"]:
            raise _fail(f"top_k ({moe['top_k']}) exceeds the {moe['experts']} experts", "moe.top_k", lines, fname)
        beyond = [b for b in moe.get("dense_blocks", []) if b > m["layers"]]
        if beyond:
            raise _fail(f"block {beyond[0]} is beyond the model's {m['layers']} layers", "moe.dense_blocks", lines,
                        fname)
        groups, top_groups = moe.get("groups", 1), moe.get("top_groups", 1)
        if moe["experts"] % groups or (groups > 1 and moe["experts"] // groups < 2):
            raise _fail(f"must divide the {moe['experts']} experts into groups of at least 2", "moe.groups", lines,
                        fname)
        if top_groups > groups or moe.get("top_k", 1) > top_groups * (moe["experts"] // groups):
            raise _fail(f"top_groups {top_groups} of {groups} groups must hold top_k {moe.get('top_k', 1)} experts",
                        "moe.top_groups", lines, fname)
        moe = Experts(experts=moe["experts"], top_k=moe.get("top_k", 1), router=moe.get("router", "softmax"),
                      normalize=moe.get("normalize", True), scale=float(moe.get("scale", 1.0)),
                      d_ff=moe.get("d_ff") or d_ff, shared=moe.get("shared_experts", 0),
                      dense_blocks=tuple(sorted(moe.get("dense_blocks", []))),
                      router_std=float(moe.get("router_std") or default_std), groups=groups, top_groups=top_groups)
    ra, rm = data.get("residual", {}).get("attention", {}), data.get("residual", {}).get("mlp", {})
    rho = s.get("input_correlation", "auto")
    spec = Spec(
        name=str(data.get("name", _stem_name(fname))),
        layers=m["layers"], d_model=d, heads=heads, d_ff=d_ff, norm=norm,
        norm_type=m.get("norm_type", "layernorm"), attention=m.get("attention", "softmax"),
        out_proj=m.get("out_proj", True), causal=m.get("causal", False), activation=m.get("activation", "gelu"),
        softmax_scale=scale, embedding_norm=m.get("embedding_norm", norm == "post") or False, kv_heads=kv,
        parallel_residual=m.get("parallel_residual", False),
        seq_len=s.get("length", 512), vocab=s.get("vocab", 32000),
        input_correlation=None if rho == "auto" else float(rho),
        embeddings=tuple(s.get("embeddings", ["token", "position"])),
        dropout=float(data.get("dropout", 0.0)),
        embedding_dropout=None if data.get("embedding_dropout") is None else float(data["embedding_dropout"]),
        attention_dropout=float(data.get("attention_dropout", 0.0)),
        mlp_dropout=float(data.get("mlp_dropout", 0.0)),
        init=init, qk_beta=None if qk_beta is None else float(qk_beta),
        res_attention=Residual(float(ra.get("skip", 1.0)), float(ra.get("block", 1.0))),
        res_mlp=Residual(float(rm.get("skip", 1.0)), float(rm.get("block", 1.0))),
        thresholds={**THRESHOLDS, **project.get("thresholds", {}),
                    **{k: float(v) for k, v in data.get("thresholds", {}).items()}},
        select=tuple(c.upper() for c in data.get("select", project.get("select", []))),
        ignore=tuple(c.upper() for c in data.get("ignore", project.get("ignore", []))),
        final_norm=m.get("final_norm", norm != "none"), tie_embeddings=tied, head_transform=m.get("head_transform", False),
        logit_softcap=None if m.get("logit_softcap") is None else float(m["logit_softcap"]),
        head=None if tied else matrix("head"), qk_norm=m.get("qk_norm", "none"), head_dim=head_dim,
        norm_eps=float(m.get("norm_eps", 0.0)), embedding_scale=float(m.get("embedding_scale", 1.0)), moe=moe,
        embedding_width=m.get("embedding_width"),
        latent=lat,
        depth_alpha=float(data.get("residual", {}).get("depth_alpha", 0.0)),
        layernorm_scaling=m.get("layernorm_scaling", False),
        rope_theta=None if m.get("rope_theta") is None else float(m["rope_theta"]),
        rotary_fraction=float(m.get("rotary_fraction", 1.0)), sliding_window=m.get("sliding_window"),
        window_blocks=None if m.get("window_blocks") is None else tuple(sorted(m["window_blocks"])),
        alibi=m.get("alibi", False), alibi_scale=float(m.get("alibi_scale", 1.0)),
        source=None if fname == "<spec>" else fname, lines=dict(lines),
    )
    try:
        _check_consistency(spec)
    except SpecError as e:
        raise _fail(e.message, e.key or "", lines, fname) from None
    return _resolve_qk_beta(spec)


def _stem_name(fname: str) -> str:
    """The default name, from the file name: printable, at most 200 characters (what `name` accepts)."""
    if fname == "<spec>":
        return "model"
    return "".join(c if c.isprintable() else "?" for c in Path(fname).stem)[:200] or "model"


def _resolve_qk_beta(spec: Spec) -> Spec:
    """With init.qk_beta, the Q and K stds are the ones that realise it at the spec's T (001 eq. 9)."""
    if spec.qk_beta is None:
        return spec
    return replace(spec.with_beta(spec.qk_beta), qk_beta=spec.qk_beta)


def _check_consistency(spec: Spec) -> None:
    if spec.seq_len < 2:
        raise SpecError(f"must be >= 2, got {spec.seq_len}", key="sequence.length")
    if not 0 <= spec.dropout < 1:
        raise SpecError(f"must be a probability in [0, 1), got {spec.dropout}", key="dropout")
    if spec.input_correlation is not None and not 0 <= spec.input_correlation < 1:
        raise SpecError(f"must be in [0, 1), got {spec.input_correlation}", key="sequence.input_correlation")
    if spec.activation in ("swiglu", "geglu") and spec.d_ff < 1:
        raise SpecError("gated MLP needs d_ff", key="model.d_ff")
    if spec.parallel_residual and spec.norm != "pre":
        raise SpecError("parallel_residual needs norm: pre", key="model.parallel_residual")
    if spec.window_blocks is not None and spec.sliding_window is None:
        raise SpecError("lists the blocks of a sliding window: set model.sliding_window", key="model.window_blocks")
    if spec.window_blocks and spec.window_blocks[-1] > spec.layers:
        raise SpecError(f"block {spec.window_blocks[-1]} is beyond the model's {spec.layers} layers",
                        key="model.window_blocks")
    if spec.sliding_window and spec.attention == "centered":
        raise SpecError("centered attention subtracts the mean over all attended keys; with a sliding window it is "
                        "not modelled", key="model.sliding_window")
    if spec.layernorm_scaling and spec.norm not in ("pre", "sandwich"):
        raise SpecError("scales the norm before each branch: needs norm: pre or sandwich",
                        key="model.layernorm_scaling")
    if spec.res_attention.skip == 0 and spec.res_attention.block == 0:
        raise SpecError("skip and block cannot both be 0", key="residual.attention")
    if spec.res_mlp.skip == 0 and spec.res_mlp.block == 0:
        raise SpecError("skip and block cannot both be 0", key="residual.mlp")
    if spec.alibi_scale != 1.0 and not spec.alibi:
        raise SpecError("scales ALiBi's slopes: set model.alibi: true", key="model.alibi_scale")
    if spec.alibi and not spec.causal:
        raise SpecError("ALiBi is modelled for causal attention (model.causal: true)", key="model.alibi")
    for other, what in (("sliding_window", "a sliding window"), ("rope_theta", "a rotary embedding"),
                        ("latent", "latent attention")):
        if spec.alibi and getattr(spec, other):
            raise SpecError(f"ALiBi together with {what} is not modelled", key="model.alibi")
    if spec.alibi and spec.attention == "centered":
        raise SpecError("centered attention subtracts the mean over all attended keys; with ALiBi it is not modelled",
                        key="model.alibi")
    if spec.latent and (spec.norm not in ("pre", "sandwich") or spec.layernorm_scaling):
        raise SpecError("latent attention is modelled behind a unit norm (model.norm: pre or sandwich, without "
                        "layernorm_scaling): its latents' norms then change nothing but the gains", key="latent_attention")
    if spec.latent and spec.qk_norm != "none":
        raise SpecError("latent attention normalises its latents, not the queries and keys: qk_norm is not modelled "
                        "with it", key="model.qk_norm")
    if spec.latent and not spec.out_proj:  # its moment-equivalent heads (stack._latent_equivalent) are not v_dim wide
        raise SpecError("latent attention is modelled with its output projection (DeepSeek's o_proj): set "
                        "model.out_proj: true", key="model.out_proj")
    if spec.latent and spec.latent.rope_dim % 2:
        raise SpecError(f"must be even (pairs of coordinates turn), got {spec.latent.rope_dim}",
                        key="latent_attention.rope_dim")
    if spec.latent and spec.latent.rope_dim and spec.rope_theta is None:
        raise SpecError("rotary key coordinates need model.rope_theta", key="latent_attention.rope_dim")
    if spec.qk_norm != "none" and spec.qk_beta is not None:
        raise SpecError("sets the Q/K stds for a beta, but model.qk_norm normalises queries and keys: their scale, "
                        "and beta, follow from model.softmax_scale", key="init.qk_beta")
