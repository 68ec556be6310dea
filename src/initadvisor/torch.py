"""Measure a real PyTorch transformer at initialisation (optional extra: needs torch, and transformers for
HuggingFace models). Import it on demand: ``import initadvisor.torch``; the rest of initadvisor never imports it.

`measure(model, seq_len)` re-initialises the model under ``seeds`` torch seeds, feeds random token ids and
measures, per residual-stream index, the same quantities as the analytic engine predicts (`run_spec`) and as
`initadvisor.simulate` measures on its numpy network:

* stream index 0 = the residual stream entering block 1 (a forward pre-hook on the first block: after the
  embeddings, their norm and dropout); index i = the output of block i (a forward hook on block i). For pre-LN
  models the last index is BEFORE the final norm (``ln_f`` / ``norm``), unlike ``output_hidden_states[-1]``.
* q = mean over tokens and coordinates of h^2; p = mean over ordered token pairs t != s of h_t . h_s / d;
  rho = mean p / mean q (a ratio of averages over sequences); the same over the first, middle and last third
  of positions (``rho_thirds``; the last third is the late-token regime of causal models).
* gradients of loss = sum(h_L * G), G ~ N(0, 1) i.i.d. of h_L's shape, with respect to every stream index
  (autograd): grad_q = mean g^2, grad_p = mean over pairs t != s of g_t . g_s / d; raw and normalised by
  grad_q at index L (``grad_q_norm``, ``grad_p_norm``, ratios of averages; ``grad_q_norm_thirds`` per third).
* ``ipr`` per attention layer (when the model returns attentions: eager attention, output_attentions=True):
  the mean over query rows (and heads) of sum_s A_ts^2 BEFORE attention dropout. HuggingFace returns the
  probabilities after dropout; since E[(m / (1 - r))^2] = 1 / (1 - r) for a keep-mask m of rate r, the measured
  value is multiplied by (1 - r), r read from the config. Causal rows have t + 1 keys; ``ipr_thirds`` splits the
  rows by query position.

Token ids are drawn i.i.d. from Zipf's law p_i ~ 1/i over the vocabulary by default (``tokens="zipf"``, as
`initadvisor.simulate` does and as the engine's ``input_correlation: auto`` assumes), or uniformly
(``tokens="uniform"``); the input embedding's padding row (zeroed by transformers) is never drawn. BERT-family
models (a ``token_type_embeddings`` table) get token_type_ids all zero; GPT-2 gets none (its token_type_ids would
re-use the word embeddings). ``use_cache=False`` where the model takes it.

Every quantity X comes with its standard error X_se over the n = seeds x batch sequences.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from initadvisor.core.causal import thirds
from initadvisor.core.ops import zipf_ids
from initadvisor.families import ATTN_DROPOUT_KEYS, BLOCK_PATHS
from initadvisor.progress import tell
from initadvisor.simulate import mean_se, ratio_se

__all__ = ["measure", "find_blocks", "reinit", "sample_tokens", "measure_spec", "measure_hf_config", "apply",
           "SpecModel", "OpModule", "audit", "build_hf"]


def find_blocks(model: nn.Module) -> nn.ModuleList:
    """The ModuleList of transformer blocks of a HuggingFace (BERT-family, GPT-2, GPT-NeoX, Llama-family) or
    nanoGPT-style model."""
    for path in BLOCK_PATHS:
        obj: Any = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList) and len(obj) > 0:
            return obj
    raise ValueError(f"cannot find the transformer blocks of {type(model).__name__} "
                     f"(looked for {', '.join(BLOCK_PATHS)})")


def reinit(model: nn.Module | Callable[[], nn.Module], seed: int, eager: bool = True) -> nn.Module:
    """A freshly initialised copy of `model` under torch.manual_seed(seed).

    `model` may be a factory (called under the seed), a HuggingFace PreTrainedModel (re-created from its config
    with `_from_config`, eager attention so that attentions can be returned), or any module with a ``config``
    attribute whose class takes it (nanoGPT: ``GPT(config)``)."""
    torch.manual_seed(seed)
    if not isinstance(model, nn.Module):
        return model()
    cls = type(model)
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"cannot re-initialise {cls.__name__}: pass a factory (a callable returning a fresh model)")
    if hasattr(cls, "_from_config"):
        kw = {"attn_implementation": "eager"} if eager else {}
        return cls._from_config(config, **kw)
    return cls(config)


def sample_tokens(vocab: int, batch: int, seq_len: int, rng: np.random.Generator, tokens: str = "zipf",
                  skip: int | None = None) -> np.ndarray:
    """Token ids (batch, seq_len): i.i.d. Zipf p_i ~ 1/i over the vocabulary (rank i -> id i - 1), or uniform.

    `skip`: an id never drawn (the padding row, which transformers zeroes): ranks run over vocab - 1 ids and
    step over it."""
    n = vocab - 1 if skip is not None and 0 <= skip < vocab else vocab
    if tokens == "uniform":
        ids = rng.integers(0, n, size=(batch, seq_len))
    elif tokens == "zipf":
        ids = zipf_ids(n, (batch, seq_len), rng)
    else:
        raise ValueError(f"tokens must be 'zipf' or 'uniform', got {tokens!r}")
    if n < vocab:
        ids = ids + (ids >= skip)
    return ids


def _padding_idx(model: nn.Module) -> int | None:
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    pad = getattr(emb, "padding_idx", None)
    return pad if isinstance(pad, int) else None


def _vocab(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    for key in ("vocab_size",):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _attn_dropout(model: nn.Module) -> float:
    cfg = getattr(model, "config", None)
    for key in ATTN_DROPOUT_KEYS:
        v = getattr(cfg, key, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return 0.0


def _pair_moments(x: torch.Tensor, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence (x: (B, T, d)): q = mean of x^2, p = mean over ordered pairs t != s of x_t . x_s / d."""
    x = x[:, lo:hi].detach().double()
    B, T, d = x.shape
    sq = (x * x).sum((1, 2))
    tot = x.sum(1)
    q = sq / (T * d)
    p = ((tot * tot).sum(-1) - sq) / (d * T * (T - 1)) if T > 1 else torch.full((B,), float("nan"))
    return q.cpu().numpy(), p.cpu().numpy()


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    for name in ("hidden_states", "last_hidden_state"):
        h = getattr(out, name, None)
        if isinstance(h, torch.Tensor):
            return h
    raise TypeError(f"cannot find the hidden states in a block output of type {type(out).__name__}")


