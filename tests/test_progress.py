"""Progress (issue 14): the library tells a callback its work as it goes; the CLI shows a transient bar on stderr
only when a person watches (table output, both streams a terminal, outside CI) and nothing otherwise."""

import io
import json
import os
import pty
import subprocess
import sys
import threading

import pytest

from conftest import ROOT

from initadvisor import api, cli, progress

SMALL = {"model": {"layers": 3, "d_model": 32, "heads": 2}, "sequence": {"length": 16, "vocab": 100}}
HF = ROOT / "tests/data/hf"


def recorded():
    calls = []
    return calls, lambda done, total: calls.append((done, total))


def counts_up(calls, total):
    """Every call has the same total, done never falls, and the last call says all is done."""
    assert calls, "progress was never told"
    assert {t for _, t in calls} == {total}, calls
    assert all(a <= b for (a, _), (b, _) in zip(calls, calls[1:])), calls
    assert calls[-1][0] == total and all(0 <= d <= total for d, _ in calls)


def test_verify_tells_each_seed_then_the_theory():
    calls, cb = recorded()
    api.verify(SMALL, seeds=3, progress=cb)
    assert calls == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]


def test_verify_torch_tells_each_seed():
    pytest.importorskip("torch")
    calls, cb = recorded()
    api.verify(SMALL, backend="torch", seeds=2, progress=cb)
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]


@pytest.mark.parametrize("kw, total", [({"width": [32, 64]}, 2 * 3), ({"depth": [2, 5]}, 5)])
def test_sweep_tells_each_block_profiled(kw, total):
    calls, cb = recorded()
    api.sweep(SMALL, progress=cb, **kw)
    counts_up(calls, total)
    assert len(calls) == total


def test_sweep_of_a_causal_spec_tells_each_block():
    calls, cb = recorded()
    api.sweep(ROOT / "model_specs/gpt2-small.yaml", depth=[2, 4], progress=cb)
    assert calls == [(i, 4) for i in range(1, 5)]


