"""The step-0 loss (initadvisor.loss, `initial_loss` in check/1, rule IA501) and the spec's head keys.

1. The expected cross-entropy of V Gaussian logits against exact references (V = 2 by quadrature, the small-s
   series, V = 1) and against direct sampling over an (s, V) grid with tiny V, large s, soft-capping and a tied
   head's own-token logit: within 4 standard errors + 1e-3 nats.
2. The whole prediction (spec -> engine -> head) against the measured step-0 cross-entropy of real
   `transformers` models built with from_config on CPU (GPT-2, Llama, Mistral, Qwen2, GPT-NeoX, BERT, RoBERTa,
   Gemma-2's soft-capping, GPT-2 without ln_f): uniform random tokens, the exact expectation over uniform
   random targets (ln sum_v e^{z_v} - mean_v z_v), 8 x 64 tokens x 4 seeds, within 0.05 nats; each
   configuration also states the wrong prediction it rules out (no s^2/2 term, no own-token logit, a final norm
   where there is none, no cap), more than 0.05 nats away.
3. The spec's `version` key and the head keys: defaults, round trip, one-line errors naming key, file and line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import logsumexp, ndtr

from initadvisor.core.model import propagate, propagate_causal
from initadvisor.diagnose import check
from initadvisor.hf import import_config, read_hf_config, to_yaml
from initadvisor.loss import expected_cross_entropy, expected_logsumexp, initial_loss, logit_std, own_token_moment
from initadvisor.spec import SpecError, build_spec, parse_spec
from initadvisor.stack import from_spec

DATA = Path(__file__).parent / "data" / "hf"
BASE = {"model": {"layers": 2, "d_model": 64, "heads": 4}, "sequence": {"length": 32, "vocab": 1000}}


def spec_of(**over) -> dict:
    out = json.loads(json.dumps(BASE))
    for k, v in over.items():
        out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


# ------------------------------------------------------------------------------------------------
# 1. The formula


def exact_v2(s: float) -> float:
    """E ln(e^a + e^b), a, b ~ N(0, s^2): E max = s / sqrt(pi), plus E ln(1 + e^-|a - b|) by quadrature."""
    if s == 0:
        return math.log(2)
    sd = math.sqrt(2) * s

    def f(x):
        return math.log1p(math.exp(-x)) * math.exp(-x * x / (2 * sd * sd)) / (sd * math.sqrt(2 * math.pi))

    return s / math.sqrt(math.pi) + 2 * quad(f, 0, np.inf, epsabs=1e-14, limit=500)[0]


@pytest.mark.parametrize("s", [0.0, 0.01, 0.5, 1.0, 1.01, 2.0, 5.0, 10.0, 50.0, 200.0])
def test_two_logits_against_quadrature(s):
    assert expected_logsumexp(2, s) == pytest.approx(exact_v2(s), abs=1e-6)


@pytest.mark.parametrize("V", [1000, 10**6, 10**9])
@pytest.mark.parametrize("s", [0.01, 0.5, 1.0, 1.5, 2.0])
def test_small_logits_against_the_series(V, s):
    """ln V + s^2/2 - (e^{s^2} - 1)/(2V): the delta method for E ln of a sum of V log-normals, up to terms of
    order e^{3 s^2} / V^2 (dropping s^2/2, or using s instead of s^2, is off by far more)."""
    series = math.log(V) + s * s / 2 - math.expm1(s * s) / (2 * V)
    tol = 1e-7 + math.exp(3 * s * s) / V**2
    assert expected_logsumexp(V, s) == pytest.approx(series, abs=tol)
    assert expected_cross_entropy(V, s) == pytest.approx(series, abs=tol)  # targets: mean 0


def test_one_logit_and_zero_std():
    assert expected_cross_entropy(1, 3.0) == 0.0  # one class: probability 1
    assert expected_cross_entropy(1, 3.0, self_mean=5.0) == pytest.approx(0.0, abs=1e-12)
    for V in (2, 3, 50257, 10**6):
        assert expected_cross_entropy(V, 0.0) == pytest.approx(math.log(V), abs=1e-9)


def test_finite_and_ordered_over_the_range():
    """No NaN or inf from s = 0 to 10^134 (the largest a spec can give), V from 2 to 10^9, any cap, an own
    logit far above the rest; the loss grows with s, a cap bounds it by ln V + 2 cap."""
    for V in (2, 3, 1000, 10**6, 10**9):
        prev = -1.0
        for s in (0.0, 1e-8, 0.3, 1.0, 1.2, 3.0, 10.0, 50.0, 1e5, 1e134):
            x = expected_cross_entropy(V, s)
            assert math.isfinite(x) and x >= prev - 1e-9 * abs(x), (V, s, x, prev)
            prev = x
            for cap in (1e-8, 0.5, 30.0):
                y = expected_cross_entropy(V, s, cap)
                assert math.isfinite(y) and math.log(V) - 1e-9 <= y <= math.log(V) + 2 * cap + 1e-6, (V, s, cap, y)
            for mu in (3.0, 1e6, 1e150):
                assert math.isfinite(expected_cross_entropy(V, s, None, mu, 1.5 * s))


def sample_ce(rng, V, s, n, cap=None, mu=0.0, own_std=None):
    """Mean and standard error of ln sum_v e^{l_v} - mean_v l_v (the cross-entropy averaged over uniform
    targets), logit 0 the own one, over n draws of the V logits."""
    out = []
    rows = max(1, 4_000_000 // V)
    for start in range(0, n, rows):
        k = min(rows, n - start)
        z = rng.standard_normal((k, V)) * s
        z[:, 0] = mu + rng.standard_normal(k) * (s if own_std is None else own_std)
        if cap is not None:
            z = cap * np.tanh(z / cap)
        out.append(logsumexp(z, axis=1) - z.mean(axis=1))
    x = np.concatenate(out)
    return x.mean(), x.std() / math.sqrt(n)


SAMPLED = [  # V, s, cap, own mean, own std, draws
    (2, 0.3, None, 0.0, None, 40000), (2, 3.0, None, 0.0, None, 40000), (2, 50.0, None, 0.0, None, 40000),
    (7, 1.5, None, 0.0, None, 20000), (1000, 0.3, None, 0.0, None, 4000), (1000, 1.5, None, 0.0, None, 4000),
    (1000, 4.0, None, 0.0, None, 4000), (1000, 50.0, None, 0.0, None, 4000), (50000, 1.0, None, 0.0, None, 400),
    (50000, 10.0, None, 0.0, None, 200), (10**6, 3.0, None, 0.0, None, 24),
    (1000, 3.0, 5.0, 0.0, None, 4000), (1000, 30.0, 5.0, 0.0, None, 4000), (2, 5.0, 2.0, 0.0, None, 40000),
    (50, 3.0, 1.0, 0.0, None, 20000), (1000, 0.5, 0.3, 0.0, None, 4000),
    (1000, 0.3, None, 3.0, 0.35, 4000), (1000, 2.0, None, 10.0, 3.0, 4000), (100, 5.0, None, 100.0, 6.0, 4000),
    (1000, 5.0, 20.0, 100.0, 6.0, 4000),
]


@pytest.mark.parametrize("V, s, cap, mu, own_std, n", SAMPLED, ids=[f"V{c[0]}-s{c[1]}-cap{c[2]}-mu{c[3]}"
                                                                    for c in SAMPLED])
def test_against_direct_sampling(V, s, cap, mu, own_std, n):
    rng = np.random.default_rng(V * 7919 + int(s * 1000) + int(mu))
    mean, se = sample_ce(rng, V, s, n, cap, mu, own_std)
    assert expected_cross_entropy(V, s, cap, mu, own_std) == pytest.approx(mean, abs=4 * se + 1e-3)


# ------------------------------------------------------------------------------------------------
# The spec's head: logit std, the own token's row


def test_logit_std_and_what_it_reads():
    s = build_spec(spec_of(init={"std": 0.05}))
    assert logit_std(s, 123.0) == pytest.approx(0.05 * 8)  # final norm (default): |h|^2 = d q / (q + eps)
    no_norm = build_spec(spec_of(model={"final_norm": False}, init={"std": 0.05}))
    assert logit_std(no_norm, 4.0) == pytest.approx(0.05 * 8 * 2)  # |h|^2 = d q_L
    mlm = build_spec(spec_of(model={"final_norm": False, "head_transform": True}, init={"std": 0.05}))
    assert logit_std(mlm, 4.0) == pytest.approx(0.4)  # the transform ends in a LayerNorm
    own = build_spec(spec_of(model={"tie_embeddings": False}, init={"head": {"gain": 1, "bias_std": 0.5}}))
    assert own.head_init.std == pytest.approx(1 / 8) and logit_std(own, 1e6) == pytest.approx(math.hypot(1, 0.5))
    # the final norm outputs q / (q + eps): a stream as small as eps leaves half the variance
    eps = build_spec(spec_of(model={"norm_eps": 1e-5}, init={"std": 0.05}))
    assert logit_std(eps, 1e-5) == pytest.approx(0.05 * 8 / math.sqrt(2))
    capped = build_spec(spec_of(model={"logit_softcap": 2.0}, init={"std": 1.0}))
    assert 1.5 < logit_std(capped, 1.0) < 2.0  # s = 8 against c = 2: mostly saturated at +-2
    x = 8 * np.linspace(-9, 9, 200001)  # E (c tanh(z / c))^2, z ~ N(0, 64), by the trapezoid rule
    w = np.exp(-(x / 8) ** 2 / 2) / (8 * math.sqrt(2 * math.pi))
    assert logit_std(capped, 1.0) ** 2 == pytest.approx(np.trapezoid((2 * np.tanh(x / 2)) ** 2 * w, x), rel=1e-3)


def test_own_token_row_follows_the_skip_path():
    """Pre-LN: the row keeps std^2 / n_tables times skip^2 per sublayer; post-LN: each norm divides it by its
    input's q, so it shrinks; no token table, nothing."""
    pre = build_spec(spec_of(model={"norm": "pre"}, residual={"attention": {"skip": 0.9}, "mlp": {"skip": 0.8}}))
    st = from_spec(pre)
    assert own_token_moment(st, propagate(st, backward=False)) == pytest.approx(0.02**2 * (0.81 * 0.64) ** 2)
    post = build_spec(spec_of(model={"norm": "post"}))
    st = from_spec(post)
    tr = propagate(st, backward=False)
    c = own_token_moment(st, tr)
    assert 0 < c < tr.q[0] / 2  # enters as half of the normalised embeddings (token + position)
    position_only = build_spec(spec_of(sequence={"embeddings": ["position"]}))
    st = from_spec(position_only)
    assert own_token_moment(st, propagate(st, backward=False)) == 0.0


