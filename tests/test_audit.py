"""`initadvisor.audit` on real models on CPU: transformers' own families (built from the shipped tiny configs) and
a tiny nanoGPT written here. Correct inits give no finding over seeds; each known init bug gives its finding,
with the factor where there is one; the probe step finds a QK-norm that is built and never called; the spec of
the weights as they are goes through `check`; the gate raises."""

import json
import math
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from conftest import ROOT  # noqa: E402
from initadvisor.audit import AuditError, audit, audit_config  # noqa: E402
from initadvisor.report import render_audit  # noqa: E402
from initadvisor.rules import RULES  # noqa: E402
from initadvisor.spec import SpecError  # noqa: E402

CONFIGS = sorted((ROOT / "tests/data/hf").glob("*/config.json"))
AUDIT_CODES = [c for c, r in RULES.items() if r.scope == "audit"]


def codes(report) -> list[str]:
    return [f.code for f in report.findings]


def hits(report, code: str) -> list:
    return [f for f in report.findings if f.code == code]


def hf(model_type: str, layers: int = 4, seed: int = 0, **kw):
    shape = ({"n_layer": layers, "n_embd": 64, "n_head": 4, "n_positions": 64} if model_type == "gpt2" else
             {"num_hidden_layers": layers, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 172,
              "max_position_embeddings": 64})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, vocab_size=1000, **shape, **kw))


def redraw(model, suffixes: tuple[str, ...], std: float) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(suffixes):
                p.normal_(0.0, std)


# --------------------------------------------------------------------------------------------- a tiny nanoGPT


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 200
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    qk_norm: str = "none"  # "none", "called", "built" (constructed, never called: the bug)


class LayerNorm(nn.Module):
    def __init__(self, ndim: int, one_plus: bool = False):
        super().__init__()
        self.one_plus = one_plus  # the 1 + w convention: the stored weight starts at 0
        self.weight = nn.Parameter(torch.zeros(ndim) if one_plus else torch.ones(ndim))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, 1 + self.weight if self.one_plus else self.weight, None, 1e-5)


class Attention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(c.n_embd, 3 * c.n_embd), nn.Linear(c.n_embd, c.n_embd)
        self.n_head, self.qk = c.n_head, c.qk_norm
        if c.qk_norm != "none":
            self.q_norm, self.k_norm = LayerNorm(c.n_embd // c.n_head), LayerNorm(c.n_embd // c.n_head)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, 2))
        if self.qk == "called":
            q, k = self.q_norm(q), self.k_norm(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c_fc, self.gelu = nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU()
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c: GPTConfig, one_plus: bool):
        super().__init__()
        self.ln_1, self.attn = LayerNorm(c.n_embd, one_plus), Attention(c)
        self.ln_2, self.mlp = LayerNorm(c.n_embd, one_plus), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's module names and init (model.py), shrunk."""

    def __init__(self, c: GPTConfig, scale_proj: bool = True, tie: bool = True, one_plus: bool = False):
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd), wpe=nn.Embedding(c.block_size, c.n_embd),
            h=nn.ModuleList(Block(c, one_plus) for _ in range(c.n_layer)), ln_f=LayerNorm(c.n_embd, one_plus)))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        if tie:
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        if scale_proj:
            redraw(self, ("c_proj.weight",), 0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x)[:, [-1], :]), None  # nanoGPT's inference path


def nano(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    cfg = {k: kw.pop(k) for k in list(kw) if k in GPTConfig.__dataclass_fields__}
    return GPT(GPTConfig(**cfg), **kw)


# --------------------------------------------------------------------------------------------- correct inits


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.parent.name)
def test_correct_hf_models_have_no_findings_over_seeds(config):
    for seed in range(3):
        report = audit_config(config, layers=2 + seed, seed=seed)
        assert report.findings == [], (seed, [f.message for f in report.findings])
        assert report.blocks == 2 + seed
        weights = [t for t in report.tensors if t.kind == "weight"]
        assert weights and all(t.intended_std and abs(math.log(t.factor)) < max(0.1, 4 / math.sqrt(2 * t.n))
                               for t in weights)
        assert {"q", "k", "v", "o", "ff_out", "embedding"} <= {t.role for t in weights}
        assert all(t.intended_mean == 1 and t.mean == 1 for t in report.tensors if t.kind == "gain")
        assert report.check["schema"] == "initadvisor.check/1"


