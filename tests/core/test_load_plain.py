"""The spec loader's own document builder (spec/load.py `_parse_docs`) against PyYAML's constructor.

`_parse_docs` builds a plain document (mappings with unique string keys, lists, core scalars) from
libyaml's nodes itself and hands everything else to PyYAML; the promise is the same values (with their
types: `True` is not `1`) and the same errors as `yaml.load_all(text, Loader=_Loader)` with PyYAML's own
resolver (the loader resolves tags its own faster way). Checked on YAML's corners, on 20,000 generated
documents near a real spec, on 8,000 of random values and on 200,000 scalars.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.spec.load import MAX_DEPTH, _Loader, _parse_docs, _plain
from tests.core.test_prescan import mutated


def typed(value: Any) -> Any:
    """`value` with every scalar's type spelled out, so that 1 == True or 1 == 1.0 cannot pass for equal."""
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    if isinstance(value, float) and value != value:
        return ("float", "nan")
    return (type(value).__name__, value if isinstance(value, (str, int, float, bool, type(None))) else repr(value))


class PyYAMLResolving(_Loader):
    """The loader with PyYAML's own resolver methods: the reference for spec/load.py's faster ones."""

    resolve = yaml.resolver.BaseResolver.resolve
    descend_resolver = yaml.resolver.BaseResolver.descend_resolver
    ascend_resolver = yaml.resolver.BaseResolver.ascend_resolver


def reference(text: str) -> tuple[str, Any]:
    try:
        return "ok", [typed(d) for d in yaml.load_all(text, Loader=PyYAMLResolving)]
    except Exception as e:  # the error must be the same one, raised the same way
        return "error", (type(e).__name__, str(e))


def ours(text: str) -> tuple[str, Any]:
    try:
        return "ok", [typed(d) for d, _ in _parse_docs(text)]
    except Exception as e:
        return "error", (type(e).__name__, str(e))


CORNERS = [
    "",
    "---\n",
    "--- \n...\n---\na: 1\n",
    "a: 1\n---\nb: [2, 3]\n--- ~\n",
    "a: yes\nb: no\nc: on\nd: true\ne: False\nf: TRUE\ng: !!bool yes\nh: !!bool maybe\n",
    "a: 1\nb: 0x1f\nc: 0o17\nd: -7\ne: +3\nf: 1_000\ng: 017\nh: !!int '12'\ni: !!int x\n",
    "a: 1.5\nb: .inf\nc: -.Inf\nd: .nan\ne: 1e3\nf: 6.8523015e+5\ng: 1_0.5\nh: !!float 3\n",
    "a: ~\nb: null\nc:\nd: Null\ne: !!null ''\n",
    "a: 2024-01-02\nb: 2024-01-02T03:04:05Z\nc: '2024-01-02'\n",
    "a: !!str 1\nb: !!str true\nc: '1'\nd: \"x\\ty\"\ne: |\n  two\n  lines\nf: >-\n  folded\n  text\n",
    "a: &x {b: 1}\nc: *x\n",
    "a: &x [1, 2]\nb: *x\nc: *x\n",
    "base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n",
    "d:\n  <<: [{a: 1}, {b: 2}]\n",
    "a: 1\na: 2\n",
    "m:\n  k: 1\n  k: 2\n",
    "1: one\n2: two\n",
    "? [a, b]\n: c\n",
    "? {a: 1}\n: c\n",
    "~: x\n",
    "true: x\n",
    "a: !!set {x, y}\n",
    "a: !!omap [{x: 1}, {y: 2}]\n",
    "a: !!binary aGVsbG8=\n",
    "a: !!python/tuple [1, 2]\n",
    "a: !custom x\n",
    "!!map {a: 1}\n",
    "!!str {a: 1}\n",
    "!!seq {a: 1}\n",
    "- a\n- [b, {c: d}]\n- - e\n",
    "just a string\n",
    "42\n",
    "a: [1, 2\n",
    "a: 'unterminated\n",
    "a: b: c\n",
    "\t- tab\n",
    "&a a: &a b\n",
    "a: *nothing\n",
    "x: &loop\n  - *loop\n",
    "a: 99999999999999999999999999999999\n",
    "a: 0x" + "f" * 5000 + "\n",
    "a: " + "1" * 5000 + "\n",
    "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n",
    "a:" + "".join(f"\n{'  ' * i}b{i}:" for i in range(1, MAX_DEPTH + 4)) + " x\n",
    "%YAML 1.1\n---\na: 1\n",
    "%TAG !e! tag:example.com,2000:\n---\na: !e!foo x\n",
]


@pytest.mark.parametrize("text", CORNERS)
def test_yaml_corners_build_the_same_values_and_errors(text: str) -> None:
    assert ours(text) == reference(text)


def test_the_examples_repo_builds_the_same() -> None:
    files = sorted((Path(__file__).parents[2] / "examples-repo").rglob("*.yaml"))
    assert files
    for f in files:
        text = f.read_text()
        assert ours(text) == reference(text) and reference(text)[0] == "ok", f