@pytest.mark.parametrize("x, grid", [("beta", 100), ("depth", 8)])
def test_diagram_tells_each_layer_of_each_chunk(x, grid):
    from initadvisor.phase_diagram import CHUNK

    calls, cb = recorded()
    spec = ROOT / "model_specs/bert-base.yaml"
    api.diagram(spec, x=x, grid=grid, progress=cb)
    layers = api.load(spec).layers
    chunks = -(-grid * grid // CHUNK) if x == "beta" else 1
    if x == "depth":  # the deepest grid point's layers, one chunk of the other axis
        layers = max(json.loads(api.diagram(spec, x=x, grid=grid).to_json())["x"]["values"])
    counts_up(calls, chunks * layers)
    assert len(calls) == chunks * layers


def test_audit_tells_the_build_each_tensor_and_the_check():
    pytest.importorskip("transformers")
    from initadvisor.audit import audit_config

    calls, cb = recorded()
    rep = audit_config(HF / "llama/config.json", layers=1, progress=cb)
    total = len(rep.tensors) + 3  # the build, the probe, each tensor, the check
    assert calls[0] == (1, 2)  # built: the audit's own steps are not known before
    counts_up(calls[1:], total)


def test_recommend_tells_the_analysis_the_solvers_and_each_recipe():
    calls, cb = recorded()
    rep = api.recommend(SMALL, progress=cb)
    assert calls == [(i, 9) for i in range(10)] and len(rep.recipes) == 8  # the spec's row, then seven recipes


def test_a_silent_progress_changes_nothing():
    """The reports are the same with and without a callback (verify's own wall time aside)."""
    a = json.loads(api.verify(SMALL, seeds=2, progress=lambda *_: None).to_json())
    b = json.loads(api.verify(SMALL, seeds=2).to_json())
    a["measurement"].pop("seconds"), b["measurement"].pop("seconds")
    assert a == b
    assert api.sweep(SMALL, width=[32, 64], progress=lambda *_: None).to_json() == api.sweep(SMALL, width=[32, 64]).to_json()


def alive():
    return {t for t in threading.enumerate() if t.is_alive()}


class Terminal(io.StringIO):
    def isatty(self):
        return True


def in_terminal(monkeypatch, args, delay=0.0, env=None):
    """Run the CLI in-process with both streams a (fake) terminal; returns (exit code, stdout, stderr)."""
    out, err = Terminal(), Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(progress, "DELAY", delay)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as e:
        cli.main([str(a) for a in args])
    return e.value.code, out.getvalue(), err.getvalue()


@pytest.fixture
def small_spec(tmp_path):
    import yaml

    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


@pytest.mark.parametrize("args, steps", [
    (["verify", "{spec}", "--seeds", "2"], "3/3"),
    (["sweep", "{spec}", "--width", "32,64"], "6/6"),
    (["diagram", "{spec}", "--grid", "8"], "3/3"),
    (["recommend", "{spec}"], "9/9"),
])
def test_a_watched_terminal_shows_a_bar_on_stderr(monkeypatch, small_spec, args, steps):
    threads = alive()
    code, out, err = in_terminal(monkeypatch, [a.format(spec=small_spec) for a in args])
    assert code in (0, 1)
    assert args[0] in err and steps in err, err  # the bar: its label and its count of steps
    assert steps not in out and out.strip()  # the report on stdout, the bar not in it
    for t in alive() - threads:  # the bar's refresh thread ends (rich signals it at stop, without joining it)
        t.join(timeout=10)
    assert alive() == threads


def test_audit_on_a_watched_terminal_shows_a_bar(monkeypatch):
    pytest.importorskip("transformers")
    code, out, err = in_terminal(monkeypatch, ["audit", HF / "gpt2/config.json", "--layers", "1"])
    assert code in (0, 1) and "audit" in err and "/" in err


@pytest.mark.parametrize("args, env, delay", [
    (["verify", "{spec}", "--seeds", "2", "--format", "json"], {}, 0.0),  # JSON
    (["sweep", "{spec}", "--width", "32", "--format", "json"], {}, 0.0),
    (["recommend", "{spec}", "--format", "yaml"], {}, 0.0),
    (["verify", "{spec}", "--seeds", "2"], {"CI": "true"}, 0.0),  # CI
    (["verify", "{spec}", "--seeds", "2"], {"TERM": "dumb"}, 0.0),
    (["verify", "{spec}", "--seeds", "2"], {}, 60.0),  # a run shorter than the delay
])
def test_nothing_extra_in_json_in_ci_or_a_quick_run(monkeypatch, small_spec, args, env, delay):
    code, out, err = in_terminal(monkeypatch, [a.format(spec=small_spec) for a in args], delay, env)
    assert code in (0, 1) and err == ""
    if "json" in args:
        json.loads(out)


def test_nothing_extra_when_piped(small_spec):
    """stdout and stderr are pipes: the bar never starts, whatever the run's length."""
    r = subprocess.run([sys.executable, "-m", "initadvisor", "verify", str(small_spec), "--seeds", "2"],
                       capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "CI"})
    assert r.returncode in (0, 1) and r.stderr == ""


def test_json_on_a_real_terminal_is_json_alone(small_spec):
    """A pseudo-terminal for both streams, as a person runs `verify --format json`: the output parses as JSON."""
    main, sub = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"TERM": "xterm"}
    p = subprocess.Popen([sys.executable, "-m", "initadvisor", "verify", str(small_spec), "--seeds", "3", "--format",
                          "json"], stdout=sub, stderr=sub, env=env)
    os.close(sub)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert p.wait() in (0, 1)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert json.loads(text)["schema"] == "initadvisor.verify/1"


@pytest.mark.parametrize("call", [
    lambda bad: api.verify(SMALL, seeds=1, progress=bad),
    lambda bad: api.sweep(SMALL, width=[32], progress=bad),
    lambda bad: api.diagram(SMALL, grid=4, progress=bad),
    lambda bad: api.recommend(SMALL, progress=bad),
])
def test_a_progress_that_is_not_callable_is_a_usage_error(call):
    from initadvisor import UsageError

    with pytest.raises(UsageError, match="progress: must be a callable"):
        call(5)


def test_audit_refuses_a_progress_that_is_not_callable():
    pytest.importorskip("transformers")
    from initadvisor import UsageError
    from initadvisor.audit import audit_config

    with pytest.raises(UsageError, match="progress"):
        audit_config(HF / "llama/config.json", layers=1, progress="yes")