def test_gpt2_intends_the_depth_scaled_projections_and_ties_its_head():
    report = audit_config(ROOT / "tests/data/hf/gpt2/config.json", layers=3)
    by_role = {t.role: t for t in report.tensors if t.block == 1 and t.kind == "weight"}
    assert by_role["o"].intended_std == by_role["ff_out"].intended_std == pytest.approx(0.02 / math.sqrt(6))
    assert by_role["q"].intended_std == 0.02 and by_role["q"].name.endswith("c_attn.weight[q]")
    assert report.tied_head is True and report.family == "gpt2"


@pytest.mark.parametrize("seed", range(3))
def test_correct_nanogpt_has_no_findings(seed):
    report = audit(nano(seed, n_layer=3))
    assert report.findings == [] and report.family == "nanogpt" and report.tied_head is True
    o = next(t for t in report.tensors if t.role == "o" and t.kind == "weight")
    assert o.intended_std == pytest.approx(0.02 / math.sqrt(6))
    assert report.check["spec"]["model"]["layers"] == 3 and report.check["spec"]["model"]["causal"]


# --------------------------------------------------------------------------------------------- std findings


def test_missing_depth_scaling_is_reported_with_its_factor():
    model = hf("gpt2", layers=4)
    redraw(model, ("c_proj.weight",), 0.02)  # the GPT-2 implementation that never applied 1/sqrt(2L)
    report = audit(model)
    assert codes(report) == ["IA601", "IA601"]
    for f, role in zip(report.findings, ("o ", "ff_out ")):
        assert f.message.startswith(role) and "missing a factor 1/sqrt(2L) (L = 4)" in f.message
        assert "blocks 1-4" in f.message and f.severity == "error" and f.layer == 1
    factors = [t.factor for t in report.tensors if t.role in ("o", "ff_out") and t.kind == "weight"]
    assert len(factors) == 8 and all(f == pytest.approx(math.sqrt(8), rel=0.1) for f in factors)
    assert all(t.codes == () for t in report.tensors if t.role in ("q", "k", "v", "ff_in"))


def test_doubled_depth_scaling_is_reported():
    model = hf("gpt2", layers=4)
    redraw(model, ("c_proj.weight",), 0.02 / 8)  # 1/sqrt(2L) applied twice
    report = audit(model)
    assert codes(report) == ["IA601", "IA601"]
    assert all("an extra factor 1/sqrt(2L) (L = 4)" in f.message for f in report.findings)


def test_depth_scaling_on_the_swiglu_value_matrix_is_reported_apart_from_the_gate():
    model = hf("llama", layers=4)
    redraw(model, ("mlp.up_proj.weight",), 0.02 / math.sqrt(8))
    report = audit(model)
    assert codes(report) == ["IA601"]
    assert report.findings[0].message.startswith("up model.layers.*.mlp.up_proj.weight, blocks 1-4")
    assert "an extra factor 1/sqrt(2L)" in report.findings[0].message
    assert all(not t.codes for t in report.tensors if t.role == "gate")


def test_unnamed_factors_and_the_mean():
    model = hf("llama", layers=2)
    redraw(model, ("self_attn.q_proj.weight",), 0.05)
    with torch.no_grad():
        model.model.layers[1].self_attn.v_proj.weight.add_(0.02)
    report = audit(model)
    messages = [f.message for f in hits(report, "IA601")]
    assert len(messages) == 2
    assert messages[0].startswith("q ") and "factor 2.5" in messages[0] and "missing" not in messages[0]
    assert messages[1].startswith("v model.layers.*.self_attn.v_proj.weight, block 2: mean 0.0")
    assert "where 0 is intended" in messages[1]


def test_nanogpt_without_the_projection_scaling():
    report = audit(nano(scale_proj=False))
    assert codes(report) == ["IA601", "IA601"]
    assert all("missing a factor 1/sqrt(2L) = 1/L = 1/2 (L = 2)" in f.message for f in report.findings)