def _accepts(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _has_token_types(model: nn.Module) -> bool:
    return any(name.endswith("token_type_embeddings") for name, _ in model.named_modules())


def _run_one(model: nn.Module, ids: torch.Tensor, gen: torch.Generator, attentions: bool) -> dict[str, np.ndarray]:
    """One forward/backward pass; per-sequence raw moments."""
    blocks = find_blocks(model)
    L = len(blocks)
    hs: list[torch.Tensor | None] = [None] * (L + 1)

    def pre_hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        h = args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))
        hs[0] = h

    def make_hook(i: int) -> Callable:
        def hook(_m: nn.Module, _args: Any, out: Any) -> None:
            hs[i + 1] = _first_tensor(out)
        return hook

    handles = [blocks[0].register_forward_pre_hook(pre_hook, with_kwargs=True)]
    handles += [b.register_forward_hook(make_hook(i)) for i, b in enumerate(blocks)]
    kwargs: dict[str, Any] = {}
    if _has_token_types(model):  # BERT family: one segment row for all tokens (GPT-2's would reuse wte)
        kwargs["token_type_ids"] = torch.zeros_like(ids)
    if _accepts(model, "use_cache"):
        kwargs["use_cache"] = False
    if attentions:
        kwargs["output_attentions"] = True
    try:
        with torch.enable_grad():
            out = model(ids, **kwargs)
    finally:
        for h in handles:
            h.remove()
    if any(h is None for h in hs):
        raise RuntimeError("a block's input or output was not captured")
    T = ids.shape[1]
    spans = thirds(T)
    res: dict[str, list] = {k: [] for k in ("q", "p", "q3", "p3", "gq", "gp", "gq3")}
    for h in hs:
        q, p = _pair_moments(h)
        res["q"].append(q)
        res["p"].append(p)
        m3 = [_pair_moments(h, lo, hi) for lo, hi in spans]
        res["q3"].append(np.stack([m[0] for m in m3], axis=1))
        res["p3"].append(np.stack([m[1] for m in m3], axis=1))
    hL = hs[-1]
    G = torch.randn(hL.shape, generator=gen, dtype=torch.float32).to(device=hL.device, dtype=hL.dtype)
    loss = (hL * G).sum()
    grads = torch.autograd.grad(loss, hs, allow_unused=True)
    for i, g in enumerate(grads):
        if g is None:  # unreachable only if a stream index does not feed h_L
            raise RuntimeError(f"stream index {i} does not reach the last block's output")
        gq, gp = _pair_moments(g)
        res["gq"].append(gq)
        res["gp"].append(gp)
        res["gq3"].append(np.stack([_pair_moments(g, lo, hi)[0] for lo, hi in spans], axis=1))
    out_np = {k: np.stack(v, axis=1) for k, v in res.items()}  # (B, L+1[, 3])
    atts = getattr(out, "attentions", None) if attentions else None
    if atts is not None and len(atts) == L and all(a is not None for a in atts):
        ipr, ipr3 = [], []
        for a in atts:  # (B, heads, T, T) after attention dropout
            s = (a.detach().double() ** 2).sum(-1).mean(1)  # (B, T): per query row, mean over heads
            ipr.append(s.mean(1).cpu().numpy())
            ipr3.append(np.stack([s[:, lo:hi].mean(1).cpu().numpy() for lo, hi in spans], axis=1))
        out_np["ipr"] = np.stack(ipr, axis=1)
        out_np["ipr3"] = np.stack(ipr3, axis=1)
    return out_np


