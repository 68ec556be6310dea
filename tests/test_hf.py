"""HuggingFace config.json import: field-by-field mapping, round trip through YAML, and the init claims checked
against the real randomly initialised transformers model.

The configs under tests/data/hf/<family>/ were written by transformers' own config classes (save_pretrained)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from initadvisor.hf import SUPPORTED, import_config, read_hf_config, to_yaml
from initadvisor.spec import MATRICES, SpecError, parse_spec

DATA = Path(__file__).parent / "data" / "hf"
FAMILIES = ("bert", "roberta", "electra", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "olmo2", "phi3",
            "gemma2", "gemma3_text", "mixtral", "qwen3_moe", "opt", "falcon", "modernbert")
GEMMA = ("gemma2", "gemma3_text")
BERT_LIKE = ("bert", "roberta", "electra")
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "olmo2", "phi3", "mixtral", "qwen3_moe")


def cfg_path(family: str) -> Path:
    return DATA / family / "config.json"


def raw(family: str) -> dict:
    return json.loads(cfg_path(family).read_text())


def ignored_fields(notes: list[str]) -> set[str]:
    found = [n for n in notes if n.startswith("ignored")]
    assert len(found) <= 1, "ignored fields must be listed in one note"
    return set(found[0].split(": ", 1)[1].split(", ")) if found else set()


def write(tmp_path: Path, data: object, name: str = "config.json") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))
    return p


# ------------------------------------------------------------------------------------------------
# Field-by-field mapping, with expectations computed here from the JSON (not through hf.py)


def expected(family: str) -> dict:
    c = raw(family)
    if family in BERT_LIKE:
        length = c["max_position_embeddings"] - (c["pad_token_id"] + 1 if family == "roberta" else 0)
        return dict(
            layers=c["num_hidden_layers"], d_model=c["hidden_size"], heads=c["num_attention_heads"],
            kv_heads=c["num_attention_heads"], d_ff=c["intermediate_size"], activation="gelu", norm="post",
            norm_type="layernorm", embedding_norm=True, causal=False, parallel_residual=False, seq_len=length,
            vocab=c["vocab_size"], embeddings=("token", "position", "segment"), dropout=c["hidden_dropout_prob"],
            attention_dropout=c["attention_probs_dropout_prob"], std={m: c["initializer_range"] for m in MATRICES},
            softmax_scale=1 / math.sqrt(c["hidden_size"] // c["num_attention_heads"]),
            final_norm=False, tie_embeddings=c["tie_word_embeddings"], head_transform=True,  # the MLM head
            used={"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "hidden_act",
                  "is_decoder", "add_cross_attention", "max_position_embeddings", "vocab_size", "type_vocab_size",
                  "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "model_type",
                  "tie_word_embeddings", "layer_norm_eps"}
            | ({"pad_token_id"} if family == "roberta" else set())
            | ({"embedding_size"} if family == "electra" else set()),
        )
    if family == "gpt2":
        d, layers = c["n_embd"], c["n_layer"]
        proj = c["initializer_range"] / math.sqrt(2 * layers)
        return dict(
            layers=layers, d_model=d, heads=c["n_head"], kv_heads=c["n_head"], d_ff=c["n_inner"] or 4 * d,
            activation="gelu_tanh", norm="pre", norm_type="layernorm", embedding_norm=False, causal=True,
            parallel_residual=False, seq_len=c["n_positions"], vocab=c["vocab_size"], embeddings=("token", "position"),
            dropout=c["resid_pdrop"], attention_dropout=c["attn_pdrop"],
            std={**{m: c["initializer_range"] for m in MATRICES}, "o": proj, "ff_out": proj},
            softmax_scale=1 / math.sqrt(d // c["n_head"]),
            final_norm=True, tie_embeddings=c["tie_word_embeddings"], head_transform=False,  # ln_f, lm_head
            used={"n_layer", "n_embd", "n_head", "n_inner", "activation_function", "n_positions", "vocab_size",
                  "add_cross_attention", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "initializer_range",
                  "resid_pdrop", "embd_pdrop", "attn_pdrop", "model_type", "tie_word_embeddings", "layer_norm_epsilon"},
        )
    if family == "modernbert":  # bidirectional pre-LN, embedding norm, GeGLU, truncated init, depth-scaled outputs
        r, L = c["initializer_range"], c["num_hidden_layers"]
        trunc = 0.8796256610342398  # the std of N(0, 1) truncated at +-2 (initializer_cutoff_factor)
        return dict(
            layers=L, d_model=c["hidden_size"], heads=c["num_attention_heads"], kv_heads=c["num_attention_heads"],
            d_ff=c["intermediate_size"], activation="geglu", norm="pre", norm_type="layernorm", embedding_norm=True,
            causal=False, parallel_residual=False, seq_len=c["max_position_embeddings"], vocab=c["vocab_size"],
            embeddings=("token",), dropout=0.0, attention_dropout=0.0,
            std={**{m: trunc * r for m in MATRICES}, "o": trunc * r / math.sqrt(2 * L),
                 "ff_out": trunc * r / math.sqrt(2 * L)},
            softmax_scale=1 / math.sqrt(c["hidden_size"] // c["num_attention_heads"]), final_norm=True,
            tie_embeddings=c["tie_word_embeddings"], head_transform=True,
            used={"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "hidden_activation",
                  "max_position_embeddings", "vocab_size", "mlp_dropout", "attention_dropout", "local_attention",
                  "layer_types", "initializer_cutoff_factor", "initializer_range", "model_type",
                  "tie_word_embeddings", "norm_eps", "embedding_dropout", "rope_parameters"},
        )
    if family == "falcon":  # parallel attention and MLP on one norm, multi-query (one K/V head), GeLU, rotary
        return dict(
            layers=c["num_hidden_layers"], d_model=c["hidden_size"], heads=c["num_attention_heads"],
            kv_heads=1 if c["multi_query"] else c["num_attention_heads"], d_ff=c["ffn_hidden_size"],
            activation="gelu", norm="pre", norm_type="layernorm", embedding_norm=False, causal=True,
            parallel_residual=c["parallel_attn"], seq_len=c["max_position_embeddings"], vocab=c["vocab_size"],
            embeddings=("token",), dropout=c["hidden_dropout"], attention_dropout=c["attention_dropout"],
            std={m: c["initializer_range"] for m in MATRICES},
            softmax_scale=1 / math.sqrt(c["hidden_size"] // c["num_attention_heads"]), final_norm=True,
            tie_embeddings=c["tie_word_embeddings"], head_transform=False,
            used={"num_hidden_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "activation",
                  "max_position_embeddings", "vocab_size", "alibi", "new_decoder_architecture", "multi_query",
                  "parallel_attn", "hidden_dropout", "attention_dropout", "initializer_range", "model_type",
                  "tie_word_embeddings", "layer_norm_epsilon"},
        )
    if family == "opt":  # pre-LN (do_layer_norm_before), ReLU, learned positions, no embedding dropout
        return dict(
            layers=c["num_hidden_layers"], d_model=c["hidden_size"], heads=c["num_attention_heads"],
            kv_heads=c["num_attention_heads"], d_ff=c["ffn_dim"], activation="relu",
            norm="pre" if c["do_layer_norm_before"] else "post", norm_type="layernorm", embedding_norm=False,
            causal=True, parallel_residual=False, seq_len=c["max_position_embeddings"], vocab=c["vocab_size"],
            embeddings=("token", "position"), dropout=c["dropout"], attention_dropout=c["attention_dropout"],
            std={m: c["init_std"] for m in MATRICES}, softmax_scale=1 / math.sqrt(c["hidden_size"] //
                                                                                 c["num_attention_heads"]),
            final_norm=c["do_layer_norm_before"] and not c["_remove_final_layer_norm"],
            tie_embeddings=c["tie_word_embeddings"], head_transform=False,
            used={"num_hidden_layers", "hidden_size", "num_attention_heads", "ffn_dim", "activation_function",
                  "max_position_embeddings", "vocab_size", "word_embed_proj_dim", "layerdrop",
                  "layer_norm_elementwise_affine", "do_layer_norm_before", "_remove_final_layer_norm", "init_std",
                  "dropout", "attention_dropout", "model_type", "tie_word_embeddings"},
        )
    base = dict(
        layers=c["num_hidden_layers"], d_model=c["hidden_size"], heads=c["num_attention_heads"],
        d_ff=c["intermediate_size"], norm="pre", embedding_norm=False, causal=True,
        seq_len=c["max_position_embeddings"],
        vocab=c["vocab_size"], embeddings=("token",), attention_dropout=c["attention_dropout"],
        std={m: c["initializer_range"] for m in MATRICES},
        softmax_scale=1 / math.sqrt(c["hidden_size"] // c["num_attention_heads"]),
        final_norm=True, tie_embeddings=c["tie_word_embeddings"], head_transform=False,  # final norm, lm_head
    )
    if family == "gpt_neox":
        return dict(base, kv_heads=c["num_attention_heads"], activation="gelu", norm_type="layernorm",
                    parallel_residual=c["use_parallel_residual"], dropout=c["hidden_dropout"],
                    used={"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "hidden_act",
                          "use_parallel_residual", "max_position_embeddings", "vocab_size", "initializer_range",
                          "hidden_dropout", "attention_dropout", "model_type", "tie_word_embeddings", "layer_norm_eps"})
    if family in GEMMA:  # sandwich norms, embeddings x sqrt(d), GeGLU, logits scaled by query_pre_attn_scalar^-0.5
        hd = c["hidden_size"] // c["num_attention_heads"]
        return dict(base, kv_heads=c["num_key_value_heads"], activation="geglu", norm_type="rmsnorm", norm="sandwich",
                    parallel_residual=False, dropout=0.0, tie_embeddings=c["tie_word_embeddings"],
                    softmax_scale=c["query_pre_attn_scalar"] ** -0.5 * math.sqrt(c["head_dim"] / hd),
                    used={"num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                          "intermediate_size", "hidden_activation", "max_position_embeddings", "vocab_size",
                          "head_dim", "query_pre_attn_scalar", "initializer_range", "attention_dropout", "model_type",
                          "tie_word_embeddings", "rms_norm_eps", "sliding_window", "layer_types",
                          "use_bidirectional_attention", "attn_logit_softcapping", "final_logit_softcapping"})
    used = {"num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "hidden_act", "max_position_embeddings", "vocab_size", "head_dim", "initializer_range", "attention_dropout",
            "model_type", "tie_word_embeddings", "rms_norm_eps"}
    used |= ({"sliding_window"} if family in ("mistral", "phi3", "mixtral") else set() if family in ("llama", "olmo2")
             else {"use_sliding_window"})
    used |= set() if family in ("llama", "olmo2") else {"layer_types"}  # which layers are local (sliding window)
    used |= {"num_local_experts", "num_experts_per_tok"} if family in ("mixtral", "qwen3_moe") else set()
    used |= {"router_jitter_noise"} if family == "mixtral" else set()
    used |= ({"decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "moe_intermediate_size"}
             if family == "qwen3_moe" else set())
    used |= {"resid_pdrop"} if family == "phi3" else set()  # embd_pdrop: never applied by transformers' Phi3Model
    return dict(base, kv_heads=c["num_key_value_heads"], activation="swiglu", norm_type="rmsnorm",
                parallel_residual=False, dropout=c.get("resid_pdrop", 0.0), used=used,
                norm="reordered" if family == "olmo2" else "pre")


@pytest.mark.parametrize("family", FAMILIES)
def test_mapping_field_by_field(family: str) -> None:
    spec, notes = import_config(cfg_path(family))
    exp = expected(family)
    for key in ("layers", "d_model", "heads", "kv_heads", "d_ff", "activation", "norm", "norm_type", "embedding_norm",
                "causal", "parallel_residual", "seq_len", "vocab", "embeddings", "dropout", "attention_dropout",
                "final_norm", "tie_embeddings", "head_transform"):
        assert getattr(spec, key) == exp[key], key
    assert spec.logit_softcap == raw(family).get("final_logit_softcapping")
    assert spec.embedding_scale == (math.sqrt(spec.d_model) if family in GEMMA else 1.0)
    assert spec.qk_norm == {"qwen3": "head", "qwen3_moe": "head", "olmo2": "all", "gemma3_text": "head"}.get(family,
                                                                                                      "none")
    eps_key = next((k for k in ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "norm_eps") if k in raw(family)),
                   None)
    if eps_key is None:  # OPT's nn.LayerNorm keeps its default eps
        assert family == "opt" and spec.norm_eps == 1e-5
    else:
        assert spec.norm_eps == raw(family)[eps_key] and exp["used"] >= {eps_key}
    # an untied head is an nn.Linear drawn like the rest (initializer_range), a tied one is the token embedding
    assert (spec.head is None) == spec.tie_embeddings
    assert spec.head_init.std == pytest.approx(exp["std"]["embedding"] if spec.tie_embeddings else
                                               raw(family).get("initializer_range", raw(family).get("init_std")),
                                               rel=1e-12)
    assert spec.head_init.bias_std == 0.0
    assert spec.attention == "softmax" and spec.out_proj
    assert spec.softmax_scale == pytest.approx(exp["softmax_scale"], rel=1e-12)
    for m in MATRICES:
        assert spec.init[m].std == pytest.approx(exp["std"][m], rel=1e-12), m
        assert spec.init[m].bias_std == 0.0, m
    assert spec.name == family  # no _name_or_path in these files
    assert spec.source == str(cfg_path(family))
    # every field is either used or listed once as ignored (rotary families: the rotary embedding's parameters)
    rotary = {"rope_parameters"} if family in ("gpt_neox", *LLAMA_LIKE, *GEMMA, "falcon", "modernbert") else set()
    assert ignored_fields(notes) == set(raw(family)) - exp["used"] - rotary


def test_mixture_of_experts_mapping() -> None:
    """Mixtral: every block, top-k renormalised, experts intermediate_size wide; Qwen3-MoE: the layers in
    mlp_only_layers (from 0) and off decoder_sparse_step dense, norm_topk_prob, moe_intermediate_size."""
    mix, _ = import_config(cfg_path("mixtral"))
    c = raw("mixtral")
    assert (mix.moe.experts, mix.moe.top_k, mix.moe.router, mix.moe.normalize, mix.moe.d_ff, mix.moe.dense_blocks,
            mix.moe.shared, mix.moe.scale) == (c["num_local_experts"], c["num_experts_per_tok"], "softmax", True,
                                              c["intermediate_size"], (), 0, 1.0)
    assert mix.moe.router_std == c["initializer_range"]
    qm, _ = import_config(cfg_path("qwen3_moe"))
    c = raw("qwen3_moe")
    assert (qm.moe.experts, qm.moe.top_k, qm.moe.normalize, qm.moe.d_ff, qm.d_ff) == (
        c["num_local_experts"], c["num_experts_per_tok"], c["norm_topk_prob"], c["moe_intermediate_size"],
        c["intermediate_size"])
    assert qm.moe.dense_blocks == tuple(i + 1 for i in c["mlp_only_layers"])


def test_falcon_variants(tmp_path: Path) -> None:
    """The new decoder architecture (Falcon-40B): num_kv_heads groups, always parallel; the old one without
    multi-query: a K/V head per head; ALiBi (Falcon-RW) in place of the rotary embedding, its slopes scaled by
    1 / sqrt(head_dim) as Falcon scales its biases with the logits, the probabilities dropped out only with it; a
    sequential block with two dropout rates is refused."""
    c = raw("falcon")
    spec, _ = import_config(write(tmp_path, c | {"new_decoder_architecture": True, "num_kv_heads": 2,
                                                 "parallel_attn": False}))
    assert (spec.kv_heads, spec.parallel_residual) == (2, True)
    spec, _ = import_config(write(tmp_path, c | {"multi_query": False, "parallel_attn": False}))
    assert (spec.kv_heads, spec.parallel_residual) == (spec.heads, False)
    spec, _ = import_config(write(tmp_path, c | {"alibi": True, "attention_dropout": 0.1}))
    d_head = c["hidden_size"] // c["num_attention_heads"]
    assert (spec.alibi, spec.alibi_scale, spec.rope_theta, spec.attention_dropout) == (True, d_head ** -0.5, None, 0.1)
    spec, notes = import_config(write(tmp_path, c | {"attention_dropout": 0.1}))
    assert spec.attention_dropout == 0.0 and "only with ALiBi" in "\n".join(notes)
    with pytest.raises(SpecError, match="attention_dropout"):
        import_config(write(tmp_path, c | {"parallel_attn": False, "attention_dropout": 0.1}))
    # the Hub's Falcon-7B/40B/RW configs have no max_position_embeddings: transformers' default 2048, noted
    spec, notes = import_config(write(tmp_path, {k: v for k, v in c.items() if k != "max_position_embeddings"}))
    assert spec.seq_len == 2048 and any("sequence.length 2048" in n for n in notes)


def test_modernbert_flat_rope_parameters_are_refused(tmp_path: Path) -> None:
    """transformers 5's ModernBERT takes rope_parameters per layer type only; a flat one (a fuzz case) passed the
    import and then `verify --backend torch` could not build the model."""
    c = raw("modernbert")
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, c | {"rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}}))
    assert e.value.key == "rope_parameters" and e.value.line is not None and "per layer type" in str(e.value)


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "qwen3", "phi3"])
@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_rope_fields_that_are_not_objects_are_refused(tmp_path: Path, family: str, key: str) -> None:
    """transformers validates rope_parameters / rope_scaling as objects (or null): a number there (fuzz seed 88) was
    ignored by the import, and `verify --backend torch` could not build the model."""
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, raw(family) | {key: 1}))
    assert e.value.key == key and e.value.line is not None
    import_config(write(tmp_path, raw(family) | {key: None}))  # null: the family's default


@pytest.mark.parametrize("family", ["bloom", "gemma2", "qwen3", "gemma3"])
@pytest.mark.parametrize("value", [1e308, "sliding_attention", [1, 2], [None]])
def test_layer_types_that_are_not_lists_of_names_are_refused(tmp_path: Path, family: str, value) -> None:
    """transformers reads layer_types in every family (remapping legacy names) as a list of names: a number there
    (fuzz seed 96, a BLOOM config) passed `check` as an ignored field while `verify --backend torch` could not build
    the model. Refused by name at its line, in the wrapper's nested config too; null and a list of names pass."""
    c = raw(family)
    nested = "text_config" if family == "gemma3" else None
    bad = c | ({nested: c[nested] | {"layer_types": value}} if nested else {"layer_types": value})
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, bad))
    assert e.value.key == (f"{nested}." if nested else "") + "layer_types" and e.value.line is not None
    import_config(write(tmp_path, c | {"mtp_layer_types": None}))
    with pytest.raises(SpecError):
        import_config(write(tmp_path, c | {"mtp_layer_types": 3}))


