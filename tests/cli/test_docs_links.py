"""The README and docs/ point only at files a user of the project has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_doc_points_outside_the_project(doc: Path) -> None:
    bad = [f"{doc.name}:{i}: {line.strip()}" for i, line in enumerate(doc.read_text().splitlines(), 1)
           if "shared/" in line or "DESIGN.md" in line]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_project(doc: Path) -> None:
    problems = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same page
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT):
            problems.append(f"{target}: outside the project")
        elif not path.exists():
            problems.append(f"{target}: no such file")
    assert not problems, f"{doc.name}: " + "; ".join(problems)


def test_readme_links_the_architecture() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "(docs/architecture.md)" in readme
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme


def test_every_test_the_reliability_table_cites_exists() -> None:
    """docs/reliability.md names the test behind each row: a renamed or deleted test must fail here."""
    text = (ROOT / "docs" / "reliability.md").read_text()
    missing = []
    for cell in re.findall(r"\| ([^|]*`[^|]*) \|\s*$", text, flags=re.MULTILINE):
        current: Path | None = None
        for ref in re.findall(r"`([^`]+)`", cell):
            module, _, name = ref.partition("::")
            if module:
                if not module.endswith(".py") and "/" not in module:
                    continue  # not a test reference (a setting, a message)
                path = ROOT / "tests" / (module if module.endswith(".py") else module.rstrip("/"))
                if not path.exists():
                    missing.append(ref)
                    continue
                current = path if path.is_file() else None
            if name and current is not None:
                pattern = re.escape(name.split("[")[0]).replace(r"\*", r"\w*")
                if not re.search(rf"^def {pattern}\b|^def {pattern}\(", current.read_text(), flags=re.MULTILINE):
                    missing.append(f"{current.relative_to(ROOT)}::{name}")
    assert not missing, f"docs/reliability.md cites tests that do not exist: {missing}"