def measure(
    model: nn.Module | Callable[[], nn.Module],
    seq_len: int,
    batch: int = 2,
    seeds: int = 4,
    vocab: int | None = None,
    train: bool = True,
    device: str = "cpu",
    input_ids: torch.Tensor | np.ndarray | None = None,
    tokens: str = "zipf",
    rng_seed: int = 0,
    attentions: bool = True,
    dtype: torch.dtype = torch.float32,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Measure per-stream-index second moments of a randomly initialised model (see the module docstring).

    `model`: a HuggingFace model or nanoGPT-style module (re-created for each seed from its config, see `reinit`),
    or a factory returning a fresh model. `seeds` fresh initialisations (torch seeds rng_seed*1000 + s) of `batch`
    sequences each; `train`: training mode (dropout active). `input_ids` (batch, seq_len) replaces the random
    tokens. `progress(done, total)` is told each seed done (`initadvisor.progress`). Returns a dict of numpy arrays:
    q, p, rho, q_thirds, rho_thirds (L+1, 3), grad_q, grad_p, grad_q_norm, grad_p_norm, grad_rho (length L+1),
    grad_q_norm_thirds (L+1, 3; each third's grad_q over its own value at index L), ipr, ipr_thirds (length L, when
    attentions are returned), each X with X_se (over the seeds x batch sequences taken as independent), plus n,
    seeds, batch, layers, tokens, attn_dropout, and per_seed: one dict of per-seed means (q, p, grad_q, grad_p[,
    ipr]) per seed, for standard errors over seeds (`initadvisor.verification.pool_seeds`)."""
    if seeds < 1 or batch < 1:
        raise ValueError("seeds and batch must be >= 1")
    if seq_len < 2:
        raise ValueError("seq_len must be >= 2")
    runs = []
    ipr_factor = 1.0
    for s in range(seeds):
        m = reinit(model, rng_seed * 1000 + s, eager=attentions)
        m = m.to(device=device, dtype=dtype)
        m.train(train)
        v = vocab or _vocab(m)
        if input_ids is None and v is None:
            raise ValueError("pass vocab= (the model's config has no vocab_size)")
        rng = np.random.default_rng([rng_seed, s])
        if input_ids is None:
            ids = torch.as_tensor(sample_tokens(v, batch, seq_len, rng, tokens, _padding_idx(m)), dtype=torch.long)
        else:
            ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long)
            if ids.ndim == 1:
                ids = ids[None]
        ids = ids.to(device)
        want_att = attentions and hasattr(m, "config") and getattr(m.config, "_attn_implementation", None) == "eager"
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        runs.append(_run_one(m, ids, gen, want_att))
        ipr_factor = 1.0 - _attn_dropout(m) if train else 1.0
        del m
        tell(progress, s + 1, seeds)
    cat = {k: np.concatenate([r[k] for r in runs], axis=0) for k in runs[0] if all(k in r for r in runs)}
    L = cat["q"].shape[1] - 1
    out: dict[str, Any] = {}

    def put(name: str, pair: tuple[np.ndarray, np.ndarray]) -> None:
        out[name], out[name + "_se"] = pair

    put("q", mean_se(cat["q"]))
    put("p", mean_se(cat["p"]))
    put("rho", ratio_se(cat["p"], cat["q"]))
    put("q_thirds", mean_se(cat["q3"]))
    put("rho_thirds", ratio_se(cat["p3"], cat["q3"]))
    put("grad_q", mean_se(cat["gq"]))
    put("grad_p", mean_se(cat["gp"]))
    ref = np.repeat(cat["gq"][:, L:L + 1], L + 1, axis=1)
    put("grad_q_norm", ratio_se(cat["gq"], ref))
    put("grad_p_norm", ratio_se(cat["gp"], ref))
    put("grad_rho", ratio_se(cat["gp"], cat["gq"]))
    ref3 = np.repeat(cat["gq3"][:, L:L + 1], L + 1, axis=1)
    put("grad_q_norm_thirds", ratio_se(cat["gq3"], ref3))
    if "ipr" in cat:
        m_, se_ = mean_se(cat["ipr"] * ipr_factor)
        out["ipr"], out["ipr_se"] = m_, se_
        m_, se_ = mean_se(cat["ipr3"] * ipr_factor)
        out["ipr_thirds"], out["ipr_thirds_se"] = m_, se_
    keys = {"q": "q", "p": "p", "grad_q": "gq", "grad_p": "gp", "ipr": "ipr"}
    out["per_seed"] = [{k: r[v].mean(0) * (ipr_factor if k == "ipr" else 1.0) for k, v in keys.items() if v in r}
                       for r in runs]
    out.update(n=seeds * batch, seeds=seeds, batch=batch, layers=L, seq_len=seq_len,
               tokens="given" if input_ids is not None else tokens, attn_dropout=1.0 - ipr_factor)
    return out


# ---------------------------------------------------------------------------------------------
# The network of a Spec in PyTorch (the definition `initadvisor.simulate` implements in numpy), `verify`'s
# torch backend, and `apply`: initialise a real model with a recommendation.


class OpModule(nn.Module):
    """One operation of core/ops.py as a module: the submodules of its `torch_build`, its `torch_forward`."""

    def __init__(self, op, d: int):
        super().__init__()
        self.op = op
        for name, mod in op.torch_build(lambda child, width=d: OpModule(child, width), d).items():
            self.add_module(name, mod)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op.torch_forward(self, x)


class SpecModel(nn.Module):
    """The random network of a Spec (the one `initadvisor.simulate` runs in numpy): the embeddings, then the
    blocks (`measure` hooks `blocks`), each a sequence of operations."""

    def __init__(self, spec):
        super().__init__()
        from initadvisor.stack import from_spec

        net = from_spec(spec)
        self.embed = OpModule(net.embeddings, spec.d_model)
        self.blocks = nn.ModuleList(nn.Sequential(*(OpModule(op, spec.d_model) for op in ops)) for ops in net.blocks)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return x


def measure_spec(spec, seeds: int = 3, batch: int = 2, device: str = "cpu", progress=None) -> dict[str, Any]:
    """`verify --backend torch` on a YAML spec: the spec's network in PyTorch."""
    return measure(lambda: SpecModel(spec).to(device), seq_len=spec.seq_len, batch=batch, seeds=seeds,
                   vocab=spec.vocab, device=device, attentions=False, progress=progress)


def measure_hf_config(source, spec, seeds: int = 3, batch: int = 2, device: str = "cpu",
                      progress=None) -> dict[str, Any]:
    """`verify --backend torch` on a HuggingFace config (a config.json path or folder, a dict or a
    PretrainedConfig): the real model, randomly initialised."""
    from collections.abc import Mapping
    from pathlib import Path

    from transformers import AutoModel, PretrainedConfig

    from initadvisor.hf import _load_json, transformers_config
    from initadvisor.spec import SpecError, one_line

    def build() -> nn.Module:
        # eager attention returns the probabilities (the IPR); Falcon's eager path adds ALiBi twice: sdpa there
        impl = "sdpa" if config.model_type == "falcon" and getattr(config, "alibi", False) else "eager"
        return build_hf(config, AutoModel, attn_implementation=impl).to(device)

    where, raw = "<config>", None
    try:  # transformers validates the config its own way: what it refuses is the input's fault, in one line
        if isinstance(source, PretrainedConfig):
            config = source
        else:
            if not isinstance(source, Mapping):
                where = str(Path(source) / "config.json" if Path(source).is_dir() else Path(source))
            raw = dict(source) if isinstance(source, Mapping) else _load_json(where)[0]
            config = transformers_config(raw)
        for lean in (None, "null", "drop"):  # a field the import ignores may break the model (a pad_token_id past
            try:  # the vocabulary): built again without them (hf.transformers_config)
                config = transformers_config(raw, lean) if lean else config
                with torch.no_grad():
                    build()(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device))
                break
            except Exception:
                if raw is None or lean == "drop":
                    raise
    except Exception as e:  # noqa: BLE001
        if isinstance(e, MemoryError) or "can't allocate memory" in str(e):  # (a table of 1e8 token types)
            raise SpecError("measuring this network needs more memory than is available: transformers could not "
                            "allocate its weights", where) from None
        raise SpecError(one_line(f"transformers cannot build this model: {type(e).__name__}: {e}")[:300],
                        where) from None
    return measure(build, seq_len=spec.seq_len, batch=batch, seeds=seeds, device=device, progress=progress)