@pytest.mark.parametrize("family", ["mixtral", "gemma3_text", "qwen3", "modernbert", "deepseek_v3"])
def test_sizes_beyond_the_specs_bounds_are_refused_by_the_import(tmp_path: Path, family: str) -> None:
    """num_hidden_layers 1e8 (fuzz seed 97): the families' per-layer patterns (windows, dense blocks) were built
    before the spec's bound on model.layers was checked, and ran out of memory; the import names the field and the
    spec's bound at its line, and the bound itself passes."""
    from initadvisor.spec import MAX_INT

    c = raw(family)
    key = "num_hidden_layers"
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, c | {key: 10**8}))
    assert e.value.key == key and e.value.line is not None and str(MAX_INT["model.layers"]) in str(e.value)
    c.pop("layer_types", None)  # (one per layer)
    assert import_config(write(tmp_path, c | {key: MAX_INT["model.layers"]}))[0].layers == MAX_INT["model.layers"]


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3", "bert"])
def test_a_null_that_transformers_refuses_is_its_default_for_both(tmp_path: Path, family: str) -> None:
    """transformers 5.24 refuses null for its strict fields (fuzz seed 102: tie_word_embeddings null, which `check` read
    as missing); `verify --backend torch` and `audit` build through hf.transformers_config, which leaves such a null
    out so that transformers takes its default, as the import does. A null transformers accepts is kept (Mistral's
    sliding_window: no window), a wrong value still fails."""
    transformers = pytest.importorskip("transformers")
    from initadvisor.hf import transformers_config

    c = raw(family) | {"tie_word_embeddings": None}
    built = transformers_config(c)
    assert built.tie_word_embeddings == transformers.AutoConfig.for_model(model_type=family).tie_word_embeddings
    assert import_config(write(tmp_path, c))[0].tie_embeddings == built.tie_word_embeddings
    assert transformers_config(raw("mistral") | {"sliding_window": None}).sliding_window is None
    with pytest.raises(Exception):
        transformers_config(c | {"tie_word_embeddings": "yes"})