def test_tied_head_adds_the_own_token_logit():
    """A shallow tied pre-LN model whose stream is mostly the token embedding predicts the current token: its
    loss exceeds the untied one; BERT's transform (or untying) removes it."""
    base = spec_of(model={"layers": 1, "d_model": 1024, "heads": 8, "norm": "pre", "norm_type": "rmsnorm",
                          "activation": "swiglu", "d_ff": 1024}, sequence={"vocab": 256, "embeddings": ["token"]},
                   init={"std": 0.01})
    tied = initial_loss(build_spec(base))["expected"]
    untied = initial_loss(build_spec({**base, "model": {**base["model"], "tie_embeddings": False}}))["expected"]
    mlm = initial_loss(build_spec({**base, "model": {**base["model"], "head_transform": True}}))["expected"]
    assert tied > untied + 0.05 and mlm == pytest.approx(untied)
    assert untied == pytest.approx(expected_cross_entropy(256, math.sqrt(1024) * 0.01))


def test_initial_loss_takes_a_number():
    s = build_spec(spec_of(model={"final_norm": False, "tie_embeddings": False}, init={"head": {"std": 0.05}}))
    out = initial_loss(s, 4.0)
    assert out["logit_std"] == pytest.approx(0.8) and out["uniform"] == pytest.approx(math.log(1000))
    assert out["expected"] == pytest.approx(expected_cross_entropy(1000, 0.8))