def build_hf(config, auto, **kw) -> nn.Module:
    """A family's modelled stack from its config: the family's own class where the Auto classes build another (T5:
    T5EncoderModel, `families.Family.model_class`), else `auto`'s; `kw` to from_config."""
    import transformers

    from initadvisor.families import FAMILIES

    name = getattr(FAMILIES.get(config.model_type), "model_class", None)
    return getattr(transformers, name)._from_config(config, **kw) if name else auto.from_config(config, **kw)


def apply(model: nn.Module, recommendation: dict) -> list[dict[str, Any]]:
    """Initialise `model` (HuggingFace BERT/GPT-2/GPT-NeoX/Llama family, or nanoGPT) with a `recommend` result.

    Reads only numbers: the per-matrix stds and bias stds and the head count of
    recommendation['patched_spec'] (validated like a spec file), and draws the weights exactly as the
    report's `init_weights` snippet would (same module-name rules, same order of random draws). The snippet
    text itself is never executed, so a JSON file cannot run code. Returns, per initialised module, its role
    and the weight std before and after. Residual scales live in forward() and are not changed: see
    recommendation['residual_instructions']."""
    from initadvisor.init_code import RULES, init_matrices, numbers
    from initadvisor.spec import build_spec

    patched = recommendation.get("patched_spec") if isinstance(recommendation, dict) else None
    if not isinstance(patched, dict):
        raise ValueError("not a `recommend` result: no 'patched_spec' mapping")
    std, bias_std, heads = numbers(build_spec(patched, fname="patched_spec"))
    weights = {n: m.weight for n, m in model.named_modules()
               if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2}
    weights |= {n: p for n, p in model.named_parameters() if p.dim() == 3}  # stacked experts, by parameter
    before = {n: float(w.detach().float().std()) for n, w in weights.items()}
    done = init_matrices(model, std, bias_std, RULES, heads)  # the snippet's own function
    return [{"module": n, "role": role, "std_before": before.get(n),
             "std_after": float(weights[n].detach().float().std())} for n, role in done.items()]


def audit(model: nn.Module, config=None, truncation: float | None = None,
          progress: Callable[[int, int], None] | None = None):
    """Audit a live model's initialisation against the intended one: `initadvisor.audit.audit`."""
    from initadvisor.audit import audit as run

    return run(model, config, truncation, progress)