@pytest.mark.parametrize("field, value", [("sliding_window", -0.0), ("max_window_layers", "relu")])
def test_qwens_window_fields_are_checked_when_the_window_is_off(tmp_path: Path, field: str, value) -> None:
    """transformers checks sliding_window's and max_window_layers' types whatever use_sliding_window says (fuzz seed
    102): the import refuses them by name too."""
    c = raw("qwen3") | {"use_sliding_window": False, field: value}
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, c))
    assert e.value.key == field and e.value.line is not None


def test_gpt_neox_head_dim_other_than_its_heads_is_refused(tmp_path: Path) -> None:
    """transformers' GPT-NeoX turns head_dim x rotary_pct coordinates of heads hidden_size / heads wide: another
    head_dim breaks the real model (a fuzz case crashed `verify --backend torch`), so the import names the field."""
    c = raw("gpt_neox")
    spec, _ = import_config(write(tmp_path, c | {"head_dim": c["hidden_size"] // c["num_attention_heads"]}))
    assert spec.d_head == c["hidden_size"] // c["num_attention_heads"]
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, c | {"head_dim": 10**8}))
    assert e.value.key == "head_dim" and e.value.line is not None and "hidden_size" in str(e.value)


def test_mixture_of_experts_variants(tmp_path: Path) -> None:
    c = raw("qwen3_moe") | {"num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": []}
    spec, _ = import_config(write(tmp_path, c))
    assert spec.moe.dense_blocks == (1, 3)  # layers 0 and 2 (from 0): (i + 1) % 2 != 0
    spec, notes = import_config(write(tmp_path, c | {"mlp_only_layers": [1, 3]}))
    assert spec.moe is None and any("every layer is dense" in n for n in notes)
    with pytest.raises(SpecError, match="router_jitter_noise"):
        import_config(write(tmp_path, raw("mixtral") | {"router_jitter_noise": 0.1}))
    with pytest.raises(SpecError, match="mlp_only_layers"):
        import_config(write(tmp_path, c | {"mlp_only_layers": "0"}))


def test_sliding_window_mapping() -> None:
    """Gemma's local layers: layer_types (else 1 in 2 / 5 in 6); a window in every layer leaves window_blocks out."""
    for family, blocks in (("gemma2", (1,)), ("gemma3_text", None)):
        spec = import_config(cfg_path(family))[0]
        c = raw(family)
        local = tuple(i + 1 for i, t in enumerate(c.get("layer_types") or []) if t == "sliding_attention")
        assert spec.sliding_window == c["sliding_window"]
        assert spec.window_blocks == (blocks if "layer_types" not in c else (None if len(local) == spec.layers
                                                                             else local))


def test_family_notes() -> None:
    notes = {f: import_config(cfg_path(f))[1] for f in FAMILIES}
    joined = {f: "\n".join(n) for f, n in notes.items()}
    for f in ("gpt_neox", *LLAMA_LIKE, *GEMMA, "falcon", "modernbert"):  # the rotary embedding's base and share
        spec, rp = import_config(cfg_path(f))[0], raw(f)["rope_parameters"]
        rp = rp.get("sliding_attention", rp)  # Gemma 3: a base per layer type, the sliding layers' taken
        assert (spec.rope_theta, spec.rotary_fraction) == (rp["rope_theta"], rp.get("partial_rotary_factor", 1.0))
        assert "rope_parameters" not in ignored_fields(notes[f])
    assert import_config(cfg_path("gpt_neox"))[0].rotary_fraction == 0.25  # partial rotary
    assert "rope_theta per layer type" in joined["gemma3_text"]
    for f in ("bert", "gpt2", "opt"):
        assert "rotary" not in joined[f] and import_config(cfg_path(f))[0].rope_theta is None
    gpt2 = import_config(cfg_path("gpt2"))[0]  # embd_pdrop 0.05 and resid_pdrop 0.1: both rates kept
    assert (gpt2.embedding_dropout, gpt2.dropout) == (raw("gpt2")["embd_pdrop"], raw("gpt2")["resid_pdrop"])
    assert "embedding_size 32 != hidden_size 64" in joined["electra"]
    assert "pad_token_id + 1 = 2" in joined["roberta"]
    mistral = import_config(cfg_path("mistral"))[0]  # a window in every layer: window_blocks left out
    assert (mistral.sliding_window, mistral.window_blocks) == (raw("mistral")["sliding_window"], None)
    assert import_config(cfg_path("qwen2"))[0].sliding_window is None  # use_sliding_window false
    for f in FAMILIES:
        assert "transformers_version" in ignored_fields(notes[f])
        assert "tie_word_embeddings" not in ignored_fields(notes[f])
    assert "MLM head works at embedding_size 32" in joined["electra"]


@pytest.mark.parametrize("family", FAMILIES)
def test_yaml_round_trip(family: str) -> None:
    d, notes = read_hf_config(cfg_path(family))
    spec, _ = import_config(cfg_path(family))
    text = to_yaml(d, notes, source=str(cfg_path(family)))
    lines = text.splitlines()
    assert lines[0].startswith("#") and all(n.split()[0] in text for n in notes)
    back = parse_spec(text, "spec.yaml")
    assert dataclasses.replace(back, source=spec.source) == spec
    assert "  q: {std: " in text  # per-matrix init leaves inline, readable


def test_read_returns_plain_layout() -> None:
    d, _ = read_hf_config(cfg_path("gpt2"))
    assert set(d) == {"version", "name", "model", "sequence", "dropout", "embedding_dropout", "attention_dropout",
                      "init"}  # GPT-2's test config drops the embeddings at 0.05, the branches at 0.1
    assert next(iter(d)) == "version" and d["version"] == 1  # imported specs carry the format version first
    assert d["init"]["o"] == {"std": pytest.approx(0.01), "bias_std": 0.0}
    assert "softmax_scale" not in d["model"]  # standard scale: left to the spec default
    assert json.loads(json.dumps(d)) == d  # plain data only


# ------------------------------------------------------------------------------------------------
# Variants written on the fly


def test_gpt2_unscaled_attention_and_name(tmp_path: Path) -> None:
    c = raw("gpt2") | {"scale_attn_weights": False, "_name_or_path": "openai-community/gpt2", "n_inner": 96}
    spec, notes = import_config(write(tmp_path, c))
    assert spec.softmax_scale == 1.0
    assert spec.name == "openai-community/gpt2"
    assert spec.d_ff == 96
    assert any("scale_attn_weights" in n for n in notes)
    back = parse_spec(to_yaml(*read_hf_config(write(tmp_path, c))))
    assert back.softmax_scale == 1.0


def test_gpt2_inverse_layer_idx_is_noted(tmp_path: Path) -> None:
    _, notes = import_config(write(tmp_path, raw("gpt2") | {"scale_attn_by_inverse_layer_idx": True}))
    assert any("scale_attn_by_inverse_layer_idx" in n and "not modelled" in n for n in notes)


def test_llama_gelu_gate_and_head_dim(tmp_path: Path) -> None:
    c = raw("llama") | {"hidden_act": "gelu_pytorch_tanh", "head_dim": 32}
    spec, notes = import_config(write(tmp_path, c))
    assert spec.activation == "geglu"
    # 4 heads of 32 at d_model 64: the heads' width and the output projection's fan-in 128 are the real ones
    assert (spec.head_dim, spec.d_head, spec.fan_in("o")) == (32, 32, 128)
    assert spec.softmax_scale == pytest.approx(1 / math.sqrt(32))
    assert spec.gain("o") == pytest.approx(raw("llama")["initializer_range"] ** 2 * 128)


def test_seq_len_override(tmp_path: Path) -> None:
    spec, notes = import_config(cfg_path("mistral"), seq_len=32)
    assert spec.seq_len == 32
    assert not any("sliding-window" in n for n in notes)  # window 64 covers 32 tokens
    assert any("sequence.length 32" in n for n in notes)


def test_missing_optional_fields_use_transformers_defaults(tmp_path: Path) -> None:
    c = {k: v for k, v in raw("bert").items() if k not in ("hidden_act", "initializer_range", "hidden_dropout_prob")}
    spec, notes = import_config(write(tmp_path, c))
    assert spec.activation == "gelu" and spec.init["q"].std == 0.02 and spec.dropout == 0.1
    assert any(n.startswith("not in the config") and "hidden_act=gelu" in n for n in notes)


def test_directory_and_qwen2_sliding(tmp_path: Path) -> None:
    c = raw("qwen2") | {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}
    c.pop("layer_types")
    spec, notes = import_config(write(tmp_path, c).parent)  # a model directory works too
    assert (spec.sliding_window, spec.window_blocks) == (16, (2,))  # layers from max_window_layers (from 0) on


# ------------------------------------------------------------------------------------------------
# Errors


def test_unsupported_model_type(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, raw("llama") | {"model_type": "xlnet"}))
    assert "'xlnet'" in str(e.value) and all(f in str(e.value) for f in SUPPORTED)
    assert e.value.key == "model_type" and e.value.file.endswith("config.json") and e.value.line