def test_check_report_and_ia501():
    rep = check(build_spec(spec_of()))
    assert set(rep["initial_loss"]) == {"expected", "uniform", "logit_std"}
    assert rep["initial_loss"]["uniform"] == pytest.approx(math.log(1000), abs=1e-5)
    assert "IA501" not in [f["code"] for f in rep["findings"]]
    big = check(build_spec(spec_of(model={"tie_embeddings": False}, init={"head": {"std": 1.0}})))
    hit = [f for f in big["findings"] if f["code"] == "IA501"]
    assert len(hit) == 1 and hit[0]["severity"] == "warning" and "ln V" in hit[0]["message"]
    assert big["initial_loss"]["logit_std"] == pytest.approx(8.0)


# ------------------------------------------------------------------------------------------------
# 2. Real transformers models at init


DROPOUTS = ("attn_pdrop", "embd_pdrop", "resid_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob",
            "hidden_dropout", "attention_dropout")
WIDE = {"num_hidden_layers": 1, "hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 1024}
T, BATCH, SEEDS = 64, 8, (0, 1, 2, 3)


@pytest.fixture(scope="module")
def transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    torch.set_num_threads(1)
    return tf


def measured(make, vocab: int, low: int = 0) -> float:
    """The step-0 cross-entropy averaged over uniform random targets, random uniform input tokens."""
    import torch

    out = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        model = make().eval()
        ids = torch.randint(low, vocab, (BATCH, T), generator=torch.Generator().manual_seed(100 + seed))
        with torch.no_grad():
            z = model(input_ids=ids).logits.double()
        out.append((torch.logsumexp(z, -1) - z.mean(-1)).mean().item())
    return sum(out) / len(out)


def predicted(spec) -> float:
    """The spec's prediction for uniform random tokens: their input correlation is 1/V for the token table
    (the spec's default assumes Zipf-distributed text), 0 for positions, 1 for the one segment row."""
    share = {"token": 1 / spec.vocab, "position": 0.0, "segment": 1.0}
    spec = spec.with_overrides(input_correlation=sum(share[t] for t in spec.embeddings) / len(spec.embeddings))
    stack = from_spec(spec)
    return initial_loss(spec, stack=stack, ct=propagate_causal(stack) if spec.causal else None)["expected"]


def no_s2(spec) -> float:
    return math.log(spec.vocab)  # the logit-variance term dropped


def no_own(spec) -> float:
    return predicted(spec.with_overrides(tie_embeddings=False, head=spec.head_init))


HF_CASES = [  # family, config changes, a wrong prediction the measurement rules out
    ("gpt2", {"initializer_range": 0.02, "vocab_size": 2048}, None),
    ("gpt2", {"initializer_range": 0.2, "vocab_size": 8192}, no_s2),
    ("gpt2", {"initializer_range": 0.1, "vocab_size": 4096, "n_embd": 128, "tie_word_embeddings": False}, no_s2),
    ("llama", {"initializer_range": 0.2, "vocab_size": 8192}, no_s2),
    ("llama", {"initializer_range": 0.01, "vocab_size": 256, "tie_word_embeddings": True, **WIDE,
               "num_key_value_heads": 8, "head_dim": 64}, no_own),
    ("mistral", {"initializer_range": 0.15, "vocab_size": 4096}, no_s2),
    ("qwen2", {"initializer_range": 0.1, "vocab_size": 4096, "tie_word_embeddings": True}, no_s2),
    ("gpt_neox", {"initializer_range": 0.2, "vocab_size": 8192}, no_s2),
    ("gpt_neox", {"initializer_range": 0.01, "vocab_size": 256, "tie_word_embeddings": True, **WIDE}, None),
    ("bert", {"initializer_range": 0.02, "vocab_size": 2048}, None),
    ("bert", {"initializer_range": 0.15, "vocab_size": 8192}, no_s2),
    ("roberta", {"initializer_range": 0.15, "vocab_size": 8192}, no_s2),
    # OPT-350m's layout: the tied head reads project_out's output (no own-token part), post-LN without a final norm
    # (at init_std 0.2-0.3 with 32-wide tokens 0.1-0.5 nats off: the own token's e . W_out W_in e, not modelled)
    ("opt", {"init_std": 0.1, "vocab_size": 8192, "word_embed_proj_dim": 32, "do_layer_norm_before": False},
     lambda spec: predicted(spec.with_overrides(tie_embeddings=True))),
]


@pytest.mark.parametrize("family, over, wrong", HF_CASES,
                         ids=[f"{f}-{o.get('initializer_range', o.get('init_std'))}-{o['vocab_size']}-{i}" for i, (f, o, _) in
                              enumerate(HF_CASES)])
def test_real_models_step0_loss(transformers, family, over, wrong):
    raw = json.loads((DATA / family / "config.json").read_text()) | over
    raw |= {k: 0.0 for k in DROPOUTS if k in raw}  # eval mode anyway; the spec's q then has no dropout either
    config = transformers.AutoConfig.from_pretrained(DATA / family, **{k: raw[k] for k in raw if k in over
                                                                       or k in DROPOUTS})
    cls = transformers.AutoModelForMaskedLM if family in ("bert", "roberta") else transformers.AutoModelForCausalLM
    got = measured(lambda: cls.from_config(config), config.vocab_size, low=3 if family == "roberta" else 0)
    spec, _ = import_config(raw, seq_len=T)
    assert predicted(spec) == pytest.approx(got, abs=0.05)
    if wrong is not None:
        assert abs(wrong(spec) - got) > 0.05, "this configuration cannot tell the term apart"


def test_gemma2_soft_capping(transformers):
    """Gemma-2's final_logit_softcapping: logits = c tanh(z / c); an untied head (std 0.5, logit std 4) after
    the final RMSNorm (gain 1 + 0 at init)."""
    for cap in (5.0, 30.0):
        config = transformers.Gemma2Config(
            vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, initializer_range=0.5, final_logit_softcapping=cap,
            tie_word_embeddings=False, max_position_embeddings=128)
        got = measured(lambda: transformers.Gemma2ForCausalLM(config), 4096)
        spec = build_spec({"model": {"layers": 2, "d_model": 64, "heads": 4, "norm": "pre", "norm_type": "rmsnorm",
                                     "causal": True, "tie_embeddings": False, "logit_softcap": cap},
                           "sequence": {"length": T, "vocab": 4096, "embeddings": ["token"]}, "init": {"std": 0.5}})
        assert predicted(spec) == pytest.approx(got, abs=0.05)
        assert abs(predicted(dataclasses.replace(spec, logit_softcap=None)) - got) > 0.05


def test_gpt2_without_final_norm(transformers):
    """ln_f removed: the head reads the last block's stream, q_L from the engine (per position)."""
    import torch

    config = transformers.GPT2Config(vocab_size=2048, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                     initializer_range=0.1, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)

    def make():
        model = transformers.GPT2LMHeadModel(config)
        model.transformer.ln_f = torch.nn.Identity()
        return model

    got = measured(make, 2048)
    spec, _ = import_config(config.to_dict(), seq_len=T)
    spec = spec.with_overrides(final_norm=False)
    assert predicted(spec) == pytest.approx(got, abs=0.05)
    assert abs(predicted(spec.with_overrides(final_norm=True)) - got) > 0.05


def test_llama3_debug_model_head(transformers):
    """The issue's reference: a Llama-3 debug model (dim 256, vocab 2048, final RMSNorm) with torchtitan's output
    init, N(0, (1/16)^2) truncated at 3 sigma (std factor 0.98655). The spec takes the head's actual std.
    Predicted 8.11 nats for random tokens, ln V = 7.62; torchtitan's run logs 8.049 at step 1 on text, one seed
    (its targets are not uniform, so the head's draw moves that one number by about s sqrt(sum_v p_v^2))."""
    import torch

    config = transformers.LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=128)

    def make():
        model = transformers.LlamaForCausalLM(config)
        torch.nn.init.trunc_normal_(model.lm_head.weight, std=1 / 16, a=-3 / 16, b=3 / 16)
        return model

    got = measured(make, 2048)
    factor = math.sqrt(1 - 6 * math.exp(-4.5) / math.sqrt(2 * math.pi) / (2 * ndtr(3) - 1))  # truncated at 3 sigma
    spec = build_spec({"model": {"layers": 2, "d_model": 256, "heads": 16, "norm": "pre", "norm_type": "rmsnorm",
                                 "causal": True, "tie_embeddings": False},
                       "sequence": {"length": T, "vocab": 2048, "embeddings": ["token"]},
                       "init": {"head": {"std": factor / 16}}})
    pred = predicted(spec)
    assert pred == pytest.approx(got, abs=0.05)
    assert pred == pytest.approx(8.11, abs=0.005) and pred - math.log(2048) == pytest.approx(0.486, abs=0.005)


