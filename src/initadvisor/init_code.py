"""A ready-to-paste PyTorch `init_weights(model)` for a recommended spec.

The snippet is for people to paste; initadvisor never executes it. Its loop is `init_matrices`, printed from its
own source: `initadvisor.torch.apply` calls the same function with the numbers (`numbers(spec)`) and `RULES`,
so a recommendation JSON can never run code and the paste and `apply` cannot drift apart. Module names
covered: HuggingFace BERT/RoBERTa/ELECTRA, GPT-2, GPT-NeoX, the Llama family (Mistral, Qwen2/3, OLMo 2, Phi-3,
Gemma 2/3, the experts of Mixtral and Qwen3-MoE; their routers are left to the model), OPT, Falcon, BLOOM,
ModernBERT, T5, DeepSeek-V3 (its latent projections: kv_b_proj split into key and value rows), and nanoGPT.
The rules live here, not in `initadvisor.families`, because the snippet prints them and must not import
initadvisor; each registry entry there names the rules its family's modules match.
"""

from __future__ import annotations

import ast

# (module-name suffix, role); the first match wins, so the more specific suffixes come first.
_RULES_TEXT = """[
    ("attention.self.query", "q"), ("attention.self.key", "k"), ("attention.self.value", "v"),
    ("attention.output.dense", "o"), ("intermediate.dense", "ff_in"), ("output.dense", "ff_out"),
    ("self_attn.q_proj", "q"), ("self_attn.k_proj", "k"), ("self_attn.v_proj", "v"), ("self_attn.o_proj", "o"),
    ("self_attn.out_proj", "o"), ("fc1", "ff_in"), ("fc2", "ff_out"), ("embed_positions", "embedding"),
    ("attn.Wqkv", "qkv"), ("attn.Wo", "o"), ("mlp.Wi", "ff_in"), ("mlp.Wo", "ff_out"), ("tok_embeddings", "embedding"),
    ("head.dense", "o"),
    ("mlp.gate_proj", "ff_in"), ("mlp.up_proj", "ff_in"), ("mlp.down_proj", "ff_out"),
    ("self_attn.qkv_proj", "qkv"), ("mlp.gate_up_proj", "ff_in"),
    ("mlp.experts.gate_up_proj", "ff_in"), ("mlp.experts.down_proj", "ff_out"),
    ("attention.query_key_value", "qkv-neox"), ("attention.dense", "o"),
    ("mlp.dense_h_to_4h", "ff_in"), ("mlp.dense_4h_to_h", "ff_out"),
    ("attn.c_attn", "qkv"), ("attn.c_proj", "o"), ("mlp.c_fc", "ff_in"), ("mlp.c_proj", "ff_out"),
    ("word_embeddings", "embedding"), ("position_embeddings", "embedding"), ("token_type_embeddings", "embedding"),
    ("wte", "embedding"), ("wpe", "embedding"), ("embed_tokens", "embedding"), ("embed_in", "embedding"),
    ("SelfAttention.q", "q"), ("SelfAttention.k", "k"), ("SelfAttention.v", "v"), ("SelfAttention.o", "o"),
    ("DenseReluDense.wi", "ff_in"), ("DenseReluDense.wi_0", "ff_in"), ("DenseReluDense.wi_1", "ff_in"),
    ("DenseReluDense.wo", "ff_out"), ("shared", "embedding"),
    ("self_attn.q_b_proj", "q"), ("self_attn.kv_b_proj", "kv-latent"), ("self_attn.q_a_proj", "down"),
    ("self_attn.kv_a_proj_with_mqa", "down"),
]"""
RULES: list[tuple[str, str]] = ast.literal_eval(_RULES_TEXT)