@pytest.mark.parametrize("family,field", [("bert", "hidden_size"), ("gpt2", "n_layer"), ("llama", "intermediate_size"),
                                          ("roberta", "max_position_embeddings"), ("qwen2", "model_type")])
def test_missing_field(tmp_path: Path, family: str, field: str) -> None:
    c = {k: v for k, v in raw(family).items() if k != field}
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, c))
    assert e.value.key == field and field in str(e.value)


@pytest.mark.parametrize("text,what", [("{not json", "not valid JSON"), ('{"model_type": "bert",}', "not valid JSON"),
                                       ("[1, 2]", "JSON object"), ('"bert"', "JSON object"),
                                       ('{"model_type": "gpt2", "n_layer": NaN}', "NaN"), ("", "not valid JSON")])
def test_bad_json(tmp_path: Path, text: str, what: str) -> None:
    with pytest.raises(SpecError) as e:
        read_hf_config(write(tmp_path, text))
    assert what in str(e.value) and str(tmp_path) in str(e.value)


def test_bad_values_name_the_field(tmp_path: Path) -> None:
    for patch, key in [({"num_hidden_layers": "2"}, "num_hidden_layers"), ({"hidden_act": "relu"}, "hidden_act"),
                       ({"num_attention_heads": 6}, "num_attention_heads (model.heads)"),
                       ({"num_key_value_heads": 3}, "num_key_value_heads (model.kv_heads)"),
                       ({"attention_dropout": 1.5}, "attention_dropout")]:
        with pytest.raises(SpecError) as e:
            import_config(write(tmp_path, raw("llama") | patch))
        assert e.value.key == key, patch
        assert e.value.line is not None


