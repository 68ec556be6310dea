"""Audit a live PyTorch model's initialisation: the weights as they are against the init that is intended.

`audit(model, config=None, truncation=None)` reads every parameter of the model and gives each a role and a
block: q, k, v (fused q/k/v matrices split as `init_code.init_matrices` splits them), o, gate and up (the
SwiGLU gate and value matrices apart), ff_in, ff_out, embedding / position / segment, head (an untied output
head), norm (the gain a norm applies: its weight, or 1 + weight where the module computes (1 + w), found by
calling the norm), other (any other Linear or Embedding), and their biases. Names follow `init_code.RULES`:
HuggingFace BERT/RoBERTa/ELECTRA, GPT-2, GPT-NeoX, Llama/Mistral/Qwen2, and nanoGPT.

The intended init comes from `config` (anything `initadvisor.api.load` reads: an initadvisor spec, a
HuggingFace config.json path, dict or PretrainedConfig), else from the model's own HuggingFace config (the
family's transformers init: `initadvisor.families`), else, for a nanoGPT-style model (transformer.wte,
transformer.h), from nanoGPT's init: N(0, 0.02) for every Linear and Embedding, both c_proj at
0.02 / sqrt(2 n_layer), zero biases, unit norm gains, head tied to wte. A spec gives the per-matrix stds and
bias stds, the head's tying (model.tie_embeddings, default true) and init; a HuggingFace config adds N(0,
initializer_range) for every other Linear/Embedding with zero biases. Without any of these the intent is
unknown and only the checks that need none run (PyTorch default Linear, zero or constant tensors, the probe).

Findings (rules IA601-IA606, `scope="audit"` in `initadvisor.rules`), grouped over blocks:

* IA601 a std off the intended one by more than max(0.01, 6 / sqrt(2 n)) in |ln factor| (a std from n Gaussian
  entries has relative standard error 1 / sqrt(2 n)), with the factor named where it is a common one (1/sqrt(2L),
  1/sqrt(L), 1/(2L), 1/L, 1/sqrt(2), 1/2, 1/sqrt(3), extra or missing); a mean beyond 6 standard errors and
  0.1 intended std; a nonzero bias where zero is intended; a norm gain other than 1.
* IA602 an nn.Linear still uniform within +-1/sqrt(fan_in) at std 1/sqrt(3 fan_in) (at least 256 entries), an
  nn.Embedding at std 1 where another std is intended.
* IA603 a weight matrix or embedding whose entries are all equal (zero or constant) or not all finite; a zero
  norm gain.
* IA604 a trainable parameter whose gradient is None or exactly zero after one forward/backward on random tokens
  (eval mode, loss = sum of <output, G> over every tensor output, G ~ N(0, 1), private generators: the model,
  its modes, its .grad and torch's global random state are left as they were).
* IA605 with `truncation=t` (the init is meant to be N(0, s^2) truncated at +-t s): a weight reaching beyond
  t s, s = std / sqrt(1 - 2 t phi(t) / (2 Phi(t) - 1)), with a 6-standard-error margin; tested only where an
  untruncated normal would exceed the bound with probability > 0.999. The weights alone cannot say that a
  truncation was meant, so without `truncation` this check does not run.
* IA606 the head tied to the token embedding against tie_word_embeddings (nanoGPT: tied), or the reverse.

The spec of the model as initialised (the intended spec with each matrix's std replaced by the RMS of its
measured tensors over blocks, biases likewise) goes through `initadvisor.diagnose.check`; the report keeps that
check/1 report. `audit_config` builds a HuggingFace model from a config.json on CPU and audits it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from initadvisor import __version__
from initadvisor.errors import UsageError, one_line
from initadvisor.init_code import RULES as SUFFIX_ROLES
from initadvisor.progress import Progress, checked, tell
from initadvisor.rules import RULES, Finding, finding
from initadvisor.spec import MATRICES, Spec, SpecError, build_spec
from initadvisor.torch import _accepts, _has_token_types, find_blocks

SCHEMA = "initadvisor.audit/1"
Z = 6.0  # standard errors a measured std or mean may be off before it is reported
SEVERITY = {"info": 0, "warning": 1, "error": 2}

# the module-name rules, with the SwiGLU gate and value (up) matrices and the embedding tables told apart
ROLES = [("mlp.gate_proj", "gate"), ("mlp.up_proj", "up"), ("position_embeddings", "position"), ("wpe", "position"),
         ("token_type_embeddings", "segment"), *SUFFIX_ROLES]
MATRIX_OF = {"gate": "ff_in", "up": "ff_in", "position": "embedding", "segment": "embedding"}


class AuditError(Exception):
    """`AuditReport.raise_for_findings`: the model's init is not what is intended (`report` holds the audit)."""

    def __init__(self, report: AuditReport, lines: list[str]):
        self.report = report
        super().__init__(f"{len(lines)} init audit finding(s) in {report.model}: " + "; ".join(lines))


