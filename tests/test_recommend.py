"""`recommend`: alpha_c, beta, tau, DeepScaleLM numbers, recipes, patched specs and the PyTorch snippet."""

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from initadvisor.core.model import propagate
from initadvisor.recipes import alpha_c, max_rho, recommend
from initadvisor.spec import build_spec, load_spec
from initadvisor.stack import from_spec

from conftest import ROOT, SPECS

HF_CONFIGS = sorted((ROOT / "tests" / "data" / "hf").glob("*/config.json"))


def run(*args):
    return subprocess.run([sys.executable, "-m", "initadvisor", *map(str, args)], capture_output=True, text=True)


def test_alpha_c_of_paper001_fig1():
    """001 Fig. 1c: 60-layer post-LN BERT (ReLU, sigma_w^2 = sigma_v^2 = 0.2, sigma_b^2 = 4e-4, alpha_MLP = 1,
    small beta): alpha_c lies between 1.0 and 1.5; the engine collapses just below it and not just above."""
    spec = load_spec(ROOT / "model_specs" / "paper001-fig1-bert60.yaml")
    a, _ = alpha_c(spec, 0.99)
    assert 1.0 < a < 1.5
    assert max_rho(spec, skip_a=a - 0.01) >= 0.99 > max_rho(spec, skip_a=a + 0.01)


def test_alpha_c_none_when_unreachable():
    spec = replace(load_spec(ROOT / "model_specs" / "paper001-fig1-bert60.yaml"), layers=60)
    a, why = alpha_c(spec, 0.01)  # rho_max below the input's own correlation after one block
    assert a is None and "no skip strength" in why


@pytest.mark.parametrize("path", SPECS + HF_CONFIGS, ids=[p.parent.name if p.name == "config.json" else p.stem
                                                         for p in SPECS + HF_CONFIGS])
def test_patched_spec_passes_check(path, tmp_path):
    out = tmp_path / "patched.yaml"
    r = run("recommend", path, "--format", "json", "--out", out)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["schema"] == "initadvisor.recommend/1"
    for key in ("beta_c", "beta_c_per_layer", "beta_recommended", "qk_std", "alpha_c", "alpha_c_mlp", "tau",
                "tau_per_layer", "deepscalelm", "recipes", "patched_spec"):
        assert key in rep
    assert rep["beta_recommended"] < rep["beta_c"] / 2
    assert {r["name"] for r in rep["recipes"]} >= {"as-given", "critical", "deepscalelm", "gpt2", "deepnorm",
                                                   "t-fixup", "admin"}
    assert run("check", out).returncode == 0
    assert build_spec(rep["patched_spec"]) == load_spec(out)


def test_tau_is_eq47_of_the_predicted_geometry():
    """tau_per_layer is Noci eq. 47 at each attention input of the recommended (critical) model."""
    spec = load_spec(ROOT / "model_specs" / "bert-base.yaml")
    rep = recommend(spec)
    assert rep["patched_recipe"] == "critical"
    t = propagate(from_spec(build_spec(rep["patched_spec"])), backward=False)  # the mean field's, as eq. 47's
    d, n = spec.d_model, spec.seq_len
    for i, tau in enumerate(rep["tau_per_layer"]):
        rho = t.p[i] / t.q[i]  # post-LN: block i+1 sees the stream after block i, q = 1 (or 1/(1-p))
        sx2 = t.q[i]
        closed = math.sqrt(d * n * (1 + rho * (n - 1)) / (sx2**2 * (1 - rho) ** 2 * (n + d) * (n - 1)))
        assert tau == pytest.approx(closed, rel=1e-4)
    assert rep["tau"] == pytest.approx(float(np.median(rep["tau_per_layer"])), rel=1e-5)