def test_a_real_spec_is_built_by_the_loader_itself() -> None:
    """The fast path is taken for what specs are (else the checks above would compare PyYAML to itself)."""
    for f in sorted((Path(__file__).parents[2] / "examples-repo").rglob("*.yaml")):
        for node in yaml.compose_all(f.read_text(), Loader=_Loader):
            assert typed(_plain(node, 0, set())) == typed(yaml.load(yaml.serialize(node), Loader=_Loader)), f


def test_generated_documents_build_the_same() -> None:
    """20,000 documents near a real spec, mutated where YAML has corners (quotes, flow collections, block
    scalars, second documents, explicit and merge keys): every one builds the same, or fails the same."""
    rng = random.Random(20261204)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(20_000):
        text = mutated(rng)
        got = ours(text)
        assert got == reference(text), text
        outcomes[got[0]] += 1
    assert outcomes["ok"] > 3_000 and outcomes["error"] > 3_000, outcomes  # both sides reached


SCALARS = ["x", "1", "-2", "0x1f", "0o7", "017", "1_000", "1.5", ".inf", "-.nan", "1e3", "true", "False", "yes",
           "off", "~", "null", "", "2024-01-02", "2024-01-02 03:04:05", "'1'", '"true"', "!!str 5", "!!int '5'",
           "!!bool yes", "!!float 2", "!!null ''", "!!binary aGk=", "!x y", "<<", "=", "a b", "'a: b'"]


def structure(rng: random.Random, depth: int, anchors: list[str]) -> str:
    """A random value in flow style: scalars from YAML's corners, nested maps and lists, anchors, aliases,
    merge keys, duplicate and non-string keys."""
    r = rng.random()
    if depth > 3 or r < 0.45:
        if anchors and rng.random() < 0.08:
            return "*" + rng.choice(anchors)
        return rng.choice(SCALARS)
    prefix = ""
    if rng.random() < 0.1:
        anchors.append(f"a{len(anchors)}")
        prefix = f"&{anchors[-1]} "
    if r < 0.75:
        keys = [rng.choice(["k", "j", "i", "<<", "1", "true", "~", "[l]", "'q'"]) if rng.random() < 0.3
                else f"k{n}" for n in range(rng.randint(0, 4))]
        return prefix + "{" + ", ".join(f"{k}: {structure(rng, depth + 1, anchors)}" for k in keys) + "}"
    return prefix + "[" + ", ".join(structure(rng, depth + 1, anchors) for _ in range(rng.randint(0, 4))) + "]"


def test_generated_values_build_the_same() -> None:
    """8,000 documents of random values from YAML's corners (every scalar type, tags, anchors, aliases,
    merge keys, duplicates), as block mappings of flow values."""
    rng = random.Random(7)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(8_000):
        anchors: list[str] = []
        text = "".join(f"f{n}: {structure(rng, 0, anchors)}\n" for n in range(rng.randint(1, 4)))
        got = ours(text)
        assert got == reference(text), text
        outcomes[got[0]] += 1
    assert outcomes["ok"] > 1_500 and outcomes["error"] > 1_500, outcomes


SCALAR_PARTS = ["", "0", "1", "7", "9", "12", "2024", "-", "+", ".", "_", ":", "e", "E", "x", "o", "b", "a", "f",
                "inf", "Inf", "nan", "NaN", "true", "True", "TRUE", "false", "yes", "no", "on", "null", "Null",
                "~", "<<", "=", "!", "&", "*", "T", "Z", " ", "\n", "0x", "0o", "1e3", "3.5", "-01-02", "T03:04:05",
                "Y", "y", "n", "N", "F"]


def test_scalars_resolve_to_pyyamls_tags() -> None:
    """The loader's `resolve` against PyYAML's `BaseResolver.resolve` with the same implicit resolvers, on
    every first character that has resolvers and on 200,000 scalars made of the parts their regexes
    look at, for each combination of plain/quoted implicitness, and for collections."""
    ours_, theirs = _Loader(""), PyYAMLResolving("")
    rng = random.Random(20261205)
    values = [""] + [rng.choice(SCALAR_PARTS) for _ in range(50)]
    values += ["".join(rng.choice(SCALAR_PARTS) for _ in range(rng.randint(1, 5))) for _ in range(200_000)]
    values += [f"{k}{rest}" for k in _Loader.yaml_implicit_resolvers if k for rest in ("", "1", "x", ".5")]
    for value in values:
        for implicit in ((True, False), (False, True), (False, False), (True, True)):
            want = theirs.resolve(yaml.ScalarNode, value, implicit)  # type: ignore[no-untyped-call]
            assert ours_.resolve(yaml.ScalarNode, value, implicit) == want, (value, implicit)
    for kind in (yaml.MappingNode, yaml.SequenceNode):
        assert ours_.resolve(kind, None, (True, False)) == theirs.resolve(kind, None, (True, False))  # type: ignore[no-untyped-call]
    ours_.dispose()
    theirs.dispose()