def init_matrices(model, std, bias_std, rules, heads):
    """Draw every recognised matrix N(0, std[role]^2) (biases bias_std[role], else 0); returns {name: role}."""
    import torch

    done = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            for pname, p in module.named_parameters(recurse=False):  # stacked experts (E, out, in): Mixtral
                role = next((r for suffix, r in rules if f"{name}.{pname}".endswith(suffix)), None)
                if role is not None and p.dim() == 3:
                    p.normal_(0.0, std[role])
                    done[f"{name}.{pname}"] = role
            role = next((r for suffix, r in rules if name.endswith(suffix)), None)
            w = getattr(module, "weight", None)
            if role is None or not isinstance(w, torch.Tensor) or w.dim() != 2:
                continue
            if role == "qkv":  # GPT-2 Conv1D (d, 3d), nanoGPT or Phi-3 Linear (d + 2 kv, d): [q | k | v] blocks
                dim = 1 if type(module).__name__ == "Conv1D" else 0
                d = w.shape[1 - dim]
                parts = w.split([d, (w.shape[dim] - d) // 2, (w.shape[dim] - d) // 2], dim=dim)
                for part, r in zip(parts, "qkv"):
                    part.normal_(0.0, std[r])
            elif role == "kv-latent":  # DeepSeek's kv_b_proj: rows per head [key (qk_nope_head_dim) | value]
                nope = dict(model.named_modules())[name.rpartition(".")[0]].qk_nope_head_dim
                view = w.view(heads, w.shape[0] // heads, w.shape[1])
                view[:, :nope].normal_(0.0, std["k"])
                view[:, nope:].normal_(0.0, std["v"])
            elif role == "qkv-neox":  # rows per K/V group: (group, [q x heads/groups, k, v], head_dim); GPT-NeoX:
                hd = w.shape[1] // heads  # a group per head; Falcon: one group (multi-query) or num_kv_heads
                groups = (w.shape[0] // hd - heads) // 2
                view = w.view(groups, heads // groups + 2, hd, w.shape[1])
                view[:, :-2].normal_(0.0, std["q"])
                view[:, -2].normal_(0.0, std["k"])
                view[:, -1].normal_(0.0, std["v"])
            else:
                w.normal_(0.0, std[role])
            b = getattr(module, "bias", None)
            if isinstance(b, torch.Tensor):
                b.normal_(0.0, bias_std[role]) if bias_std.get(role) else b.zero_()
            done[name] = role
    return done


# The snippet: the numbers, the rules and init_matrices' own source (one definition for `apply` and the paste).
TEMPLATE = '''\
STD = {std}
BIAS_STD = {bias_std}
# (module-name suffix, role); the first match wins, so the more specific suffixes come first.
RULES = ''' + _RULES_TEXT + '''


{source}

def init_weights(model, heads={heads}):
    """Initialise every recognised matrix with the recommended std; returns {{module name: role}}."""
    return init_matrices(model, STD, BIAS_STD, RULES, heads)
'''


def numbers(spec) -> tuple[dict[str, float], dict[str, float], int]:
    """The snippet's numbers: per-matrix std, per-matrix bias std (6 significant digits) and the head count."""
    std = {m: float(f"{i.std:.6g}") for m, i in spec.init.items()}
    bias = {m: float(f"{i.bias_std:.6g}") for m, i in spec.init.items()}
    if spec.latent:  # latent attention's down projections (q_a_proj, kv_a_proj_with_mqa)
        std["down"], bias["down"] = float(f"{spec.latent.down_std:.6g}"), 0.0
    return std, bias, spec.heads


def render(spec) -> str:
    """The snippet with the spec's per-matrix stds filled in."""
    std, bias, heads = numbers(spec)
    import inspect

    return TEMPLATE.format(std=std, bias_std=bias, heads=heads, source=inspect.getsource(init_matrices))


def residual_instructions(spec) -> list[str]:
    """How to apply the residual scales (and, under a QK-norm, the softmax scale), which live in the forward
    pass, not in the weights."""
    a, m = spec.res_attention, spec.res_mlp
    qk = [f"QK-norm: attention logits = {spec.softmax_scale:.6g} * sum over the d_model / heads = {spec.d_head} "
          "coordinates of q_i k_i (softmax_scale: the Q/K stds do not set beta under a QK-norm)"
          ] if spec.qk_norm != "none" else [
          f"latent attention: attention logits = {spec.softmax_scale:.6g} * q . k (softmax_scale: its latents' norms "
          "leave the up projections' stds and the scale to set beta)"] if spec.latent else []
    depth = spec.layers ** -spec.depth_alpha  # depth-muP / CompleteP branch multiplier
    lns = ["LayerNorm-Scaling: the norm before each branch of block l (from 1) times 1 / sqrt(l)"
           ] if spec.layernorm_scaling else []
    if (a.skip, a.block * depth, m.skip, m.block * depth) == (1.0, 1.0, 1.0, 1.0):
        return ["residual scales are the standard ones (skip 1, block 1): nothing to change in forward()", *qk,
                *lns]
    out = [f"attention sub-block: x = {a.skip:.6g} * x + {a.block * depth:.6g} * attn(...)",
           f"MLP sub-block:       x = {m.skip:.6g} * x + {m.block * depth:.6g} * mlp(...)", *qk, *lns]
    if spec.depth_alpha:
        out.append(f"block multipliers include layers^-depth_alpha = {spec.layers}^-{spec.depth_alpha:g} = {depth:.6g}")
    if spec.norm == "post":
        out.append("post-LN: the LayerNorm after each sum removes a common factor, so skip s and block b act "
                   "like skip 1 and block b/s: dividing the output-projection (o, ff_out) stds by s gives the "
                   "same forward pass at init without touching forward()")
    return out