@pytest.mark.parametrize("family", ["bert", "gpt2", "gpt_neox", "llama", "qwen2"])
def test_head_claims_hold_in_the_real_model(transformers, family):
    """What the import says about the head is what transformers builds: tying, the head's std, the final norm,
    BERT's MLM transform."""
    import torch

    for tie in (True, False):
        raw = json.loads((DATA / family / "config.json").read_text()) | {"tie_word_embeddings": tie}
        config = transformers.AutoConfig.from_pretrained(DATA / family, tie_word_embeddings=tie)
        cls = transformers.AutoModelForMaskedLM if family == "bert" else transformers.AutoModelForCausalLM
        torch.manual_seed(0)
        model = cls.from_config(config)
        spec, _ = import_config(raw)
        head, emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
        assert (head.data_ptr() == emb.data_ptr()) is spec.tie_embeddings is tie
        assert head.std().item() == pytest.approx(spec.head_init.std, rel=0.05)
        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        assert spec.final_norm is bool(names & {"ln_f", "final_layer_norm", "norm"})
        assert spec.head_transform is ("transform" in names)


# ------------------------------------------------------------------------------------------------
# 3. The spec: version and head keys


def test_version_key():
    assert parse_spec("version: 1\nmodel: {layers: 1, d_model: 8, heads: 2}") == \
        parse_spec("model: {layers: 1, d_model: 8, heads: 2}")  # optional; old specs stay valid
    for bad in ("2", "0", "'1'", "true", "1.0", "null", "[1]"):
        with pytest.raises(SpecError) as e:
            parse_spec(f"name: x\nversion: {bad}\nmodel: {{layers: 1, d_model: 8, heads: 2}}\n", "s.yaml")
        assert (e.value.key, e.value.file, e.value.line) == ("version", "s.yaml", 2)
        assert "\n" not in str(e.value) and "version 1" in str(e.value)
    d = build_spec(spec_of()).to_dict()
    assert next(iter(d)) == "version" and d["version"] == 1


