"""The family registry against the real models: each entry's block paths, weight-role rules, fused-QKV layout and
attention-dropout key checked on the randomly initialised transformers model built from tests/data/hf/<family>/
(2 layers, d_model 64)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from initadvisor.families import ATTN_DROPOUT_KEYS, BLOCK_PATHS, FAMILIES
from initadvisor.hf import SUPPORTED, WRAPPERS, import_config
from initadvisor.init_code import RULES, init_matrices

DATA = Path(__file__).parent / "data" / "hf"


def test_registry_covers_the_test_configs_and_every_rule() -> None:
    assert SUPPORTED == tuple(FAMILIES)
    assert sorted([*FAMILIES, *WRAPPERS]) == sorted(p.name for p in DATA.iterdir())  # (gemma3: its text_config)
    for mt, fam in FAMILIES.items():
        assert fam.model_type == mt == json.loads((DATA / mt / "config.json").read_text())["model_type"]
        assert set(fam.blocks) <= set(BLOCK_PATHS)
        assert fam.attn_dropout_key in ATTN_DROPOUT_KEYS
        roles = {role for _, role in fam.rules}
        roles |= {"k", "v"} if "kv-latent" in roles else set()  # DeepSeek's kv_b_proj: per head [key | value] rows
        assert (fam.fused_qkv is None) == ({"q", "k", "v"} <= roles)
    # no rule of the snippet is left without a family that uses it
    assert {s for s, _ in RULES} == {s for fam in FAMILIES.values() for s, _ in fam.rules}


@pytest.mark.parametrize("family", FAMILIES)
def test_attn_dropout_key_is_the_one_read(tmp_path: Path, family: str) -> None:
    c = json.loads((DATA / family / "config.json").read_text()) | {FAMILIES[family].attn_dropout_key: 0.123}
    if family == "modernbert":  # its attention dropout also drops the branch output: one rate with the MLP's
        c["mlp_dropout"] = 0.123
    if family == "falcon":  # Falcon drops its attention probabilities only with ALiBi
        c["alibi"] = True
    (tmp_path / "config.json").write_text(json.dumps(c))
    assert import_config(tmp_path)[0].attention_dropout == 0.123
    # initadvisor.torch takes the first of ATTN_DROPOUT_KEYS the transformers config has
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert next(getattr(config, k) for k in ATTN_DROPOUT_KEYS if hasattr(config, k)) == 0.123


@pytest.fixture(scope="module")
def models():
    """Per family: (config, spec, base model, causal-LM (ModernBERT: masked-LM) wrapper), eager attention, eval
    mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    out = {}
    for f in FAMILIES:
        torch.manual_seed(0)
        config = transformers.AutoConfig.from_pretrained(DATA / f)
        if f == "t5":  # the encoder stack, and the encoder-decoder; the relative bias zeroed (_attention's test)
            base = transformers.T5EncoderModel._from_config(config, attn_implementation="eager").eval()
            lm = transformers.T5ForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
            torch.nn.init.zeros_(base.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight)
        else:
            base = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
            auto = transformers.AutoModelForMaskedLM if f == "modernbert" else transformers.AutoModelForCausalLM
            lm = auto.from_config(config, attn_implementation="eager").eval()
        out[f] = config, import_config(DATA / f)[0], base, lm
    return out


def _resolve(model, path: str):
    for part in path.split("."):
        model = getattr(model, part, None)
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_block_paths_find_the_blocks(models, family: str) -> None:
    import torch

    config, spec, *built = models[family]
    for model, path in zip(built, FAMILIES[family].blocks):
        blocks = _resolve(model, path)
        assert isinstance(blocks, torch.nn.ModuleList) and len(blocks) == spec.layers == 2, (type(model), path)
        # the search in BLOCK_PATHS order stops at this path
        first = next(p for p in BLOCK_PATHS if isinstance(_resolve(model, p), torch.nn.ModuleList))
        assert first == path


def _first_match(name: str, rules) -> tuple[str, str] | None:
    return next(((s, r) for s, r in rules if name.endswith(s)), None)


