"""A spec file's `metadata.name` read from its lines, without parsing the YAML.

Why: a shard learns which files are its own from the app names inside them, and parsing all 50,000
files of a repository to keep 10,000 was most of a shard's start. This reads the name of a plainly
written spec in a few microseconds, and answers None (the caller parses the file) for anything whose
layout it cannot prove line by line.

What it proves, for the lines from the top of the file to the end of the `metadata:` block: every line
is block structure (a `key:` or a `- ` item, each at a place a block may be), no scalar or flow
collection continues on the next line (quotes and brackets close on their line, no plain scalar runs
on, block scalars `|`/`>` are skipped by their indentation), so each line is what it looks like. Then
the one `metadata:` header at column 0 opens a block whose `name: <plain word>` at the block's
indentation is the document's name. Anything else is None: tabs, CR, non-ASCII text, document markers
and directives (a second document), anchors, aliases, tags, explicit keys, quoted keys in that block.

The promise (tests/core/test_prescan.py checks it against the parser, with generated documents): when
this returns a name and the file parses, the file holds one document and that is its metadata.name.
Whether the name resolves to a string (not a date or a number) is the caller's check, with the
parser's own resolver.
"""

from __future__ import annotations

import re

_METADATA = re.compile(r"metadata *:")
_TOP_KEY = re.compile(r"([A-Za-z][A-Za-z0-9_.-]*):(?: |$)")
_METADATA_HEADER = re.compile(r"metadata: *(?: #.*)?")
_NAME = re.compile(r" *name: +([^ ]+)(?: +#.*)? *")
_BLOCK_HEADER = re.compile(r"[|>][-+]?(?: +#.*)? *")
_SPECIAL = re.compile(r"[\"'\[\]{}#|>&*!?%@`]")
_SCALAR_START_REFUSED = frozenset("?&*!%@`")


# The layout nearly every spec file has, proven by one regex instead of a walk over its lines (5.2 -> 2.9 us
# a file; a shard reads the name of every file in the repository): top-level `key: word` lines, then
# `metadata:` whose children are `key: word` lines two spaces deep, one of them `name:` (and `labels:`-like
# keys holding `key: word` lines four spaces deep), then the next top-level key; blank and comment lines
# between them. Every such line is what `_walk` accepts as closed block structure, so where this matches,
# `_walk` gives the same name (tests/core/test_prescan.py). Linear on hostile input: each line can be
# matched one way only (the alternatives part at the line's first non-space character, and a blank or
# comment line is never inside a nested block), so a failed match never retries a split of the lines.
_WORD = r"[A-Za-z0-9][A-Za-z0-9_./-]*"
_KEY = r"[A-Za-z][A-Za-z0-9_.-]*"
_SKIP = r" *(?:#[^\n]*)?\n"
_CHILD = rf"(?:  (?!name:){_KEY}: {_WORD}\n|  (?!name:){_KEY}:\n(?:    {_KEY}: {_WORD}\n)*|{_SKIP})*"
_COMMON = re.compile(rf"(?:{_KEY}: {_WORD}\n|{_SKIP})*metadata:\n{_CHILD}  name: ({_WORD})\n{_CHILD}[A-Za-z]")


def declared_name(text: str) -> str | None:
    """The plain word after `name:` in the file's only `metadata:` block, or None when it cannot tell."""
    if not _one_plain_document(text):
        return None
    common = _COMMON.match(text)
    return common.group(1) if common is not None else _walk(text)


def _walk(text: str) -> str | None:
    """`declared_name` line by line, for any layout."""
    name: str | None = None
    in_metadata = False
    child_indent = -1  # the metadata block's indentation, once its first line is seen
    bound = 0  # the deepest indentation the next line may have (deeper: the previous value runs on)
    opener = False  # the previous line ended in `key:` or `-`: the next line may go deeper
    skip_deeper_than: int | None = None  # inside a block scalar: its lines are text, not structure
    for line in text.split("\n"):
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if skip_deeper_than is not None:
            if not stripped or indent > skip_deeper_than:
                continue
            skip_deeper_than = None
        if not stripped or stripped[0] == "#":
            continue
        if indent > bound and not opener:
            return None  # a plain scalar continued, or a stray line: not provably structure
        if indent == 0:
            if in_metadata:
                break  # the next top-level key: the metadata block is complete
            if not _TOP_KEY.match(line):
                return None  # the document must be a block mapping written from column 0
            if _METADATA_HEADER.fullmatch(line):
                in_metadata, bound, opener = True, 0, True
                continue
        if in_metadata:
            if child_indent < 0:
                child_indent = indent
            if indent < child_indent:
                return None
            if indent == child_indent:
                if not _TOP_KEY.match(line, indent):
                    return None  # a quoted, explicit or merge key could be (or bring) the name
                if line.startswith("name:", indent):
                    m = _NAME.fullmatch(line)
                    if name is not None or m is None:
                        return None
                    name, bound, opener = m.group(1), indent, False
                    continue
        shape = _line_shape(line, indent)
        if shape is None:
            return None
        bound, opener, block = shape
        if block:
            skip_deeper_than, opener = bound, False
    return name if in_metadata else None