def test_missing_file_and_not_utf8(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        import_config(tmp_path / "nope.json")
    with pytest.raises(SpecError, match="without a config.json"):
        import_config(tmp_path)
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(SpecError, match="UTF-8"):
        import_config(tmp_path / "bin.json")


def test_hf_module_does_not_import_transformers() -> None:
    code = ("import sys; from initadvisor.hf import import_config; import_config(sys.argv[1]); "
            "bad = [m for m in ('transformers', 'torch') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, str(cfg_path("llama"))], check=True)


# ------------------------------------------------------------------------------------------------
# The init claims against the real randomly initialised model built by transformers


# spec matrix -> regexes searched in the real model's parameter names (weights only)
PARAMS = {
    "bert": {"q": ["attention.self.query."], "k": ["attention.self.key."], "v": ["attention.self.value."],
             "o": ["attention.output.dense."], "ff_in": ["intermediate.dense."],
             "ff_out": [r"layer\.\d+\.output\.dense\."],
             "embedding": ["word_embeddings", "position_embeddings", "token_type_embeddings"]},
    "gpt2": {"qkv": ["attn.c_attn."], "o": ["attn.c_proj."], "ff_in": ["mlp.c_fc."], "ff_out": ["mlp.c_proj."],
             "embedding": [r"^wte\.", r"^wpe\."]},
    "gpt_neox": {"qkv": ["attention.query_key_value."], "o": ["attention.dense."], "ff_in": ["mlp.dense_h_to_4h."],
                 "ff_out": ["mlp.dense_4h_to_h."], "embedding": ["embed_in."]},
    "llama": {"q": ["q_proj."], "k": ["k_proj."], "v": ["v_proj."], "o": ["o_proj."],
              "ff_in": ["gate_proj.", "up_proj."], "ff_out": ["down_proj."], "embedding": ["embed_tokens."]},
}
for _f in ("roberta", "electra"):
    PARAMS[_f] = PARAMS["bert"]
for _f in ("mistral", "qwen2", "qwen3", "olmo2", *GEMMA):
    PARAMS[_f] = PARAMS["llama"]
PARAMS["phi3"] = {"qkv": ["qkv_proj."], "o": ["o_proj."], "ff_in": ["gate_up_proj."], "ff_out": ["down_proj."],
                  "embedding": ["embed_tokens."]}
PARAMS["falcon"] = {"qkv": ["query_key_value."], "o": ["self_attention.dense."], "ff_in": ["dense_h_to_4h."],
                    "ff_out": ["dense_4h_to_h."], "embedding": ["word_embeddings."]}
PARAMS["modernbert"] = {"qkv": ["attn.Wqkv."], "o": ["attn.Wo."], "ff_in": ["mlp.Wi."], "ff_out": ["mlp.Wo."],
                        "embedding": ["tok_embeddings."]}
PARAMS["opt"] = {"q": ["q_proj."], "k": ["k_proj."], "v": ["v_proj."], "o": ["out_proj."], "ff_in": ["fc1."],
                 "ff_out": ["fc2."], "embedding": ["embed_tokens.", "embed_positions."]}
for _f in ("mixtral", "qwen3_moe"):  # the experts: 3-D parameters (experts, out, in); the router: mlp.gate
    PARAMS[_f] = {**PARAMS["llama"], "ff_in": ["gate_proj.", "up_proj.", r"experts\.gate_up_proj$"],
                  "ff_out": ["down_proj.", r"experts\.down_proj$"], "router": [r"mlp\.gate\.weight"]}


@pytest.fixture(scope="module")
def models():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    out = {}
    for f in FAMILIES:
        torch.manual_seed(0)
        config = transformers.AutoConfig.from_pretrained(DATA / f)
        out[f] = transformers.AutoModel.from_config(config)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_init_matches_real_model(models, family: str) -> None:
    import torch

    model = models[family]
    spec, _ = import_config(cfg_path(family))
    params = dict(model.named_parameters())
    # the real model is the shape the spec claims
    assert model.config.num_hidden_layers == spec.layers
    for mat, patterns in PARAMS[family].items():
        found = [p.detach() for n, p in params.items()
                 if (n.endswith("weight") or ".experts." in n) and any(re.search(s, n) for s in patterns)]
        assert found, (family, mat)
        w = torch.cat([p.flatten() for p in found])
        rms = w.pow(2).mean().sqrt().item()  # std about 0: the init is zero-mean
        claimed = {"qkv": spec.init["q"].std, "router": spec.moe and spec.moe.router_std}.get(mat) or spec.init[mat].std
        if mat == "qkv":
            assert spec.init["q"].std == spec.init["k"].std == spec.init["v"].std
        assert rms == pytest.approx(claimed, rel=0.05), (family, mat, rms, claimed)
        assert abs(w.mean().item()) < 0.1 * claimed
    if family == "gpt2":  # the depth-scaled c_proj really is 1/sqrt(2 n_layer) of the rest
        assert spec.init["o"].std == pytest.approx(spec.init["q"].std / math.sqrt(2 * spec.layers))
    biases = {n: p for n, p in params.items() if n.endswith("bias")}
    if family not in ("llama", "mistral", "qwen3", "olmo2", "phi3", "mixtral", "qwen3_moe", "modernbert", *GEMMA):
        assert biases
    for n, b in biases.items():
        assert torch.count_nonzero(b) == 0, n  # bias_std 0 everywhere
    for n, p in params.items():  # norm gains 1, as the spec's norms assume
        if "norm" in n.lower() and n.endswith("weight"):
            assert torch.all(p == (0 if family in GEMMA else 1)), n  # Gemma applies 1 + w


def test_real_model_structure_matches_spec(models) -> None:
    # grouped KV heads, gated MLP width and parallel residual as claimed
    llama = models["llama"]
    spec, _ = import_config(cfg_path("llama"))
    attn = llama.layers[0].self_attn
    assert attn.k_proj.out_features == spec.kv_heads * spec.d_head
    assert llama.layers[0].mlp.gate_proj.out_features == spec.d_ff
    neox_spec, _ = import_config(cfg_path("gpt_neox"))
    assert models["gpt_neox"].layers[0].use_parallel_residual is neox_spec.parallel_residual is True
    gpt2_spec, _ = import_config(cfg_path("gpt2"))
    assert models["gpt2"].h[0].mlp.c_fc.nf == gpt2_spec.d_ff
    rob_spec, _ = import_config(cfg_path("roberta"))
    # RoBERTa position ids run from pad_token_id + 1 to max_position_embeddings - 1
    assert models["roberta"].embeddings.position_embeddings.num_embeddings - 2 == rob_spec.seq_len
    el = models["electra"]
    assert el.embeddings_project.in_features == 32 and el.embeddings_project.out_features == 64


def test_t5_encoder_mapping_and_init() -> None:
    """T5 (v1.1 layout: gated GeLU, heads * d_kv != d_model, untied): the encoder stack's spec field by field from the
    JSON, and its init against the real T5EncoderModel built from the same file (T5's own rule: q (d d_kv)^-1/2, k,
    v, wi d^-1/2, o (heads d_kv)^-1/2, wo d_ff^-1/2, embedding 1; norm gains 1; no biases)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    c = raw("t5")
    d, dkv, H, F = c["d_model"], c["d_kv"], c["num_heads"], c["d_ff"]
    spec, notes = import_config(cfg_path("t5"))
    assert (spec.layers, spec.d_model, spec.heads, spec.d_head, spec.d_ff) == (c["num_layers"], d, H, dkv, F)
    assert (spec.norm, spec.norm_type, spec.causal, spec.activation, spec.softmax_scale) == (
        "pre", "rmsnorm", False, "geglu", 1.0)
    assert spec.dropout == spec.mlp_dropout == spec.attention_dropout == c["dropout_rate"]
    assert spec.embeddings == ("token",) and spec.seq_len == 512 and spec.norm_eps == c["layer_norm_epsilon"]
    assert spec.head_init.std == 1.0  # scale_decoder_outputs false: the N(0, 1) embedding without a rescale
    assert "relative_attention_bias" in "\n".join(notes) and "gelu_new" in "\n".join(notes)
    torch.manual_seed(0)
    model = transformers.T5EncoderModel._from_config(transformers.AutoConfig.from_pretrained(DATA / "t5"))
    want = {"q": (d * dkv) ** -0.5, "k": d ** -0.5, "v": d ** -0.5, "o": (H * dkv) ** -0.5, "ff_in": d ** -0.5,
            "ff_out": F ** -0.5, "embedding": 1.0}
    names = {"q": r"SelfAttention\.q\.", "k": r"SelfAttention\.k\.", "v": r"SelfAttention\.v\.",
             "o": r"SelfAttention\.o\.", "ff_in": r"DenseReluDense\.wi_[01]\.", "ff_out": r"DenseReluDense\.wo\.",
             "embedding": r"^shared\."}
    params = dict(model.named_parameters())
    for m, pattern in names.items():
        w = torch.cat([p.detach().flatten() for n, p in params.items() if re.search(pattern, n)])
        assert spec.init[m].std == pytest.approx(want[m], rel=1e-12), m
        assert w.pow(2).mean().sqrt().item() == pytest.approx(want[m], rel=0.05), m
    assert not any(n.endswith("bias") for n in params)
    assert all(torch.all(p == 1) for n, p in params.items() if "layer_norm" in n)
    back = parse_spec(to_yaml(*read_hf_config(cfg_path("t5"))), "t5.yaml")
    assert dataclasses.replace(back, source=spec.source) == spec


def test_t5_variants(tmp_path: Path) -> None:
    """The original T5 (ReLU, tied head rescaled by d^-1/2); decoder stacks and non-unit initializer_factor are
    refused with the field named."""
    base = {"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 100}
    spec, _ = import_config(write(tmp_path, base))
    assert spec.activation == "relu" and spec.d_head == 64 and spec.head_init.std == 64 ** -0.5  # d_kv default 64
    for field, value, match in (("initializer_factor", 0.5, "T5LayerNorm's gain"), ("is_decoder", True, "decoder"),
                                ("feed_forward_proj", "gated-gelu-x", "feed_forward_proj"),
                                ("feed_forward_proj", "swoosh", "feed_forward_proj")):
        with pytest.raises(SpecError, match=match) as e:
            import_config(write(tmp_path, {**base, field: value}))
        assert e.value.key == field


def test_deepseek_v3_mapping_and_init(tmp_path: Path) -> None:
    """DeepSeek-V3: latent attention's widths and the MoE section (group-limited routing too) field by field from the
    JSON, the init against the
    real model built from the same file (every matrix, router and expert at initializer_range, kv_b_proj's key and
    value rows alike), and yarn's mscale^2 on the logits' scale."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    c = raw("deepseek_v3")
    spec, notes = import_config(cfg_path("deepseek_v3"))
    A, E, r = spec.latent, spec.moe, c["initializer_range"]
    assert (A.q_rank, A.kv_rank, A.nope_dim, A.rope_dim, A.v_dim, A.down_std) == (
        c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], r)
    assert (E.experts, E.top_k, E.router, E.normalize, E.scale, E.d_ff, E.shared, E.router_std) == (
        c["n_routed_experts"], c["num_experts_per_tok"], "sigmoid", c["norm_topk_prob"], c["routed_scaling_factor"],
        c["moe_intermediate_size"], c["n_shared_experts"], r)
    assert E.dense_blocks == tuple(range(1, c["first_k_dense_replace"] + 1))
    assert (spec.norm, spec.norm_type, spec.causal, spec.activation) == ("pre", "rmsnorm", True, "swiglu")
    assert spec.d_head == c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    assert spec.softmax_scale == pytest.approx(spec.d_head ** -0.5, rel=1e-12)
    assert spec.fan_in("k") == spec.fan_in("v") == A.kv_rank and spec.fan_in("o") == spec.heads * A.v_dim
    assert (E.groups, E.top_groups) == (c["n_group"], c["topk_group"])
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(DATA / "deepseek_v3"))
    for n, p in model.named_parameters():
        if p.dim() >= 2:
            assert p.detach().pow(2).mean().sqrt().item() == pytest.approx(r, rel=0.1), n
    yarn = {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0,
            "original_max_position_embeddings": 64}
    scaled, _ = import_config(write(tmp_path, c | {"rope_parameters": yarn}))
    assert scaled.softmax_scale == pytest.approx(spec.softmax_scale * (0.1 * math.log(40.0) + 1) ** 2, rel=1e-12)
    real = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    assert real.layers[0].self_attn.scaling == pytest.approx(scaled.softmax_scale, rel=1e-6)