@dataclass(frozen=True)
class TensorStat:
    """One measured tensor (a part of a fused q/k/v matrix is one): a row of the per-role, per-block table."""

    name: str  # parameter name; "[q]" etc. marks a part of a fused matrix
    role: str
    kind: str  # weight | bias | gain (a norm's) | param (anything else)
    block: int | None  # 1-based; None outside the blocks
    n: int
    std: float
    mean: float
    max_abs: float
    intended_std: float | None  # None: unknown
    intended_mean: float | None  # 1 for norm gains, 0 for the rest
    factor: float | None  # std / intended_std
    codes: tuple[str, ...] = ()  # the findings that name it
    convention: str | None = None  # gains: "w" or "1 + w"


@dataclass
class AuditReport:
    """`audit`'s result: the per-tensor table, the findings, and `check` on the spec of the weights as they are."""

    model: str
    family: str | None
    blocks: int
    intent: str  # where the intended init comes from
    tied_head: bool | None
    tensors: list[TensorStat]
    findings: list[Finding]
    check: dict | None  # initadvisor.check/1 of the measured spec; None when the model's structure is unknown
    notes: list[str] = field(default_factory=list)

    def failures(self, severity: str = "warning", ignore: tuple[str, ...] | str = ()) -> list[str]:
        """One line per audit finding at `severity` or above, and per error of the check report; codes starting
        with a prefix in `ignore` are left out. The check's warnings (IA303 on a standard BERT) are advice."""
        if severity not in SEVERITY:
            raise ValueError(f"severity must be one of {', '.join(SEVERITY)}, got {severity!r}")
        skip = tuple(c.upper() for c in ((ignore,) if isinstance(ignore, str) else ignore))
        found = [(f.code, f.severity, f.message) for f in self.findings if SEVERITY[f.severity] >= SEVERITY[severity]]
        found += [(f["code"], f["severity"], f["message"]) for f in (self.check or {}).get("findings", [])
                  if f["severity"] == "error"]
        return [f"{code} {sev}: {msg}" for code, sev, msg in found if not code.upper().startswith(skip)]

    def raise_for_findings(self, severity: str = "warning", ignore: tuple[str, ...] | str = ()) -> AuditReport:
        """Raise AuditError when `failures(severity, ignore)` is not empty; return the report otherwise."""
        lines = self.failures(severity, ignore)
        if lines:
            raise AuditError(self, lines)
        return self

    @property
    def verdict(self) -> str:
        """fail on an error-level audit finding or check error, else pass (the CLI's exit code: 1 or 0)."""
        return "fail" if self.failures("error") else "pass"

    def to_json(self) -> str:
        """What `initadvisor audit --format json` prints (without its final newline)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def to_dict(self) -> dict:
        """The JSON-safe `initadvisor.audit/1` document (non-finite numbers as null)."""
        return _finite({
            "schema": SCHEMA, "version": __version__, "model": self.model, "family": self.family,
            "blocks": self.blocks, "intent": self.intent, "tied_head": self.tied_head,
            "verdict": self.verdict,
            "findings": [asdict(f) for f in self.findings], "tensors": [asdict(t) for t in self.tensors],
            "check": self.check, "notes": list(self.notes),
        })


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


# ---------------------------------------------------------------------------------------------------
# reading the model


@dataclass
class _Part:
    """A tensor to measure, with its module (for the default-init and norm tests)."""

    name: str
    role: str
    kind: str
    block: int | None
    module: nn.Module
    tensor: torch.Tensor
    convention: str | None = None


def _blocks(model: nn.Module) -> tuple[str | None, int]:
    """The blocks' ModuleList name and length (None, 0 when there is none)."""
    try:
        blocks = find_blocks(model)
    except ValueError:
        return None, 0
    return next(n for n, m in model.named_modules() if m is blocks), len(blocks)


def _block_of(name: str, prefix: str | None) -> int | None:
    if prefix is None or not name.startswith(prefix + "."):
        return None
    index = name[len(prefix) + 1:].split(".", 1)[0]
    return int(index) + 1 if index.isdigit() else None


