"""The supported HuggingFace model families: one registry entry per config.json `model_type`.

Each entry holds what initadvisor knows about the family: how its config maps onto a spec (`hf` dispatches on
it), where its blocks live in the module tree and which config field holds the attention-dropout rate
(`initadvisor.torch`), and which module names carry which weight role (`init_code.RULES`).

The rules themselves stay in init_code.py: `recommend` prints them verbatim into a snippet that must run without
initadvisor, as one list whose first match wins across every family (and nanoGPT). An entry therefore names the
rules its modules match instead of owning a copy.

The mappings follow what `transformers` (5.x) does when it builds a randomly initialised model from the config
(`AutoModel.from_config`):

* every `nn.Linear` / `Conv1D` weight and every `nn.Embedding` table ~ N(0, initializer_range^2), every bias 0,
  every norm gain 1 (`PreTrainedModel._init_weights`);
* GPT-2 re-draws both `c_proj` weights (attention output and MLP down projection) with
  std = initializer_range / sqrt(2 * n_layer) (`GPT2PreTrainedModel._init_weights`);
* GPT-NeoX, Llama, Mistral, Qwen2, Qwen3 and OLMo 2 use the plain rule for every matrix (no depth scaling);
  Qwen3 normalises each head's queries and keys (RMSNorm, weight 1) before the scores, OLMo 2 all heads' queries
  and keys at once, and puts its norms after each branch instead of before (h + RMSNorm(f(h))); Phi-3 fuses
  q, k and v into one qkv_proj ([q | k | v] rows) and the gate and up projections into gate_up_proj;
* Mixtral's and Qwen3-MoE's experts are stacked 3-D parameters (experts, out, in) and their routers Linear
  layers, all drawn with initializer_range; OPT draws everything with init_std; Falcon fuses q, k and v per K/V
  group (one group for multi-query);
* T5 draws with its own rule (`T5PreTrainedModel._init_weights`: q (d d_kv)^-1/2, k, v, wi d^-1/2, o (H d_kv)^-1/2, wo
  d_ff^-1/2, embeddings N(0, 1)); DeepSeek-V3 and BLOOM use the plain rule for every matrix, the router and the
  stacked experts (DeepSeek's latent down and up projections alike);
* the output head (`...ForCausalLM.lm_head`, GPT-NeoX's `embed_out`, BERT's MLM decoder) is the token embedding
  when `tie_word_embeddings` (default true for GPT-2 and the BERT family, false for GPT-NeoX, Llama, Mistral,
  Qwen2), else an nn.Linear with the plain rule; the decoders end in a final norm (ln_f, final_layer_norm,
  norm), the BERT family in the MLM transform (dense, activation, LayerNorm) before the decoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .init_code import RULES
from .spec import MATRICES

if TYPE_CHECKING:
    from .hf import _Config


# num_key_value_heads where a config leaves it out: transformers' (5.24) class defaults, else the head count
KV_HEADS_DEFAULT = {"mistral": 8, "mixtral": 8, "qwen2": 32, "qwen3": 32, "qwen3_moe": 4, "gemma2": 4,
                    "gemma3_text": 4}

# families whose transformers model reads a null head_dim as the width (5.24: a TypeError, no model)
NULL_HEAD_DIM_REFUSED = ("qwen2", "olmo2", "phi3", "qwen3_moe")


@dataclass(frozen=True)
class Family:
    """One HuggingFace model family.

    to_spec: (config, this entry, notes) -> the spec dict without its name; appends its notes.
    blocks: where the ModuleList of blocks lives, in the base model (`AutoModel`), then in the task-head models
        (`...ForCausalLM`, `...ForMaskedLM`).
    rules: the (module-name suffix, role) rules of init_code.RULES that the family's modules match.
    attn_dropout_key: the config field holding the attention-probability dropout rate.
    model_class: the transformers class that builds the modelled stack where the Auto classes build another (T5:
        the encoder alone), else None.
    """

    model_type: str
    to_spec: Callable[[_Config, Family, list[str]], dict[str, Any]]
    blocks: tuple[str, str]
    rules: tuple[tuple[str, str], ...]
    attn_dropout_key: str
    model_class: str | None = None

    @property
    def fused_qkv(self) -> str | None:
        """The role of a fused q/k/v matrix, which says how `init_code.init_matrices` splits it: "qkv" = [q | k | v]
        blocks along the output dimension (GPT-2's Conv1D (d, 3d), nanoGPT's Linear (3d, d)); "qkv-neox" = rows
        per K/V group as (group, [q x heads/groups, k, v], head_dim): GPT-NeoX a group per head, Falcon one
        (multi-query) or num_kv_heads. None: separate q, k and v matrices."""
        return next((role for _, role in self.rules if role.startswith("qkv")), None)


# ---------------------------------------------------------------------------------------------
# Config mappings: (config, family, notes) -> spec dict

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


def _kv_heads(cfg: _Config, mt: str, heads: int) -> int:
    """num_key_value_heads; left out, transformers' class default (KV_HEADS_DEFAULT); a null, the same where
    transformers refuses it (hf.transformers_config leaves it out), Qwen2's and Qwen3's head count."""
    kv = cfg.get("num_key_value_heads", "posint", None, spec_key="model.kv_heads")
    if kv is None:
        null = cfg.raw.get("num_key_value_heads", 0) is None and mt in ("qwen2", "qwen3")
        kv = heads if null else KV_HEADS_DEFAULT.get(mt, heads)
        if kv != heads:
            cfg.defaulted.append(f"num_key_value_heads={kv}")
            cfg.src["model.kv_heads"] = "num_key_value_heads"
    return kv


def _init_std(cfg: _Config, notes: list[str]) -> float:
    r = cfg.get("initializer_range", "float", 0.02, spec_key="init.std")
    if r > 1 and cfg.raw.get("model_type") == "llama":
        raise cfg.error(f"LlamaConfig takes initializer_range in [0, 1], got {r:g}", "initializer_range")
    if r == 0:  # PreTrainedModel._init_weights: `std = config.initializer_range or 0.02`
        notes.append("initializer_range 0 is replaced by 0.02 in transformers (`initializer_range or 0.02`)")
        return 0.02
    return r


def _init(std: float, tied: bool, **per_matrix: float) -> dict[str, Any]:
    init: dict[str, Any] = {"std": std}
    for m in (*MATRICES, *(() if tied else ("head",))):  # a tied head is the token embedding
        init[m] = {"std": per_matrix.get(m, std), "bias_std": 0.0}
    return init


def _head(cfg: _Config, tied_default: bool, final_norm: bool, transform: bool) -> dict[str, Any]:
    """The `model` keys of the output head: the final norm, tying (tie_word_embeddings), the MLM transform."""
    tied = cfg.get("tie_word_embeddings", "bool", tied_default, spec_key="model.tie_embeddings")
    return {"final_norm": final_norm, "tie_embeddings": tied, "head_transform": transform}


def _eps(cfg: _Config, key: str, default: float) -> float:
    """Every norm's epsilon (transformers' default for the family when absent)."""
    return cfg.get(key, "float", default, spec_key="model.norm_eps")


def _attention_scale(head_dim: int, scale: float) -> float | None:
    """softmax_scale in the spec's terms (logits = scale * sum over the head's head_dim coordinates), None if the
    standard head_dim^-0.5."""
    return None if math.isclose(scale, head_dim ** -0.5, rel_tol=1e-12) else scale


def _cross_attention(cfg: _Config, notes: list[str]) -> bool:
    if cfg.get("add_cross_attention", "bool", None):
        notes.append("add_cross_attention: the cross-attention blocks of an encoder-decoder are not modelled")
        return True
    return False


def _seq(cfg: _Config, key: str, aliases: tuple[str, ...] = ()) -> int:
    return cfg.get(key, "posint", required=True, spec_key="sequence.length", aliases=aliases)


def _trained_seq(cfg: _Config, key: str, trained: int, family: str, notes: list[str]) -> int:
    """The config's `key`, else the length the family was trained at (noted): families without a position table."""
    if key in cfg.raw:
        return _seq(cfg, key)
    notes.append(f"{family} has no position table: sequence.length {trained}, the length it was trained at; "
                 "--seq-len sets another")
    return trained