def test_latent_attention_is_its_moment_equivalent() -> None:
    """The adapter's equivalent heads: the logits' variance for unit inputs (transcribed: scale^2 g_Q (nope g_K +
    rope g_R), the latents normed), the value and output gains, rope_dim coordinates turned, and beta moved by the
    softmax scale (with_beta) as a QK-norm's."""
    from initadvisor.stack import block_params, spec_beta
    from initadvisor.spec import build_spec

    spec = build_spec({"model": {"layers": 2, "d_model": 256, "heads": 4, "norm": "pre", "causal": True,
                                 "rope_theta": 10000.0},
                       "latent_attention": {"q_rank": 96, "kv_rank": 64, "nope_dim": 32, "rope_dim": 16, "v_dim": 48,
                                            "down_std": 0.05},
                       "init": {"q": {"std": 0.03}, "k": {"std": 0.04}, "v": {"std": 0.06}, "o": {"std": 0.07}},
                       "sequence": {"length": 128}})
    g_q, g_k, g_r = 0.03 ** 2 * 96, 0.04 ** 2 * 64, 0.05 ** 2 * 256
    V = spec.softmax_scale ** 2 * g_q * (32 * g_k + 16 * g_r)
    assert spec.softmax_scale == pytest.approx(48 ** -0.5)
    assert spec_beta(spec) == pytest.approx(math.sqrt(V / math.log(128)), rel=1e-12)
    P = block_params(spec)
    assert (P.g_v, P.g_o) == (pytest.approx(0.06 ** 2 * 64), pytest.approx(0.07 ** 2 * 4 * 48))
    assert P.init["o"][0] ** 2 * 4 * P.head_dim == pytest.approx(P.g_o)  # the network's gains are the moments'
    assert P.init["v"][0] ** 2 * 256 == pytest.approx(P.g_v)
    assert P.init["q"][0] ** 2 * 256 * P.init["k"][0] ** 2 * 256 * P.softmax_scale ** 2 * P.head_dim == pytest.approx(V)
    share = 16 * g_r / (32 * g_k + 16 * g_r)
    assert round(P.head_dim * P.rope_fraction) == 16 and P.rope_fraction == pytest.approx(share, abs=0.5 / P.head_dim)
    assert spec_beta(spec.with_beta(0.3)) == pytest.approx(0.3, rel=1e-12)


