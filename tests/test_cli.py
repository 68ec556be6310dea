"""The `check` command as a user runs it: JSON contract, exit codes, overrides, bad input."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT, SPECS

GOOD = """\
model:
  layers: 4
  d_model: 64
  heads: 4
"""


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "initadvisor", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


def strict_json(text):
    def no_nan(c):
        raise AssertionError(f"non-finite number in JSON: {c}")

    return json.loads(text, parse_constant=no_nan)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_check_json_contract_on_shipped_specs(path):
    r = run("check", path, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    rep = strict_json(r.stdout)
    assert rep["schema"] == "initadvisor.check/1" and rep["version"]
    assert rep["verdict"] == ("pass" if r.returncode == 0 else "fail")
    layers, n = rep["layers"], rep["spec"]["model"]["layers"]
    assert [row["index"] for row in layers] == list(range(n + 1))
    assert set(layers[0]) >= {"index", "q", "p", "rho"}
    for row in layers[1:]:
        assert set(row) >= {"q", "p", "rho", "beta", "beta_c", "ipr", "attention_phase"}
        assert row["attention_phase"] in ("uniform", "crossover", "localized")
        assert row["rho"] == pytest.approx(row["p"] / row["q"], rel=1e-4)
        assert 0 < row["ipr"] <= 1 and row["q"] > 0
    for f in rep["findings"]:
        assert set(f) == {"code", "severity", "message", "layer", "source"}
        assert f["severity"] in ("error", "warning", "info")
    table = run("check", path)
    assert table.returncode == r.returncode and "verdict" in table.stdout


def test_gate_outcomes_of_shipped_specs():
    codes = {p.stem: run("check", p, "--format", "json") for p in SPECS}
    assert codes["bert-base"].returncode == 0
    assert codes["gpt2-small"].returncode == 0
    fig1 = strict_json(codes["paper001-fig1-bert60"].stdout)
    assert fig1["verdict"] == "fail" and "IA101" in {f["code"] for f in fig1["findings"]}
    ent = strict_json(codes["entropy-collapse"].stdout)
    assert ent["verdict"] == "fail" and "IA201" in {f["code"] for f in ent["findings"]}
    gpt2 = strict_json(codes["gpt2-small"].stdout)
    assert "IA901" in {f["code"] for f in gpt2["findings"]}  # causal: late-token approximation noted


def test_fail_on_and_overrides(tmp_path):
    spec = ROOT / "model_specs" / "deep-preln-96.yaml"  # a warning (collapse trend) and no error
    assert run("check", spec, "--format", "json").returncode == 0
    assert run("check", spec, "--fail-on", "warning", "--format", "json").returncode == 1
    assert run("check", ROOT / "model_specs" / "paper001-fig1-bert60.yaml", "--fail-on", "never").returncode == 0
    base = strict_json(run("check", ROOT / "model_specs" / "bert-base.yaml", "--format", "json").stdout)
    over = strict_json(run("check", ROOT / "model_specs" / "bert-base.yaml", "--format", "json", "--seq-len", "128",
                           "--input-correlation", "0.5", "--dropout", "0").stdout)
    assert over["spec"]["sequence"]["length"] == 128 and over["spec"]["dropout"] == 0
    assert over["layers"][0]["rho"] == pytest.approx(0.5) and base["layers"][0]["rho"] != over["layers"][0]["rho"]


BAD = [
    ("model:\n  layers: 4\n  d_modle: 64\n  heads: 4\n", 3, "did you mean 'd_model'"),
    ("model:\n  layers: four\n  d_model: 64\n  heads: 4\n", 2, "model.layers"),
    ("model:\n  layers: 0\n  d_model: 64\n  heads: 4\n", 2, "must be >= 1"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 5\n", 4, "must divide d_model"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\ndropout: .nan\n", 5, "must be finite"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\ndropout: 1.5\n", 5, "probability"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: [4\n", 5, "malformed YAML"),
    ("model:\n  layers: 4\n  d_model: 64\n", None, "model.heads: required key missing"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\n  norm: postln\n", 5, "did you mean 'post'"),
    ("model:\n  layers: 4\n  layers: 5\n  d_model: 64\n  heads: 4\n", 3, "duplicate key"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\ninit:\n  q: {std: 0.02, gain: 1}\n", 6, "either std or gain"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\nlatent_attention:\n  kv_rank: 16\n  v_dim: 16\n", 5,
     "latent_attention.nope_dim: required key missing"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\n  norm: post\nlatent_attention: {kv_rank: 16, nope_dim: 8, "
     "rope_dim: 0, v_dim: 16}\n", 6, "behind a unit norm"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\n  norm: pre\nlatent_attention: {kv_rank: 16, nope_dim: 8, "
     "rope_dim: 4, v_dim: 16}\n", 6, "need model.rope_theta"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\n  norm: pre\n  rope_theta: 100\nlatent_attention: {kv_rank: "
     "16, nope_dim: 8, rope_dim: 3, v_dim: 16}\n", 7, "must be even"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\n  norm: pre\n  qk_norm: head\nlatent_attention: {kv_rank: 16, "
     "nope_dim: 8, rope_dim: 0, v_dim: 16}\n", 6, "qk_norm is not modelled"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\n  alibi: true\n", 5, "modelled for causal attention"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\n  causal: true\n  alibi: true\n  sliding_window: 8\n", 6,
     "ALiBi together with a sliding window"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\nmoe: {experts: 8, top_k: 4, groups: 4, top_groups: 1}\n", 5,
     "must hold top_k"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\n  alibi_scale: 0.5\n", 5, "set model.alibi: true"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\nmoe: {experts: 6, groups: 4}\n", 5, "groups of at least 2"),
    ("model:\n  layers: 4\n  d_model: 64\n  heads: 4\nmlp_dropout: 1.0\n", 5, "probability"),
    ("", 1, "empty spec"),
    ("- 1\n- 2\n", 1, "top level must be a mapping"),
]


@pytest.mark.parametrize("text,line,needle", BAD, ids=[b[2] for b in BAD])
def test_bad_spec_is_one_clear_line(tmp_path, text, line, needle):
    f = tmp_path / "spec.yaml"
    f.write_text(text)
    r = run("check", f)
    assert r.returncode == 2
    err = r.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert needle in err and "spec.yaml" in err
    if line is not None:
        assert f"spec.yaml:{line}:" in err


def test_unreadable_inputs(tmp_path):
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00garbage")
    for target, needle in [(tmp_path / "missing.yaml", "no such file"), (tmp_path, "directory"),
                           (tmp_path / "bin.yaml", "UTF-8")]:
        r = run("check", target)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_usage_errors_exit_2(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(GOOD)
    assert run("check", f, "--format", "xml").returncode == 2
    assert run("check", f, "--seq-len", "1").returncode == 2
    assert run("check", f, "--dropout", "1").returncode == 2
    assert run("check").returncode == 2


def test_every_spec_command_reads_the_project_config(tmp_path):
    """A bad [tool.initadvisor] is refused by every command that reads a spec, as by check: recommend must never
    write a spec that check then refuses in the same folder."""
    (tmp_path / "pyproject.toml").write_text("[tool.initadvisor.thresholds]\ngrad_vanish = 1e-300\n")
    (tmp_path / "s.yaml").write_text(GOOD)
    for args in (["check"], ["recommend"], ["verify", "--seeds", "1"], ["diagram", "--grid", "2"],
                 ["sweep", "--depth", "1,2"], ["plot", "--png", "p.png"]):
        r = run(args[0], "s.yaml", *args[1:], cwd=tmp_path)
        assert r.returncode == 2 and "pyproject.toml:2" in r.stderr and "grad_vanish" in r.stderr, (args, r.stderr)


@pytest.mark.parametrize("name", ["new\nline.yaml", "cr\rreturn.yaml", "sep\u2028line.yaml"])
def test_patched_spec_of_a_file_with_a_line_break_in_its_name(tmp_path, name):
    """The patched file's header comment names the spec on one line: a line break in the file name ended the comment
    and left the rest of the name as a YAML line that `check` refused (fuzz seed 81)."""
    spec = tmp_path / name
    spec.write_text("model:\n  layers: 2\n  d_model: 8\n  heads: 2\n")
    out = tmp_path / "patched.yaml"
    r = run("recommend", spec, "--out", out)
    assert r.returncode == 0, r.stderr
    assert out.read_text().splitlines()[0].startswith("# initadvisor recommend:")
    c = run("check", out)
    assert c.returncode == 0, c.stderr


def test_imported_spec_of_a_config_under_a_line_break(tmp_path):
    """import's header names the config on one line, as recommend's (the same class: the rest of the path became a
    YAML line that `check` refused)."""
    folder = tmp_path / "a\nb"
    folder.mkdir()
    (folder / "config.json").write_text((ROOT / "tests" / "data" / "hf" / "llama" / "config.json").read_text())
    r = run("import", folder / "config.json")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "imported.yaml"
    out.write_text(r.stdout)
    c = run("check", out)
    assert c.returncode == 0, c.stderr