@pytest.mark.parametrize("family", FAMILIES)
def test_rules_match_real_modules_of_the_right_shape(models, family: str) -> None:
    import torch

    config, spec, model, _ = models[family]
    fam = FAMILIES[family]
    d, d_ff, kv, hq = spec.d_model, spec.d_ff, spec.kv_heads * spec.d_head, spec.heads * spec.d_head
    d_emb = getattr(config, "embedding_size", d)  # ELECTRA's embeddings are narrower
    out_in = {"q": (hq, d), "k": (kv, d), "v": (kv, d), "o": (d, hq), "ff_in": (d_ff, d), "ff_out": (d, d_ff),
              "qkv": (d + 2 * kv, d), "qkv-neox": (d + 2 * kv, d)}  # [q | k | v] rows, or per K/V group
    gated = spec.activation in ("swiglu", "geglu")
    if spec.latent:  # multi-head latent attention: the down projections to the latents, the up projections per head
        A = spec.latent
        out_in.update({"o": (d, spec.heads * A.v_dim), "kv-latent": (spec.heads * (A.nope_dim + A.v_dim), A.kv_rank),
                       "q": (hq, A.q_rank or d)})
        down = {"self_attn.q_a_proj": (A.q_rank, d), "self_attn.kv_a_proj_with_mqa": (A.kv_rank + A.rope_dim, d)}
    matrices = {n: m for n, m in model.named_modules()
                if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2}
    moe = spec.moe
    dense = len(moe.dense_blocks) if moe else spec.layers
    stacked = {f"{n}.{pn}": p for n, m in model.named_modules() for pn, p in m.named_parameters(recurse=False)
               if p.dim() == 3}  # a mixture of experts' (experts, out, in) matrices, named by parameter
    for suffix, role in fam.rules:
        if suffix.startswith("mlp.experts."):
            hits = [n for n in stacked if n.endswith(suffix)]
            assert len(hits) == spec.layers - dense, (suffix, hits)
            f = moe.d_ff
            want = (moe.experts, 2 * f, d) if role == "ff_in" else (moe.experts, d, f)
            assert all(tuple(stacked[n].shape) == want for n in hits), (suffix, want)
            continue
        hits = [n for n in matrices if _first_match(n, fam.rules) == (suffix, role)]
        count = 1 if role == "embedding" else dense if suffix.startswith("mlp.") else spec.layers
        count = 0 if suffix == "head.dense" else count  # ModernBERT's MLM head: in the masked-LM model only
        if suffix.startswith("DenseReluDense.wi"):  # T5: wi (ReLU) or wi_0 and wi_1 (gated), one layout a model
            count *= (suffix == "DenseReluDense.wi") != gated
        if spec.latent and suffix in ("self_attn.q_proj", "self_attn.q_a_proj"):  # q_proj: without a q latent
            count *= (suffix == "self_attn.q_proj") == (spec.latent.q_rank is None)
        assert len(hits) == count, (suffix, hits)
        for n in hits:
            w = matrices[n].weight
            shape = tuple(w.T.shape if type(matrices[n]).__name__ == "Conv1D" else w.shape)
            want = (2 * d_ff, d) if suffix in ("mlp.gate_up_proj", "mlp.Wi") else out_in.get(role)  # fused gate, up
            want = down[suffix] if role == "down" else want
            assert shape[1] == d_emb if role == "embedding" else shape == want, (n, shape)
    # the snippet's full rule list gives every matrix the family's role: no other family's suffix shadows one
    for n in matrices:
        fam_hit, hit = _first_match(n, fam.rules), _first_match(n, RULES)
        assert (fam_hit and fam_hit[1]) == (hit and hit[1]), n


def _attention(model, family: str, std: dict[str, float]):
    """init_matrices with the family's rules and these stds, then (layer-0 attention probabilities, outputs of
    every attention output projection) on random tokens."""
    import torch

    fam = FAMILIES[family]
    torch.manual_seed(1)
    done = init_matrices(model, std, {}, fam.rules, model.config.num_attention_heads)
    assert set(done.values()) == {r for _, r in fam.rules}
    outs = []
    hooks = [m.register_forward_hook(lambda _m, _a, o: outs.append(o)) for n, m in model.named_modules()
             if done.get(n) == "o"]
    ids = torch.randint(2, model.config.vocab_size, (2, 8))
    with torch.no_grad():
        att = model(ids, output_attentions=True).attentions[0]
    for h in hooks:
        h.remove()
    return att, outs


def _uniform(att) -> bool:
    """Every query row spreads its weight evenly over the keys it sees."""
    seen = att > 0
    return bool(seen.any()) and bool(att[seen].sub(att.amax(-1, keepdim=True).expand_as(att)[seen]).abs().max()
                                     < 1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_rules_and_qkv_layout_drive_the_real_forward(models, family: str) -> None:
    # zeroing q (or k) makes every logit 0 and the attention uniform; zeroing v makes the attention output 0.
    # A fused q/k/v split that drew the wrong rows (or a rule on the wrong module) breaks one of these.
    model = models[family][2]
    std = dict.fromkeys(("q", "k", "v", "o", "ff_in", "ff_out", "embedding", "down"), 1.0)
    att, outs = _attention(model, family, std)
    assert not _uniform(att) and all(o.abs().max() > 0 for o in outs)
    spec = models[family][1]
    for zero in ("q", "k"):  # latent attention's rotary key comes from its down projection
        off = {zero: 0.0, **({"down": 0.0} if zero == "k" and spec.latent else {})}
        att = _attention(model, family, std | off)[0]
        if spec.alibi:  # the logits are ALiBi's biases alone: its rows at init
            from initadvisor.core.attention import alibi_rows

            T = att.shape[-1]
            assert np.allclose(att.numpy(), alibi_rows(T, spec.heads)[None], atol=1e-6), zero
        else:
            assert _uniform(att), zero
    att, outs = _attention(model, family, std | {"v": 0.0})
    assert len(outs) == 2 and all(o.abs().max() == 0 for o in outs)


@pytest.mark.parametrize("variant", [{"new_decoder_architecture": True, "num_kv_heads": 2},
                                     {"multi_query": False}])
def test_falcon_query_key_value_groups_drive_the_real_forward(variant) -> None:
    """Falcon-40B's rows per K/V group ([q, q, k, v] for 4 heads over 2 groups) and the old block without
    multi-query (a group per head, GPT-NeoX's layout) split by the same rule."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.FalconConfig(**json.loads((DATA / "falcon" / "config.json").read_text()) | variant)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    std = dict.fromkeys(("q", "k", "v", "o", "ff_in", "ff_out", "embedding"), 1.0)
    assert not _uniform(_attention(model, "falcon", std)[0])
    for zero in ("q", "k"):
        assert _uniform(_attention(model, "falcon", std | {zero: 0.0})[0]), zero
    att, outs = _attention(model, "falcon", std | {"v": 0.0})
    assert all(o.abs().max() == 0 for o in outs)