def test_deepscalelm_block_follows_the_paper():
    spec = load_spec(ROOT / "model_specs" / "gpt2-small.yaml")
    ds = recommend(spec, k=2)["deepscalelm"]
    N, d, p = spec.layers, spec.d_model, spec.dropout
    assert ds["lambda2"] == pytest.approx(1 - 2 / N, rel=1e-5) and ds["beta2"] == pytest.approx(2 / N, rel=1e-5)
    assert ds["sigma_e2"] == pytest.approx((1 - p) / 2, rel=1e-5)  # two embedding tables
    assert ds["sigma_qk2"] == pytest.approx(1 / d, rel=1e-5)
    assert ds["sigma_f2"] == pytest.approx(math.sqrt((1 - p) / 2) / d, rel=1e-5)  # not sqrt(1-p)/(2d)
    assert len(ds["sigma_vo2_per_layer"]) == N


def test_recipe_constants():
    from initadvisor.recipes import recipe_deepnorm, recipe_gpt2, recipe_tfixup

    spec = load_spec(ROOT / "model_specs" / "bert-base.yaml")
    N, d = spec.layers, spec.d_model
    assert recipe_gpt2(spec).spec.init["o"].std == pytest.approx(0.02 / math.sqrt(2 * N))
    dn = recipe_deepnorm(spec).spec  # DeepNet: alpha = (2N)^(1/4), beta = (8N)^(-1/4), Xavier
    assert dn.res_attention.skip == pytest.approx((2 * N) ** 0.25)
    assert dn.init["v"].std == pytest.approx((8 * N) ** -0.25 * math.sqrt(2 / (2 * d)))
    tf = recipe_tfixup(spec).spec  # T-Fixup encoder: 0.67 N^(-1/4), no LayerNorm
    assert tf.norm == "none" and tf.init["o"].std == pytest.approx(0.67 * N**-0.25 * math.sqrt(1 / d))


def test_yaml_format_prints_the_patched_spec(tmp_path):
    r = run("recommend", ROOT / "model_specs" / "entropy-collapse.yaml", "--format", "yaml")
    assert r.returncode == 0
    f = tmp_path / "p.yaml"
    f.write_text(r.stdout)
    assert run("check", f).returncode == 0  # the entropy-collapse spec, repaired
    assert run("check", ROOT / "model_specs" / "entropy-collapse.yaml").returncode == 1