def test_a_config_states_the_intent():
    model = nano(scale_proj=False, n_layer=4)
    assert audit(model).findings  # nanoGPT's init scales c_proj
    spec = audit(model).check["spec"]  # the weights as they are, as a spec: c_proj at 0.02
    assert spec["init"]["o"]["std"] == pytest.approx(0.02, rel=0.05)
    assert audit(model, config=spec).findings == []
    report = audit(nano(), config=ROOT / "tests/data/hf/gpt2/config.json")  # GPT-2's init at the same depth
    assert report.findings == [] and report.intent.startswith("transformers' gpt2 init")
    assert report.family == "nanogpt" and report.tied_head is True


# --------------------------------------------------------------------------------------------- other findings


def test_linear_left_at_pytorch_default():
    model = hf("llama", layers=2)
    model.model.layers[1].mlp.up_proj = nn.Linear(64, 172, bias=False)  # created after the init ran
    report = audit(model)
    assert codes(report) == ["IA602"]
    msg = report.findings[0].message
    assert msg.startswith("up model.layers.*.mlp.up_proj.weight, block 2: still at PyTorch's default init")
    assert "1/sqrt(3 fan_in)" in msg and "where std 0.02 is intended" in msg


def test_linear_with_bias_fused_linear_and_embedding_at_default():
    model = nano()
    model.transformer.h[0].mlp.c_fc = nn.Linear(64, 256)
    model.transformer.h[1].attn.c_attn = nn.Linear(64, 192)
    model.transformer.wpe = nn.Embedding(32, 64)
    report = audit(model)
    assert codes(report) == ["IA602", "IA602", "IA602"]  # a Linear's uniform bias is part of its finding
    messages = [f.message for f in report.findings]
    assert messages[0].startswith("position transformer.wpe.weight: still at PyTorch's default")
    assert "nn.Embedding: N(0, 1)" in messages[0]
    assert messages[1].startswith("ff_in transformer.h.*.mlp.c_fc.weight, block 1: still at")
    assert messages[2].startswith("q/k/v transformer.h.*.attn.c_attn.weight, block 2: still at")


@pytest.mark.parametrize("fill, text", [(0.0, "all zero"), (0.01, "constant 0.01")])
def test_zero_or_constant_tensor(fill, text):
    model = hf("gpt2", layers=2)
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.fill_(fill)
    report = audit(model)
    assert codes(report)[0] == "IA603" and report.findings[0].message.endswith(text)
    assert report.findings[0].message.startswith("ff_in transformer.h.*.mlp.c_fc.weight, block 2")


def test_non_finite_weights():
    model = nano()
    with torch.no_grad():
        model.transformer.h[1].attn.c_proj.weight[0, 0] = float("nan")
    report = audit(model)
    assert codes(report)[0] == "IA603" and "not finite" in report.findings[0].message
    assert report.check["spec"]["init"]["o"]["std"] == pytest.approx(0.01, rel=0.1)  # from the finite tensor
    json.dumps(report.to_dict(), allow_nan=False)
    from rich.console import Console

    console = Console(record=True, width=200)
    render_audit(report, console)
    assert "nan" not in console.export_text().lower().replace("nanogpt", "")


def test_norm_gains_in_either_convention():
    assert audit(nano(one_plus=True)).findings == []  # stored 0, applied 1 + 0
    report = audit(nano(one_plus=True))
    assert {t.convention for t in report.tensors if t.kind == "gain"} == {"1 + w"}
    model = nano()
    with torch.no_grad():
        model.transformer.h[0].ln_2.weight.zero_()
        model.transformer.h[1].ln_1.weight.fill_(0.5)
    report = audit(model)
    assert codes(report)[:2] == ["IA601", "IA603"]
    assert "norm gain mean 0.5" in report.findings[0].message
    assert "norm gain all zero" in report.findings[1].message
    assert "norm gains other than 1 are not modelled by the spec" in report.notes


def test_qk_norm_built_and_never_called():
    report = audit(nano(qk_norm="built"))
    assert codes(report) == ["IA604", "IA604"]
    assert report.findings[0].message.startswith("norm transformer.h.*.attn.q_norm.weight, blocks 1, 2: no gradient")
    assert "k_norm" in report.findings[1].message
    assert not any("norm gains" in n for n in report.notes)  # the gains are 1: only their gradient is missing
    assert audit(nano(qk_norm="called")).findings == []