def test_bloom_mapping_and_init(tmp_path: Path) -> None:
    """BLOOM: ALiBi, the embedding LayerNorm, pre-LN GeLU (tanh) blocks of 4 d, dropout on both branches and on the
    probabilities, the tied head, field by field from the JSON; every matrix of the real model at initializer_range
    and every bias 0; the residual taken after the input norm is refused."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    c = raw("bloom")
    spec, notes = import_config(cfg_path("bloom"))
    assert (spec.layers, spec.d_model, spec.heads, spec.d_ff) == (c["n_layer"], c["hidden_size"], c["n_head"],
                                                                  4 * c["hidden_size"])
    assert (spec.alibi, spec.causal, spec.norm, spec.norm_type, spec.embedding_norm, spec.activation) == (
        True, True, "pre", "layernorm", True, "gelu_tanh")
    assert (spec.dropout, spec.attention_dropout, spec.embedding_dropout) == (c["hidden_dropout"],
                                                                              c["attention_dropout"], 0.0)
    assert spec.tie_embeddings and spec.rope_theta is None and spec.seq_len == 2048 and "ALiBi" in "\n".join(notes)
    assert all(spec.init[m].std == c["initializer_range"] for m in MATRICES)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(DATA / "bloom"))
    for n, p in model.named_parameters():
        if p.dim() == 2:
            assert p.detach().pow(2).mean().sqrt().item() == pytest.approx(c["initializer_range"], rel=0.1), n
        elif n.endswith("bias"):
            assert torch.count_nonzero(p) == 0, n
    with pytest.raises(SpecError, match="after the input norm") as e:
        import_config(write(tmp_path, c | {"apply_residual_connection_post_layernorm": True}))
    assert e.value.key == "apply_residual_connection_post_layernorm"


def test_gemma3_multimodal_wrapper(tmp_path: Path) -> None:
    """model_type gemma3 (Gemma3ForConditionalGeneration, the Hub's Gemma 3 4B-27B): its language model from
    text_config, drawn with text_config's initializer_range (the wrapper's own is not read: measured on the real
    wrapper model), the text config's defaults where it is silent, errors naming text_config's fields."""
    text = {k: v for k, v in raw("gemma3_text").items() if k != "model_type"}
    text["initializer_range"] = 0.05
    wrapper = {"model_type": "gemma3", "initializer_range": 0.01, "text_config": {"model_type": "gemma3_text", **text},
               "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28,
                                 "patch_size": 14},
               "mm_tokens_per_image": 4}
    spec, notes = import_config(write(tmp_path, wrapper))
    alone, _ = import_config(write(tmp_path, {**text, "model_type": "gemma3_text"}, "t.json"))
    assert dataclasses.replace(spec, name="", source=None, notes=()) == \
        dataclasses.replace(alone, name="", source=None, notes=())
    assert spec.init["q"].std == 0.05 and spec.name == "gemma3"
    assert {"vision_config", "initializer_range", "mm_tokens_per_image"} <= ignored_fields(notes)

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(transformers.AutoConfig.for_model(**wrapper))
    q = torch.cat([p.flatten() for n, p in model.named_parameters() if "language_model" in n and "q_proj" in n])
    assert q.pow(2).mean().sqrt().item() == pytest.approx(0.05, rel=0.05)
    from initadvisor.api import verify
    from initadvisor.audit import audit_config

    path = write(tmp_path, wrapper)
    assert audit_config(path).findings == []  # the language model as transformers builds it: no silent-init finding
    assert set(verify(path, backend="torch", seeds=1, batch=1).max_error) >= {"rho", "q", "grad_q"}  # it builds

    quiet = {k: v for k, v in text.items() if k not in ("vocab_size", "max_position_embeddings")}
    spec, notes = import_config(write(tmp_path, {**wrapper, "text_config": quiet}))
    assert (spec.vocab, spec.seq_len) == (262208, 131072)  # Gemma3TextConfig's defaults
    assert any("text_config.vocab_size=262208" in n for n in notes)
    for bad, key in (({k: v for k, v in wrapper.items() if k != "text_config"}, "text_config"),
                     ({**wrapper, "text_config": [1]}, "text_config"),
                     ({**wrapper, "text_config": {**text, "hidden_size": -3}}, "text_config.hidden_size")):
        with pytest.raises(SpecError) as e:
            import_config(write(tmp_path, bad))
        assert e.value.key == key
    lines = (tmp_path / "config.json").read_text().splitlines()
    assert e.value.line == 1 + next(i for i, ln in enumerate(lines) if '"text_config"' in ln)  # its fields have none


ROPE_SCALINGS = [  # (family, config fields): yarn (default and DeepSeek-style mscales), longrope (factor given or not)
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}),
    ("qwen2", {"rope_scaling": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
                                "mscale": 0.707, "mscale_all_dim": 1.0}}),
    ("gpt_neox", {"rope_scaling": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 2048}}),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("phi3", {"rope_scaling": {"type": "longrope", "long_factor": [1.5] * 8, "short_factor": [1.0] * 8},
              "original_max_position_embeddings": 64, "max_position_embeddings": 2048}),
    ("phi3", {"rope_scaling": {"type": "longrope", "long_factor": [1.5] * 8, "short_factor": [1.0] * 8,
                               "factor": 4.0}, "original_max_position_embeddings": 64}),
]


@pytest.mark.parametrize("family,fields", ROPE_SCALINGS)
def test_rope_attention_factor_matches_transformers(tmp_path: Path, family: str, fields: dict) -> None:
    """yarn and longrope multiply cos and sin by an attention factor: the rotated share f of a head's logits times
    its square, carried by softmax_scale (variance-equivalent: f af^4 + 1 - f). Checked against the factor the real
    model's rotary embedding applies (its `attention_scaling`), a partial rotary (GPT-NeoX's 0.25) included."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    path = write(tmp_path, raw(family) | fields)
    spec, _ = import_config(path)
    af = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(tmp_path)).rotary_emb.attention_scaling
    f = spec.rotary_fraction
    assert (spec.softmax_scale or spec.d_head ** -0.5) == pytest.approx(spec.d_head ** -0.5 * math.sqrt(f * af**4 + 1 - f),
                                                                       rel=1e-9)


