"""Write the hostile-input corpus used by tests/test_hostile.py (run once; the files are committed).

    python tests/fuzz/make_corpus.py

bad/*.yaml  every file must make `initadvisor check FILE` exit 2 with one line on stderr, no traceback.
ok/*.yaml   odd but valid specs (extreme numbers inside the schema's ranges, odd-but-legal YAML): they must
            exit 0 or 1 with a finite JSON report.

Large cases (the 5 MB files, 10000-deep nesting, a 5000-digit integer) are generated inside the tests
instead of stored. The generator is deterministic (fixed seeds), so re-running it reproduces the corpus.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
BERT = (HERE.parents[1] / "model_specs" / "bert-base.yaml").read_text()
BASE = "model:\n  layers: 4\n  d_model: 64\n  heads: 4\n"


def with_model(extra: str) -> str:
    return BASE + extra


BAD: dict[str, bytes | str] = {
    # --- beyond the caps (d_model <= 1e6, length <= 1e7, positive numbers >= 1e-8) or not printable text in a name
    "std-subnormal.yaml": with_model("init:\n  std: 5.0e-324\n"),
    "std-tiny-1e-308.yaml": with_model("init:\n  std: 1.0e-308\n"),
    "thresholds-tiny.yaml": with_model("thresholds:\n  grad_vanish: 1.0e-300\n"),
    "unicode-name.yaml": 'name: "模型 🚀 \\u2028 ünïcödé"\n' + BASE,
    "name-with-newline.yaml": 'name: "two\\nlines"\n' + BASE,
    "name-lone-surrogate.yaml": 'name: "\\ud800"\n' + BASE,
    "name-control-chars.yaml": 'name: "\\e[31mred\\x00\\a"\n' + BASE,
    "seq-length-huge.yaml": with_model("sequence:\n  length: 1000000000\n"),
    "d-model-huge.yaml": "model:\n  layers: 2\n  d_model: 1000000000\n  heads: 1\n",
    # --- not YAML text at all
    "empty.yaml": "",
    "whitespace-only.yaml": "   \n\t\n  \n",
    "comment-only.yaml": "# nothing here\n# at all\n",
    "document-marker-only.yaml": "---\n...\n",
    "non-utf8-latin1.yaml": "name: caf\xe9\nmodel:\n  layers: 4\n".encode("latin-1"),
    "non-utf8-lone-continuation.yaml": b"model:\n  layers: \x80\x81\n",
    "utf16-with-bom.yaml": BASE.encode("utf-16"),
    "utf8-overlong.yaml": b"model:\n  layers: \xc0\xb4\n",
    "nul-byte.yaml": "model:\n  layers: 4\x00\n  d_model: 64\n",
    "control-char-escape.yaml": "model:\n  layers: 4\x1b[31m\n",
    "control-char-bell.yaml": "name: \x07\n" + BASE,
    "lone-surrogate-escape.yaml": 'name: "\\ud800"\n' + BASE + "  norm: 12\n",
    # --- truncated YAML
    "truncated-flow-mapping.yaml": "model: {layers: 4, d_model: 64, heads: 4\n",
    "truncated-flow-sequence.yaml": BASE + "sequence:\n  embeddings: [token, position\n",
    "truncated-quoted-string.yaml": 'name: "bert\n' + BASE,
    "truncated-mid-key.yaml": BERT[: BERT.index("d_model") + 3],
    "truncated-after-colon.yaml": "model:\n  layers:",
    "truncated-block-scalar.yaml": "name: |\n",
    "truncated-anchor.yaml": "model: &\n",
    "bad-indentation.yaml": "model:\n  layers: 4\n d_model: 64\n   heads: 4\n",
    "tab-indentation.yaml": "model:\n\tlayers: 4\n",
    "two-documents.yaml": BASE + "---\n" + BASE,
    "directive-garbage.yaml": "%YAML 9.9\n%TAG ! tag:x,2000:\n---\n" + BASE,
    # --- top level of the wrong shape
    "top-level-list.yaml": "- model\n- layers\n",
    "top-level-scalar.yaml": "42\n",
    "top-level-string.yaml": "just some text\n",
    "top-level-null.yaml": "~\n",
    # --- huge, tiny and odd numbers where they are not allowed
    "float-1e308-string.yaml": with_model("init:\n  std: 1e308\n"),  # YAML 1.1: a string, not a number
    "float-1.0e+308.yaml": with_model("init:\n  std: 1.0e+308\n"),
    "float-overflow-inf.yaml": with_model("init:\n  std: 1.0e+400\n"),
    "float-inf.yaml": with_model("init:\n  std: .inf\n"),
    "float-neg-inf.yaml": with_model("dropout: -.inf\n"),
    "float-nan.yaml": with_model("dropout: .nan\n"),
    "float-nan-threshold.yaml": with_model("thresholds:\n  rank_collapse_rho: .NaN\n"),
    "float-negative-zero-std.yaml": with_model("init:\n  std: -0.0\n"),
    "float-zero-std.yaml": with_model("init:\n  std: 0.0\n"),
    "float-1e-308-layers.yaml": "model:\n  layers: 1.0e-308\n  d_model: 64\n  heads: 4\n",
    "int-negative-zero-layers.yaml": "model:\n  layers: -0\n  d_model: 64\n  heads: 4\n",
    "int-10pow400-layers.yaml": f"model:\n  layers: {10**400}\n  d_model: 64\n  heads: 4\n",
    "int-10pow400-std.yaml": with_model(f"init:\n  std: {10**400}\n"),
    "int-10pow400-dropout.yaml": with_model(f"dropout: {10**400}\n"),
    "int-neg-10pow400-skip.yaml": with_model(f"residual:\n  attention: {{skip: -{10**400}}}\n"),
    "int-10pow400-input-correlation.yaml": with_model(f"sequence:\n  input_correlation: {10**400}\n"),
    "int-10pow400-threshold.yaml": with_model(f"thresholds:\n  grad_explode: {10**400}\n"),
    "int-hex-huge.yaml": with_model("init:\n  std: 0x" + "f" * 400 + "\n"),
    "int-sexagesimal-huge.yaml": with_model("init:\n  std: " + ":".join(["59"] * 300) + "\n"),
    "layers-zero.yaml": "model:\n  layers: 0\n  d_model: 64\n  heads: 4\n",
    "layers-negative.yaml": "model:\n  layers: -5\n  d_model: 64\n  heads: 4\n",
    "layers-over-1e9.yaml": "model:\n  layers: 1000000001\n  d_model: 64\n  heads: 4\n",
    "dropout-one.yaml": with_model("dropout: 1.0\n"),
    "seq-length-one.yaml": with_model("sequence:\n  length: 1\n"),
    "input-correlation-one.yaml": with_model("sequence:\n  input_correlation: 1.0\n"),
    # --- wrong types
    "layers-string.yaml": "model:\n  layers: '12'\n  d_model: 64\n  heads: 4\n",
    "layers-float.yaml": "model:\n  layers: 12.0\n  d_model: 64\n  heads: 4\n",
    "layers-bool.yaml": "model:\n  layers: true\n  d_model: 64\n  heads: 4\n",
    "layers-null.yaml": "model:\n  layers: ~\n  d_model: 64\n  heads: 4\n",
    "layers-list.yaml": "model:\n  layers: [12]\n  d_model: 64\n  heads: 4\n",
    "layers-mapping.yaml": "model:\n  layers: {n: 12}\n  d_model: 64\n  heads: 4\n",
    "layers-date.yaml": "model:\n  layers: 2001-12-14\n  d_model: 64\n  heads: 4\n",
    "model-list.yaml": "model: [4, 64, 4]\n",
    "model-null.yaml": "model:\n",
    "model-missing.yaml": "name: x\n",
    "init-scalar.yaml": with_model("init: 0.02\n"),
    "norm-int.yaml": with_model("  norm: 1\n"),
    "norm-typo.yaml": with_model("  norm: prelayer\n"),
    "activation-list.yaml": with_model("  activation: [gelu]\n"),
    "name-int.yaml": "name: 12\n" + BASE,
    "embeddings-string.yaml": with_model("sequence:\n  embeddings: token\n"),
    "embeddings-empty.yaml": with_model("sequence:\n  embeddings: []\n"),
    "embeddings-duplicate.yaml": with_model("sequence:\n  embeddings: [token, token]\n"),
    "embeddings-nested.yaml": with_model("sequence:\n  embeddings: [[token]]\n"),
    "thresholds-null.yaml": with_model("thresholds:\n"),
    "causal-string.yaml": with_model("  causal: 'yes please'\n"),
    "binary-value.yaml": with_model("init:\n  std: !!binary aGVsbG8=\n"),
    "set-value.yaml": with_model("sequence:\n  embeddings: !!set {token, position}\n"),
    "omap-section.yaml": "model: !!omap [{layers: 4}, {d_model: 64}, {heads: 4}]\n",
    "bad-timestamp.yaml": with_model("init:\n  std: !!timestamp 2001-13-45\n"),
    "bad-int-tag.yaml": "model:\n  layers: !!int abc\n  d_model: 64\n  heads: 4\n",
    "bad-float-tag.yaml": with_model("init:\n  std: !!float abc\n"),
    "bool-tag-on-number.yaml": with_model("  causal: !!bool 7\n"),
    # --- structure
    "duplicate-top-key.yaml": BASE + BASE,
    "duplicate-nested-key.yaml": "model:\n  layers: 4\n  layers: 5\n  d_model: 64\n  heads: 4\n",
    "duplicate-key-flow.yaml": "model: {layers: 4, layers: 4, d_model: 64, heads: 4}\n",
    "unknown-top-key.yaml": BASE + "optimizer: adam\n",
    "unknown-nested-key.yaml": with_model("  layer_count: 4\n"),
    "non-scalar-key.yaml": with_model("? [a, b]\n: 1\n"),
    "mapping-key.yaml": "? {model: 1}\n: 2\n",
    "null-key.yaml": with_model("~: 1\n"),
    "int-key.yaml": with_model("12: 1\n"),
    "key-with-newline.yaml": with_model('  "lay\\nerz": 3\n'),
    "key-with-carriage-return.yaml": with_model('  "lay\\rers": 3\n'),
    "key-with-unicode-line-separator.yaml": with_model('  "lay\\u2028ers": 3\n'),
    "key-with-nel.yaml": with_model('  "lay\\x85ers": 3\n'),
    "choice-with-newline.yaml": with_model('  norm: "po\\nst"\n'),
    "merge-key.yaml": "base: &b {layers: 4, d_model: 64, heads: 4}\nmodel:\n  <<: *b\n",
    "undefined-alias.yaml": "model: *nothing\n",
    "recursive-alias-list.yaml": "model: &a [*a]\n",
    "recursive-alias-mapping.yaml": "model: &a {layers: *a}\n",
    "heads-not-dividing.yaml": "model:\n  layers: 4\n  d_model: 64\n  heads: 5\n",
    "kv-heads-not-dividing.yaml": with_model("  kv_heads: 3\n"),
    "parallel-residual-post.yaml": with_model("  parallel_residual: true\n"),
    "skip-and-block-zero.yaml": with_model("residual:\n  attention: {skip: 0, block: 0}\n"),
    "std-and-gain.yaml": with_model("init:\n  v: {std: 0.02, gain: 1.0}\n"),
    "qk-beta-and-q.yaml": with_model("init:\n  qk_beta: 0.5\n  q: {std: 0.02}\n"),
    "nesting-21-deep.yaml": "model: " + "[" * 21 + "]" * 21 + "\n",
    # --- YAML alias bombs (billion laughs): the composed graph is small, its expansion is not
    "billion-laughs.yaml": (
        "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
        + "model: *i\n"
    ),
    "billion-laughs-mapping.yaml": (
        "a: &a {x: lol, y: lol}\n"
        + "".join(f"{chr(98 + i)}: &{chr(98 + i)} {{x: *{chr(97 + i)}, y: *{chr(97 + i)}, z: *{chr(97 + i)}}}\n"
                  for i in range(20))
        + BASE
    ),
    "billion-laughs-in-value.yaml": (
        BASE + "sequence:\n  embeddings: &e0 [token, token]\n"
        + "".join(f"x{i}: &e{i + 1} [*e{i}, *e{i}, *e{i}, *e{i}]\n" for i in range(15))
    ),
    # --- unsafe tags: must be refused by the safe loader, never executed
    "python-object-apply.yaml": "model: !!python/object/apply:os.system ['echo pwned > /tmp/initadvisor-pwned']\n",
    "python-object-new.yaml": "model: !!python/object/new:subprocess.Popen [['touch', '/tmp/initadvisor-pwned']]\n",
    "python-name.yaml": "model: !!python/name:os.system\n",
    "python-module.yaml": "model: !!python/module:os\n",
    "python-object.yaml": "model: !!python/object:collections.OrderedDict {}\n",
    "python-bytes.yaml": with_model("name: !!python/bytes aGk=\n"),
    "python-complex.yaml": with_model("init:\n  std: !!python/complex 1+2j\n"),
    "custom-local-tag.yaml": with_model("init:\n  std: !pwn 0.02\n"),
    "custom-global-tag.yaml": with_model("init:\n  std: !<tag:evil.example,2024:x> 0.02\n"),
    "tag-on-mapping-key.yaml": "!!python/name:os.system model: 1\n",
    "javascript-ish.yaml": "model: !!js/function 'function(){}'\n",
}

# odd but valid: must exit 0 or 1 and print a finite JSON report
OK: dict[str, str] = {
    "unicode-name-printable.yaml": 'name: "模型 🚀 ünïcödé"\n' + BASE,
    "minimal.yaml": BASE,
    "std-just-below-1e6.yaml": with_model("init:\n  std: 999999.0\n"),
    "dropout-negative-zero.yaml": with_model("dropout: -0.0\n"),
    "skip-negative-zero.yaml": with_model("residual:\n  attention: {skip: -0.0, block: 1}\n"),
    "input-correlation-tiny.yaml": with_model("sequence:\n  input_correlation: 1.0e-308\n"),
    "input-correlation-near-one.yaml": with_model("sequence:\n  input_correlation: 0.9999999999999999\n"),
    "layers-hex.yaml": "model:\n  layers: 0x4\n  d_model: 0100\n  heads: 0b100\n",  # YAML 1.1 octal 0100
    "python-tuple-on-list.yaml": with_model("sequence:\n  embeddings: !!python/tuple [token]\n"),  # tag ignored
    "layers-underscore.yaml": "model:\n  layers: 1_2\n  d_model: 6_4\n  heads: 4\n",
    "layers-sexagesimal.yaml": "model:\n  layers: 1:0\n  d_model: 64\n  heads: 4\n",
    "utf8-bom.yaml": "\ufeff" + BASE,
    "crlf-line-endings.yaml": BASE.replace("\n", "\r\n"),
    "no-trailing-newline.yaml": BASE.rstrip("\n"),
    "flow-style.yaml": "{model: {layers: 4, d_model: 64, heads: 4}}\n",
    "explicit-document.yaml": "%YAML 1.1\n---\n" + BASE + "...\n",
    "anchors-and-aliases.yaml": "model:\n  layers: &n 4\n  d_model: 64\n  heads: *n\n",
    "vocab-one-segment.yaml": with_model("sequence:\n  vocab: 1\n  embeddings: [segment]\n"),
    "seq-length-two.yaml": with_model("sequence:\n  length: 2\n"),
    "comments-everywhere.yaml": "# c\nmodel: # c\n  # c\n  layers: 4 # c\n  d_model: 64\n  heads: 4 # c\n# c\n",
}


def random_cases() -> dict[str, bytes]:
    rng = random.Random(20240611)
    out = {}
    for i in range(4):
        out[f"random-bytes-{i}.yaml"] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096)))
    for i in range(3):  # random printable ASCII: hits the YAML scanner, not the UTF-8 decoder
        out[f"random-printable-{i}.yaml"] = "".join(
            rng.choice(" \n:-[]{},&*!|>'\"%@`#?abcxyz0123456789.") for _ in range(rng.randrange(1, 2048))).encode()
    i = 0
    for _ in range(200):  # bert-base with a few bytes flipped, until 6 of them are invalid
        b = bytearray(BERT.encode())
        for _ in range(rng.randrange(1, 6)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if not _loads(bytes(b)):
            out[f"bert-bitflip-{i}.yaml"] = bytes(b)
            i += 1
            if i == 6:
                break
    return out


def _loads(content: bytes) -> bool:
    """True when the case is in fact a valid spec (a random mutation that happened to stay valid)."""
    import sys

    sys.path.insert(0, str(HERE.parents[1] / "src"))
    from initadvisor.spec import SpecError, parse_spec

    try:
        parse_spec(content.decode("utf-8"), "case.yaml")
    except (SpecError, UnicodeDecodeError):
        return False
    except Exception:  # a crash is exactly what the corpus is for: keep it
        return False
    return True


def main() -> None:
    for sub in ("bad", "ok"):
        shutil.rmtree(HERE / sub, ignore_errors=True)
        (HERE / sub).mkdir()
    randoms = {k: v for k, v in random_cases().items() if not _loads(v)}
    for name, content in {**BAD, **randoms}.items():
        (HERE / "bad" / name).write_bytes(content.encode() if isinstance(content, str) else content)
    for name, content in OK.items():
        (HERE / "ok" / name).write_bytes(content.encode())
    print(f"wrote {len(BAD) + len(randoms)} bad and {len(OK)} ok cases under {HERE}")


if __name__ == "__main__":
    main()
