"""Reading an app's name from a spec file's lines (spec/prescan.py), checked against the YAML parser.

The promise a shard relies on to skip another shard's file unparsed: when the lines give a name and the
file parses, the file holds exactly one document and that name is its metadata.name. A wrong answer
would hide an app from its own shard; so the generated documents below aim at the places where lines
and YAML disagree (quotes and brackets that span lines, block scalars, plain scalars that run on,
second documents, quoted and merge keys), and the answers must still match the parser's.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from reconciler.spec.load import _doc_name, _parse_docs, plain_name
from reconciler.spec.prescan import _COMMON, _one_plain_document, _walk, declared_name

BASE = [
    "apiVersion: flink-reconciler.io/v1alpha1",
    "kind: FlinkApp",
    "metadata:",
    "  name: counter",
    "  namespace: flink",
    "spec:",
    "  job:",
    "    jarURI: local:///opt/flink/usrlib/counter.jar",
    '    args: ["--rate", "100"]',
]


def parsed_name(text: str) -> tuple[bool, Any]:
    """(parsed, metadata.name of its only document or the documents themselves)."""
    try:
        docs = [d for d, _ in _parse_docs(text) if d is not None]
    except Exception:  # any parse failure: the file is an error, never skipped unseen by its shard
        return False, None
    if len(docs) == 1 and isinstance(docs[0], dict) and isinstance(docs[0].get("metadata"), dict):
        return True, docs[0]["metadata"].get("name")
    return True, docs


def test_the_examples_repo_names_are_read_from_their_lines() -> None:
    root = Path(__file__).parents[2] / "examples-repo"
    files = sorted(root.rglob("*.yaml"))
    assert files
    for f in files:
        text = f.read_text()
        parsed, name = parsed_name(text)
        assert parsed and plain_name(text) == name, f


@pytest.mark.parametrize(("text", "want"), [
    ("\n".join(BASE), "counter"),
    # comments, quoted and flow values, block scalars elsewhere: still provable
    ('# a comment\nkind: "FlinkApp"\nmetadata: # c\n  labels: {team: "web, \'x\'"}\n  name: counter  # c\n'
     'spec:\n  x: |\n    metadata:\n      name: evil\n    "\n', "counter"),
    ("metadata:\n  annotations:\n    note: >-\n      it's\n      \"open\n  name: counter\n", "counter"),
    ("spec:\n  - a: 'it''s'\n  - [x, {y: \"z\"}]\nmetadata:\n  name: counter\n", "counter"),
])
def test_plainly_written_specs_give_their_name(text: str, want: str) -> None:
    assert plain_name(text) == want
    assert parsed_name(text) == (True, want)


@pytest.mark.parametrize("text", [
    # a quoted scalar that runs on hides a fake block; the real name comes later
    'metadata:\n  labels: {a: "x\n  name: evil\nfoo: y\n  "}\n  name: real\n',
    'kind: "x\nmetadata:\n  name: evil"\n"metadata":\n  name: real\n',
    # a plain scalar that runs on, flow collections over two lines
    "metadata:\n  name: evil\n    more\n",
    "metadata:\n  labels: [a,\n  b]\n  name: x\n",
    # a second document, directives, end markers
    "metadata:\n  name: one\n---\nmetadata:\n  name: two\n",
    "%YAML 1.1\n---\nmetadata:\n  name: yes\n",
    "metadata:\n  name: one\n...\n",
    # quoted, merge, explicit and duplicate keys; anchors, aliases, tags
    'metadata:\n  "name": evil\n  name: real\n',
    "metadata:\n  <<: {name: evil}\n",
    "metadata:\n  ? name\n  : evil\n",
    "metadata:\n  name: a\n  name: b\n",
    "metadata:\n  name: &x a\n",
    "metadata:\n  name: !!str a\n",
    "metadata: &m\n  name: a\n",
    # names the parser reads as something else than a string, or that are not app names
    "metadata:\n  name: 2024-01-02\n", "metadata:\n  name: 123\n", "metadata:\n  name: 'q'\n",
    "metadata:\n  name: null\n", "metadata:\n  name: true\n", "metadata:\n  name: Upper\n",
    # a name on its own line, a flow metadata, no metadata, two of them
    "metadata:\n  name:\n    a\n", "metadata: {name: a}\n", "kind: FlinkApp\n",
    "metadata:\n  name: a\nmetadata:\n  name: b\n",
    # tabs, CR, non-ASCII, an indented document, a sequence at the top
    "metadata:\n\tname: a\n", "metadata:\r\n  name: a\r\n", "metadata:\n  name: a\n  x: \u00e9\n",
    "  metadata:\n    name: a\n", "- metadata:\n    name: a\n",
])
def test_what_the_lines_cannot_prove_is_left_to_the_parser(text: str) -> None:
    assert plain_name(text) is None


KEYS = ["metadata", "name", "namespace", "labels", "spec", "kind", "a", "x y", '"name"', "'metadata'", "<<",
        "? name", "name ", "a:b", "-x", "job"]
SEPS = [": ", ":", " : ", "", ":  "]
VALUES = ["", "foo", "real", "evil", "bar-1", '"q"', "'q'", '"open', "'open", 'close"', "close'", '"a\\"b"',
          "'it''s'", '[a, "b"]', "[open", "{a: b}", "{a: 'b", "|", ">-", "|2", "|+", "&a", "*a", "!!str x",
          "# c", "x # c", "it's", 'x, "y', '"a: \'b", c', "2024-01-02", "true", "123", "null", "- x", "a: b",
          "x#y", "]", "}", "[x]: y", '"k": v', "'k':v"]
LINES = ["---", "...", "%YAML 1.1", "", "#c", "  #c", '"', "'", "]", "}", "metadata:", "  name: evil",
         "  name: real", "name: top", "  - name: item", "    more", "  |", "- x", "? metadata", ": x"]


def random_line(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return rng.choice(LINES)
    indent = " " * rng.choice([0, 0, 1, 2, 2, 2, 3, 4, 4, 6])
    prefix = rng.choice(["", "", "", "- ", "- - ", "-"])
    return indent + prefix + rng.choice(KEYS) + rng.choice(SEPS) + rng.choice(VALUES)


WRAPS = [('"', '"'), ("'", "'"), ("[", "]"), ("{", "}"), ("|", ""), (">-", ""), ("word", ""), ('"a\\', '"'),
         ("x, '", "'"), ("[it's, '", "']"), ("- |", "")]


def wrapped(rng: random.Random, lines: list[str]) -> list[str]:
    """Lines i..j turned into the inside of a construct that spans lines (a quoted or plain scalar, a flow
    collection, a block scalar) opened by a line before them and closed by one after."""
    i = rng.randint(0, len(lines))
    j = rng.randint(i, min(len(lines), i + 4))
    opener, closer = rng.choice(WRAPS)
    head = " " * rng.choice([0, 2, 4]) + rng.choice(["labels", "a", "kind", "- b"]) + ": " + opener
    shift = " " * rng.choice([0, 0, 1, 2, 4])
    inside = [shift + ln for ln in lines[i:j]]
    tail = [" " * rng.choice([0, 2, 4, 6]) + closer] if closer else []
    return [*lines[:i], head, *inside, *tail, *lines[j:]]


def mutated(rng: random.Random) -> str:
    lines = list(BASE)
    for _ in range(rng.randint(0, 5)):
        op = rng.random()
        at = rng.randint(0, len(lines))
        if op < 0.45 or not lines:
            lines.insert(at, random_line(rng))
        elif op < 0.6:
            lines[min(at, len(lines) - 1)] = random_line(rng)
        elif op < 0.75:
            j = min(at, len(lines) - 1)
            lines[j] = " " * rng.choice([1, 2]) + lines[j]
        else:
            lines = wrapped(rng, lines)
    return "\n".join(lines) + rng.choice(["", "\n"])


def test_where_the_lines_give_a_name_the_parser_agrees() -> None:
    """60,000 documents near a real spec, mutated where lines and YAML part ways."""
    rng = random.Random(20261203)
    answered = agreed = 0
    for _ in range(60_000):
        text = mutated(rng)
        name = declared_name(text)
        if name is None:
            continue
        answered += 1
        parsed, got = parsed_name(text)
        if parsed:
            assert got == name or plain_name(text) is None, f"lines say {name!r}, the parser {got!r}:\n{text}"
            agreed += got == name
    # the generator must reach both sides: answers that parse, and (above) the refusals
    assert answered > 10_000 and agreed > 5_000, (answered, agreed)


def test_the_one_regex_for_the_common_layout_agrees_with_the_line_walk() -> None:
    """`declared_name` proves the layout nearly every spec has with one regex and walks the lines for the
    rest: where the regex answers, the walk must give the same name (the walk is what the parser checks
    above). The generated documents reach both: answers and refusals of the regex, on the same texts."""
    rng = random.Random(20261204)
    fast = fallback = 0
    for _ in range(60_000):
        text = mutated(rng)
        if not _one_plain_document(text):
            continue
        m = _COMMON.match(text)
        if m is None:
            fallback += 1
            continue
        fast += 1
        assert m.group(1) == _walk(text), f"the regex says {m.group(1)!r}, the walk {_walk(text)!r}:\n{text}"
    assert fast > 5_000 and fallback > 5_000, (fast, fallback)
    # the layouts a repository is made of take the regex
    labelled = "\n".join([*BASE[:4], "  labels:", "    team: web", "    tier: gold", *BASE[4:]]) + "\n"
    for text in ["\n".join(BASE) + "\n", labelled, *(f.read_text() for f in
                                                    (Path(__file__).parents[2] / "examples-repo").rglob("*.yaml"))]:
        assert _COMMON.match(text) is not None, text


def test_a_name_the_parser_would_not_read_as_a_string_is_left_to_it() -> None:
    for word in ("null", "true", "false", "123", "0x1f", "0o17", "2024-01-02"):
        text = f"metadata:\n  name: {word}\n"
        assert declared_name(text) == word and plain_name(text) is None
        assert _doc_name(_parse_docs(text)[0][0]) is None


def test_a_hostile_megabyte_line_is_read_in_linear_time() -> None:
    """A spec is untrusted input: no backtracking over a long run of spaces (a regex like `(.*?) *$` took
    3.5 s for 40,000 spaces and would take half an hour for a 1 MiB line, stalling the shard). A guard
    against that class of bug, with a bound a thousand times the linear time, not a speed target."""
    import time

    spaces = " " * 1_000_000
    texts = [f"kind: a{spaces}b\nmetadata:\n  name: x\n", f"metadata:\n  name: x{spaces}y\n",
             f"metadata:{spaces}x\n  name: x\n", "a: [" + '"x", ' * 200_000 + "]\nmetadata:\n  name: x\n",
             f"a: '{spaces}\nmetadata:\n  name: x\n",
             # the one-regex path: lines it could split between two loops, then a mismatch at the end
             "metadata:\n  labels:\n" + "\n" * 500_000 + "  name: x\n    y\n",
             "metadata:\n  labels:\n" + "    a: b\n" * 100_000 + "  name: x\n" + "  # c\n" * 100_000 + "  ]\n",
             "a: b\n" * 150_000 + "metadata:\n  name: x\n" + f"{spaces}\n"]
    started = time.monotonic()
    answers = [declared_name(t) for t in texts]
    assert time.monotonic() - started < 10
    assert answers == ["x", None, None, "x", None, None, None, "x"]