def test_the_probe_leaves_the_model_as_it_was():
    model = nano(qk_norm="built")
    model.train()
    model.transformer.h[0].eval()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = torch.get_rng_state()
    audit(model)
    assert torch.equal(state, torch.get_rng_state())
    assert model.training and not model.transformer.h[0].training and model.transformer.h[1].training
    assert all(p.grad is None and torch.equal(before[n], p) for n, p in model.named_parameters())


def test_truncation_that_never_bites():
    model = hf("llama", layers=2)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                nn.init.trunc_normal_(p, std=0.02)  # a = -2, b = 2: absolute, +-100 std
    report = audit(model, truncation=2)
    assert set(codes(report)) == {"IA605"} and len(report.findings) == 9  # embedding, head, 7 matrices
    assert "truncation at +-2 std" in report.findings[0].message
    assert audit(model).findings == []  # without the claim the weights are a plain N(0, 0.02)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                nn.init.trunc_normal_(p, std=0.02, a=-0.04, b=0.04)
    assert audit(model, truncation=2).findings == []  # biting bounds; the std 0.88 x 0.02 is expected
    assert codes(audit(model))[0] == "IA601"  # ... and is off by that factor without the claim


def test_head_tying_against_the_intent():
    report = audit(nano(tie=False))
    assert codes(report) == ["IA606"] and report.tied_head is False
    assert "separate from the token embedding" in report.findings[0].message
    model = hf("llama", layers=2, tie_word_embeddings=False)
    model.lm_head.weight = model.model.embed_tokens.weight
    assert codes(audit(model)) == ["IA606"]


# --------------------------------------------------------------------------------------------- the spec and check


def test_the_spec_is_built_from_the_weights_as_they_are():
    model = hf("gpt2", layers=4)
    redraw(model, ("attn.c_proj.weight",), 0.02)
    rep = audit(model).check
    assert rep["schema"] == "initadvisor.check/1" and rep["verdict"] in ("pass", "fail") and rep["layers"]
    init = rep["spec"]["init"]
    assert init["o"]["std"] == pytest.approx(0.02, rel=0.03)
    assert init["ff_out"]["std"] == pytest.approx(0.02 / math.sqrt(8), rel=0.03)
    assert init["q"]["std"] == pytest.approx(0.02, rel=0.03) and init["o"]["bias_std"] == 0


def test_an_unknown_model_gets_the_checks_that_need_no_intent():
    model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 32), nn.LayerNorm(32))
    report = audit(model)
    assert report.intent == "unknown" and report.check is None and report.family is None
    assert codes(report) == ["IA602"]  # nn.Linear's default shape needs no intent; the embedding's N(0, 1) does


# --------------------------------------------------------------------------------------------- the gate, JSON, CLI


def test_raise_for_findings():
    clean = audit(nano())
    assert clean.raise_for_findings() is clean
    report = audit(nano(qk_norm="built"))
    with pytest.raises(AuditError) as e:
        report.raise_for_findings()
    assert "IA604 error" in str(e.value) and e.value.report is report
    assert report.raise_for_findings(ignore=("IA604",)) is report
    model = hf("llama", layers=2)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                nn.init.trunc_normal_(p, std=0.02)
    loose = audit(model, truncation=2)
    assert loose.raise_for_findings(severity="error") is loose  # IA605 is a warning
    with pytest.raises(AuditError):
        loose.raise_for_findings()
    with pytest.raises(ValueError):
        loose.raise_for_findings(severity="fatal")


def test_json_document():
    report = audit(nano(qk_norm="built"))
    doc = report.to_dict()
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text)["schema"] == "initadvisor.audit/1" and doc["verdict"] == "fail"
    assert [f["code"] for f in doc["findings"]] == ["IA604", "IA604"]
    assert len(doc["tensors"]) == len(report.tensors) and doc["check"]["schema"] == "initadvisor.check/1"
    assert audit(nano()).to_dict()["verdict"] == "pass"