def _one_plain_document(text: str) -> bool:
    """Only printable ASCII and newlines (no tab, CR or other line break, NEL, LS, PS, a line split would
    miss); no line that starts a second document, a directive or an end marker (`---`, `...`, `%`); one
    line that starts with `metadata`, and it is a `metadata:` key. (str methods, not regexes: this runs on
    every file of the repository; 1.9 us a spec instead of 4.8 for three regex scans.)"""
    if not (text.isascii() and text.replace("\n", "").isprintable()):
        return False
    if text.startswith(("---", "...", "%")) or "\n---" in text or "\n..." in text or "\n%" in text:
        return False
    if text.startswith("metadata"):
        first = 0
    elif (first := text.find("\nmetadata") + 1) == 0:
        return False  # no metadata line
    return text.find("\nmetadata", first) < 0 and _METADATA.match(text, first) is not None


def _line_shape(line: str, indent: int) -> tuple[int, bool, bool] | None:
    """(bound, opener, block scalar) of one line: `bound` is the column of its last key or item dash (a
    following line deeper than it would continue a value); None when the line is not provably block
    structure closed on itself."""
    if not _SPECIAL.search(line):
        return _plain_shape(line, indent)
    return _scan_shape(line, indent)


def _plain_shape(line: str, indent: int) -> tuple[int, bool, bool] | None:
    """A line without quotes, brackets, comments or indicators. Linear: a spec may be hostile (no regex
    here that backtracks over a long run of spaces)."""
    n = len(line)
    i, dash = indent, -1
    while i < n and line[i] == "-" and (i + 1 == n or line[i + 1] == " "):
        dash = i
        i += 1
        while i < n and line[i] == " ":
            i += 1
    rest = line[i:].rstrip(" ")
    colon = rest.find(": ")
    if colon < 0 and rest.endswith(":"):
        colon = len(rest) - 1
    if colon > 0:
        return i, not rest[colon + 1:].strip(" "), False
    if colon == 0 or dash < 0:
        return None  # `: x` with no key, or a bare scalar line (a value that began on an earlier line)
    return dash, not rest, False


def _scan_shape(line: str, indent: int) -> tuple[int, bool, bool] | None:
    n = len(line)
    i = indent
    start = True  # at a place where a scalar or a collection may begin
    depth = 0  # flow collections open on this line
    anchor = indent
    keyed = False
    empty = True  # nothing after the line's last `key:` or `-`
    scalar_col = -1
    while i < n:
        c = line[i]
        if c == " ":
            i += 1
            continue
        if c == "#" and i > 0 and line[i - 1] == " ":
            break
        if depth == 0 and start and c == "-" and (i + 1 == n or line[i + 1] == " "):
            anchor, keyed, empty = i, True, True
            i += 1
            continue
        if depth == 0 and start and c in "|>":
            if not keyed or not _BLOCK_HEADER.fullmatch(line, i):
                return None  # a header with an indentation digit, or no key or dash to own it
            return anchor, False, True
        if c in "\"'":
            end = _closing_quote(line, i)
            if not start or end < 0:
                return None
            after = end
            while after < n and line[after] == " ":
                after += 1
            if after < n and (line[after] not in ",]}:#" or (line[after] == "#" and after == end)):
                return None
            scalar_col, start, empty = i, False, False
            i = end
            continue
        if start and c in "[{":
            depth += 1
            empty = False
            i += 1
            continue
        if depth and c in "]}":
            depth -= 1
            start = False
            i += 1
            continue
        if depth and c == ",":
            start = True
            i += 1
            continue
        if c == ":" and (i + 1 == n or line[i + 1] == " " or (depth and line[i + 1] in ",]}")):
            if depth == 0:
                if scalar_col < 0:
                    return None  # a key that is a flow collection, or no key at all
                anchor, keyed, empty = scalar_col, True, True
            start = True
            i += 1
            continue
        if start and c in _SCALAR_START_REFUSED:
            return None  # explicit key, anchor, alias, tag, reserved: not worth proving
        if start:
            scalar_col = i
        start, empty = False, False
        i += 1
    if depth or not keyed:
        return None
    return anchor, empty, False


def _closing_quote(line: str, i: int) -> int:
    """Index after the quote closing the one at `i` on this line, or -1 (it runs on to the next line)."""
    q = line[i]
    j = i + 1
    n = len(line)
    while j < n:
        c = line[j]
        if q == '"' and c == "\\":
            j += 2
            continue
        if c == q:
            if q == "'" and j + 1 < n and line[j + 1] == "'":
                j += 2
                continue
            return j + 1
        j += 1
    return -1