def test_table_output_and_k():
    r = run("recommend", ROOT / "model_specs" / "bert-base.yaml")
    assert r.returncode == 0 and "alpha_c" in r.stdout and "def init_weights" in r.stdout
    assert run("recommend", ROOT / "model_specs" / "bert-base.yaml", "--k", "0").returncode == 2
    big = json.loads(run("recommend", ROOT / "model_specs" / "bert-base.yaml", "--k", "50", "--format", "json").stdout)
    assert big["deepscalelm"]["beta2"] == pytest.approx(0.5) and "k/N" not in big["deepscalelm"]["caveats"][0]


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "gpt_neox", "falcon", "opt", "mixtral"])
def test_init_weights_snippet_sets_the_stds_on_real_models(family):
    """The pasted `init_weights` gives every matrix of a real HuggingFace model the recommended std."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from initadvisor.hf import import_config

    cfg_path = ROOT / "tests" / "data" / "hf" / family / "config.json"
    spec, _ = import_config(cfg_path)
    rep = recommend(spec)
    ns: dict = {}
    exec(rep["init_weights"], ns)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(cfg_path.parent))
    done = ns["init_weights"](model)
    want = build_spec(rep["patched_spec"]).init
    weights = {n: m.weight for n, m in model.named_modules() if hasattr(m, "weight")} | dict(model.named_parameters())
    seen = set()
    for name, role in done.items():
        w = weights[name].detach()  # a module's weight, or a mixture of experts' stacked parameter
        if role in ("q", "k", "v", "o", "ff_in", "ff_out") and w.numel() > 2000:
            assert float(w.std()) == pytest.approx(want[role].std, rel=0.06), (name, role)
            seen.add(role)
    assert seen >= {"o", "ff_in", "ff_out"}


def test_causal_recipe_is_judged_on_its_own_per_layer_model():
    """gpt2-small's DeepScaleLM recipe has per-layer V/O variances: the causal (position-resolved) analysis of
    the recipe runs on them. Reference: the same blocks built by hand from the per-layer gains. Before the fix the
    analysis ran the spec without its per-layer values: late-token rho 0.427 instead of 0.728 (0.733 before two rows
    weighed a repeated token by its copy weight)."""
    from initadvisor import recipes as R
    from initadvisor.core.causal import propagate_overlaps
    from initadvisor.core.ops import block
    from initadvisor.diagnose import analyse, diagnose
    from initadvisor.stack import from_spec, input_moments

    spec = load_spec(ROOT / "model_specs" / "gpt2-small.yaml")
    recipe = R.recipe_deepscalelm(spec, R.dslm(spec, 2.0))
    assert recipe.per_layer  # the case in question: values the spec format cannot hold
    own = from_spec(recipe.spec).layers  # the spec's blocks (block 1 reads the tokens' repeats), no per-layer values
    hand = [block(replace(P, g_v=float(gv), g_o=float(go)))
            for P, gv, go in zip(own, recipe.per_layer["g_v"], recipe.per_layer["g_o"])]
    want = propagate_overlaps(hand, *input_moments(recipe.spec), spec.seq_len,
                              repeats=from_spec(recipe.spec).embeddings.repeats()).rho_thirds[-1, 2]
    a = analyse(recipe.spec, recipe.stack())
    assert a.ct.rho_thirds[-1, 2] == pytest.approx(want, rel=1e-12)
    assert want - analyse(recipe.spec).ct.rho_thirds[-1, 2] > 0.25  # the spec alone differs: 0.427
    row = next(r for r in recommend(spec)["recipes"] if r["name"] == "deepscalelm")
    assert row["findings"] == sorted({f.code for f in diagnose(recipe.spec, a)})


def test_recipes_beyond_the_budget_are_compared_on_the_late_token_pair(monkeypatch):
    """Past RECIPE_CELLS an analysis (a 999-layer windowed MoE stack at T 10000 took 150 s), the recipes' rows run the
    pair engine and say so, and the patched recipe is analysed as `check` analyses it: its row is check's verdict on
    the patched spec and has no such note. Within the budget every row is position-resolved (gpt2-small)."""
    from initadvisor import diagnose, recipes as R

    spec = load_spec(ROOT / "model_specs" / "gpt2-small.yaml")
    cells = diagnose.resolved_cells(R.Recipe("as-given", "", "", spec).stack())
    assert cells <= R.RECIPE_CELLS
    deep = R.Recipe("as-given", "", "", replace(spec, layers=1682)).stack()  # 12 s an analysis: 105 s when resolved
    assert diagnose.resolved_cells(deep) > R.RECIPE_CELLS
    window = build_spec({"model": {"layers": 22, "d_model": 64, "heads": 1, "sliding_window": 6},
                         "sequence": {"length": 512}})  # fuzz seed 121: 3.9 s an analysis, recommend 33 s resolved
    assert diagnose.resolved_cells(R.Recipe("as-given", "", "", window).stack()) > R.RECIPE_CELLS
    llama = build_spec({"model": {"layers": 32, "d_model": 64, "heads": 2, "norm": "pre", "causal": True,
                                  "rope_theta": 500000.0}, "sequence": {"length": 131072}})  # Llama-3.1-8B's depth and T:
    assert diagnose.resolved_cells(R.Recipe("as-given", "", "", llama).stack()) > R.RECIPE_CELLS  # 5.5 s an analysis
    within = recommend(spec)
    assert not any("late-token pair" in n for r in within["recipes"] for n in r["notes"])
    monkeypatch.setattr(R, "RECIPE_CELLS", cells - 1)
    rep = recommend(spec)
    rows = {r["name"]: r for r in rep["recipes"]}
    chosen = rows[rep["patched_recipe"]]
    assert rep["patched_recipe"] != "as-given" and not any("late-token pair" in n for n in chosen["notes"])
    assert chosen == next(r for r in within["recipes"] if r["name"] == rep["patched_recipe"])
    assert diagnose.check(build_spec(rep["patched_spec"]))["verdict"] == chosen["verdict"] == "pass"
    paired = [r for r in rep["recipes"] if r["name"] not in ("as-given", rep["patched_recipe"]) and
              r["verdict"] != "undefined"]
    assert paired and all(any("late-token pair" in n for n in r["notes"]) for r in paired)
    assert rows["as-given"] == within["recipes"][0]
    assert any(r != next(w for w in within["recipes"] if w["name"] == r["name"]) for r in paired)
    alibi = build_spec({"model": {"layers": 12, "d_model": 256, "heads": 8, "norm": "pre", "causal": True,
                                  "alibi": True}, "sequence": {"length": 512, "vocab": 5000}})
    assert diagnose.resolved_cells(R.Recipe("as-given", "", "", alibi).stack()) > R.RECIPE_CELLS  # 40 s


def test_mixture_of_experts_cells_count_twice():
    """The recipes' budget counts a MoE stack's position-resolved cells twice (fuzz seed 111: a 25-layer windowed
    stack of 1827 experts at T 512 took 59 s in recommend; its routing statistics per pair cost 2.1 us a cell
    against 1.3 us dense): the same stack without experts counts half."""
    from initadvisor.diagnose import resolved_cells
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    base = {"model": {"layers": 4, "d_model": 32, "heads": 4, "causal": True}, "sequence": {"length": 64}}
    for extra in ({}, {"model": {**base["model"], "sliding_window": 8}}):
        dense = from_spec(build_spec({**base, **extra}))
        moe = from_spec(build_spec({**base, **extra, "moe": {"experts": 4, "top_k": 2}}))
        assert resolved_cells(dense) > 0 and resolved_cells(moe) == 2 * resolved_cells(dense)


def test_post_ln_causal_cells_count_the_walk():
    """The recipes' budget counts a post-LN causal stack's position-resolved cells WALK_COST times (its rho walk,
    walk.causal_factor, about 7x the run); the same stack pre-LN, or past WALK_CELLS, once."""
    from initadvisor.core import model
    from initadvisor.diagnose import resolved_cells
    from initadvisor.spec import build_spec
    from initadvisor.stack import from_spec

    base = {"model": {"layers": 4, "d_model": 32, "heads": 4, "causal": True}, "sequence": {"length": 64}}
    post, pre = (from_spec(build_spec({**base, "model": {**base["model"], "norm": n}})) for n in ("post", "pre"))
    assert resolved_cells(post) == model.WALK_COST * resolved_cells(pre) > 0
    deep = from_spec(build_spec({**base, "model": {**base["model"], "norm": "post", "layers": 200}}))
    shallow = from_spec(build_spec({**base, "model": {**base["model"], "norm": "pre", "layers": 200}}))
    assert resolved_cells(deep) == resolved_cells(shallow)  # 201 x 1024 cells: past WALK_CELLS, no walk


def test_a_recipe_whose_skip_overflows_its_fourth_power_is_reported():
    """Fuzz seed 131: a sigmoid router of std 3e5 over one expert led a recipe to a residual skip of 4e126, whose
    fourth power (a token's mean-square spread) raised OverflowError from Python's float power: `recommend` died with
    an internal error. The spread now overflows to inf like the moments, and the report stays finite."""
    spec = build_spec({"model": {"layers": 15, "d_model": 896, "heads": 64},
                       "moe": {"experts": 1, "router": "sigmoid", "router_std": 321170.85339216527}})
    rep = recommend(spec, rho_max=0.734088034316045, k=0.1108927381494052, alpha_mlp=True)
    json.dumps(rep, allow_nan=False)
    assert rep["recipes"] and rep["patched_recipe"]