def test_head_keys_defaults_and_round_trip():
    s = build_spec(spec_of())
    assert (s.final_norm, s.tie_embeddings, s.head_transform, s.logit_softcap, s.head) == (True, True, False,
                                                                                          None, None)
    assert s.head_init == s.init["embedding"]
    assert "head" not in s.to_dict()["init"]  # tied: the embedding's
    u = build_spec(spec_of(model={"tie_embeddings": False, "final_norm": False, "logit_softcap": 30},
                           init={"head": {"gain": 2, "bias_std": 0.1}}))
    assert u.head_init.std == pytest.approx(math.sqrt(2 / 64)) and u.logit_softcap == 30.0
    d = u.to_dict()
    assert d["init"]["head"] == {"std": u.head.std, "bias_std": 0.1}
    assert build_spec(d) == u and build_spec(s.to_dict()) == s
    assert build_spec(spec_of(model={"tie_embeddings": False})).head_init.std == 0.02  # init.std's


@pytest.mark.parametrize("text, key, line", [
    ("model:\n  layers: 1\n  d_model: 8\n  heads: 2\ninit:\n  head: {std: 0.1}\n", "init.head", 6),
    ("model:\n  layers: 1\n  d_model: 8\n  heads: 2\n  final_norm: yes please\n", "model.final_norm", 5),
    ("model:\n  layers: 1\n  d_model: 8\n  heads: 2\n  tie_embeddings: 1\n", "model.tie_embeddings", 5),
    ("model:\n  layers: 1\n  d_model: 8\n  heads: 2\n  logit_softcap: 0\n", "model.logit_softcap", 5),
    ("model:\n  layers: 1\n  d_model: 8\n  heads: 2\n  logit_softcap: .nan\n", "model.logit_softcap", 5),
    ("model:\n  layers: 1\n  d_model: 8\n  heads: 2\n  tie_embeddings: false\ninit:\n  head: {std: 0.1, gain: 1}\n",
     "init.head", 7),
    ("model:\n  layers: 1\n  d_model: 8\n  heads: 2\n  head_transfrom: true\n", "model.head_transfrom", 5),
])
def test_bad_head_keys_name_key_file_and_line(text, key, line):
    with pytest.raises(SpecError) as e:
        parse_spec(text, "m.yaml")
    assert (e.value.key, e.value.file, e.value.line) == (key, "m.yaml", line)
    assert "\n" not in str(e.value)