def _head(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if head is not None else getattr(model, "lm_head", None)


def _token_embedding(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    return emb if emb is not None else next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)


def _parts(model: nn.Module, prefix: str | None, heads: int | None) -> list[_Part]:
    """Every parameter once (tied ones under their first name), fused q/k/v matrices split into q, k and v."""
    head, seen, out = _head(model), set(), []
    for mname, module in model.named_modules():
        if module is head:
            role = "head"
        elif "norm" in type(module).__name__.lower() and getattr(getattr(module, "weight", None), "ndim", 1) == 1:
            role = "norm"
        else:
            role = next((r for suffix, r in ROLES if mname.endswith(suffix)), "other")
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen or p.numel() == 0:
                continue
            seen.add(id(p))
            name, block, w = f"{mname}.{pname}" if mname else pname, _block_of(mname, prefix), p.detach()
            kind = "bias" if pname == "bias" else "weight" if p.dim() >= 2 else "param"
            if p.dim() == 3:  # a mixture of experts' stacked matrices (experts, out, in), named by parameter
                role = next((r for suffix, r in ROLES if name.endswith(suffix)), role)
            if role == "norm" and pname == "weight" and p.dim() == 1:
                out.append(_Part(name, "norm", "gain", block, module, *_gain(module, w)))
            elif kind == "weight" and role == "kv-latent" and hasattr(_parent(model, mname), "qk_nope_head_dim"):
                nope, view = _parent(model, mname).qk_nope_head_dim, w.view(heads or 1, -1, w.shape[1])
                out += [_Part(f"{name}[k]", "k", kind, block, module, view[:, :nope]),
                        _Part(f"{name}[v]", "v", kind, block, module, view[:, nope:])]
            elif kind == "weight" and role in ("qkv", "qkv-neox"):
                out += [_Part(f"{name}[{r}]", r, kind, block, module, x) for r, x in _split(module, w, role, heads)]
            else:
                out.append(_Part(name, "other" if kind == "param" else role, kind, block, module, w))
    return out


def _parent(model: nn.Module, mname: str) -> nn.Module | None:
    return dict(model.named_modules()).get(mname.rpartition(".")[0])


def _split(module: nn.Module, w: torch.Tensor, role: str, heads: int | None) -> list[tuple[str, torch.Tensor]]:
    if role == "qkv":  # GPT-2 Conv1D (d, 3d), nanoGPT or Phi-3 Linear (d + 2 kv, d): [q | k | v]
        dim = 1 if type(module).__name__ == "Conv1D" else 0
        d = w.shape[1 - dim]
        return list(zip("qkv", w.split([d, (w.shape[dim] - d) // 2, (w.shape[dim] - d) // 2], dim=dim)))
    if heads is None:  # rows per K/V group (GPT-NeoX: per head): without the head count, one qkv tensor
        return [("qkv", w)]
    hd = w.shape[1] // heads
    groups = (w.shape[0] // hd - heads) // 2  # init_code.init_matrices' layout: Falcon's groups, NeoX's heads
    view = w.view(groups, heads // groups + 2, hd, w.shape[1])
    return [("q", view[:, :-2]), ("k", view[:, -2]), ("v", view[:, -1])]


def _gain(module: nn.Module, w: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The gain a norm applies and its convention, "w" or "1 + w", told apart by calling the norm on +-x:
    (norm(x) - norm(-x)) / 2 = normalised(x) * gain, whose RMS is the gain's (normalised(x) has RMS 1).
    PyTorch's own norms apply w and are not called (a batch norm would update its running statistics)."""
    if type(module).__module__.startswith("torch."):
        return w, "w"
    x = torch.randn(64, w.shape[0], generator=torch.Generator().manual_seed(0)).to(w)
    try:
        with torch.no_grad():
            eff = float(((module(x) - module(-x)) / 2).float().pow(2).mean().sqrt())
    except Exception:  # noqa: BLE001  (a norm that cannot run alone on (batch, d): its weight is its gain)
        return w, "w"
    plain, shifted = float(w.float().pow(2).mean().sqrt()), float((1 + w.float()).pow(2).mean().sqrt())
    return (1 + w, "1 + w") if abs(eff - shifted) < abs(eff - plain) else (w, "w")


def _stats(t: torch.Tensor) -> tuple[int, float, float, float, float, float]:
    """n, std, mean, max |x|, max, min (in float32; the population std)."""
    x = t.float().flatten()
    std, mean = torch.std_mean(x, correction=0)
    return x.numel(), float(std), float(mean), float(x.abs().max()), float(x.max()), float(x.min())


# ---------------------------------------------------------------------------------------------------
# the intended init


@dataclass(frozen=True)
class _Intent:
    source: str
    spec: Spec | None  # per-matrix stds, bias stds, the head and its tying; the model's structure for `check`
    other: float | None  # std of any other Linear / Embedding (biases then 0); None: unknown
    moments: Spec | None = None  # the spec `check` runs where the weights map onto it only as moments (OPT-350m)


def _family(model: nn.Module) -> str | None:
    """The model's HuggingFace model_type, "nanogpt" for nanoGPT's module names, or None."""
    own = getattr(model, "config", None)
    if _is_hf_config(own):
        return own.model_type
    names = dict(model.named_modules())
    return "nanogpt" if "transformer.wte" in names and "transformer.h" in names else None


def _intent(model: nn.Module, config: Any, family: str | None, blocks: int, parts: list[_Part],
            notes: list[str]) -> _Intent:
    """The intended init (see the module docstring)."""
    from initadvisor.api import load
    from initadvisor.families import FAMILIES

    if config is None and family == "nanogpt":
        return _Intent("nanoGPT's init (0.02, c_proj 0.02 / sqrt(2 n_layer), tied head)",
                       _nanogpt_spec(model, blocks, parts, notes), 0.02)
    if config is None and family in FAMILIES:
        config = model.config
    if config is None:
        why = f"model_type {family!r} is not a supported family" if family else "not a HuggingFace or nanoGPT model"
        notes.append(f"no config given and {why}: the intended init is unknown")
        return _Intent("unknown", None, None)
    if _is_hf_config(config):
        config = config.to_dict()
    spec = load(config)
    notes += [f"config: {n}" for n in spec.notes  # what the spec cannot model, not the import's bookkeeping
              if not n.startswith(("ignored (", "not in the config"))]
    if spec.layers != blocks:
        notes.append(f"the config has {spec.layers} layers, the model {blocks} blocks: depth-scaled stds follow "
                     "the config")
    raw = _hf_raw(config)
    if raw is None:
        return _Intent(f"the spec {spec.name!r}", spec, None)
    if raw["model_type"] == "t5":  # T5's only other weight, relative_attention_bias: factor d_model^-1/2
        std = spec.d_model ** -0.5
        return _Intent(f"transformers' t5 init (initializer_factor 1, relative bias d_model^-1/2 = {std:.4g})",
                       spec, std)
    if raw["model_type"] == "opt" and raw.get("word_embed_proj_dim", spec.d_model) != spec.d_model:
        std = raw.get("init_std", 0.02)  # the tables and project_in / project_out as drawn, the head tied
        data = spec.to_dict()
        data["init"] = {k: v for k, v in data["init"].items() if k != "head"} | {"embedding": {"std": std}}
        data["model"]["tie_embeddings"] = True
        del data["sequence"]["input_correlation"]
        notes.append("word_embed_proj_dim: the weights are compared as drawn; the check report is the config's "
                     "(its moments through project_in and project_out), not the measured weights'")
        return _Intent(f"transformers' opt init (init_std {std:g})", build_spec(data, fname="<audit>"), std, spec)
    std = raw.get("initializer_range") or 0.02  # transformers: `config.initializer_range or 0.02`
    return _Intent(f"transformers' {raw['model_type']} init (initializer_range {std:g})", spec, std)


def _is_hf_config(obj: Any) -> bool:
    return callable(getattr(obj, "to_dict", None)) and isinstance(getattr(obj, "model_type", None), str)


def _hf_raw(config: Any) -> dict | None:
    """The HuggingFace config as a dict; None for an initadvisor spec."""
    from initadvisor.api import is_hf_config
    from initadvisor.hf import _load_json

    if isinstance(config, Mapping):
        return dict(config) if "model_type" in config else None
    if isinstance(config, (str, os.PathLike)) and is_hf_config(Path(config)):
        return _load_json(config)[0]
    return None


def _nanogpt_spec(model: nn.Module, blocks: int, parts: list[_Part], notes: list[str]) -> Spec | None:
    """nanoGPT's structure (pre-LN GPT, GELU MLP, learned positions) and init, read off the modules."""
    cfg, h = getattr(model, "config", None), model.transformer.h
    heads = getattr(cfg, "n_head", None) or (getattr(getattr(h[0], "attn", None), "n_head", None) if blocks else None)
    wte, wpe = model.transformer.wte, getattr(model.transformer, "wpe", None)
    ff_in = next((p.module for p in parts if p.role == "ff_in" and isinstance(p.module, nn.Linear)), None)
    if not isinstance(heads, int) or ff_in is None:
        notes.append("nanoGPT-style model without config.n_head or an mlp.c_fc Linear: no spec, no check")
        return None
    seq = getattr(cfg, "block_size", None) or (wpe.num_embeddings if wpe is not None else 1024)
    drop = float(getattr(cfg, "dropout", 0.0))
    notes.append("nanoGPT-style model: taken as pre-LN with LayerNorm, GELU, causal, dropout config.dropout")
    return build_spec({
        "name": type(model).__name__,
        "model": {"layers": blocks, "d_model": wte.embedding_dim, "heads": heads, "d_ff": ff_in.out_features,
                  "norm": "pre", "norm_type": "layernorm", "causal": True, "activation": "gelu",
                  "embedding_norm": False},
        "sequence": {"length": seq, "vocab": wte.num_embeddings,
                     "embeddings": ["token", "position"] if wpe is not None else ["token"]},
        "dropout": drop, "attention_dropout": drop,
        "init": {"std": 0.02, "o": {"std": 0.02 / math.sqrt(2 * blocks)},
                 "ff_out": {"std": 0.02 / math.sqrt(2 * blocks)}},
    }, fname="<nanoGPT>")


def _intended(p: _Part, intent: _Intent) -> float | None:
    """The intended std of a part (norm gains: 0, their intended mean being 1)."""
    if p.kind == "gain":
        return None if intent.spec is None and intent.other is None else 0.0
    if p.kind not in ("weight", "bias"):
        return None
    matrix = MATRIX_OF.get(p.role, p.role)
    if p.role == "down" and intent.spec is not None and intent.spec.latent:  # latent attention's down projections
        return intent.spec.latent.down_std if p.kind == "weight" else 0.0
    if intent.spec is not None and (matrix in intent.spec.init or matrix == "head"):
        i = intent.spec.head_init if matrix == "head" else intent.spec.init[matrix]
        return i.std if p.kind == "weight" else i.bias_std
    if intent.other is not None and (p.kind == "bias" or p.role in ("head", "other")):
        return intent.other if p.kind == "weight" else 0.0
    return None


# ---------------------------------------------------------------------------------------------------
# the probe step


def _probe(model: nn.Module, notes: list[str]) -> dict[str, str]:
    """{parameter name: "None" | "zero"} for the trainable parameters that get no gradient from one
    forward/backward on random tokens (see the module docstring)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    emb = _token_embedding(model)
    if not params or not isinstance(emb, nn.Embedding):
        notes.append("probe step skipped: no trainable parameters or no token embedding")
        return {}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, emb.num_embeddings, (2, 8), generator=gen).to(params[0][1].device)
    kwargs: dict[str, Any] = {}
    if _has_token_types(model):
        kwargs["token_type_ids"] = torch.zeros_like(ids)
    if _accepts(model, "use_cache"):
        kwargs["use_cache"] = False
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.enable_grad():
            outs = [t for t in _tensors(model(ids, **kwargs)) if t.requires_grad and t.is_floating_point()]
            if not outs:
                notes.append("probe step skipped: the model's output carries no gradient")
                return {}
            loss = sum((t.float() * torch.randn(t.shape, generator=gen).to(t.device)).sum() for t in outs)
            grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
    except Exception as e:  # noqa: BLE001  (a forward that does not take token ids: the weights are still audited)
        notes.append(one_line(f"probe step skipped: the model did not run on token ids: {type(e).__name__}: {e}")[:300])
        return {}
    finally:
        for m, mode in modes.items():
            m.training = mode
    return {n: "None" if g is None else "zero" for (n, _), g in zip(params, grads) if g is None or not g.any()}


def _tensors(out: Any):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, Mapping):  # a transformers ModelOutput is an OrderedDict of its non-None fields
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (tuple, list)):
        for v in out:
            yield from _tensors(v)


# ---------------------------------------------------------------------------------------------------
# the audit


def _tol(n: int) -> float:
    """The |ln factor| a std of n entries may show by chance: 6 standard errors (1 / sqrt(2 n)), at least 1%."""
    return max(0.01, Z / math.sqrt(2 * n))


def _factor_name(f: float, layers: int) -> str | None:
    """The common factor f is close to: an extra one (f ~ c) or a missing one (f ~ 1/c)."""
    L = max(layers, 1)
    cands = [("1/sqrt(2L)", (2 * L) ** -0.5), ("1/sqrt(L)", L ** -0.5), ("1/(2L)", 1 / (2 * L)), ("1/L", 1 / L),
             ("1/sqrt(2)", 2 ** -0.5), ("1/2", 0.5), ("1/sqrt(3)", 3 ** -0.5)]
    for sign, what in ((1, "an extra factor {} (applied twice, or where none is meant)"), (-1, "missing a factor {}")):
        names = [n for n, c in cands if c < 0.99 and abs(math.log(f) - sign * math.log(c)) < 0.05]
        if names:
            return what.format(" = ".join(names) + (f" (L = {L})" if any("L" in n for n in names) else ""))
    return None


def _truncated_std(t: float) -> float:
    """The std of N(0, 1) truncated at +-t."""
    phi, mass = math.exp(-t * t / 2) / math.sqrt(2 * math.pi), math.erf(t / math.sqrt(2))
    return math.sqrt(1 - 2 * t * phi / mass)


def _pytorch_default(module: nn.Module, n: int, std: float, max_abs: float, intended: float | None) -> str | None:
    """"linear" or "embedding" where a weight is at PyTorch's default init (and another is intended), else None."""
    if isinstance(module, nn.Linear) and n >= 256:
        bound = module.in_features ** -0.5
        if max_abs <= bound * (1 + 1e-6) and abs(math.log(std * math.sqrt(3) / bound)) < _tol(n):
            return "linear"
    if isinstance(module, nn.Embedding) and intended is not None and abs(math.log(intended)) > _tol(n):
        if abs(math.log(std)) < _tol(n):
            return "embedding"
    return None


def audit(model: nn.Module, config: Any = None, truncation: float | None = None,
          progress: Progress | None = None) -> AuditReport:
    """Audit `model`'s initialisation (see the module docstring): per-tensor std and mean against the intended
    init, findings IA601-IA606, and `check` on the spec of the weights as they are.

    `config`: the intended init, anything `initadvisor.api.load` reads (default: the model's HuggingFace config,
    or nanoGPT's init). `truncation`: the init is meant to be normal truncated at +-truncation std (IA605).
    `progress(done, total)`: told after the probe step, each tensor and the check."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"audit needs a torch.nn.Module, got {type(model).__name__}")
    if truncation is not None and (isinstance(truncation, bool) or not isinstance(truncation, (int, float))
                                   or not truncation > 0):
        raise ValueError(f"truncation must be a positive number of standard deviations, got {truncation!r}")
    progress = checked(progress)
    notes: list[str] = []
    prefix, blocks = _blocks(model)
    heads = config.heads if isinstance(config, Spec) else getattr(getattr(model, "config", None),
                                                                  "num_attention_heads", None)
    parts = _parts(model, prefix, heads if isinstance(heads, int) else None)
    family = _family(model)
    intent = _intent(model, config, family, blocks, parts, notes)
    layers = blocks or (intent.spec.layers if intent.spec else 1)
    grads = _probe(model, notes)
    total = len(parts) + 2  # the probe, each tensor, the check

    issues: dict[tuple, list[tuple[_Part, dict]]] = {}  # (code, name pattern, key) -> [(part, its numbers)]
    rows, defaults = [], set()
    for i, p in enumerate(parts):
        tell(progress, i + 1, total)
        n, std, mean, max_abs, hi, lo = _stats(p.tensor)
        intended = _intended(p, intent)
        m = {"n": n, "std": std, "mean": mean, "max_abs": max_abs, "intended": intended}
        codes: list[str] = []

        def report(code: str, key: str, **extra: Any) -> None:
            pattern = _pattern(p, prefix)
            if code in ("IA602", "IA604"):  # a module's or parameter's issue: q, k, v of a fused matrix together
                pattern = pattern.split("[")[0]
            issues.setdefault((code, pattern, key), []).append((p, {**m, **extra}))
            codes.append(code)

        if p.name.split("[")[0] in grads:
            report("IA604", grads[p.name.split("[")[0]])
        if not math.isfinite(std + mean):
            report("IA603", "non-finite")
        elif p.kind == "weight" and hi == lo:
            report("IA603", "zero" if hi == 0 else "constant", value=hi)
        elif p.kind == "gain" and max_abs == 0:
            report("IA603", "zero gain")
        elif p.kind == "weight" and (how := _pytorch_default(p.module, n, std, max_abs, intended)):
            defaults.add(id(p.module))
            report("IA602", how, fan_in=getattr(p.module, "in_features", None))
        elif not (p.kind == "bias" and id(p.module) in defaults):  # a default module's bias goes with its IA602
            if truncation is not None and p.kind == "weight":
                t, f_t = float(truncation), _truncated_std(float(truncation))
                bound = t * std / f_t * (1 + Z / math.sqrt(2 * n))  # t s, s estimated as if truncated
                if n * math.log(math.erf(bound / (std * math.sqrt(2)))) < math.log(1e-3) and max_abs > bound:
                    report("IA605", "loose", reach=max_abs / std, t=t)
                elif intended:
                    intended = m["intended"] = intended * f_t  # the truncation narrows the std by f_t
            _check_moments(p, m, intended, report, layers)
        rows.append(TensorStat(p.name, p.role, p.kind, p.block, n, std, mean, max_abs, intended,
                               None if intended is None else float(p.kind == "gain"),
                               std / intended if intended else None, tuple(dict.fromkeys(codes)), p.convention))

    findings = [_finding(code, pattern, key, group) for (code, pattern, key), group in issues.items()]
    tied = _tied(model)
    meant = None if intent.spec is None else intent.spec.tie_embeddings
    if tied is not None and meant is not None and tied != meant:
        findings.append(finding("IA606", f"the output head is {'tied to' if tied else 'separate from'} the token "
                                         f"embedding, but {intent.source} has it {'tied' if meant else 'untied'}"))
    order = list(RULES)
    findings.sort(key=lambda f: (order.index(f.code), f.layer or 0))
    spec = intent.moments or (_measured_spec(intent.spec, rows, tied, notes) if intent.spec is not None else None)
    if spec is None:
        notes.append("no spec for the model's structure: no check report")
    from initadvisor.diagnose import check

    tell(progress, total - 1, total)
    report = AuditReport(type(model).__name__, family, blocks, intent.source, tied, rows, findings,
                         check(spec) if spec is not None else None, notes)
    tell(progress, total, total)
    return report


def _check_moments(p: _Part, m: dict, intended: float | None, report, layers: int) -> None:
    """IA601: the std (with its factor), the mean, a nonzero bias, a norm gain, against the intended init."""
    if intended is None:
        return
    if p.kind == "gain":
        if abs(m["mean"] - 1) > 1e-3 or m["std"] > 1e-3:
            report("IA601", "gain")
    elif intended == 0:
        if m["max_abs"] > 0:
            report("IA601", "nonzero")
    elif abs(math.log(m["std"] / intended)) > _tol(m["n"]):
        f = m["std"] / intended
        report("IA601", _factor_name(f, layers) or f"x{f:.2g}", factor=f)
    elif abs(m["mean"]) > max(Z * m["std"] / math.sqrt(m["n"]), 0.1 * intended):
        report("IA601", "mean")


def _pattern(p: _Part, prefix: str | None) -> str:
    """The parameter name with its block index as *: the same tensor in every block."""
    return p.name if p.block is None else p.name.replace(f"{prefix}.{p.block - 1}.", f"{prefix}.*.", 1)


def _where(parts: list[_Part], pattern: str) -> str:
    """The role(s), the parameter name pattern and the blocks it covers."""
    p, role = parts[0], "/".join(dict.fromkeys(q.role for q in parts))
    if p.block is None:
        return f"{role} {pattern}"
    blocks = sorted({q.block for q in parts})
    run = len(blocks) > 2 and blocks == list(range(blocks[0], blocks[-1] + 1))
    span = f"{blocks[0]}-{blocks[-1]}" if run else ", ".join(map(str, blocks))
    return f"{role} {pattern}, block{'s' if len(blocks) > 1 else ''} {span}"


def _finding(code: str, pattern: str, key: str, group: list[tuple[_Part, dict]]) -> Finding:
    """One finding for one tensor with one issue, over the blocks."""
    parts, ms = [p for p, _ in group], [m for _, m in group]
    first = ms[0]

    def avg(k: str) -> float:
        return sum(m[k] for m in ms) / len(ms)

    if code == "IA601":
        if key == "gain":
            what = f"norm gain mean {avg('mean'):.4g}, std {avg('std'):.3g} where 1 is intended"
        elif key == "nonzero":
            what = f"nonzero bias (std {avg('std'):.3g}, mean {avg('mean'):.3g}) where zero is intended"
        elif key == "mean":
            what = f"mean {avg('mean'):.3g} where 0 is intended (std {avg('std'):.3g})"
        else:
            f = math.exp(sum(math.log(m["factor"]) for m in ms) / len(ms))
            named = "" if key.startswith("x") else f": {key}"
            what = f"std {avg('std'):.3g} where {first['intended']:.3g} is intended, factor {f:.3g}{named}"
    elif code == "IA602":
        if key == "linear":
            what = (f"uniform within +-1/sqrt(fan_in) = +-{first['fan_in'] ** -0.5:.3g} at std {avg('std'):.3g} "
                    "= 1/sqrt(3 fan_in) (nn.Linear: kaiming_uniform, a = sqrt(5))")
        else:
            what = f"std {avg('std'):.3g} (nn.Embedding: N(0, 1))"
        what = f"still at PyTorch's default init: {what}" + (
            f" where std {first['intended']:.3g} is intended" if first["intended"] else "")
    elif code == "IA603":
        what = {"zero": "all zero", "constant": f"constant {first.get('value', 0):.3g}",
                "zero gain": "norm gain all zero: the norm outputs only its bias",
                "non-finite": "entries that are not finite"}[key]
    elif code == "IA604" and key == "None":
        what = ("no gradient: not part of the forward pass (built but never called, or called under no_grad or "
                "on a detached tensor)")
    elif code == "IA604":
        what = "gradient exactly zero: something after it blocks the gradient (an all-zero tensor, IA603?)"
    else:  # IA605
        what = (f"|w| reaches {max(m['reach'] for m in ms):.3g} std where truncation at +-{first['t']:g} std is "
                "intended: the truncation bounds never bite")
    return finding(code, f"{_where(parts, pattern)}: {what}", parts[0].block)


def _tied(model: nn.Module) -> bool | None:
    head, emb = _head(model), _token_embedding(model)
    if head is None or emb is None:
        return None
    return head.weight is emb.weight


def _measured_spec(spec: Spec, rows: list[TensorStat], tied: bool | None, notes: list[str]) -> Spec:
    """The intended spec with each matrix's std (and bias std) the RMS of its measured tensors, the head tied
    as it is."""
    data = spec.to_dict()
    if tied is not None:
        data["model"]["tie_embeddings"] = tied
    tied = data["model"]["tie_embeddings"]
    init: dict[str, Any] = {"qk_beta": None}
    for matrix in (*MATRICES, *(() if tied else ("head",))):
        i = spec.head_init if matrix == "head" else spec.init[matrix]
        init[matrix] = {"std": i.std, "bias_std": i.bias_std}
        for kind, key in (("weight", "std"), ("bias", "bias_std")):
            got = [r for r in rows if r.kind == kind and MATRIX_OF.get(r.role, r.role) == matrix
                   and math.isfinite(r.std + r.mean)]
            if not got:
                continue
            rms = [math.sqrt(r.std ** 2 + r.mean ** 2) for r in got]
            init[matrix][key] = math.sqrt(sum(x * x for x in rms) / len(rms))
            if kind == "weight" and max(rms) > min(rms) * (1 + max(_tol(r.n) for r in got)):
                notes.append(f"{matrix} std differs between its tensors ({min(rms):.3g} to {max(rms):.3g}): the "
                             f"spec, one std per matrix, takes their RMS {init[matrix][key]:.3g}")
        if not init[matrix]["std"] > 0:
            notes.append(f"{matrix} is all zero: the spec takes std 1e-12")
            init[matrix]["std"] = 1e-12
    if any(r.kind == "gain" and (abs(r.mean - 1) > 1e-3 or r.std > 1e-3) for r in rows):
        notes.append("norm gains other than 1 are not modelled by the spec")
    data["init"] = init
    data["name"] = f"{spec.name} (as initialised)"
    return build_spec(data, fname="<audit>")


# ---------------------------------------------------------------------------------------------------
# the command: a config.json, built on CPU


def audit_config(path: str | os.PathLike, layers: int = 2, seed: int = 0,
                 progress: Progress | None = None) -> AuditReport:
    """`initadvisor audit config.json`: build the HuggingFace model with its LM head (...ForCausalLM, or
    ...ForMaskedLM for encoders) on CPU with `layers` blocks under torch seed `seed`, and audit it;
    `progress(done, total)`: told once the model is built, then as `audit` tells it."""
    from initadvisor.hf import _load_json, import_config, transformers_config

    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise UsageError(f"must be a whole number >= 1, got {layers!r}", "--layers")
    progress = checked(progress)
    spec, _ = import_config(path)  # refuses what check refuses, naming the file and key
    from dataclasses import replace

    from initadvisor.simulate import MEMORY_SHARE, available_memory, memory_needed

    # weights and their gradients (itemsize 8 = two float32 copies), the tables, a probe of 2 x 8 tokens
    need = memory_needed(replace(spec, layers=layers, seq_len=min(spec.seq_len, 8)), 2, 8, True)
    have = available_memory()
    if need > MEMORY_SHARE * have:
        raise SpecError(f"building this model with {layers} layers needs about {need / 2**30:.3g} GiB, over "
                        f"{MEMORY_SHARE:g} of the {have / 2**30:.3g} GiB available (its width and vocabulary set "
                        "the size; --layers 1 is the least)", str(path))
    raw, _, fname = _load_json(path)
    try:  # transformers validates the config its own way: what it refuses is the input's fault, in one line
        from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

        from initadvisor.torch import build_hf

        def build(lean: str | None):
            config = transformers_config(raw, lean)  # (a multimodal wrapper: its language model)
            full = config.num_hidden_layers
            config.num_hidden_layers = layers  # GPT-2's n_layer through its attribute_map
            kinds = getattr(config, "layer_types", None)
            if isinstance(kinds, list) and kinds:  # per-layer attention kinds (Qwen2): repeated over the new depth
                config.layer_types = [kinds[i % len(kinds)] for i in range(layers)]
            auto = AutoModelForCausalLM if spec.causal else AutoModelForMaskedLM
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return build_hf(config, auto), full

        for lean in (None, "null", "drop"):  # a field the import ignores may break the build: without them
            try:
                model, full = build(lean)
                break
            except Exception:  # noqa: BLE001
                if lean == "drop":
                    raise
    except Exception as e:  # noqa: BLE001
        raise SpecError(one_line(f"transformers cannot build this model: {type(e).__name__}: {e}")[:300],
                        fname) from None
    tell(progress, 1, 2)
    report = audit(model, progress=progress and (lambda done, total: progress(done + 1, total + 1)))
    report.notes.insert(0, f"built {type(model).__name__} on CPU with {layers} of the config's {full} layers "
                           f"(torch seed {seed}); the check report is for these {layers} layers")
    return report