@pytest.mark.parametrize("bad", [{"rope_type": "yarn", "factor": -2.0, "original_max_position_embeddings": 64},
                                 {"rope_type": "yarn", "factor": 2.0, "attention_factor": "big"},
                                 {"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}])
def test_rope_attention_factor_bad_values(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, raw("llama") | {"rope_scaling": bad}))
    assert e.value.key == "rope_scaling" and e.value.line is not None


STRICT_VALUES = [0, 1, 7, 0.5, "bogus", True, None, [1, 2], {}]


@pytest.mark.parametrize("family", sorted(p.name for p in DATA.iterdir() if (p / "config.json").is_file()))
def test_every_config_the_import_accepts_transformers_builds(family: str) -> None:
    """transformers (5.24) types its config fields strictly and checks some across fields; `check` accepting what
    `verify --backend torch` and `audit` then refuse was the fuzzer's commonest finding. Every top-level field (and
    a few common ones absent here) set to each of STRICT_VALUES: what the import accepts, hf.transformers_config
    builds. It passes a field as the import reads it: an ignored one it leaves out on refusal, a whole number in a
    float field as the float (the value kept), a null the import reads as missing as missing."""
    pytest.importorskip("transformers")
    from initadvisor.hf import transformers_config

    c = raw(family)
    failed = []
    for key in [*sorted(c), "use_cache", "bos_token_id", "id2label", "output_attentions", "problem_type"]:
        for v in STRICT_VALUES:
            case = c | {key: v}
            try:
                import_config(case)
            except SpecError:
                continue
            try:
                transformers_config(case)
            except Exception as e:  # noqa: BLE001
                failed.append(f"{key}={v!r}: {str(e).splitlines()[-1][:120]}")
    assert not failed, failed
    if family == "llama":  # the value kept, as a float
        assert transformers_config(c | {"initializer_range": 1}).initializer_range == 1.0


def test_layer_type_names_are_transformers_own() -> None:
    """hf.LAYER_TYPES (the import refuses other names in layer_types) is what transformers accepts: its allowed names
    and the legacy names it maps onto them."""
    cu = pytest.importorskip("transformers.configuration_utils")
    from initadvisor.hf import LAYER_TYPES

    assert LAYER_TYPES == set(cu.ALLOWED_ATTN_LAYER_TYPES) | set(cu._LEGACY_LAYER_TYPE_REMAP)


@pytest.mark.parametrize("family, change, key, words", [
    ("gemma2", {"num_hidden_layers": 3}, "layer_types", "2 layer types for 3 layers"),
    ("qwen3", {"layer_types": ["full_attention", "bogus"]}, "layer_types", "unknown layer type 'bogus'"),
    ("llama", {"head_dim": 7}, "head_dim", "even head_dim, got 7"),
    ("llama", {"initializer_range": 2.0}, "initializer_range", "[0, 1]"),
    ("gemma2", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar", "[1, 1e12]"),
    ("gemma3_text", {"query_pre_attn_scalar": 0.5}, "query_pre_attn_scalar", "[1, 1e12]"),
    ("deepseek_v3", {"first_k_dense_replace": 0.5}, "first_k_dense_replace", "[0, 1e12]"),
    ("bert", {"type_vocab_size": 0}, "type_vocab_size", "[1, 1e12]"),
    ("roberta", {"pad_token_id": None}, "pad_token_id", "pad_token_id + 1"),
    ("qwen3", {"rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "default"}}},
     "rope_parameters", "per layer type"),
    ("roberta", {"pad_token_id": "x"}, "pad_token_id", "[0, 1e12]"),
    ("modernbert", {"sliding_window": None}, "sliding_window", "twice"),
    ("deepseek_v3", {"num_key_value_heads": 2}, "num_key_value_heads", "must equal num_attention_heads (4)"),
    ("qwen2", {"head_dim": None}, "head_dim", "null"),
    ("qwen3", {"layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": False}, "layer_types",
     "use_sliding_window false"),
])
def test_what_transformers_refuses_in_a_field_the_import_reads_check_refuses(
        tmp_path: Path, family: str, change: dict, key: str, words: str) -> None:
    """Fields that shape the spec, where transformers refuses a value the import used to take (a fallback, a
    truncation, a crash: query_pre_attn_scalar 0 was a ZeroDivisionError): refused by name, at the field's line."""
    with pytest.raises(SpecError) as e:
        import_config(write(tmp_path, raw(family) | change))
    assert e.value.key == key and e.value.line is not None and words in str(e.value)


def test_modernberts_sliding_window_sets_local_attention(tmp_path: Path) -> None:
    """ModernBERT's config takes sliding_window as the half-window: local_attention = 2 x it, over local_attention's
    own value (transformers' property setter); the spec's window follows, as transformers builds it."""
    c = raw("modernbert") | {"sliding_window": 8}
    spec, notes = import_config(write(tmp_path, c))
    assert spec.sliding_window == 16 and any("local_attention = 2 x sliding_window" in n for n in notes)
    transformers = pytest.importorskip("transformers")
    assert transformers.AutoConfig.for_model(**c).local_attention == 16


@pytest.mark.parametrize("family", LLAMA_LIKE + GEMMA)
@pytest.mark.parametrize("given", ["missing", "null"])
def test_a_missing_kv_head_count_is_transformers_default(tmp_path: Path, family: str, given: str) -> None:
    """num_key_value_heads left out is the class default in transformers 5.24 (Mistral and Mixtral 8, Qwen2 and
    Qwen3 32: a GQA model, or one transformers cannot build), not the head count; a null is Qwen2's and Qwen3's
    head count. The spec's K/V heads are transformers' (or both refuse)."""
    transformers = pytest.importorskip("transformers")
    from initadvisor.hf import transformers_config

    c = raw(family) | {"num_attention_heads": 32, "num_key_value_heads": None}
    if given == "missing":
        del c["num_key_value_heads"]
    try:
        built = transformers_config(c)
        kv = built.num_key_value_heads
        transformers.AutoModel.from_config(built)
    except Exception:  # noqa: BLE001
        kv = None
    try:
        assert import_config(write(tmp_path, c))[0].kv_heads == kv
    except SpecError as e:
        assert kv is None and e.key is not None


def test_electra_embedding_size_is_the_tables_width(tmp_path):
    """ELECTRA with embedding_size != hidden_size: tables of that width projected to d_model (model.embedding_width),
    so the stream entering block 1 has q = initializer_range^2 x embedding_size x the LayerNorm's (1 / keep); equal
    widths set nothing; a width past the spec's limit names the config's field and line."""
    from initadvisor.errors import SpecError

    c = raw("electra")
    spec, _ = import_config(cfg_path("electra"))
    e, std = c["embedding_size"], c["initializer_range"]
    assert spec.embedding_width == e != spec.d_model
    from initadvisor.stack import input_moments

    assert input_moments(spec)[0] == pytest.approx(std**2 * e / (1 - c["hidden_dropout_prob"]), rel=1e-6)
    assert import_config(write(tmp_path, {**c, "embedding_size": c["hidden_size"]}))[0].embedding_width is None
    with pytest.raises(SpecError) as err:
        import_config(write(tmp_path, {**c, "embedding_size": 2_000_000}))
    assert err.value.key == "embedding_size" and err.value.line is not None


def test_transformers_warnings_on_fields_the_import_ignores_stay_off_stderr(tmp_path: Path) -> None:
    """A bos_token_id past the vocabulary (fuzz seed 131, a Qwen2 config): the import ignores it, transformers warns
    about it on stderr when `verify --backend torch` builds the model, beside the report's verdict. The CLI keeps
    transformers' warnings off stderr (TRANSFORMERS_VERBOSITY error, unless the user set it)."""
    c = raw("qwen2") | {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000, "bos_token_id": 10**30}
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}
    r = subprocess.run([sys.executable, "-m", "initadvisor", "verify", str(write(tmp_path, c)), "--backend", "torch",
                        "--seeds", "1", "--batch", "1", "--format", "json"], capture_output=True, text=True, env=env)
    assert r.returncode in (0, 1) and json.loads(r.stdout)["layers"] and r.stderr == "", r.stderr[:300]