def test_import_writes_version_and_head():
    d, notes = read_hf_config(DATA / "llama" / "config.json")
    text = to_yaml(d, notes)
    assert text.split("\n\n", 1)[1].startswith("version: 1\n")
    assert "  head: {std: " in text and "tie_embeddings: false" in text
    back = parse_spec(text)
    assert back == import_config(DATA / "llama" / "config.json")[0] and back.head_init.std == 0.025
    bert, _ = import_config(DATA / "bert" / "config.json")
    assert bert.tie_embeddings and bert.head_transform and not bert.final_norm
    c = json.loads((DATA / "llama" / "config.json").read_text())
    del c["tie_word_embeddings"]  # transformers' LlamaConfig default: untied
    s, notes = import_config(c)
    assert not s.tie_embeddings and any("tie_word_embeddings=False" in n for n in notes)


@pytest.mark.parametrize("model", [
    {"layers": 1, "d_model": 32, "heads": 2, "norm": "pre", "causal": True},  # tied: the own row's share varies
    {"layers": 3, "d_model": 32, "heads": 2, "norm": "none", "causal": True, "final_norm": False},  # so does s
], ids=["own-row", "no-final-norm"])
def test_position_average_is_the_mean_over_positions(model):
    """The causal loss averages POSITIONS positions through an interpolation: against evaluating each one."""
    from initadvisor.core.model import propagate
    from initadvisor.diagnose import causal_trace
    from initadvisor.loss import POSITIONS, expected_cross_entropy, initial_loss, own_token_moment, raw_logit_std
    from initadvisor.stack import from_spec

    spec = build_spec({"model": model, "sequence": {"length": 64, "vocab": 300}, "init": {"std": 0.3}})
    stack = from_spec(spec)
    trace, ct = propagate(stack, backward=False), causal_trace(stack)
    q_pos = np.asarray(ct.q[-1], dtype=float)
    qs = q_pos[((np.arange(POSITIONS) + 0.5) * q_pos.size / POSITIONS).astype(int)]
    c = own_token_moment(stack, trace)
    direct = []
    for q in qs:
        s, f = raw_logit_std(spec, q), min(c / q, 1.0)
        direct.append(expected_cross_entropy(spec.vocab, s, None, s * np.sqrt(spec.d_model * f), s * np.sqrt(1 + f)))
    assert np.ptp(direct) > 1e-4  # the positions do differ here
    assert initial_loss(spec, trace, stack, ct)["expected"] == pytest.approx(np.mean(direct), rel=1e-6, abs=1e-7)
