"""Hostile input: whatever a user (or a fuzzer) feeds `initadvisor check`, the tool either answers with a
finite report (exit 0/1) or refuses with exit 2 and exactly one line on stderr: never a traceback, never a
hang, never unbounded memory.

- the fuzz corpus (tests/fuzz/bad, tests/fuzz/ok; regenerate with `python tests/fuzz/make_corpus.py`) and
  large cases generated here, through the real CLI in subprocesses (2 GB address-space limit, 5 s each);
- the same corpus in-process through load_spec (fast, better failure messages);
- property-based: random VALID specs (hypothesis) through build_spec + diagnose.check: no exception, no
  NaN/inf anywhere, rho in [-1, 1], q > 0, grad_q >= 0, deterministic;
- depth: a 100000-layer spec stays finite.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ROOT
from initadvisor.diagnose import check
from initadvisor.spec import SpecError, build_spec, load_spec

FUZZ = ROOT / "tests" / "fuzz"
BAD = sorted((FUZZ / "bad").glob("*.yaml"))
OK = sorted((FUZZ / "ok").glob("*.yaml"))
TIME_LIMIT_S = 30.0  # per CLI call: the subprocess timeout, a hang guard (a read that never ends), not a timing check
MEM_LIMIT = 2 * 1024**3  # RLIMIT_AS of each CLI subprocess
MB5 = 5 * 1024 * 1024
BASE = "model:\n  layers: 4\n  d_model: 64\n  heads: 4\n"


# --------------------------------------------------------------------------------------------- helpers


def strict_json(text):
    def no_nan(c):
        raise AssertionError(f"non-finite number in JSON: {c}")

    return json.loads(text, parse_constant=no_nan)


def non_finite(x, path="$"):
    """Paths of every NaN/inf float in a nested report."""
    if isinstance(x, float):
        return [] if math.isfinite(x) else [f"{path}={x}"]
    if isinstance(x, dict):
        return [p for k, v in x.items() for p in non_finite(v, f"{path}.{k}")]
    if isinstance(x, (list, tuple)):
        return [p for i, v in enumerate(x) for p in non_finite(v, f"{path}[{i}]")]
    return []


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_cli(path, *args, timeout=TIME_LIMIT_S + 2):
    """(returncode or 'timeout', stdout, stderr, seconds) of `python -m initadvisor check PATH ARGS`."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "",
           "COLUMNS": "100"}
    t = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "initadvisor", "check", str(path), *args], capture_output=True,
                           timeout=timeout, preexec_fn=_limit, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        return "timeout", e.stdout or b"", e.stderr or b"", time.perf_counter() - t
    return r.returncode, r.stdout, r.stderr, time.perf_counter() - t


def run_forked(path, *args, timeout=TIME_LIMIT_S + 2):
    """Like run_cli, without the interpreter start-up: a forked child (same 2 GB limit) runs the CLI's real
    entry point `initadvisor.cli.main()` with fresh stdout/stderr on pipes and exits with its code. An
    uncaught exception prints its traceback and exits 1, as `python -m initadvisor` would."""
    import initadvisor.cli  # noqa: F401  (imported before forking: the child only runs it)

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            import io
            import traceback

            _limit()
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (out_r, err_r, out_w, err_w):
                os.close(fd)
            enc = sys.getfilesystemencoding()
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=enc, errors="strict")
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=enc,
                                          errors="backslashreplace", line_buffering=True)
            sys.argv = ["initadvisor", "check", str(path), *args]
            os.chdir(ROOT)
            try:
                from initadvisor.cli import main

                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    chunks = {out_r: [], err_r: []}
    import selectors

    sel = selectors.DefaultSelector()
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    deadline = t + timeout
    timed_out = False
    while sel.get_map():
        left = deadline - time.perf_counter()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(left):
            data = os.read(key.fd, 1 << 16)
            if data:
                chunks[key.fd].append(data)
            else:
                sel.unregister(key.fd)
    sel.close()
    if timed_out:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    secs = time.perf_counter() - t
    os.close(out_r)
    os.close(err_r)
    rc = "timeout" if timed_out else os.waitstatus_to_exitcode(status)
    return rc, b"".join(chunks[out_r]), b"".join(chunks[err_r]), secs