def _shape(cfg: _Config) -> tuple[int, int, int, int]:
    """Depth, width, heads and FFN width under the field names BERT-style, GPT-NeoX and Llama configs share."""
    g = cfg.get
    return (g("num_hidden_layers", "posint", required=True, spec_key="model.layers"),
            g("hidden_size", "posint", required=True, spec_key="model.d_model"),
            g("num_attention_heads", "posint", required=True, spec_key="model.heads"),
            g("intermediate_size", "posint", required=True, spec_key="model.d_ff"))


def _bert_like(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    g, mt = cfg.get, fam.model_type
    layers, d, heads, d_ff = _shape(cfg)
    act = _activation(cfg, "hidden_act", "gelu", False, notes)
    causal = g("is_decoder", "bool", None, spec_key="model.causal") or False
    if causal:
        notes.append("is_decoder: true, so self-attention is causal")
    _cross_attention(cfg, notes)
    n_pos = _seq(cfg, "max_position_embeddings")
    length = n_pos
    if mt == "roberta":
        if "pad_token_id" in cfg.raw and cfg.raw["pad_token_id"] is None:
            raise cfg.error("null: RoBERTa's position ids count from pad_token_id + 1", "pad_token_id")
        pad = g("pad_token_id", "natural", 1)
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
    g("type_vocab_size", "posint", 2)  # (transformers looks token_type_ids up in it: one row at least)
    embeddings = ["token", "position", "segment"]
    notes.append("segment embedding: token_type_ids default to 0, so one token_type row is shared by all tokens")
    if mt == "electra":
        e = g("embedding_size", "posint", 128, spec_key="model.embedding_width")
        if e != d:
            notes.append(f"ELECTRA embedding_size {e} != hidden_size {d}: tables of width {e}, their LayerNorm and "
                         f"dropout, then embeddings_project to {d} (std initializer_range, zero bias): "
                         f"model.embedding_width {e}")
    std = _init_std(cfg, notes)
    drop = g("hidden_dropout_prob", "prob", 0.1, spec_key="dropout")
    attn_drop = g(fam.attn_dropout_key, "prob", 0.1, spec_key="attention_dropout")
    head = _head(cfg, True, False, True)  # no final norm: the MLM transform ends in a LayerNorm
    if mt == "electra" and e != d:  # e: embedding_size, read above
        notes.append(f"ELECTRA's MLM head works at embedding_size {e}: its logits have variance "
                     f"{e} * initializer_range^2, the spec's initial_loss takes hidden_size {d}")
    return {
        "model": {"layers": layers, "d_model": d, "heads": heads, "kv_heads": heads, "d_ff": d_ff, "norm": "post",
                  "norm_type": "layernorm", "attention": "softmax", "out_proj": True, "causal": causal,
                  "activation": act, "embedding_norm": True, "parallel_residual": False, **head,
                  "norm_eps": _eps(cfg, "layer_norm_eps", 1e-12),
                  **({"embedding_width": e} if mt == "electra" and e != d else {})},
        "sequence": {"length": length, "vocab": vocab, "embeddings": embeddings},
        "dropout": drop, "attention_dropout": attn_drop,
        "init": _init(std, head["tie_embeddings"]),
    }


def _dropouts(cfg: _Config, resid: str, emb: str, default: float) -> dict[str, float]:
    """The spec's dropout (residual branches) and, where it differs, embedding_dropout."""
    r = cfg.get(resid, "prob", default, spec_key="dropout")
    e = cfg.get(emb, "prob", default, spec_key="embedding_dropout")
    return {"dropout": r, **({"embedding_dropout": e} if e != r else {})}


def _rotary(cfg: _Config, notes: list[str], partial_key: str | None = None) -> dict[str, float]:
    """The spec's rope_theta and rotary_fraction: rope_parameters (transformers 5), else rope_theta /
    rotary_emb_base and partial_rotary_factor (or the family's `partial_key`); Gemma 3's per-layer-type bases:
    the sliding layers' (most of them); RoPE scaling is a note."""
    for key in ("rope_parameters", "rope_scaling"):  # transformers validates them as objects (or null)
        if cfg.raw.get(key) is not None and not isinstance(cfg.raw[key], dict):
            raise cfg.error(f"expected a JSON object or null, got {str(cfg.raw[key])[:40]}", key)
    rp = cfg.raw.get("rope_parameters") or {}
    rs = cfg.raw.get("rope_scaling") or {}
    cfg.used.update(k for k in ("rope_parameters", "rope_theta", "rotary_emb_base", "partial_rotary_factor",
                                "rope_scaling", partial_key) if k and k in cfg.raw)
    per_type = {k: v for k, v in rp.items() if isinstance(v, dict)}
    if per_type and cfg.raw.get("model_type") not in ("gemma3_text", "modernbert"):
        raise cfg.error("rope_parameters per layer type: this family's transformers class takes one flat object",
                        "rope_parameters")
    if per_type:
        kind = "sliding_attention" if "sliding_attention" in per_type else sorted(per_type)[0]
        others = ", ".join(f"{k} {v.get('rope_theta')}" for k, v in sorted(per_type.items()) if k != kind)
        rp = per_type[kind]
        notes.append(f"rope_theta per layer type: the spec takes the {kind} layers' {rp.get('rope_theta')} for "
                     f"every layer (not modelled: {others})")
    theta = rp.get("rope_theta", cfg.raw.get("rope_theta", cfg.raw.get("rotary_emb_base", 10000.0)))
    frac = rp.get("partial_rotary_factor", cfg.raw.get("partial_rotary_factor"))
    if partial_key and cfg.raw.get(partial_key) is not None:
        frac = cfg.raw[partial_key]
    frac = 1.0 if frac is None else frac
    for key, v, ok in (("rope_theta", theta, lambda x: 1e-8 <= x < 1e12),
                       ("partial_rotary_factor", frac, lambda x: 0 < x <= 1)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
            where = next(k for k in (partial_key, "rope_parameters", "rope_theta", "rotary_emb_base",
                                     "partial_rotary_factor", key) if k and k in cfg.raw or k == key)
            raise cfg.error(f"unsupported rotary {key} {str(v)[:40]}", where)
    rtype = rs.get("rope_type") or rs.get("type") or rp.get("rope_type")  # transformers: rope_scaling wins
    if rtype not in (None, "default"):
        notes.append(f"rope_type {rtype!r}: its rescaled frequencies are not modelled (their effect at init: the "
                     "rotation's coherence over a row's keys)" + ("; its attention_factor is (softmax_scale)"
                                                                  if rtype in ("yarn", "longrope") else ""))
    return {"rope_theta": float(theta), "rotary_fraction": float(frac)}


def rope_attention_factor(cfg: _Config) -> float:
    """transformers' cos / sin multiplier of yarn and longrope RoPE scaling (`_compute_yarn_parameters`,
    `_compute_longrope_parameters`): the rotated part of every query and key times it, so their logits times its
    square; 1 for the other rope types."""
    params = cfg.raw.get("rope_scaling") or cfg.raw.get("rope_parameters") or {}  # (transformers: the legacy wins)
    if any(isinstance(v, dict) for v in params.values()):  # per layer type: the sliding layers' (as _rotary)
        params = params.get("sliding_attention") or params[sorted(params)[0]]
    rtype = params.get("rope_type") or params.get("type")
    if rtype not in ("yarn", "longrope"):
        return 1.0
    where = "rope_scaling" if cfg.raw.get("rope_scaling") else "rope_parameters"
    orig = params.get("original_max_position_embeddings", cfg.raw.get("original_max_position_embeddings"))
    factor = params.get("factor")
    af = params.get("attention_factor")
    if af is None:
        if factor is None:
            if not orig or not cfg.raw.get("max_position_embeddings"):
                raise cfg.error(f"{rtype} without factor needs max_position_embeddings and "
                                "original_max_position_embeddings", where)
            factor = cfg.raw["max_position_embeddings"] / orig
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor < 1e12:
            raise cfg.error(f"unsupported {rtype} factor {str(factor)[:40]}", where)
        if rtype == "yarn":
            def mscale(m=1.0):
                return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

            m, m_all = params.get("mscale"), params.get("mscale_all_dim")
            af = mscale(m) / mscale(m_all) if m and m_all else mscale()
        elif factor <= 1:
            af = 1.0
        elif not isinstance(orig, (int, float)) or isinstance(orig, bool) or orig <= 1:
            raise cfg.error(f"longrope needs original_max_position_embeddings > 1, got {str(orig)[:40]}", where)
        else:
            af = math.sqrt(1 + math.log(factor) / math.log(orig))
    if isinstance(af, bool) or not isinstance(af, (int, float)) or not 0 < af < 1e6:
        raise cfg.error(f"unsupported {rtype} attention_factor {str(af)[:40]}", where)
    return float(af)


def _decoder(layers: int, d: int, heads: int, kv: int, d_ff: int, act: str, norm_type: str, parallel: bool,
             scale: float | None, head: dict[str, Any]) -> dict[str, Any]:
    """The `model` section of a pre-LN causal decoder (GPT-2, GPT-NeoX, Llama family)."""
    model = {"layers": layers, "d_model": d, "heads": heads, "kv_heads": kv, "d_ff": d_ff, "norm": "pre",
             "norm_type": norm_type, "attention": "softmax", "out_proj": True, "causal": True, "activation": act,
             "embedding_norm": False, "parallel_residual": parallel, **head}
    if scale is not None:
        model["softmax_scale"] = scale
    return model


def _gpt2(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
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
    scale = _attention_scale(d_head, 1.0 / math.sqrt(d_head) if scale_weights else 1.0)
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
    drop = _dropouts(cfg, "resid_pdrop", "embd_pdrop", 0.1)
    attn_drop = g(fam.attn_dropout_key, "prob", 0.1, spec_key="attention_dropout")
    head = _head(cfg, True, True, False)  # ln_f, then lm_head
    return {
        "model": {**_decoder(layers, d, heads, heads, d_ff, act, "layernorm", False, scale, head),
                  "norm_eps": _eps(cfg, "layer_norm_epsilon", 1e-5)},
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token", "position"]},
        **drop, "attention_dropout": attn_drop,
        "init": _init(std, head["tie_embeddings"], o=proj, ff_out=proj),
    }


def _gpt_neox(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    g = cfg.get
    layers, d, heads, d_ff = _shape(cfg)
    act = _activation(cfg, "hidden_act", "gelu", False, notes)
    parallel = g("use_parallel_residual", "bool", True, spec_key="model.parallel_residual")
    length = _seq(cfg, "max_position_embeddings")
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    rope = _rotary(cfg, notes, "rotary_pct")
    head_dim = g("head_dim", "posint", None)
    if head_dim is not None and head_dim * heads != d:  # transformers turns head_dim x rotary_pct coordinates
        raise cfg.error(f"{head_dim} x num_attention_heads {heads} != hidden_size {d}: GPT-NeoX's heads are "
                        "hidden_size / num_attention_heads wide, its rotary embedding head_dim (transformers cannot "
                        "run the model)", "head_dim")
    std = _init_std(cfg, notes)
    drop = g("hidden_dropout", "prob", 0.0, spec_key="dropout")  # embedding dropout uses the same rate
    attn_drop = g(fam.attn_dropout_key, "prob", 0.0, spec_key="attention_dropout")
    head = _head(cfg, False, True, False)  # final_layer_norm, then embed_out
    return {
        "model": {**_decoder(layers, d, heads, heads, d_ff, act, "layernorm", parallel, None, head),
                  "norm_eps": _eps(cfg, "layer_norm_eps", 1e-5), **rope},
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        "dropout": drop, "attention_dropout": attn_drop,
        "init": _init(std, head["tie_embeddings"]),
    }


def _truncated_std(std: float, cutoff: float) -> float:
    """The std of N(0, std^2) truncated at +-cutoff std (torch.nn.init.trunc_normal_'s draw)."""
    z = 2.0 * 0.5 * (1.0 + math.erf(cutoff / math.sqrt(2.0))) - 1.0  # P(|x| < cutoff)
    return std * math.sqrt(1.0 - 2.0 * cutoff * math.exp(-0.5 * cutoff * cutoff) / math.sqrt(2 * math.pi) / z)


def _modernbert(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    """ModernBERT: a bidirectional pre-LN encoder (embedding LayerNorm, block 0's attention norm the identity on an
    already normed input), fused Wqkv, GeGLU, no biases, local attention (|m - s| <= local_attention // 2) in the
    layers layer_types calls sliding (else every third layer global), rotary; weights truncated normal at
    +-initializer_cutoff_factor std, the output projections at initializer_range / sqrt(2 L)."""
    g = cfg.get
    layers, d, heads, d_ff = _shape(cfg)
    act = _activation(cfg, "hidden_activation", "gelu", True, notes)
    length = _seq(cfg, "max_position_embeddings")
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    # attention_dropout drops the probabilities and the attention branch's output, mlp_dropout the MLP's hidden units
    # (the same second moments as its output): one residual rate when they agree
    attn_drop = g("attention_dropout", "prob", 0.0, spec_key="attention_dropout")
    drop = g("mlp_dropout", "prob", 0.0, spec_key="dropout")
    if attn_drop != drop:
        raise cfg.error(f"the attention branch's output dropout ({attn_drop:g}) and the MLP's ({drop:g}) differ: one "
                        "rate is modelled", "mlp_dropout")
    local = g("local_attention", "posint", 128, spec_key="model.sliding_window")
    if "sliding_window" in cfg.raw:  # transformers sets local_attention to twice it (the half-window), over the key
        if cfg.raw["sliding_window"] is None:
            raise cfg.error("null: ModernBERT's sliding_window sets local_attention to twice it (leave it out)",
                            "sliding_window")
        local = 2 * g("sliding_window", "posint", spec_key="model.sliding_window")
        notes.append(f"sliding_window {local // 2}: local_attention = 2 x sliding_window = {local} (transformers)")
    types = cfg.raw.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        cfg.used.add("layer_types")
        blocks = [i + 1 for i, t in enumerate(types) if t == "sliding_attention"]
    else:
        every = g("global_attn_every_n_layers", "posint", 3)
        blocks = [i + 1 for i in range(layers) if i % every]
    rp = cfg.raw.get("rope_parameters")
    if isinstance(rp, dict) and rp and not all(isinstance(v, dict) for v in rp.values()):
        raise cfg.error("ModernBERT's rope_parameters are per layer type ({\"full_attention\": {...}, "
                        "\"sliding_attention\": {...}}): transformers refuses a flat one", "rope_parameters")
    rope = _rotary(cfg, notes)
    cutoff = g("initializer_cutoff_factor", "float", 2.0, spec_key="init.std") or 3.0
    if cfg.raw.get("initializer_range") == 0:  # (its _init_weights divides by it)
        raise cfg.error("ModernBERT's initializer_range must be > 0", "initializer_range")
    r = _init_std(cfg, notes)
    std, out = _truncated_std(r, cutoff), _truncated_std(r / math.sqrt(2 * layers), cutoff)
    notes.append(f"weights truncated at +-{cutoff:g} std: their std is {std / r:.4f} x the nominal one; output "
                 f"projections (attention, MLP) at initializer_range / sqrt(2 L) = {r / math.sqrt(2 * layers):.6g}")
    head = _head(cfg, True, True, True)  # final_norm, then the MLM head (dense, activation, LayerNorm, decoder)
    model = {"layers": layers, "d_model": d, "heads": heads, "kv_heads": heads, "d_ff": d_ff, "norm": "pre",
             "norm_type": "layernorm", "attention": "softmax", "out_proj": True, "causal": False, "activation": act,
             "embedding_norm": True, "parallel_residual": False, **head, **rope,
             "norm_eps": _eps(cfg, "norm_eps", 1e-5)}
    if blocks:
        model["sliding_window"] = local
        if len(blocks) < layers:
            model["window_blocks"] = blocks
    return {
        "model": model,
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        "dropout": drop, "embedding_dropout": g("embedding_dropout", "prob", 0.0, spec_key="embedding_dropout"),
        "attention_dropout": attn_drop,
        "init": _init(std, head["tie_embeddings"], o=out, ff_out=out),
    }


def _falcon(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    """Falcon: one input LayerNorm shared by attention and MLP in parallel (h + attn(N h) + mlp(N h); the new
    decoder architecture's two norms are equal at init), multi-query (one K/V head) or num_kv_heads, GeLU,
    rotary or ALiBi (Falcon-RW), no biases, one dropout on the sum of the branches; every Linear and Embedding ~
    N(0, initializer_range^2), the head tied."""
    g = cfg.get
    layers = g("num_hidden_layers", "posint", required=True, spec_key="model.layers")
    d = g("hidden_size", "posint", required=True, spec_key="model.d_model")
    heads = g("num_attention_heads", "posint", required=True, spec_key="model.heads")
    d_ff = g("ffn_hidden_size", "posint", None, spec_key="model.d_ff") or 4 * d
    act = _activation(cfg, "activation", "gelu", False, notes)
    # the Hub's Falcon-7B/40B/RW configs have no max_position_embeddings (2048: transformers' FalconConfig default)
    length = _trained_seq(cfg, "max_position_embeddings", 2048, "Falcon (rotary or ALiBi)", notes)
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    alibi = g("alibi", "bool", False)
    new = g("new_decoder_architecture", "bool", False)
    if new:
        kv = g("num_kv_heads", "posint", heads, spec_key="model.kv_heads")
        g("num_ln_in_parallel_attn", "inert")  # 1 or 2 input norms: equal (unit gains) at init
    else:
        kv = 1 if g("multi_query", "bool", True, spec_key="model.kv_heads") else heads
    parallel = new or g("parallel_attn", "bool", True, spec_key="model.parallel_residual")
    drop = g("hidden_dropout", "prob", 0.0, spec_key="dropout")
    attn_drop = g(fam.attn_dropout_key, "prob", 0.0, spec_key="attention_dropout")
    if not parallel and attn_drop != drop:  # the sequential block drops the attention branch at attention_dropout
        raise cfg.error(f"the sequential block (parallel_attn: false) drops the attention branch at attention_dropout "
                        f"{attn_drop:g} and the MLP's at hidden_dropout {drop:g}: one rate is modelled",
                        "attention_dropout")
    # ALiBi replaces the rotary embedding, its biases added before the logits' 1 / sqrt(head_dim); the probabilities
    # are dropped out only with it (transformers' FalconAttention)
    rope = {"alibi": True, "alibi_scale": (d // heads) ** -0.5} if alibi else _rotary(cfg, notes)
    if alibi:
        notes.append("ALiBi as Falcon's sdpa and flash attention apply it (slopes / sqrt(head_dim)); transformers' eager "
                     "attention adds the biases twice (with the logits and through the mask)")
    if attn_drop and not alibi:
        notes.append(f"attention_dropout {attn_drop:g} drops Falcon's attention probabilities only with ALiBi"
                     + ("" if parallel else " (here: the attention branch's output)"))
    std = _init_std(cfg, notes)
    head = _head(cfg, True, True, False)  # ln_f, then the tied lm_head
    model = {**_decoder(layers, d, heads, kv, d_ff, act, "layernorm", parallel, None, head), **rope}
    model["norm_eps"] = _eps(cfg, "layer_norm_epsilon", 1e-5)
    return {
        "model": model,
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        "dropout": drop, "embedding_dropout": 0.0, "attention_dropout": attn_drop if alibi else 0.0,
        "init": _init(std, head["tie_embeddings"]),
    }


def _bloom(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    """BLOOM: a LayerNorm on the embeddings, pre-LN blocks with ALiBi (head h's logits minus m_h (t - s)), fused
    query_key_value rows per head ([q, k, v], GPT-NeoX's layout), GeLU (tanh) MLP of 4 d, biases, dropout
    hidden_dropout on both branches; every Linear and Embedding N(0, initializer_range^2), the head tied."""
    g = cfg.get
    layers = g("n_layer", "posint", required=True, spec_key="model.layers", aliases=("num_hidden_layers",))
    d = g("hidden_size", "posint", required=True, spec_key="model.d_model", aliases=("n_embed",))
    heads = g("n_head", "posint", required=True, spec_key="model.heads", aliases=("num_attention_heads",))
    if g("apply_residual_connection_post_layernorm", "bool", False):
        raise cfg.error("the residual taken after the input norm (h -> N(h) + f(N(h))) is not modelled",
                        "apply_residual_connection_post_layernorm")
    g("pretraining_tp", "inert")  # tensor-parallel slicing of the same matrices
    g("slow_but_exact", "inert")
    length = _trained_seq(cfg, "seq_length", 2048, "BLOOM (ALiBi)", notes)
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    std = _init_std(cfg, notes)
    head = _head(cfg, True, True, False)  # ln_f, then the tied lm_head
    model = {**_decoder(layers, d, heads, heads, 4 * d, "gelu_tanh", "layernorm", False, None, head),
             "embedding_norm": True, "alibi": True, "norm_eps": _eps(cfg, "layer_norm_epsilon", 1e-5)}
    return {
        "model": model,
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        "dropout": g("hidden_dropout", "prob", 0.0, spec_key="dropout"), "embedding_dropout": 0.0,
        "attention_dropout": g(fam.attn_dropout_key, "prob", 0.0, spec_key="attention_dropout"),
        "init": _init(std, head["tie_embeddings"]),
    }


def _opt(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    """OPT: learned positions (offset 2: rows 2..T + 1 of a table drawn like the rest), ReLU, zero biases, dropout
    on both branches (none on the embeddings); pre-LN with a final LayerNorm, or post-LN without an embedding norm
    (do_layer_norm_before: false, OPT-350m). Every Linear and Embedding ~ N(0, init_std^2)."""
    g = cfg.get
    layers = g("num_hidden_layers", "posint", required=True, spec_key="model.layers")
    d = g("hidden_size", "posint", required=True, spec_key="model.d_model")
    heads = g("num_attention_heads", "posint", required=True, spec_key="model.heads")
    d_ff = g("ffn_dim", "posint", required=True, spec_key="model.d_ff")
    act = _activation(cfg, "activation_function", "relu", False, notes)
    length = _seq(cfg, "max_position_embeddings")
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    proj = g("word_embed_proj_dim", "posint", d)
    if g("layerdrop", "prob", 0.0):
        raise cfg.error("layerdrop (whole layers skipped at random in training) is not modelled", "layerdrop")
    if g("layer_norm_elementwise_affine", "bool", True) is False:
        notes.append("layer_norm_elementwise_affine: false: norms without gains, the same at init (gains 1)")
    pre = g("do_layer_norm_before", "bool", True, spec_key="model.norm")
    final = pre and not g("_remove_final_layer_norm", "bool", False, spec_key="model.final_norm")
    std = g("init_std", "float", 0.02, spec_key="init.std")
    head = _head(cfg, True, final, False)  # final_layer_norm (pre-LN), then the tied lm_head
    model = _decoder(layers, d, heads, heads, d_ff, act, "layernorm", False, None, head)
    model.update(norm="pre" if pre else "post", norm_eps=1e-5)  # nn.LayerNorm's default eps
    sequence = {"length": length, "vocab": vocab, "embeddings": ["token", "position"]}
    init = _init(std, head["tie_embeddings"])
    if proj != d:  # OPT-350m: tokens of width proj, project_in to d (then the positions), project_out before the head
        init, sequence, model["tie_embeddings"] = _projected_embeddings(std, proj, vocab, sequence, notes)
    return {
        "model": model,
        "sequence": sequence,
        "dropout": g("dropout", "prob", 0.1, spec_key="dropout"), "embedding_dropout": 0.0,  # OPTDecoder: none
        "attention_dropout": g(fam.attn_dropout_key, "prob", 0.0, spec_key="attention_dropout"),
        "init": init,
    }


def _projected_embeddings(std: float, proj: int, vocab: int, sequence: dict, notes: list[str]) -> tuple:
    """OPT-350m's token embeddings of width proj, project_in (proj -> d) and project_out (d -> proj) around the
    stack, every matrix N(0, std^2), as the spec's moments: a token row enters with variance v = std^2 (proj std^2)
    per coordinate next to the positions' std^2, so both tables at sqrt((v + std^2) / 2) and the tokens' repeats at
    their share v / (v + std^2) of the input correlation; the tied head reads project_out's output, whose own-token
    part (e . W_out W_in e) has mean 0, so its logits are an untied head's of std std sqrt(proj std^2)."""
    from initadvisor.core.ops import zipf_repeat_correlation

    v = std * std * proj * std * std
    mixed = math.sqrt((v + std * std) / 2.0)
    init = _init(std, False, embedding=mixed, head=std * math.sqrt(proj) * std)
    share = v / (v + std * std)
    notes.append(f"word_embed_proj_dim {proj}: tokens projected in (project_in) and out (project_out) around the "
                 f"stack: as moments, tables of std {mixed:.4g} (token rows {math.sqrt(v):.4g}, positions {std:g}), "
                 f"input correlation {share:.4g} x the tokens' repeats, an untied head of std "
                 f"{std * math.sqrt(proj) * std:.4g} (project_out's output, no own-token part at init); `recommend`'s "
                 "init code reads these moments: its embedding and head stds are not the real tables' and "
                 "projections'")
    return init, {**sequence, "input_correlation": share * zipf_repeat_correlation(vocab)}, False


def _t5(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    """T5's encoder stack (T5EncoderModel): pre-LN RMSNorm blocks without biases, unscaled logits (q . k), a learned
    relative-position bias shared by the layers, ReLU or gated MLPs with a dropout on their hidden units; T5's own
    init (`T5PreTrainedModel._init_weights`, factor = initializer_factor): embedding N(0, factor^2), q at
    factor (d d_kv)^-1/2, k and v at factor d^-1/2, o at factor (heads d_kv)^-1/2, the MLP's input at factor
    d^-1/2 and output at factor d_ff^-1/2, norm gains factor."""
    g = cfg.get
    layers = g("num_layers", "posint", required=True, spec_key="model.layers")
    d = g("d_model", "posint", required=True, spec_key="model.d_model")
    heads = g("num_heads", "posint", required=True, spec_key="model.heads")
    d_kv = g("d_kv", "posint", 64, spec_key="model.head_dim")
    d_ff = g("d_ff", "posint", 2048, spec_key="model.d_ff")
    proj = g("feed_forward_proj", "str", "relu", spec_key="model.activation")
    parts = proj.split("-")  # T5Config: ACT or gated-ACT; "gated-gelu" runs gelu_new (its dense_act_fn)
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise cfg.error(f"unsupported feed_forward_proj {proj!r} (expected ACT or gated-ACT)", "feed_forward_proj")
    gated, act = len(parts) == 2, "gelu_new" if proj == "gated-gelu" else parts[-1]
    exact, approx = (_GATED, _GATED_APPROX) if gated else (_ACT, _ACT_APPROX)
    if act in approx:
        notes.append(f"feed_forward_proj {proj!r} ({act}) approximated by '{approx[act]}'")
    elif act not in exact:
        raise cfg.error(f"unsupported feed_forward_proj {proj!r}", "feed_forward_proj")
    act = exact.get(act) or approx[act]
    factor = g("initializer_factor", "float", 1.0, spec_key="init.std")
    if factor != 1.0:
        raise cfg.error(f"initializer_factor {factor:g} sets every T5LayerNorm's gain to it: norm gains other than 1 "
                        "are not modelled", "initializer_factor")
    if g("is_decoder", "bool", False):
        raise cfg.error("T5's decoder stack (cross-attention) is not modelled: the import reads the encoder",
                        "is_decoder")
    length = _trained_seq(cfg, "n_positions", 512, "T5 (a relative-position bias instead)", notes)
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    drop = g("dropout_rate", "prob", 0.1, spec_key="dropout")
    for k in ("num_decoder_layers", "relative_attention_num_buckets", "relative_attention_max_distance"):
        g(k, "inert")
    notes.append(f"the encoder stack only (T5EncoderModel); relative_attention_bias: one learned bias per head and "
                 f"distance bucket, N(0, 1 / d_model) at init, adds 1 / {d} to the logits' variance (about 1 for "
                 f"unit inputs): not modelled")
    std = {"q": (d * d_kv) ** -0.5, "k": d ** -0.5, "v": d ** -0.5, "o": (heads * d_kv) ** -0.5,
           "ff_in": d ** -0.5, "ff_out": d_ff ** -0.5, "embedding": 1.0}
    # transformers 5 always ties the head to the embedding (N(0, 1)) and rescales the decoder's output by d^-1/2 unless
    # the config said tie_word_embeddings: false (T5 v1.1), which it records as scale_decoder_outputs
    scaled = g("scale_decoder_outputs", "bool", None)
    if scaled is None:
        scaled = g("tie_word_embeddings", "bool", True, spec_key="model.tie_embeddings") is not False
    notes.append("initial_loss: T5ForConditionalGeneration's head reads the decoder, not this encoder; the spec's "
                 "head is the embedding (N(0, 1)) " + ("after the decoder's d_model^-1/2 rescale: a head of std "
                                                       "d_model^-1/2" if scaled else "without a rescale (T5 v1.1)"))
    model = {"layers": layers, "d_model": d, "heads": heads, "kv_heads": heads, "d_ff": d_ff, "norm": "pre",
             "norm_type": "rmsnorm", "attention": "softmax", "out_proj": True, "causal": False, "activation": act,
             "embedding_norm": False, "parallel_residual": False, "final_norm": True, "tie_embeddings": False,
             "head_transform": False, "softmax_scale": 1.0, "norm_eps": _eps(cfg, "layer_norm_epsilon", 1e-6)}
    if heads * d_kv != d:
        model["head_dim"] = d_kv
    init = _init(std["q"], False, **std)
    init["head"] = {"std": d ** -0.5 if scaled else 1.0, "bias_std": 0.0}
    return {
        "model": model,
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        "dropout": drop, "mlp_dropout": drop, "attention_dropout": drop,
        "init": init,
    }


def _llama_like(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    g = cfg.get
    layers, d, heads, d_ff = _shape(cfg)
    kv = _kv_heads(cfg, fam.model_type, heads)
    act = _activation(cfg, "hidden_act", "silu", True, notes)
    length = _seq(cfg, "max_position_embeddings")
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    if "head_dim" in cfg.raw and cfg.raw["head_dim"] is None and fam.model_type in NULL_HEAD_DIM_REFUSED:
        raise cfg.error("null: transformers takes it as the head width (leave it out)", "head_dim")
    head_dim = g("head_dim", "posint", None, spec_key="model.head_dim") or (d // heads if d >= heads else 1)
    scale = _attention_scale(head_dim, head_dim ** -0.5)
    rope = _rotary(cfg, notes)
    window = _sliding_window(cfg, fam.model_type, layers)
    std = _init_std(cfg, notes)
    attn_drop = g(fam.attn_dropout_key, "prob", 0.0, spec_key="attention_dropout")
    head = _head(cfg, False, True, False)  # the final RMSNorm, then lm_head
    model = {**_decoder(layers, d, heads, kv, d_ff, act, "rmsnorm", False, scale, head), **rope, **window}
    model["norm_eps"] = _eps(cfg, "rms_norm_eps", 1e-5 if fam.model_type == "olmo2" else 1e-6)
    if heads * head_dim != d:  # Qwen3-0.6B: 16 heads of 128 at d_model 1024
        model["head_dim"] = head_dim
    if fam.model_type == "qwen3":  # q_norm, k_norm: RMSNorm over each head's head_dim, weight 1, before rotary
        model["qk_norm"] = "head"
    if fam.model_type == "olmo2":  # h + RMSNorm(f(h)) per branch; q_norm, k_norm over all heads' q and k
        model.update(norm="reordered", qk_norm="all")
    if fam.model_type == "qwen3_moe":
        model["qk_norm"] = "head"
    moe = _moe(cfg, fam.model_type, layers, std, notes)
    return {
        "model": model,
        **({"moe": moe} if moe else {}),
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        # Phi-3 drops out both branches' outputs (resid_pdrop; transformers never applies its embd_pdrop); the
        # other families have no residual or embedding dropout
        **({"dropout": g("resid_pdrop", "prob", 0.0, spec_key="dropout"), "embedding_dropout": 0.0}
           if fam.model_type == "phi3" else {"dropout": 0.0}),
        "attention_dropout": attn_drop,
        "init": _init(std, head["tie_embeddings"]),
    }


def _gemma(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    """Gemma 2 and Gemma 3 (text): RMSNorm before and after each branch, weights stored as w and applied as 1 + w
    (zero-initialised: gain 1), embeddings times sqrt(d), GeGLU, logits scaled by query_pre_attn_scalar^-0.5;
    Gemma 2 soft-caps the attention and final logits, Gemma 3 normalises each head's queries and keys."""
    g, mt = cfg.get, fam.model_type
    layers, d, heads, d_ff = _shape(cfg)
    kv = _kv_heads(cfg, mt, heads)
    act = _activation(cfg, "hidden_activation", "gelu_pytorch_tanh", True, notes, aliases=("hidden_act",))
    length = _seq(cfg, "max_position_embeddings")
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    head_dim = g("head_dim", "posint", 256, spec_key="model.head_dim")
    qpas = g("query_pre_attn_scalar", "posint", 256, spec_key="model.softmax_scale")
    scale = _attention_scale(head_dim, qpas ** -0.5)
    rope = _rotary(cfg, notes)
    window = _sliding_window(cfg, mt, layers)
    std = _init_std(cfg, notes)
    if g("use_bidirectional_attention", "bool", None):
        raise cfg.error("bidirectional attention (an encoder) is not modelled for Gemma", "use_bidirectional_attention")
    cap = g("attn_logit_softcapping", "float", None, spec_key="model.softmax_scale")
    if cap is not None:  # c tanh(s / c) is the identity to O((s / c)^2) where the logits' std s << c
        s_max = std * std * d * (scale or head_dim ** -0.5) * math.sqrt(head_dim)  # q, k of unit inputs
        if s_max > cap / 10:
            raise cfg.error(f"attention soft-capping at {cap:g} with logits of std up to {s_max:.3g} at init is "
                            "not modelled", "attn_logit_softcapping")
        notes.append(f"attn_logit_softcapping {cap:g}: the logits' std at init (at most {s_max:.3g} for unit "
                     "inputs) is far below the cap, where c tanh(s / c) = s")
    notes.append("norm weights are stored as w and applied as 1 + w: zero-initialised, gain 1 at init")
    head = _head(cfg, True, True, False)  # the final RMSNorm, then the tied head
    model = {**_decoder(layers, d, heads, kv, d_ff, act, "rmsnorm", False, scale, head), **rope, **window}
    if heads * head_dim != d:  # Gemma 2 2B: 8 heads of 256 at d_model 2304
        model["head_dim"] = head_dim
    model.update(norm="sandwich", norm_eps=_eps(cfg, "rms_norm_eps", 1e-6), embedding_scale=math.sqrt(d),
                 logit_softcap=g("final_logit_softcapping", "float", None, spec_key="model.logit_softcap"))
    if mt == "gemma3_text":
        model["qk_norm"] = "head"
    return {
        "model": model,
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        "dropout": 0.0,
        "attention_dropout": g(fam.attn_dropout_key, "prob", 0.0, spec_key="attention_dropout"),
        "init": _init(std, head["tie_embeddings"]),
    }


def _deepseek_v3(cfg: _Config, fam: Family, notes: list[str]) -> dict[str, Any]:
    """DeepSeek-V3: Llama's pre-norm block with multi-head latent attention (the `latent_attention` section; the
    logits scaled by qk_head_dim^-1/2 times yarn's mscale^2 where rope_parameters set mscale_all_dim) and, from block
    first_k_dense_replace + 1 on, a mixture of experts: sigmoid router, top-k renormalised (norm_topk_prob) times
    routed_scaling_factor within the best topk_group of n_group expert groups, n_shared_experts always on; every
    matrix and the router at initializer_range."""
    g = cfg.get
    layers, d, heads, d_ff = _shape(cfg)
    act = _activation(cfg, "hidden_act", "silu", True, notes)
    length = _seq(cfg, "max_position_embeddings")
    vocab = g("vocab_size", "posint", required=True, spec_key="sequence.vocab")
    nope = g("qk_nope_head_dim", "posint", 128, spec_key="latent_attention.nope_dim")
    rope = g("qk_rope_head_dim", "posint", 64, spec_key="latent_attention.rope_dim")
    latent = {"q_rank": g("q_lora_rank", "posint", None, spec_key="latent_attention.q_rank"),
              "kv_rank": g("kv_lora_rank", "posint", 512, spec_key="latent_attention.kv_rank"),
              "nope_dim": nope, "rope_dim": rope, "v_dim": g("v_head_dim", "posint", 128, spec_key="latent_attention.v_dim")}
    for k in ("qk_head_dim", "rope_interleave", "attention_bias"):
        g(k, "inert")  # interleaved pairs turn like halves; biases start at 0
    kv = g("num_key_value_heads", "posint", None)  # MLA's keys and values are per head: transformers repeats them
    if kv is None and "num_key_value_heads" not in cfg.raw:  # heads / kv times, so kv must be heads (left out: 128)
        kv = 128
    if kv not in (None, heads):
        raise cfg.error(f"must equal num_attention_heads ({heads}) for multi-head latent attention, got {kv}"
                        + ("" if "num_key_value_heads" in cfg.raw else " (the default)"), "num_key_value_heads")
    if "head_dim" in cfg.raw and g("head_dim", "posint", required=True) != rope:  # transformers' rotary table
        raise cfg.error(f"must equal qk_rope_head_dim ({rope}): transformers sizes the rotary table by it", "head_dim")
    rotary = _rotary(cfg, notes)
    if rope % 2:
        raise cfg.error(f"qk_rope_head_dim must be even, got {rope}", "qk_rope_head_dim")
    rotary["rotary_fraction"] = 1.0  # the rotary key is rope_dim wide: latent_attention says which coordinates turn
    scale = (nope + rope) ** -0.5
    rp = cfg.raw.get("rope_parameters") if isinstance(cfg.raw.get("rope_parameters"), dict) else {}
    rp = rp or (cfg.raw.get("rope_scaling") if isinstance(cfg.raw.get("rope_scaling"), dict) else {})
    if rp.get("rope_type", rp.get("type", "default")) != "default" and rp.get("mscale_all_dim"):
        factor = rp.get("factor")
        if isinstance(factor, (int, float)) and not isinstance(factor, bool) and math.isfinite(factor) and factor > 1:
            mscale = 0.1 * float(rp["mscale_all_dim"]) * math.log(factor) + 1.0  # yarn_get_mscale
            scale *= mscale * mscale
            notes.append(f"yarn: the logits' scale times mscale^2 = {mscale * mscale:.4g} (factor {factor:g}, "
                         f"mscale_all_dim {rp['mscale_all_dim']:g})")
    std = _init_std(cfg, notes)
    experts = g("n_routed_experts", "posint", 256, spec_key="moe.experts", aliases=("num_local_experts",))
    top_k = g("num_experts_per_tok", "posint", 8, spec_key="moe.top_k")
    groups = g("n_group", "posint", 8, spec_key="moe.groups")
    top_groups = g("topk_group", "posint", 4, spec_key="moe.top_groups")
    first_dense = g("first_k_dense_replace", "natural", 3)
    moe = {"experts": experts, "top_k": top_k, "router": "sigmoid",
           "normalize": g("norm_topk_prob", "bool", True, spec_key="moe.normalize"),
           "scale": g("routed_scaling_factor", "float", 2.5, spec_key="moe.scale"),
           "d_ff": g("moe_intermediate_size", "posint", 2048, spec_key="moe.d_ff"),
           "shared_experts": g("n_shared_experts", "natural", 1), "dense_blocks": list(range(1, min(first_dense, layers) + 1)),
           "router_std": std, "groups": groups, "top_groups": top_groups}
    head = _head(cfg, False, True, False)  # the final RMSNorm, then lm_head
    model = {**_decoder(layers, d, heads, heads, d_ff, act, "rmsnorm", False, _attention_scale(nope + rope, scale),
                        head), **rotary, "norm_eps": _eps(cfg, "rms_norm_eps", 1e-6)}
    return {
        "model": model,
        "latent_attention": {**latent, "down_std": std},
        **({"moe": moe} if first_dense < layers else {}),
        "sequence": {"length": length, "vocab": vocab, "embeddings": ["token"]},
        "dropout": 0.0,
        "attention_dropout": g(fam.attn_dropout_key, "prob", 0.0, spec_key="attention_dropout"),
        "init": _init(std, head["tie_embeddings"]),
    }


def _moe(cfg: _Config, mt: str, layers: int, std: float, notes: list[str]) -> dict[str, Any] | None:
    """The `moe` section: Mixtral (every layer; top-k softmax renormalised, experts intermediate_size wide) and
    Qwen3-MoE (every decoder_sparse_step-th layer but mlp_only_layers; norm_topk_prob, experts
    moe_intermediate_size wide, the dense layers intermediate_size). The router and the experts are drawn with
    initializer_range (their `_init_weights`)."""
    g = cfg.get
    if mt == "mixtral":
        if g("router_jitter_noise", "float", 0.0):  # train mode: the MoE input times U(1 - j, 1 + j)
            raise cfg.error("router jitter noise (the MoE input times U(1 - j, 1 + j) in train mode) is not "
                            "modelled", "router_jitter_noise")
        return {"experts": g("num_local_experts", "posint", 8, spec_key="moe.experts", aliases=("num_experts",)),
                "top_k": g("num_experts_per_tok", "posint", 2, spec_key="moe.top_k"), "router": "softmax",
                "normalize": True, "router_std": std}
    if mt != "qwen3_moe":
        return None
    experts = g("num_experts", "posint", 128, spec_key="moe.experts", aliases=("num_local_experts",))
    step = g("decoder_sparse_step", "posint", 1, spec_key="moe.dense_blocks")
    only = g("mlp_only_layers", "any", [])
    if only is not None and not (isinstance(only, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                               for i in only)):
        raise cfg.error("expected a list of layer indices", "mlp_only_layers")
    only = set(only or [])
    dense = [i + 1 for i in range(layers) if i in only or (i + 1) % step != 0]
    if len(dense) == layers:
        notes.append("every layer is dense (decoder_sparse_step, mlp_only_layers): no mixture of experts")
        return None
    return {"experts": experts, "top_k": g("num_experts_per_tok", "posint", 8, spec_key="moe.top_k"),
            "router": "softmax", "normalize": g("norm_topk_prob", "bool", False, spec_key="moe.normalize"),
            "d_ff": g("moe_intermediate_size", "posint", 768, spec_key="moe.d_ff"), "dense_blocks": dense,
            "router_std": std}


def _sliding_window(cfg: _Config, mt: str, layers: int) -> dict[str, Any]:
    """The spec's sliding_window and window_blocks (absent: every block): Mistral, Phi-3 and Mixtral window every
    layer (Phi-3's and Mixtral's default: none); Gemma 2 / 3 the layers layer_types calls sliding (else 1 in 2,
    or 5 in 6); Qwen2 / Qwen3 with use_sliding_window those layer_types says (else from max_window_layers on)."""
    if mt in ("llama", "olmo2"):
        return {}
    g = cfg.get
    types = cfg.raw.get("layer_types")
    if isinstance(types, list):
        cfg.used.add("layer_types")
    if mt in ("mistral", "phi3", "mixtral"):
        default = 4096 if mt == "mistral" and "sliding_window" not in cfg.raw else None
        window = g("sliding_window", "posint", default, spec_key="model.sliding_window")
        local = list(range(1, layers + 1))
    elif mt in ("gemma2", "gemma3_text"):
        if "sliding_window" in cfg.raw and cfg.raw["sliding_window"] is None:  # transformers builds no model
            raise cfg.error("null: Gemma's sliding layers need a window (leave it out: 4096)", "sliding_window")
        window = g("sliding_window", "posint", 4096, spec_key="model.sliding_window")
        period = 2 if mt == "gemma2" else 6
        local = [i + 1 for i in range(layers) if (types[i] == "sliding_attention" if isinstance(types, list)
                                                   and len(types) == layers else (i + 1) % period != 0)]
    else:  # qwen2, qwen3, qwen3_moe: the config nulls sliding_window unless use_sliding_window (transformers checks
        # the window's fields' types either way, so the import does too)
        if cfg.raw.get("sliding_window") is not None:
            g("sliding_window", "posint")
        if cfg.raw.get("max_window_layers") is not None:
            g("max_window_layers", "natural")
        if not g("use_sliding_window", "bool", False):
            if isinstance(types, list) and "sliding_attention" in types:  # transformers nulls the window: no model
                raise cfg.error("sliding layers, and use_sliding_window false: transformers builds them without a "
                                "window size", "layer_types")
            cfg.used -= {"sliding_window", "max_window_layers"}  # (checked, and ignored: no window)
            return {}
        window = g("sliding_window", "posint", 4096 if "sliding_window" not in cfg.raw else None,
                   spec_key="model.sliding_window")
        mwl = g("max_window_layers", "natural", 28)
        local = [i + 1 for i in range(layers) if (types[i] == "sliding_attention" if isinstance(types, list)
                                                   and len(types) == layers else i >= mwl)]
    if window is None or not local:
        return {}
    return {"sliding_window": window, **({} if len(local) == layers else {"window_blocks": local})}


# ---------------------------------------------------------------------------------------------
# The registry

_ROLE = dict(RULES)


def _rules(*suffixes: str) -> tuple[tuple[str, str], ...]:
    return tuple((s, _ROLE[s]) for s in suffixes)  # a KeyError names a suffix missing from init_code.RULES


_BERT_RULES = _rules("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                     "intermediate.dense", "output.dense",
                     "word_embeddings", "position_embeddings", "token_type_embeddings")
_LLAMA_ATTENTION_RULES = _rules("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                "embed_tokens")
_LLAMA_RULES = _LLAMA_ATTENTION_RULES + _rules("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_EXPERT_RULES = _rules("mlp.experts.gate_up_proj", "mlp.experts.down_proj")  # stacked (E, out, in) parameters

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("bert", _bert_like, ("encoder.layer", "bert.encoder.layer"), _BERT_RULES,
           "attention_probs_dropout_prob"),
    Family("roberta", _bert_like, ("encoder.layer", "roberta.encoder.layer"), _BERT_RULES,
           "attention_probs_dropout_prob"),
    Family("electra", _bert_like, ("encoder.layer", "electra.encoder.layer"), _BERT_RULES,
           "attention_probs_dropout_prob"),
    Family("gpt2", _gpt2, ("h", "transformer.h"),
           _rules("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "wte", "wpe"), "attn_pdrop"),
    Family("gpt_neox", _gpt_neox, ("layers", "gpt_neox.layers"),
           _rules("attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h",
                  "embed_in"), "attention_dropout"),
    Family("llama", _llama_like, ("layers", "model.layers"), _LLAMA_RULES, "attention_dropout"),
    Family("mistral", _llama_like, ("layers", "model.layers"), _LLAMA_RULES, "attention_dropout"),
    Family("qwen2", _llama_like, ("layers", "model.layers"), _LLAMA_RULES, "attention_dropout"),
    Family("qwen3", _llama_like, ("layers", "model.layers"), _LLAMA_RULES, "attention_dropout"),
    Family("olmo2", _llama_like, ("layers", "model.layers"), _LLAMA_RULES, "attention_dropout"),
    Family("phi3", _llama_like, ("layers", "model.layers"),
           _rules("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj", "embed_tokens"),
           "attention_dropout"),
    Family("mixtral", _llama_like, ("layers", "model.layers"), _LLAMA_ATTENTION_RULES + _EXPERT_RULES,
           "attention_dropout"),
    Family("qwen3_moe", _llama_like, ("layers", "model.layers"), _LLAMA_RULES + _EXPERT_RULES, "attention_dropout"),
    Family("modernbert", _modernbert, ("layers", "model.layers"),
           _rules("attn.Wqkv", "attn.Wo", "mlp.Wi", "mlp.Wo", "tok_embeddings", "head.dense"), "attention_dropout"),
    Family("falcon", _falcon, ("h", "transformer.h"),
           _rules("attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h",
                  "word_embeddings"), "attention_dropout"),
    Family("opt", _opt, ("decoder.layers", "model.decoder.layers"),
           _rules("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1", "fc2",
                  "embed_tokens", "embed_positions"), "attention_dropout"),
    Family("t5", _t5, ("encoder.block", "encoder.block"),
           _rules("SelfAttention.q", "SelfAttention.k", "SelfAttention.v", "SelfAttention.o", "DenseReluDense.wi",
                  "DenseReluDense.wi_0", "DenseReluDense.wi_1", "DenseReluDense.wo", "shared", "embed_tokens"),
           "dropout_rate", "T5EncoderModel"),
    Family("deepseek_v3", _deepseek_v3, ("layers", "model.layers"),
           _rules("self_attn.q_b_proj", "self_attn.kv_b_proj", "self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa",
                  "self_attn.q_proj", "self_attn.o_proj", "embed_tokens", "mlp.gate_proj", "mlp.up_proj",
                  "mlp.down_proj", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"), "attention_dropout"),
    Family("bloom", _bloom, ("h", "transformer.h"),
           _rules("attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h",
                  "word_embeddings"), "attention_dropout"),
    Family("gemma2", _gemma, ("layers", "model.layers"), _LLAMA_RULES, "attention_dropout"),
    Family("gemma3_text", _gemma, ("layers", "model.layers"), _LLAMA_RULES, "attention_dropout"),
)}

# where the list of transformer blocks lives, tried in order (base models first, then wrappers); spelled out
# rather than gathered from FAMILIES because the order is the search order and shows in find_blocks' error
BLOCK_PATHS = (
    "encoder.layer",  # BERT, RoBERTa, ELECTRA
    "h",  # GPT-2 base
    "layers",  # GPT-NeoX, Llama, Mistral, Qwen2, Qwen3, OLMo 2, Phi-3, Gemma 2/3 base models
    "transformer.h",  # GPT2LMHeadModel, nanoGPT
    "gpt_neox.layers",  # GPTNeoXForCausalLM
    "model.layers",  # LlamaForCausalLM & co.
    "decoder.layers", "model.decoder.layers",  # OPT
    "encoder.block",  # T5EncoderModel
    "bert.encoder.layer", "roberta.encoder.layer", "electra.encoder.layer",
    "blocks",  # initadvisor.torch.SpecModel
)
# config fields holding the attention-probability dropout rate
ATTN_DROPOUT_KEYS = tuple(dict.fromkeys(f.attn_dropout_key for f in FAMILIES.values()))