def test_render_shows_table_and_findings():
    from rich.console import Console

    console = Console(record=True, width=200)
    render_audit(audit(nano(scale_proj=False)), console)
    text = console.export_text()
    assert "transformer.h.0.attn.c_proj.weight" in text and "IA601 error init-mismatch" in text
    assert "check of the spec of the weights as they are" in text


def test_audit_config_layers_and_errors(tmp_path):
    report = audit_config(ROOT / "tests/data/hf/qwen2/config.json", layers=3)  # layer_types follows the depth
    assert report.blocks == 3 and report.findings == [] and report.check["spec"]["model"]["layers"] == 3
    for bad in (0, -1, True, 1.5):
        with pytest.raises(SpecError, match="--layers"):
            audit_config(ROOT / "tests/data/hf/gpt2/config.json", layers=bad)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2}')
    with pytest.raises(SpecError) as e:
        audit_config(tmp_path / "config.json")
    assert "config.json" in str(e.value) and "\n" not in str(e.value)


def test_audit_command_line(tmp_path):
    """The CLI: a JSON report whose verdict sets the exit code, and one line with exit 2 for bad input, a model
    too large to build (about 2 TiB) refused before allocating it."""
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "initadvisor", "audit", *map(str, args)], capture_output=True,
                              text=True)

    r = run(ROOT / "tests/data/hf/llama/config.json", "--format", "json", "--seed", "3")
    assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "pass" and json.loads(r.stdout)["blocks"] == 2
    big = {"model_type": "llama", "hidden_size": 65536, "intermediate_size": 262144, "num_attention_heads": 512,
           "num_key_value_heads": 8, "num_hidden_layers": 126, "vocab_size": 2_000_000, "tie_word_embeddings": False,
           "max_position_embeddings": 8192}
    (tmp_path / "big.json").write_text(json.dumps(big))
    (tmp_path / "bad.json").write_text("{bad")
    for args, needle in [((tmp_path / "big.json",), "GiB"), ((ROOT / "model_specs/bert-base.yaml",), "config.json"),
                         ((tmp_path / "bad.json",), "not valid JSON"), ((tmp_path / "nope.json",), "no such file"),
                         ((ROOT / "tests/data/hf/gpt2/config.json", "--layers", "0"), "--layers"),
                         ((ROOT / "tests/data/hf/gpt2/config.json", "--format", "xml"), "--format")]:
        r = run(*args)
        assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)


def test_audit_rules_are_registered_for_rules_and_explain():
    from initadvisor.diagnose import check
    from initadvisor.formats import rule_text
    from initadvisor.rules import EXAMPLE_BASE
    from initadvisor.spec import build_spec

    assert AUDIT_CODES == ["IA601", "IA602", "IA603", "IA604", "IA605", "IA606"]
    for code in AUDIT_CODES:
        r = RULES[code]
        for text in (r.name, r.title, r.criterion, r.meaning, r.formula, r.source, r.fix):
            assert text.strip() and "\n" not in text
        assert r.meaning in rule_text(code) and r.fails == r.passes == {}
    assert not set(AUDIT_CODES) & {f["code"] for f in check(build_spec(EXAMPLE_BASE))["findings"]}


def test_torch_module_exports_audit():
    import initadvisor.torch as T

    assert "audit" in T.__all__ and codes(T.audit(nano(qk_norm="built"))) == ["IA604", "IA604"]


def test_opt_350m_projected_embeddings(tmp_path):
    """OPT-350m's layout (tokens of width word_embed_proj_dim, project_in / project_out, the head tied): compared as
    drawn, silent over seeds; a project_in drawn 5x too wide is named; the check report is the config's moments."""
    cfg = json.loads((ROOT / "tests/data/hf/opt/config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg | {"word_embed_proj_dim": 32, "do_layer_norm_before": False}))
    for seed in range(3):
        report = audit_config(path, seed=seed)
        assert report.findings == [], [f.message for f in report.findings]
        assert report.tied_head and report.check["spec"]["model"]["tie_embeddings"] is False  # moments: untied
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    with torch.no_grad():
        model.model.decoder.project_in.weight.normal_(0.0, 0.1)
    found = audit(model).findings
    assert [f.code for f in found] == ["IA601"] and "project_in" in found[0].message