def assert_clean_refusal(res, path):
    rc, out, err, secs = res
    text = err.decode("utf-8", "replace")
    assert rc == 2, f"{path}: exit {rc} after {secs:.1f}s, stderr:\n{text[-1500:]}"
    assert "Traceback" not in text, text[-1500:]
    lines = text.splitlines()  # \r, \x85, \u2028 ... break a line in a terminal or CI log too
    assert len(lines) == 1 and text.endswith("\n"), f"{path}: stderr is not one line: {text[:500]!r}"
    assert lines[0].startswith("initadvisor: error: "), lines[0]  # a hang shows as rc "timeout" (run_cli)


# --------------------------------------------------------------------------------------------- generated cases


def generated_cases(d: Path) -> dict[str, Path]:
    """Large and special cases, written here rather than stored: name -> path."""
    cases = {
        "deep-nesting-10000-flow-lists.yaml": "[" * 10000 + "]" * 10000,
        "deep-nesting-10000-block-lists.yaml": "- " * 10000 + "x\n",
        "deep-nesting-100000-flow-mappings.yaml": "{a: " * 100000 + "}" * 100000,
        "deep-nesting-10000-under-model.yaml": "model:\n  layers: " + "[" * 10000 + "]" * 10000 + "\n",
        "int-5000-digits-layers.yaml": "model:\n  layers: " + "9" * 5000 + "\n  d_model: 64\n  heads: 4\n",
        "int-5000-digits-std.yaml": BASE + "init:\n  std: " + "9" * 5000 + "\n",
        "key-1mb.yaml": BASE + "  " + "k" * (1 << 20) + ": 1\n",
        "5mb-comments-then-bad-key.yaml": BASE + "# padding comment line\n" * (MB5 // 23) + "bogus_key: 1\n",
        "5mb-flow-list.yaml": BASE + "dropout: [" + "0, " * (MB5 // 3) + "0]\n",
        "5mb-block-list.yaml": BASE + "dropout:\n" + "- 0\n" * (MB5 // 4),
        "5mb-string-then-bad-value.yaml": 'name: "' + "x" * MB5 + '"\n' + BASE + "  norm: 7\n",
        "5mb-garbage.yaml": ("abc: -[]{}\n#'\"" * (MB5 // 14)),
        "5mb-aliases.yaml": "a: &a [1]\n" + "b: [" + "*a, " * (MB5 // 4) + "*a]\n",
    }
    out = {}
    for name, text in cases.items():
        p = d / name
        p.write_text(text)
        out[name] = p
    (d / "a-directory").mkdir()
    out["a-directory"] = d / "a-directory"
    (d / "hf-dir-without-config").mkdir()
    (d / "hf-dir-without-config" / "config.json.bak").write_text("{}")
    out["hf-dir-without-config"] = d / "hf-dir-without-config"
    out["missing-file.yaml"] = d / "does-not-exist.yaml"
    out["missing-dir/missing-file.yaml"] = d / "no-such-dir" / "x.yaml"
    loop = d / "symlink-loop.yaml"
    loop.symlink_to(loop)
    out["symlink-loop.yaml"] = loop
    out["dev-null"] = Path("/dev/null")
    # hostile config.json files take the HuggingFace import path
    for name, text in {
        "config-garbage.json": "{" * 100000,
        "config-list.json": "[1, 2]",
        "config-nan.json": '{"model_type": "bert", "num_hidden_layers": NaN, "hidden_size": 64, '
                           '"num_attention_heads": 4}',
        "config-5000-digits.json": '{"model_type": "bert", "num_hidden_layers": 1' + "0" * 5000
                                   + ', "hidden_size": 64, "num_attention_heads": 4}',
        "config-non-utf8.json": None,
    }.items():
        p = d / name
        if text is None:
            p.write_bytes(b'{"model_type": "b\xe9rt"}')
        else:
            p.write_text(text)
        out[name] = p
    return out


GENERATED = ["deep-nesting-10000-flow-lists.yaml", "deep-nesting-10000-block-lists.yaml",
             "deep-nesting-100000-flow-mappings.yaml", "deep-nesting-10000-under-model.yaml",
             "int-5000-digits-layers.yaml", "int-5000-digits-std.yaml", "key-1mb.yaml",
             "5mb-comments-then-bad-key.yaml", "5mb-flow-list.yaml", "5mb-block-list.yaml",
             "5mb-string-then-bad-value.yaml", "5mb-garbage.yaml", "5mb-aliases.yaml", "a-directory",
             "hf-dir-without-config", "missing-file.yaml", "missing-dir/missing-file.yaml", "symlink-loop.yaml",
             "dev-null", "config-garbage.json", "config-list.json", "config-nan.json", "config-5000-digits.json",
             "config-non-utf8.json"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    cases = generated_cases(tmp_path_factory.mktemp("hostile"))
    assert sorted(cases) == sorted(GENERATED)
    return cases


@pytest.fixture(scope="module")
def cli_results(generated):
    """Every CLI case run once: a sample (a dozen cases, one 5 MB file among them) through
    `python -m initadvisor` in real subprocesses, two at a time; the rest through forked children running
    the same entry point, `initadvisor.cli.main()` (interpreter start-up would dominate: ~0.4 s a call)."""
    real = {("gen", n): (generated[n], ("--format", "json"))
            for n in ("5mb-flow-list.yaml", "a-directory", "missing-file.yaml", "deep-nesting-10000-flow-lists.yaml")}
    real.update({("bad", p.name): (p, ("--format", "json")) for p in BAD[::20]})
    real.update({("ok-json", p.name): (p, ("--format", "json")) for p in OK[::10]})
    forked = {("bad", p.name): (p, ("--format", "json")) for p in BAD}
    forked.update({("gen", n): (p, ("--format", "json")) for n, p in generated.items()})
    for p in OK:
        forked[("ok-json", p.name)] = (p, ("--format", "json"))
        forked[("ok-table", p.name)] = (p, ())
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {k: pool.submit(run_cli, p, *a) for k, (p, a) in real.items()}
        results = {k: f.result() for k, f in futures.items()}
    results.update({k: run_forked(p, *a) for k, (p, a) in forked.items() if k not in real})
    return results


# --------------------------------------------------------------------------------------------- CLI: refusals


def test_corpus_is_present():
    assert len(BAD) >= 100 and len(OK) >= 20, "run python tests/fuzz/make_corpus.py"


@pytest.mark.parametrize("path", BAD, ids=[p.name for p in BAD])
def test_cli_refuses_bad_file(path, cli_results):
    assert_clean_refusal(cli_results[("bad", path.name)], path)


@pytest.mark.parametrize("name", GENERATED)
def test_cli_refuses_generated_case(name, generated, cli_results):
    assert_clean_refusal(cli_results[("gen", name)], name)


@pytest.mark.parametrize("path", OK, ids=[p.name for p in OK])
def test_cli_answers_odd_but_valid_file(path, cli_results):
    for fmt in ("ok-json", "ok-table"):
        rc, out, err, secs = cli_results[(fmt, path.name)]
        text = err.decode("utf-8", "replace")
        assert rc in (0, 1), f"{path.name} ({fmt}): exit {rc}, stderr:\n{text[-1500:]}"
        assert "Traceback" not in text  # a hang shows as rc "timeout", failing the exit-code check
        if fmt == "ok-json":
            rep = strict_json(out.decode())
            assert rep["verdict"] == ("pass" if rc == 0 else "fail")


def test_unsafe_tags_were_not_executed(cli_results):
    assert ("bad", "python-object-apply.yaml") in cli_results
    assert not Path("/tmp/initadvisor-pwned").exists()


# --------------------------------------------------------------------------------------------- in-process


@pytest.mark.parametrize("path", BAD, ids=[p.name for p in BAD])
def test_load_spec_refuses_bad_file(path):
    with pytest.raises(SpecError) as e:
        load_spec(path)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, repr(msg)
    assert msg.startswith(str(path)), msg


@pytest.mark.parametrize("path", OK, ids=[p.name for p in OK])
def test_load_spec_accepts_odd_file(path):
    rep = check(load_spec(path))
    assert not non_finite(rep)
    json.dumps(rep, allow_nan=False)


# --------------------------------------------------------------------------------------------- valid specs

try:  # a declared test dependency; without it only the property test below is skipped, not the corpus tests
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:
    st = None


def _floats(lo, hi, log=False):
    if log:
        return st.floats(math.log(lo), math.log(hi)).map(lambda x: float(f"{math.exp(x):.6g}"))
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def valid_specs(draw, max_layers=2000):
    """Spec dicts inside the schema's ranges (every key optional except the required three); a hypothesis
    strategy through `st.composite(valid_specs)`."""
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32, 64]))
    d_head = draw(st.sampled_from([1, 2, 8, 16, 32, 64, 128, 256]))
    norm = draw(st.sampled_from(["post", "pre", "none"]))
    model = {"layers": draw(st.one_of(st.integers(1, 24), st.integers(1, max_layers))),
             "d_model": heads * d_head, "heads": heads, "norm": norm}

    def opt(key, strat, into=model):
        if draw(st.booleans()):
            into[key] = draw(strat)

    opt("kv_heads", st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
    opt("d_ff", st.integers(1, 16384))
    opt("norm_type", st.sampled_from(["layernorm", "rmsnorm"]))
    opt("attention", st.sampled_from(["softmax", "centered"]))
    opt("out_proj", st.booleans())
    opt("causal", st.booleans())
    opt("activation", st.sampled_from(["relu", "gelu", "gelu_tanh", "silu", "tanh", "linear", "swiglu", "geglu"]))
    opt("softmax_scale", st.one_of(st.none(), _floats(1e-3, 10, log=True)))
    opt("embedding_norm", st.one_of(st.none(), st.booleans()))
    if norm == "pre":
        opt("parallel_residual", st.booleans())
    seq: dict = {}
    opt("length", st.one_of(st.integers(2, 8), st.integers(2, 100_000)), seq)
    opt("vocab", st.one_of(st.integers(1, 4), st.integers(1, 10**6)), seq)
    opt("input_correlation", st.one_of(st.just("auto"), st.just(0.0), _floats(0.0, 0.999)), seq)
    opt("embeddings", st.lists(st.sampled_from(["token", "position", "segment"]), min_size=1, max_size=3,
                               unique=True), seq)
    data: dict = {"model": model}
    if seq:
        data["sequence"] = seq
    opt("dropout", st.one_of(st.just(0.0), _floats(0.0, 0.9)), data)
    opt("attention_dropout", st.one_of(st.just(0.0), _floats(0.0, 0.9)), data)
    init: dict = {}
    opt("std", _floats(1e-4, 10, log=True), init)
    use_beta = draw(st.booleans())
    for m in ("q", "k", "v", "o", "ff_in", "ff_out", "embedding"):
        if (m in ("q", "k") and use_beta) or not draw(st.booleans()):
            continue
        e: dict = {}
        kind = draw(st.sampled_from(["std", "gain", None]))
        if kind == "std":
            e["std"] = draw(_floats(1e-4, 10, log=True))
        elif kind == "gain":
            e["gain"] = draw(_floats(1e-4, 100, log=True))
        opt("bias_std", st.one_of(st.just(0.0), _floats(0.0, 1.0)), e)
        init[m] = e
    if use_beta:
        opt("qk_beta", _floats(1e-3, 10, log=True), init)
    if init:
        data["init"] = init
    res = {}
    for branch in ("attention", "mlp"):
        if draw(st.booleans()):
            skip = draw(st.one_of(st.just(1.0), st.just(0.0), _floats(0.0, 10)))
            block = draw(st.one_of(st.just(1.0), _floats(0.0, 10)))
            res[branch] = {"skip": skip, "block": 1.0 if skip == 0 and block == 0 else block}
    if res:
        data["residual"] = res
    return data


def assert_sane_report(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy overflow warnings: the report is what counts
        rep = check(build_spec(json.loads(json.dumps(data))))
        again = check(build_spec(json.loads(json.dumps(data))))
    bad = non_finite(rep)
    assert not bad, f"non-finite values {bad[:6]} for spec {json.dumps(data)}"
    text = json.dumps(rep, allow_nan=False, sort_keys=True)
    assert text == json.dumps(again, allow_nan=False, sort_keys=True), "two runs differ"
    nulled = " ".join(f["message"] for f in rep["findings"] if f["code"] == "IA104")
    for row in rep["layers"]:
        for key, ok in (("rho", lambda v: -1.0 <= v <= 1.0), ("q", lambda v: v > 0), ("grad_q", lambda v: v > 0)):
            if row[key] is None:  # beyond the engine's range: null, and IA104 names the quantity
                assert f"{key} " in nulled, (row, nulled)
            else:
                assert ok(row[key]), row
    assert len(rep["layers"]) == data["model"]["layers"] + 1
    return rep


def test_valid_specs_give_finite_deterministic_reports():
    if st is None:
        pytest.importorskip("hypothesis")

    @settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(st.composite(valid_specs)())
    def prop(data):
        assert_sane_report(data)

    prop()


# Minimal valid specs the property test found (shrunk by hand): each yields NaN/inf in the report, and
# `check --format json` then dies in json.dumps(allow_nan=False) with a ValueError traceback (exit 1).
ENGINE_REGRESSIONS = {
    "none-norm-overflow": {"model": {"layers": 7, "d_model": 64, "heads": 4, "norm": "none"},
                           "init": {"std": 10.0}},
    "none-norm-default-width": {"model": {"layers": 50, "d_model": 64, "heads": 4, "norm": "none"},
                                "init": {"std": 1.0}},
    "pre-ln-mlp-skip-growth": {"model": {"layers": 737, "d_model": 1, "heads": 1, "norm": "pre"},
                               "residual": {"mlp": {"skip": 1.3}}},
    "swiglu-one-layer-wide": {"model": {"layers": 1, "d_model": 4096, "heads": 1, "activation": "swiglu"},
                              "init": {"std": 1.0}},
    "centered-identical-tokens": {"model": {"layers": 1, "d_model": 1, "heads": 1, "attention": "centered"},
                                  "sequence": {"vocab": 1, "embeddings": ["token"]},
                                  "residual": {"attention": {"skip": 0.0}}},
    # (benchmarks/fuzz.py, seed 3101: the distance-resolved engine's q was a Python float, whose ** raised
    # OverflowError within a block past the clamp; `check` and `sweep` exited "internal error")
    "windowed-long-context-skip-overflow": {"model": {"layers": 44, "d_model": 64, "heads": 1, "norm": "reordered",
                                                      "sliding_window": 82},
                                            "sequence": {"length": 20000}, "residual": {"mlp": {"skip": 1574.0}}},
}


@pytest.mark.parametrize("name", list(ENGINE_REGRESSIONS))
def test_engine_regressions_stay_finite(name):
    assert_sane_report(ENGINE_REGRESSIONS[name])


# --------------------------------------------------------------------------------------------- depth

DEPTH = 100_000  # its wall time (target < 10 s) is reported by benchmarks/deep_stack.py, not asserted here


def test_depth_100000_stays_finite():
    rep = check(build_spec({"model": {"layers": DEPTH, "d_model": 64, "heads": 4, "norm": "pre"}}))
    assert len(rep["layers"]) == DEPTH + 1
    assert not non_finite(rep)
    json.dumps(rep, allow_nan=False)
    assert all(-1 <= row["rho"] <= 1 and row["q"] > 0 and row["grad_q"] >= 0 for row in rep["layers"])


def test_verify_counts_the_address_space_limit(tmp_path):
    """Under a soft RLIMIT_AS (a CI runner's, a job scheduler's) `verify` refuses a network that would not fit in what
    is left of it, with one line and exit 2, where it used to pass the MemAvailable check and die in the allocator
    (the fuzzer's run: a 79M-row embedding table for torch under its address-space limit)."""
    spec = tmp_path / "big.yaml"
    spec.write_text("model: {layers: 1, d_model: 32, heads: 2, d_ff: 64}\nsequence: {length: 16, vocab: 20000000}\n")
    pytest.importorskip("torch")
    code = ("import resource, torch\n"
            "from initadvisor.cli import main\n"
            "from initadvisor.simulate import available_memory\n"
            "held = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
            "resource.setrlimit(resource.RLIMIT_AS, (held + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
            "assert available_memory() <= 1 << 30\n"
            f"main(['verify', {str(spec)!r}, '--backend', 'torch', '--seeds', '2'])\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "GiB" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


LATENT_WIDE = ("model: {layers: 2, d_model: 16, heads: 1, d_ff: 16, norm: pre, rope_theta: 10000}\n"
               "latent_attention: {kv_rank: 8, nope_dim: 64, rope_dim: %d, v_dim: 16, down_std: %g}\n"
               "sequence: {length: 64}\ninit: {std: 1.0}\n")


@pytest.mark.parametrize("rope,down", [(2, 1e-3), (6, 0.02), (0, 0.02), (2, 0.5)])
def test_verify_memory_counts_the_heads_as_drawn(rope, down):
    """The memory estimate holds at least the weights the numpy network draws, and the query and key projections
    the forward computes (T x heads x d_head floats each): latent attention's equivalent heads are rope_dim over the
    rotary key's share of the logits wide, 32 million coordinates at down_std 1e-3, where the estimate counted d_model
    and verify died allocating 9.75 GiB (the property test's run)."""
    import yaml

    from initadvisor.core.ops import leaves
    from initadvisor.simulate import memory_needed
    from initadvisor.stack import block_params, from_spec

    spec = build_spec(yaml.safe_load(LATENT_WIDE % (rope, down)))
    P = block_params(spec)
    drawn = sum(math.prod(shape) for ops in from_spec(spec).blocks for op in leaves(ops)
                for _, shape, *_ in (op.draws() or ()))
    assert drawn > 2 * spec.layers * spec.d_model * P.heads * P.d_head  # (the projections are counted)
    projections = 2 * spec.seq_len * P.heads * P.d_head
    assert memory_needed(spec, 1, 4) >= 4 * (drawn + spec.layers * projections)


def test_verify_refuses_latent_heads_too_wide_for_memory(tmp_path):
    """The spec of the property test's run: one line, exit 2, before allocating."""
    spec = tmp_path / "wide.yaml"
    spec.write_text(LATENT_WIDE % (2, 1e-3))
    res = subprocess.run([sys.executable, "-m", "initadvisor", "verify", str(spec), "--seeds", "1"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "GiB" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.parametrize("std,qk_beta", [(0.02, 0.5), (1.8e-8, 4e5), (1.26e-7, 0.13)])
def test_latent_qk_beta_round_trips_whatever_softmax_scale_it_needs(std, qk_beta):
    """Latent attention realises init.qk_beta by its softmax scale, which can leave model.softmax_scale's range
    (4e18, 1e11: two fuzz cases, where `recommend` refused its own spec with exit 2, and `plot` after a load-time
    refusal): the normalised spec writes qk_beta and not the scale that follows from it, as for the Q/K stds."""
    data = {"model": {"layers": 2, "d_model": 72, "heads": 12, "norm": "pre", "causal": True, "softmax_scale": 0.5},
            "latent_attention": {"kv_rank": 2480, "nope_dim": 3, "rope_dim": 0, "v_dim": 6},
            "init": {"std": std, "qk_beta": qk_beta}}
    spec = build_spec(data)
    back = build_spec(spec.to_dict())
    assert back.softmax_scale == pytest.approx(spec.softmax_scale, rel=1e-12) and back.qk_beta == qk_beta
    from initadvisor.stack import spec_beta

    assert spec_beta(back) == pytest.approx(qk_beta, rel=1e-12)


def test_deep_causal_stack_skips_the_position_resolved_engine():
    """The position-resolved engine costs ~1 ms a layer however short T: a 100000-layer causal stack at T = 6 (a fuzz
    case) took 100 s in `check`. From (layers + 1) x max(T, 1024) > 1e7 on, the late-token pair, noted."""
    from initadvisor.diagnose import causal_trace, notes
    from initadvisor.stack import from_spec

    spec = build_spec({"model": {"layers": 10000, "d_model": 64, "heads": 4, "norm": "pre", "causal": True},
                       "sequence": {"length": 6}})
    assert causal_trace(from_spec(spec)) is None
    assert any("max(T, 1024)" in n and "late-token pair" in n for n in notes(spec))
    assert causal_trace(from_spec(build_spec({**spec.to_dict(), "model": {**spec.to_dict()["model"],
                                                                          "layers": 9000}}))) is not None


def test_latent_attention_without_its_output_projection_is_refused():
    """Its moment-equivalent heads (stack._latent_equivalent) are not v_dim wide, so without an output projection
    the numpy and PyTorch networks could not be built: `check` accepted such a spec and `verify` crashed (a fuzz
    case). Refused at load, naming the key."""
    data = {"model": {"layers": 2, "d_model": 1, "heads": 1, "norm": "pre", "causal": True, "out_proj": False,
                      "rope_theta": 1e4},
            "latent_attention": {"kv_rank": 31, "nope_dim": 1, "rope_dim": 6, "v_dim": 1}}
    with pytest.raises(SpecError) as e:
        build_spec(data)
    assert e.value.key == "model.out_proj"
    build_spec({**data, "model": {**data["model"], "out_proj": True}})
